//! `PortForward`: a one-time URL where the client's connections are forwarded to ports on the
//! pod's localhost, from inside its network namespace.

use super::errors::Error;
use crishim_proto::cri::{PortForwardRequest, PortForwardResponse};
use crishim_state::records::PodState;

use super::runtime_service::RuntimeService;

impl RuntimeService {
    pub(super) async fn do_port_forward(
        &self,
        req: PortForwardRequest,
    ) -> Result<PortForwardResponse, Error> {
        let inner = &self.inner;
        let pod = inner.store.pod(&req.pod_sandbox_id)?;
        if pod.state != PodState::Ready {
            return Err(Error::failed_precondition(format!(
                "PortForward: pod sandbox {} is not ready",
                pod.id
            )));
        }
        if let Some(p) = req.port.iter().find(|p| !(1..=65535).contains(*p)) {
            return Err(Error::invalid_argument(format!(
                "PortForward: {p} is not a port number"
            )));
        }
        let url = inner
            .streaming()?
            .port_forward_url(req)
            .map_err(super::streaming::url_status)?;
        Ok(PortForwardResponse { url })
    }
}
