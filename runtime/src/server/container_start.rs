//! `StartContainer`.

use crishim_proto::cri::{StartContainerRequest, StartContainerResponse};
use crishim_proto::shim::{Request, Response};
use tonic::Status;

use super::runtime_service::{RuntimeService, SHIM_TIMEOUT};
use crate::shim_client::unexpected;

impl RuntimeService {
    pub(super) async fn do_start_container(
        &self,
        req: StartContainerRequest,
    ) -> Result<StartContainerResponse, Status> {
        let inner = &self.inner;
        let c = inner.container(&req.container_id)?;
        let _guard = inner.lock(&c.id).await;
        match inner
            .shim(&c.pod_id)
            .call(&Request::Start { id: c.id.clone() }, SHIM_TIMEOUT)
            .await?
        {
            Response::State(s) => {
                let mut c = inner.container(&c.id)?;
                let exited = s.status == crishim_proto::shim::Status::Exited;
                c.last = Some(s.clone());
                inner.save_container(&c)?;
                inner
                    .emit_container(
                        &c,
                        crishim_proto::cri::ContainerEventType::ContainerStartedEvent,
                    )
                    .await;
                if exited {
                    // It ran and ended already: the watcher may have been too early to see it.
                    inner
                        .emit_container(
                            &c,
                            crishim_proto::cri::ContainerEventType::ContainerStoppedEvent,
                        )
                        .await;
                }
                Ok(StartContainerResponse {})
            }
            other => Err(unexpected(other)),
        }
    }
}
