//! The chunk cache of one lazy layer: a sparse file per regular file, under the layer's
//! directory in `root_dir` (root's alone), filled chunk by chunk as reads need them.
//!
//! A chunk is written only once it matched its digest, and only then marked local. What is on
//! disk is not trusted across a restart (a crash can leave a chunk half written): a chunk not
//! yet marked local in this process is hashed again before it is served, and fetched if it
//! does not match.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::toc::Chunk;
use crate::tree::{NodeKind, Tree};

/// Fetches one chunk's bytes, checked against its digest.
pub trait Fetcher: Send + Sync {
    fn fetch(&self, chunk: &Chunk) -> Result<Vec<u8>, FetchFailed>;
}

/// Why a chunk could not be served.
#[derive(Debug, thiserror::Error)]
pub enum FetchFailed {
    /// Its bytes did not match the TOC: never served.
    #[error("chunk at {offset} of the blob failed its digest: {why}")]
    Corrupt { offset: u64, why: String },
    /// The registry did not answer in time, or refused.
    #[error("fetching the chunk at {offset} of the blob: {why}")]
    Unavailable { offset: u64, why: String },
}

/// What the server reports of its cache.
#[derive(Debug, Default)]
pub struct Stats {
    /// Compressed bytes of the chunks that are local.
    pub local_bytes: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub chunk_errors: AtomicU64,
}

pub struct Cache {
    dir: PathBuf,
    tree: Arc<Tree>,
    owners: Vec<u64>,
    local: Vec<AtomicBool>,
    inflight: Mutex<HashSet<usize>>,
    done: Condvar,
    files: Mutex<HashMap<u64, Arc<File>>>,
    fetcher: Box<dyn Fetcher>,
    pub stats: Arc<Stats>,
}

impl Cache {
    pub fn new(dir: PathBuf, tree: Arc<Tree>, fetcher: Box<dyn Fetcher>) -> Cache {
        let owners = tree.chunk_owners();
        let local = (0..tree.chunks.len())
            .map(|_| AtomicBool::new(false))
            .collect();
        Cache {
            dir,
            tree,
            owners,
            local,
            inflight: Mutex::new(HashSet::new()),
            done: Condvar::new(),
            files: Mutex::new(HashMap::new()),
            fetcher,
            stats: Arc::new(Stats::default()),
        }
    }

    /// The cache file of the regular file `ino`, as long as the file (holes where nothing is
    /// local yet).
    pub fn file(&self, ino: u64) -> std::io::Result<Arc<File>> {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = files.get(&ino) {
            return Ok(f.clone());
        }
        let size = match &self.tree.node(ino).kind {
            NodeKind::File { size, .. } => *size,
            _ => return Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.dir.join(ino.to_string()))?;
        if f.metadata()?.len() != size {
            f.set_len(size)?;
        }
        let f = Arc::new(f);
        files.insert(ino, f.clone());
        Ok(f)
    }

    /// Whether every chunk of the file `ino` is local.
    pub fn complete(&self, ino: u64) -> bool {
        match &self.tree.node(ino).kind {
            NodeKind::File { chunks, .. } => chunks
                .clone()
                .all(|c| self.local[c].load(Ordering::Acquire)),
            _ => false,
        }
    }

    /// Make the chunks of `ino` that cover `range` local; the first failure is the answer.
    pub fn ensure(&self, ino: u64, range: std::ops::Range<u64>) -> Result<(), FetchFailed> {
        let NodeKind::File { chunks, .. } = &self.tree.node(ino).kind else {
            return Ok(());
        };
        for i in chunks.clone() {
            let c = &self.tree.chunks[i];
            if c.file_offset + c.size <= range.start || c.file_offset >= range.end {
                continue;
            }
            self.ensure_chunk(i)?;
        }
        Ok(())
    }

    fn ensure_chunk(&self, i: usize) -> Result<(), FetchFailed> {
        if self.local[i].load(Ordering::Acquire) {
            return Ok(());
        }
        // One fetch per chunk: later readers wait for the first.
        {
            let mut inflight = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if self.local[i].load(Ordering::Acquire) {
                    return Ok(());
                }
                if inflight.insert(i) {
                    break;
                }
                inflight = self.done.wait(inflight).unwrap_or_else(|e| e.into_inner());
            }
        }
        let result = self.fill(i);
        if let Err(FetchFailed::Corrupt { .. }) = result {
            self.stats.chunk_errors.fetch_add(1, Ordering::Relaxed);
        }
        if result.is_ok() {
            self.local[i].store(true, Ordering::Release);
            let c = &self.tree.chunks[i];
            self.stats
                .local_bytes
                .fetch_add(c.compressed.end - c.compressed.start, Ordering::Relaxed);
        }
        let mut inflight = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
        inflight.remove(&i);
        self.done.notify_all();
        result
    }

    fn fill(&self, i: usize) -> Result<(), FetchFailed> {
        let c = &self.tree.chunks[i];
        let io = |e: std::io::Error| FetchFailed::Unavailable {
            offset: c.compressed.start,
            why: format!("the chunk cache: {e}"),
        };
        let file = self.file(self.owners[i]).map_err(io)?;
        // A chunk of zeros is the hole the cache file already has there.
        if c.zeros || self.on_disk(&file, c).map_err(io)? {
            return Ok(());
        }
        let data = self.fetcher.fetch(c)?;
        self.stats
            .fetched_bytes
            .fetch_add(c.compressed.end - c.compressed.start, Ordering::Relaxed);
        if data.len() as u64 != c.size {
            return Err(FetchFailed::Corrupt {
                offset: c.compressed.start,
                why: format!("{} bytes where the TOC says {}", data.len(), c.size),
            });
        }
        file.write_all_at(&data, c.file_offset).map_err(io)
    }

    /// Whether the cache file already holds `c`'s bytes (from before a restart): only where
    /// it has data there, and it hashes to the chunk's digest.
    fn on_disk(&self, file: &File, c: &Chunk) -> std::io::Result<bool> {
        let Some(want) = &c.digest else {
            return Ok(false);
        };
        // SAFETY: lseek on an owned, open descriptor.
        let data = unsafe { libc::lseek(file.as_raw_fd(), c.file_offset as i64, libc::SEEK_DATA) };
        if data < 0 || data as u64 >= c.file_offset + c.size {
            return Ok(false);
        }
        let mut buf = vec![0; c.size as usize];
        file.read_exact_at(&mut buf, c.file_offset)?;
        Ok(&crate::sha256(&buf) == want)
    }
}

/// `sha256` over a reader's bytes, for the tests.
#[cfg(test)]
fn hash(b: &[u8]) -> String {
    crate::sha256(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toc::{Entry, Kind, Toc};

    struct Counting {
        data: Vec<u8>,
        calls: AtomicU64,
        corrupt: bool,
    }

    impl Fetcher for Arc<Counting> {
        fn fetch(&self, c: &Chunk) -> Result<Vec<u8>, FetchFailed> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(20));
            let mut d =
                self.data[c.file_offset as usize..(c.file_offset + c.size) as usize].to_vec();
            if self.corrupt {
                d[0] ^= 1;
            }
            if Some(hash(&d)) != c.digest {
                return Err(FetchFailed::Corrupt {
                    offset: c.compressed.start,
                    why: "digest".into(),
                });
            }
            Ok(d)
        }
    }

    fn layer(data: &[u8]) -> Toc {
        let chunks = data
            .chunks(100)
            .enumerate()
            .map(|(i, b)| Chunk {
                file_offset: i as u64 * 100,
                size: b.len() as u64,
                compressed: (i as u64 * 10)..(i as u64 * 10 + 10),
                inner_offset: 0,
                digest: Some(hash(b)),
                zeros: false,
            })
            .collect();
        Toc {
            entries: vec![Entry {
                path: "f".into(),
                kind: Kind::File {
                    size: data.len() as u64,
                    digest: None,
                    chunks,
                },
                mode: 0o644,
                uid: 0,
                gid: 0,
                mtime: None,
                xattrs: vec![],
            }],
            prefetch_before: None,
            dropped_xattrs: 0,
        }
    }

    /// Concurrent readers of one chunk cause one fetch; the bytes land in the cache file; a
    /// new cache over the same directory (a restart) finds them by their digest, and fetches
    /// nothing.
    #[test]
    fn a_chunk_is_fetched_once_and_found_again_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..350u32).map(|i| (i % 251) as u8).collect();
        let tree = Arc::new(Tree::build(&layer(&data), None));
        let f = Arc::new(Counting {
            data: data.clone(),
            calls: AtomicU64::new(0),
            corrupt: false,
        });
        let cache = Arc::new(Cache::new(
            dir.path().into(),
            tree.clone(),
            Box::new(f.clone()),
        ));
        let ino = tree.lookup(crate::tree::ROOT, "f").unwrap();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let cache = cache.clone();
                std::thread::spawn(move || cache.ensure(ino, 120..130).unwrap())
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(f.calls.load(Ordering::SeqCst), 1);
        cache.ensure(ino, 0..350).unwrap();
        assert_eq!(f.calls.load(Ordering::SeqCst), 4);
        assert!(cache.complete(ino));
        let mut got = vec![0; 350];
        cache.file(ino).unwrap().read_exact_at(&mut got, 0).unwrap();
        assert_eq!(got, data);

        let again = Cache::new(dir.path().into(), tree.clone(), Box::new(f.clone()));
        again.ensure(ino, 0..350).unwrap();
        assert_eq!(
            f.calls.load(Ordering::SeqCst),
            4,
            "the restart fetched again"
        );
        // A chunk changed on disk is fetched again, not served.
        let file = again.file(ino).unwrap();
        file.write_all_at(b"X", 205).unwrap();
        let third = Cache::new(dir.path().into(), tree, Box::new(f.clone()));
        third.ensure(ino, 200..210).unwrap();
        assert_eq!(f.calls.load(Ordering::SeqCst), 5);
    }

    /// A chunk that fails its digest is never written or marked local, and is counted.
    #[test]
    fn a_corrupt_chunk_is_refused_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![7u8; 150];
        let tree = Arc::new(Tree::build(&layer(&data), None));
        let f = Arc::new(Counting {
            data,
            calls: AtomicU64::new(0),
            corrupt: true,
        });
        let cache = Cache::new(dir.path().into(), tree.clone(), Box::new(f));
        let ino = tree.lookup(crate::tree::ROOT, "f").unwrap();
        assert!(matches!(
            cache.ensure(ino, 0..10),
            Err(FetchFailed::Corrupt { .. })
        ));
        assert!(!cache.complete(ino));
        assert_eq!(cache.stats.chunk_errors.load(Ordering::SeqCst), 1);
        let mut got = vec![1; 100];
        cache.file(ino).unwrap().read_exact_at(&mut got, 0).unwrap();
        assert_eq!(got, vec![0; 100], "nothing was written");
    }
}
