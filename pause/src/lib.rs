//! The pod's infra process, crishim's own "pause". The shim clones it into the pod's new
//! namespaces, where it sets the hostname and brings loopback up, then execs this program, which
//! only waits: it pins the namespaces, and as PID 1 of a shared pid namespace it reaps every
//! orphan.
//!
//! Before it waits it confines itself ([`confine`], [`filter`]): a mount namespace of its own with
//! an empty read-only root, no capabilities, `no_new_privs` and a seccomp filter. A container that
//! can see it (shared pid namespace) and ptrace it finds nothing of the host behind it.

mod confine;
pub mod filter;

use std::io::Write;
use std::os::fd::FromRawFd;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};

/// The descriptor on which the infra process reports `ok` or `error: ...`: a fixed number, so
/// that its command line stays `crishim-pause`, as `ps` in a shared-pid pod shows it.
pub const READY_FD: i32 = 3;

/// The descriptor on which the shim may leave us the daemon's empty mount namespace, to join
/// instead of making one (see `confine::empty_root`).
pub const MNT_FD: i32 = 4;

/// Confine ourselves, report on [`READY_FD`], then wait.
pub fn run() -> ! {
    let set = signals();
    // PID 1 ignores signals it has no handler for; blocking them and waiting makes them arrive.
    let _ = set.thread_block();
    let mut ready = ready_pipe();
    let mut program = filter::program();
    let confined = if confine::join_empty(MNT_FD) {
        Ok(())
    } else {
        confine::empty_root()
    };
    if let Err(e) = confined.and_then(|()| confine::drop_privileges()) {
        eprintln!("crishim-pause: {e}");
        if let Some(r) = &mut ready {
            let _ = r.write_all(format!("error: {e}").as_bytes());
        }
        // SAFETY: _exit ends the process at once, skipping atexit handlers.
        unsafe { libc::_exit(1) }
    }
    if let Some(r) = &mut ready {
        let _ = r.write_all(b"ok");
    }
    // The report pipe goes with every other descriptor.
    std::mem::forget(ready);
    confine::close_all_fds();
    // Last, as it forbids everything but waiting; no_new_privs lets us load it without capabilities.
    if filter::load(&mut program).is_err() {
        // SAFETY: as above.
        unsafe { libc::_exit(2) }
    }
    wait_loop(&set)
}

/// [`READY_FD`] when it is the pipe the shim left us (not when run by hand).
fn ready_pipe() -> Option<std::fs::File> {
    let st = nix::sys::stat::fstat(READY_FD).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return None;
    }
    // SAFETY: the shim handed this descriptor to us alone, for this report.
    Some(unsafe { std::fs::File::from_raw_fd(READY_FD) })
}

fn signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        set.add(s);
    }
    set
}

/// Wait for signals; reap on SIGCHLD; exit cleanly on SIGTERM or SIGINT. Only calls that
/// [`filter::ALLOWED`] lets through.
fn wait_loop(set: &SigSet) -> ! {
    loop {
        match set.wait() {
            Ok(Signal::SIGCHLD) => reap_all(),
            // SAFETY: _exit is exit_group, with no atexit handlers to run.
            Ok(Signal::SIGTERM) | Ok(Signal::SIGINT) => unsafe { libc::_exit(0) },
            _ => {}
        }
    }
}

fn reap_all() {
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}
