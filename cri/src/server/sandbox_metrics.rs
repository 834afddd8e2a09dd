//! `ListMetricDescriptors` and `ListPodSandboxMetrics` (KEP-2371): the cAdvisor-compatible
//! metrics that a kubelet with `PodAndContainerStatsFromCRI` serves at `/metrics/cadvisor`,
//! taken from the same readings as the stats RPCs.
//!
//! Each metric carries cAdvisor's labels (`container`, `id`, `image`, `name`, `namespace`,
//! `pod`), filled by the runtime since the kubelet passes them through as they are; network
//! metrics add `interface` and belong to the pod (cAdvisor's `POD` container). CRI values are
//! integers, so the seconds counters count whole seconds, as CRI-O's do.

use super::errors::Error;
use crishim_proto::cri::{
    self, ListMetricDescriptorsRequest, ListMetricDescriptorsResponse,
    ListPodSandboxMetricsRequest, ListPodSandboxMetricsResponse, MetricType,
};
use crishim_state::records::{ContainerRecord, PodRecord, PodState};

use super::runtime_service::RuntimeService;

const LABELS: [&str; 6] = ["container", "id", "image", "name", "namespace", "pod"];
/// cAdvisor's container name for the pod's own (network) metrics.
const POD_CONTAINER: &str = "POD";

/// One metric family: its name, help, type and whether it is per interface (a pod's) rather
/// than per container.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    per_interface: bool,
}

const fn family(name: &'static str, help: &'static str, kind: MetricType) -> Family {
    Family {
        name,
        help,
        kind,
        per_interface: false,
    }
}

const fn network(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        help,
        kind: MetricType::Counter,
        per_interface: true,
    }
}

const FAMILIES: &[Family] = &[
    family(
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed in seconds.",
        MetricType::Counter,
    ),
    family(
        "container_memory_usage_bytes",
        "Current memory usage in bytes, including all memory regardless of when it was accessed.",
        MetricType::Gauge,
    ),
    family(
        "container_memory_working_set_bytes",
        "Current working set in bytes.",
        MetricType::Gauge,
    ),
    family(
        "container_memory_rss",
        "Size of RSS in bytes.",
        MetricType::Gauge,
    ),
    family(
        "container_memory_swap",
        "Container swap usage in bytes.",
        MetricType::Gauge,
    ),
    family(
        "container_fs_usage_bytes",
        "Number of bytes that are consumed by the container on this filesystem.",
        MetricType::Gauge,
    ),
    family(
        "container_fs_inodes_total",
        "Number of inodes the container's writable layer uses.",
        MetricType::Gauge,
    ),
    network(
        "container_network_receive_bytes_total",
        "Cumulative count of bytes received.",
    ),
    network(
        "container_network_transmit_bytes_total",
        "Cumulative count of bytes transmitted.",
    ),
    network(
        "container_network_receive_errors_total",
        "Cumulative count of errors encountered while receiving.",
    ),
    network(
        "container_network_transmit_errors_total",
        "Cumulative count of errors encountered while transmitting.",
    ),
];

fn label_keys(f: &Family) -> Vec<String> {
    let mut keys: Vec<String> = LABELS.iter().map(|k| k.to_string()).collect();
    if f.per_interface {
        keys.push("interface".into());
    }
    keys
}

fn find(name: &str) -> &'static Family {
    FAMILIES
        .iter()
        .find(|f| f.name == name)
        .expect("every metric built here has a family")
}

/// A metric of family `name`, when its value is known.
fn metric(name: &str, labels: &[String], at: i64, value: Option<u64>) -> Option<cri::Metric> {
    let f = find(name);
    Some(cri::Metric {
        name: f.name.into(),
        timestamp: at,
        metric_type: f.kind as i32,
        label_values: labels.to_vec(),
        value: Some(cri::UInt64Value { value: value? }),
    })
}

fn uint(v: &Option<cri::UInt64Value>) -> Option<u64> {
    v.as_ref().map(|v| v.value)
}

/// cAdvisor's labels for a container of `pod` (or for the pod itself, with `container` None).
fn labels(pod: &PodRecord, container: Option<&ContainerRecord>) -> Vec<String> {
    let meta = pod.config.metadata.clone().unwrap_or_default();
    let (name, id, image) = match container {
        Some(c) => (c.name().to_string(), c.id.clone(), c.image.clone()),
        None => (POD_CONTAINER.to_string(), pod.id.clone(), String::new()),
    };
    vec![name, id.clone(), image, id, meta.namespace, meta.name]
}

/// The metrics of one container's stats.
fn container_metrics(labels: &[String], s: &cri::ContainerStats) -> Vec<cri::Metric> {
    let mut out = Vec::new();
    if let Some(cpu) = &s.cpu {
        out.extend(metric(
            "container_cpu_usage_seconds_total",
            labels,
            cpu.timestamp,
            uint(&cpu.usage_core_nano_seconds).map(|ns| ns / 1_000_000_000),
        ));
    }
    if let Some(m) = &s.memory {
        for (name, v) in [
            ("container_memory_usage_bytes", &m.usage_bytes),
            ("container_memory_working_set_bytes", &m.working_set_bytes),
            ("container_memory_rss", &m.rss_bytes),
        ] {
            out.extend(metric(name, labels, m.timestamp, uint(v)));
        }
    }
    if let Some(swap) = &s.swap {
        out.extend(metric(
            "container_memory_swap",
            labels,
            swap.timestamp,
            uint(&swap.swap_usage_bytes),
        ));
    }
    if let Some(fs) = &s.writable_layer {
        out.extend(metric(
            "container_fs_usage_bytes",
            labels,
            fs.timestamp,
            uint(&fs.used_bytes),
        ));
        out.extend(metric(
            "container_fs_inodes_total",
            labels,
            fs.timestamp,
            uint(&fs.inodes_used),
        ));
    }
    out
}

/// The pod's own metrics: its network interfaces' counters.
fn pod_metrics(labels: &[String], network: Option<&cri::NetworkUsage>) -> Vec<cri::Metric> {
    let Some(net) = network else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for i in net.default_interface.iter().chain(&net.interfaces) {
        let mut l = labels.to_vec();
        l.push(i.name.clone());
        for (name, v) in [
            ("container_network_receive_bytes_total", &i.rx_bytes),
            ("container_network_transmit_bytes_total", &i.tx_bytes),
            ("container_network_receive_errors_total", &i.rx_errors),
            ("container_network_transmit_errors_total", &i.tx_errors),
        ] {
            out.extend(metric(name, &l, net.timestamp, uint(v)));
        }
    }
    out
}

impl RuntimeService {
    pub(super) async fn do_list_metric_descriptors(
        &self,
        _req: ListMetricDescriptorsRequest,
    ) -> Result<ListMetricDescriptorsResponse, Error> {
        Ok(ListMetricDescriptorsResponse {
            descriptors: FAMILIES
                .iter()
                .map(|f| cri::MetricDescriptor {
                    name: f.name.into(),
                    help: f.help.into(),
                    label_keys: label_keys(f),
                })
                .collect(),
        })
    }

    pub(super) async fn do_list_pod_sandbox_metrics(
        &self,
        _req: ListPodSandboxMetricsRequest,
    ) -> Result<ListPodSandboxMetricsResponse, Error> {
        let inner = &self.inner;
        let mut pods = inner.pods_viewed("", &Default::default(), |p| {
            (p.state == PodState::Ready).then(|| p.clone())
        });
        pods.sort_by_key(|p| p.created_at);
        let mut pod_metrics_list = Vec::with_capacity(pods.len());
        for pod in &pods {
            let stats = inner.pod_stats(pod).await;
            let linux = stats.linux.unwrap_or_default();
            let records = inner.store.pod_containers(&pod.id);
            let container_metrics_list = linux
                .containers
                .iter()
                .filter_map(|s| {
                    let id = &s.attributes.as_ref()?.id;
                    let record = records.iter().find(|r| &r.id == id)?;
                    Some(cri::ContainerMetrics {
                        container_id: id.clone(),
                        metrics: container_metrics(&labels(pod, Some(record)), s),
                    })
                })
                .collect();
            pod_metrics_list.push(cri::PodSandboxMetrics {
                pod_sandbox_id: pod.id.clone(),
                metrics: pod_metrics(&labels(pod, None), linux.network.as_ref()),
                container_metrics: container_metrics_list,
            });
        }
        inner.forget_gone_rates();
        Ok(ListPodSandboxMetricsResponse {
            pod_metrics: pod_metrics_list,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_matches_its_descriptor() {
        let labels: Vec<String> = LABELS.iter().map(|l| format!("v-{l}")).collect();
        let stats = cri::ContainerStats {
            cpu: Some(cri::CpuUsage {
                timestamp: 7,
                usage_core_nano_seconds: Some(cri::UInt64Value {
                    value: 2_500_000_000,
                }),
                ..Default::default()
            }),
            memory: Some(cri::MemoryUsage {
                timestamp: 8,
                working_set_bytes: Some(cri::UInt64Value { value: 4096 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = container_metrics(&labels, &stats);
        let names: Vec<_> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "container_cpu_usage_seconds_total",
                "container_memory_working_set_bytes"
            ],
            "unknown values are left out, not reported as 0"
        );
        assert_eq!(m[0].value.as_ref().unwrap().value, 2, "whole seconds");
        assert_eq!(m[0].metric_type, MetricType::Counter as i32);
        assert_eq!((m[0].timestamp, m[1].timestamp), (7, 8));
        let net = cri::NetworkUsage {
            timestamp: 9,
            default_interface: Some(cri::NetworkInterfaceUsage {
                name: "eth0".into(),
                rx_bytes: Some(cri::UInt64Value { value: 10 }),
                tx_bytes: Some(cri::UInt64Value { value: 11 }),
                ..Default::default()
            }),
            interfaces: vec![],
        };
        let p = pod_metrics(&labels, Some(&net));
        assert_eq!(p.len(), 2);
        for metric in m.iter().chain(&p) {
            let f = find(&metric.name);
            assert_eq!(metric.label_values.len(), label_keys(f).len(), "{}", f.name);
        }
        assert_eq!(p[0].label_values.last().unwrap(), "eth0");
    }

    #[test]
    fn names_are_unique_and_cadvisors() {
        let mut names: Vec<_> = FAMILIES.iter().map(|f| f.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FAMILIES.len());
        assert!(names.iter().all(|n| n.starts_with("container_")));
    }
}
