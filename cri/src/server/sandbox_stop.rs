//! `StopPodSandbox`: force-stop every container, then shut the shim and infra process down and
//! unmount the pod's /dev/shm. Idempotent; container records stay until the pod is removed.

use super::errors::Error;
use crishim_proto::cri::{ContainerEventType, StopPodSandboxRequest, StopPodSandboxResponse};
use crishim_proto::shim::{paths, Request};
use crishim_state::records::PodState;
use tracing::{info, warn};

use super::runtime_service::{Inner, RuntimeService};
use crate::shim_client::ShimError;

impl RuntimeService {
    pub(super) async fn do_stop_pod_sandbox(
        &self,
        req: StopPodSandboxRequest,
    ) -> Result<StopPodSandboxResponse, Error> {
        let inner = &self.inner;
        let pod = inner.store.pod(&req.pod_sandbox_id)?;
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
        let pod = self.store.pod(pod_id)?;
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
        let mut pod = self.store.pod(pod_id)?;
        if pod.state != PodState::NotReady {
            pod.state = PodState::NotReady;
            self.store.save_pod(&pod)?;
            self.emit_pod(pod_id, ContainerEventType::ContainerStoppedEvent);
            info!(pod = %pod_id, "pod sandbox stopped");
            self.nri_stop_pod(&pod).await;
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
