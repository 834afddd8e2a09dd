//! CDI devices, applied with the `container-device-interface` crate from `cdi_spec_dirs`.

use std::collections::HashSet;
use std::path::PathBuf;

use container_device_interface::cache::Cache;
use container_device_interface::container_edits::{ContainerEdits, DeviceNode};
use container_device_interface::spec_dirs::with_spec_dirs;
use oci_spec::runtime::Spec;
use tracing::warn;

use super::error::GpuError;

/// The edits of some CDI devices, read from the host by [`resolve`].
#[derive(Debug, Clone)]
pub struct Edits {
    names: Vec<String>,
    edits: ContainerEdits,
}

impl Edits {
    /// Make the edits in `spec`, as the crate's `Cache::inject_devices` does.
    pub fn apply(&self, spec: &mut Spec) -> Result<(), GpuError> {
        self.edits
            .clone()
            .apply(spec)
            .map_err(|e| self.error(format!("failed to inject devices: {e}")))
    }

    fn error(&self, e: impl std::fmt::Display) -> GpuError {
        GpuError::Invalid(format!(
            "applying CDI devices {}: {e}",
            self.names.join(", ")
        ))
    }
}

/// The edits of the CDI devices `names`, from the specs in `dirs`, with the type and numbers of
/// each device node read from its host path now, so that applying them reads nothing. An
/// unknown name is refused by name.
pub fn resolve(dirs: &[PathBuf], names: &[String]) -> Result<Edits, GpuError> {
    let dirs: Vec<&str> = dirs.iter().filter_map(|d| d.to_str()).collect();
    let mut cache = Cache::default();
    with_spec_dirs(&dirs)(&mut cache);
    if let Err(e) = cache.refresh() {
        // One broken spec file must not take every other vendor's devices down.
        warn!(error = %e, "some CDI specs could not be loaded");
    }
    for name in names {
        if !cache.devices.contains_key(name) {
            let mut known = cache.list_devices();
            known.truncate(20);
            return Err(GpuError::Invalid(format!(
                "unknown CDI device {name:?} (known in {}: {})",
                dirs.join(", "),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
    }
    let mut out = Edits {
        names: names.to_vec(),
        edits: ContainerEdits::new(),
    };
    // Merged as `inject_devices` merges them: each spec's own edits once, then the device's.
    let mut specs = HashSet::new();
    for name in names {
        let device = &cache.devices[name];
        let mut spec = device.get_spec();
        if specs.insert(spec.clone()) {
            if let Some(edits) = spec.edits() {
                out.edits.append(edits).map_err(|e| out.error(e))?;
            }
        }
        out.edits.append(device.edits()).map_err(|e| out.error(e))?;
    }
    // A node this fails for is left as it is: applying the edits reports why.
    for node in out.edits.container_edits.device_nodes.iter_mut().flatten() {
        let mut filled = DeviceNode { node: node.clone() };
        if filled.fill_missing_info().is_ok() {
            *node = filled.node;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const SPEC: &str = r#"cdiVersion: "0.6.0"
kind: "crishim.test/gpu"
devices:
  - name: "gpu0"
    containerEdits:
      env:
        - "FROM_CDI=gpu0"
      deviceNodes:
        - path: "/dev/nvidia0"
          hostPath: "HOST"
          type: "c"
          major: 195
          minor: 0
"#;

    #[test]
    fn devices_apply_and_unknown_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("gpu.yaml"),
            SPEC.replace("HOST", "/host/dev/nvidia0"),
        )
        .unwrap();
        let dirs = vec![dir.path().to_path_buf()];
        let mut spec = Spec::default();
        resolve(&dirs, &["crishim.test/gpu=gpu0".into()])
            .unwrap()
            .apply(&mut spec)
            .unwrap();
        let env = spec.process().as_ref().unwrap().env().clone().unwrap();
        assert!(env.contains(&"FROM_CDI=gpu0".to_string()), "{env:?}");
        let devices = spec.linux().as_ref().unwrap().devices().clone().unwrap();
        assert!(devices
            .iter()
            .any(|d| d.path() == Path::new("/dev/nvidia0")));

        let e = resolve(&dirs, &["crishim.test/gpu=gpu9".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"crishim.test/gpu=gpu9\"") && e.contains("crishim.test/gpu=gpu0"),
            "{e}"
        );
    }
}
