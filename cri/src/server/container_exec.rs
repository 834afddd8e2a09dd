//! `Exec`: a one-time URL where the client runs a command in a running container with its stdio
//! streamed (SPDY or WebSocket; see the streaming crate).

use super::errors::Error;
use crishim_proto::cri::{ExecRequest, ExecResponse};
use crishim_proto::shim::Status as ShimStatus;
use crishim_state::records::ContainerRecord;

use super::runtime_service::{Inner, RuntimeService};

impl RuntimeService {
    pub(super) async fn do_exec(&self, req: ExecRequest) -> Result<ExecResponse, Error> {
        let inner = &self.inner;
        if req.cmd.is_empty() {
            return Err(Error::invalid_argument("Exec: cmd is empty"));
        }
        check_stdio("Exec", req.stdin, req.stdout, req.stderr, req.tty)?;
        inner.running_container(&req.container_id).await?;
        let url = inner
            .streaming()?
            .exec_url(req)
            .map_err(super::streaming::url_status)?;
        Ok(ExecResponse { url })
    }
}

/// The stdio a streaming request may ask for, as the kubelet checks it.
pub(super) fn check_stdio(
    rpc: &str,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
) -> Result<(), Error> {
    if !(stdin || stdout || stderr) {
        return Err(Error::invalid_argument(format!(
            "{rpc}: one of stdin, stdout and stderr must be requested"
        )));
    }
    if tty && stderr {
        return Err(Error::invalid_argument(format!(
            "{rpc}: tty and stderr cannot both be requested (a tty merges stderr into stdout)"
        )));
    }
    Ok(())
}

impl Inner {
    /// The record of `id`, which must be running.
    pub(super) async fn running_container(&self, id: &str) -> Result<ContainerRecord, Error> {
        let c = self.store.container(id)?;
        self.pod_ready(&c.pod_id, &format!("container {id}"))?;
        let state = self.refresh(&c).await;
        if state.status != ShimStatus::Running {
            return Err(Error::failed_precondition(format!(
                "container {id} is not running ({:?})",
                state.status
            )));
        }
        Ok(c)
    }
}
