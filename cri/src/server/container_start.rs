//! `StartContainer`.

use super::errors::Error;
use crishim_proto::cri::{StartContainerRequest, StartContainerResponse};
use crishim_proto::shim::{Request, Response, START_ERROR};

use super::errors::unexpected;
use super::runtime_service::RuntimeService;

impl super::runtime_service::Inner {
    /// The pod's first container to start ends its start-up: observed once per pod.
    fn count_pod_start(&self, c: &crishim_state::records::ContainerRecord) {
        let first = self
            .store
            .pod_containers(&c.pod_id)
            .iter()
            .all(|o| o.id == c.id || o.last.as_ref().is_none_or(|s| s.started_at == 0));
        if let (true, Ok(pod)) = (first, self.store.pod(&c.pod_id)) {
            let took = crishim_state::records::now_nanos()
                .saturating_sub(pod.created_at)
                .max(0);
            crate::metrics::global().pod_started(std::time::Duration::from_nanos(took as u64));
        }
    }
}

impl RuntimeService {
    pub(super) async fn do_start_container(
        &self,
        req: StartContainerRequest,
    ) -> Result<StartContainerResponse, Error> {
        let inner = &self.inner;
        let c = inner.store.container(&req.container_id)?;
        let _guard = inner.store.lock(&c.id).await;
        inner.nri_start_container(&c).await?;
        match inner
            .shim_call(
                &c.pod_id,
                &Request::Start { id: c.id.clone() },
                self.inner.cgroup_request_timeout(),
            )
            .await?
        {
            // Its process could not start (the executable is missing): the shim recorded it
            // exited with `StartError`; announce that and fail the RPC, as containerd does.
            // (Recording the exit announces it.)
            Response::State(s) if s.reason == START_ERROR => {
                let message = format!("starting container {}: {}", c.id, s.message);
                inner.update_state(&c.id, s).await;
                Err(Error::failed_precondition(message))
            }
            Response::State(s) => {
                inner.count_pod_start(&c);
                // Announce the start with the state the shim answered, then record it through the
                // same merge as the exit watcher: an exit it already recorded is never undone,
                // and one seen first here is announced (once) after the start.
                let mut started = inner.store.container(&c.id)?;
                started.last = Some(s.clone());
                inner
                    .emit_container(
                        &started,
                        crishim_proto::cri::ContainerEventType::ContainerStartedEvent,
                    )
                    .await;
                inner.update_state(&c.id, s).await;
                if let Ok(c) = inner.store.container(&c.id) {
                    inner
                        .nri_container_event(&c, super::nri::ContainerEvent::PostStart)
                        .await;
                }
                Ok(StartContainerResponse {})
            }
            other => Err(unexpected(other)),
        }
    }
}
