//! The result cache: one entry per pod, keyed by its id, holding the network config and runtime
//! arguments ADD ran with and, once ADD is done, its final result. The entries are kept in a
//! [`Journal`] at `<cache_dir>/journal` (see [`crishim_state::journal`]); `<pod id>.json` files of older
//! daemons are moved into it when it is first opened.
//!
//! The entry is written before the first plugin runs (so that a crash during ADD still
//! leaves DEL the config to undo it with), updated with the result when ADD succeeds, and
//! removed after a successful DEL.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crishim_state::journal::Journal;

pub const CACHE_KIND: &str = "crishim-cni-cache/v1";

/// The journal's file name in the cache directory.
pub const JOURNAL: &str = "journal";

/// The largest entry: a network config list and a plugin's result (its stdout is kept up to
/// 1 MiB), with room to spare.
const MAX_ENTRY_BYTES: u32 = 8 << 20;

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

/// The cache in `dir`, root's alone; its journal is opened at first use. Clones share it.
#[derive(Clone)]
pub struct Cache {
    dir: PathBuf,
    journal: Arc<Mutex<Option<Arc<Journal>>>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").field("dir", &self.dir).finish()
    }
}

impl Cache {
    pub fn new(dir: PathBuf) -> Self {
        Cache {
            dir,
            journal: Arc::new(Mutex::new(None)),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn journal(&self) -> std::io::Result<Arc<Journal>> {
        let mut slot = self.journal.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(j) = &*slot {
            return Ok(j.clone());
        }
        crishim_sys::hostfs::create_private_dir(&self.dir)?;
        let journal = Journal::open(
            &self.dir.join(JOURNAL),
            MAX_ENTRY_BYTES,
            &self.dir.join("quarantine"),
        )?;
        // Older daemons' `<id>.json` entries, as they are: a damaged one is reported when it is
        // loaded, as before; one the journal cannot take is left where it is.
        for (p, _, why) in journal.take_files(&self.dir) {
            tracing::warn!(path = %p.display(), error = %why, "moving a CNI cache file into the journal");
        }
        let journal = Arc::new(journal);
        *slot = Some(journal.clone());
        Ok(journal)
    }

    /// The entry of `id`: `Ok(None)` when there is none.
    pub fn load(&self, id: &str) -> Result<Option<CacheEntry>, String> {
        let journal = self
            .journal()
            .map_err(|e| format!("opening the CNI cache in {}: {e}", self.dir.display()))?;
        let data = match journal.get(id) {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(None),
            Err(e) => return Err(format!("reading the CNI cache entry of {id}: {e}")),
        };
        serde_json::from_slice(&data)
            .map(Some)
            .map_err(|e| format!("{id}: invalid cache entry: {e}"))
    }

    /// The pods that have an entry.
    pub fn ids(&self) -> std::io::Result<Vec<String>> {
        Ok(self.journal()?.keys())
    }

    /// Writes the entry, durably.
    pub fn store(&self, entry: &CacheEntry) -> std::io::Result<()> {
        let data = serde_json::to_vec(entry).expect("serializing a cache entry");
        Ok(self.journal()?.put(&entry.container_id, &data)?)
    }

    /// Removes the entry; a missing one is fine.
    pub fn remove(&self, id: &str) -> std::io::Result<()> {
        Ok(self.journal()?.remove(id)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn store_load_remove() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path().join("cni"));
        assert_eq!(cache.load("abc").unwrap(), None);
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
        cache.store(&entry).unwrap();
        assert_eq!(cache.load("abc").unwrap().as_ref(), Some(&entry));
        entry.result = Some(json!({"cniVersion": "1.0.0"}));
        cache.store(&entry).unwrap();
        assert_eq!(cache.load("abc").unwrap().as_ref(), Some(&entry));
        // Durable: a new cache on the directory finds it.
        let again = Cache::new(cache.dir().to_path_buf());
        assert_eq!(again.load("abc").unwrap(), Some(entry));
        let names: Vec<_> = std::fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [JOURNAL], "no temp file left");
        cache.remove("abc").unwrap();
        cache.remove("abc").unwrap();
        assert_eq!(cache.load("abc").unwrap(), None);
    }

    #[test]
    fn an_older_daemons_files_are_moved_in_and_a_damaged_one_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("cni");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(
            d.join("old.json"),
            serde_json::to_vec_pretty(&json!({
                "kind": CACHE_KIND, "containerId": "old", "ifName": "eth0", "netns": "",
                "cniArgs": "", "config": {"name": "n"}
            }))
            .unwrap(),
        )
        .unwrap();
        std::fs::write(d.join("bad.json"), "{").unwrap();
        let cache = Cache::new(d.clone());
        assert_eq!(cache.load("old").unwrap().unwrap().if_name, "eth0");
        assert!(cache
            .load("bad")
            .unwrap_err()
            .contains("invalid cache entry"));
        assert!(!d.join("old.json").exists() && !d.join("bad.json").exists());
    }
}
