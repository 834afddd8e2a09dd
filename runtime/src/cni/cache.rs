//! The result cache: one JSON file per pod, `<cache_dir>/<pod id>.json`, holding the network
//! config and runtime arguments ADD ran with and, once ADD is done, its final result.
//!
//! The entry is written before the first plugin runs (so that a crash during ADD still
//! leaves DEL the config to undo it with), updated with the result when ADD succeeds, and
//! removed after a successful DEL.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const CACHE_KIND: &str = "crishim-cni-cache/v1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheEntry {
    pub kind: String,
    pub container_id: String,
    pub if_name: String,
    pub netns: String,
    pub cni_args: String,
    #[serde(default)]
    pub capability_args: BTreeMap<String, Value>,
    /// The config file ADD used.
    #[serde(default)]
    pub config_path: PathBuf,
    /// The network config list, as `.conflist` JSON.
    pub config: Value,
    /// The final ADD result; null while ADD runs (or if it was interrupted).
    #[serde(default)]
    pub result: Option<Value>,
}

pub fn path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json"))
}

/// The entry of `id`: `Ok(None)` when there is none.
pub fn load(dir: &Path, id: &str) -> Result<Option<CacheEntry>, String> {
    let p = path(dir, id);
    let data = match std::fs::read(&p) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", p.display())),
    };
    serde_json::from_slice(&data)
        .map(Some)
        .map_err(|e| format!("{}: invalid cache entry: {e}", p.display()))
}

/// Writes the entry atomically (a temp file renamed over it), root's alone.
pub fn store(dir: &Path, entry: &CacheEntry) -> std::io::Result<()> {
    crishim_proto::hostfs::create_private_dir(dir)?;
    let data = serde_json::to_vec_pretty(entry).expect("serializing a cache entry");
    crishim_proto::record::write_atomic(&path(dir, &entry.container_id), &data)
}

/// Removes the entry; a missing one is fine.
pub fn remove(dir: &Path, id: &str) -> std::io::Result<()> {
    match std::fs::remove_file(path(dir, id)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn store_load_remove() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cni");
        assert_eq!(load(&cache, "abc").unwrap(), None);
        let mut entry = CacheEntry {
            kind: CACHE_KIND.into(),
            container_id: "abc".into(),
            if_name: "eth0".into(),
            netns: "/run/netns/x".into(),
            cni_args: "IgnoreUnknown=1".into(),
            capability_args: BTreeMap::new(),
            config_path: "/etc/cni/net.d/10.conflist".into(),
            config: json!({"name": "n", "plugins": [{"type": "bridge"}]}),
            result: None,
        };
        store(&cache, &entry).unwrap();
        assert_eq!(load(&cache, "abc").unwrap().as_ref(), Some(&entry));
        entry.result = Some(json!({"cniVersion": "1.0.0"}));
        store(&cache, &entry).unwrap();
        assert_eq!(load(&cache, "abc").unwrap(), Some(entry));
        let names: Vec<_> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["abc.json"], "no temp file left");
        remove(&cache, "abc").unwrap();
        remove(&cache, "abc").unwrap();
        assert_eq!(load(&cache, "abc").unwrap(), None);
        std::fs::write(path(&cache, "bad"), "{").unwrap();
        assert!(load(&cache, "bad")
            .unwrap_err()
            .contains("invalid cache entry"));
    }
}
