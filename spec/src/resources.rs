//! cgroup limits (`linux.resources`), the OOM score and sysctls, as containerd's
//! `WithResources`, `WithOOMScoreAdj` and `WithSysctls`.

use std::collections::HashMap;

use crishim_proto::cri;
use oci_spec::runtime::{
    LinuxCpu, LinuxDeviceCgroup, LinuxHugepageLimit, LinuxMemory, LinuxResources,
};

use super::host::HostFacts;
use super::SpecError;

/// The kernel's range for `oom_score_adj`.
const OOM_SCORE_ADJ_RANGE: (i32, i32) = (-1000, 1000);

/// Zero means "not set" for every CRI number, as in containerd.
pub(super) fn build(
    config: &cri::ContainerConfig,
    devices: Vec<LinuxDeviceCgroup>,
    host: &HostFacts,
) -> Result<LinuxResources, SpecError> {
    let mut out = LinuxResources::default();
    out.set_devices(Some(devices));
    let Some(r) = config.linux.as_ref().and_then(|l| l.resources.as_ref()) else {
        return Ok(out);
    };

    let mut cpu = LinuxCpu::default();
    cpu.set_period(
        non_zero(r.cpu_period)
            .map(|p| unsigned(p, "cpu_period"))
            .transpose()?,
    )
    .set_quota(non_zero(r.cpu_quota))
    .set_shares(
        non_zero(r.cpu_shares)
            .map(|s| unsigned(s, "cpu_shares"))
            .transpose()?,
    )
    .set_cpus(non_empty(&r.cpuset_cpus))
    .set_mems(non_empty(&r.cpuset_mems));
    if cpu != LinuxCpu::default() {
        out.set_cpu(Some(cpu));
    }

    let mut memory = LinuxMemory::default();
    let limit = non_zero(r.memory_limit_in_bytes);
    memory.set_limit(limit);
    // Swap can only be limited where it is accounted. With a memory limit and no swap limit,
    // memory+swap equals the limit: the container does not swap.
    if host.swap_controller {
        memory.set_swap(non_zero(r.memory_swap_limit_in_bytes).or(limit));
    }
    if memory != LinuxMemory::default() {
        out.set_memory(Some(memory));
    }

    check_hugepage_limits(&r.hugepage_limits)?;
    // Without the hugetlb controller containerd (tolerating its absence, the default) skips them.
    if host.hugetlb_controller && !r.hugepage_limits.is_empty() {
        let limits = r
            .hugepage_limits
            .iter()
            .map(|h| {
                let mut limit = LinuxHugepageLimit::default();
                limit
                    .set_page_size(h.page_size.clone())
                    .set_limit(i64::try_from(h.limit).unwrap_or(i64::MAX));
                limit
            })
            .collect();
        out.set_hugepage_limits(Some(limits));
    }

    if !r.unified.is_empty() {
        check_unified(&r.unified)?;
        out.set_unified(Some(r.unified.clone()));
    }
    Ok(out)
}

/// Most hugepage limits a container or pod may set: one per page size, and a node has a few.
const MAX_HUGEPAGE_LIMITS: usize = 16;
/// Longest page size name (`2MB`, `1GB`, `64KB`).
const MAX_PAGE_SIZE: usize = 16;

/// Hugepage limits are recorded with the container or pod whether or not the node enforces
/// them, so their number and names are bounded first.
fn check_hugepage_limits(limits: &[cri::HugepageLimit]) -> Result<(), SpecError> {
    if limits.len() > MAX_HUGEPAGE_LIMITS {
        return Err(SpecError::Invalid(format!(
            "resources.hugepage_limits has {} entries, at most {MAX_HUGEPAGE_LIMITS}",
            limits.len()
        )));
    }
    match limits.iter().find(|h| h.page_size.len() > MAX_PAGE_SIZE) {
        Some(h) => Err(SpecError::Invalid(format!(
            "resources.hugepage_limits page size {:?} is longer than {MAX_PAGE_SIZE} bytes",
            crishim_sys::shown::shown(&h.page_size)
        ))),
        None => Ok(()),
    }
}

/// Most `unified` entries a container may set; cgroup v2 has fewer files than this.
const MAX_UNIFIED_KEYS: usize = 128;
/// Longest `unified` value (an `io.max` line for a few devices fits many times).
const MAX_UNIFIED_VALUE: usize = 4096;

/// `unified` keys name files in the container's own cgroup directory, so each must be a plain
/// `<controller>.<name>` file name: a `/` or `..` would reach other cgroups' files (runc refuses
/// `/` too).
fn check_unified(unified: &HashMap<String, String>) -> Result<(), SpecError> {
    if unified.len() > MAX_UNIFIED_KEYS {
        return Err(SpecError::Invalid(format!(
            "resources.unified has {} keys, at most {MAX_UNIFIED_KEYS}",
            unified.len()
        )));
    }
    for (key, value) in unified {
        let well_formed = key.split_once('.').is_some_and(|(controller, name)| {
            !controller.is_empty()
                && !name.is_empty()
                && controller
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
                && !name.starts_with('.')
                && !name.ends_with('.')
                && !name.contains("..")
        });
        if !well_formed {
            return Err(SpecError::Invalid(format!(
                "resources.unified key {key:?} is not a cgroup file name of the form \
                 <controller>.<name> (no '/', '..' or NUL)"
            )));
        }
        if value.len() > MAX_UNIFIED_VALUE || value.contains('\0') {
            return Err(SpecError::Invalid(format!(
                "resources.unified value of {key:?} is longer than {MAX_UNIFIED_VALUE} bytes or \
                 holds a NUL"
            )));
        }
    }
    Ok(())
}

/// The requested score, never below the daemon's own (lowering it needs CAP_SYS_RESOURCE) and
/// within the kernel's range. Only set when the CRI config has resources.
pub(super) fn oom_score_adj(config: &cri::ContainerConfig, min: Option<i32>) -> Option<i32> {
    let requested = config.linux.as_ref()?.resources.as_ref()?.oom_score_adj;
    let (lowest, highest) = OOM_SCORE_ADJ_RANGE;
    let adj = requested.clamp(i64::from(lowest), i64::from(highest)) as i32;
    Some(min.map_or(adj, |min| adj.max(min)))
}

/// The pod's sysctls, for every container of the pod.
pub(super) fn sysctls(sandbox: &cri::PodSandboxConfig) -> Option<HashMap<String, String>> {
    sandbox
        .linux
        .as_ref()
        .map(|l| l.sysctls.clone())
        .filter(|s| !s.is_empty())
}

fn non_zero(v: i64) -> Option<i64> {
    (v != 0).then_some(v)
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn unsigned(v: i64, what: &str) -> Result<u64, SpecError> {
    u64::try_from(v).map_err(|_| SpecError::Invalid(format!("{what} {v} is negative")))
}
