//! A plan's pod and containers as the CRI configs a kubelet would send for them.

use std::path::Path;

use crishim_proto::cri;
use k8s_openapi::api::core::v1::Container;

use super::error::WorkflowError;
use super::manifest::{Plan, Volume, VolumeSource};
use super::resources::resources;

/// The sandbox config of the run's pod.
pub fn pod_config(plan: &Plan, log_dir: &Path) -> cri::PodSandboxConfig {
    // A pod on the host network has the node's name, as the kubelet leaves it unset.
    let mut hostname = if plan.host_network {
        String::new()
    } else {
        plan.name.clone()
    };
    hostname.truncate(63);
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: plan.name.clone(),
            uid: plan.uid.clone(),
            namespace: plan.namespace.clone(),
            attempt: 0,
        }),
        hostname,
        log_directory: log_dir.to_string_lossy().into_owned(),
        labels: plan.labels.clone().into_iter().collect(),
        annotations: plan.annotations.clone().into_iter().collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces(plan)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn namespaces(plan: &Plan) -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: if plan.host_network {
            cri::NamespaceMode::Node
        } else {
            cri::NamespaceMode::Pod
        } as i32,
        pid: if plan.share_pid {
            cri::NamespaceMode::Pod
        } else {
            cri::NamespaceMode::Container
        } as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// The log file of a container's `attempt`, relative to the pod's log directory.
pub fn log_path(name: &str, attempt: u32) -> String {
    format!("{name}/{attempt}.log")
}

/// The CRI config of `c`'s `attempt`; `sources` gives the host path of each of its volume mounts,
/// in order (the volume's directory, or its subPath's bind: see [`super::subpath`]).
pub fn container_config(
    plan: &Plan,
    c: &Container,
    attempt: u32,
    sources: &[std::path::PathBuf],
) -> Result<cri::ContainerConfig, WorkflowError> {
    let mounts = c
        .volume_mounts
        .iter()
        .flatten()
        .zip(sources)
        .map(|(m, host)| cri::Mount {
            container_path: m.mount_path.clone(),
            host_path: host.to_string_lossy().into_owned(),
            readonly: m.read_only.unwrap_or(false),
            ..Default::default()
        })
        .collect();
    let sc = c.security_context.as_ref();
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt,
        }),
        image: Some(cri::ImageSpec {
            image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: c
            .env
            .iter()
            .flatten()
            .map(|e| cri::KeyValue {
                key: e.name.clone(),
                value: e.value.clone().unwrap_or_default().into(),
            })
            .collect(),
        mounts,
        log_path: log_path(&c.name, attempt),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources(c)?),
            security_context: Some(cri::LinuxContainerSecurityContext {
                capabilities: caps.map(|k| cri::Capability {
                    add_capabilities: k.add.clone().unwrap_or_default(),
                    drop_capabilities: k.drop.clone().unwrap_or_default(),
                    ..Default::default()
                }),
                run_as_user: sc
                    .and_then(|s| s.run_as_user)
                    .map(|value| cri::Int64Value { value }),
                run_as_group: sc
                    .and_then(|s| s.run_as_group)
                    .map(|value| cri::Int64Value { value }),
                readonly_rootfs: sc.and_then(|s| s.read_only_root_filesystem) == Some(true),
                namespace_options: Some(namespaces(plan)),
                ..Default::default()
            }),
        }),
        ..Default::default()
    })
}

/// Where a volume lives on the host: hostPath as given, emptyDir under the run's directory.
pub fn host_dir(v: &Volume, run_dir: &Path) -> std::path::PathBuf {
    match &v.source {
        VolumeSource::HostPath { path, .. } => path.clone(),
        VolumeSource::EmptyDir { .. } => run_dir.join("volumes").join(&v.name),
    }
}
