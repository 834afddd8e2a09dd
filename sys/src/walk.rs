//! Walking a tree that someone else may be changing while it is walked (a volume a container
//! writes, a container's writable layer), by file descriptor.
//!
//! The root is opened once; every directory below is opened relative to its parent's descriptor
//! (`openat2` with `RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH | RESOLVE_NO_XDEV`, or `openat` with
//! `O_NOFOLLOW` on kernels before 5.6) and checked to be the inode the walk saw, and each entry is
//! looked at with `statx(AT_SYMLINK_NOFOLLOW)` relative to its directory's descriptor. So swapping
//! a directory for a symlink mid-walk cannot take the walk out of the tree: no path is resolved
//! again from the root, and no symlink is followed. Entries on another mount (another device, or
//! a bind mount of the same one) are not visited. The walk counts entries as it reads them,
//! keeping one open directory per level (at most [`Limits::max_depth`]) and one small buffer each,
//! and stops at [`Limits::max_entries`] or a deadline.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Directory levels below the root a walk goes at most.
pub const MAX_DEPTH: usize = 256;

/// Where a walk stops.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Entries visited at most, the root's included.
    pub max_entries: u64,
    /// Directory levels below the root, at most.
    pub max_depth: usize,
    /// No entry is visited after this.
    pub deadline: Option<Instant>,
}

impl Limits {
    /// At most `max_entries` entries, [`MAX_DEPTH`] levels, no deadline.
    pub fn entries(max_entries: u64) -> Self {
        Limits {
            max_entries,
            max_depth: MAX_DEPTH,
            deadline: None,
        }
    }
}

/// Why a walk stopped before the end of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The tree holds more entries than this.
    Entries(u64),
    /// The tree is deeper than this many levels.
    Depth(usize),
    /// The deadline passed.
    Deadline,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Entries(n) => write!(f, "it holds more than {n} entries"),
            Stop::Depth(n) => write!(f, "it is deeper than {n} directories"),
            Stop::Deadline => write!(f, "the walk ran past its deadline"),
        }
    }
}

/// What `statx` says of an entry (not following a final symlink).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub mode: u32,
    pub dev: u64,
    pub ino: u64,
    pub nlink: u64,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// The mount's id, where the kernel says (5.8).
    pub mnt_id: Option<u64>,
    /// Whether the entry is the root of a mount, where the kernel says (5.8).
    pub mount_root: Option<bool>,
}

impl Stat {
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }

    pub fn is_symlink(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }

    /// Whether `other` is the same inode.
    pub fn same_inode(&self, other: &Stat) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }
}

/// One entry, as the visitor sees it: its directory's descriptor and its name there.
pub struct Entry<'a> {
    dir: BorrowedFd<'a>,
    name: &'a CStr,
    stat: Stat,
    depth: usize,
    root: &'a Path,
    rel: &'a Path,
}

impl Entry<'_> {
    /// The descriptor of the directory holding the entry (for the root: of its parent).
    pub fn dir(&self) -> BorrowedFd<'_> {
        self.dir
    }

    /// The entry's name in [`Entry::dir`]: one component, or `.` for a root that names none.
    pub fn name(&self) -> &CStr {
        self.name
    }

    pub fn stat(&self) -> &Stat {
        &self.stat
    }

    /// Levels below the root: 0 for the root.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The entry's path as walked, for messages only: resolving it again is what the walk avoids.
    pub fn path(&self) -> PathBuf {
        if self.depth == 0 {
            return self.root.to_path_buf();
        }
        self.root
            .join(self.rel)
            .join(OsStr::from_bytes(self.name.to_bytes()))
    }

    /// `/proc/self/fd/<dir>/<name>`: the entry reached through its directory's descriptor, for
    /// calls that take only a path (`lsetxattr`). Only the final component is looked up by name,
    /// in the directory the walk holds; a call that does not follow a final link (`l*`) reaches
    /// this entry or, where it was swapped since, whatever now has the name there, never a link's
    /// target.
    pub fn fd_path(&self) -> PathBuf {
        let mut p = PathBuf::from(format!("/proc/self/fd/{}", self.dir.as_raw_fd()));
        p.push(OsStr::from_bytes(self.name.to_bytes()));
        p
    }
}

/// What a walk did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Walked {
    /// Entries visited.
    pub entries: u64,
    /// Entries left out for being on another mount.
    pub other_mounts: u64,
    /// Why it stopped short of the end, if it did.
    pub stopped: Option<Stop>,
}

/// A walk's failure: the path (for messages) and the error there.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct Error {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        io::Error::new(e.source.kind(), e.to_string())
    }
}

/// One open directory on the walk's stack and what is left of its entries.
struct Frame {
    fd: OwnedFd,
    /// Its path below the root, for messages.
    rel: PathBuf,
    buf: Vec<u8>,
    pos: usize,
    len: usize,
}

/// Bytes of `getdents64` records read at once per directory level.
const DENTS_BUF: usize = 4096;
/// Entries between two looks at the clock.
const CLOCK_EVERY: u64 = 256;

/// Walk `root`, depth first, calling `visit` with each entry (the root first, then what each
/// directory holds before what lies below it). Directories on the root's mount are descended
/// into; symlinks are visited, never followed; entries on another mount are left out. Entries
/// that vanish or change into something else while the walk looks are skipped. An error of
/// `visit` ends the walk with that error and the entry's path.
///
/// `root`'s own components (all but a final symlink, which is visited as itself) are the
/// caller's to trust: they are resolved once, when the walk starts.
pub fn walk(
    root: &Path,
    limits: &Limits,
    mut visit: impl FnMut(&Entry<'_>) -> io::Result<()>,
) -> Result<Walked, Error> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error { path, source }
    };
    let (parent, name) = match root.file_name() {
        Some(n) => {
            let p = root.parent().filter(|p| !p.as_os_str().is_empty());
            (p.unwrap_or(Path::new(".")), n)
        }
        None => (root, OsStr::new(".")),
    };
    let name = CString::new(name.as_bytes())
        .map_err(|_| err(root)(io::Error::new(io::ErrorKind::InvalidInput, "NUL in path")))?;
    let parent_fd = open_path(parent).map_err(err(root))?;
    let root_stat = stat_at(parent_fd.as_fd(), &name).map_err(err(root))?;
    let mut walked = Walked::default();
    let empty = Path::new("");
    walked.entries = 1;
    if limits.max_entries == 0 {
        walked.stopped = Some(Stop::Entries(0));
        return Ok(walked);
    }
    visit(&Entry {
        dir: parent_fd.as_fd(),
        name: &name,
        stat: root_stat,
        depth: 0,
        root,
        rel: empty,
    })
    .map_err(err(root))?;
    if !root_stat.is_dir() {
        return Ok(walked);
    }
    let Some(fd) = open_dir_at(parent_fd.as_fd(), &name, &root_stat, false).map_err(err(root))?
    else {
        // The root changed between the look and the open: nothing of it is walked.
        return Ok(walked);
    };
    drop(parent_fd);
    let on_root_mount = |s: &Stat| {
        s.dev == root_stat.dev
            && match (s.mnt_id, root_stat.mnt_id) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
            && s.mount_root != Some(true)
    };
    let mut stack = vec![Frame {
        fd,
        rel: PathBuf::new(),
        buf: vec![0; DENTS_BUF],
        pos: 0,
        len: 0,
    }];
    while !stack.is_empty() {
        let depth = stack.len();
        let top = stack.last_mut().expect("not empty");
        let Some(child) = next_name(top).map_err(|e| err(&root.join(&top.rel))(e))? else {
            stack.pop();
            continue;
        };
        if child.as_bytes() == b"." || child.as_bytes() == b".." {
            continue;
        }
        let child_path = || {
            root.join(&top.rel)
                .join(OsStr::from_bytes(child.as_bytes()))
        };
        let stat = match stat_at(top.fd.as_fd(), &child) {
            Ok(s) => s,
            Err(e) if vanished(&e) => continue,
            Err(e) => return Err(err(&child_path())(e)),
        };
        if !on_root_mount(&stat) {
            walked.other_mounts += 1;
            continue;
        }
        if walked.entries >= limits.max_entries {
            walked.stopped = Some(Stop::Entries(limits.max_entries));
            return Ok(walked);
        }
        if walked.entries % CLOCK_EVERY == 1 && limits.deadline.is_some_and(|d| Instant::now() >= d)
        {
            walked.stopped = Some(Stop::Deadline);
            return Ok(walked);
        }
        walked.entries += 1;
        visit(&Entry {
            dir: top.fd.as_fd(),
            name: &child,
            stat,
            depth,
            root,
            rel: &top.rel,
        })
        .map_err(|e| err(&child_path())(e))?;
        if !stat.is_dir() {
            continue;
        }
        if depth >= limits.max_depth {
            walked.stopped = Some(Stop::Depth(limits.max_depth));
            return Ok(walked);
        }
        let fd = match open_dir_at(top.fd.as_fd(), &child, &stat, true) {
            Ok(Some(fd)) => fd,
            Ok(None) => continue,
            Err(e) => return Err(err(&child_path())(e)),
        };
        let rel = top.rel.join(OsStr::from_bytes(child.as_bytes()));
        stack.push(Frame {
            fd,
            rel,
            buf: vec![0; DENTS_BUF],
            pos: 0,
            len: 0,
        });
    }
    Ok(walked)
}

/// Errors that say the entry is gone or is no longer what the walk saw (a race with whoever
/// writes the tree): the entry is skipped.
fn vanished(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EXDEV | libc::EAGAIN)
    )
}

fn cstr_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

/// `open(path, O_PATH | O_DIRECTORY)`: the root's parent, a path the caller trusts.
fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let c = cstr_path(path)?;
    // SAFETY: open with a C string; the descriptor is checked, then owned.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn statx_raw(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<Stat> {
    // SAFETY: a zeroed statx is a valid value for the kernel to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx on a descriptor we hold, a C string, into a struct we own.
    let r = unsafe {
        libc::statx(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT,
            libc::STATX_BASIC_STATS | libc::STATX_MNT_ID,
            &mut stx,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let mount_root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    Ok(Stat {
        mode: stx.stx_mode as u32,
        dev: libc::makedev(stx.stx_dev_major, stx.stx_dev_minor),
        ino: stx.stx_ino,
        nlink: stx.stx_nlink as u64,
        size: stx.stx_size,
        blocks: stx.stx_blocks,
        mnt_id: (stx.stx_mask & libc::STATX_MNT_ID != 0).then_some(stx.stx_mnt_id),
        mount_root: (stx.stx_attributes_mask & mount_root != 0)
            .then_some(stx.stx_attributes & mount_root != 0),
    })
}

/// `name` in `dir`, not following a final symlink.
fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Stat> {
    statx_raw(dir, name, 0)
}

/// What an open descriptor is.
fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    statx_raw(fd, c"", libc::AT_EMPTY_PATH)
}

use libc::{RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS, RESOLVE_NO_XDEV};

/// Whether `openat2` answered `ENOSYS` once (a kernel before 5.6): `openat` from then on.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// Open the directory `name` in `dir` for reading, without following a symlink or crossing a
/// mount, and check that it is the inode `seen` (and, where `child`, on `seen`'s mount); `None`
/// where it is gone or no longer that directory.
fn open_dir_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    seen: &Stat,
    child: bool,
) -> io::Result<Option<OwnedFd>> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let mut fd = -1;
    if child && !NO_OPENAT2.load(Ordering::Relaxed) {
        let name = Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
        let resolve = RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH;
        match crate::confined::openat2(&dir, name, flags, resolve) {
            Ok(opened) => fd = opened.into_raw_fd(),
            Err(e) => match e.raw_os_error() {
                Some(libc::ENOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
                _ if vanished(&e) => return Ok(None),
                _ => return Err(e),
            },
        }
    }
    if fd < 0 {
        // SAFETY: openat with a descriptor we hold and a C string.
        fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return if vanished(&e) { Ok(None) } else { Err(e) };
        }
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let now = stat_fd(fd.as_fd())?;
    let same_mount = match (now.mnt_id, seen.mnt_id) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    };
    Ok((now.is_dir() && now.same_inode(seen) && same_mount).then_some(fd))
}

/// The next name in `frame`'s directory, reading more records as needed; `None` at its end.
fn next_name(frame: &mut Frame) -> io::Result<Option<CString>> {
    if frame.pos >= frame.len {
        // SAFETY: getdents64 on a directory descriptor we hold, into a buffer we own.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                frame.fd.as_raw_fd(),
                frame.buf.as_mut_ptr(),
                frame.buf.len(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            // A directory removed while it is read reads as ENOENT: its end.
            return if e.raw_os_error() == Some(libc::ENOENT) {
                Ok(None)
            } else {
                Err(e)
            };
        }
        if n == 0 {
            return Ok(None);
        }
        frame.pos = 0;
        frame.len = n as usize;
    }
    // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
    let rec = &frame.buf[frame.pos..frame.len];
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed getdents64 record");
    if rec.len() < 19 {
        return Err(bad());
    }
    let reclen = u16::from_ne_bytes([rec[16], rec[17]]) as usize;
    if reclen < 19 || reclen > rec.len() {
        return Err(bad());
    }
    let name = CStr::from_bytes_until_nul(&rec[19..reclen]).map_err(|_| bad())?;
    frame.pos += reclen;
    Ok(Some(name.to_owned()))
}

#[cfg(test)]
mod tests;
