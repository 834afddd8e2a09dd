//! Idmapped mounts (`mount_setattr(MOUNT_ATTR_IDMAP)`): a clone of a mount tree through which
//! files are seen with their owners mapped into a user namespace. What gives a pod with its own
//! user namespace its image layers and volumes, owned by its root, without copying or chowning.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;

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
    // SAFETY: open_tree with a valid path; the result is a new descriptor we own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint,
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
    // SAFETY: mount_setattr on our detached tree with a correctly sized attribute struct.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Attach a detached mount at `target` (which must exist, as a directory or a file to match).
pub fn attach(tree: &OwnedFd, target: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(target.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: move_mount of our detached tree onto a path.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
