//! `RuntimeConfig`: crishim drives cgroups itself, through the cgroupfs driver.

use crishim_proto::cri::{
    CgroupDriver, LinuxRuntimeConfiguration, RuntimeConfigRequest, RuntimeConfigResponse,
};
use tonic::Status;

use super::runtime_service::RuntimeService;

impl RuntimeService {
    pub(super) async fn do_runtime_config(
        &self,
        _req: RuntimeConfigRequest,
    ) -> Result<RuntimeConfigResponse, Status> {
        Ok(RuntimeConfigResponse {
            linux: Some(LinuxRuntimeConfiguration {
                cgroup_driver: CgroupDriver::Cgroupfs as i32,
            }),
        })
    }
}
