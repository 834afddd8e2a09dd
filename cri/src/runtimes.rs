//! `[runtimes.<name>]`: the RuntimeClass handlers this node serves, as containerd's `runtimes`.
//! The empty handler (pods without a RuntimeClass) is the built-in libcontainer path;
//! `[runtimes.default]` may change its options. Any other name may run an external OCI runtime
//! binary (runc, crun, runsc, youki), which the pod's shim drives through its CLI.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// `runtime = "libcontainer"`: the runtime built into the shim.
pub const BUILTIN: &str = "libcontainer";
/// The table that configures the empty handler.
pub const DEFAULT_TABLE: &str = "default";
/// A RuntimeClass handler is a DNS label.
const MAX_NAME: usize = 63;
const MAX_POD_ANNOTATIONS: usize = 64;
const MAX_PATTERN: usize = 317;
const MAX_HANDLERS: usize = 64;

/// One `[runtimes.<name>]` table.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RuntimeHandlerConfig {
    /// An OCI runtime binary (an absolute path), or `libcontainer` (the default): built in.
    #[serde(default = "builtin")]
    pub runtime: String,
    /// GPU injection (`[gpu]`) for this handler's containers.
    #[serde(default = "yes")]
    pub gpu: bool,
    /// A privileged container gets no host devices (and no access to all of them), as in
    /// containerd: for sandboxed runtimes, where host devices mean nothing.
    #[serde(default)]
    pub privileged_without_host_devices: bool,
    /// Pod annotations passed into each container's OCI spec: keys, or prefixes ending in `*`.
    #[serde(default)]
    pub pod_annotations: Vec<String>,
}

impl Default for RuntimeHandlerConfig {
    fn default() -> Self {
        RuntimeHandlerConfig {
            runtime: builtin(),
            gpu: true,
            privileged_without_host_devices: false,
            pod_annotations: Vec::new(),
        }
    }
}

fn builtin() -> String {
    BUILTIN.into()
}

fn yes() -> bool {
    true
}

impl RuntimeHandlerConfig {
    /// The external runtime's binary; `None` for the built-in one.
    pub fn binary(&self) -> Option<&Path> {
        (self.runtime != BUILTIN).then(|| Path::new(&self.runtime))
    }

    /// Whether a pod annotation is passed into the containers' specs.
    pub fn passes_annotation(&self, key: &str) -> bool {
        self.pod_annotations
            .iter()
            .any(|p| match p.strip_suffix('*') {
                Some(prefix) => key.starts_with(prefix),
                None => key == p,
            })
    }
}

/// The node's handlers by name, the empty name being the default.
#[derive(Debug, Clone)]
pub struct Handlers {
    by_name: BTreeMap<String, RuntimeHandlerConfig>,
}

impl Handlers {
    /// From the `[runtimes]` tables: `default` configures the empty handler, which always exists.
    pub fn new(tables: &BTreeMap<String, RuntimeHandlerConfig>) -> Self {
        let mut by_name = BTreeMap::new();
        by_name.insert(
            String::new(),
            tables.get(DEFAULT_TABLE).cloned().unwrap_or_default(),
        );
        for (name, config) in tables {
            if name != DEFAULT_TABLE {
                by_name.insert(name.clone(), config.clone());
            }
        }
        Handlers { by_name }
    }

    /// A handler by the name a request gives (`default` names the empty handler too).
    pub fn get(&self, name: &str) -> Option<&RuntimeHandlerConfig> {
        let name = if name == DEFAULT_TABLE { "" } else { name };
        self.by_name.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &RuntimeHandlerConfig)> {
        self.by_name.iter().map(|(n, c)| (n.as_str(), c))
    }

    /// The names, for a refusal: `"" (default), runc, ...`.
    pub fn names(&self) -> String {
        self.by_name
            .keys()
            .map(|n| {
                if n.is_empty() {
                    "\"\" (default)".to_string()
                } else {
                    n.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// An external runtime's state root: `<state_dir>/runtimes/<name>`.
pub fn state_root(state_dir: &Path, name: &str) -> PathBuf {
    let name = if name.is_empty() { DEFAULT_TABLE } else { name };
    state_dir.join("runtimes").join(name)
}

/// Check the tables at start-up, naming the key at fault.
pub fn validate(tables: &BTreeMap<String, RuntimeHandlerConfig>) -> Result<(), String> {
    if tables.len() > MAX_HANDLERS {
        return Err(format!("[runtimes]: at most {MAX_HANDLERS} handlers"));
    }
    for (name, config) in tables {
        let label = name.len() <= MAX_NAME
            && !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !label {
            return Err(format!(
                "[runtimes.{name:?}]: a handler name is a DNS label (at most {MAX_NAME} of [a-z0-9-])"
            ));
        }
        if let Some(binary) = config.binary() {
            if !binary.is_absolute() {
                return Err(format!(
                    "runtimes.{name}.runtime: {:?} must be \"{BUILTIN}\" or an absolute path",
                    config.runtime
                ));
            }
            if !is_executable(binary) {
                return Err(format!(
                    "runtimes.{name}.runtime: {} is not an executable file",
                    binary.display()
                ));
            }
        }
        if config.pod_annotations.len() > MAX_POD_ANNOTATIONS
            || config.pod_annotations.iter().any(|p| {
                p.is_empty()
                    || p.len() > MAX_PATTERN
                    || p.strip_suffix('*').unwrap_or(p).contains('*')
            })
        {
            return Err(format!(
                "runtimes.{name}.pod_annotations: at most {MAX_POD_ANNOTATIONS} keys, each a key \
                 or a prefix ending in '*' (at most {MAX_PATTERN} bytes)"
            ));
        }
    }
    Ok(())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(toml_text: &str) -> BTreeMap<String, RuntimeHandlerConfig> {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn the_empty_handler_always_exists_and_default_configures_it() {
        let h = Handlers::new(&BTreeMap::new());
        assert_eq!(h.get("").unwrap(), &RuntimeHandlerConfig::default());
        assert!(h.get("runc").is_none());
        let h = Handlers::new(&tables(
            "[default]\ngpu = false\n[runc]\nruntime = \"/bin/sh\"\n",
        ));
        assert!(!h.get("").unwrap().gpu);
        assert!(!h.get("default").unwrap().gpu);
        assert_eq!(h.get("runc").unwrap().binary(), Some(Path::new("/bin/sh")));
        assert_eq!(h.names(), "\"\" (default), runc");
    }

    #[test]
    fn bad_tables_are_refused_naming_the_key() {
        for (text, key) in [
            ("[RunC]\n", "[runtimes.\"RunC\"]"),
            ("[runc]\nruntime = \"runc\"\n", "runtimes.runc.runtime"),
            (
                "[runc]\nruntime = \"/nonexistent/runc\"\n",
                "runtimes.runc.runtime",
            ),
            (
                "[runc]\npod_annotations = [\"a*b*\"]\n",
                "runtimes.runc.pod_annotations",
            ),
            (
                "[runc]\npod_annotations = [\"\"]\n",
                "runtimes.runc.pod_annotations",
            ),
        ] {
            let e = validate(&tables(text)).unwrap_err();
            assert!(e.starts_with(key), "{text}: {e}");
        }
        assert!(
            toml::from_str::<BTreeMap<String, RuntimeHandlerConfig>>("[runc]\nbinary = 1\n")
                .is_err()
        );
        // A multi-byte last character is no slicing hazard.
        validate(&tables("[runc]\npod_annotations = [\"é\", \"aé*\"]\n")).unwrap();
        validate(&tables(
            "[runc]\nruntime = \"/bin/sh\"\npod_annotations = [\"io.kubernetes.cri.*\", \"x\"]\n",
        ))
        .unwrap();
    }

    #[test]
    fn pod_annotations_match_keys_and_prefixes() {
        let c = RuntimeHandlerConfig {
            pod_annotations: vec!["io.katacontainers.*".into(), "exact".into()],
            ..Default::default()
        };
        assert!(c.passes_annotation("io.katacontainers.config.hypervisor"));
        assert!(c.passes_annotation("exact"));
        assert!(!c.passes_annotation("exactly"));
        assert!(!c.passes_annotation("io.kubernetes.cri.x"));
    }
}
