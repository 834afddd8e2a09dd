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
mod tests;
