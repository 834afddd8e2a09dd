//! A pod's processes are reached by pidfd, never by a bare pid: once the infra process is gone
//! its pid may name any process on the node, and `/proc/<pid>/ns/*` that process's namespaces
//! (the host's, or another pod's).
//!
//! - The network namespace is always the pinned one (`<state_dir>/netns/<pod>`, an nsfs bind
//!   that names the namespace itself, whatever happens to the process). A pod without one (it
//!   was stopped) has none to enter.
//! - Anything else (`ns/user` for idmapped mounts, `net/dev` for stats) is read through a
//!   [`ProcessFd`] of the infra process, proven to be the pod's: its network namespace is the
//!   pinned one, and each file is kept only while the process still holds its pid.
//! - The namespace paths a create hands the shim (`/proc/<infra pid>/ns/*`) are checked again
//!   by the shim, whose child the infra process is, against the pid it has not reaped.

use std::os::unix::fs::MetadataExt as _;

use super::errors::Error;

use crishim_proto::shim::{Request, Response};
use crishim_state::records::{PodRecord, PodState};

use super::runtime_service::Inner;
use crate::shim_client::SHIM_TIMEOUT;
use crishim_cni::pidfd::ProcessFd;

impl Inner {
    /// `pod`'s infra process, held by pidfd: the pod is ready, the process holds the recorded
    /// pid, and (unless the pod is on the host's network) its network namespace is the pod's
    /// pinned one. `FailedPrecondition` otherwise, naming what is missing.
    pub(super) fn infra_process(&self, pod: &PodRecord, rpc: &str) -> Result<ProcessFd, Error> {
        ready(pod, rpc)?;
        let exited = || {
            Error::failed_precondition(format!(
                "{rpc}: the infra process of pod sandbox {} has exited",
                pod.id
            ))
        };
        let p = ProcessFd::open(pod.infra_pid).map_err(|_| exited())?;
        if pod.host_network {
            return Ok(p);
        }
        // No CNI network: the infra made its own namespace, pinned nowhere. The shim checks
        // the create's namespace paths against its unreaped child.
        let Ok(pinned) = std::fs::metadata(self.netns_path(&pod.id)) else {
            return Ok(p);
        };
        let live = p
            .open_proc("ns/net")
            .and_then(|f| f.metadata())
            .map_err(|_| exited())?;
        if (pinned.dev(), pinned.ino()) != (live.dev(), live.ino()) {
            return Err(Error::failed_precondition(format!(
                "{rpc}: pid {} is no longer the infra process of pod sandbox {}",
                pod.infra_pid, pod.id
            )));
        }
        Ok(p)
    }

    /// The network namespace a port-forward to `pod` enters, open: `None` for the host's (a
    /// host-network pod), else the pinned one; a pod with none pinned (no CNI network: its infra
    /// made its own) gets its infra's, opened through a pidfd taken before its shim confirmed
    /// the pid as its unreaped infra process. Never a bare `/proc/<infra pid>/ns/net`.
    pub(super) async fn forward_netns(
        &self,
        pod: &PodRecord,
    ) -> std::io::Result<Option<std::fs::File>> {
        use std::io::{Error, ErrorKind};
        ready(pod, "PortForward").map_err(|s| Error::other(s.message().to_string()))?;
        if pod.host_network {
            return Ok(None);
        }
        let gone = || {
            Error::new(
                ErrorKind::NotFound,
                format!("pod sandbox {} has no network namespace", pod.id),
            )
        };
        match std::fs::File::open(self.netns_path(&pod.id)) {
            Ok(f) => return Ok(Some(f)),
            Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
            Err(_) => {}
        }
        let p = ProcessFd::open(pod.infra_pid).map_err(|_| gone())?;
        let ping = self
            .shim_call(&pod.id, &Request::Ping, SHIM_TIMEOUT)
            .await
            .map_err(|_| gone())?;
        match ping {
            Response::Pong { infra_pid, .. } if infra_pid == pod.infra_pid => {}
            _ => return Err(gone()),
        }
        p.open_proc("ns/net").map(Some).map_err(|_| gone())
    }

    /// `FailedPrecondition` unless the pod of container `pod_id` is ready: a stopped pod's
    /// containers take no exec or attach.
    pub(super) fn pod_ready(&self, pod_id: &str, rpc: &str) -> Result<(), Error> {
        ready(&self.store.pod(pod_id)?, rpc)
    }
}

fn ready(pod: &PodRecord, rpc: &str) -> Result<(), Error> {
    if pod.state != PodState::Ready {
        return Err(Error::failed_precondition(format!(
            "{rpc}: pod sandbox {} is not ready (stopped)",
            pod.id
        )));
    }
    Ok(())
}
