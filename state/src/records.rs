//! The daemon's records of pods and containers: in memory for serving, and on disk as JSON in a
//! journal per kind (see [`crate::journal`]), so a restart finds them and a torn write cannot
//! corrupt them. CRI configs are kept as their protobuf encoding. A record that cannot be read at
//! start-up is moved to `<root_dir>/records/quarantine/`, and its pod's or container's files are
//! kept.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use crishim_proto::cri;
use crishim_proto::shim::ContainerState;
use crishim_sys::hostfs;
use crishim_sys::shown::shown;

use crate::journal::Journal;
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
    pub cgroup_driver: crishim_proto::cgroups_path::CgroupDriver,
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
    /// The identity its process was given (`process.user` of its spec, with the image's groups
    /// resolved), for `ContainerStatus.user` (KEP-3619).
    #[serde(default)]
    pub user: Option<ProcessUser>,
}

/// A process's uid, gid and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessUser {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
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

/// The largest record read at start-up. A record holds a CRI config (at most the 16 MiB message
/// limit, a third more as base64) and a little state; anything larger is damage.
const MAX_RECORD_BYTES: u64 = 32 << 20;

/// What a record says about itself, checked against the file it was read from.
pub trait Record {
    fn id(&self) -> &str;
}

impl Record for PodRecord {
    fn id(&self) -> &str {
        &self.id
    }
}

impl Record for ContainerRecord {
    fn id(&self) -> &str {
        &self.id
    }
}

/// What [`RecordDir::load_all`] found.
pub struct Loaded<T> {
    pub records: Vec<T>,
    /// The ids (file stems) of records that could not be read and were moved to quarantine.
    pub quarantined: Vec<String>,
}

/// A directory of records, root's alone (0700): a [`Journal`] (`journal`, 0600) keyed by id, each
/// value a record's JSON. Records that cannot be read go to the sibling `quarantine/` directory as
/// `<dir name>-<id>.json`. `<id>.json` files that daemons before the journal wrote are moved into
/// it at start-up.
#[derive(Clone)]
pub struct RecordDir {
    dir: PathBuf,
    journal: std::sync::Arc<Journal>,
}

/// The journal's file name in a record directory.
pub const JOURNAL: &str = "journal";

impl RecordDir {
    pub fn new(dir: PathBuf) -> std::io::Result<Self> {
        hostfs::create_private_dir(&dir)?;
        let quarantine = dir.parent().unwrap_or(&dir).join(QUARANTINE);
        let journal = Journal::open(&dir.join(JOURNAL), MAX_RECORD_BYTES as u32, &quarantine)?;
        Ok(RecordDir {
            dir,
            journal: std::sync::Arc::new(journal),
        })
    }

    /// Where unreadable records are kept for a person to look at: `<records>/quarantine/`.
    pub fn quarantine_dir(&self) -> PathBuf {
        self.dir.parent().unwrap_or(&self.dir).join(QUARANTINE)
    }

    /// Records `value` under `id`, durably (one append and one `fdatasync`).
    pub fn save<T: Serialize>(&self, id: &str, value: &T) -> std::io::Result<()> {
        let json = serde_json::to_vec(value).map_err(std::io::Error::other)?;
        Ok(self.journal.put(id, &json)?)
    }

    pub fn remove(&self, id: &str) -> std::io::Result<()> {
        Ok(self.journal.remove(id)?)
    }

    /// Remove the temporary files of writes that a crash cut short (by daemons before the
    /// journal). Only at start-up, when no write of this process is under way.
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

    /// Every readable record. One that cannot be read (an I/O error, over the size cap, not
    /// JSON of the right shape, or naming another id than its key) is moved to quarantine and
    /// reported, never fatal. Older daemons' `<id>.json` files are moved into the journal first.
    pub fn load_all<T: for<'de> Deserialize<'de> + Record>(&self) -> Loaded<T> {
        let mut loaded = Loaded {
            records: Vec::new(),
            quarantined: Vec::new(),
        };
        self.migrate_files(&mut loaded.quarantined);
        // A key damage took a later write of: what is left of it may be stale (a pod still
        // `Creating`, a container removed), so it is kept aside, and its files with it.
        let suspect = self.journal.suspect_keys();
        for id in suspect {
            match self.journal.get(id) {
                Ok(Some(bytes)) => self.quarantine_bytes(
                    id,
                    &bytes,
                    "a later write of this record was damaged on disk; this is the one before it",
                ),
                _ => {
                    tracing::warn!(record = %shown(id), "a write of this record was damaged on disk; its files are kept")
                }
            }
            loaded.quarantined.push(id.clone());
        }
        for id in self.journal.keys() {
            if suspect.contains(&id) {
                continue;
            }
            let parsed = match self.journal.get(&id) {
                Ok(Some(bytes)) => match serde_json::from_slice::<T>(&bytes) {
                    Ok(r) if r.id() == id => Ok(r),
                    Ok(r) => Err((bytes, format!("it names id {:?}", shown(r.id())))),
                    Err(e) => Err((bytes, e.to_string())),
                },
                Ok(None) => continue,
                Err(e) => Err((Vec::new(), e.to_string())),
            };
            match parsed {
                Ok(r) => loaded.records.push(r),
                Err((bytes, error)) => {
                    self.quarantine_bytes(&id, &bytes, &error);
                    loaded.quarantined.push(id);
                }
            }
        }
        loaded
    }

    /// Moves each `<id>.json` file into the journal; one that cannot be read goes to quarantine.
    fn migrate_files(&self, quarantined: &mut Vec<String>) {
        for (p, id, error) in self.journal.take_files(&self.dir) {
            self.quarantine(&p, &error);
            quarantined.push(id);
        }
    }

    /// The quarantine's file for `name`, under a fresh name if one is taken.
    fn quarantine_path(&self, name: &str) -> PathBuf {
        let kind = self.dir.file_name().unwrap_or_default().to_string_lossy();
        let q = self.quarantine_dir();
        let to = q.join(format!("{kind}-{name}"));
        if to.exists() {
            return q.join(format!("{kind}-{name}.{}", now_nanos()));
        }
        to
    }

    /// Keep the unreadable record `id` in quarantine as it was, and drop it from the journal.
    fn quarantine_bytes(&self, id: &str, bytes: &[u8], error: &str) {
        let to = self.quarantine_path(&format!("{id}.json"));
        let kept = hostfs::create_private_dir(&self.quarantine_dir())
            .and_then(|()| hostfs::write_private(&to, bytes))
            .and_then(|()| Ok(self.journal.remove(id)?));
        self.report_quarantine(id, error, kept);
    }

    /// Move the unreadable record file `p` into quarantine.
    fn quarantine(&self, p: &Path, error: &str) {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        let to = self.quarantine_path(&name);
        let moved = hostfs::create_private_dir(&self.quarantine_dir())
            .and_then(|()| crishim_sys::record::rename_synced(p, &to));
        self.report_quarantine(&name, error, moved);
    }

    fn report_quarantine(&self, name: &str, error: &str, moved: std::io::Result<()>) {
        match moved {
            Ok(()) => tracing::warn!(
                record = %shown(name),
                error = %shown(error),
                quarantine = %self.quarantine_dir().display(),
                "moved an unreadable record to quarantine; its pod or container's files are kept"
            ),
            Err(e) => tracing::warn!(
                record = %shown(name),
                error = %shown(error),
                move_error = %e,
                "skipping an unreadable record that could not be moved to quarantine"
            ),
        }
    }
}

/// The quarantine's directory name, beside `pods/` and `containers/`.
pub const QUARANTINE: &str = "quarantine";

pub use crishim_sys::record::{now_nanos, write_atomic};

/// In-memory index: records by id, and reserved names so two pods (or two containers of one pod)
/// never share a CRI name.
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
    crishim_sys::random::hex(32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_with_protobuf_configs() {
        let root = tempfile::tempdir().unwrap();
        let rd = RecordDir::new(root.path().join("pods")).unwrap();
        let config = cri::PodSandboxConfig {
            hostname: "h".into(),
            labels: [("a".to_string(), "b".to_string())].into(),
            ..Default::default()
        };
        let rec = PodRecord {
            config,
            shared_pid: true,
            cgroup_parent: "/x".into(),
            ..pod_record(&new_id().unwrap())
        };
        rd.save(&rec.id, &rec).unwrap();
        let back = rd.load_all::<PodRecord>().records;
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].config.hostname, "h");
        assert_eq!(back[0].config.labels["a"], "b");
        assert_eq!(rec.id.len(), 64);
    }

    fn pod_record(id: &str) -> PodRecord {
        PodRecord {
            id: id.into(),
            config: Default::default(),
            runtime_handler: String::new(),
            state: PodState::Ready,
            created_at: 1,
            infra_pid: 2,
            host_network: false,
            host_pid: false,
            host_ipc: false,
            shared_pid: false,
            shm: None,
            cgroup_parent: String::new(),
            cgroup_driver: Default::default(),
            owned_cgroups: vec![],
            ips: vec![],
        }
    }

    #[test]
    fn unreadable_records_go_to_quarantine() {
        let root = tempfile::tempdir().unwrap();
        let rd = RecordDir::new(root.path().join("pods")).unwrap();
        rd.save("good", &pod_record("good")).unwrap();
        let dir = root.path().join("pods");
        std::fs::write(dir.join("torn.json"), b"{").unwrap();
        std::fs::write(
            dir.join("liar.json"),
            serde_json::to_vec(&pod_record("x")).unwrap(),
        )
        .unwrap();
        std::fs::create_dir(dir.join("adir.json")).unwrap();
        // A record too large to be one: never read into memory.
        std::fs::File::create(dir.join("huge.json"))
            .unwrap()
            .set_len(MAX_RECORD_BYTES + 1)
            .unwrap();
        // An older daemon's record file: moved into the journal.
        std::fs::write(
            dir.join("old.json"),
            serde_json::to_vec_pretty(&pod_record("old")).unwrap(),
        )
        .unwrap();
        let loaded = rd.load_all::<PodRecord>();
        let mut ids: Vec<_> = loaded.records.iter().map(|r| r.id.as_str()).collect();
        ids.sort();
        assert_eq!(ids, ["good", "old"]);
        let mut q = loaded.quarantined.clone();
        q.sort();
        assert_eq!(q, ["adir", "huge", "liar", "torn"]);
        let mut names: Vec<_> = std::fs::read_dir(rd.quarantine_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "pods-adir.json",
                "pods-huge.json",
                "pods-liar.json",
                "pods-torn.json"
            ]
        );
        assert_eq!(rd.quarantine_dir(), root.path().join("quarantine"));
        assert_eq!(
            std::fs::read(rd.quarantine_dir().join("pods-torn.json")).unwrap(),
            b"{",
            "kept as it was"
        );
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            left,
            [JOURNAL],
            "every file was moved into the journal or quarantine"
        );
        // Moved for good: a reopened directory still has them, and only them.
        let again = RecordDir::new(dir.clone()).unwrap().load_all::<PodRecord>();
        assert_eq!(again.records.len(), 2);
        assert!(again.quarantined.is_empty());
        // A second torn record of the same name does not overwrite the first one's copy.
        std::fs::write(dir.join("torn.json"), b"[").unwrap();
        drop(again);
        assert_eq!(rd.load_all::<PodRecord>().quarantined, ["torn"]);
        assert_eq!(std::fs::read_dir(rd.quarantine_dir()).unwrap().count(), 5);
    }

    #[test]
    fn a_record_whose_later_write_was_damaged_is_kept_aside() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("pods");
        let rd = RecordDir::new(dir.clone()).unwrap();
        let creating = PodRecord {
            state: PodState::Creating,
            ..pod_record("p1")
        };
        rd.save("p1", &creating).unwrap();
        let damaged_at = rd.journal.end();
        rd.save("p1", &pod_record("p1")).unwrap();
        rd.save("p2", &pod_record("p2")).unwrap();
        drop(rd);
        // A flipped bit in the value of p1's Ready write, which p2's write followed.
        let mut bytes = std::fs::read(dir.join(JOURNAL)).unwrap();
        bytes[damaged_at as usize + 20] ^= 1;
        std::fs::write(dir.join(JOURNAL), &bytes).unwrap();
        let loaded = RecordDir::new(dir).unwrap().load_all::<PodRecord>();
        assert_eq!(
            loaded
                .records
                .iter()
                .map(|r| r.id.as_str())
                .collect::<Vec<_>>(),
            ["p2"],
            "p1 is not rolled back as if it were still being created"
        );
        assert_eq!(loaded.quarantined, ["p1"]);
        let kept: Vec<u8> =
            std::fs::read(root.path().join(QUARANTINE).join("pods-p1.json")).unwrap();
        assert_eq!(
            serde_json::from_slice::<PodRecord>(&kept).unwrap().state,
            PodState::Creating
        );
    }

    #[test]
    fn temporaries_of_cut_short_writes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let rd = RecordDir::new(dir.path().to_path_buf()).unwrap();
        std::fs::write(dir.path().join("a.json"), b"{}").unwrap();
        std::fs::write(dir.path().join("a.json.123.4.tmp"), b"{").unwrap();
        rd.remove_temporaries();
        let mut left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["a.json", JOURNAL]);
    }
}
