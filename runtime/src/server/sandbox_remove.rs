//! `RemovePodSandbox`: stop the pod if needed, remove its containers, files and record. Removing a
//! pod that does not exist succeeds, as the CRI asks.

use crishim_proto::cri::{ContainerEventType, RemovePodSandboxRequest, RemovePodSandboxResponse};
use tonic::Status;
use tracing::info;

use super::runtime_service::{Inner, RuntimeService};
use crate::records::{pod_name, PodRecord};

impl RuntimeService {
    pub(super) async fn do_remove_pod_sandbox(
        &self,
        req: RemovePodSandboxRequest,
    ) -> Result<RemovePodSandboxResponse, Status> {
        let inner = &self.inner;
        let pod = match inner.pod(&req.pod_sandbox_id) {
            Ok(p) => p,
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(RemovePodSandboxResponse {}),
            Err(s) => return Err(s),
        };
        let _guard = inner.lock(&pod.id).await;
        inner.remove_pod(&pod).await?;
        Ok(RemovePodSandboxResponse {})
    }
}

impl Inner {
    /// Stop the pod if needed, then remove its containers, files, record and name.
    pub(super) async fn remove_pod(&self, pod: &PodRecord) -> Result<(), Status> {
        self.stop_pod(&pod.id).await?;
        for c in self.pod_containers(&pod.id) {
            let _cguard = self.lock(&c.id).await;
            self.remove_container(&c).await?;
        }
        for dir in [self.pod_state_dir(&pod.id), self.pod_files_dir(&pod.id)] {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    return Err(Status::internal(format!("removing {}: {e}", dir.display())));
                }
            }
        }
        self.pod_records
            .remove(&pod.id)
            .map_err(|e| Status::internal(format!("removing pod record: {e}")))?;
        self.emit_pod(&pod.id, ContainerEventType::ContainerDeletedEvent);
        {
            let mut index = self.index.lock().unwrap();
            index.pods.remove(&pod.id);
            if let Some(m) = &pod.config.metadata {
                index.release(&pod_name(m), &pod.id);
            }
        }
        self.forget_lock(&pod.id);
        info!(pod = %pod.id, "pod sandbox removed");
        Ok(())
    }
}
