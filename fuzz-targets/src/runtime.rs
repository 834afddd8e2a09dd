//! The daemon's own inputs: its records on disk, CNI plugins' output, `crishim run` manifests
//! and `config.toml`.

use std::path::Path;

use crishim::workflow::manifest;
use crishim_cni::cache::CacheEntry;
use crishim_cni::{NetworkList, NetworkResult};
use crishim_cri::config::Config;
use crishim_proto::shim::ContainerState;
use crishim_state::records::{ContainerRecord, PodRecord};

use crate::input::split_at_byte;

/// `/proc/self/mountinfo` as the daemon, the image store and the shim read it: mount points can
/// carry names a pod chose (volume names), escaped by the kernel. Every mount kept is absolute.
/// The same bytes as a `struct statmount` the kernel filled (`mountinfo::read_points`), whose
/// strings are read only within the size it says it wrote.
pub fn mountinfo(data: &[u8]) {
    for m in crishim_sys::mountinfo::parse(&String::from_utf8_lossy(data)) {
        assert!(m.mount_point.is_absolute(), "{m:?}");
    }
    if let Some(m) = crishim_sys::mountinfo::parse_statmount(data) {
        assert!(m.mount_point.is_absolute(), "{m:?}");
    }
}

/// A record file as start-up reads it: pod, container, CNI cache entry or exit record.
pub fn records(data: &[u8]) {
    let _ = serde_json::from_slice::<PodRecord>(data);
    if let Ok(c) = serde_json::from_slice::<ContainerRecord>(data) {
        let _ = c.name();
    }
    if let Ok(e) = serde_json::from_slice::<CacheEntry>(data) {
        if let Some(r) = e.result {
            let _ = NetworkResult::parse(r, &e.if_name);
        }
    }
    let _ = serde_json::from_slice::<ContainerState>(data);
}

/// A records or CNI cache journal as start-up finds it (its bytes after the magic): replayed
/// alone, then opened as a file, where a damaged tail is cut off and the rest must read back.
pub fn journal(data: &[u8]) {
    use crishim_state::journal::{replay, Journal, MAGIC};
    const CAP: u32 = 1 << 16;
    let file = [&MAGIC[..], data].concat();
    let Ok(r) = replay(&file[..], CAP) else {
        return;
    };
    assert!(r.valid_end <= file.len() as u64);
    for slot in r.index.values() {
        assert!(slot.value_at + u64::from(slot.value_len) <= slot.at + slot.frame_len);
        assert!(slot.at + slot.frame_len <= r.valid_end);
    }
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("journal");
    std::fs::write(&path, &file).expect("writing the journal");
    let j = Journal::open(&path, CAP, &dir.path().join("quarantine")).expect("opening it");
    let mut keys = j.keys();
    keys.sort();
    let mut want: Vec<_> = r.index.keys().cloned().collect();
    want.sort();
    assert_eq!(keys, want);
    for k in &keys {
        let v = j.get(k).expect("reading a value").expect("a live key");
        assert_eq!(v.len() as u32, r.index[k].value_len);
    }
    // Reopened (rewritten if it was damaged), it holds the same keys and no damage.
    drop(j);
    let again = replay(&std::fs::read(&path).expect("the journal")[..], CAP).expect("a replay");
    assert!(again.damaged.is_empty());
    assert_eq!(again.index.len(), keys.len());
}

/// What a CNI plugin prints (the first line is the interface asked for), also read as a
/// network config list and as a single config.
pub fn cni_result(data: &[u8]) {
    let (ifname, out) = split_at_byte(data, b'\n');
    let Ok(raw) = serde_json::from_slice::<serde_json::Value>(out) else {
        return;
    };
    if let Ok(r) = NetworkResult::parse(raw.clone(), &String::from_utf8_lossy(ifname)) {
        let _ = (r.pod_ip(), r.additional_ips());
    }
    let source = Path::new("/fuzz/10-net.conflist");
    if let Ok(list) = NetworkList::from_list_json(raw.clone(), source.into()) {
        let _ = (list.to_json(), list.has_cached_results());
    }
    let _ = NetworkList::from_conf_json(raw, source.into());
}

/// A Pod manifest for `crishim run` (YAML or JSON).
pub fn pod_manifest(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = manifest::parse(text);
    }
}

/// `config.toml`, validated as at start-up, with the streaming server's settings derived.
pub fn config_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = Config::parse(text, Path::new("/fuzz/config.toml")) {
        let _ = c.streaming_server();
    }
}
