//! `PodSandboxStats` and `ListPodSandboxStats`: a ready pod's CPU and memory (from its own cgroup
//! when the pod has one, else summed over its running containers), its network counters (the
//! infra process's `net/dev`, for a pod with an `eth0`), its process count (the sum of its
//! containers') and its containers' stats. A pod that is not ready gets its attributes only, as
//! in containerd.

use super::errors::Error;
use crishim_proto::cri::{
    self, ListPodSandboxStatsRequest, ListPodSandboxStatsResponse, PodSandboxStatsRequest,
    PodSandboxStatsResponse,
};
use crishim_proto::shim::Status as ShimStatus;
use crishim_state::records::{now_nanos, PodRecord, PodState};

use super::container_stats::{known, memory_usage, pod_rate_key, value, Reading};
use super::runtime_service::{Inner, RuntimeService};
use super::sandbox_run::DEFAULT_CGROUP_PARENT;
use crate::stats::{self, Cgroups, Memory};

/// The interface CNI gives every pod (`PodNetwork::ifname`), reported as the default one.
const DEFAULT_INTERFACE: &str = "eth0";

impl RuntimeService {
    pub(super) async fn do_pod_sandbox_stats(
        &self,
        req: PodSandboxStatsRequest,
    ) -> Result<PodSandboxStatsResponse, Error> {
        let pod = self.inner.store.pod(&req.pod_sandbox_id)?;
        let stats = self.inner.pod_stats(&pod).await;
        self.inner.forget_gone_rates();
        Ok(PodSandboxStatsResponse { stats: Some(stats) })
    }

    pub(super) async fn do_list_pod_sandbox_stats(
        &self,
        req: ListPodSandboxStatsRequest,
    ) -> Result<ListPodSandboxStatsResponse, Error> {
        let f = req.filter.unwrap_or_default();
        let mut pods = self
            .inner
            .pods_viewed(&f.id, &f.label_selector, |p| Some(p.clone()));
        pods.sort_by_key(|p| p.created_at);
        let mut stats = Vec::with_capacity(pods.len());
        for p in &pods {
            stats.push(self.inner.pod_stats(p).await);
        }
        self.inner.forget_gone_rates();
        Ok(ListPodSandboxStatsResponse { stats })
    }
}

impl Inner {
    pub(super) async fn pod_stats(&self, pod: &PodRecord) -> cri::PodSandboxStats {
        let attributes = Some(cri::PodSandboxAttributes {
            id: pod.id.clone(),
            metadata: pod.config.metadata.clone(),
            labels: pod.config.labels.clone(),
            annotations: pod.config.annotations.clone(),
        });
        let mut linux = cri::LinuxPodSandboxStats::default();
        if pod.state != PodState::Ready {
            return cri::PodSandboxStats {
                attributes,
                linux: Some(linux),
                windows: None,
            };
        }

        let mut containers = self.store.pod_containers(&pod.id);
        containers.sort_by_key(|c| c.created_at);
        let mut readings: Vec<Reading> = Vec::new();
        for c in &containers {
            if self.refresh(c).await.status != ShimStatus::Running {
                continue;
            }
            let r = self.read_container(c, true).await;
            linux.containers.push(self.container_stats(c, &r));
            readings.push(r);
        }

        let at = now_nanos();
        let own = self.own_pod_cgroup(pod);
        let (own_cpu, own_memory, own_psi) = match &own {
            Some(path) => {
                let path = path.clone();
                let read = tokio::task::spawn_blocking(move || {
                    let cg = Cgroups::host();
                    (
                        known("cpu", &path, cg.cpu_usage_ns(&path)),
                        known("memory", &path, cg.memory(&path)),
                        cg.pressures(&path),
                    )
                });
                read.await.unwrap_or_default()
            }
            None => (None, None, Default::default()),
        };
        // Otherwise summed over the running containers: known only when known for each of them.
        // The rate is the sum of theirs (a rate of the summed counter would jump whenever a
        // container starts or goes).
        linux.cpu = match own_cpu {
            Some(u) => Some(self.cpu_usage(&pod_rate_key(&pod.id), at, u)),
            None => readings
                .iter()
                .map(|r| r.cpu)
                .sum::<Option<u64>>()
                .map(|u| cri::CpuUsage {
                    timestamp: at,
                    usage_core_nano_seconds: value(u),
                    usage_nano_cores: value(
                        linux
                            .containers
                            .iter()
                            .filter_map(|c| Some(c.cpu.as_ref()?.usage_nano_cores.as_ref()?.value))
                            .sum(),
                    ),
                    psi: None,
                }),
        };
        let memory = own_memory.or_else(|| {
            let zero = Memory {
                working_set: Some(0),
                rss: Some(0),
                page_faults: Some(0),
                major_page_faults: Some(0),
                ..Default::default()
            };
            readings
                .iter()
                .try_fold(zero, |sum, r| Some(sum.add(r.memory.as_ref()?)))
        });
        linux.memory = memory.as_ref().map(|m| cri::MemoryUsage {
            psi: super::container_stats::cri_psi(own_psi.memory),
            ..memory_usage(at, m)
        });
        if let Some(cpu) = linux.cpu.as_mut() {
            cpu.psi = super::container_stats::cri_psi(own_psi.cpu);
        }
        linux.io = super::container_stats::io_usage(at, own_psi.io);
        linux.process = readings
            .iter()
            .map(|r| r.pids)
            .sum::<Option<u64>>()
            .map(|n| cri::ProcessUsage {
                timestamp: at,
                process_count: value(n),
            });
        linux.network = self.network_usage(pod, at);
        cri::PodSandboxStats {
            attributes,
            linux: Some(linux),
            windows: None,
        }
    }

    /// The pod's cgroup parent when it is the pod's alone, so its counters are the pod's: the
    /// default `/crishim/<pod-id>`, one the daemon created for this pod, or the kubelet's
    /// `…/pod<uid>`; and no other pod shares it.
    pub(super) fn own_pod_cgroup(&self, pod: &PodRecord) -> Option<String> {
        let parent = pod.cgroup_parent.trim_end_matches('/');
        if parent.is_empty() {
            return None;
        }
        let uid = pod.config.metadata.as_ref().map_or("", |m| m.uid.as_str());
        let last = parent.rsplit('/').next().unwrap_or("");
        let own = parent == format!("{DEFAULT_CGROUP_PARENT}/{}", pod.id)
            || pod
                .owned_cgroups
                .iter()
                .any(|o| o.trim_end_matches('/') == parent)
            || (!uid.is_empty() && (last.contains(uid) || last.contains(&uid.replace('-', "_"))));
        let shared = !self
            .store
            .pods_viewed(|p| {
                (p.id != pod.id && p.cgroup_parent.trim_end_matches('/') == parent).then_some(())
            })
            .is_empty();
        (own && !shared && Cgroups::host().exists(parent)).then(|| parent.to_string())
    }

    /// The counters of the pod's network namespace, through its infra process, once that process
    /// is known to still hold the namespace pinned for the pod (so a reused pid is never read).
    /// `None` for host network and for a pod without an `eth0` (no CNI network).
    fn network_usage(&self, pod: &PodRecord, at: i64) -> Option<cri::NetworkUsage> {
        if pod.host_network || pod.infra_pid <= 0 {
            return None;
        }
        // Held by pidfd and checked against the pinned namespace; `net/dev` is kept only if
        // the process still held its pid after the read.
        let infra = self.infra_process(pod, "PodSandboxStats").ok()?;
        let interfaces = infra
            .read_proc("net/dev")
            .map(|text| stats::parse_net_dev(&text))
            .map_err(|e| tracing::debug!(pod = %pod.id, error = %e, "net/dev unreadable"))
            .ok()?;
        let usage = |i: &stats::Interface| cri::NetworkInterfaceUsage {
            name: i.name.clone(),
            rx_bytes: value(i.rx_bytes),
            rx_errors: value(i.rx_errors),
            tx_bytes: value(i.tx_bytes),
            tx_errors: value(i.tx_errors),
        };
        let default = interfaces.iter().find(|i| i.name == DEFAULT_INTERFACE)?;
        Some(cri::NetworkUsage {
            timestamp: at,
            default_interface: Some(usage(default)),
            interfaces: interfaces
                .iter()
                .filter(|i| i.name != "lo")
                .map(usage)
                .collect(),
        })
    }
}
