//! `crishim bundle spec`: a starting `config.json`, as `runc spec` writes one: `sh` on a terminal,
//! a read-only `rootfs`, new pid/network/ipc/uts/mount/cgroup namespaces, the standard mounts,
//! masked and read-only paths, a minimal capability set, and no devices beyond the defaults.

use std::io::Write;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxDeviceCgroupBuilder, Spec};

use super::config::CONFIG;
use super::error::BundleError;

pub fn default_spec() -> Spec {
    // oci-spec's defaults are runc's, but for these.
    let mut spec = Spec::default();
    spec.set_hostname(Some("crishim".into()));
    if let Some(p) = spec.process_mut() {
        p.set_terminal(Some(true));
    }
    let deny_all = LinuxDeviceCgroupBuilder::default()
        .allow(false)
        .access("rwm")
        .build()
        .expect("a complete device rule");
    if let Some(r) = spec
        .linux_mut()
        .as_mut()
        .and_then(|l| l.resources_mut().as_mut())
    {
        r.set_devices(Some(vec![deny_all]));
    }
    spec
}

/// Write the default config into `dir`; never overwrites one.
pub fn write_default(dir: &Path) -> Result<PathBuf, BundleError> {
    let path = dir.join(CONFIG);
    let mut json = serde_json::to_vec_pretty(&default_spec()).expect("a spec serializes");
    json.push(b'\n');
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => BundleError::SpecExists(path.clone()),
            _ => BundleError::io("creating", &path, e),
        })?;
    file.write_all(&json)
        .map_err(|e| BundleError::io("writing", &path, e))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_runc_like_config_once() {
        let d = tempfile::tempdir().unwrap();
        let path = write_default(d.path()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["process"]["args"], serde_json::json!(["sh"]));
        assert_eq!(v["process"]["terminal"], true);
        assert_eq!(v["root"]["path"], "rootfs");
        let ns: Vec<_> = v["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap().to_string())
            .collect();
        for want in ["pid", "network", "ipc", "uts", "mount"] {
            assert!(ns.iter().any(|n| n == want), "{want} in {ns:?}");
        }
        assert!(v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["destination"] == "/proc"));
        let e = write_default(d.path()).unwrap_err().to_string();
        assert!(e.contains("already exists"), "{e}");
    }
}
