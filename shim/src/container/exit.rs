//! Exits: reaped children (a container's init, an exec'd process, the infra process), each
//! container's exit recorded on disk and told to waiters and watchers.

use std::time::Duration;

use crishim_proto::cgroups_path;
use crishim_proto::shim::{ContainerState, Status};
use nix::sys::wait::WaitStatus;

use crate::record::now_nanos;

use super::{Shared, Shim};

impl Shim {
    /// Record a reaped child: a container's init, an exec'd process, or an orphan.
    pub fn on_exit(&mut self, status: WaitStatus) {
        let Some(pid) = status.pid().map(|p| p.as_raw()) else {
            return;
        };
        if pid == self.infra_pid {
            eprintln!("crishim-shim: infra process {pid} exited: {status:?}");
            self.infra_pid = 0;
            return;
        }
        if let Some(tx) = self.exec_waiters.remove(&pid) {
            let _ = tx.send(status);
            return;
        }
        let Some(code) = exit_code(&status) else {
            return;
        };
        let hit = self
            .containers
            .values_mut()
            .find(|c| c.state.pid == pid && c.state.status != Status::Exited);
        if let Some(c) = hit {
            c.state.status = Status::Exited;
            c.state.exit_code = code;
            c.state.finished_at = now_nanos();
            // Any OOM kill in the container's cgroup, as containerd reports it: the killed
            // process is often a child, and the init then exits with its status.
            c.state.oom_killed = oom_killed(&c.cgroup);
            let state = c.state.clone();
            self.record_exit(&state);
        }
    }

    /// An exit, recorded on disk, then told to waiters and to every `Watch` stream.
    pub(super) fn record_exit(&mut self, state: &ContainerState) {
        self.persist(state);
        self.exited.notify_waiters();
        self.watchers.retain(|w| w.send(state.clone()).is_ok());
    }
}

/// Exit code as a shell reports it: the code, or 128 + the signal.
pub fn exit_code(status: &WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(*code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + *sig as i32),
        _ => None,
    }
}

/// Wait until the container has been reaped, or the timeout passes.
pub async fn wait_exited(shim: &Shared, id: &str, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let notify = shim.borrow().exited.clone();
        let notified = notify.notified();
        match shim.borrow().containers.get(id) {
            None => return true,
            Some(c) if c.state.status == Status::Exited => return true,
            _ => {}
        }
        // Also poll: a process that vanished without a SIGCHLD to us (re-parented) still ends the wait.
        if tokio::time::timeout_at(
            deadline.min(tokio::time::Instant::now() + Duration::from_millis(200)),
            notified,
        )
        .await
        .is_err()
            && tokio::time::Instant::now() >= deadline
        {
            return false;
        }
    }
}

/// Did the kernel's OOM killer act in this cgroup? (v2 `memory.events`, v1 `memory.oom_control`.)
fn oom_killed(cgroup: &str) -> bool {
    let Some(dir) = cgroups_path::dir(cgroup) else {
        return false;
    };
    if dir.is_empty() || dir.contains("..") {
        return false;
    }
    let rel = dir.trim_start_matches('/');
    let candidates = [
        format!("/sys/fs/cgroup/{rel}/memory.events"),
        format!("/sys/fs/cgroup/memory/{rel}/memory.oom_control"),
    ];
    candidates.iter().any(|p| {
        std::fs::read_to_string(p).is_ok_and(|text| {
            text.lines().any(|l| {
                l.strip_prefix("oom_kill ")
                    .is_some_and(|n| n.trim().parse::<u64>().unwrap_or(0) > 0)
            })
        })
    })
}
