//! `ListContainers`, with its id, pod, state and label filters.

use super::errors::Error;
use crishim_proto::cri::{self, ListContainersRequest, ListContainersResponse};
use crishim_state::records::ContainerRecord;

use super::container_status::cri_state;
use super::runtime_service::RuntimeService;

impl RuntimeService {
    pub(super) async fn do_list_containers(
        &self,
        req: ListContainersRequest,
    ) -> Result<ListContainersResponse, Error> {
        let inner = &self.inner;
        let f = req.filter.unwrap_or_default();
        let keep = |c: &ContainerRecord| {
            (f.id.is_empty() || c.id.starts_with(&f.id))
                && (f.pod_sandbox_id.is_empty() || c.pod_id.starts_with(&f.pod_sandbox_id))
                && super::labels_match(&f.label_selector, &c.config.labels)
        };
        let wanted = |state: i32| f.state.as_ref().is_none_or(|s| s.state == state);
        // The relist path: states the watch streams keep current cost no shim round trip.
        let (known, ask) = inner.store.containers_by_state(keep, |c, s| {
            let state = cri_state(s);
            wanted(state).then(|| container(c, state))
        });
        let mut containers: Vec<cri::Container> = known.into_iter().flatten().collect();
        for c in ask {
            let state = cri_state(&inner.refresh(&c).await);
            if wanted(state) {
                containers.push(container(&c, state));
            }
        }
        Ok(ListContainersResponse { containers })
    }
}

fn container(c: &ContainerRecord, state: i32) -> cri::Container {
    cri::Container {
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
    }
}
