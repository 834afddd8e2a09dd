//! `ReopenContainerLog`: after the kubelet rotated the log file, the shim starts a new one.

use super::errors::Error;
use crishim_proto::cri::{ReopenContainerLogRequest, ReopenContainerLogResponse};
use crishim_proto::shim::{Request, Status as ShimStatus};

use super::runtime_service::RuntimeService;

impl RuntimeService {
    pub(super) async fn do_reopen_container_log(
        &self,
        req: ReopenContainerLogRequest,
    ) -> Result<ReopenContainerLogResponse, Error> {
        let inner = &self.inner;
        let c = inner.store.container(&req.container_id)?;
        if inner.refresh(&c).await.status != ShimStatus::Running {
            return Err(Error::failed_precondition(format!(
                "container {} is not running",
                c.id
            )));
        }
        inner
            .shim_ok(&c.pod_id, Request::ReopenLog { id: c.id.clone() })
            .await?;
        Ok(ReopenContainerLogResponse {})
    }
}
