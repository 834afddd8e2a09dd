//! An empty mount namespace: a read-only tmpfs of no size as its root, and nothing else. The
//! daemon holds one for the pods' infra processes to join and for the shims to build create
//! views in (see `crishim-cri`'s `empty_mnt`).

use std::ffi::CStr;
use std::io;

fn check(r: libc::c_long) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let ptr = |c: Option<&CStr>| c.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: mount(2) with NUL-terminated strings or nulls.
    let r = unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
    };
    check(r.into())
}

/// Moves the calling thread into a new mount namespace whose only mount is an empty read-only
/// tmpfs, its root. The thread's other namespaces and the node's mounts are untouched.
pub fn make_here() -> io::Result<()> {
    // SAFETY: unshare with a flag; it affects this thread only (a new mount namespace takes a
    // root and working directory of its own with it).
    check(unsafe { libc::unshare(libc::CLONE_NEWNS) }.into())?;
    mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)?;
    // Any directory serves as the mount point; /proc is on every node.
    mount(
        Some(c"tmpfs"),
        c"/proc",
        Some(c"tmpfs"),
        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some(c"size=4k,nr_inodes=2,mode=0555"),
    )?;
    // SAFETY: chdir, pivot_root and umount2 with NUL-terminated paths.
    unsafe {
        check(libc::chdir(c"/proc".as_ptr()).into())?;
        check(libc::syscall(
            libc::SYS_pivot_root,
            c".".as_ptr(),
            c".".as_ptr(),
        ))?;
        check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH).into())?;
        check(libc::chdir(c"/".as_ptr()).into())
    }
}
