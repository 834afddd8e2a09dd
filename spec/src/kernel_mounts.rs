//! CRI mounts at the container's `/proc` and `/sys`: refused unless their source is that same
//! kernel filesystem.
//!
//! The shim writes the SELinux process label to `/proc/thread-self/attr/exec` inside the
//! container's mounts. A volume at `/proc` (an `emptyDir` an init container filled with
//! `thread-self/attr/exec`) would take that write and the workload would run unlabelled (runc's
//! CVE-2019-16884); a volume under `/sys` can stand in for the kernel's own files there
//! (`/sys/fs/selinux/enforce`). The shim writes labels only through a verified procfs handle
//! (`shim/src/lsm_attr.rs`); this refuses such mounts at `CreateContainer` besides, with the
//! mount named.
//!
//! What is allowed, after the container path is cleaned lexically (`//proc`, `/proc/`,
//! `/proc/../proc` are all `/proc`):
//! - at `/proc` or beneath it: a procfs source only (a hostPath of the node's `/proc` or a
//!   part of it, as containerd and runc allow). An lxcfs file over `/proc/meminfo` is refused.
//! - at `/sys`: a sysfs source only. Beneath `/sys`: sysfs, or one of the kernel filesystems
//!   the node itself mounts beneath its `/sys` (cgroup, cgroup2, bpf, securityfs, selinuxfs,
//!   smackfs, debugfs, tracefs, resctrl), so that a CNI agent's hostPath of `/sys/fs/bpf` at
//!   `/sys/fs/bpf` keeps working: none of those holds a regular file a workload can write. And
//!   any source that is the node's own `/sys` or beneath it (on a cgroup v1 node
//!   `/sys/fs/cgroup` is a tmpfs).
//! - at `/`: nothing (a mount there would hide the container's `/proc` and `/sys`).
//! - an image volume (KEP-4639) at either: never (its content is an image's files).
//!
//! A host path that does not exist is left to the mount's own check, which refuses it.

use crishim_proto::cri;
use nix::sys::statfs::{self, FsType};

use super::mounts::clean;
use super::SpecError;

/// The kernel filesystems accepted beneath (not at) the container's `/sys`.
const BENEATH_SYS: [FsType; 10] = [
    statfs::SYSFS_MAGIC,
    statfs::CGROUP_SUPER_MAGIC,
    statfs::CGROUP2_SUPER_MAGIC,
    statfs::BPF_FS_MAGIC,
    statfs::SECURITYFS_MAGIC,
    statfs::SELINUX_MAGIC,
    statfs::SMACK_MAGIC,
    statfs::DEBUGFS_MAGIC,
    statfs::TRACEFS_MAGIC,
    statfs::RDTGROUP_SUPER_MAGIC,
];

/// Which of the container's kernel trees a cleaned container path falls in.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Tree {
    /// `/`: over both.
    Root,
    Proc,
    /// `/sys` itself.
    Sys,
    BeneathSys,
}

fn tree(clean_path: &str) -> Option<Tree> {
    let within = |top: &str| {
        clean_path == top
            || clean_path
                .strip_prefix(top)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    match clean_path {
        "/" => Some(Tree::Root),
        "/sys" => Some(Tree::Sys),
        _ if within("/proc") => Some(Tree::Proc),
        _ if within("/sys") => Some(Tree::BeneathSys),
        _ => None,
    }
}

/// Refuse every CRI mount at the container's `/proc` or `/sys` whose source is not that kernel
/// filesystem (see the module's doc). `InvalidArgument`, naming the mount.
pub(super) fn check(config: &cri::ContainerConfig) -> Result<(), SpecError> {
    config.mounts.iter().try_for_each(check_one)
}

fn check_one(m: &cri::Mount) -> Result<(), SpecError> {
    // A relative container path is refused by the mount's own check.
    if !m.container_path.starts_with('/') {
        return Ok(());
    }
    let path = clean(&m.container_path);
    let Some(tree) = tree(&path) else {
        return Ok(());
    };
    let named = || {
        if super::mounts::is_image_volume(m) {
            format!("image volume mount at {:?}", m.container_path)
        } else {
            format!(
                "mount at {:?} (host path {:?})",
                m.container_path, m.host_path
            )
        }
    };
    let (want, accepted): (&str, &[FsType]) = match tree {
        Tree::Root => {
            return Err(SpecError::Invalid(format!(
                "{}: a mount at / would hide the container's /proc and /sys",
                named()
            )))
        }
        Tree::Proc => ("procfs", &[statfs::PROC_SUPER_MAGIC]),
        Tree::Sys => ("sysfs", &[statfs::SYSFS_MAGIC]),
        Tree::BeneathSys => ("sysfs or a kernel filesystem of /sys", &BENEATH_SYS),
    };
    let top = if tree == Tree::Proc { "/proc" } else { "/sys" };
    if super::mounts::is_image_volume(m) {
        return Err(SpecError::Invalid(format!(
            "{}: {path} is within the container's {top}, where only {want} may be mounted, \
             not an image's files",
            named()
        )));
    }
    if m.host_path.is_empty() {
        return Ok(());
    }
    let fs = match statfs::statfs(m.host_path.as_str()) {
        Ok(fs) => fs.filesystem_type(),
        Err(nix::errno::Errno::ENOENT) => return Ok(()),
        Err(e) => {
            return Err(SpecError::Invalid(format!(
                "{}: checking the source's filesystem: {e}",
                named()
            )))
        }
    };
    // Beneath /sys, the node's own files beneath its /sys too: on a cgroup v1 node its
    // /sys/fs/cgroup is a tmpfs (of systemd's), which no workload can write to.
    let nodes_own = || std::fs::canonicalize(&m.host_path).is_ok_and(|p| p.starts_with("/sys"));
    let allowed = accepted.contains(&fs) || (tree == Tree::BeneathSys && nodes_own());
    if !allowed {
        return Err(SpecError::Invalid(format!(
            "{}: {path} is within the container's {top}, where only {want} may be mounted; the \
             source's filesystem (type {:#x}) could stand in for the kernel's files",
            named(),
            fs.0
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(container_path: &str, host_path: &str) -> cri::Mount {
        cri::Mount {
            container_path: container_path.to_string(),
            host_path: host_path.to_string(),
            ..Default::default()
        }
    }

    #[test]
    fn container_paths_are_cleaned_before_they_are_placed() {
        for p in [
            "/proc",
            "/proc/",
            "//proc",
            "/./proc",
            "/proc/../proc",
            "/tmp/../proc",
            "/proc/self/attr",
            "/proc/thread-self/attr/exec",
            "/proc/1/task/1/attr",
        ] {
            assert_eq!(tree(&clean(p)), Some(Tree::Proc), "{p}");
        }
        for p in ["/sys", "/sys/", "//sys//", "/sys/fs/..", "/proc/../sys"] {
            assert_eq!(tree(&clean(p)), Some(Tree::Sys), "{p}");
        }
        for p in ["/sys/fs/selinux", "/sys/fs/selinux/", "//sys/./fs/selinux"] {
            assert_eq!(tree(&clean(p)), Some(Tree::BeneathSys), "{p}");
        }
        for p in ["/", "//", "/proc/..", "/sys/../.."] {
            assert_eq!(tree(&clean(p)), Some(Tree::Root), "{p}");
        }
        for p in [
            "/procfs",
            "/proc2/attr",
            "/system",
            "/data/proc",
            "/host/sys",
        ] {
            assert_eq!(tree(&clean(p)), None, "{p}");
        }
    }

    // A host directory holding thread-self/attr/exec as a regular file: what a volume over
    // /proc would bring. Refused at each form of the path, and at /sys and beneath it.
    #[test]
    fn a_directory_over_proc_or_sys_is_refused_naming_the_mount() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("thread-self/attr")).unwrap();
        std::fs::write(dir.path().join("thread-self/attr/exec"), "").unwrap();
        let host = dir.path().to_str().unwrap();
        for p in [
            "/proc",
            "/proc/",
            "//proc",
            "/proc/../proc",
            "/proc/self/attr",
            "/sys",
            "/sys/fs/selinux",
            "//sys/fs/selinux/",
            "/",
        ] {
            let SpecError::Invalid(e) = check_one(&mount(p, host)).unwrap_err() else {
                panic!("{p}: not InvalidArgument");
            };
            assert!(
                e.contains(&format!("{p:?}")) && e.contains(host),
                "{p}: {e}"
            );
        }
    }

    #[test]
    fn the_kernel_filesystems_themselves_are_allowed() {
        for (at, source) in [
            ("/proc", "/proc"),
            ("/proc/", "/proc"),
            ("/proc/sys", "/proc/sys"),
            ("/sys", "/sys"),
            ("/sys/fs/selinux", "/sys"),
            ("/host/proc", "/tmp"),
            ("/data", "/tmp"),
        ] {
            check_one(&mount(at, source)).unwrap_or_else(|e| panic!("{at} from {source}: {e:?}"));
        }
        // The node's own cgroup tree beneath /sys (a tmpfs on this cgroup v1 machine).
        if std::path::Path::new("/sys/fs/cgroup").is_dir() {
            check_one(&mount("/sys/fs/cgroup", "/sys/fs/cgroup")).unwrap();
        }
        // The node's own /sys beneath the container's, but not at /proc.
        check_one(&mount("/sys/fs/selinux", "/sys/kernel")).unwrap();
        assert!(check_one(&mount("/proc/self", "/sys/kernel")).is_err());
        // procfs is not sysfs, nor the other way round.
        assert!(check_one(&mount("/sys", "/proc")).is_err());
        assert!(check_one(&mount("/proc", "/sys")).is_err());
        assert!(check_one(&mount("/sys/fs/selinux", "/proc")).is_err());
        // A missing host path is the mount's own check's to refuse; a relative path too.
        check_one(&mount("/proc", "/nonexistent/crishim-test")).unwrap();
        check_one(&mount("proc", "/tmp")).unwrap();
    }

    #[test]
    fn an_image_volume_over_proc_is_refused() {
        let mut m = mount("/proc/../proc", "");
        m.image = Some(cri::ImageSpec {
            image: "busybox".into(),
            ..Default::default()
        });
        let SpecError::Invalid(e) = check_one(&m).unwrap_err() else {
            panic!("not InvalidArgument");
        };
        assert!(e.contains("image volume") && e.contains("/proc"), "{e}");
    }
}
