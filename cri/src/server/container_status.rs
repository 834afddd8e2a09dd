//! `ContainerStatus`.

use std::collections::HashMap;

use super::errors::Error;
use crishim_proto::cri::{self, ContainerStatusRequest, ContainerStatusResponse};
use crishim_proto::shim::{ContainerState, Status as ShimStatus};
use crishim_state::records::ContainerRecord;

use super::runtime_service::RuntimeService;

impl RuntimeService {
    pub(super) async fn do_container_status(
        &self,
        req: ContainerStatusRequest,
    ) -> Result<ContainerStatusResponse, Error> {
        let inner = &self.inner;
        let c = inner.store.container(&req.container_id)?;
        let state = inner.refresh(&c).await;
        let mut info = HashMap::new();
        if req.verbose {
            let verbose = serde_json::json!({
                "sandboxID": c.pod_id,
                "pid": state.pid,
                "bundle": c.bundle,
                "message": state.message,
            });
            info.insert("info".to_string(), verbose.to_string());
        }
        let mut status = container_status(&c, &state);
        // From creation on (the kubelet's in-place resize reads them before start): what the
        // cgroup enforces, or, before start where it cannot be read yet, what was asked for.
        status.resources = match state.status {
            ShimStatus::Running | ShimStatus::Created => match inner.resources_in_force(&c).await {
                None if state.status == ShimStatus::Created => asked_resources(&c),
                in_force => in_force,
            },
            ShimStatus::Exited | ShimStatus::Unknown => None,
        };
        Ok(ContainerStatusResponse {
            status: Some(status),
            info,
        })
    }
}

impl super::runtime_service::Inner {
    /// The limits the container's cgroup enforces (KEP-1287: the kubelet resizes a pod in place
    /// only when the runtime reports them). `None` when they cannot be read.
    async fn resources_in_force(&self, c: &ContainerRecord) -> Option<cri::ContainerResources> {
        let cgroup = self.container_cgroup(c)?;
        let read =
            tokio::task::spawn_blocking(move || crate::stats::Cgroups::host().limits(&cgroup));
        let l = read.await.ok()?.ok()?;
        Some(cri::ContainerResources {
            linux: Some(cri::LinuxContainerResources {
                cpu_period: l.cpu_period,
                cpu_quota: l.cpu_quota,
                cpu_shares: l.cpu_shares,
                memory_limit_in_bytes: l.memory_limit,
                cpuset_cpus: l.cpuset_cpus,
                cpuset_mems: l.cpuset_mems,
                ..Default::default()
            }),
            windows: None,
        })
    }
}

/// The resources the container's config asks for.
fn asked_resources(c: &ContainerRecord) -> Option<cri::ContainerResources> {
    let linux = c.config.linux.as_ref()?.resources.clone()?;
    Some(cri::ContainerResources {
        linux: Some(linux),
        windows: None,
    })
}

pub(super) fn cri_state(s: &ContainerState) -> i32 {
    match s.status {
        ShimStatus::Created => cri::ContainerState::ContainerCreated as i32,
        ShimStatus::Running => cri::ContainerState::ContainerRunning as i32,
        ShimStatus::Exited => cri::ContainerState::ContainerExited as i32,
        ShimStatus::Unknown => cri::ContainerState::ContainerUnknown as i32,
    }
}

/// `Completed`, `Error`, `OOMKilled` or the shim's own (`StartError`), as the kubelet expects them.
fn reason(s: &ContainerState) -> String {
    match s.status {
        _ if !s.reason.is_empty() => s.reason.clone(),
        ShimStatus::Exited if s.oom_killed => "OOMKilled".into(),
        ShimStatus::Exited if s.exit_code == 0 => "Completed".into(),
        ShimStatus::Exited => "Error".into(),
        _ => String::new(),
    }
}

pub(super) fn container_status(c: &ContainerRecord, s: &ContainerState) -> cri::ContainerStatus {
    cri::ContainerStatus {
        id: c.id.clone(),
        metadata: c.config.metadata.clone(),
        state: cri_state(s),
        created_at: c.created_at,
        started_at: s.started_at,
        finished_at: s.finished_at,
        exit_code: s.exit_code,
        image: Some(cri::ImageSpec {
            image: c.image.clone(),
            ..Default::default()
        }),
        image_ref: c.image_ref.clone(),
        image_id: c.image_id.clone(),
        reason: reason(s),
        message: s.message.clone(),
        labels: c.config.labels.clone(),
        annotations: c.config.annotations.clone(),
        mounts: c.config.mounts.clone(),
        log_path: c.log_path.display().to_string(),
        resources: None,
        stop_signal: super::stop_signal::to_cri(c.stop_signal) as i32,
        // KEP-3619: the identity the process runs as, supplementary groups included (those
        // of the image's /etc/group too, unless SupplementalGroupsPolicy is Strict).
        user: c.user.as_ref().map(|u| cri::ContainerUser {
            linux: Some(cri::LinuxContainerUser {
                uid: u.uid.into(),
                gid: u.gid.into(),
                supplemental_groups: u.groups.iter().map(|g| i64::from(*g)).collect(),
            }),
        }),
    }
}
