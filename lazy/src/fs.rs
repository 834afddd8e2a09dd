//! The read-only FUSE filesystem of one lazy layer: metadata from the TOC's [`Tree`], bytes
//! from the [`Cache`] (fetched and checked chunk by chunk), or, once the prefetch made the
//! layer an ordinary snapshot, from that snapshot's files.
//!
//! A file whose bytes are all local is handed to the kernel with FUSE passthrough where the
//! kernel has it (Linux 6.9 and later): its reads then go to the backing file without a trip
//! through this process. A read that cannot be served gets `EIO`, never other bytes.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};

use crate::cache::{Cache, FetchFailed};
use crate::tree::{NodeKind, Tree};

/// The layer never changes: the kernel may keep what it learnt for as long as it likes.
const TTL: Duration = Duration::from_secs(3600);

/// Where an open file's bytes come from.
enum Source {
    Cache(Arc<File>),
    /// The promoted snapshot's file, or an inline one.
    Local(Arc<File>),
    Inline,
}

enum Mode {
    Cached,
    /// The one mapping this inode passes through to, kept while the inode may be opened again.
    Passthrough(Arc<BackingId>),
}

/// An inode's I/O mode and its open files. The kernel refuses (`EIO`) an open in one mode while
/// files of the inode are open in the other; it drops a file's hold on the mode before it sends
/// the file's RELEASE, so an inode with no file open here may change mode.
struct InodeIo {
    mode: Mode,
    open: u32,
}

/// Passthrough mappings kept (an open descriptor each); past this, those of closed files go.
const BACKING_KEPT: usize = 8192;

struct Handle {
    ino: u64,
    source: Source,
    /// Keeps the kernel's passthrough mapping for as long as the file is open.
    _backing: Option<Arc<BackingId>>,
}

pub struct LazyFs {
    tree: Arc<Tree>,
    cache: Arc<Cache>,
    /// The layer's ordinary snapshot, once the prefetch made it.
    snapshot: RwLock<Option<OwnedFd>>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    passthrough: AtomicBool,
    /// Inodes opened, and how.
    modes: Mutex<HashMap<u64, InodeIo>>,
    /// Set once the kernel agreed to passthrough (tests and the server's log read it).
    pub passthrough_on: Arc<AtomicBool>,
}

impl LazyFs {
    pub fn new(tree: Arc<Tree>, cache: Arc<Cache>) -> LazyFs {
        LazyFs {
            tree,
            cache,
            snapshot: RwLock::new(None),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            passthrough: AtomicBool::new(false),
            modes: Mutex::new(HashMap::new()),
            passthrough_on: Arc::new(AtomicBool::new(false)),
        }
    }

    /// From now on, files are read from `snapshot` (the layer unpacked and checked whole).
    pub fn promote(&self, snapshot: OwnedFd) {
        *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Some(snapshot);
    }

    pub fn shared(self: &Arc<Self>) -> Shared {
        Shared(self.clone())
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let n = self.tree.get(ino)?;
        let (kind, size, rdev) = match &n.kind {
            NodeKind::Dir { .. } => (FileType::Directory, 4096, 0),
            NodeKind::File { size, .. } => (FileType::RegularFile, *size, 0),
            NodeKind::Inline { data } => (FileType::RegularFile, data.len() as u64, 0),
            NodeKind::Symlink { target } => (FileType::Symlink, target.len() as u64, 0),
            NodeKind::Char { rdev } => (FileType::CharDevice, 0, *rdev),
            NodeKind::Block { rdev } => (FileType::BlockDevice, 0, *rdev),
            NodeKind::Fifo => (FileType::NamedPipe, 0, 0),
        };
        let mtime = if n.mtime >= 0 {
            UNIX_EPOCH + Duration::from_secs(n.mtime as u64)
        } else {
            UNIX_EPOCH - Duration::from_secs(n.mtime.unsigned_abs())
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm: (n.mode & 0o7777) as u16,
            nlink: n.nlink,
            uid: n.uid,
            gid: n.gid,
            rdev,
            blksize: 4096,
            flags: 0,
        })
    }

    /// The promoted snapshot's copy of the regular file `ino`, if there is one.
    fn snapshot_file(&self, ino: u64) -> Option<File> {
        let guard = self.snapshot.read().unwrap_or_else(|e| e.into_inner());
        let dir = guard.as_ref()?;
        let node = self.tree.node(ino);
        // The snapshot is this layer unpacked by the hardened unpacker; resolve beneath it all
        // the same, and take only a regular file of the size the TOC gives.
        let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW;
        let resolve =
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
        let fd = crishim_sys::confined::openat2(dir, Path::new(&node.path), flags, resolve).ok()?;
        let f = File::from(fd);
        let m = f.metadata().ok()?;
        let size = match &node.kind {
            NodeKind::File { size, .. } => *size,
            _ => return None,
        };
        (m.is_file() && m.len() == size).then_some(f)
    }

    /// The passthrough mapping to open `ino` with, or `None` to open it cached. While files of
    /// the inode are open, their mode; once none is, passthrough where `whole` (a file with
    /// every byte local) is given, reusing the inode's mapping if it has one.
    fn open_mode(
        &self,
        ino: u64,
        whole: Option<&File>,
        reply: &ReplyOpen,
    ) -> Option<Arc<BackingId>> {
        let mut modes = self.modes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(io) = modes.get_mut(&ino).filter(|io| io.open > 0) {
            io.open += 1;
            return match &io.mode {
                Mode::Passthrough(b) => Some(b.clone()),
                Mode::Cached => None,
            };
        }
        let kept = match modes.get(&ino).map(|io| &io.mode) {
            Some(Mode::Passthrough(b)) => Some(b.clone()),
            _ => None,
        };
        let backing = whole
            .filter(|_| self.passthrough.load(Ordering::Relaxed))
            .and_then(|f| {
                kept.or_else(|| match reply.open_backing(f.as_fd()) {
                    Ok(b) => Some(Arc::new(b)),
                    Err(e) => {
                        tracing::debug!(ino, error = %e, "no passthrough for this file");
                        None
                    }
                })
            });
        if modes.len() >= BACKING_KEPT {
            // Inodes no file holds open (their mappings' descriptors close).
            modes.retain(|_, io| io.open > 0);
        }
        let mode = match &backing {
            Some(b) => Mode::Passthrough(b.clone()),
            None => Mode::Cached,
        };
        modes.insert(ino, InodeIo { mode, open: 1 });
        backing
    }

    /// A file of `ino` was released.
    fn closed(&self, ino: u64) {
        let mut modes = self.modes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(io) = modes.get_mut(&ino) {
            io.open = io.open.saturating_sub(1);
        }
    }

    fn read_at(&self, h: &Source, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let len = match &self.tree.node(ino).kind {
            NodeKind::File { size, .. } => *size,
            NodeKind::Inline { data } => data.len() as u64,
            _ => return Err(Errno::EINVAL),
        };
        let end = offset.saturating_add(size as u64).min(len);
        if offset >= end {
            return Ok(Vec::new());
        }
        let file = match h {
            Source::Inline => {
                let NodeKind::Inline { data } = &self.tree.node(ino).kind else {
                    return Err(Errno::EIO);
                };
                return Ok(data[offset as usize..end as usize].to_vec());
            }
            Source::Local(f) => f,
            Source::Cache(f) => {
                if let Err(e) = self.cache.ensure(ino, offset..end) {
                    let path = &self.tree.node(ino).path;
                    match &e {
                        FetchFailed::Corrupt { .. } => {
                            tracing::error!(file = %path, error = %e, "refused a chunk: EIO")
                        }
                        FetchFailed::Unavailable { .. } => {
                            tracing::warn!(file = %path, error = %e, "read failed: EIO")
                        }
                    }
                    return Err(Errno::EIO);
                }
                f
            }
        };
        let mut buf = vec![0; (end - offset) as usize];
        file.read_exact_at(&mut buf, offset).map_err(|e| {
            tracing::warn!(file = %self.tree.node(ino).path, offset, error = %e, "read failed: EIO");
            Errno::EIO
        })?;
        Ok(buf)
    }
}

/// The filesystem as the FUSE session owns it, while the server keeps a handle to promote it.
pub struct Shared(pub Arc<LazyFs>);

impl Filesystem for Shared {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Passthrough needs the kernel's stack-depth room: this mount (1) under overlayfs (2).
        let on = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok();
        self.0.passthrough.store(on, Ordering::Relaxed);
        self.0.passthrough_on.store(on, Ordering::Relaxed);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let fs = &self.0;
        match name
            .to_str()
            .and_then(|n| fs.tree.lookup(parent.0, n))
            .and_then(|ino| fs.attr(ino))
        {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.0.tree.get(ino.0).map(|n| &n.kind) {
            Some(NodeKind::Symlink { target }) => reply.data(target.as_bytes()),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let fs = &self.0;
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let ino = ino.0;
        let (source, file) = match fs.tree.get(ino).map(|n| &n.kind) {
            Some(NodeKind::Inline { .. }) => (Source::Inline, None),
            Some(NodeKind::File { .. }) => match fs.snapshot_file(ino) {
                Some(f) => {
                    let f = Arc::new(f);
                    (Source::Local(f.clone()), Some(f))
                }
                None => match fs.cache.file(ino) {
                    Ok(f) => {
                        let whole = fs.cache.complete(ino).then(|| f.clone());
                        (Source::Cache(f), whole)
                    }
                    Err(e) => {
                        tracing::warn!(ino, error = %e, "opening the chunk cache");
                        return reply.error(Errno::EIO);
                    }
                },
            },
            Some(_) => return reply.error(Errno::EINVAL),
            None => return reply.error(Errno::ENOENT),
        };
        let backing = match &source {
            Source::Inline => None,
            _ => fs.open_mode(ino, file.as_deref(), &reply),
        };
        let fh = fs.next_fh.fetch_add(1, Ordering::Relaxed);
        let opened = FopenFlags::FOPEN_KEEP_CACHE;
        // In the table before the kernel learns the handle: its first read may come at once.
        fs.handles.lock().unwrap_or_else(|e| e.into_inner()).insert(
            fh,
            Handle {
                ino,
                source,
                _backing: backing.clone(),
            },
        );
        match &backing {
            // The kernel refuses (EIO) a passthrough open with any flag but its few.
            Some(b) => reply.opened_passthrough(FileHandle(fh), FopenFlags::FOPEN_NOFLUSH, b),
            None => reply.opened(FileHandle(fh), opened),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let fs = &self.0;
        let source = {
            let handles = fs.handles.lock().unwrap_or_else(|e| e.into_inner());
            match handles.get(&fh.0) {
                Some(h) if h.ino == ino.0 => match &h.source {
                    Source::Cache(f) => Source::Cache(f.clone()),
                    Source::Local(f) => Source::Local(f.clone()),
                    Source::Inline => Source::Inline,
                },
                _ => return reply.error(Errno::EBADF),
            }
        };
        match fs.read_at(&source, ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let handle = self
            .0
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        if let Some(h) = handle {
            if !matches!(h.source, Source::Inline) {
                self.0.closed(h.ino);
            }
        }
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.0.tree.get(ino.0).map(|n| &n.kind) {
            Some(NodeKind::Dir { .. }) => reply.opened(FileHandle(0), FopenFlags::FOPEN_CACHE_DIR),
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let fs = &self.0;
        let Some(node) = fs.tree.get(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let NodeKind::Dir { children } = &node.kind else {
            return reply.error(Errno::ENOTDIR);
        };
        let dots = [(ino.0, "."), (node.parent, "..")];
        let all = dots
            .into_iter()
            .chain(children.iter().map(|(n, i)| (*i, n.as_str())));
        for (i, (child, name)) in all.enumerate().skip(offset as usize) {
            let kind = fs.attr(child).map_or(FileType::RegularFile, |a| a.kind);
            if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = self.0.tree.nodes.len() as u64;
        reply.statfs(0, 0, 0, files, 0, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let Some(node) = self.0.tree.get(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let value = node
            .xattrs
            .iter()
            .find(|(k, _)| OsStr::new(k) == name)
            .map(|(_, v)| v);
        match value {
            None => reply.error(Errno::NO_XATTR),
            Some(v) if size == 0 => reply.size(v.len() as u32),
            Some(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Some(v) => reply.data(v),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let Some(node) = self.0.tree.get(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let mut list = Vec::new();
        for (k, _) in &node.xattrs {
            list.extend_from_slice(k.as_bytes());
            list.push(0);
        }
        if size == 0 {
            reply.size(list.len() as u32)
        } else if list.len() > size as usize {
            reply.error(Errno::ERANGE)
        } else {
            reply.data(&list)
        }
    }
}
