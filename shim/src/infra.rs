//! The pod's infra process: cloned into the pod's new namespaces, where it sets the hostname and
//! brings loopback up, then execs `crishim-pause` (the `pause/` crate), which confines itself and
//! only waits.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};

use crishim_pause::READY_FD;
use crishim_proto::shim::InfraSpec;
use nix::sched::CloneFlags;
use nix::sys::signal::Signal;
use nix::sys::wait::waitpid;

/// Longest readiness report read from the infra process.
const MAX_REPORT: u64 = 4096;

/// The infra executable, installed next to `crishim-shim`.
pub const PAUSE_BINARY: &str = "crishim-pause";

/// Clone the infra process into new namespaces; returns its pid (in our pid namespace) once it has
/// confined itself, or why it could not. It joins `empty_mnt`, the daemon's empty mount
/// namespace (`spec.empty_mnt`, opened by the caller), where it can (see `crishim_pause::MNT_FD`).
pub fn spawn(spec: &InfraSpec, empty_mnt: Option<&std::fs::File>) -> Result<i32, String> {
    let exe = pause_binary()?;
    let exe = CString::new(exe.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // The infra process reports `ok` or its error on `w`; EOF means it died before.
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("pipe for the infra process: {e}"))?;
    let ready_fd = w.as_raw_fd();
    let argv = [CString::new(PAUSE_BINARY).unwrap()];
    let hostname = spec.hostname.clone();
    let mut flags = CloneFlags::empty();
    for (on, f) in [
        (spec.net, CloneFlags::CLONE_NEWNET),
        (spec.ipc, CloneFlags::CLONE_NEWIPC),
        (spec.uts, CloneFlags::CLONE_NEWUTS),
        (spec.pid, CloneFlags::CLONE_NEWPID),
    ] {
        if on {
            flags |= f;
        }
    }
    if spec.userns.is_some() {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    let net = spec.net;
    let uts = spec.uts;
    let label = spec.selinux_label.clone();
    if label.as_ref().is_some_and(|l| l.contains('\0')) {
        return Err("the infra process's SELinux label holds a NUL byte".to_string());
    }
    // With a user namespace the child waits on `go` until its maps are written: before, it
    // has no capabilities in its namespaces and no uid to run as.
    let (go_r, go_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("pipe for the infra process: {e}"))?;
    let go_fd = go_r.as_raw_fd();
    let wait_for_maps = spec.userns.is_some();
    // Opened here, joined in the child (before it execs; the descriptor closes with exec).
    let netns = match &spec.netns {
        Some(path) => Some(std::fs::File::open(path).map_err(|e| {
            format!(
                "opening the pod's network namespace {}: {e}",
                path.display()
            )
        })?),
        None => None,
    };
    // Above the numbers the child moves descriptors to. Not for a pod with its own user
    // namespace: its root has no say over a namespace of the node's.
    let empty_mnt = empty_mnt
        .filter(|_| spec.userns.is_none())
        .and_then(|f| {
            nix::fcntl::fcntl(f.as_raw_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10)).ok()
        })
        // SAFETY: fcntl returned a fresh descriptor that we now own.
        .map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    let mnt_fd = empty_mnt.as_ref().map(|f| f.as_raw_fd());
    let mut stack = vec![0u8; 64 * 1024];
    let child = Box::new(move || -> isize {
        if wait_for_maps {
            let mut b = [0u8; 1];
            // SAFETY: a read on the pipe this child inherited.
            if unsafe { libc::read(go_fd, b.as_mut_ptr().cast(), 1) } != 1 {
                return 14;
            }
            // Become the namespace's root: as the host's root, unmapped there, an exec would
            // drop every capability.
            let root = (nix::unistd::Gid::from_raw(0), nix::unistd::Uid::from_raw(0));
            if nix::unistd::setgroups(&[]).is_err()
                || nix::unistd::setresgid(root.0, root.0, root.0).is_err()
                || nix::unistd::setresuid(root.1, root.1, root.1).is_err()
            {
                return 15;
            }
        }
        if uts && !hostname.is_empty() && nix::unistd::sethostname(&hostname).is_err() {
            return 10;
        }
        if let Some(fd) = &netns {
            // The daemon made the pod's network namespace (loopback up); join it.
            if nix::sched::setns(fd, CloneFlags::CLONE_NEWNET).is_err() {
                return 13;
            }
        } else if net {
            let _ = crishim_proto::net::loopback_up();
        }
        // Our copy of the descriptor table: the report pipe becomes READY_FD, open across exec.
        // SAFETY: dup2/fcntl on descriptors of this (about to exec) child.
        let inherited = unsafe {
            if ready_fd == READY_FD {
                libc::fcntl(READY_FD, libc::F_SETFD, 0)
            } else {
                libc::dup2(ready_fd, READY_FD)
            }
        };
        if inherited < 0 {
            return 12;
        }
        if let Some(fd) = mnt_fd {
            // SAFETY: dup2 of our descriptor onto MNT_FD, open across exec.
            if unsafe { libc::dup2(fd, crishim_pause::MNT_FD) } < 0 {
                return 17;
            }
        }
        if let Some(label) = &label {
            // The context the exec runs in (SELinux), through a verified procfs handle:
            // failing it, the process must not run. The reason goes to the report pipe.
            if let Err(e) = crate::lsm_attr::set_exec_label(label) {
                let report = format!("error: {e}\n");
                // SAFETY: a write of a buffer this child owns to its report pipe.
                unsafe { libc::write(READY_FD, report.as_ptr().cast(), report.len()) };
                return 16;
            }
        }
        let _ = nix::unistd::execv(&exe, &argv);
        11
    });
    // SAFETY: the shim is single-threaded here; the child runs only the closure above, then execs.
    let pid = unsafe { nix::sched::clone(child, &mut stack, flags, Some(Signal::SIGCHLD as i32)) }
        .map_err(|e| format!("clone infra process ({flags:?}): {e}"))?;
    drop(empty_mnt);
    drop(w);
    drop(go_r);
    if let Some(u) = &spec.userns {
        let written = [("uid_map", &u.uid_map), ("gid_map", &u.gid_map)]
            .iter()
            .try_for_each(|(file, text)| {
                std::fs::write(format!("/proc/{pid}/{file}"), text.as_bytes())
                    .map_err(|e| format!("writing the infra process's {file}: {e}"))
            })
            .and_then(|()| {
                nix::unistd::write(&go_w, b"g")
                    .map(|_| ())
                    .map_err(|e| format!("releasing the infra process: {e}"))
            });
        if let Err(e) = written {
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
            return Err(e);
        }
    }
    drop(go_w);
    let mut report = String::new();
    let _ = std::fs::File::from(r)
        .take(MAX_REPORT)
        .read_to_string(&mut report);
    if report.trim() == "ok" {
        return Ok(pid.as_raw());
    }
    let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    let status = waitpid(pid, None);
    Err(match report.trim().strip_prefix("error: ") {
        Some(e) => format!("infra process: {e}"),
        None => format!("infra process exited before it was ready: {status:?}"),
    })
}

/// `crishim-pause` next to our own executable; its absence is a broken install.
fn pause_binary() -> Result<std::path::PathBuf, String> {
    let own = std::env::current_exe().map_err(|e| format!("finding own executable: {e}"))?;
    pause_binary_beside(&own)
}

fn pause_binary_beside(own: &std::path::Path) -> Result<std::path::PathBuf, String> {
    let exe = own.with_file_name(PAUSE_BINARY);
    if !exe.is_file() {
        return Err(format!(
            "the infra executable {} is missing: install crishim-pause next to crishim-shim",
            exe.display()
        ));
    }
    Ok(exe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_pause_binary_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("crishim-shim");
        let e = pause_binary_beside(&own).unwrap_err();
        assert!(
            e.contains(&dir.path().join(PAUSE_BINARY).display().to_string())
                && e.contains("install crishim-pause next to crishim-shim"),
            "{e}"
        );
        std::fs::write(dir.path().join(PAUSE_BINARY), b"").unwrap();
        assert_eq!(
            pause_binary_beside(&own).unwrap(),
            dir.path().join(PAUSE_BINARY)
        );
    }
}
