//! The daemon's state of pods and containers, in the spirit of containerd's `store/sandbox`,
//! `store/container` and name registrar: the records (in memory and on disk), the name
//! reservations, the per-id lifecycle locks and which pods' shims are followed. Every field is
//! private; the RPC handlers go through this narrow API, and no caller holds a lock of it across
//! an `await`.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use crishim_proto::shim::{ContainerState, Status as ShimStatus};
use crishim_sys::shown::shown;

use crate::records::{container_name, pod_name, ContainerRecord, PodRecord, RecordDir};
use crishim_sys::blocking::off_the_workers;

/// Candidates named in an ambiguous-prefix error.
const MAX_CANDIDATES: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{what} id is empty")]
    EmptyId { what: &'static str },
    #[error("{what} {id:?} not found")]
    NotFound { what: &'static str, id: String },
    #[error("{what} id prefix {id:?} is ambiguous: it matches {candidates}; give more of the id")]
    Ambiguous {
        what: &'static str,
        id: String,
        candidates: String,
    },
    #[error("{what} name {name:?} is reserved by {what} {holder}")]
    NameReserved {
        what: &'static str,
        name: String,
        holder: String,
    },
    #[error("saving {what} record {id}: {source}")]
    Io {
        what: &'static str,
        id: String,
        source: std::io::Error,
    },
}

/// Wraps a record file's I/O error with what and whose record it was.
fn io_error<'a>(what: &'static str, id: &'a str) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        what,
        id: id.to_string(),
        source,
    }
}

/// The records in memory, and which names they hold.
#[derive(Default)]
struct Index {
    pods: HashMap<String, PodRecord>,
    containers: HashMap<String, ContainerRecord>,
    names: HashMap<String, String>,
}

impl Index {
    fn reserve(&mut self, name: &str, id: &str) -> Result<(), String> {
        match self.names.get(name) {
            Some(holder) if holder != id => Err(holder.clone()),
            _ => {
                self.names.insert(name.to_string(), id.to_string());
                Ok(())
            }
        }
    }

    fn release(&mut self, name: &str, id: &str) {
        if self.names.get(name).is_some_and(|h| h == id) {
            self.names.remove(name);
        }
    }

    /// The name a container's record holds (its pod's metadata is part of it).
    fn container_name(&self, c: &ContainerRecord) -> Option<String> {
        let m = c.config.metadata.as_ref()?;
        let pod = self.pods.get(&c.pod_id)?.config.metadata.clone()?;
        Some(container_name(m, &pod))
    }
}

pub struct Store {
    pod_records: RecordDir,
    container_records: RecordDir,
    index: Mutex<Index>,
    /// Ids whose record was unreadable at start-up and quarantined: their directories are never
    /// removed as strays.
    quarantined: HashSet<String>,
    /// Serialise lifecycle operations on one pod or container.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Pods whose shim's `Watch` stream is open: their containers' recorded states are current
    /// (operations record what they change, the stream every exit), so reads need no shim call.
    watched: Mutex<HashSet<String>>,
}

impl Store {
    /// Load the records under `records_dir` (`pods/`, `containers/`), quarantining unreadable
    /// ones, and reserve the names they hold.
    pub fn open(records_dir: &Path) -> std::io::Result<Store> {
        let pod_records = RecordDir::new(records_dir.join("pods"))?;
        let container_records = RecordDir::new(records_dir.join("containers"))?;
        pod_records.remove_temporaries();
        container_records.remove_temporaries();
        let pods = pod_records.load_all::<PodRecord>();
        let containers = container_records.load_all::<ContainerRecord>();
        // Their files stay: a person may recover them from the quarantined record.
        let quarantined = pods
            .quarantined
            .into_iter()
            .chain(containers.quarantined)
            .collect();
        let mut index = Index::default();
        for p in pods.records {
            if let Some(m) = &p.config.metadata {
                let _ = index.reserve(&pod_name(m), &p.id);
            }
            index.pods.insert(p.id.clone(), p);
        }
        for c in containers.records {
            if let Some(name) = index.container_name(&c) {
                let _ = index.reserve(&name, &c.id);
            }
            index.containers.insert(c.id.clone(), c);
        }
        Ok(Store {
            pod_records,
            container_records,
            index: Mutex::new(index),
            quarantined,
            locks: Mutex::default(),
            watched: Mutex::default(),
        })
    }

    /// Take the lifecycle lock of one pod or container.
    pub async fn lock(&self, id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let m = self
            .locks
            .lock()
            .unwrap()
            .entry(id.to_string())
            .or_default()
            .clone();
        m.lock_owned().await
    }

    fn forget_lock(&self, id: &str) {
        self.locks.lock().unwrap().remove(id);
    }

    /// The pod `id` names: its full id, or a prefix of exactly one (crictl prints 13 characters).
    pub fn pod(&self, id: &str) -> Result<PodRecord, StoreError> {
        resolve(&self.index.lock().unwrap().pods, id, "pod sandbox").cloned()
    }

    /// The container `id` names: its full id, or a prefix of exactly one.
    pub fn container(&self, id: &str) -> Result<ContainerRecord, StoreError> {
        resolve(&self.index.lock().unwrap().containers, id, "container").cloned()
    }

    /// Reserve a new pod's name for `id`.
    pub fn reserve_pod_name(&self, name: &str, id: &str) -> Result<(), StoreError> {
        self.reserve("pod sandbox", name, id)
    }

    /// Reserve a new container's name for `id`.
    pub fn reserve_container_name(&self, name: &str, id: &str) -> Result<(), StoreError> {
        self.reserve("container", name, id)
    }

    fn reserve(&self, what: &'static str, name: &str, id: &str) -> Result<(), StoreError> {
        self.index
            .lock()
            .unwrap()
            .reserve(name, id)
            .map_err(|holder| StoreError::NameReserved {
                what,
                name: name.to_string(),
                holder,
            })
    }

    /// Give up a name `id` holds (a failed create); a name held by another id stays.
    pub fn release_name(&self, name: &str, id: &str) {
        self.index.lock().unwrap().release(name, id);
    }

    pub fn save_pod(&self, p: &PodRecord) -> Result<(), StoreError> {
        off_the_workers(|| self.pod_records.save(&p.id, p)).map_err(io_error("pod", &p.id))?;
        self.index
            .lock()
            .unwrap()
            .pods
            .insert(p.id.clone(), p.clone());
        Ok(())
    }

    pub fn save_container(&self, c: &ContainerRecord) -> Result<(), StoreError> {
        off_the_workers(|| self.container_records.save(&c.id, c))
            .map_err(io_error("container", &c.id))?;
        self.index
            .lock()
            .unwrap()
            .containers
            .insert(c.id.clone(), c.clone());
        Ok(())
    }

    /// Forget a pod: its record, its name, its lock and whether it was watched.
    pub fn delete_pod(&self, p: &PodRecord) -> Result<(), StoreError> {
        self.pod_records
            .remove(&p.id)
            .map_err(io_error("pod", &p.id))?;
        {
            let mut index = self.index.lock().unwrap();
            index.pods.remove(&p.id);
            if let Some(m) = &p.config.metadata {
                index.release(&pod_name(m), &p.id);
            }
        }
        self.watched.lock().unwrap().remove(&p.id);
        self.forget_lock(&p.id);
        Ok(())
    }

    /// Forget a container: its record, its name and its lock. Idempotent.
    pub fn delete_container(&self, id: &str) {
        let _ = self.container_records.remove(id);
        {
            let mut index = self.index.lock().unwrap();
            if let Some(c) = index.containers.remove(id) {
                if let Some(name) = index.container_name(&c) {
                    index.release(&name, id);
                }
            }
        }
        self.forget_lock(id);
    }

    /// Record a state its shim reported. Returns the record, and whether this is its exit (saved
    /// to disk at once; an exit is final, so later states never replace it). `None`: no such
    /// container.
    pub fn record_state(&self, id: &str, state: ContainerState) -> Option<(ContainerRecord, bool)> {
        let exited =
            |s: &Option<ContainerState>| s.as_ref().is_some_and(|s| s.status == ShimStatus::Exited);
        let record = {
            let mut index = self.index.lock().unwrap();
            let c = index.containers.get_mut(id)?;
            if exited(&c.last) || c.last.as_ref() == Some(&state) {
                return Some((c.clone(), false));
            }
            c.last = Some(state);
            c.clone()
        };
        let now_exited = exited(&record.last);
        if now_exited {
            if let Err(e) = off_the_workers(|| self.container_records.save(&record.id, &record)) {
                tracing::warn!(container = %record.id, error = %e, "saving an exit");
            }
        }
        Some((record, now_exited))
    }

    /// Whether any pod is recorded.
    pub fn has_pods(&self) -> bool {
        !self.index.lock().unwrap().pods.is_empty()
    }

    /// The records of a pod's containers.
    pub fn pod_containers(&self, pod_id: &str) -> Vec<ContainerRecord> {
        self.containers_where(|c| c.pod_id == pod_id)
    }

    pub fn containers_where(
        &self,
        keep: impl Fn(&ContainerRecord) -> bool,
    ) -> Vec<ContainerRecord> {
        let index = self.index.lock().unwrap();
        index
            .containers
            .values()
            .filter(|c| keep(c))
            .cloned()
            .collect()
    }

    pub fn pods_where(&self, keep: impl Fn(&PodRecord) -> bool) -> Vec<PodRecord> {
        self.pods_viewed(|p| keep(p).then(|| p.clone()))
    }

    /// `view` of each pod, under the index's lock (no copy of the records); `None` leaves a pod
    /// out.
    pub fn pods_viewed<T>(&self, view: impl Fn(&PodRecord) -> Option<T>) -> Vec<T> {
        let index = self.index.lock().unwrap();
        index.pods.values().filter_map(view).collect()
    }

    /// One pass over the containers `keep` selects, under the index's lock: each whose recorded
    /// state is current (exited, or its pod's shim is watched) is mapped by `view` in place, with
    /// no copy of its record; the others come back as records, for their shim to be asked.
    pub fn containers_by_state<T>(
        &self,
        keep: impl Fn(&ContainerRecord) -> bool,
        view: impl Fn(&ContainerRecord, &ContainerState) -> T,
    ) -> (Vec<T>, Vec<ContainerRecord>) {
        let watched = self.watched.lock().unwrap();
        let index = self.index.lock().unwrap();
        let (mut known, mut ask) = (Vec::new(), Vec::new());
        for c in index.containers.values().filter(|c| keep(c)) {
            match &c.last {
                Some(s) if s.status == ShimStatus::Exited || watched.contains(&c.pod_id) => {
                    known.push(view(c, s))
                }
                _ => ask.push(c.clone()),
            }
        }
        (known, ask)
    }

    /// The current state of a container whose pod's shim is watched (the store then holds it);
    /// `None` when it is not, or the container has no state yet.
    pub fn watched_state(&self, c: &ContainerRecord) -> Option<ContainerState> {
        if !self.watched.lock().unwrap().contains(&c.pod_id) {
            return None;
        }
        let index = self.index.lock().unwrap();
        index.containers.get(&c.id).and_then(|c| c.last.clone())
    }

    /// Whether the pod's shim `Watch` stream is open (its recorded states are current).
    pub fn set_watched(&self, pod_id: &str, watched: bool) {
        let mut w = self.watched.lock().unwrap();
        if watched {
            w.insert(pod_id.to_string());
        } else {
            w.remove(pod_id);
        }
    }

    /// How many pods' shims are followed (their `Watch` stream is open).
    pub fn watched_count(&self) -> usize {
        self.watched.lock().unwrap().len()
    }

    /// The ids of every pod and every container.
    pub fn ids(&self) -> (HashSet<String>, HashSet<String>) {
        let index = self.index.lock().unwrap();
        (
            index.pods.keys().cloned().collect(),
            index.containers.keys().cloned().collect(),
        )
    }

    /// Whether `id` (a file name found on disk) belongs to a quarantined record.
    pub fn is_quarantined(&self, id: &str) -> bool {
        self.quarantined.contains(id)
    }
}

/// The record with id `id`, or the only one whose id starts with it, as containerd and CRI-O
/// accept. An ambiguous prefix is refused naming some of its candidates.
fn resolve<'a, T>(
    records: &'a HashMap<String, T>,
    id: &str,
    what: &'static str,
) -> Result<&'a T, StoreError> {
    if id.is_empty() {
        return Err(StoreError::EmptyId { what });
    }
    if let Some(r) = records.get(id) {
        return Ok(r);
    }
    let mut hits = records.iter().filter(|(k, _)| k.starts_with(id));
    match (hits.next(), hits.next()) {
        (Some((_, r)), None) => Ok(r),
        (None, _) => Err(StoreError::NotFound {
            what,
            id: shown(id).into_owned(),
        }),
        (Some((a, _)), Some((b, _))) => {
            let mut ids: Vec<&str> = [a, b]
                .into_iter()
                .chain(hits.map(|(k, _)| k))
                .map(String::as_str)
                .collect();
            ids.sort_unstable();
            let more = ids.len().saturating_sub(MAX_CANDIDATES);
            ids.truncate(MAX_CANDIDATES);
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            Err(StoreError::Ambiguous {
                what,
                id: shown(id).into_owned(),
                candidates: format!("{}{tail}", ids.join(", ")),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_key<T: Clone>(keys: &[&str], v: T) -> HashMap<String, T> {
        keys.iter().map(|k| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn ids_resolve_by_unique_prefix() {
        let ids = ["11d7ac32033a6f00", "11d7ac32033a6f01", "22aa", "11d7bb"];
        let m: HashMap<String, usize> = ids
            .iter()
            .enumerate()
            .map(|(i, k)| (k.to_string(), i))
            .collect();
        assert_eq!(resolve(&m, "22aa", "container").unwrap(), &2, "a full id");
        assert_eq!(
            resolve(&m, "22", "container").unwrap(),
            &2,
            "a unique prefix"
        );
        assert_eq!(resolve(&m, "11d7b", "container").unwrap(), &3);
        let e = resolve(&m, "11d7ac32033a6", "container").unwrap_err();
        assert!(matches!(e, StoreError::Ambiguous { .. }), "{e}");
        assert!(
            e.to_string().contains("11d7ac32033a6f00, 11d7ac32033a6f01"),
            "{e}"
        );
        assert!(matches!(
            resolve(&m, "33", "container"),
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            resolve(&m, "", "container"),
            Err(StoreError::EmptyId { .. })
        ));
        let long = "f".repeat(1 << 20);
        assert!(
            resolve(&m, &long, "container")
                .unwrap_err()
                .to_string()
                .len()
                < 400
        );
    }

    #[test]
    fn an_ambiguous_prefix_names_at_most_five_candidates() {
        let keys: Vec<String> = (0..12).map(|i| format!("ab{i:02}")).collect();
        let m = by_key(&keys.iter().map(String::as_str).collect::<Vec<_>>(), ());
        let e = resolve(&m, "ab", "pod sandbox").unwrap_err();
        assert!(
            e.to_string()
                .contains("ab00, ab01, ab02, ab03, ab04 and 7 more"),
            "{e}"
        );
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
