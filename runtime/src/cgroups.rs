//! Pod cgroup parents. The kubelet creates (and removes) the parents it names; when a pod names one
//! that does not exist yet, or none at all, libcontainer creates it for the first container, and then
//! it is ours to remove with the pod. We record which directories we created and remove only those.
//! Under the systemd driver the parents are slices, which systemd makes and the kubelet removes.

use std::path::{Path, PathBuf};

use crishim_proto::cgroups_path;
use serde::{Deserialize, Serialize};

/// `cgroup_driver` in the config: who makes pod and container cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    #[default]
    Cgroupfs,
    Systemd,
}

/// The pod cgroup parent under the systemd driver when the pod names none.
pub const DEFAULT_SYSTEMD_SLICE: &str = "crishim.slice";

impl CgroupDriver {
    /// Whether this host can use the driver: systemd's needs a cgroup v2 host (libcgroups drives
    /// systemd on the unified hierarchy only) and a systemd to talk to.
    pub fn check_host(self) -> Result<(), String> {
        if self == CgroupDriver::Cgroupfs {
            return Ok(());
        }
        if !crate::spec::is_cgroup_v2() {
            return Err(
                "cgroup_driver = \"systemd\" needs a cgroup v2 (unified) host, and \
                        /sys/fs/cgroup is not cgroup2; use cgroup_driver = \"cgroupfs\""
                    .into(),
            );
        }
        let bus = std::env::var_os("DBUS_SYSTEM_BUS_ADDRESS").is_some()
            || ["/run/systemd/private", "/run/dbus/system_bus_socket"]
                .iter()
                .any(|p| Path::new(p).exists());
        if !bus {
            return Err("cgroup_driver = \"systemd\" but systemd is not reachable \
                        (no /run/systemd/private or system bus socket)"
                .into());
        }
        Ok(())
    }

    /// The cgroup parent of a pod that asked for `requested` (empty: none), checked against the
    /// driver's form: a slice name for systemd, a path for cgroupfs.
    pub fn pod_parent(
        self,
        requested: &str,
        pod_id: &str,
        default_root: &str,
    ) -> Result<String, String> {
        match (self, requested) {
            (CgroupDriver::Cgroupfs, "") => Ok(format!("{default_root}/{pod_id}")),
            (CgroupDriver::Systemd, "") => Ok(DEFAULT_SYSTEMD_SLICE.to_string()),
            (CgroupDriver::Systemd, slice) if cgroups_path::is_slice_name(slice) => {
                Ok(slice.to_string())
            }
            (CgroupDriver::Systemd, other) => Err(format!(
                "cgroup_parent {other:?} is not a systemd slice name (like \
                 kubepods-besteffort-pod<uid>.slice); crishim runs with cgroup_driver = \
                 \"systemd\", so the kubelet needs --cgroup-driver=systemd"
            )),
            (CgroupDriver::Cgroupfs, slice)
                if !slice.starts_with('/') && slice.ends_with(".slice") =>
            {
                Err(format!(
                    "cgroup_parent {slice:?} is a systemd slice, but crishim runs with \
                     cgroup_driver = \"cgroupfs\"; set cgroup_driver = \"systemd\" or run the \
                     kubelet with --cgroup-driver=cgroupfs"
                ))
            }
            (CgroupDriver::Cgroupfs, path) => Ok(path.to_string()),
        }
    }

    /// The OCI cgroupsPath of container `id` in a pod whose parent is `parent`.
    pub fn container_path(self, parent: &str, id: &str) -> String {
        match self {
            CgroupDriver::Cgroupfs => format!("{}/{id}", parent.trim_end_matches('/')),
            CgroupDriver::Systemd => cgroups_path::systemd(parent, id),
        }
    }
}

/// Mount points of every cgroup hierarchy (each v1 controller, and the v2 unified one).
pub fn roots() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split(' ').next()?;
            let mountpoint = pre.split(' ').nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(mountpoint))
        })
        .collect()
}

/// The prefixes of `parent` (`/a`, `/a/b`, …) that exist in no hierarchy yet: the ones we will own.
pub fn missing_prefixes(parent: &str) -> Vec<String> {
    let roots = roots();
    let mut prefix = String::new();
    let mut missing = Vec::new();
    for comp in parent
        .split('/')
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
    {
        prefix.push('/');
        prefix.push_str(comp);
        if !roots.iter().any(|r| r.join(&prefix[1..]).exists()) {
            missing.push(prefix.clone());
        }
    }
    missing
}

/// Remove the directories we created, deepest first, in every hierarchy. A directory still in use
/// (another pod under a shared parent) stays.
pub fn remove(owned: &[String]) {
    let roots = roots();
    let mut owned: Vec<&String> = owned.iter().collect();
    owned.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
    for prefix in owned {
        for root in &roots {
            let dir = root.join(prefix.trim_start_matches('/'));
            match std::fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT) | Some(libc::ENOTEMPTY) | Some(libc::EBUSY)
                    ) => {}
                Err(e) => {
                    tracing::warn!(cgroup = %dir.display(), error = %e, "removing pod cgroup")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_driver_takes_parents_of_its_own_form() {
        let fs = CgroupDriver::Cgroupfs;
        let sd = CgroupDriver::Systemd;
        assert_eq!(fs.pod_parent("", "p1", "/crishim").unwrap(), "/crishim/p1");
        assert_eq!(
            fs.pod_parent("/kubepods/pod1", "p1", "/crishim").unwrap(),
            "/kubepods/pod1"
        );
        assert_eq!(
            sd.pod_parent("", "p1", "/crishim").unwrap(),
            DEFAULT_SYSTEMD_SLICE
        );
        assert_eq!(
            sd.pod_parent("kubepods-pod1.slice", "p1", "/crishim")
                .unwrap(),
            "kubepods-pod1.slice"
        );
        let e = sd
            .pod_parent("/kubepods/pod1", "p1", "/crishim")
            .unwrap_err();
        assert!(e.contains("--cgroup-driver=systemd"), "{e}");
        let e = fs
            .pod_parent("kubepods-pod1.slice", "p1", "/crishim")
            .unwrap_err();
        assert!(e.contains("--cgroup-driver=cgroupfs"), "{e}");

        assert_eq!(
            fs.container_path("/kubepods/pod1/", "c1"),
            "/kubepods/pod1/c1"
        );
        assert_eq!(
            sd.container_path("kubepods-pod1.slice", "c1"),
            "kubepods-pod1.slice:crishim:c1"
        );
    }

    #[test]
    fn prefixes_that_exist_are_not_ours() {
        if roots().is_empty() {
            return; // no cgroups mounted where the tests run
        }
        let missing = missing_prefixes("/crishim-unit-test-none/x");
        assert_eq!(
            missing,
            ["/crishim-unit-test-none", "/crishim-unit-test-none/x"]
        );
        assert!(missing_prefixes("/").is_empty());
    }
}
