//! `StopPodSandbox`: force-stop every container, then shut the shim and infra process down and
//! unmount the pod's /dev/shm. Idempotent; container records stay until the pod is removed.

use super::errors::Error;
use crishim_proto::cri::{ContainerEventType, StopPodSandboxRequest, StopPodSandboxResponse};
use crishim_proto::shim::{paths, Request};
use crishim_state::records::PodState;
use tracing::{info, warn};

use super::errors::from_store_error;
use super::runtime_service::{Inner, RuntimeService};
use crate::shim_client::ShimError;

impl RuntimeService {
    pub(super) async fn do_stop_pod_sandbox(
        &self,
        req: StopPodSandboxRequest,
    ) -> Result<StopPodSandboxResponse, Error> {
        let inner = &self.inner;
        let pod = inner
            .store
            .pod(&req.pod_sandbox_id)
            .map_err(from_store_error)?;
        let _guard = inner.store.lock(&pod.id).await;
        inner.stop_pod(&pod.id).await?;
        Ok(StopPodSandboxResponse {})
    }
}

impl Inner {
    pub(super) async fn stop_pod(&self, pod_id: &str) -> Result<(), Error> {
        let mut phases = Phases::new("StopPodSandbox", pod_id);
        // Refresh first so each container's final state is recorded before the shim goes.
        for c in self.store.pod_containers(pod_id) {
            self.refresh(&c).await;
        }
        phases.done("refresh");
        let pod = self.store.pod(pod_id).map_err(from_store_error)?;
        // The shim's shutdown and the CNI DEL overlap: the network namespace is pinned by a bind
        // mount, not by the infra process, so the plugins find it whatever the shim is doing.
        // The DEL is the longer: the final states are recorded while it runs.
        let (stopped, network) =
            tokio::join!(self.stop_processes(pod_id), self.teardown_network(&pod));
        phases.done("shim, infra and network");
        stopped?;
        network
    }

    /// Stop the pod's processes ([`teardown_pod`](Self::teardown_pod)), then record its
    /// containers' final states and the pod as not ready: it is, whatever becomes of its
    /// network (a failed DEL is retried by the next stop or the remove).
    async fn stop_processes(&self, pod_id: &str) -> Result<(), Error> {
        self.teardown_pod(pod_id).await;
        // The shim is gone, and so is what its Watch stream told: the final states are read
        // from the exit records it left (the stream's task may not have seen its end yet).
        self.store.set_watched(pod_id, false);
        for c in self.store.pod_containers(pod_id) {
            let _ = self.refresh(&c).await;
            // No process uses the rootfs now: it is unmounted here, while the CNI DEL runs (as
            // containerd's shim unmounts at a task's exit), not on RemoveContainer's path.
            crate::container_images::unmount_rootfs(&c.id, &self.bundle_dir(&c.id).join("rootfs"));
        }
        let mut pod = self.store.pod(pod_id).map_err(from_store_error)?;
        if pod.state != PodState::NotReady {
            pod.state = PodState::NotReady;
            self.store.save_pod(&pod).map_err(from_store_error)?;
            self.emit_pod(pod_id, ContainerEventType::ContainerStoppedEvent);
            info!(pod = %pod_id, "pod sandbox stopped");
        }
        Ok(())
    }

    /// Stop everything of the pod that runs or is mounted: the shim kills its containers and the
    /// infra process; then any survivor is killed by pid and /dev/shm is unmounted. Idempotent.
    pub(super) async fn teardown_pod(&self, pod_id: &str) {
        let dir = self.pod_state_dir(pod_id);
        let mut phases = Phases::new("teardown", pod_id);
        let timeout = std::time::Duration::from_secs(60);
        let shut_down = match self.shim_call(pod_id, &Request::Shutdown, timeout).await {
            Ok(_) => true,
            // Already stopped (or never started): nothing answers, nothing to say.
            Err(ShimError::Unreachable(..)) => false,
            Err(e) => {
                warn!(pod = %pod_id, error = %e, "shim shutdown failed; killing what is left");
                false
            }
        };
        // libcontainer's state, or an external runtime's (held elsewhere, so assumed).
        let has_containers = std::fs::read_dir(dir.join("runc"))
            .is_ok_and(|mut d| d.next().is_some())
            || dir.join(paths::OCI_RUNTIME).exists();
        if !shut_down && has_containers {
            self.pod_shims.cleanup_dead(&dir).await;
            // A dead shim's containers were re-parented to us, their subreaper: collect them.
            for c in self.store.pod_containers(pod_id) {
                if let Some(pid) = c.last.as_ref().map(|s| s.pid).filter(|p| *p > 0) {
                    self.pod_shims.kill_orphan(pid).await;
                }
            }
        }
        phases.done("shim shutdown");
        self.pod_shims.kill_shim_then_infra(pod_id, &dir).await;
        phases.done("reap shim and infra");
        if let Err(e) = self.pod_files.unmount_shm(&dir.join("shm")) {
            warn!(pod = %pod_id, error = %e, "unmounting /dev/shm");
        }
        let _ = std::fs::remove_file(dir.join(paths::SOCKET));
        // The shim deleted the containers' cgroups; now the parent directories we made, if empty.
        if let Ok(pod) = self.store.pod(pod_id) {
            self.pod_shims.remove_cgroups(&pod.owned_cgroups);
        }
        phases.done("shm and cgroups");
    }
}

/// Debug-level timings of an operation's phases (`RUST_LOG=crishim_cri=debug`), for finding
/// where a stop or remove spends its time.
pub(super) struct Phases<'a> {
    op: &'static str,
    id: &'a str,
    last: std::time::Instant,
}

impl<'a> Phases<'a> {
    pub(super) fn new(op: &'static str, id: &'a str) -> Self {
        Phases {
            op,
            id,
            last: std::time::Instant::now(),
        }
    }

    /// The phase that just ended.
    pub(super) fn done(&mut self, phase: &'static str) {
        let now = std::time::Instant::now();
        let us = now.duration_since(self.last).as_micros() as u64;
        tracing::debug!(op = self.op, id = %self.id, phase, us, "phase");
        self.last = now;
    }
}

/// Kill and delete the containers a dead shim left, through `crishim-shim cleanup` (run from
/// `shim_binary`), which runs libcontainer in its own process.
pub(super) async fn cleanup_dead_shim(shim_binary: &std::path::Path, dir: &std::path::Path) {
    let out = tokio::process::Command::new(shim_binary)
        .arg("cleanup")
        .arg("--dir")
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            warn!(dir = %dir.display(), status = %o.status, stderr = %String::from_utf8_lossy(&o.stderr).trim(), "shim cleanup")
        }
        Err(e) => warn!(dir = %dir.display(), error = %e, "running shim cleanup"),
    }
}

/// Kill what is left of the pod's shim, then of its infra process, and reap both. The shim
/// first: the infra is its child, and a shim that hangs would never reap an infra killed before
/// it; once the shim is gone the infra is the daemon's (the subreaper's) to reap.
pub(super) async fn kill_shim_then_infra(dir: &std::path::Path) {
    for file in [paths::SHIM_PID, paths::INFRA_PID] {
        // Only a process's own pid: `waitpid` takes 0 and -1 for "any child", which would reap
        // one of the daemon's that another task waits for.
        if let Some(recorded) = crishim_proto::shim::pid_file::read(&dir.join(file)) {
            crishim_proto::shim::kill_if_ours(&recorded);
            reap(recorded.pid).await;
        }
    }
}

/// The daemon is the shims' subreaper: collect an exited shim so it leaves no zombie. A pid that is
/// not our child (the daemon restarted since) is someone else's to reap.
pub(super) async fn reap(pid: i32) {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let pid = nix::unistd::Pid::from_raw(pid);
    // Polled from 1 ms up to every 10 ms, for at most about 2 s: a shim that was told to shut
    // down is usually gone within a few milliseconds.
    let mut delay = std::time::Duration::from_millis(1);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    while tokio::time::Instant::now() < deadline {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_millis(10));
            }
            _ => return,
        }
    }
}

/// SIGKILL `pid` only if it is our own unreaped child: such a pid cannot have been reused.
pub(super) fn kill_child(pid: i32) {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let p = nix::unistd::Pid::from_raw(pid);
    if let Ok(WaitStatus::StillAlive) = waitpid(p, Some(WaitPidFlag::WNOHANG)) {
        let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` in a forked child that is a subreaper, as the daemon is, so the test process
    /// keeps its own children and parentage.
    fn in_subreaper(f: impl FnOnce() -> Option<Vec<bool>>) -> Option<Vec<bool>> {
        crishim_sys::testing::in_child_mount_ns(|| {
            // SAFETY: prctl with integer arguments.
            if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
                return None;
            }
            f()
        })
    }

    fn run(dir: &std::path::Path) -> Option<()> {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .ok()?
            .block_on(kill_shim_then_infra(dir));
        Some(())
    }

    /// A shim that hangs (here: one that never waits for its children) and its infra, left for
    /// the teardown to kill: both are gone after it, not left as zombies.
    #[test]
    fn a_hung_shim_and_its_infra_are_killed_and_both_reaped() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let gone = |pid: i32| !std::path::Path::new(&format!("/proc/{pid}")).exists();
        let seen = in_subreaper(|| {
            // The infra runs under the name the teardown checks for; the shim then becomes a
            // process that never reaps it.
            let script = format!(
                "bash -c 'exec -a crishim-pause sleep 60' & echo $! > {}; \
                 exec -a crishim-shim sleep 60",
                dir.path().join(paths::INFRA_PID).display()
            );
            let shim = std::process::Command::new("bash")
                .args(["-c", &script])
                .spawn()
                .ok()?;
            let shim_pid = shim.id() as i32;
            std::fs::write(dir.path().join(paths::SHIM_PID), shim_pid.to_string()).ok()?;
            let infra_pid = (0..500).find_map(|_| {
                let named = |pid: i32, name: &str| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| c.starts_with(name.as_bytes()))
                };
                let infra = std::fs::read_to_string(dir.path().join(paths::INFRA_PID))
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok())
                    .filter(|&p| named(p, "crishim-pause") && named(shim_pid, "crishim-shim"));
                if infra.is_none() {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                infra
            })?;
            run(dir.path())?;
            Some(vec![gone(shim_pid), gone(infra_pid)])
        });
        assert_eq!(
            seen,
            Some(vec![true, true]),
            "[shim gone, infra gone] (None: the setup failed)"
        );
    }

    /// Pid files that say 0 or -1 (damaged after a crash) reap nothing: `waitpid` would take
    /// them for any child, here one of the daemon's own that has exited and is still its to wait
    /// for.
    #[test]
    fn pid_files_of_zero_or_minus_one_reap_no_other_child() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let seen = in_subreaper(|| {
            std::fs::write(dir.path().join(paths::SHIM_PID), "0").ok()?;
            std::fs::write(dir.path().join(paths::INFRA_PID), "-1").ok()?;
            let mut other = std::process::Command::new("true").spawn().ok()?;
            let other_pid = other.id();
            // Exited, not yet waited for.
            let zombie = (0..500).any(|_| {
                let state =
                    std::fs::read_to_string(format!("/proc/{other_pid}/stat")).unwrap_or_default();
                let z = state
                    .rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z'));
                if !z {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                z
            });
            run(dir.path())?;
            Some(vec![zombie, other.wait().is_ok_and(|s| s.success())])
        });
        assert_eq!(
            seen,
            Some(vec![true, true]),
            "[the other child exited, its status was still ours to read]"
        );
    }
}
