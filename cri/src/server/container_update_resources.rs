//! `UpdateContainerResources`: new cgroup limits for a running container, applied by its shim and
//! kept in the container's record.

use super::errors::Error;
use crishim_proto::cri::{UpdateContainerResourcesRequest, UpdateContainerResourcesResponse};
use crishim_proto::shim::Request;

use super::errors::from_spec_error;
use super::runtime_service::RuntimeService;
use crishim_spec as spec;

impl RuntimeService {
    pub(super) async fn do_update_container_resources(
        &self,
        req: UpdateContainerResourcesRequest,
    ) -> Result<UpdateContainerResourcesResponse, Error> {
        let inner = &self.inner;
        let c = inner.store.container(&req.container_id)?;
        let linux = req.linux.ok_or_else(|| {
            Error::invalid_argument("UpdateContainerResources: linux resources are required")
        })?;
        let resources =
            spec::resources(&linux).map_err(|e| from_spec_error("UpdateContainerResources", e))?;
        // A stopped pod's shim is gone: say so, rather than an Unavailable the kubelet retries.
        inner.pod_ready(&c.pod_id, "UpdateContainerResources")?;
        let _guard = inner.store.lock(&c.id).await;
        inner
            .shim_ok(
                &c.pod_id,
                Request::Update {
                    id: c.id.clone(),
                    resources: Box::new(resources),
                },
            )
            .await?;
        let mut c = inner.store.container(&c.id)?;
        c.config
            .linux
            .get_or_insert_with(Default::default)
            .resources = Some(linux);
        inner.store.save_container(&c)?;
        Ok(UpdateContainerResourcesResponse {})
    }
}
