//! `RuntimeConfig`: the cgroup driver in use (`cgroup_driver` in the config), which the kubelet
//! (1.28 and later) adopts.

use super::errors::Error;
use crishim_proto::cri::{
    CgroupDriver, LinuxRuntimeConfiguration, RuntimeConfigRequest, RuntimeConfigResponse,
};

use super::runtime_service::RuntimeService;

impl RuntimeService {
    pub(super) async fn do_runtime_config(
        &self,
        _req: RuntimeConfigRequest,
    ) -> Result<RuntimeConfigResponse, Error> {
        Ok(RuntimeConfigResponse {
            linux: Some(LinuxRuntimeConfiguration {
                cgroup_driver: match self.inner.config.cgroup_driver {
                    crishim_spec::cgroups::CgroupDriver::Cgroupfs => CgroupDriver::Cgroupfs,
                    crishim_spec::cgroups::CgroupDriver::Systemd => CgroupDriver::Systemd,
                } as i32,
            }),
        })
    }
}
