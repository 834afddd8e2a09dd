//! `ExecSync`: run a command in a running container through its shim; a timeout kills it and is
//! reported as `DeadlineExceeded`.

use std::time::Duration;

use super::errors::Error;
use crishim_proto::cri::{ExecSyncRequest, ExecSyncResponse};
use crishim_proto::shim::{truncate_exec_output, Request, Response};

use super::errors::unexpected;
use super::runtime_service::RuntimeService;
use crate::bounds::request_secs;
use crate::shim_client::SHIM_TIMEOUT;

impl RuntimeService {
    pub(super) async fn do_exec_sync(
        &self,
        req: ExecSyncRequest,
    ) -> Result<ExecSyncResponse, Error> {
        let inner = &self.inner;
        let c = inner.store.container(&req.container_id)?;
        if req.cmd.is_empty() {
            return Err(Error::invalid_argument("ExecSync: cmd is empty"));
        }
        inner.pod_ready(&c.pod_id, "ExecSync")?;
        // The exec'd process joins the container's cgroup in a few ms: keep that lock fast until then.
        crishim_spec::cgroups::warm_migration(std::time::Duration::from_millis(100));
        let timeout = request_secs(req.timeout).as_secs();
        // The shim enforces the command's timeout; ours only guards against a stuck shim.
        let guard = if timeout == 0 {
            Duration::from_secs(24 * 3600)
        } else {
            Duration::from_secs(timeout) + SHIM_TIMEOUT
        };
        let exec = Request::Exec {
            id: c.id.clone(),
            args: req.cmd.clone(),
            timeout,
        };
        match inner.shim_call(&c.pod_id, &exec, guard).await? {
            Response::Exec {
                timed_out: true, ..
            } => Err(Error::deadline_exceeded(format!(
                "ExecSync {:?} in container {} timed out after {timeout}s; the process was killed",
                req.cmd, c.id
            ))),
            Response::Exec {
                exit_code,
                mut stdout,
                mut stderr,
                ..
            } => {
                // The shim cuts them already; the reply must fit one gRPC message whatever it sent.
                truncate_exec_output(&mut stdout, &mut stderr);
                Ok(ExecSyncResponse {
                    stdout,
                    stderr,
                    exit_code,
                })
            }
            other => Err(unexpected(other)),
        }
    }
}
