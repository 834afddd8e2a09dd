//! CDI devices, applied with the `container-device-interface` crate from `cdi_spec_dirs`.

use std::path::PathBuf;

use container_device_interface::cache::Cache;
use container_device_interface::spec_dirs::with_spec_dirs;
use oci_spec::runtime::Spec;
use tracing::warn;

use super::error::GpuError;

/// Apply the CDI devices `names` to `spec`. An unknown name is refused by name.
pub fn apply(dirs: &[PathBuf], names: &[String], spec: &mut Spec) -> Result<(), GpuError> {
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
    cache
        .inject_devices(Some(spec), names.to_vec())
        .map_err(|e| {
            GpuError::Invalid(format!("applying CDI devices {}: {e}", names.join(", ")))
        })?;
    Ok(())
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
        apply(&dirs, &["crishim.test/gpu=gpu0".into()], &mut spec).unwrap();
        let env = spec.process().as_ref().unwrap().env().clone().unwrap();
        assert!(env.contains(&"FROM_CDI=gpu0".to_string()), "{env:?}");
        let devices = spec.linux().as_ref().unwrap().devices().clone().unwrap();
        assert!(devices
            .iter()
            .any(|d| d.path() == Path::new("/dev/nvidia0")));

        let e = apply(&dirs, &["crishim.test/gpu=gpu9".into()], &mut spec)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"crishim.test/gpu=gpu9\"") && e.contains("crishim.test/gpu=gpu0"),
            "{e}"
        );
    }
}
