//! Takes from the infra process everything a container could borrow through it: the host's files
//! (`/proc/1/root` of a shared pid namespace), its capabilities and any new privileges. Done after
//! exec, because a dynamically linked build needs the host's root to start.

use std::io;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};

/// An existing directory to mount the empty root on: every host running the shim has /proc, and
/// the mount, in our own private mount namespace, hides it from nothing but ourselves.
const MOUNT_POINT: &str = "/proc";

/// Join the empty mount namespace left on `fd` (the daemon's: a read-only tmpfs of no size as its
/// root, nothing else); whether we did. Not for a pod with its own user namespace, whose root
/// has no say over the node's namespaces: it makes its own with [`empty_root`].
pub fn join_empty(fd: i32) -> bool {
    // SAFETY: fstatfs into a zeroed struct we own, on a descriptor number we may not hold.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let is_ns =
        unsafe { libc::fstatfs(fd, &mut st) } == 0 && st.f_type as u64 == libc::NSFS_MAGIC as u64;
    // SAFETY: setns on a namespace descriptor; then chdir to the root it gave us.
    let joined = is_ns
        && unsafe { libc::setns(fd, libc::CLONE_NEWNS) } == 0
        && unsafe { libc::chdir(c"/".as_ptr()) } == 0;
    // SAFETY: our own descriptor, used no more.
    unsafe { libc::close(fd) };
    joined
}

/// Enter a mount namespace of our own and pivot into an empty, read-only tmpfs: afterwards `/` and
/// `/proc/<pid>/root` show an empty directory, as pause's root does, and no host mount is reachable.
pub fn empty_root() -> Result<(), String> {
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    // Private first, so that neither the tmpfs nor the detach below propagates to the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("making / private: {e}"))?;
    mount(
        Some("tmpfs"),
        MOUNT_POINT,
        Some("tmpfs"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=4k,nr_inodes=2,mode=0555"),
    )
    .map_err(|e| format!("mounting the empty root: {e}"))?;
    nix::unistd::chdir(MOUNT_POINT).map_err(|e| format!("chdir to the empty root: {e}"))?;
    // pivot_root(".", "."): the old root ends up stacked on the new one, and is detached next.
    nix::unistd::pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| format!("detaching the old root: {e}"))?;
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}

/// Drop every capability (bounding and ambient sets included), set `no_new_privs`, and make the
/// process non-dumpable, so that only `CAP_SYS_PTRACE` reaches its `/proc` files or ptraces it.
pub fn drop_privileges() -> Result<(), String> {
    // The bounding set first: dropping from it needs CAP_SETPCAP, which capset takes away.
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments; EINVAL past the kernel's last capability.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(format!(
                "dropping capability {cap} from the bounding set: {e}"
            ));
        }
    }
    // SAFETY: as above.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(format!(
            "clearing the ambient capabilities: {}",
            io::Error::last_os_error()
        ));
    }
    clear_capabilities()?;
    // SAFETY: as above.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!("no_new_privs: {}", io::Error::last_os_error()));
    }
    // SAFETY: as above.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(format!("PR_SET_DUMPABLE: {}", io::Error::last_os_error()));
    }
    Ok(())
}

/// capset(2) with empty effective, permitted and inheritable sets.
fn clear_capabilities() -> Result<(), String> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [Data::default(); 2];
    // SAFETY: valid pointers to a v3 header and its two data words for the call's duration.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    if rc != 0 {
        return Err(format!("capset: {}", io::Error::last_os_error()));
    }
    Ok(())
}

/// Close every descriptor: the shim's log and `/dev/null` would otherwise be reachable through
/// `/proc/1/fd`. Nothing after this writes anywhere.
pub fn close_all_fds() {
    // SAFETY: close_range with integer arguments; we hold no descriptor we still need.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) };
    if rc != 0 {
        // Kernels before 5.9: closing one by one, up to a limit far above what we inherit.
        for fd in 0..4096 {
            // SAFETY: as above.
            unsafe { libc::close(fd) };
        }
    }
}
