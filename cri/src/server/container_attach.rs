//! `Attach`: a one-time URL where the client connects to a running container's stdio, which its
//! shim owns (the output still goes to the log file too).

use super::errors::Error;
use crishim_proto::cri::{AttachRequest, AttachResponse};

use super::container_exec::check_stdio;
use super::runtime_service::RuntimeService;

impl RuntimeService {
    pub(super) async fn do_attach(&self, req: AttachRequest) -> Result<AttachResponse, Error> {
        let inner = &self.inner;
        check_stdio("Attach", req.stdin, req.stdout, req.stderr, req.tty)?;
        let c = inner.running_container(&req.container_id).await?;
        if req.stdin && !(c.config.stdin || c.config.tty) {
            return Err(Error::failed_precondition(format!(
                "Attach: container {} was not created with stdin, so there is none to attach to",
                c.id
            )));
        }
        let url = inner
            .streaming()?
            .attach_url(req)
            .map_err(super::streaming::url_status)?;
        Ok(AttachResponse { url })
    }
}
