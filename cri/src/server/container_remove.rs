//! `RemoveContainer`: force-stop it if it runs, then delete it everywhere. Removing a container that
//! does not exist succeeds, as the CRI asks.

use std::time::Duration;

use super::errors::Error;
use crishim_proto::cri::{RemoveContainerRequest, RemoveContainerResponse};
use crishim_state::records::ContainerRecord;
use tracing::info;

use super::runtime_service::{Inner, RuntimeService};
use crishim_state::store::StoreError;

impl RuntimeService {
    pub(super) async fn do_remove_container(
        &self,
        req: RemoveContainerRequest,
    ) -> Result<RemoveContainerResponse, Error> {
        let inner = &self.inner;
        let c = match inner.store.container(&req.container_id) {
            Ok(c) => c,
            Err(StoreError::NotFound { .. }) => return Ok(RemoveContainerResponse {}),
            Err(e) => return Err(Error::from(e)),
        };
        let _guard = inner.store.lock(&c.id).await;
        inner.remove_container(&c).await?;
        Ok(RemoveContainerResponse {})
    }
}

impl Inner {
    pub(super) async fn remove_container(&self, c: &ContainerRecord) -> Result<(), Error> {
        // A dead shim cannot stop anything, and its container is already gone with it.
        if self.shim_alive(&c.pod_id).await {
            self.stop_container(c, Duration::ZERO).await?;
        }
        self.try_undo_create(&c.pod_id, &c.id).await?;
        self.nri_container_event(c, super::nri::ContainerEvent::Remove)
            .await;
        self.emit_container(
            c,
            crishim_proto::cri::ContainerEventType::ContainerDeletedEvent,
        )
        .await;
        info!(container = %c.id, "container removed");
        Ok(())
    }
}
