//! LSM process attributes (`/proc/thread-self/attr/exec`), written only through a verified
//! procfs handle, as libcontainer writes AppArmor's profile: both go through libpathrs's
//! `ProcfsHandle`.
//!
//! The SELinux label is written after `pivot_root`, inside the container's mounts. A plain
//! `open("/proc/thread-self/attr/exec")` there would follow whatever is mounted at `/proc`: a
//! CRI volume holding a regular file `thread-self/attr/exec` would take the label and the
//! workload would run in the shim's own domain (runc's CVE-2019-16884). The handle is a fresh
//! private procfs where the process may mount one (`fsopen`), else the `/proc` it sees, checked
//! to be a procfs root; the attribute is then opened beneath it without crossing a mount, and the
//! opened file is checked to be on procfs once more before a byte is written. Any check failing
//! stops the start or exec: the process must not run unlabelled.

use std::io::Write as _;
use std::os::fd::AsFd;

use pathrs::flags::OpenFlags;
use pathrs::procfs::{ProcfsBase, ProcfsHandle};

/// The attribute that sets the context of the next `execve`.
const EXEC_ATTR: &str = "attr/exec";

/// The inode number of procfs's root directory (part of Linux's ABI).
const PROC_ROOT_INO: u64 = 1;

/// A verified handle on procfs: a private procfs where this process may mount one (`fsopen`),
/// else the `/proc` it sees. Either way that `/proc` must be the root of a procfs first: else it
/// is a volume standing in for it, refused here with a plain reason (pathrs, reporting its own
/// failure, would read `/proc/thread-self` for the message and panic on such a `/proc`).
pub fn procfs() -> Result<ProcfsHandle, String> {
    check_proc_root(std::path::Path::new("/proc"))?;
    ProcfsHandle::new().map_err(|e| format!("opening a verified procfs handle: {e}"))
}

/// Whether `path` is the root of a procfs mount: the filesystem type, and the root's inode (1).
fn check_proc_root(path: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    let fs = nix::sys::statfs::fstatfs(dir.as_fd())
        .map_err(|e| format!("checking the filesystem of {}: {e}", path.display()))?;
    let ino = dir
        .metadata()
        .map_err(|e| format!("checking {}: {e}", path.display()))?
        .ino();
    if fs.filesystem_type() != nix::sys::statfs::PROC_SUPER_MAGIC || ino != PROC_ROOT_INO {
        return Err(format!(
            "{} is not the root of a procfs (filesystem type {:#x}, inode {ino}): a volume \
             mounted over it? Refusing to write a label through it",
            path.display(),
            fs.filesystem_type().0
        ));
    }
    Ok(())
}

/// This thread's `attr/exec`, opened through a verified procfs handle and checked to be on
/// procfs. Opened before the seccomp filter is loaded and the capabilities are dropped (so the
/// handle can be a private procfs, and a filter cannot stand in the way), written last.
pub struct ExecAttr(std::fs::File);

impl ExecAttr {
    /// Open this thread's `attr/exec` through a fresh verified procfs handle.
    pub fn open() -> Result<Self, String> {
        Self::open_in(&procfs()?)
    }

    /// Open this thread's `attr/exec` beneath `proc`, crossing no mount.
    pub fn open_in(proc: &ProcfsHandle) -> Result<Self, String> {
        let file = proc
            .open(
                ProcfsBase::ProcThreadSelf,
                EXEC_ATTR,
                OpenFlags::O_WRONLY | OpenFlags::O_CLOEXEC,
            )
            .map_err(|e| format!("opening /proc/thread-self/{EXEC_ATTR}: {e}"))?;
        Self::on_procfs(file)
    }

    /// `file`, if it is on procfs: anything else is a stand-in (a volume mounted over `/proc`),
    /// refused before a byte is written to it.
    fn on_procfs(file: std::fs::File) -> Result<Self, String> {
        let fs = nix::sys::statfs::fstatfs(file.as_fd()).map_err(|e| {
            format!("checking the filesystem of /proc/thread-self/{EXEC_ATTR}: {e}")
        })?;
        if fs.filesystem_type() != nix::sys::statfs::PROC_SUPER_MAGIC {
            return Err(format!(
                "/proc/thread-self/{EXEC_ATTR} is not on procfs (filesystem type {:#x}): \
                 refusing to write a label to it",
                fs.filesystem_type().0
            ));
        }
        Ok(Self(file))
    }

    /// Set the SELinux context this thread's next `execve` runs in, in one write.
    pub fn set_label(mut self, label: &str) -> Result<(), String> {
        self.0
            .write_all(label.as_bytes())
            .map_err(|e| format!("writing it: {e}"))
    }
}

/// Set the SELinux context this thread's next `execve` runs in, through a verified handle.
pub fn set_exec_label(label: &str) -> Result<(), String> {
    ExecAttr::open()
        .and_then(|attr| attr.set_label(label))
        .map_err(|e| format!("setting the SELinux label {label:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABEL: &str = "system_u:system_r:container_t:s0:c1,c2";

    // No SELinux on this kernel: a regular file stands in for /proc/thread-self/attr/exec, as a
    // volume mounted over /proc would hold one. It must be refused and stay empty. (The old
    // writer opened whatever path it was given and wrote the label there.)
    #[test]
    fn a_label_file_off_procfs_is_refused_and_left_unwritten() {
        let dir = tempfile::tempdir().unwrap();
        let attr = dir.path().join("exec");
        std::fs::write(&attr, "").unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&attr).unwrap();
        let e = ExecAttr::on_procfs(file).err().unwrap();
        assert!(e.contains("is not on procfs"), "{e}");
        assert_eq!(std::fs::read_to_string(&attr).unwrap(), "");
    }

    // Through the real handle the write reaches this thread's procfs attribute; this kernel has
    // no LSM taking process labels (and the label is no context), so the kernel itself refuses
    // it: the error is the write's, not the open's or the procfs check's.
    #[test]
    fn the_label_reaches_procfs_through_the_handle() {
        let e = set_exec_label("crishim-test-not-a-context").unwrap_err();
        assert!(e.contains("writing it"), "{e}");
        assert!(
            !e.contains("not on procfs") && !e.contains("opening"),
            "{e}"
        );
    }

    #[test]
    fn a_directory_standing_in_for_proc_is_refused() {
        check_proc_root(std::path::Path::new("/proc")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let e = check_proc_root(dir.path()).unwrap_err();
        assert!(e.contains("is not the root of a procfs"), "{e}");
        // procfs, but not its root: no handle from it either.
        let e = check_proc_root(std::path::Path::new("/proc/self")).unwrap_err();
        assert!(e.contains("is not the root of a procfs"), "{e}");
    }

    const CHILD: &str = "CRISHIM_LSM_ATTR_CHILD";
    const SCENARIO: &str = "lsm_attr::tests::a_volume_over_proc_does_not_take_the_label";

    // runc's CVE-2019-16884: a volume over /proc, or over this thread's attr directory, holding
    // a regular file attr/exec. Played in a child process of its own (a mount namespace, tmpfs
    // mounts, a capability dropped), so no other test, and no cached procfs handle, is in the
    // way. The old plain open of /proc/thread-self/attr/exec wrote the label into both.
    #[test]
    fn a_volume_over_proc_does_not_take_the_label() {
        if std::env::var_os(CHILD).is_some() {
            return over_proc();
        }
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: a mount namespace and tmpfs mounts in /proc need root");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([SCENARIO, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "{text}");
    }

    fn over_proc() {
        use caps::{CapSet, Capability::CAP_SYS_ADMIN};
        use nix::mount::{mount, MsFlags};
        let none = None::<&str>;
        let tmpfs = |at: &str| {
            mount(
                Some("crishim-test"),
                at,
                Some("tmpfs"),
                MsFlags::empty(),
                none,
            )
            .unwrap();
            let stand_in = std::path::Path::new("/proc/thread-self/attr/exec");
            std::fs::create_dir_all(stand_in.parent().unwrap()).unwrap();
            std::fs::write(stand_in, "").unwrap();
            // What a plain open of the attribute now finds: the volume's regular file.
            assert_eq!(
                nix::sys::statfs::statfs(stand_in)
                    .unwrap()
                    .filesystem_type(),
                nix::sys::statfs::TMPFS_MAGIC
            );
            stand_in
        };
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("a mount namespace");
        mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).unwrap();

        // A volume over this thread's attr directory, in a real /proc. Without CAP_SYS_ADMIN (a
        // container's init, usually) the handle is that /proc, and the lookup may not cross
        // into the volume: refused.
        let stand_in = tmpfs("/proc/thread-self/attr");
        caps::drop(None, CapSet::Effective, CAP_SYS_ADMIN).unwrap();
        let e = set_exec_label(LABEL).unwrap_err();
        assert!(e.contains("opening /proc/thread-self/attr/exec"), "{e}");
        assert_eq!(std::fs::read_to_string(stand_in).unwrap(), "");
        // With it, the handle is a procfs of its own, beneath no volume: the write reaches the
        // real attribute (refused by this kernel, which has no SELinux), never the stand-in.
        caps::raise(None, CapSet::Effective, CAP_SYS_ADMIN).unwrap();
        let e = set_exec_label(LABEL).unwrap_err();
        assert!(e.contains("writing it"), "{e}");
        assert_eq!(std::fs::read_to_string(stand_in).unwrap(), "");

        // A volume over /proc itself: refused, with or without the capability.
        let stand_in = tmpfs("/proc");
        let e = set_exec_label(LABEL).unwrap_err();
        assert!(e.contains("/proc is not the root of a procfs"), "{e}");
        caps::drop(None, CapSet::Effective, CAP_SYS_ADMIN).unwrap();
        let e = set_exec_label(LABEL).unwrap_err();
        assert!(e.contains("/proc is not the root of a procfs"), "{e}");
        assert_eq!(std::fs::read_to_string(stand_in).unwrap(), "");
    }
}
