//! `RemoveContainer`: force-stop it if it runs, then delete it everywhere. Removing a container that
//! does not exist succeeds, as the CRI asks.

use std::time::Duration;

use crishim_proto::cri::{RemoveContainerRequest, RemoveContainerResponse};
use tonic::Status;
use tracing::info;

use super::runtime_service::{Inner, RuntimeService};
use crate::records::{container_name, ContainerRecord};

impl RuntimeService {
    pub(super) async fn do_remove_container(
        &self,
        req: RemoveContainerRequest,
    ) -> Result<RemoveContainerResponse, Status> {
        let inner = &self.inner;
        let c = match inner.container(&req.container_id) {
            Ok(c) => c,
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(RemoveContainerResponse {}),
            Err(s) => return Err(s),
        };
        let _guard = inner.lock(&c.id).await;
        inner.remove_container(&c).await?;
        Ok(RemoveContainerResponse {})
    }
}

impl Inner {
    pub(super) async fn remove_container(&self, c: &ContainerRecord) -> Result<(), Status> {
        // A dead shim cannot stop anything, and its container is already gone with it.
        if self.shim_alive(&c.pod_id).await {
            self.stop_container(c, Duration::ZERO).await?;
        }
        self.undo_create(&c.pod_id, &c.id).await;
        self.emit_container(
            c,
            crishim_proto::cri::ContainerEventType::ContainerDeletedEvent,
        )
        .await;
        let pod_meta = self
            .index
            .lock()
            .unwrap()
            .pods
            .get(&c.pod_id)
            .and_then(|p| p.config.metadata.clone());
        if let (Some(m), Some(pm)) = (&c.config.metadata, pod_meta) {
            self.index
                .lock()
                .unwrap()
                .release(&container_name(m, &pm), &c.id);
        }
        self.forget_lock(&c.id);
        info!(container = %c.id, "container removed");
        Ok(())
    }
}
