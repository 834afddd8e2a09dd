//! The subreaper loop: on every SIGCHLD, reap all exited children and record them.

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use tokio::signal::unix::{signal, SignalKind};

use crate::container::Shared;

pub async fn run(shim: Shared) {
    let mut sigchld = match signal(SignalKind::child()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("crishim-shim: cannot watch SIGCHLD: {e}");
            return;
        }
    };
    loop {
        reap(&shim);
        if sigchld.recv().await.is_none() {
            return;
        }
    }
}

/// Reap every child that has exited. Runs only between awaits, so it never races a synchronous
/// libcontainer call waiting for its own helper processes.
pub fn reap(shim: &Shared) {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(status) => shim.borrow_mut().on_exit(status),
        }
    }
}
