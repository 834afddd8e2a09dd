//! `UpdatePodSandboxResources`: the pod-level limits (KEP-1287 and pod-level resources). They are
//! written to the pod's cgroup where that cgroup is the pod's own and the daemon made it (the
//! default `/crishim/<pod-id>`, or a parent it created). Under a parent the kubelet manages
//! (`kubepods/…/pod<uid>`, or any slice) the kubelet has already set them, and the call only
//! checks them, as containerd does.

use super::errors::Error;
use crishim_proto::cri::{UpdatePodSandboxResourcesRequest, UpdatePodSandboxResourcesResponse};
use crishim_state::records::PodRecord;
use oci_spec::runtime::LinuxResources;
use tracing::info;

use super::errors::from_spec_error;
use super::runtime_service::RuntimeService;
use crate::stats::Cgroups;
use crishim_spec as spec;
use crishim_spec::cgroups::CgroupDriver;

const RPC: &str = "UpdatePodSandboxResources";

impl RuntimeService {
    pub(super) async fn do_update_pod_sandbox_resources(
        &self,
        req: UpdatePodSandboxResourcesRequest,
    ) -> Result<UpdatePodSandboxResourcesResponse, Error> {
        let inner = &self.inner;
        let pod = inner.store.pod(&req.pod_sandbox_id)?;
        let Some(resources) = req.resources else {
            return Err(Error::invalid_argument(format!(
                "{RPC}: resources are required"
            )));
        };
        let limits = spec::resources(&resources).map_err(|e| from_spec_error(RPC, e))?;
        // The overhead is only recorded, but it is checked and bounded as the limits are.
        if let Some(overhead) = &req.overhead {
            spec::resources(overhead).map_err(|e| from_spec_error(RPC, e))?;
        }
        let _guard = inner.store.lock(&pod.id).await;
        // Plugins may refuse it before anything changes.
        inner
            .nri_update_pod(&pod, req.overhead.as_ref(), Some(&resources))
            .await?;
        if let Some(cgroup) = inner.daemon_made_pod_cgroup(&pod) {
            write_limits(&Cgroups::host(), &cgroup, &limits)
                .map_err(|e| Error::internal(format!("{RPC}: writing to cgroup {cgroup}: {e}")))?;
            info!(pod = %pod.id, cgroup = %cgroup, "pod resources updated");
        }
        // Kept in the pod's record as the pod's config would carry them, whoever enforces them.
        let mut pod = inner.store.pod(&pod.id)?;
        let linux = pod.config.linux.get_or_insert_with(Default::default);
        linux.resources = Some(resources);
        if req.overhead.is_some() {
            linux.overhead = req.overhead;
        }
        inner.store.save_pod(&pod)?;
        inner.nri_post_update_pod(&pod).await;
        Ok(UpdatePodSandboxResourcesResponse {})
    }
}

impl super::runtime_service::Inner {
    /// The pod's cgroup when the daemon made it for this pod alone.
    fn daemon_made_pod_cgroup(&self, pod: &PodRecord) -> Option<String> {
        if pod.cgroup_driver != CgroupDriver::Cgroupfs {
            return None;
        }
        let own = self.own_pod_cgroup(pod)?;
        let made = own == format!("{}/{}", super::sandbox_run::DEFAULT_CGROUP_PARENT, pod.id)
            || pod
                .owned_cgroups
                .iter()
                .any(|o| o.trim_end_matches('/') == own);
        made.then_some(own)
    }
}

/// Write the CPU and memory limits `r` sets to cgroup `path` (v1 or v2 files).
pub(super) fn write_limits(
    cgroups: &Cgroups,
    path: &str,
    r: &LinuxResources,
) -> std::io::Result<()> {
    let cpu = r.cpu().as_ref();
    let quota = cpu.and_then(|c| c.quota());
    let period = cpu.and_then(|c| c.period());
    let shares = cpu.and_then(|c| c.shares());
    let memory = r.memory().as_ref().and_then(|m| m.limit());
    if cgroups.is_v2() {
        if quota.is_some() || period.is_some() {
            let max = match quota {
                Some(q) if q > 0 => q.to_string(),
                _ => "max".to_string(),
            };
            let period = period.unwrap_or(100_000);
            cgroups.write("cpu", path, "cpu.max", &format!("{max} {period}"))?;
        }
        if let Some(s) = shares.filter(|s| *s > 0) {
            cgroups.write("cpu", path, "cpu.weight", &shares_to_weight(s).to_string())?;
        }
        if let Some(m) = memory {
            let max = if m > 0 { m.to_string() } else { "max".into() };
            cgroups.write("memory", path, "memory.max", &max)?;
        }
    } else {
        if let Some(p) = period.filter(|p| *p > 0) {
            cgroups.write("cpu", path, "cpu.cfs_period_us", &p.to_string())?;
        }
        if let Some(q) = quota {
            let q = if q > 0 { q } else { -1 };
            cgroups.write("cpu", path, "cpu.cfs_quota_us", &q.to_string())?;
        }
        if let Some(s) = shares.filter(|s| *s > 0) {
            cgroups.write("cpu", path, "cpu.shares", &s.to_string())?;
        }
        if let Some(m) = memory {
            let m = if m > 0 { m } else { -1 };
            cgroups.write("memory", path, "memory.limit_in_bytes", &m.to_string())?;
        }
    }
    Ok(())
}

/// cgroup v1 `cpu.shares` (2–262144) as v2 `cpu.weight` (1–10000), the conversion runc and the
/// kubelet use.
fn shares_to_weight(shares: u64) -> u64 {
    let shares = shares.clamp(2, 262_144);
    1 + ((shares - 2) * 9999) / 262_142
}

#[cfg(test)]
mod tests {
    use super::*;
    use crishim_proto::cri::LinuxContainerResources;

    fn limits(cpu_quota: i64, shares: i64, memory: i64) -> LinuxResources {
        spec::resources(&LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota,
            cpu_shares: shares,
            memory_limit_in_bytes: memory,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn limits_go_to_the_v1_and_v2_files() {
        let v1 = tempfile::tempdir().unwrap();
        for c in ["cpu", "memory"] {
            std::fs::create_dir_all(v1.path().join(c).join("crishim/p")).unwrap();
        }
        let cg = Cgroups::at(v1.path());
        write_limits(&cg, "/crishim/p", &limits(50_000, 512, 64 << 20)).unwrap();
        let read = |f: &str| std::fs::read_to_string(v1.path().join(f)).unwrap();
        assert_eq!(read("cpu/crishim/p/cpu.cfs_quota_us"), "50000");
        assert_eq!(read("cpu/crishim/p/cpu.cfs_period_us"), "100000");
        assert_eq!(read("cpu/crishim/p/cpu.shares"), "512");
        assert_eq!(read("memory/crishim/p/memory.limit_in_bytes"), "67108864");

        let v2 = tempfile::tempdir().unwrap();
        std::fs::write(v2.path().join("cgroup.controllers"), "cpu memory").unwrap();
        std::fs::create_dir_all(v2.path().join("crishim/p")).unwrap();
        let cg = Cgroups::at(v2.path());
        write_limits(&cg, "/crishim/p", &limits(0, 1024, 128 << 20)).unwrap();
        let read = |f: &str| std::fs::read_to_string(v2.path().join("crishim/p").join(f)).unwrap();
        assert_eq!(read("cpu.max"), "max 100000", "no quota: unlimited");
        assert_eq!(read("cpu.weight"), "39");
        assert_eq!(read("memory.max"), "134217728");
        assert!(
            write_limits(&cg, "/../../etc", &limits(1, 2, 3)).is_err(),
            "a climbing path"
        );
    }

    #[test]
    fn shares_convert_to_weights_as_runc_does() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(u64::MAX), 10_000);
    }
}
