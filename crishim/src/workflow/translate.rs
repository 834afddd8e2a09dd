//! A plan's pod and containers as the CRI configs a kubelet would send for them.

use std::path::Path;

use crishim_proto::cri;
use k8s_openapi::api::core::v1::Container;

use super::manifest::{Plan, Volume, VolumeSource};
use super::WorkflowError;

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

const CPU_PERIOD: i64 = 100_000;

/// CPU and memory limits (and CPU requests as shares), the way the kubelet converts them.
pub fn resources(c: &Container) -> Result<cri::LinuxContainerResources, WorkflowError> {
    let r = c.resources.as_ref();
    let get = |which: &str, key: &str| {
        r.and_then(|r| match which {
            "limits" => r.limits.as_ref(),
            _ => r.requests.as_ref(),
        })
        .and_then(|m| m.get(key))
        .map(|q| {
            parse_quantity(&q.0).ok_or_else(|| {
                WorkflowError::Invalid(format!(
                    "container {:?}: resources.{which}.{key} {:?} is not a quantity",
                    c.name, q.0
                ))
            })
        })
        .transpose()
    };
    let mut out = cri::LinuxContainerResources::default();
    if let Some(cpu) = get("limits", "cpu")? {
        out.cpu_period = CPU_PERIOD;
        out.cpu_quota = ((cpu * CPU_PERIOD as f64).ceil() as i64).max(1000);
    }
    if let Some(cpu) = get("requests", "cpu")?.or(get("limits", "cpu")?) {
        out.cpu_shares = ((cpu * 1024.0) as i64).max(2);
    }
    if let Some(mem) = get("limits", "memory")? {
        out.memory_limit_in_bytes = mem.ceil() as i64;
    }
    get("requests", "memory")?;
    Ok(out)
}

/// A Kubernetes quantity (`500m`, `2`, `64Mi`, `1G`, `1e3`) as a number.
pub fn parse_quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        _ => return None,
    };
    Some(n * factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_kubernetes_writes_them() {
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("2"), Some(2.0));
        assert_eq!(parse_quantity("64Mi"), Some(64.0 * 1024.0 * 1024.0));
        assert_eq!(parse_quantity("1G"), Some(1e9));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("lots"), None);
        assert_eq!(parse_quantity("-1"), None);
        assert_eq!(parse_quantity("5Qi"), None);
    }

    #[test]
    fn limits_become_cfs_quota_and_memory_limit() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "a",
            "resources": {"limits": {"cpu": "250m", "memory": "128Mi"}}
        }))
        .unwrap();
        let r = resources(&c).unwrap();
        assert_eq!((r.cpu_period, r.cpu_quota), (100_000, 25_000));
        assert_eq!(r.cpu_shares, 256);
        assert_eq!(r.memory_limit_in_bytes, 128 << 20);
    }
}
