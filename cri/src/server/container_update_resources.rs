//! `UpdateContainerResources`: new cgroup limits for a running container, applied by its shim and
//! kept in the container's record. NRI plugins may amend them first.

use super::errors::Error;
use crishim_proto::cri::{
    LinuxContainerResources, UpdateContainerResourcesRequest, UpdateContainerResourcesResponse,
};
use crishim_proto::shim::Request;

use super::errors::from_spec_error;
use super::nri::ContainerEvent;
use super::runtime_service::{Inner, RuntimeService};
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
        // Checked before plugins hear of it.
        spec::resources(&linux).map_err(|e| from_spec_error("UpdateContainerResources", e))?;
        let linux = inner.nri_update_container(&c, linux).await?;
        inner.apply_resources(&c.id, linux).await?;
        if let Ok(c) = inner.store.container(&c.id) {
            inner
                .nri_container_event(&c, ContainerEvent::PostUpdate)
                .await;
        }
        Ok(UpdateContainerResourcesResponse {})
    }
}

impl Inner {
    /// Has the container's shim apply `linux` to its cgroup, and records it.
    pub(super) async fn apply_resources(
        &self,
        id: &str,
        linux: LinuxContainerResources,
    ) -> Result<(), Error> {
        let c = self.store.container(id)?;
        let resources =
            spec::resources(&linux).map_err(|e| from_spec_error("UpdateContainerResources", e))?;
        // A stopped pod's shim is gone: say so, rather than an Unavailable the kubelet retries.
        self.pod_ready(&c.pod_id, "UpdateContainerResources")?;
        let _guard = self.store.lock(&c.id).await;
        self.shim_ok(
            &c.pod_id,
            Request::Update {
                id: c.id.clone(),
                resources: Box::new(resources),
            },
        )
        .await?;
        let mut c = self.store.container(&c.id)?;
        c.config
            .linux
            .get_or_insert_with(Default::default)
            .resources = Some(linux);
        self.store.save_container(&c)?;
        Ok(())
    }
}
