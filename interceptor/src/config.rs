//! Loading `/etc/crishim/vgpu/config.json`, whose format (`crishim_proto::vgpu`) the runtime
//! writes at `CreateContainer`: a missing config passes everything through, a broken one fails
//! closed.

use std::path::Path;

pub use crishim_proto::vgpu::{Config, CONFIG_PATH, VERSION};

#[derive(Debug, PartialEq)]
pub enum Loaded {
    /// No config: pass everything through.
    Absent,
    Valid(Config),
    /// Unreadable or invalid, with why: fail closed.
    Broken(String),
}

/// Read and check the config at `path`.
pub fn load(path: &Path) -> Loaded {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Loaded::Absent,
        Err(e) => return Loaded::Broken(format!("reading {}: {e}", path.display())),
    };
    let config: Config = match serde_json::from_slice(&text) {
        Ok(c) => c,
        Err(e) => return Loaded::Broken(format!("{}: {e}", path.display())),
    };
    match check(&config) {
        Ok(()) => Loaded::Valid(config),
        Err(why) => Loaded::Broken(format!("{}: {why}", path.display())),
    }
}

/// What the format cannot say by itself: the values make sense.
fn check(c: &Config) -> Result<(), String> {
    if c.version != VERSION {
        return Err(format!(
            "version {} is not the supported {VERSION}",
            c.version
        ));
    }
    if c.memory_limit_bytes == Some(0) {
        return Err("memory_limit_bytes is 0".into());
    }
    if let Some(p) = c.core_percent {
        if !(1..=100).contains(&p) {
            return Err(format!("core_percent {p} is not within 1..=100"));
        }
    }
    for u in &c.device_uuids {
        if crate::cuda::parse_uuid(u).is_none() {
            return Err(format!("device UUID {u:?} is malformed"));
        }
    }
    for (key, p) in [
        ("libcuda", Some(&c.libcuda)),
        ("libnvidia_ml", c.libnvidia_ml.as_ref()),
        ("accounting_file", Some(&c.accounting_file)),
    ] {
        if let Some(p) = p {
            if !p.is_absolute() {
                return Err(format!("{key} {} is not an absolute path", p.display()));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{
        "version": 1, "container_id": "c1", "pod_uid": "u1",
        "device_uuids": ["GPU-c0ffee00-0000-4000-8000-000000000000"],
        "memory_limit_bytes": 268435456, "core_percent": 50,
        "libcuda": "/usr/local/nvidia/lib64/libcuda.so.1",
        "libnvidia_ml": "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
        "accounting_file": "/etc/crishim/vgpu/shared/usage"
    }"#;

    fn load_text(text: &str) -> Loaded {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, text).unwrap();
        load(&p)
    }

    #[test]
    fn a_valid_config_loads() {
        let Loaded::Valid(c) = load_text(GOOD) else {
            panic!("not valid")
        };
        assert_eq!(c.memory_limit_bytes, Some(256 << 20));
        assert_eq!(c.core_percent, Some(50));
    }

    #[test]
    fn absent_is_pass_through_and_anything_wrong_is_broken() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(&dir.path().join("none.json")), Loaded::Absent);
        for (text, needle) in [
            ("{", "EOF"),
            (
                &GOOD.replace("\"version\": 1", "\"version\": 2"),
                "version 2",
            ),
            (&GOOD.replace("268435456", "0"), "memory_limit_bytes is 0"),
            (
                &GOOD.replace("\"core_percent\": 50", "\"core_percent\": 150"),
                "150",
            ),
            (&GOOD.replace("GPU-c0ffee00", "GPU-nothex"), "malformed"),
            (&GOOD.replace("\"pod_uid\"", "\"pod_uidd\""), "pod_uidd"),
            (
                &GOOD.replace("/usr/local/nvidia/lib64/libcuda", "lib64/libcuda"),
                "absolute",
            ),
        ] {
            match load_text(text) {
                Loaded::Broken(why) => assert!(why.contains(needle), "{why}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
