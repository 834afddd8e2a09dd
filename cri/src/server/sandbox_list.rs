//! `ListPodSandbox`, with its id, state and label filters.

use super::errors::Error;
use crishim_proto::cri::{self, ListPodSandboxRequest, ListPodSandboxResponse};

use super::runtime_service::RuntimeService;
use super::sandbox_status::cri_state;

impl RuntimeService {
    pub(super) async fn do_list_pod_sandbox(
        &self,
        req: ListPodSandboxRequest,
    ) -> Result<ListPodSandboxResponse, Error> {
        let f = req.filter.unwrap_or_default();
        let items = self.inner.pods_viewed(&f.id, &f.label_selector, |p| {
            let state = cri_state(p.state);
            f.state
                .as_ref()
                .is_none_or(|s| s.state == state)
                .then(|| cri::PodSandbox {
                    id: p.id.clone(),
                    metadata: p.config.metadata.clone(),
                    state,
                    created_at: p.created_at,
                    labels: p.config.labels.clone(),
                    annotations: p.config.annotations.clone(),
                    runtime_handler: p.runtime_handler.clone(),
                })
        });
        Ok(ListPodSandboxResponse { items })
    }
}
