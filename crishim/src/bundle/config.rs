//! An OCI bundle on disk: checked here, before anything is created, so that a bad one is refused
//! with the file and the reason rather than by libcontainer halfway through a create.

use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;

use super::error::BundleError;

pub const CONFIG: &str = "config.json";

#[derive(Debug)]
pub struct Bundle {
    /// Absolute and canonical.
    pub dir: PathBuf,
    pub rootfs: PathBuf,
    pub oci_version: String,
    pub terminal: bool,
}

impl Bundle {
    pub fn load(dir: &Path) -> Result<Bundle, BundleError> {
        let canonical = dir.canonicalize().map_err(|source| BundleError::NoBundle {
            path: dir.to_path_buf(),
            source,
        })?;
        if !canonical.is_dir() {
            return Err(BundleError::NotADirectory(dir.to_path_buf()));
        }
        let path = canonical.join(CONFIG);
        let config_error = |message: String| BundleError::Config {
            path: path.clone(),
            message,
        };
        let raw = std::fs::read(&path).map_err(|e| config_error(e.to_string()))?;
        // serde_json's message names the line and column of a malformed file.
        let spec: Spec = serde_json::from_slice(&raw)
            .map_err(|e| config_error(format!("not a valid OCI runtime config: {e}")))?;
        let process = spec
            .process()
            .as_ref()
            .ok_or_else(|| config_error("no \"process\" to run".into()))?;
        if process.args().as_ref().is_none_or(|a| a.is_empty()) {
            return Err(config_error("\"process.args\" is empty".into()));
        }
        let root = spec
            .root()
            .as_ref()
            .ok_or_else(|| config_error("no \"root\"".into()))?;
        let rootfs = canonical.join(root.path());
        match std::fs::metadata(&rootfs) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(BundleError::Rootfs {
                    path: rootfs,
                    message: "not a directory".into(),
                })
            }
            Err(e) => {
                return Err(BundleError::Rootfs {
                    path: rootfs,
                    message: e.to_string(),
                })
            }
        }
        Ok(Bundle {
            rootfs,
            oci_version: spec.version().clone(),
            terminal: process.terminal().unwrap_or(false),
            dir: canonical,
        })
    }

    /// The id a bundle runs under when none is given: its directory's name, as a user would.
    pub fn default_id(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(config: Option<&str>, rootfs: bool) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        if let Some(c) = config {
            std::fs::write(d.path().join(CONFIG), c).unwrap();
        }
        if rootfs {
            std::fs::create_dir(d.path().join("rootfs")).unwrap();
        }
        d
    }

    /// The message as the command line prints it: with its causes.
    fn chain(e: BundleError) -> String {
        format!("{:#}", anyhow::Error::from(e))
    }

    fn err(config: Option<&str>, rootfs: bool) -> String {
        let d = bundle(config, rootfs);
        chain(Bundle::load(d.path()).unwrap_err())
    }

    const GOOD: &str = r#"{"ociVersion":"1.0.2","process":{"args":["sh"],"cwd":"/","user":{"uid":0,"gid":0}},"root":{"path":"rootfs"}}"#;

    #[test]
    fn a_valid_bundle_loads() {
        let d = bundle(Some(GOOD), true);
        let b = Bundle::load(d.path()).unwrap();
        assert_eq!(b.rootfs, d.path().canonicalize().unwrap().join("rootfs"));
        assert_eq!(b.oci_version, "1.0.2");
        assert!(!b.terminal);
    }

    #[test]
    fn bad_bundles_are_refused_with_the_reason() {
        let e = chain(Bundle::load(Path::new("/nonexistent/bundle")).unwrap_err());
        assert!(
            e.contains("/nonexistent/bundle") && e.contains("No such file"),
            "{e}"
        );
        let e = err(None, true);
        assert!(
            e.contains("config.json") && e.contains("No such file"),
            "{e}"
        );
        let e = err(Some("{\"ociVersion\": "), true);
        assert!(
            e.contains("not a valid OCI runtime config") && e.contains("line 1"),
            "{e}"
        );
        let e = err(Some(GOOD), false);
        assert!(e.contains("rootfs") && e.contains("No such file"), "{e}");
        let e = err(
            Some(
                r#"{"ociVersion":"1.0.2","process":{"args":[],"cwd":"/","user":{"uid":0,"gid":0}},"root":{"path":"rootfs"}}"#,
            ),
            true,
        );
        assert!(e.contains("process.args"), "{e}");
    }
}
