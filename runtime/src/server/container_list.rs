//! `ListContainers`, with its id, pod, state and label filters.

use crishim_proto::cri::{self, ListContainersRequest, ListContainersResponse};
use tonic::Status;

use super::container_status::cri_state;
use super::runtime_service::RuntimeService;
use crate::records::ContainerRecord;

impl RuntimeService {
    pub(super) async fn do_list_containers(
        &self,
        req: ListContainersRequest,
    ) -> Result<ListContainersResponse, Status> {
        let inner = &self.inner;
        let f = req.filter.unwrap_or_default();
        let candidates: Vec<ContainerRecord> = inner
            .index
            .lock()
            .unwrap()
            .containers
            .values()
            .filter(|c| f.id.is_empty() || c.id == f.id || c.id.starts_with(&f.id))
            .filter(|c| {
                f.pod_sandbox_id.is_empty()
                    || c.pod_id == f.pod_sandbox_id
                    || c.pod_id.starts_with(&f.pod_sandbox_id)
            })
            .filter(|c| super::labels_match(&f.label_selector, &c.config.labels))
            .cloned()
            .collect();
        let mut containers = Vec::with_capacity(candidates.len());
        for c in candidates {
            let state = cri_state(&inner.refresh(&c).await);
            if f.state.as_ref().is_some_and(|s| s.state != state) {
                continue;
            }
            containers.push(cri::Container {
                id: c.id.clone(),
                pod_sandbox_id: c.pod_id.clone(),
                metadata: c.config.metadata.clone(),
                image: Some(cri::ImageSpec {
                    image: c.image.clone(),
                    ..Default::default()
                }),
                image_ref: c.image_ref.clone(),
                image_id: c.image_id.clone(),
                state,
                created_at: c.created_at,
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
            });
        }
        Ok(ListContainersResponse { containers })
    }
}
