//! The daemon's records of pods and containers: in memory for serving, and one JSON file each on
//! disk, written atomically (temp file + rename), so a restart finds them and a torn write cannot
//! corrupt them. CRI configs are kept as their protobuf encoding.

use std::collections::HashMap;
use std::path::PathBuf;

use base64::Engine as _;
use crishim_proto::cri;
use crishim_proto::shim::ContainerState;
use prost::Message;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PodState {
    /// RunPodSandbox has not finished; after a crash, recovery rolls it back.
    Creating,
    Ready,
    NotReady,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PodRecord {
    pub id: String,
    #[serde(with = "pb")]
    pub config: cri::PodSandboxConfig,
    pub runtime_handler: String,
    pub state: PodState,
    pub created_at: i64,
    pub infra_pid: i32,
    /// Namespace modes resolved from the config.
    pub host_network: bool,
    pub host_pid: bool,
    pub host_ipc: bool,
    pub shared_pid: bool,
    /// Where the pod's /dev/shm tmpfs is mounted (None for host IPC).
    pub shm: Option<PathBuf>,
    pub cgroup_parent: String,
    /// The driver the pod's cgroups were made with (the config's when the pod was created).
    #[serde(default)]
    pub cgroup_driver: crate::cgroups::CgroupDriver,
    /// Cgroup directories of the parent that the daemon created, removed with the pod.
    #[serde(default)]
    pub owned_cgroups: Vec<String>,
    /// Addresses from CNI, the primary one first.
    #[serde(default)]
    pub ips: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub id: String,
    pub pod_id: String,
    #[serde(with = "pb")]
    pub config: cri::ContainerConfig,
    /// The image as the caller named it, its ID, and the reference reported as `image_ref`.
    pub image: String,
    pub image_id: String,
    pub image_ref: String,
    pub created_at: i64,
    /// Absolute; empty for none.
    pub log_path: PathBuf,
    pub bundle: PathBuf,
    pub stop_signal: i32,
    /// The last state the shim reported; final once the container has exited.
    pub last: Option<ContainerState>,
}

impl ContainerRecord {
    pub fn name(&self) -> &str {
        self.config
            .metadata
            .as_ref()
            .map_or("", |m| m.name.as_str())
    }
}

/// Protobuf messages inside JSON records, as base64 of their wire encoding.
mod pb {
    use super::*;

    pub fn serialize<M: Message, S: serde::Serializer>(m: &M, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(m.encode_to_vec()))
    }

    pub fn deserialize<'de, M: Message + Default, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<M, D::Error> {
        let s = String::deserialize(d)?;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(serde::de::Error::custom)?;
        M::decode(&raw[..]).map_err(serde::de::Error::custom)
    }
}

/// A directory of `<id>.json` records.
#[derive(Debug, Clone)]
pub struct RecordDir {
    dir: PathBuf,
}

impl RecordDir {
    pub fn new(dir: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(RecordDir { dir })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    pub fn save<T: Serialize>(&self, id: &str, value: &T) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
        write_atomic(&self.path(id), &json)
    }

    pub fn remove(&self, id: &str) -> std::io::Result<()> {
        match std::fs::remove_file(self.path(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Remove the temporary files of writes that a crash cut short. Only at start-up, when no
    /// write of this process is under way.
    pub fn remove_temporaries(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "tmp") {
                tracing::info!(path = %p.display(), "removing the temporary file of a cut-short write");
                let _ = std::fs::remove_file(&p);
            }
        }
    }

    /// Every readable record; unreadable ones are reported and skipped, never fatal.
    pub fn load_all<T: for<'de> Deserialize<'de>>(&self) -> Vec<T> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "json") {
                match std::fs::read(&p)
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
                {
                    Ok(v) => out.push(v),
                    Err(e) => {
                        tracing::warn!(path = %p.display(), error = %e, "skipping unreadable record")
                    }
                }
            }
        }
        out
    }
}

pub use crishim_proto::record::{now_nanos, write_atomic};

/// In-memory index: records by id, and reserved names so two pods (or two containers of one pod)
/// never share a CRI name.
#[derive(Default)]
pub struct Index {
    pub pods: HashMap<String, PodRecord>,
    pub containers: HashMap<String, ContainerRecord>,
    pub names: HashMap<String, String>,
}

impl Index {
    /// Reserve `name` for `id`; on conflict returns the holder's id.
    pub fn reserve(&mut self, name: &str, id: &str) -> Result<(), String> {
        match self.names.get(name) {
            Some(holder) if holder != id => Err(holder.clone()),
            _ => {
                self.names.insert(name.to_string(), id.to_string());
                Ok(())
            }
        }
    }

    pub fn release(&mut self, name: &str, id: &str) {
        if self.names.get(name).is_some_and(|h| h == id) {
            self.names.remove(name);
        }
    }
}

/// The reserved name of a pod, as the kubelet composes it (name_namespace_uid_attempt).
pub fn pod_name(m: &cri::PodSandboxMetadata) -> String {
    format!("{}_{}_{}_{}", m.name, m.namespace, m.uid, m.attempt)
}

/// The reserved name of a container within its pod.
pub fn container_name(m: &cri::ContainerMetadata, pod: &cri::PodSandboxMetadata) -> String {
    format!(
        "{}_{}_{}_{}_{}",
        m.name, pod.name, pod.namespace, pod.uid, m.attempt
    )
}

/// A fresh 64-hex id; an error if the kernel gives no random bytes (never a fixed id).
pub fn new_id() -> std::io::Result<String> {
    crishim_proto::random::hex(32)
}

/// [`new_id`] for an RPC: a failure is `Internal`.
pub fn new_id_status() -> Result<String, tonic::Status> {
    new_id().map_err(|e| tonic::Status::internal(format!("generating an id: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_with_protobuf_configs() {
        let dir = tempfile::tempdir().unwrap();
        let rd = RecordDir::new(dir.path().to_path_buf()).unwrap();
        let config = cri::PodSandboxConfig {
            hostname: "h".into(),
            labels: [("a".to_string(), "b".to_string())].into(),
            ..Default::default()
        };
        let rec = PodRecord {
            id: new_id().unwrap(),
            config,
            runtime_handler: String::new(),
            state: PodState::Ready,
            created_at: 1,
            infra_pid: 2,
            host_network: false,
            host_pid: false,
            host_ipc: false,
            shared_pid: true,
            shm: None,
            cgroup_parent: "/x".into(),
            cgroup_driver: Default::default(),
            owned_cgroups: vec![],
            ips: vec![],
        };
        rd.save(&rec.id, &rec).unwrap();
        std::fs::write(dir.path().join("broken.json"), b"{").unwrap();
        let back: Vec<PodRecord> = rd.load_all();
        assert_eq!(back.len(), 1, "the torn record is skipped");
        assert_eq!(back[0].config.hostname, "h");
        assert_eq!(back[0].config.labels["a"], "b");
        assert_eq!(rec.id.len(), 64);
    }

    #[test]
    fn temporaries_of_cut_short_writes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let rd = RecordDir::new(dir.path().to_path_buf()).unwrap();
        std::fs::write(dir.path().join("a.json"), b"{}").unwrap();
        std::fs::write(dir.path().join("a.json.123.4.tmp"), b"{").unwrap();
        rd.remove_temporaries();
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("a.json")]);
    }

    #[test]
    fn names_are_reserved_once() {
        let mut i = Index::default();
        i.reserve("n", "a").unwrap();
        assert_eq!(i.reserve("n", "b"), Err("a".into()));
        i.release("n", "b");
        assert!(i.reserve("n", "b").is_err(), "only the holder releases");
        i.release("n", "a");
        i.reserve("n", "b").unwrap();
    }
}
