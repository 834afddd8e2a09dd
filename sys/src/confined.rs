//! One bounded reader for every file the host reads from a place an image or a container
//! controls: a container's root filesystem (its `/etc/passwd`, `/etc/group`, `/etc/ld.so.preload`,
//! its glibc), a volume (a workflow's outputs), or a host directory shared into a container
//! read-write (the GPU accounting file).
//!
//! What the reader guarantees, whatever is at the path:
//! - the path is resolved by the kernel inside a root directory (`openat2` with
//!   `RESOLVE_IN_ROOT`, or `RESOLVE_BENEATH`, and always `RESOLVE_NO_MAGICLINKS`): `..`, absolute
//!   symlinks and `/proc/self/...` links cannot leave it;
//! - nothing but a regular file is ever opened for reading: the path is first opened `O_PATH`
//!   (which opens no device and waits on no FIFO), checked with `fstat`, and only then reopened
//!   `O_RDONLY | O_NONBLOCK | O_NOCTTY` through that very descriptor, so a character device, a
//!   FIFO, a socket or a directory is refused without a byte read and without blocking;
//! - the size is capped before the read (`st_size` over the cap: refused), and the read itself
//!   stops at the cap plus one byte, so a file that grows while it is read is refused as well.
//!   Errors name the path (cut to 256 bytes) and the cap.

use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// How the path is resolved inside the root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// As if the root were `/` (`RESOLVE_IN_ROOT`): absolute symlinks and `..` stay inside it.
    /// For a root filesystem, where `/lib -> usr/lib` and `libc.so.6 -> libc-2.31.so` are normal.
    InRoot,
    /// Beneath the root (`RESOLVE_BENEATH`): anything that would leave it, an absolute symlink
    /// included, is an error.
    Beneath,
}

/// What a read is allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub scope: Scope,
    /// Refuse a symlink anywhere on the path (`RESOLVE_NO_SYMLINKS`, and `O_NOFOLLOW` for the
    /// last component), not only one that leaves the root.
    pub no_symlinks: bool,
    /// The most bytes read; a larger file is an error, never a silent cut.
    pub max_bytes: u64,
}

impl Limits {
    /// Inside a root filesystem: its own symlinks are followed, inside it.
    pub const fn in_root(max_bytes: u64) -> Limits {
        Limits {
            scope: Scope::InRoot,
            no_symlinks: false,
            max_bytes,
        }
    }

    /// Beneath a directory a container may write, with no symlink at all.
    pub const fn beneath_no_symlinks(max_bytes: u64) -> Limits {
        Limits {
            scope: Scope::Beneath,
            no_symlinks: true,
            max_bytes,
        }
    }
}

/// Why a confined read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Nothing there (`ENOENT`), or a path component is not a directory (`ENOTDIR`).
    #[error("{path} does not exist")]
    Missing { path: String },
    /// The path leaves the root, or has a symlink where none is allowed.
    #[error("{path} resolves outside its root or through a symlink, refused: {source}")]
    Escapes { path: String, source: io::Error },
    #[error("opening {path}: {source}")]
    Open { path: String, source: io::Error },
    #[error("{path} is a {kind}, not a regular file: refused")]
    NotRegular { path: String, kind: &'static str },
    #[error("{path} is larger than the {max} bytes allowed: refused")]
    TooLarge { path: String, max: u64 },
    #[error("reading {path}: {source}")]
    Read { path: String, source: io::Error },
}

impl ReadError {
    /// Whether the file is simply not there.
    pub fn is_missing(&self) -> bool {
        matches!(self, ReadError::Missing { .. })
    }

    /// Whether the read was refused for what lies at the path (not a regular file, too large, a
    /// way out of the root): the doing of whoever controls the root, not a failure of the node.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            ReadError::NotRegular { .. } | ReadError::TooLarge { .. } | ReadError::Escapes { .. }
        )
    }
}

/// [`read`] as text (invalid UTF-8 replaced); `Ok(None)` when nothing is there.
pub fn read_text(root: &Path, rel: &str, limits: Limits) -> Result<Option<String>, ReadError> {
    match read(root, rel, limits) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) if e.is_missing() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Read `rel` inside the directory `root` (a path the host chose) within `limits`.
pub fn read(root: &Path, rel: &str, limits: Limits) -> Result<Vec<u8>, ReadError> {
    let shown = || crate::shown::shown(&format!("{}/{rel}", root.display())).into_owned();
    let dir = File::open(root).map_err(|source| match source.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) => ReadError::Missing { path: shown() },
        _ => ReadError::Open {
            path: shown(),
            source,
        },
    })?;
    read_at(&dir, rel, limits).map_err(|e| e.named(&shown()))
}

/// Read `rel` inside the open directory `root` within `limits`. Errors name `rel`.
pub fn read_at(root: &impl AsRawFd, rel: &str, limits: Limits) -> Result<Vec<u8>, ReadError> {
    let path = || crate::shown::shown(rel).into_owned();
    let file = open_at(root, rel, limits)?;
    let mut bytes = Vec::new();
    file.take(limits.max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| ReadError::Read {
            path: path(),
            source,
        })?;
    if bytes.len() as u64 > limits.max_bytes {
        return Err(ReadError::TooLarge {
            path: path(),
            max: limits.max_bytes,
        });
    }
    Ok(bytes)
}

/// `rel` inside `root`, opened for reading only if it is a regular file no larger than the cap
/// (the caller must still read at most the cap plus one: [`read_at`] does).
pub fn open_at(root: &impl AsRawFd, rel: &str, limits: Limits) -> Result<File, ReadError> {
    let path = || crate::shown::shown(rel).into_owned();
    let mut resolve = libc::RESOLVE_NO_MAGICLINKS;
    resolve |= match limits.scope {
        Scope::InRoot => libc::RESOLVE_IN_ROOT,
        Scope::Beneath => libc::RESOLVE_BENEATH,
    };
    let mut flags = libc::O_PATH | libc::O_CLOEXEC;
    if limits.no_symlinks {
        resolve |= libc::RESOLVE_NO_SYMLINKS;
        flags |= libc::O_NOFOLLOW;
    }
    let rel_in = rel.trim_start_matches('/');
    let handle = openat2(root, Path::new(rel_in), flags, resolve).map_err(|source| match source
        .raw_os_error()
    {
        Some(libc::ENOENT | libc::ENOTDIR) => ReadError::Missing { path: path() },
        Some(libc::EXDEV | libc::ELOOP) => ReadError::Escapes {
            path: path(),
            source,
        },
        _ => ReadError::Open {
            path: path(),
            source,
        },
    })?;
    let st = fstat(handle.as_raw_fd()).map_err(|source| ReadError::Open {
        path: path(),
        source,
    })?;
    check(&st, limits.max_bytes, &path)?;
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
    let (file, again) = reopen(&handle, &st, flags).map_err(|source| ReadError::Open {
        path: path(),
        source,
    })?;
    check(&again, limits.max_bytes, &path)?;
    Ok(file)
}

/// Open the very inode an `O_PATH` `handle` holds (whose `fstat` was `seen`) with `flags`,
/// through `/proc/self/fd`: nothing resolves the path again, and a file swapped meanwhile is an
/// error. Returns the file and its `fstat`.
pub fn reopen(
    handle: &impl AsRawFd,
    seen: &libc::stat,
    flags: i32,
) -> io::Result<(File, libc::stat)> {
    let via = format!("/proc/self/fd/{}\0", handle.as_raw_fd());
    // SAFETY: `via` is NUL-terminated and lives across the call.
    let fd = unsafe { libc::open(via.as_ptr().cast(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
    let again = fstat(file.as_raw_fd())?;
    if (again.st_dev, again.st_ino) != (seen.st_dev, seen.st_ino) {
        return Err(io::Error::other("the file changed while it was opened"));
    }
    Ok((file, again))
}

fn check(st: &libc::stat, max: u64, path: &dyn Fn() -> String) -> Result<(), ReadError> {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFDIR => Some("directory"),
        libc::S_IFCHR => Some("character device"),
        libc::S_IFBLK => Some("block device"),
        libc::S_IFIFO => Some("FIFO"),
        libc::S_IFSOCK => Some("socket"),
        libc::S_IFLNK => Some("symlink"),
        _ => Some("special file"),
    };
    if let Some(kind) = kind {
        return Err(ReadError::NotRegular { path: path(), kind });
    }
    if st.st_size as u64 > max {
        return Err(ReadError::TooLarge { path: path(), max });
    }
    Ok(())
}

impl ReadError {
    /// The same error naming `path` instead.
    fn named(self, path: &str) -> ReadError {
        let path = path.to_string();
        match self {
            ReadError::Missing { .. } => ReadError::Missing { path },
            ReadError::Escapes { source, .. } => ReadError::Escapes { path, source },
            ReadError::Open { source, .. } => ReadError::Open { path, source },
            ReadError::NotRegular { kind, .. } => ReadError::NotRegular { path, kind },
            ReadError::TooLarge { max, .. } => ReadError::TooLarge { path, max },
            ReadError::Read { source, .. } => ReadError::Read { path, source },
        }
    }
}

/// `fstat(2)` of an open descriptor.
pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: a zeroed stat is a valid out-buffer; fd is open for the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// openat2(2): open `rel` (`.` when empty) relative to `dir` with `flags` and `resolve`
/// (`RESOLVE_*`) rules. The one wrapper of the call, for every resolution the host makes inside a
/// root it does not trust.
pub fn openat2(dir: &impl AsRawFd, rel: &Path, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let path = std::ffi::CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let how = OpenHow {
        flags: flags as u64,
        mode: 0,
        resolve,
    };
    // SAFETY: valid pointers for the duration of the call; the kernel copies `how`.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::time::{Duration, Instant};

    const CAP: u64 = 64;

    fn root() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("etc")).unwrap();
        d
    }

    #[test]
    fn a_regular_file_within_the_cap_is_read_and_one_exactly_at_it_too() {
        let d = root();
        std::fs::write(d.path().join("etc/small"), b"hello").unwrap();
        std::fs::write(d.path().join("etc/exact"), vec![b'x'; CAP as usize]).unwrap();
        let l = Limits::in_root(CAP);
        assert_eq!(read(d.path(), "etc/small", l).unwrap(), b"hello");
        assert_eq!(read(d.path(), "/etc/exact", l).unwrap().len(), CAP as usize);
        let e = read(d.path(), "etc/none", l).unwrap_err();
        assert!(e.is_missing(), "{e}");
    }

    #[test]
    fn a_file_over_the_cap_is_refused_naming_the_path_and_the_cap() {
        let d = root();
        std::fs::write(d.path().join("etc/big"), vec![b'x'; CAP as usize + 1]).unwrap();
        let e = read(d.path(), "etc/big", Limits::in_root(CAP)).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { max: CAP, .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("etc/big") && msg.contains("64 bytes"), "{msg}");
    }

    #[test]
    fn a_file_grown_after_the_check_is_still_cut_at_the_cap() {
        let d = root();
        let p = d.path().join("etc/grows");
        std::fs::write(&p, b"ok").unwrap();
        let dir = File::open(d.path()).unwrap();
        let f = open_at(&dir, "etc/grows", Limits::in_root(CAP)).unwrap();
        // Grown past the cap between the open (which checked the size) and the read.
        std::fs::write(&p, vec![b'x'; 10 * CAP as usize]).unwrap();
        let mut bytes = Vec::new();
        f.take(CAP + 1).read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes.len() as u64, CAP + 1);
        // And read_at refuses it outright.
        let e = read_at(&dir, "etc/grows", Limits::in_root(CAP)).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { .. }), "{e}");
    }

    #[test]
    fn a_character_device_is_refused_without_reading() {
        let d = root();
        // Where mknod is not allowed, the host's /dev/zero is what an image's node would be.
        let node = d.path().join("etc/zero");
        let made = nix_mknod_zero(&node);
        let (dir, rel) = if made {
            (d.path().to_path_buf(), "etc/zero")
        } else {
            (std::path::PathBuf::from("/"), "dev/zero")
        };
        let e = read(&dir, rel, Limits::in_root(32 << 20)).unwrap_err();
        assert!(
            matches!(
                e,
                ReadError::NotRegular {
                    kind: "character device",
                    ..
                }
            ),
            "{e}"
        );
    }

    fn nix_mknod_zero(path: &Path) -> bool {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string; mknod only creates the node.
        unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 5)) == 0 }
    }

    #[test]
    fn a_fifo_is_refused_at_once() {
        let d = root();
        let fifo = d.path().join("etc/passwd");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let start = Instant::now();
        let e = read(d.path(), "etc/passwd", Limits::in_root(CAP)).unwrap_err();
        assert!(
            matches!(e, ReadError::NotRegular { kind: "FIFO", .. }),
            "{e}"
        );
        assert!(start.elapsed() < Duration::from_secs(1));
        let e = read(d.path(), "etc/passwd", Limits::beneath_no_symlinks(CAP)).unwrap_err();
        assert!(matches!(e, ReadError::NotRegular { .. }), "{e}");
    }

    #[test]
    fn symlinks_stay_in_the_root_or_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"host").unwrap();
        let d = root();
        std::fs::write(d.path().join("etc/mine"), b"image").unwrap();
        // An absolute link to a host file: in the root it names the image's own file.
        let host = outside.path().join("secret");
        symlink(&host, d.path().join("etc/link")).unwrap();
        let e = read(d.path(), "etc/link", Limits::in_root(CAP)).unwrap_err();
        assert!(e.is_missing(), "{e}");
        // A relative link inside the image is followed, inside it.
        symlink("mine", d.path().join("etc/ok")).unwrap();
        assert_eq!(
            read(d.path(), "etc/ok", Limits::in_root(CAP)).unwrap(),
            b"image"
        );
        // Beneath, with no symlinks: neither is followed.
        for l in ["etc/link", "etc/ok"] {
            let e = read(d.path(), l, Limits::beneath_no_symlinks(CAP)).unwrap_err();
            assert!(
                matches!(e, ReadError::Escapes { .. } | ReadError::NotRegular { .. }),
                "{l}: {e}"
            );
        }
        // A link climbing out with `..`s, beneath: refused.
        let up = format!("../../../../../../..{}", host.display());
        symlink(&up, d.path().join("etc/up")).unwrap();
        let beneath = Limits {
            scope: Scope::Beneath,
            no_symlinks: false,
            max_bytes: CAP,
        };
        let e = read(d.path(), "etc/up", beneath).unwrap_err();
        assert!(matches!(e, ReadError::Escapes { .. }), "{e}");
        // In the root, the same link's `..`s stop at the root.
        let e = read(d.path(), "etc/up", Limits::in_root(CAP)).unwrap_err();
        assert!(e.is_missing(), "{e}");
    }

    #[test]
    fn dot_dot_cannot_leave_the_root() {
        let outside = tempfile::tempdir().unwrap();
        let d = root();
        std::fs::create_dir(outside.path().join("r")).unwrap();
        std::fs::write(outside.path().join("secret"), b"host").unwrap();
        let r = outside.path().join("r");
        let e = read(&r, "../secret", Limits::in_root(CAP)).unwrap_err();
        assert!(e.is_missing(), "{e}");
        let beneath = Limits {
            scope: Scope::Beneath,
            no_symlinks: false,
            max_bytes: CAP,
        };
        let e = read(&r, "../secret", beneath).unwrap_err();
        assert!(matches!(e, ReadError::Escapes { .. }), "{e}");
        let e = read(d.path(), "etc/../../secret", beneath).unwrap_err();
        assert!(matches!(e, ReadError::Escapes { .. }), "{e}");
    }

    #[test]
    fn a_directory_or_a_socket_is_refused() {
        let d = root();
        let e = read(d.path(), "etc", Limits::in_root(CAP)).unwrap_err();
        assert!(
            matches!(
                e,
                ReadError::NotRegular {
                    kind: "directory",
                    ..
                }
            ),
            "{e}"
        );
        let _sock = std::os::unix::net::UnixListener::bind(d.path().join("etc/s")).unwrap();
        let e = read(d.path(), "etc/s", Limits::in_root(CAP)).unwrap_err();
        assert!(
            matches!(e, ReadError::NotRegular { kind: "socket", .. }),
            "{e}"
        );
    }
}
