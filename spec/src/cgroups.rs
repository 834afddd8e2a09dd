//! Pod cgroup parents. The kubelet creates (and removes) the parents it names; when a pod names one
//! that does not exist yet, or none at all, libcontainer creates it for the first container, and then
//! it is ours to remove with the pod. We record which directories we created and remove only those.
//! Under the systemd driver the parents are slices, which systemd makes and the kubelet removes.

use std::path::{Path, PathBuf};

use crishim_proto::cgroups_path;

use cgroups_path::check_cgroupfs_path;
/// The config's `cgroup_driver`, recorded with each pod; the cgroupsPath forms each driver takes.
pub use cgroups_path::{CgroupDriver, DEFAULT_SYSTEMD_SLICE};

/// Whether this host can use the driver: systemd's needs a cgroup v2 host (libcgroups drives
/// systemd on the unified hierarchy only) and a systemd to talk to.
pub fn check_host(driver: CgroupDriver) -> Result<(), String> {
    if driver == CgroupDriver::Cgroupfs {
        return Ok(());
    }
    if !crate::is_cgroup_v2() {
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

/// One mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub mount_point: PathBuf,
    /// The unified (v2) hierarchy.
    pub v2: bool,
    /// A v1 hierarchy's super options: its controllers (`cpu`, `name=systemd`) among others.
    options: Vec<String>,
}

/// Every mounted cgroup hierarchy (each v1 controller, and the v2 unified one), read once per
/// process: a node's hierarchies do not move, while `/proc/self/mountinfo` grows with every pod
/// (its overlay, `/dev/shm` and network namespace), so reading it per pod made pod start and stop
/// slower as pods accumulated.
pub fn roots() -> &'static [Hierarchy] {
    static ROOTS: std::sync::OnceLock<Vec<Hierarchy>> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| hierarchies(&crishim_sys::mountinfo::read()))
}

fn hierarchies(mounts: &[crishim_sys::mountinfo::Mount]) -> Vec<Hierarchy> {
    mounts
        .iter()
        .filter(|m| m.fs_type == "cgroup" || m.fs_type == "cgroup2")
        .map(|m| Hierarchy {
            mount_point: m.mount_point.clone(),
            v2: m.fs_type == "cgroup2",
            options: m.super_options.split(',').map(str::to_string).collect(),
        })
        .collect()
}

/// The cgroup directory of this process in one mounted hierarchy, from `/proc/self/cgroup`.
fn own_cgroup(proc_cgroup: &str, roots: &[Hierarchy]) -> Option<PathBuf> {
    proc_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let h = roots.iter().find(|h| {
            if controllers.is_empty() {
                h.v2
            } else {
                !h.v2
                    && controllers
                        .split(',')
                        .all(|c| h.options.iter().any(|o| o == c))
            }
        })?;
        let rel = Path::new(path).strip_prefix("/").ok()?;
        // A path with `..` (a cgroup namespace's view of an outside cgroup) names no directory here.
        rel.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
            .then(|| h.mount_point.join(rel))
    })
}

/// Keep the cgroup migration lock's fast path open for `window`, in the background.
///
/// Moving a process between cgroups takes the kernel's `cgroup_threadgroup_rwsem` for writing.
/// The first writer after a quiet spell waits for an RCU grace period (5 to 15 ms on this
/// repository's machines); writers that come while it waits, or within a grace period after the
/// last one, do not wait. (A hierarchy mounted with `favordynmods` keeps that fast path open for
/// good, at the price of a slower fork and exit on the node.) Each container's create and each
/// exec moves its first process into the container's cgroup some milliseconds after the request
/// arrives, so CreateContainer and ExecSync call this first: a thread of the daemon moves the
/// daemon into the cgroup it is already in (a no-op move that takes the same lock) every 2 ms
/// until the window closes, and the container's move finds the grace period passed.
pub fn warm_migration(window: std::time::Duration) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    use std::time::Instant;
    static UNTIL: Mutex<Option<Instant>> = Mutex::new(None);
    static RUNNING: AtomicBool = AtomicBool::new(false);
    let until = Instant::now() + window.min(std::time::Duration::from_secs(1));
    {
        let mut u = UNTIL.lock().unwrap_or_else(|e| e.into_inner());
        *u = Some(u.map_or(until, |t| t.max(until)));
    }
    if RUNNING.swap(true, Ordering::AcqRel) {
        return;
    }
    let Some(procs) = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| own_cgroup(&c, roots()))
        .map(|dir| dir.join("cgroup.procs"))
    else {
        RUNNING.store(false, Ordering::Release);
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("cgroup-warm".into())
        .spawn(move || loop {
            // "0": the writing process; into the cgroup it is in, so nothing moves.
            if let Err(e) = std::fs::write(&procs, "0") {
                tracing::debug!(cgroup = %procs.display(), error = %e, "warming the cgroup lock");
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
            let u = UNTIL.lock().unwrap_or_else(|e| e.into_inner());
            if u.is_none_or(|t| Instant::now() >= t) {
                // Under the lock: a caller that extends the window now sees RUNNING false.
                RUNNING.store(false, Ordering::Release);
                return;
            }
        });
    if spawned.is_err() {
        RUNNING.store(false, Ordering::Release);
    }
}

/// The prefixes of `parent` (`/a`, `/a/b`, …) that exist in no hierarchy yet: the ones we will own.
/// A parent that is not plain names (as [`CgroupDriver::pod_parent`] refuses; a record written
/// before it did) owns nothing: what libcontainer made for it is not where these prefixes point.
pub fn missing_prefixes(parent: &str) -> Vec<String> {
    if check_cgroupfs_path(parent).is_err() {
        return Vec::new();
    }
    let roots = roots();
    let mut prefix = String::new();
    let mut missing = Vec::new();
    for comp in parent.split('/').filter(|c| !c.is_empty()) {
        prefix.push('/');
        prefix.push_str(comp);
        if !roots
            .iter()
            .any(|r| r.mount_point.join(&prefix[1..]).exists())
        {
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
        for root in roots {
            let dir = root.mount_point.join(prefix.trim_start_matches('/'));
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

    /// `..` would take libcontainer (and the removal of what we created) out of the parent the
    /// pod names: refused at RunPodSandbox, naming the parent; nothing is owned for such a path.
    #[test]
    fn cgroupfs_parents_with_dot_components_are_refused() {
        let fs = CgroupDriver::Cgroupfs;
        for bad in [
            "/kubepods/../../../x",
            "/kubepods/./pod1",
            "..",
            "/kubepods/pod1/..",
            "/a\0b",
        ] {
            let e = fs.pod_parent(bad, "p1", "/crishim").unwrap_err();
            assert!(e.contains("cgroup_parent"), "{e}");
            assert!(e.contains(&format!("{bad:?}")), "{e}");
            assert!(missing_prefixes(bad).is_empty(), "{bad}");
        }
        // Empty components name nothing and stay accepted.
        assert_eq!(
            fs.pod_parent("/kubepods//pod1/", "p1", "/crishim").unwrap(),
            "/kubepods//pod1/"
        );
        assert_eq!(
            missing_prefixes("/crishim-unit-test-none//x/"),
            ["/crishim-unit-test-none", "/crishim-unit-test-none/x"]
        );
    }

    #[test]
    fn roots_are_the_cgroup_mounts() {
        let info = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                    32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                    90 23 0:50 / /run/x rw - overlay overlay rw\n\
                    junk\n";
        let roots = hierarchies(&crishim_sys::mountinfo::parse(info));
        let points: Vec<_> = roots.iter().map(|h| h.mount_point.clone()).collect();
        assert_eq!(
            points,
            [
                PathBuf::from("/sys/fs/cgroup/cpu"),
                PathBuf::from("/sys/fs/cgroup/unified")
            ]
        );
        assert_eq!(
            (roots[0].v2, roots[1].v2),
            (false, true),
            "the unified hierarchy is told apart"
        );
    }

    #[test]
    fn own_cgroup_is_found_in_the_matching_hierarchy_only() {
        let info = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                    33 31 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let roots = hierarchies(&crishim_sys::mountinfo::parse(info));
        // A hierarchy not mounted here (pids) is skipped; co-mounted controllers match theirs.
        assert_eq!(
            own_cgroup("9:pids:/a\n4:cpu,cpuacct:/system.slice/x\n", &roots),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/system.slice/x"))
        );
        assert_eq!(
            own_cgroup("0::/user.slice\n", &roots),
            Some(PathBuf::from("/sys/fs/cgroup/unified/user.slice"))
        );
        // `cpu` alone must not match a line naming `cpu,blkio`.
        assert_eq!(own_cgroup("5:cpu,blkio:/a\n", &roots), None);
        // Outside our cgroup namespace: no directory of ours to name.
        assert_eq!(own_cgroup("6:memory:/../../other\n", &roots), None);
        assert_eq!(own_cgroup("junk\n7:memory\n", &roots), None);
    }

    #[test]
    fn warming_leaves_the_process_where_it_was() {
        let before = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        warm_migration(std::time::Duration::from_millis(10));
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert_eq!(
            std::fs::read_to_string("/proc/self/cgroup").unwrap(),
            before
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
