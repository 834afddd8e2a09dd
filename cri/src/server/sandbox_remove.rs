//! `RemovePodSandbox`: stop the pod if needed, remove its containers, files and record. Removing a
//! pod that does not exist succeeds, as the CRI asks.

use super::errors::Error;
use crishim_proto::cri::{ContainerEventType, RemovePodSandboxRequest, RemovePodSandboxResponse};
use crishim_state::records::PodRecord;
use tracing::info;

use super::runtime_service::{Inner, RuntimeService};
use crishim_state::store::StoreError;

impl RuntimeService {
    pub(super) async fn do_remove_pod_sandbox(
        &self,
        req: RemovePodSandboxRequest,
    ) -> Result<RemovePodSandboxResponse, Error> {
        let inner = &self.inner;
        let pod = match inner.store.pod(&req.pod_sandbox_id) {
            Ok(p) => p,
            Err(StoreError::NotFound { .. }) => return Ok(RemovePodSandboxResponse {}),
            Err(e) => return Err(Error::from(e)),
        };
        let _guard = inner.store.lock(&pod.id).await;
        inner.remove_pod(&pod).await?;
        Ok(RemovePodSandboxResponse {})
    }
}

impl Inner {
    /// Stop the pod if needed, then remove its containers, files, record and name.
    pub(super) async fn remove_pod(&self, pod: &PodRecord) -> Result<(), Error> {
        self.stop_pod(&pod.id).await?;
        let mut phases = super::sandbox_stop::Phases::new("RemovePodSandbox", &pod.id);
        for c in self.store.pod_containers(&pod.id) {
            let _cguard = self.store.lock(&c.id).await;
            self.remove_container(&c).await?;
        }
        phases.done("containers");
        for dir in self.pod_dirs(&pod.id) {
            self.pod_files
                .remove_dir(&dir)
                .map_err(|e| Error::internal(format!("removing {}: {e}", dir.display())))?;
        }
        phases.done("directories");
        self.nri_remove_pod(pod).await;
        // Announced while the pod is still known: the event carries its status.
        self.emit_pod(&pod.id, ContainerEventType::ContainerDeletedEvent);
        self.store.delete_pod(pod)?;
        self.drop_spare_netns_if_idle();
        info!(pod = %pod.id, "pod sandbox removed");
        Ok(())
    }
}
