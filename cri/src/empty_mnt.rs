//! An empty mount namespace (a read-only tmpfs of no size as its root, and nothing else), held
//! by a thread of the daemon's that sleeps in it. Each pod's infra process joins it (through
//! that thread's `/proc/<pid>/task/<tid>/ns/mnt`, which the shim opens as it starts) rather than
//! copying the node's mount namespace and detaching every mount of the copy to reach an empty
//! root: on a node with many pods, that copy holds every pod's rootfs, `/dev/shm` and network
//! namespace. Holding no mount of the node's, it keeps no file system busy.

use std::io;
use std::path::PathBuf;

/// Start the thread; returns the path of its mount namespace.
pub fn start() -> io::Result<PathBuf> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("crishim-mnt".into())
        .spawn(move || {
            let made = crishim_sys::empty_ns::make_here().map(|()| nix::unistd::gettid().as_raw());
            let ok = made.is_ok();
            let _ = tx.send(made);
            // Held for the daemon's life; a thread that failed to make it ends.
            if ok {
                loop {
                    std::thread::park();
                }
            }
        })?;
    let tid = rx
        .recv()
        .map_err(|_| io::Error::other("the mount namespace thread ended"))??;
    Ok(PathBuf::from(format!(
        "/proc/{}/task/{tid}/ns/mnt",
        std::process::id()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The namespace's root is empty and read-only, nothing of the node is there, and the
    /// node's namespace is unchanged.
    #[test]
    fn the_namespace_is_empty() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let before = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let path = start().unwrap();
        let ns = std::fs::File::open(&path).unwrap();
        let inside = crishim_sys::testing::in_child_mount_ns(|| {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNS).ok()?;
            Some(vec![
                std::fs::read_dir("/").ok()?.next().is_none(),
                !std::path::Path::new("/proc/self").exists(),
                std::fs::write("/x", "").is_err(),
            ])
        });
        assert_eq!(
            inside,
            Some(vec![true; 3]),
            "(the root empty, no /proc, read-only)"
        );
        let after = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert_eq!(before, after, "the node's mounts changed");
    }
}
