//! Thin, safe wrappers over the `*at` syscalls the unpacker uses. Every call takes a directory fd and a
//! single path component, so nothing here resolves a path through a symlink by accident.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cstr(p: &[u8]) -> io::Result<CString> {
    CString::new(p)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub use crishim_sys::confined::openat2;

/// Open a directory beneath `root`: fails with `EXDEV` if resolution would leave `root` through `..`
/// or an absolute symlink, and with `ELOOP` through magic links.
pub fn open_dir_beneath(root: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    openat2(
        root,
        rel,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
    )
}

pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let p = cstr(path.as_os_str().as_bytes())?;
    // SAFETY: valid C string.
    let fd = unsafe {
        libc::open(
            p.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn mkdirat(dir: &OwnedFd, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })
}

/// Create a new regular file; never follows or reuses an existing entry.
pub fn create_file(dir: &OwnedFd, name: &CStr) -> io::Result<std::fs::File> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: valid fd and C string.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

pub fn symlinkat(target: &CStr, dir: &OwnedFd, name: &CStr) -> io::Result<()> {
    // SAFETY: valid fd and C strings.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })
}

/// Hard link without following a symlink at the source (flags 0).
pub fn linkat(src_dir: &OwnedFd, src: &CStr, dst_dir: &OwnedFd, dst: &CStr) -> io::Result<()> {
    // SAFETY: valid fds and C strings.
    check(unsafe {
        libc::linkat(
            src_dir.as_raw_fd(),
            src.as_ptr(),
            dst_dir.as_raw_fd(),
            dst.as_ptr(),
            0,
        )
    })
}

pub fn mknodat(dir: &OwnedFd, name: &CStr, mode: u32, major: u32, minor: u32) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    check(unsafe {
        libc::mknodat(
            dir.as_raw_fd(),
            name.as_ptr(),
            mode,
            libc::makedev(major, minor),
        )
    })
}

pub fn unlinkat(dir: &OwnedFd, name: &CStr, remove_dir: bool) -> io::Result<()> {
    let flags = if remove_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: valid fd and C string.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })
}

/// `lstat` of one entry in `dir`.
pub fn lstatat(dir: &OwnedFd, name: &CStr) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid fd, C string and out pointer.
    check(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded and filled it.
    Ok(unsafe { st.assume_init() })
}

pub fn lchownat(dir: &OwnedFd, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    check(unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            name.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// chmod of an entry known not to be a symlink (Linux cannot chmod symlinks).
pub fn chmodat(dir: &OwnedFd, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    check(unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode, 0) })
}

pub fn lutimesat(dir: &OwnedFd, name: &CStr, secs: i64) -> io::Result<()> {
    let t = libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: valid fd, C string and a two-element array.
    check(unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            name.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// Set an xattr on an entry without following a final symlink. Goes through `/proc/self/fd` because
/// there is no `lsetxattrat`; the magic link only names `dir` itself.
pub fn lsetxattrat(dir: &OwnedFd, name: &CStr, key: &[u8], value: &[u8]) -> io::Result<()> {
    let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    path.extend_from_slice(name.to_bytes());
    let path = cstr(&path)?;
    let key = cstr(key)?;
    // SAFETY: valid C strings and a byte buffer of the given length.
    check(unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            key.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

pub fn syncfs(dir: &OwnedFd) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe { libc::syncfs(dir.as_raw_fd()) })
}
