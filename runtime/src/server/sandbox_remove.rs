//! `RemovePodSandbox`: stop the pod if needed, remove its containers, files and record. Removing a
//! pod that does not exist succeeds, as the CRI asks.

use crishim_proto::cri::{RemovePodSandboxRequest, RemovePodSandboxResponse};
use tonic::Status;
use tracing::info;

use super::runtime_service::RuntimeService;
use crate::records::pod_name;

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
        inner.stop_pod(&pod.id).await?;
        for c in inner.pod_containers(&pod.id) {
            let _cguard = inner.lock(&c.id).await;
            inner.remove_container(&c).await?;
        }
        for dir in [inner.pod_state_dir(&pod.id), inner.pod_files_dir(&pod.id)] {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    return Err(Status::internal(format!("removing {}: {e}", dir.display())));
                }
            }
        }
        inner
            .pod_records
            .remove(&pod.id)
            .map_err(|e| Status::internal(format!("removing pod record: {e}")))?;
        {
            let mut index = inner.index.lock().unwrap();
            index.pods.remove(&pod.id);
            if let Some(m) = &pod.config.metadata {
                index.release(&pod_name(m), &pod.id);
            }
        }
        inner.forget_lock(&pod.id);
        info!(pod = %pod.id, "pod sandbox removed");
        Ok(RemovePodSandboxResponse {})
    }
}
