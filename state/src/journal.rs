//! A durable map from keys to values kept as one append-only file of checksummed frames: each
//! write is one append and one `fdatasync`. A file per value, replaced by rename, costs a new inode,
//! a second `fsync` (of the directory) and a freed inode on every write; on a pod start that was
//! a sixth of the node's CPU (see the README's figures).
//!
//! Layout: the 8-byte [`MAGIC`], then frames of `len: u32 LE`, `crc32(payload): u32 LE` and a
//! `payload` of `op: u8` (1 put, 2 remove), `key_len: u8`, the key, and for a put the value.
//! The latest frame of a key wins. At open the file is replayed up to its first frame that is
//! incomplete or fails its checks: that is where a crash cut an unacknowledged append short (an
//! append is acknowledged only after its `fdatasync`). The bytes from there on are copied to the
//! quarantine directory for a person, and cut off. When the file holds more than twice its live
//! frames, it is rewritten with only those (temp file, `fdatasync`, rename, directory `fsync`).
//!
//! The file is grown ahead of the frames, [`GROW_BY`] bytes of zeros at a time: an append then
//! writes into blocks the file system has already allocated, and its `fdatasync` writes that
//! data alone, not the inode and the block allocation an append past the end needs. A replay
//! stops where only zeros are left.
//!
//! Concurrent puts share their `fdatasync` (group commit): a writer appends under the lock, then
//! syncs outside it, and one `fdatasync` covers every frame appended before it began. Writers
//! that come while one runs wait for it, and the first of them syncs for the rest; appends no
//! longer wait behind a sync in progress. (In a 110-pod burst the puts seldom overlap: 9 % fewer
//! calls.)

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crishim_sys::hostfs;

pub const MAGIC: &[u8; 8] = b"crjrnl01";
const HEAD: u64 = 8;
/// A frame's bytes before its key: `len`, `crc32`, `op`, `key_len`.
const FRAME_HEAD: u64 = 10;
const OP_PUT: u8 = 1;
const OP_REMOVE: u8 = 2;
/// Keys are record ids: 64 hex digits today.
pub const MAX_KEY: usize = 255;
/// Damaged ranges copied to quarantine at one open; any more are only counted in the log.
const MAX_KEPT_DAMAGE: usize = 16;
/// Rewrite only past this size, so small journals are never rewritten.
const COMPACT_AT: u64 = 1 << 20;
/// How far past its frames the file is grown with zeros at a time.
pub const GROW_BY: u64 = 128 << 10;

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a crishim journal (its first bytes are not the journal's magic)")]
    NotAJournal { path: PathBuf },
    #[error("key {0:?} is empty or over {MAX_KEY} bytes")]
    BadKey(String),
    #[error("a value of {len} bytes is over the {max}-byte cap")]
    TooLarge { len: usize, max: u32 },
    #[error("{path}: an earlier write failed half-way and could not be undone; restart the daemon to recover the journal")]
    Poisoned { path: PathBuf },
}

impl From<JournalError> for std::io::Error {
    fn from(e: JournalError) -> Self {
        let kind = match &e {
            JournalError::Io { source, .. } => source.kind(),
            JournalError::BadKey(_) | JournalError::TooLarge { .. } => {
                std::io::ErrorKind::InvalidInput
            }
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e.to_string())
    }
}

/// Where a key's latest value sits in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The frame's first byte.
    pub at: u64,
    /// The whole frame, head included.
    pub frame_len: u64,
    pub value_at: u64,
    pub value_len: u32,
}

impl Slot {
    /// The frame at `at` of a key of `key_len` bytes and a value of `value_len`.
    fn new(at: u64, key_len: u64, value_len: u32) -> Slot {
        let value_at = at + FRAME_HEAD + key_len;
        Slot {
            at,
            frame_len: value_at + u64::from(value_len) - at,
            value_at,
            value_len,
        }
    }
}

/// Applies one valid frame to an index of the latest frames and their live bytes: the same
/// whether it was replayed or just appended.
fn apply(index: &mut HashMap<String, Slot>, live: &mut u64, op: u8, key: String, slot: Slot) {
    if let Some(old) = index.remove(&key) {
        *live -= old.frame_len;
    }
    if op == OP_PUT {
        *live += slot.frame_len;
        index.insert(key, slot);
    }
}

/// What a replay found: the live keys, and the byte ranges it skipped.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replay {
    pub index: HashMap<String, Slot>,
    /// Bytes of live frames, the magic not counted.
    pub live: u64,
    /// The end of the last valid frame.
    pub valid_end: u64,
    /// Where the zeros the file was grown with begin (its size, without any).
    pub zeros_from: u64,
    /// Ranges that are not valid frames: a frame that damage or a crash cut short, up to the next
    /// valid frame or the end of the file.
    pub damaged: Vec<(u64, u64)>,
    /// The keys that damage before the last valid frame seems to name (a cut-short last frame
    /// is a crash's unacknowledged write, not damage): their latest value may be lost.
    pub suspect: Vec<String>,
}

/// Bytes that can be read at any offset: the journal file, or a slice for the fuzz target.
pub trait Source {
    /// Fills `buf` from `at`; the caller never reads past [`Source::size`].
    fn read_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()>;
    fn size(&self) -> u64;
}

impl Source for [u8] {
    fn read_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        let at = at as usize;
        buf.copy_from_slice(&self[at..at + buf.len()]);
        Ok(())
    }
    fn size(&self) -> u64 {
        self.len() as u64
    }
}

/// The file, with its length when it was opened.
struct FileSource<'a>(&'a File, u64);

impl Source for FileSource<'_> {
    fn read_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        self.0.read_exact_at(buf, at)
    }
    fn size(&self) -> u64 {
        self.1
    }
}

/// One valid frame, as found in a source.
struct Found {
    op: u8,
    key: String,
    slot: Slot,
}

/// How many bytes a replay may hash while looking for the next valid frame past damage: bounds
/// the work on a file of garbage whose every byte claims a long frame.
const RESYNC_BUDGET: u64 = 64 << 20;

/// Replays the frames of `src` after its magic. Past a frame that is cut short or fails its
/// checks, looks for the next valid frame byte by byte (a value is JSON, which holds no raw
/// control bytes, so no frame head can hide inside one). Never allocates for a value. Errors are
/// the source's.
pub fn replay<S: Source + ?Sized>(src: &S, max_value: u32) -> std::io::Result<Replay> {
    let mut out = Replay {
        valid_end: HEAD,
        ..Replay::default()
    };
    let mut budget = RESYNC_BUDGET;
    let mut at = HEAD;
    out.zeros_from = zeros_from(src)?.max(HEAD);
    // No frame starts in the zeros (its length would be 0): they are where the frames end.
    while at < out.zeros_from {
        let mut unbounded = u64::MAX;
        let found = match frame_at(src, at, max_value, &mut unbounded)? {
            Some(f) => Some((at, f)),
            None => {
                let next = resync(src, at + 1, max_value, &mut budget)?;
                let damaged_to = next.as_ref().map_or(out.zeros_from, |(n, _)| *n);
                out.damaged.push((at, damaged_to));
                if next.is_some() {
                    out.suspect.extend(named_key(src, at, damaged_to)?);
                }
                next
            }
        };
        let Some((start, f)) = found else { break };
        at = start + f.slot.frame_len;
        out.valid_end = at;
        apply(&mut out.index, &mut out.live, f.op, f.key, f.slot);
    }
    Ok(out)
}

/// Where the run of zero bytes that ends `src` begins (its size where the last byte is not zero).
/// Reads only that run and the block before it.
fn zeros_from<S: Source + ?Sized>(src: &S) -> std::io::Result<u64> {
    let mut end = src.size();
    let mut buf = vec![0u8; 64 << 10];
    while end > 0 {
        let n = end.min(buf.len() as u64) as usize;
        let chunk = &mut buf[..n];
        src.read_at(chunk, end - n as u64)?;
        if let Some(last) = chunk.iter().rposition(|&b| b != 0) {
            return Ok(end - n as u64 + last as u64 + 1);
        }
        end -= n as u64;
    }
    Ok(0)
}

/// The key a damaged frame at `at` names, if its head and key are whole and look like an id.
fn named_key<S: Source + ?Sized>(src: &S, at: u64, to: u64) -> std::io::Result<Option<String>> {
    let mut len = [0u8; 1];
    if at + FRAME_HEAD > to {
        return Ok(None);
    }
    src.read_at(&mut len, at + FRAME_HEAD - 1)?;
    let n = u64::from(len[0]);
    if n == 0 || at + FRAME_HEAD + n > to {
        return Ok(None);
    }
    let mut key = vec![0u8; n as usize];
    src.read_at(&mut key, at + FRAME_HEAD)?;
    let plausible = key
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    Ok(plausible.then(|| String::from_utf8(key).expect("ASCII")))
}

/// The first valid frame at or after `from`, within the hashing `budget`.
fn resync<S: Source + ?Sized>(
    src: &S,
    from: u64,
    max_value: u32,
    budget: &mut u64,
) -> std::io::Result<Option<(u64, Found)>> {
    for at in from..src.size() {
        if *budget == 0 {
            return Ok(None);
        }
        if let Some(f) = frame_at(src, at, max_value, budget)? {
            return Ok(Some((at, f)));
        }
    }
    Ok(None)
}

/// The frame at `at` if it is whole and valid. Hashing its payload counts against `budget`.
fn frame_at<S: Source + ?Sized>(
    src: &S,
    at: u64,
    max_value: u32,
    budget: &mut u64,
) -> std::io::Result<Option<Found>> {
    let size = src.size();
    if at + FRAME_HEAD > size {
        return Ok(None);
    }
    let mut head = [0u8; FRAME_HEAD as usize];
    src.read_at(&mut head, at)?;
    let len = u64::from(u32::from_le_bytes(head[0..4].try_into().expect("4 bytes")));
    let crc = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
    let (op, key_len) = (head[8], u64::from(head[9]));
    let max_payload = 2 + MAX_KEY as u64 + u64::from(max_value);
    if len > max_payload || len < 2 + key_len || key_len == 0 || at + 8 + len > size {
        return Ok(None);
    }
    let value_len = len - 2 - key_len;
    if !matches!(op, OP_PUT | OP_REMOVE) || (op == OP_REMOVE && value_len != 0) {
        return Ok(None);
    }
    if *budget < len {
        *budget = 0;
        return Ok(None);
    }
    *budget -= len;
    let mut key = vec![0u8; key_len as usize];
    src.read_at(&mut key, at + FRAME_HEAD)?;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&head[8..10]);
    hasher.update(&key);
    let mut buf = vec![0u8; value_len.min(64 << 10) as usize];
    let mut done = 0;
    while done < value_len {
        let n = (value_len - done).min(buf.len() as u64) as usize;
        src.read_at(&mut buf[..n], at + FRAME_HEAD + key_len + done)?;
        hasher.update(&buf[..n]);
        done += n as u64;
    }
    let Ok(key) = String::from_utf8(key) else {
        return Ok(None);
    };
    if hasher.finalize() != crc {
        return Ok(None);
    }
    Ok(Some(Found {
        op,
        key,
        slot: Slot::new(at, key_len, value_len as u32),
    }))
}

/// One frame, ready to append.
fn frame(op: u8, key: &str, value: &[u8]) -> Vec<u8> {
    let len = 2 + key.len() + value.len();
    let mut f = Vec::with_capacity(8 + len);
    f.extend_from_slice(&(len as u32).to_le_bytes());
    f.extend_from_slice(&[0; 4]);
    f.push(op);
    f.push(key.len() as u8);
    f.extend_from_slice(key.as_bytes());
    f.extend_from_slice(value);
    let crc = crc32fast::hash(&f[8..]);
    f[4..8].copy_from_slice(&crc.to_le_bytes());
    f
}

pub struct Journal {
    path: PathBuf,
    max_value: u32,
    inner: Mutex<Inner>,
    /// Held by the writer whose `fdatasync` is running; the others wait on it.
    syncing: Mutex<()>,
    suspect: Vec<String>,
}

struct Inner {
    /// Shared with a sync running outside the lock; a rewrite puts a new file here.
    file: Arc<File>,
    /// The end of the last frame, where the next is appended.
    end: u64,
    /// The file's size: `end` and the zeros past it (see [`GROW_BY`]).
    size: u64,
    index: HashMap<String, Slot>,
    live: u64,
    /// A failed append could not be cut back off: nothing more may be appended after it.
    poisoned: bool,
    /// Frames appended so far (a count that only grows), and how many of them are on disk.
    appended: u64,
    durable: u64,
    /// The file's length up to the last durable frame: where a failed sync cuts back to.
    durable_end: u64,
    /// Bumped when a failed sync cut frames off: their writers are told so.
    epoch: u64,
    /// `fdatasync` calls made for appends.
    syncs: u64,
}

/// Grows the file with zeros to hold frames up to `end`: to the next multiple of [`GROW_BY`]
/// past it. Synced with the append that needed it.
fn grow(inner: &mut Inner, end: u64) -> std::io::Result<()> {
    if end <= inner.size {
        return Ok(());
    }
    let to = (end / GROW_BY + 1) * GROW_BY;
    let zeros = vec![0u8; (to - inner.size) as usize];
    inner.file.write_all_at(&zeros, inner.size)?;
    inner.size = to;
    Ok(())
}

impl Inner {
    /// Everything appended is on disk (after a rewrite, or at open).
    fn all_durable(&mut self) {
        self.durable = self.appended;
        self.durable_end = self.end;
    }
}

impl Journal {
    /// Opens (or creates, 0600) the journal at `path`, replaying it. Bytes that are no valid
    /// frame are copied to `quarantine/<file name>-damaged-<offset>-<nanos>`, and the journal is
    /// rewritten without them.
    pub fn open(path: &Path, max_value: u32, quarantine: &Path) -> Result<Journal, JournalError> {
        let io = |source| JournalError::Io {
            path: path.to_path_buf(),
            source,
        };
        // A rewrite a crash interrupted: the journal itself is still whole.
        let _ = std::fs::remove_file(path.with_extension("compact"));
        let file = open_rw(path, false).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut start = vec![0u8; len.min(HEAD) as usize];
        file.read_exact_at(&mut start, 0).map_err(io)?;
        if len < HEAD && MAGIC.starts_with(&start) {
            // New, or a crash came before its magic was synced.
            file.set_len(0).map_err(io)?;
            file.write_all_at(MAGIC, 0).map_err(io)?;
            file.sync_data().map_err(io)?;
            if let Some(dir) = path.parent() {
                hostfs::sync_dir(dir).map_err(io)?;
            }
            start = MAGIC.to_vec();
        }
        if start != MAGIC {
            return Err(JournalError::NotAJournal {
                path: path.to_path_buf(),
            });
        }
        let size = file.metadata().map_err(io)?.len();
        let replay = replay(&FileSource(&file, size), max_value).map_err(io)?;
        for &(from, to) in replay.damaged.iter().take(MAX_KEPT_DAMAGE) {
            keep_damage(path, &file, from, to, quarantine);
        }
        if replay.damaged.len() > MAX_KEPT_DAMAGE {
            tracing::warn!(
                journal = %path.display(),
                ranges = replay.damaged.len(),
                kept = MAX_KEPT_DAMAGE,
                "the journal had more damaged ranges than are kept in quarantine"
            );
        }
        let journal = Journal {
            path: path.to_path_buf(),
            max_value,
            inner: Mutex::new(Inner {
                file: Arc::new(file),
                end: replay.valid_end,
                size,
                index: replay.index,
                live: replay.live,
                poisoned: false,
                appended: 0,
                durable: 0,
                durable_end: replay.valid_end,
                epoch: 0,
                syncs: 0,
            }),
            syncing: Mutex::new(()),
            suspect: replay.suspect,
        };
        let mut inner = journal.lock();
        if replay.damaged.is_empty() {
            journal.compact_if_sparse(&mut inner);
        } else if let Err(e) = journal.compact(&mut inner) {
            // Damage stays behind in the file (found and skipped again at the next start), but
            // a cut-short last frame must go: the next append follows the last valid frame.
            tracing::warn!(path = %path.display(), error = %e, "rewriting a damaged journal");
            if replay
                .damaged
                .last()
                .is_some_and(|&(_, to)| to == replay.zeros_from)
            {
                inner.file.set_len(replay.valid_end).map_err(io)?;
                inner.file.sync_data().map_err(io)?;
                inner.end = replay.valid_end;
                inner.size = replay.valid_end;
                inner.all_durable();
            }
        }
        drop(inner);
        Ok(journal)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves `Inner` consistent: every change to it comes
        // after its write succeeded.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where its frames end: the bytes of the file in use (zeros follow).
    pub fn end(&self) -> u64 {
        self.lock().end
    }

    /// Keys whose latest value damage found at open may have taken (see [`Replay::suspect`]).
    pub fn suspect_keys(&self) -> &[String] {
        &self.suspect
    }

    pub fn keys(&self) -> Vec<String> {
        self.lock().index.keys().cloned().collect()
    }

    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, JournalError> {
        let inner = self.lock();
        let Some(slot) = inner.index.get(key) else {
            return Ok(None);
        };
        let mut value = vec![0u8; slot.value_len as usize];
        inner
            .file
            .read_exact_at(&mut value, slot.value_at)
            .map_err(|source| self.io(source))?;
        Ok(Some(value))
    }

    /// Sets `key` to `value`, durably: on return the value survives a crash.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), JournalError> {
        check_key(key)?;
        if value.len() > self.max_value as usize {
            return Err(JournalError::TooLarge {
                len: value.len(),
                max: self.max_value,
            });
        }
        self.append(OP_PUT, key, value, true)
    }

    /// Removes `key`; a missing key writes nothing. Not synced on its own: the next put's
    /// `fdatasync` carries it. A removal a crash loses brings back the record of something
    /// already gone, which start-up recovery finds dead and the kubelet removes again, as
    /// with the unlinked record files before the journal.
    pub fn remove(&self, key: &str) -> Result<(), JournalError> {
        if !self.lock().index.contains_key(key) {
            return Ok(());
        }
        self.append(OP_REMOVE, key, &[], false)
    }

    fn append(&self, op: u8, key: &str, value: &[u8], sync: bool) -> Result<(), JournalError> {
        let f = frame(op, key, value);
        let (seq, epoch) = {
            let mut inner = self.lock();
            if inner.poisoned {
                return Err(JournalError::Poisoned {
                    path: self.path.clone(),
                });
            }
            let at = inner.end;
            let end = at + f.len() as u64;
            if let Err(source) =
                grow(&mut inner, end).and_then(|()| inner.file.write_all_at(&f, at))
            {
                // Cut off what may have reached the file, so that the next append follows
                // valid frames; if that fails too, nothing more is appended.
                if inner
                    .file
                    .set_len(at)
                    .and_then(|()| inner.file.sync_data())
                    .is_err()
                {
                    inner.poisoned = true;
                }
                inner.size = at;
                return Err(self.io(source));
            }
            inner.end = end;
            inner.appended += 1;
            let slot = Slot::new(at, key.len() as u64, value.len() as u32);
            let inner = &mut *inner;
            apply(&mut inner.index, &mut inner.live, op, key.to_string(), slot);
            if !sync {
                self.compact_if_sparse(inner);
                return Ok(());
            }
            (inner.appended, inner.epoch)
        };
        self.sync_through(seq, epoch)
    }

    /// Returns once frame `seq` (appended in `epoch`) is on disk: synced by this call, or by
    /// one that began after it was appended.
    fn sync_through(&self, seq: u64, epoch: u64) -> Result<(), JournalError> {
        let _syncing = self.syncing.lock().unwrap_or_else(|p| p.into_inner());
        let (file, target, target_end) = {
            let inner = self.lock();
            if inner.epoch != epoch {
                return Err(self.io(std::io::Error::other(
                    "an fdatasync of the journal failed before this write was on disk",
                )));
            }
            if inner.durable >= seq {
                return Ok(());
            }
            (inner.file.clone(), inner.appended, inner.end)
        };
        let synced = file.sync_data();
        let mut inner = self.lock();
        inner.syncs += 1;
        if !Arc::ptr_eq(&file, &inner.file) {
            // Rewritten meanwhile: the new file holds every frame, synced.
            return Ok(());
        }
        match synced {
            Ok(()) => {
                inner.durable = inner.durable.max(target);
                inner.durable_end = inner.durable_end.max(target_end);
                self.compact_if_sparse(&mut inner);
                Ok(())
            }
            Err(source) => {
                // A failed fdatasync leaves the page cache's state unknown: every frame past the
                // last durable one is cut off (their writers are told), the file synced again and
                // its index rebuilt. If that fails too, nothing more is appended.
                self.cut_to_durable(&mut inner);
                Err(self.io(source))
            }
        }
    }

    fn cut_to_durable(&self, inner: &mut Inner) {
        let cut = inner.durable_end;
        let undone = inner
            .file
            .set_len(cut)
            .and_then(|()| inner.file.sync_data())
            .and_then(|()| replay(&FileSource(&inner.file, cut), self.max_value));
        match undone {
            Ok(replay) => {
                inner.end = cut;
                inner.size = cut;
                inner.index = replay.index;
                inner.live = replay.live;
                inner.all_durable();
            }
            Err(_) => inner.poisoned = true,
        }
        inner.epoch += 1;
    }

    /// Moves each `<key>.json` file in `dir` (older daemons kept a file per key) into the
    /// journal, as it is, and removes the file once the journal holds it. Returns those it could
    /// not move (unreadable, over the value cap, refused), with their key and why, for the
    /// caller to deal with; they are left where they are.
    pub fn take_files(&self, dir: &Path) -> Vec<(PathBuf, String, String)> {
        let mut left = Vec::new();
        let Ok(entries) = std::fs::read_dir(dir) else {
            return left;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let key = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let moved = read_capped(&p, u64::from(self.max_value))
                .and_then(|bytes| self.put(&key, &bytes).map_err(|e| e.to_string()));
            match moved {
                Ok(()) => {
                    if let Err(e) = std::fs::remove_file(&p) {
                        tracing::warn!(path = %p.display(), error = %e, "removing a file moved into the journal");
                    }
                }
                Err(why) => left.push((p, key, why)),
            }
        }
        left
    }

    fn io(&self, source: std::io::Error) -> JournalError {
        JournalError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Rewrites the file with only its live frames once they are under half of it. A failure
    /// leaves the old file, which is still whole, in use.
    fn compact_if_sparse(&self, inner: &mut Inner) {
        if inner.end < COMPACT_AT || inner.end < 2 * (HEAD + inner.live) {
            return;
        }
        if let Err(e) = self.compact(inner) {
            tracing::warn!(path = %self.path.display(), error = %e, "rewriting the journal without its old frames");
        }
    }

    fn compact(&self, inner: &mut Inner) -> std::io::Result<()> {
        let tmp = self.path.with_extension("compact");
        let mut out = open_rw(&tmp, true)?;
        let copied = (|| {
            out.write_all(MAGIC)?;
            let mut index = HashMap::with_capacity(inner.index.len());
            let mut at = HEAD;
            let mut buf = Vec::new();
            for (key, slot) in &inner.index {
                buf.resize(slot.frame_len as usize, 0);
                inner.file.read_exact_at(&mut buf, slot.at)?;
                out.write_all(&buf)?;
                let slot = Slot {
                    at,
                    value_at: slot.value_at - slot.at + at,
                    ..*slot
                };
                at += slot.frame_len;
                index.insert(key.clone(), slot);
            }
            out.sync_data()?;
            crishim_sys::record::rename_synced(&tmp, &self.path)?;
            Ok((index, at))
        })();
        match copied {
            Ok((index, end)) => {
                inner.file = Arc::new(out);
                inner.index = index;
                inner.end = end;
                inner.size = end;
                inner.all_durable();
                Ok(())
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }
}

/// The bytes of the file at `p`, up to `max`: a larger one is an error, and is not read.
fn read_capped(p: &Path, max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let f = File::open(p).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    if len > max {
        return Err(format!("{len} bytes, over the {max}-byte cap"));
    }
    let mut buf = Vec::with_capacity(len as usize);
    // The length is rechecked while reading: the file may have grown since.
    f.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| e.to_string())?;
    if buf.len() as u64 > max {
        return Err(format!("over the {max}-byte cap"));
    }
    Ok(buf)
}

/// Opens `path` to read and write, creating it root's alone (0600); `truncate` empties it.
fn open_rw(path: &Path, truncate: bool) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(truncate)
        .mode(hostfs::FILE_MODE)
        .open(path)
}

fn check_key(key: &str) -> Result<(), JournalError> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(JournalError::BadKey(key.chars().take(64).collect()));
    }
    Ok(())
}

/// Copies the damaged bytes from `from` to `to` of the journal into quarantine, for a person.
fn keep_damage(path: &Path, file: &File, from: u64, to: u64, quarantine: &Path) {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let dest = quarantine.join(format!(
        "{name}-damaged-{from}-{}",
        crishim_sys::record::now_nanos()
    ));
    // A frame cut short by a crash is a few KiB; of damage, at most 32 MiB is kept.
    let keep = (to - from).min(32 << 20);
    let kept = (|| {
        hostfs::create_private_dir(quarantine)?;
        let mut buf = vec![0u8; keep as usize];
        file.read_exact_at(&mut buf, from)?;
        hostfs::write_private(&dest, &buf)
    })();
    match kept {
        Ok(()) => tracing::warn!(
            journal = %path.display(),
            offset = from,
            bytes = to - from,
            kept = %dest.display(),
            "skipped bytes of the journal that are no valid frame: a write a crash cut short (never acknowledged) or damage"
        ),
        Err(e) => tracing::warn!(
            journal = %path.display(),
            offset = from,
            bytes = to - from,
            error = %e,
            "skipped bytes of the journal that are no valid frame; they could not be kept"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture {
        _t: tempfile::TempDir,
        path: PathBuf,
        quarantine: PathBuf,
    }

    fn fixture() -> Fixture {
        let t = tempfile::tempdir().unwrap();
        Fixture {
            path: t.path().join("journal"),
            quarantine: t.path().join("quarantine"),
            _t: t,
        }
    }

    impl Fixture {
        fn open(&self) -> Journal {
            Journal::open(&self.path, 1 << 20, &self.quarantine).unwrap()
        }
        fn len(&self) -> u64 {
            std::fs::metadata(&self.path).unwrap().len()
        }
        /// What the journal kept in quarantine.
        fn kept(&self) -> Vec<Vec<u8>> {
            std::fs::read_dir(&self.quarantine)
                .unwrap()
                .map(|e| std::fs::read(e.unwrap().path()).unwrap())
                .collect()
        }
    }

    fn sorted_keys(j: &Journal) -> Vec<String> {
        let mut keys = j.keys();
        keys.sort();
        keys
    }

    #[test]
    fn the_latest_write_of_each_key_survives_a_reopen() {
        let f = fixture();
        let j = f.open();
        j.put("a", b"1").unwrap();
        j.put("b", b"2").unwrap();
        j.put("a", b"3").unwrap();
        j.remove("b").unwrap();
        j.put("c", b"").unwrap();
        drop(j);
        let j = f.open();
        assert_eq!(sorted_keys(&j), ["a", "c"]);
        assert_eq!(j.get("a").unwrap().unwrap(), b"3");
        assert_eq!(j.get("c").unwrap().unwrap(), b"");
        assert_eq!(j.get("b").unwrap(), None);
    }

    #[test]
    fn the_file_grows_ahead_of_the_frames_and_appends_follow_the_last_frame() {
        let f = fixture();
        let j = f.open();
        j.put("a", b"1").unwrap();
        let size = f.len();
        assert!(size.is_multiple_of(GROW_BY));
        assert!(size > j.end(), "grown past its frames");
        let bytes = std::fs::read(&f.path).unwrap();
        assert!(bytes[j.end() as usize..].iter().all(|&b| b == 0));
        drop(j);
        let j = f.open();
        j.put("b", b"2").unwrap();
        j.remove("a").unwrap();
        j.put("c", b"3").unwrap();
        assert_eq!(f.len(), size, "written into the zeros, not grown again");
        drop(j);
        let j = f.open();
        assert_eq!(sorted_keys(&j), ["b", "c"]);
        assert!(!f.quarantine.exists(), "the zeros are no damage");
        // Frames past the zeros' first block grow it again.
        let value = vec![b'x'; GROW_BY as usize];
        j.put("big", &value).unwrap();
        assert!(f.len() > size && f.len().is_multiple_of(GROW_BY));
        drop(j);
        assert_eq!(f.open().get("big").unwrap().unwrap(), value);
    }

    #[test]
    fn writers_that_wait_on_a_sync_share_the_next_one() {
        let f = fixture();
        let j = Arc::new(f.open());
        // Hold the sync: four writers append, then all wait on it.
        let held = j.syncing.lock().unwrap();
        let writers: Vec<_> = (0..4)
            .map(|i| {
                let j = j.clone();
                std::thread::spawn(move || j.put(&format!("k{i}"), b"v").unwrap())
            })
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while j.lock().appended < 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "the writers never appended"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(held);
        for w in writers {
            w.join().unwrap();
        }
        let inner = j.lock();
        assert_eq!(inner.syncs, 1, "one fdatasync covers the four appends");
        assert_eq!(inner.durable, 4);
        assert_eq!(inner.durable_end, inner.end);
        drop(inner);
        drop(j);
        assert_eq!(sorted_keys(&f.open()), ["k0", "k1", "k2", "k3"]);
    }

    #[test]
    fn a_failed_sync_cuts_the_frames_it_did_not_cover_and_tells_their_writers() {
        let f = fixture();
        let j = f.open();
        j.put("kept", b"1").unwrap();
        // A put whose sync has not run yet (appended, as a removal is, without one).
        j.append(OP_PUT, "lost", b"2", false).unwrap();
        let (seq, epoch) = {
            let inner = j.lock();
            (inner.appended, inner.epoch)
        };
        assert_eq!(j.get("lost").unwrap().unwrap(), b"2");
        // What a failed fdatasync does.
        j.cut_to_durable(&mut j.lock());
        assert_eq!(j.get("lost").unwrap(), None);
        assert_eq!(sorted_keys(&j), ["kept"]);
        let told = j.sync_through(seq, epoch).unwrap_err().to_string();
        assert!(told.contains("before this write was on disk"), "{told}");
        // Writes go on after it, and the file holds exactly what was acknowledged.
        j.put("after", b"3").unwrap();
        drop(j);
        let j = f.open();
        assert_eq!(sorted_keys(&j), ["after", "kept"]);
        assert!(!f.quarantine.exists() || f.kept().is_empty());
    }

    #[test]
    fn the_file_is_root_only() {
        use std::os::unix::fs::MetadataExt;
        let f = fixture();
        f.open().put("a", b"1").unwrap();
        assert_eq!(std::fs::metadata(&f.path).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn removing_a_missing_key_writes_nothing() {
        let f = fixture();
        let j = f.open();
        let before = f.len();
        j.remove("nothing").unwrap();
        assert_eq!(f.len(), before);
    }

    #[test]
    fn a_cut_short_append_is_cut_off_and_kept_in_quarantine() {
        let f = fixture();
        let j = f.open();
        j.put("a", b"kept").unwrap();
        let whole = j.end();
        j.put("b", b"cut short").unwrap();
        let torn_end = j.end();
        drop(j);
        // A crash during the last append: only its first bytes reached the file, 3 bytes into
        // its value; the zeros the file was grown with follow.
        let cut = whole + 8 + 2 + 1 + 3;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&f.path)
            .unwrap();
        file.write_all_at(&vec![0; (torn_end - cut) as usize], cut)
            .unwrap();
        drop(file);
        let j = f.open();
        assert_eq!(j.keys(), ["a"]);
        assert!(
            j.suspect_keys().is_empty(),
            "a crash's cut-short write is no damage"
        );
        assert_eq!(f.len(), whole, "the torn frame is cut off");
        let kept = f.kept();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].len() as u64, cut - whole);
        // Appends go on after the last whole frame.
        j.put("c", b"after").unwrap();
        drop(j);
        assert_eq!(sorted_keys(&f.open()), ["a", "c"]);
    }

    #[test]
    fn a_flipped_bit_costs_only_its_frame() {
        let f = fixture();
        let j = f.open();
        j.put("a", b"first").unwrap();
        let second = j.end();
        j.put("b", b"second").unwrap();
        let third = j.end();
        j.put("c", b"third").unwrap();
        drop(j);
        let mut bytes = std::fs::read(&f.path).unwrap();
        bytes[second as usize + 12] ^= 0x40;
        std::fs::write(&f.path, &bytes).unwrap();
        let j = f.open();
        assert_eq!(
            sorted_keys(&j),
            ["a", "c"],
            "the frames after the damaged one are found"
        );
        assert_eq!(j.suspect_keys(), ["b"], "the damaged frame's key is named");
        assert_eq!(j.get("c").unwrap().unwrap(), b"third");
        assert_eq!(
            f.kept(),
            [&bytes[second as usize..third as usize]],
            "the damaged frame is kept as it was"
        );
        // Rewritten without it: the next start finds no damage.
        drop(j);
        let j = f.open();
        assert_eq!(j.keys().len(), 2);
        assert_eq!(f.kept().len(), 1);
    }

    #[test]
    fn damage_between_every_frame_fills_quarantine_with_at_most_its_cap() {
        let f = fixture();
        let mut bytes = MAGIC.to_vec();
        for i in 0..100 {
            bytes.extend_from_slice(&frame(OP_PUT, &format!("k{i}"), b"v"));
            bytes.push(0xff);
        }
        std::fs::write(&f.path, &bytes).unwrap();
        let j = f.open();
        assert_eq!(j.keys().len(), 100);
        assert_eq!(f.kept().len(), MAX_KEPT_DAMAGE);
    }

    #[test]
    fn garbage_claiming_long_frames_everywhere_is_skipped_within_the_budget() {
        // Every offset claims a frame of nearly the cap that runs past the end.
        let mut bytes = MAGIC.to_vec();
        for _ in 0..4096 {
            bytes.extend_from_slice(&[0xf0, 0xff, 0x00, 0x00, 1, 1]);
        }
        bytes.extend_from_slice(&frame(OP_PUT, "z", b"after"));
        let r = replay(&bytes[..], 1 << 20).unwrap();
        assert_eq!(r.index.keys().collect::<Vec<_>>(), ["z"]);
        assert_eq!(r.damaged, [(HEAD, bytes.len() as u64 - 16)]);
    }

    #[test]
    fn a_file_that_is_not_a_journal_is_refused_not_overwritten() {
        let f = fixture();
        std::fs::write(&f.path, b"{\"id\": \"x\"}").unwrap();
        let e = Journal::open(&f.path, 1 << 20, &f.quarantine)
            .err()
            .unwrap();
        assert!(matches!(e, JournalError::NotAJournal { .. }), "{e}");
        assert_eq!(std::fs::read(&f.path).unwrap(), b"{\"id\": \"x\"}");
    }

    #[test]
    fn oversized_values_and_bad_keys_are_refused() {
        let f = fixture();
        let j = Journal::open(&f.path, 16, &f.quarantine).unwrap();
        assert!(matches!(
            j.put("a", &[0; 17]),
            Err(JournalError::TooLarge { len: 17, max: 16 })
        ));
        assert!(matches!(j.put("", b"x"), Err(JournalError::BadKey(_))));
        assert!(matches!(
            j.put(&"k".repeat(256), b"x"),
            Err(JournalError::BadKey(_))
        ));
        j.put(&"k".repeat(255), &[7; 16]).unwrap();
    }

    #[test]
    fn a_frame_over_the_cap_ends_the_replay_before_anything_is_allocated() {
        // A head claiming 4 GiB: replay stops at it without reading on.
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&frame(OP_PUT, "a", b"1"));
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(&[0; 8]);
        let r = replay(&bytes[..], 1 << 20).unwrap();
        assert_eq!(r.index.len(), 1);
        assert_eq!(r.valid_end, HEAD + frame(OP_PUT, "a", b"1").len() as u64);
        // The damage ends where the zeros at the end of the file begin.
        assert_eq!(r.damaged, [(r.valid_end, r.valid_end + 4)]);
    }

    #[test]
    fn rewriting_keeps_every_live_value_and_shrinks_the_file() {
        let f = fixture();
        let j = f.open();
        let value = vec![b'x'; 4096];
        // 600 rewrites of 4 keys: 2.4 MiB appended, 16 KiB live.
        for i in 0..600 {
            j.put(&format!("k{}", i % 4), &value).unwrap();
        }
        j.put("k0", b"last").unwrap();
        assert!(j.end() < COMPACT_AT + 8192, "rewritten: {} bytes", j.end());
        drop(j);
        let j = f.open();
        assert_eq!(j.keys().len(), 4);
        assert_eq!(j.get("k0").unwrap().unwrap(), b"last");
        assert_eq!(j.get("k3").unwrap().unwrap(), value);
        assert!(!f.path.with_extension("compact").exists());
    }
}
