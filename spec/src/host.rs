//! Facts about the node that containerd consults while building a spec, passed down so tests can
//! pin them instead of depending on the machine. What cannot change while the daemon runs (the
//! cgroup layout, the daemon's own capabilities) is read once, as containerd reads it once; the
//! hostname and the NOFILE ceiling (`prlimit` can lower it) are read for every spec.

use std::path::{Path, PathBuf};

use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC};
use oci_spec::runtime::Capabilities;

use super::caps::caps_from_mask;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug, Clone)]
pub(super) struct HostFacts {
    /// cgroup v2 only (unified): containers get their own cgroup namespace.
    pub cgroup_v2: bool,
    /// Swap accounting exists, so a memory+swap limit can be written.
    pub swap_controller: bool,
    /// The hugetlb controller exists; without it containerd skips hugepage limits.
    pub hugetlb_controller: bool,
    /// The daemon's effective capabilities: what "ALL" and privileged grant, as containerd's
    /// `cap.Current()` (asking for more would make the runtime fail).
    pub current_caps: Capabilities,
    /// The node's hostname, for `HOSTNAME=` when the pod has none (host network).
    pub hostname: String,
    /// Where a privileged container's host devices are listed from.
    pub dev_root: PathBuf,
    /// The daemon's own hard RLIMIT_NOFILE: without CAP_SYS_RESOURCE a container cannot be given
    /// more, and asking for more makes container creation fail with EPERM.
    pub nofile_hard: Option<u64>,
    /// On a cgroup v1 (or hybrid) node, the v1 hierarchies under /sys/fs/cgroup in which each
    /// container gets a cgroup: (directory, the symlinks naming it, like `cpu` for `cpu,cpuacct`).
    pub cgroup_v1_dirs: Vec<(String, Vec<String>)>,
}

impl HostFacts {
    /// The node's facts: the fixed ones from the first call (reading them all took 0.1 ms of
    /// every CreateContainer), the hostname and the NOFILE ceiling now.
    pub fn detect() -> Self {
        static FIXED: std::sync::OnceLock<HostFacts> = std::sync::OnceLock::new();
        let mut facts = FIXED.get_or_init(Self::detect_fixed).clone();
        facts.hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        facts.nofile_hard = nofile_ceiling(&facts.current_caps);
        facts
    }

    fn detect_fixed() -> Self {
        let cgroup_v2 = is_cgroup_v2();
        HostFacts {
            cgroup_v2,
            swap_controller: swap_controller_available(cgroup_v2),
            hugetlb_controller: hugetlb_controller_present(cgroup_v2),
            current_caps: current_capabilities(),
            hostname: String::new(),
            dev_root: PathBuf::from("/dev"),
            nofile_hard: None,
            cgroup_v1_dirs: if cgroup_v2 {
                Vec::new()
            } else {
                cgroup_v1_dirs(Path::new(CGROUP_ROOT))
            },
        }
    }
}

/// The v1 controllers libcgroups makes a container's cgroup in (wherever they are mounted).
const V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "hugetlb",
    "memory",
    "pids",
    "perf_event",
    "blkio",
    "net_cls",
    "net_prio",
    "freezer",
];

/// The v1 hierarchies mounted in `root` whose controllers are all ones libcgroups manages (so
/// a container's cgroup exists in each), with the symlinks that name them. `systemd`'s named
/// hierarchy, `rdma`, `misc` and the v2 `unified` one are left out.
pub(super) fn cgroup_v1_dirs(root: &Path) -> Vec<(String, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    let mut links = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_symlink() {
            if let Ok(target) = std::fs::read_link(e.path()) {
                links.push((name, target.to_string_lossy().into_owned()));
            }
        } else if ft.is_dir()
            && !name.is_empty()
            && name.split(',').all(|c| V1_CONTROLLERS.contains(&c))
        {
            dirs.push(name);
        }
    }
    dirs.sort();
    dirs.into_iter()
        .map(|d| {
            let mut aliases: Vec<String> = links
                .iter()
                .filter(|(_, target)| target.trim_end_matches('/') == d)
                .map(|(name, _)| name.clone())
                .collect();
            aliases.sort();
            (d, aliases)
        })
        .collect()
}

/// The hard NOFILE limit when we may not raise it (`caps`, the daemon's effective set, lacks
/// CAP_SYS_RESOURCE); None when we may.
pub(super) fn nofile_ceiling(caps: &Capabilities) -> Option<u64> {
    if caps.contains(&oci_spec::runtime::Capability::SysResource) {
        return None;
    }
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(_, hard)| hard)
}

/// Unified mode: cgroup2 mounted at /sys/fs/cgroup (not merely at /sys/fs/cgroup/unified, as in
/// hybrid mode, where the root is a tmpfs holding the v1 hierarchies).
pub(crate) fn is_cgroup_v2() -> bool {
    Path::new(CGROUP_ROOT).join("cgroup.controllers").exists()
        && statfs(CGROUP_ROOT).is_ok_and(|fs| fs.filesystem_type() == CGROUP2_SUPER_MAGIC)
}

/// As containerd's `SwapControllerAvailable`: v1 has `memory.memsw.*` only with swap accounting;
/// on v2 `memory.swap.max` is absent from the root cgroup, so our own cgroup is looked at.
fn swap_controller_available(cgroup_v2: bool) -> bool {
    if !cgroup_v2 {
        return Path::new(CGROUP_ROOT)
            .join("memory/memory.memsw.limit_in_bytes")
            .exists();
    }
    let Ok(own) = std::fs::read_to_string("/proc/self/cgroup") else {
        return false;
    };
    own.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .is_some_and(|path| {
            Path::new(CGROUP_ROOT)
                .join(path.trim_start_matches('/'))
                .join("memory.swap.max")
                .exists()
        })
}

fn hugetlb_controller_present(cgroup_v2: bool) -> bool {
    if cgroup_v2 {
        std::fs::read_to_string(Path::new(CGROUP_ROOT).join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "hugetlb"))
    } else {
        Path::new(CGROUP_ROOT).join("hugetlb").exists()
    }
}

/// The effective set from /proc/self/status.
fn current_capabilities() -> Capabilities {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    caps_from_mask(mask)
}
