//! Pinning a network namespace to a file (a bind mount of `/proc/<pid>/ns/net`), so that it
//! outlives its processes and CNI DEL can still enter it.
//!
//! The bind mount is made in the caller's mount namespace; other mount namespaces see it only
//! if `path` lies on a shared mount.

use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// Whether `path` is a namespace file (an nsfs bind mount or a `/proc/<pid>/ns/*` link).
pub fn is_netns(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

/// `/proc/<pid>/ns/net`.
pub fn proc_netns(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/ns/net"))
}

/// Make a new network namespace with its loopback up, and pin it at `path`: a thread of its own
/// enters it and ends, so the daemon's other threads stay in the node's namespace.
pub fn create(path: &Path) -> io::Result<()> {
    let path = path.to_path_buf();
    std::thread::Builder::new()
        .name("crishim-netns".into())
        .spawn(move || -> io::Result<()> {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
            crishim_proto::net::loopback_up()?;
            pin_path(Path::new("/proc/thread-self/ns/net"), &path)
        })?
        .join()
        .map_err(|_| io::Error::other("the network namespace thread panicked"))?
}

/// Pins the network namespace of process `pid` at `path` (parent dirs are created). Pinning
/// the same namespace again is a no-op; `path` holding another namespace is `AlreadyExists`.
pub fn pin(pid: u32, path: &Path) -> io::Result<()> {
    pin_path(&proc_netns(pid), path)
}

/// Pins the namespace file `source` (e.g. `/proc/<pid>/ns/net`) at `path`; see [`pin`].
pub fn pin_path(source: &Path, path: &Path) -> io::Result<()> {
    let src = std::fs::metadata(source)?;
    if is_netns(path) {
        let cur = std::fs::metadata(path)?;
        if (cur.dev(), cur.ino()) == (src.dev(), src.ino()) {
            return Ok(());
        }
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} already holds another namespace", path.display()),
        ));
    }
    if let Some(parent) = path.parent() {
        crishim_proto::hostfs::create_private_dir(parent)?;
    }
    let created = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(e),
    };
    if let Err(e) = mount(
        Some(source),
        path,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    ) {
        if created {
            let _ = std::fs::remove_file(path);
        }
        return Err(io::Error::new(
            io::Error::from(e).kind(),
            format!(
                "bind-mounting {} on {}: {e}",
                source.display(),
                path.display()
            ),
        ));
    }
    Ok(())
}

/// Unpins `path`: detaches every namespace mount on it and removes the file. A missing file
/// is fine; a file that is not a namespace is just removed (nothing else is unmounted).
pub fn unpin(path: &Path) -> io::Result<()> {
    // Bounded, in case of stacked pins.
    for _ in 0..16 {
        if !is_netns(path) {
            break;
        }
        match umount2(path, MntFlags::MNT_DETACH) {
            Ok(()) => {}
            Err(Errno::EINVAL) | Err(Errno::ENOENT) => break,
            Err(e) => {
                return Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("unmounting {}: {e}", path.display()),
                ))
            }
        }
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
