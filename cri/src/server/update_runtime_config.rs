//! `UpdateRuntimeConfig`: the kubelet tells us the node's pod CIDR.

use super::errors::Error;
use crishim_proto::cri::{UpdateRuntimeConfigRequest, UpdateRuntimeConfigResponse};
use tracing::info;

use super::runtime_service::RuntimeService;

impl RuntimeService {
    pub(super) async fn do_update_runtime_config(
        &self,
        req: UpdateRuntimeConfigRequest,
    ) -> Result<UpdateRuntimeConfigResponse, Error> {
        let cidr = req
            .runtime_config
            .and_then(|c| c.network_config)
            .map(|n| n.pod_cidr)
            .unwrap_or_default();
        if !cidr.is_empty() {
            info!(pod_cidr = %cidr, "pod CIDR updated");
            *self.inner.pod_cidr.lock().unwrap() = cidr;
        }
        Ok(UpdateRuntimeConfigResponse {})
    }
}
