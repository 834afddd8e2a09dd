//! The OCI `linux.cgroupsPath` forms crishim writes, read by the daemon (stats) and the shim
//! (libcontainer, OOM checks): a cgroupfs path `/a/b/<id>`, or with the systemd driver
//! `<slice>:crishim:<id>`, the transient scope `crishim-<id>.scope` inside `<slice>`.

/// The scope prefix of crishim's containers under the systemd driver (`crishim-<id>.scope`).
pub const SYSTEMD_SCOPE_PREFIX: &str = "crishim";

/// The cgroupsPath of container `id` in pod slice `slice` under the systemd driver.
pub fn systemd(slice: &str, id: &str) -> String {
    format!("{slice}:{SYSTEMD_SCOPE_PREFIX}:{id}")
}

/// `cgroup_driver` in the config: who makes pod and container cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    #[default]
    Cgroupfs,
    Systemd,
}

/// The pod cgroup parent under the systemd driver when the pod names none.
pub const DEFAULT_SYSTEMD_SLICE: &str = "crishim.slice";

impl CgroupDriver {
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
            (CgroupDriver::Systemd, slice) if is_slice_name(slice) => Ok(slice.to_string()),
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
            (CgroupDriver::Cgroupfs, path) => {
                check_cgroupfs_path(path)?;
                Ok(path.to_string())
            }
        }
    }

    /// The OCI cgroupsPath of container `id` in a pod whose parent is `parent`.
    pub fn container_path(self, parent: &str, id: &str) -> String {
        match self {
            CgroupDriver::Cgroupfs => format!("{}/{id}", parent.trim_end_matches('/')),
            CgroupDriver::Systemd => systemd(parent, id),
        }
    }
}

/// A cgroupfs parent names directories below each hierarchy's root, component by component: a
/// `.` or `..` would make libcontainer create (and the daemon remove) cgroups elsewhere than the
/// ones it records as its own, so it is refused, as is a NUL. Empty components (`//`, a
/// trailing `/`) name nothing and are harmless.
pub fn check_cgroupfs_path(path: &str) -> Result<(), String> {
    if let Some(bad) = path.split('/').find(|c| matches!(*c, "." | "..")) {
        return Err(format!(
            "cgroup_parent {path:?} has a {bad:?} component; a cgroupfs parent is a path of plain \
             names (like /kubepods/burstable/pod<uid>)"
        ));
    }
    if path.contains('\0') {
        return Err(format!("cgroup_parent {path:?} holds a NUL byte"));
    }
    Ok(())
}

/// Whether `path` is the systemd form `slice:prefix:name`.
pub fn is_systemd(path: &str) -> bool {
    !path.starts_with('/') && path.split(':').count() == 3
}

/// Whether `name` is a slice unit name systemd accepts: `a-b-c.slice` (or the root `-.slice`),
/// with no empty dash-separated part and only unit-name characters.
pub fn is_slice_name(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".slice") else {
        return false;
    };
    stem == "-"
        || (!stem.is_empty()
            && stem.split('-').all(|part| !part.is_empty())
            && stem
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:\\".contains(&b)))
}

/// Where systemd puts slice `name`: `a-b.slice` is `/a.slice/a-b.slice`. `None` for a name that
/// is not a slice.
pub fn expand_slice(name: &str) -> Option<String> {
    if !is_slice_name(name) {
        return None;
    }
    let stem = name.trim_end_matches(".slice");
    if stem == "-" {
        return Some(String::new());
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        prefix.push_str(part);
        path.push_str(&format!("/{prefix}.slice"));
        prefix.push('-');
    }
    Some(path)
}

/// The cgroup directory `path` names, relative to a hierarchy's root (`/a/b`): a cgroupfs path as
/// it is, a bare slice name expanded, and the systemd form as its scope inside the expanded slice.
/// `None` for a malformed systemd form.
pub fn dir(path: &str) -> Option<String> {
    if is_systemd(path) {
        let mut parts = path.splitn(3, ':');
        let (slice, prefix, name) = (parts.next()?, parts.next()?, parts.next()?);
        let unit = if name.ends_with(".slice") {
            name.to_string()
        } else {
            format!("{prefix}-{name}.scope")
        };
        return Some(format!("{}/{unit}", expand_slice(slice)?));
    }
    if !path.starts_with('/') && path.ends_with(".slice") {
        return expand_slice(path);
    }
    Some(path.to_string())
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
    fn slices_expand_the_way_systemd_nests_them() {
        assert_eq!(
            expand_slice("kubepods-besteffort-pod1_2.slice").as_deref(),
            Some("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1_2.slice")
        );
        assert_eq!(expand_slice("-.slice").as_deref(), Some(""));
        for bad in [
            "kubepods",
            "a--b.slice",
            "-a.slice",
            ".slice",
            "a/b.slice",
            "a b.slice",
        ] {
            assert_eq!(expand_slice(bad), None, "{bad}");
        }
    }

    #[test]
    fn each_form_names_its_directory() {
        let path = systemd("kubepods-pod9.slice", "abc");
        assert_eq!(path, "kubepods-pod9.slice:crishim:abc");
        assert!(is_systemd(&path));
        assert_eq!(
            dir(&path).as_deref(),
            Some("/kubepods.slice/kubepods-pod9.slice/crishim-abc.scope")
        );
        assert_eq!(dir("crishim.slice").as_deref(), Some("/crishim.slice"));
        assert_eq!(
            dir("/kubepods/pod9/abc").as_deref(),
            Some("/kubepods/pod9/abc")
        );
        assert!(!is_systemd("/kubepods/pod9/abc"));
        assert_eq!(dir("bad:crishim:abc"), None);
    }
}
