//! `ContainerStats` and `ListContainerStats`: CPU and memory from the container's cgroup (v1 or
//! v2, read from the files, see `crate::stats`), the CPU rate since the previous sample of the same
//! container, and the disk use of its writable layer. As in containerd, only running containers
//! are listed.

use super::errors::Error;
use crishim_proto::cri::{
    self, ContainerStatsRequest, ContainerStatsResponse, ListContainerStatsRequest,
    ListContainerStatsResponse, UInt64Value,
};
use crishim_proto::shim::Status as ShimStatus;
use crishim_state::records::{now_nanos, ContainerRecord};
use tracing::debug;

use super::runtime_service::{Inner, RuntimeService};
use crate::stats::{self, Cgroups, DiskUsage, Memory};

/// The key of a pod in `Inner::cpu_rates`.
pub(super) fn pod_rate_key(pod_id: &str) -> String {
    format!("pod/{pod_id}")
}

/// One reading of a container's counters; a counter that could not be read is `None`.
#[derive(Debug, Default)]
pub(super) struct Reading {
    /// When the cgroup was read (ns since the epoch).
    pub at: i64,
    pub cpu: Option<u64>,
    pub memory: Option<Memory>,
    pub pids: Option<u64>,
    pub disk: Option<DiskUsage>,
    /// Pressure of cpu, memory and io (cgroup v2 with PSI only).
    pub psi: stats::Pressures,
    pub swap: Option<stats::Swap>,
}

/// The CRI form of a resource's pressure.
pub(super) fn cri_psi(p: Option<stats::Psi>) -> Option<cri::PsiStats> {
    let data = |d: stats::Pressure| cri::PsiData {
        total: d.total,
        avg10: d.avg10,
        avg60: d.avg60,
        avg300: d.avg300,
    };
    p.map(|p| cri::PsiStats {
        full: p.full.map(data),
        some: p.some.map(data),
    })
}

/// The CRI I/O usage: only its pressure is reported, where there is one.
pub(super) fn io_usage(at: i64, p: Option<stats::Psi>) -> Option<cri::IoUsage> {
    p.map(|p| cri::IoUsage {
        timestamp: at,
        psi: cri_psi(Some(p)),
    })
}

pub(super) fn value(v: u64) -> Option<UInt64Value> {
    Some(UInt64Value { value: v })
}

pub(super) fn memory_usage(at: i64, m: &Memory) -> cri::MemoryUsage {
    cri::MemoryUsage {
        timestamp: at,
        working_set_bytes: m.working_set.and_then(value),
        available_bytes: m.available().and_then(value),
        usage_bytes: value(m.usage),
        rss_bytes: m.rss.and_then(value),
        page_faults: m.page_faults.and_then(value),
        major_page_faults: m.major_page_faults.and_then(value),
        psi: None,
    }
}

/// A counter's value, or `None` with the reason logged (a cgroup vanishing under a container that
/// just exited is ordinary, so this is not a warning).
pub(super) fn known<T>(what: &str, cgroup: &str, r: std::io::Result<T>) -> Option<T> {
    r.map_err(|e| debug!(%cgroup, counter = what, error = %e, "cgroup counter unreadable"))
        .ok()
}

impl RuntimeService {
    pub(super) async fn do_container_stats(
        &self,
        req: ContainerStatsRequest,
    ) -> Result<ContainerStatsResponse, Error> {
        let inner = &self.inner;
        let c = inner.store.container(&req.container_id)?;
        let running = inner.refresh(&c).await.status == ShimStatus::Running;
        let reading = inner.read_container(&c, running).await;
        let stats = inner.container_stats(&c, &reading);
        inner.forget_gone_rates();
        Ok(ContainerStatsResponse { stats: Some(stats) })
    }

    pub(super) async fn do_list_container_stats(
        &self,
        req: ListContainerStatsRequest,
    ) -> Result<ListContainerStatsResponse, Error> {
        let inner = &self.inner;
        let f = req.filter.unwrap_or_default();
        let mut candidates: Vec<ContainerRecord> = inner.store.containers_where(|c| {
            c.id.starts_with(&f.id)
                && c.pod_id.starts_with(&f.pod_sandbox_id)
                && super::labels_match(&f.label_selector, &c.config.labels)
        });
        candidates.sort_by_key(|c| c.created_at);
        let mut stats = Vec::with_capacity(candidates.len());
        for c in candidates {
            if inner.refresh(&c).await.status != ShimStatus::Running {
                continue;
            }
            let reading = inner.read_container(&c, true).await;
            stats.push(inner.container_stats(&c, &reading));
        }
        inner.forget_gone_rates();
        Ok(ListContainerStatsResponse { stats })
    }
}

impl Inner {
    /// The container's cgroup: the `linux.cgroupsPath` CreateContainer wrote, derived again from
    /// the pod record (cheaper than reading the bundle's config.json per call).
    pub(super) fn container_cgroup(&self, c: &ContainerRecord) -> Option<String> {
        let pod = self.store.pod(&c.pod_id).ok()?;
        Some(pod.cgroup_driver.container_path(&pod.cgroup_parent, &c.id))
    }

    /// Read the container's counters: its cgroup's while it runs, and always its writable layer.
    pub(super) async fn read_container(&self, c: &ContainerRecord, running: bool) -> Reading {
        let cgroup = if running {
            self.container_cgroup(c)
        } else {
            None
        };
        let upper = self.images.writable_dir(&c.id).join("upper");
        tokio::task::spawn_blocking(move || {
            let at = now_nanos();
            let mut r = Reading {
                at,
                ..Default::default()
            };
            if let Some(path) = &cgroup {
                let cg = Cgroups::host();
                r.cpu = known("cpu", path, cg.cpu_usage_ns(path));
                r.memory = known("memory", path, cg.memory(path));
                r.pids = known("pids", path, cg.pids(path));
                r.psi = cg.pressures(path);
                r.swap = cg.swap(path);
            }
            r.disk = stats::disk_usage(&upper)
                .map_err(
                    |e| debug!(dir = %upper.display(), error = %e, "writable layer unreadable"),
                )
                .ok();
            r
        })
        .await
        .unwrap_or_default()
    }

    /// The CRI form of a reading (which also takes the container's next CPU-rate sample).
    /// Cumulative CPU time, and the rate since this container's or pod's previous sample.
    pub(super) fn cpu_usage(&self, key: &str, at: i64, usage: u64) -> cri::CpuUsage {
        cri::CpuUsage {
            timestamp: at,
            usage_core_nano_seconds: value(usage),
            usage_nano_cores: value(self.cpu_rates.rate(key, at, usage)),
            psi: None,
        }
    }

    pub(super) fn container_stats(&self, c: &ContainerRecord, r: &Reading) -> cri::ContainerStats {
        cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: c.id.clone(),
                metadata: c.config.metadata.clone(),
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
            }),
            cpu: r.cpu.map(|u| cri::CpuUsage {
                psi: cri_psi(r.psi.cpu),
                ..self.cpu_usage(&c.id, r.at, u)
            }),
            memory: r.memory.as_ref().map(|m| cri::MemoryUsage {
                psi: cri_psi(r.psi.memory),
                ..memory_usage(r.at, m)
            }),
            writable_layer: r.disk.map(|d| cri::FilesystemUsage {
                timestamp: r.at,
                fs_id: Some(cri::FilesystemIdentifier {
                    mountpoint: self.images.root().display().to_string(),
                }),
                used_bytes: value(d.bytes),
                inodes_used: value(d.inodes),
            }),
            swap: r.swap.map(|s| cri::SwapUsage {
                timestamp: r.at,
                swap_usage_bytes: value(s.usage),
                swap_available_bytes: s.available.and_then(value),
            }),
            io: io_usage(r.at, r.psi.io),
        }
    }

    /// Drop the CPU samples of containers and pods that no longer exist.
    pub(super) fn forget_gone_rates(&self) {
        let (pods, containers) = self.store.ids();
        self.cpu_rates.retain(|k| match k.strip_prefix("pod/") {
            Some(pod) => pods.contains(pod),
            None => containers.contains(k),
        });
    }
}
