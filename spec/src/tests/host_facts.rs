//! The node's facts (`HostFacts`): what is read once, and what for every spec.

use super::*;

#[test]
fn cgroup_v1_hierarchies_are_the_ones_libcgroups_makes_cgroups_in() {
    let dir = tempfile::tempdir().unwrap();
    for d in [
        "cpu,cpuacct",
        "memory",
        "systemd",
        "unified",
        "rdma",
        "net_cls,net_prio",
    ] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    for (link, to) in [
        ("cpu", "cpu,cpuacct"),
        ("cpuacct", "cpu,cpuacct"),
        ("net_cls", "net_cls,net_prio"),
    ] {
        std::os::unix::fs::symlink(to, dir.path().join(link)).unwrap();
    }
    assert_eq!(
        super::host::cgroup_v1_dirs(dir.path()),
        vec![
            (
                "cpu,cpuacct".to_string(),
                vec!["cpu".to_string(), "cpuacct".to_string()]
            ),
            ("memory".to_string(), vec![]),
            ("net_cls,net_prio".to_string(), vec!["net_cls".to_string()]),
        ]
    );
}

#[test]
fn cgroup_v2_is_detected_from_the_filesystem_at_the_cgroup_root() {
    // On a v1 or hybrid node /sys/fs/cgroup is a tmpfs (cgroup2 at most at .../unified), so no
    // cgroup namespace there.
    let root_is_cgroup2 = nix::sys::statfs::statfs("/sys/fs/cgroup")
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC);
    assert_eq!(HostFacts::detect().cgroup_v2, root_is_cgroup2);
}

/// The fixed facts are read once; the hostname is read for each spec. A thread with a UTS
/// namespace of its own renames the node: it sees the new name, and the same fixed facts.
#[test]
fn the_node_hostname_is_read_for_each_spec_while_the_fixed_facts_are_kept() {
    if !nix::unistd::Uid::effective().is_root() {
        return;
    }
    let before = HostFacts::detect();
    let seen = std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUTS).ok()?;
        nix::unistd::sethostname("crishim-renamed-node").ok()?;
        Some(HostFacts::detect())
    })
    .join()
    .unwrap()
    .expect("a UTS namespace for the thread");
    assert_eq!(seen.hostname, "crishim-renamed-node");
    assert_ne!(before.hostname, seen.hostname);
    assert_eq!(
        (seen.cgroup_v2, seen.cgroup_v1_dirs, seen.nofile_hard),
        (before.cgroup_v2, before.cgroup_v1_dirs, before.nofile_hard)
    );
}

/// The NOFILE ceiling is the daemon's hard limit as it is now, unless the daemon may raise it.
#[test]
fn the_nofile_ceiling_is_the_current_hard_limit_without_cap_sys_resource() {
    let hard = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .unwrap()
        .1;
    let none = oci_spec::runtime::Capabilities::new();
    assert_eq!(super::host::nofile_ceiling(&none), Some(hard));
    let may_raise = oci_spec::runtime::Capabilities::from([Capability::SysResource]);
    assert_eq!(super::host::nofile_ceiling(&may_raise), None);
}
