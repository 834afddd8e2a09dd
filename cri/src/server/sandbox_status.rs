//! `PodSandboxStatus`.

use std::collections::HashMap;

use super::errors::Error;
use crishim_proto::cri::{self, PodSandboxStatusRequest, PodSandboxStatusResponse};
use crishim_state::records::{PodRecord, PodState};

use super::runtime_service::RuntimeService;

impl RuntimeService {
    pub(super) async fn do_pod_sandbox_status(
        &self,
        req: PodSandboxStatusRequest,
    ) -> Result<PodSandboxStatusResponse, Error> {
        let pod = self.inner.store.pod(&req.pod_sandbox_id)?;
        let mut info = HashMap::new();
        if req.verbose {
            let verbose = serde_json::json!({
                "pid": pod.infra_pid,
                "runtimeHandler": pod.runtime_handler,
                "cgroupParent": pod.cgroup_parent,
                "hostNetwork": pod.host_network,
                "sharedPid": pod.shared_pid,
            });
            info.insert("info".to_string(), verbose.to_string());
        }
        Ok(PodSandboxStatusResponse {
            status: Some(pod_status(&pod)),
            info,
            ..Default::default()
        })
    }
}

pub(super) fn cri_state(s: PodState) -> i32 {
    match s {
        PodState::Ready => cri::PodSandboxState::SandboxReady as i32,
        PodState::NotReady | PodState::Creating => cri::PodSandboxState::SandboxNotready as i32,
    }
}

pub(super) fn pod_status(p: &PodRecord) -> cri::PodSandboxStatus {
    let ns_options = p
        .config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone());
    cri::PodSandboxStatus {
        id: p.id.clone(),
        metadata: p.config.metadata.clone(),
        state: cri_state(p.state),
        created_at: p.created_at,
        network: Some(cri::PodSandboxNetworkStatus {
            ip: p.ips.first().cloned().unwrap_or_default(),
            additional_ips: p
                .ips
                .iter()
                .skip(1)
                .map(|ip| cri::PodIp { ip: ip.clone() })
                .collect(),
        }),
        linux: Some(cri::LinuxPodSandboxStatus {
            namespaces: Some(cri::Namespace {
                options: ns_options,
            }),
        }),
        labels: p.config.labels.clone(),
        annotations: p.config.annotations.clone(),
        runtime_handler: p.runtime_handler.clone(),
    }
}
