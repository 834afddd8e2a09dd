//! Edits of a container's OCI spec: device nodes with their cgroup rules, bind mounts, env.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxDeviceBuilder, LinuxDeviceCgroupBuilder, LinuxDeviceType, MountBuilder, Spec,
};

use super::discover::Node;
use super::error::GpuError;

/// One edit of a spec, decided on the host and made by [`Edit::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// [`add_device`].
    Device(Node),
    /// [`add_bind`].
    Bind {
        source: PathBuf,
        destination: String,
        writable: bool,
    },
    /// [`set_env`].
    Env { key: String, value: String },
    /// This directory at the end of `PATH`, unless already in it: `PATH` is read when the edit
    /// is made, after the image's, the request's and the CDI devices' env.
    AppendPath(String),
}

impl Edit {
    pub fn bind(source: &Path, destination: &str, writable: bool) -> Edit {
        Edit::Bind {
            source: source.to_path_buf(),
            destination: destination.to_string(),
            writable,
        }
    }

    pub fn env(key: &str, value: &str) -> Edit {
        Edit::Env {
            key: key.to_string(),
            value: value.to_string(),
        }
    }

    pub fn apply(&self, spec: &mut Spec) -> Result<(), GpuError> {
        match self {
            Edit::Device(node) => add_device(spec, node)?,
            Edit::Bind {
                source,
                destination,
                writable,
            } => add_bind(spec, source, destination, *writable)?,
            Edit::Env { key, value } => set_env(spec, key, value),
            Edit::AppendPath(dir) => {
                let path = env_value(spec, "PATH").unwrap_or_default();
                let mut parts: Vec<&str> = path.split(':').filter(|p| !p.is_empty()).collect();
                if !parts.contains(&dir.as_str()) {
                    parts.push(dir);
                }
                set_env(spec, "PATH", &parts.join(":"));
            }
        }
        Ok(())
    }
}

/// Add `node` at its container path (unless a device is already there, e.g. from the CRI's
/// devices or CDI) and allow it in the device cgroup (v1 and v2 alike read these rules).
pub fn add_device(spec: &mut Spec, node: &Node) -> Result<(), GpuError> {
    let linux = spec.linux_mut().get_or_insert_with(Default::default);
    let mut devices = linux.devices().clone().unwrap_or_default();
    if !devices.iter().any(|d| d.path() == &node.container) {
        devices.push(
            LinuxDeviceBuilder::default()
                .path(node.container.clone())
                .typ(LinuxDeviceType::C)
                .major(i64::from(node.major))
                .minor(i64::from(node.minor))
                .file_mode(node.mode)
                .uid(0u32)
                .gid(0u32)
                .build()
                .map_err(|e| {
                    GpuError::Internal(format!("device {}: {e}", node.container.display()))
                })?,
        );
        linux.set_devices(Some(devices));
    }
    let mut resources = linux.resources().clone().unwrap_or_default();
    let mut rules = resources.devices().clone().unwrap_or_default();
    let allowed = rules.iter().any(|r| {
        r.allow()
            && r.typ() == Some(LinuxDeviceType::C)
            && r.major() == Some(i64::from(node.major))
            && r.minor() == Some(i64::from(node.minor))
    });
    if !allowed {
        rules.push(
            LinuxDeviceCgroupBuilder::default()
                .allow(true)
                .typ(LinuxDeviceType::C)
                .major(i64::from(node.major))
                .minor(i64::from(node.minor))
                .access("rwm")
                .build()
                .map_err(|e| GpuError::Internal(format!("device rule: {e}")))?,
        );
        resources.set_devices(Some(rules));
        linux.set_resources(Some(resources));
    }
    Ok(())
}

/// Bind-mount `source` at `destination`. Libraries and binaries are mapped executable, so only
/// `rw` mounts get `noexec`.
pub fn add_bind(
    spec: &mut Spec,
    source: &Path,
    destination: &str,
    writable: bool,
) -> Result<(), GpuError> {
    let mut options = vec![
        "rbind".to_string(),
        if writable { "rw" } else { "ro" }.to_string(),
        "nosuid".to_string(),
        "nodev".to_string(),
    ];
    if writable {
        options.push("noexec".to_string());
    }
    let mount = MountBuilder::default()
        .destination(destination)
        .typ("bind")
        .source(source)
        .options(options)
        .build()
        .map_err(|e| GpuError::Internal(format!("mount {destination}: {e}")))?;
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    mounts.retain(|m| m.destination() != Path::new(destination));
    mounts.push(mount);
    spec.set_mounts(Some(mounts));
    Ok(())
}

/// The process's value of `key`.
pub fn env_value(spec: &Spec, key: &str) -> Option<String> {
    super::request::image_value(spec.process().as_ref()?.env().as_ref()?, key)
}

/// Set `key=value` in the process env, in place of any earlier value.
pub fn set_env(spec: &mut Spec, key: &str, value: &str) {
    let Some(process) = spec.process_mut() else {
        return;
    };
    let mut env = process.env().clone().unwrap_or_default();
    env.retain(|kv| kv.split_once('=').map_or(kv != key, |(k, _)| k != key));
    env.push(format!("{key}={value}"));
    process.set_env(Some(env));
}

/// `first`, then each of `rest`'s colon lists in order, without empty or repeated entries.
pub fn path_list(first: &str, rest: &[Option<&str>]) -> String {
    let mut out: Vec<&str> = vec![first];
    for part in rest.iter().flatten().flat_map(|v| v.split(':')) {
        if !part.is_empty() && !out.contains(&part) {
            out.push(part);
        }
    }
    out.join(":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::Process;
    use std::path::PathBuf;

    fn spec(env: &[&str]) -> Spec {
        let mut s = Spec::default();
        let mut p = Process::default();
        p.set_env(Some(env.iter().map(|s| s.to_string()).collect()));
        s.set_process(Some(p));
        s
    }

    #[test]
    fn env_is_replaced_in_place_and_paths_compose() {
        let mut s = spec(&["A=1", "PATH=/bin", "B=2"]);
        set_env(&mut s, "PATH", "/bin:/x");
        assert_eq!(env_value(&s, "PATH").as_deref(), Some("/bin:/x"));
        assert_eq!(env_value(&s, "A").as_deref(), Some("1"));
        assert_eq!(
            path_list("/n", &[Some("/img:/n"), None, Some("/req::/img")]),
            "/n:/img:/req"
        );
    }

    #[test]
    fn devices_are_added_once_with_a_rule() {
        let mut s = spec(&[]);
        let node = Node {
            host: PathBuf::from("/tmp/dev/nvidia1"),
            container: PathBuf::from("/dev/nvidia1"),
            major: 195,
            minor: 1,
            mode: 0o666,
        };
        add_device(&mut s, &node).unwrap();
        add_device(&mut s, &node).unwrap();
        let linux = s.linux().as_ref().unwrap();
        assert_eq!(linux.devices().as_ref().unwrap().len(), 1);
        let rules = linux
            .resources()
            .as_ref()
            .unwrap()
            .devices()
            .clone()
            .unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].access().as_deref(), Some("rwm"));
    }
}
