//! Mounts: the defaults, the pod's files, the CRI's binds, and cgroup v1 binds in the pod's pid
//! namespace.

use super::*;
use std::os::unix::fs::symlink;

#[test]
fn default_mounts_are_containerds() {
    let spec = Fixture::new().spec();
    assert_eq!(
        destinations(&spec),
        strings(&[
            "/proc",
            "/dev",
            "/dev/pts",
            "/dev/shm",
            "/dev/mqueue",
            "/sys",
            "/sys/fs/cgroup"
        ])
    );
    let shm = mount_at(&spec, "/dev/shm");
    assert_eq!(shm.typ().as_deref(), Some("tmpfs"));
    assert_eq!(
        options(mount_at(&spec, "/sys")),
        strings(&["nosuid", "noexec", "nodev", "ro"])
    );
    let cgroup = mount_at(&spec, "/sys/fs/cgroup");
    assert_eq!(cgroup.typ().as_deref(), Some("cgroup"));
    assert!(options(cgroup).contains(&"ro".to_string()));
    assert_eq!(
        options(mount_at(&spec, "/dev/pts")).last().unwrap(),
        "gid=5"
    );
}

fn pod_files(dir: &Path) -> PodFiles {
    for name in ["hostname", "hosts", "resolv.conf"] {
        write(dir, name, "x\n");
    }
    std::fs::create_dir_all(dir.join("shm")).unwrap();
    PodFiles {
        hostname: Some(dir.join("hostname")),
        resolv_conf: Some(dir.join("resolv.conf")),
        hosts: Some(dir.join("hosts")),
        shm: Some(dir.join("shm")),
    }
}

#[test]
fn pod_files_are_bind_mounted_and_replace_the_shm_tmpfs() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.files = pod_files(dir.path());
    let spec = f.spec();
    for (dest, file) in [
        ("/etc/hostname", "hostname"),
        ("/etc/hosts", "hosts"),
        ("/etc/resolv.conf", "resolv.conf"),
        ("/dev/shm", "shm"),
    ] {
        let m = mount_at(&spec, dest);
        assert_eq!(m.typ().as_deref(), Some("bind"));
        assert_eq!(
            m.source().as_deref(),
            Some(dir.path().canonicalize().unwrap().join(file).as_path())
        );
        assert_eq!(options(m), strings(&["rbind", "rprivate", "rw"]), "{dest}");
    }
    assert_eq!(
        mounts(&spec)
            .iter()
            .filter(|m| m.destination() == Path::new("/dev/shm"))
            .count(),
        1
    );
}

#[test]
fn pod_etc_files_are_read_only_with_a_read_only_rootfs_but_shm_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.files = pod_files(dir.path());
    f.sc().readonly_rootfs = true;
    let spec = f.spec();
    assert_eq!(options(mount_at(&spec, "/etc/hosts")).last().unwrap(), "ro");
    assert_eq!(
        options(mount_at(&spec, "/etc/resolv.conf")).last().unwrap(),
        "ro"
    );
    assert_eq!(options(mount_at(&spec, "/dev/shm")).last().unwrap(), "rw");
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
}

#[test]
fn pod_file_is_skipped_when_the_container_mounts_that_path() {
    let dir = tempfile::tempdir().unwrap();
    let own = tempfile::tempdir().unwrap();
    write(own.path(), "hosts", "127.0.0.1 mine\n");
    let mut f = Fixture::new();
    f.files = pod_files(dir.path());
    f.add_mount("/etc/hosts", &own.path().join("hosts"));
    let spec = f.spec();
    let hosts: Vec<_> = mounts(&spec)
        .iter()
        .filter(|m| m.destination() == Path::new("/etc/hosts"))
        .collect();
    assert_eq!(hosts.len(), 1);
    assert_eq!(
        hosts[0].source().as_deref(),
        Some(own.path().canonicalize().unwrap().join("hosts").as_path())
    );
}

#[test]
fn cri_bind_mounts_get_rbind_access_and_propagation() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.add_mount("/data", dir.path()).readonly = true;
    f.add_mount("/logs", dir.path());
    let spec = f.spec();
    assert_eq!(
        options(mount_at(&spec, "/data")),
        strings(&["rbind", "rprivate", "ro"])
    );
    assert_eq!(
        options(mount_at(&spec, "/logs")),
        strings(&["rbind", "rprivate", "rw"])
    );
    assert_eq!(
        mount_at(&spec, "/data").source().as_deref(),
        Some(dir.path().canonicalize().unwrap().as_path())
    );
    assert_eq!(linux(&spec).rootfs_propagation(), &None);
}

#[test]
fn propagation_modes_map_to_rslave_and_rshared_and_set_rootfs_propagation() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.add_mount("/slave", dir.path()).propagation =
        cri::MountPropagation::PropagationHostToContainer as i32;
    let spec = f.spec();
    assert_eq!(
        options(mount_at(&spec, "/slave")),
        strings(&["rbind", "rslave", "rw"])
    );
    assert_eq!(linux(&spec).rootfs_propagation().as_deref(), Some("slave"));

    // A bidirectional mount makes the rootfs shared, whatever order the mounts come in.
    f.add_mount("/shared", dir.path()).propagation =
        cri::MountPropagation::PropagationBidirectional as i32;
    f.add_mount("/slave2", dir.path()).propagation =
        cri::MountPropagation::PropagationHostToContainer as i32;
    let spec = f.spec();
    assert_eq!(
        options(mount_at(&spec, "/shared")),
        strings(&["rbind", "rshared", "rw"])
    );
    assert_eq!(linux(&spec).rootfs_propagation().as_deref(), Some("shared"));
}

#[test]
fn recursive_read_only_mounts_use_rro() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    let m = f.add_mount("/data", dir.path());
    m.readonly = true;
    m.recursive_read_only = true;
    assert_eq!(
        options(mount_at(&f.spec(), "/data")),
        strings(&["rbind", "rprivate", "rro"])
    );
    f.config.mounts[0].readonly = false;
    assert!(f.invalid().contains("recursive read-only"));
}

#[test]
fn mount_options_that_only_take_away_are_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.add_mount("/data", dir.path()).mount_options =
        strings(&["noexec", "nodev", "nosuid", "noexec"]);
    f.add_mount("/ro", dir.path()).mount_options = strings(&["ro"]);
    let spec = f.spec();
    assert_eq!(
        options(mount_at(&spec, "/data")),
        strings(&["rbind", "rprivate", "rw", "noexec", "nodev", "nosuid"])
    );
    assert_eq!(
        options(mount_at(&spec, "/ro")),
        strings(&["rbind", "rprivate", "ro"])
    );
}

#[test]
fn mount_options_that_are_unknown_or_would_weaken_a_mount_are_refused_and_named() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [
        "exec",
        "suid",
        "dev",
        "rw",
        "shared",
        "remount",
        "mode=777",
        "nosuid,exec",
        "",
    ] {
        let mut f = Fixture::new();
        f.add_mount("/data", dir.path()).mount_options = strings(&["nodev", bad]);
        let e = f.invalid();
        assert!(
            e.contains("/data") && e.contains("not allowed"),
            "{bad:?}: {e}"
        );
    }
    let mut f = Fixture::new();
    f.add_mount("/data", dir.path()).mount_options = vec!["nodev".to_string(); 17];
    assert!(f.invalid().contains("over the limit"));
}

#[test]
fn relative_container_path_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.add_mount("data", dir.path());
    assert!(f.invalid().contains("\"data\" is not absolute"));
}

#[test]
fn missing_host_path_is_invalid_and_named() {
    let mut f = Fixture::new();
    f.add_mount("/data", Path::new("/nonexistent/crishim-volume"));
    assert!(f.invalid().contains("/nonexistent/crishim-volume"));
}

#[test]
fn host_path_symlinks_are_resolved() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("real")).unwrap();
    symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
    let mut f = Fixture::new();
    f.add_mount("/data", &dir.path().join("link"));
    let real = dir.path().canonicalize().unwrap().join("real");
    assert_eq!(
        mount_at(&f.spec(), "/data").source().as_deref(),
        Some(real.as_path())
    );
}

#[test]
fn user_mounts_are_sorted_parents_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.add_mount("/a/b/c", dir.path());
    f.add_mount("/a/b", dir.path());
    f.add_mount("/z", dir.path());
    f.add_mount("/a", dir.path());
    let dests = destinations(&f.spec());
    let user: Vec<_> = dests.iter().skip(7).map(String::as_str).collect();
    assert_eq!(user, ["/z", "/a", "/a/b", "/a/b/c"]);
}

#[test]
fn mounting_dev_drops_the_default_mounts_under_dev() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.add_mount("/dev", dir.path());
    let dests = destinations(&f.spec());
    assert_eq!(dests, strings(&["/proc", "/sys", "/sys/fs/cgroup", "/dev"]));
}

#[test]
fn joining_the_pods_pid_namespace_on_cgroup_v1_binds_the_containers_own_cgroups() {
    let cgroup_mounts = |spec: &Spec| -> Vec<(String, String, String)> {
        spec.mounts()
            .as_ref()
            .unwrap()
            .iter()
            .filter(|m| m.destination().starts_with("/sys/fs/cgroup"))
            .map(|m| {
                (
                    m.destination().display().to_string(),
                    m.typ().clone().unwrap_or_default(),
                    m.source()
                        .as_ref()
                        .map(|s| s.display().to_string())
                        .unwrap_or_default(),
                )
            })
            .collect()
    };
    let mut f = Fixture::new();
    let plain = vec![("/sys/fs/cgroup".into(), "cgroup".into(), "cgroup".into())];
    assert_eq!(cgroup_mounts(&f.spec()), plain, "own pid namespace");
    f.namespaces.pid = Some("/proc/100/ns/pid".into());
    let own = "/kubepods/besteffort/poduid-1/c1";
    let bind = |dest: &str, dir: &str| {
        (
            format!("/sys/fs/cgroup/{dest}"),
            "bind".to_string(),
            format!("/sys/fs/cgroup/{dir}{own}"),
        )
    };
    let spec = f.spec();
    assert_eq!(
        cgroup_mounts(&spec),
        vec![
            ("/sys/fs/cgroup".into(), "tmpfs".into(), "tmpfs".into()),
            bind("cpu,cpuacct", "cpu,cpuacct"),
            bind("cpu", "cpu,cpuacct"),
            bind("cpuacct", "cpu,cpuacct"),
            bind("memory", "memory"),
        ]
    );
    let opts = spec.mounts().as_ref().unwrap()[spec
        .mounts()
        .as_ref()
        .unwrap()
        .iter()
        .position(|m| m.destination() == Path::new("/sys/fs/cgroup/memory"))
        .unwrap()]
    .options()
    .clone()
    .unwrap();
    assert!(opts.contains(&"ro".to_string()), "{opts:?}");
    f.host.cgroup_v2 = true;
    assert_eq!(cgroup_mounts(&f.spec()), plain, "v2 mounts cgroup2 itself");
}
