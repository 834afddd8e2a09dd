//! Detached mount trees (`open_tree`, `mount_setattr`, `move_mount`), and idmapped ones
//! (`MOUNT_ATTR_IDMAP`): a clone of a mount tree through which files are seen with their owners
//! mapped into a user namespace. What gives a pod with its own user namespace its image layers
//! and volumes, owned by its root, without copying or chowning.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
/// `mount_setattr` flags for [`restricted_clone`].
pub const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
pub const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
pub const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x0000_0008;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x0000_0040;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A detached clone of the mount tree at `source` (its submounts too), to [`attach`] elsewhere,
/// in this mount namespace or another this thread enters.
pub fn clone_tree(source: &Path) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(source.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    open_tree_clone(libc::AT_FDCWD, &c, libc::AT_RECURSIVE as libc::c_uint)
}

/// `open_tree(dir, path, OPEN_TREE_CLONE | O_CLOEXEC | flags)`.
fn open_tree_clone(
    dir: libc::c_int,
    path: &std::ffi::CStr,
    flags: libc::c_uint,
) -> io::Result<OwnedFd> {
    // SAFETY: open_tree with a NUL-terminated path; the result is a new descriptor we own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | flags,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A detached clone of the mount tree at `source`, idmapped with `userns`'s mappings: a file
/// owned by host id `h` in `source` is seen there as owned by `h`'s id in the user namespace.
pub fn idmapped_clone(source: &Path, userns: &File) -> io::Result<OwnedFd> {
    let fd = clone_tree(source)?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    set_attr(&fd, &attr, libc::AT_RECURSIVE)?;
    Ok(fd)
}

/// A detached clone of the mount tree at `source` with `attrs` (`MOUNT_ATTR_RDONLY`, …) set on
/// every mount of it, and its owners left as they are. Made by host root in the host's user
/// namespace: once a mount namespace owned by a less privileged user namespace copies it, the
/// kernel locks those flags there (`MNT_LOCK_READONLY` and the like), so even a process with
/// `CAP_SYS_ADMIN` in that namespace cannot clear them on it or on a bind of it.
pub fn restricted_clone(source: &Path, attrs: u64) -> io::Result<OwnedFd> {
    let fd = clone_tree(source)?;
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    set_attr(&fd, &attr, libc::AT_RECURSIVE)?;
    Ok(fd)
}

/// `mount_setattr` on a detached tree (`flags`: `AT_RECURSIVE` for its submounts too).
fn set_attr(tree: &OwnedFd, attr: &MountAttr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: mount_setattr on our detached tree with a correctly sized attribute struct.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | flags,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A detached clone of the one mount `at` (an `O_PATH` descriptor of its root) names, without
/// its submounts, made `propagation` (`MS_SLAVE`, `MS_PRIVATE`) before anything can be attached
/// to it: a clone of a shared mount is otherwise a peer of it, and what is mounted on the clone
/// would reach the original.
pub fn clone_one(at: BorrowedFd<'_>, propagation: libc::c_ulong) -> io::Result<OwnedFd> {
    let tree = open_tree_clone(at.as_raw_fd(), c"", libc::AT_EMPTY_PATH as libc::c_uint)?;
    let attr = MountAttr {
        attr_set: 0,
        attr_clr: 0,
        propagation: u64::from(propagation as u32),
        userns_fd: 0,
    };
    set_attr(&tree, &attr, 0)?;
    Ok(tree)
}

/// Attach a detached mount on the file `target` (an `O_PATH` descriptor) names.
pub fn attach_at(tree: &OwnedFd, target: BorrowedFd<'_>) -> io::Result<()> {
    move_mount(tree, target.as_raw_fd(), c"", MOVE_MOUNT_T_EMPTY_PATH)
}

/// Attach a detached mount at `target` (which must exist, as a directory or a file to match).
pub fn attach(tree: &OwnedFd, target: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(target.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    move_mount(tree, libc::AT_FDCWD, &c, 0)
}

fn move_mount(
    tree: &OwnedFd,
    dir: libc::c_int,
    target: &std::ffi::CStr,
    flags: libc::c_uint,
) -> io::Result<()> {
    // SAFETY: move_mount of our detached tree onto a path or a descriptor.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            dir,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | flags,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
