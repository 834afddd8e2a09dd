use super::*;
use crate::merge::Merge;

/// A container's spec as a runtime makes one: oci-spec's defaults (process, default mounts
/// and namespaces, an rlimit) plus resources, a device and a cgroups path.
fn spec() -> Spec {
    let mut spec = Spec::default();
    let p = spec.process_mut().as_mut().unwrap();
    p.set_args(Some(vec!["/app".into(), "--serve".into()]));
    p.set_env(Some(vec![
        "PATH=/usr/bin:/bin".into(),
        "HOME=/root".into(),
        "LANG=C".into(),
    ]));
    p.set_oom_score_adj(Some(-998));
    let l = spec.linux_mut().as_mut().unwrap();
    l.set_cgroups_path(Some("/kubepods/pod1/ctr".into()));
    let mut null = LinuxDevice::default();
    null.set_path("/dev/fuse".into())
        .set_typ(LinuxDeviceType::C)
        .set_major(10)
        .set_minor(229);
    let rule = LinuxDeviceCgroup::from(&null);
    l.set_devices(Some(vec![null]));
    let mut deny = LinuxDeviceCgroup::default();
    deny.set_allow(false).set_access(Some("rwm".into()));
    l.set_resources(Some(resources_to_oci(&api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: Some(api::OptionalInt64 { value: 1 << 30 }),
            swap: Some(api::OptionalInt64 { value: 1 << 30 }),
            ..Default::default()
        }),
        cpu: Some(api::LinuxCpu {
            shares: Some(api::OptionalUInt64 { value: 1024 }),
            ..Default::default()
        }),
        ..Default::default()
    })));
    let r = l.resources_mut().as_mut().unwrap();
    r.set_devices(Some(vec![deny, rule]));
    spec.set_annotations(Some(
        [(
            "io.kubernetes.cri.container-type".into(),
            "container".into(),
        )]
        .into(),
    ));
    spec
}

fn adjust(f: impl FnOnce(&mut api::ContainerAdjustment)) -> api::ContainerAdjustment {
    let mut a = api::ContainerAdjustment::default();
    f(&mut a);
    a
}

fn linux_adj(f: impl FnOnce(&mut api::LinuxContainerAdjustment)) -> api::ContainerAdjustment {
    adjust(|a| f(a.linux.get_or_insert_default()))
}

fn applied(a: &api::ContainerAdjustment) -> Spec {
    let mut s = spec();
    apply(&mut s, a).unwrap();
    s
}

fn env_of(s: &Spec) -> Vec<String> {
    s.process().as_ref().unwrap().env().clone().unwrap()
}

fn kv(k: &str, v: &str) -> api::KeyValue {
    api::KeyValue {
        key: k.into(),
        value: v.into(),
    }
}

fn linux_of(s: &Spec) -> &Linux {
    s.linux().as_ref().unwrap()
}

fn resources_of(s: &Spec) -> &oci::LinuxResources {
    linux_of(s).resources().as_ref().unwrap()
}

#[test]
fn the_container_view_carries_the_spec() {
    let meta = ContainerMeta {
        id: "c1".into(),
        pod_sandbox_id: "p1".into(),
        name: "app".into(),
        state: api::ContainerState::ContainerCreated,
        labels: [("app".into(), "web".into())].into(),
        created_at: 42,
        pid: 7,
        ..Default::default()
    };
    let c = container(&spec(), meta);
    assert_eq!(
        (c.id.as_str(), c.pod_sandbox_id.as_str(), c.name.as_str()),
        ("c1", "p1", "app")
    );
    assert_eq!(c.state, api::ContainerState::ContainerCreated as i32);
    assert_eq!(c.labels["app"], "web");
    assert_eq!((c.created_at, c.pid), (42, 7));
    assert_eq!(c.args, ["/app", "--serve"]);
    assert_eq!(c.env.len(), 3);
    assert_eq!(
        c.annotations["io.kubernetes.cri.container-type"],
        "container"
    );
    assert!(c
        .mounts
        .iter()
        .any(|m| m.destination == "/proc" && m.r#type == "proc"));
    assert_eq!(c.rlimits[0].r#type, "RLIMIT_NOFILE");
    assert_eq!(c.user.unwrap().uid, 0);
    let l = c.linux.unwrap();
    let ns: Vec<_> = l.namespaces.iter().map(|n| n.r#type.as_str()).collect();
    assert!(
        ns.contains(&"network") && ns.contains(&"mount") && ns.contains(&"pid"),
        "{ns:?}"
    );
    assert_eq!(l.devices[0].path, "/dev/fuse");
    assert_eq!((l.devices[0].major, l.devices[0].minor), (10, 229));
    assert_eq!(l.cgroups_path, "/kubepods/pod1/ctr");
    assert_eq!(l.oom_score_adj.unwrap().value, -998);
    let r = l.resources.unwrap();
    assert_eq!(r.memory.unwrap().limit.unwrap().value, 1 << 30);
    assert_eq!(r.cpu.unwrap().shares.unwrap().value, 1024);
    assert_eq!(r.devices.len(), 2);
}

#[test]
fn resources_round_trip() {
    let r = api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: Some(api::OptionalInt64 { value: 100 }),
            reservation: Some(api::OptionalInt64 { value: 50 }),
            swap: Some(api::OptionalInt64 { value: 200 }),
            kernel: None,
            kernel_tcp: Some(api::OptionalInt64 { value: 9 }),
            swappiness: Some(api::OptionalUInt64 { value: 60 }),
            disable_oom_killer: Some(api::OptionalBool { value: true }),
            use_hierarchy: Some(api::OptionalBool { value: false }),
        }),
        cpu: Some(api::LinuxCpu {
            shares: Some(api::OptionalUInt64 { value: 2 }),
            quota: Some(api::OptionalInt64 { value: 50_000 }),
            period: Some(api::OptionalUInt64 { value: 100_000 }),
            realtime_runtime: Some(api::OptionalInt64 { value: 1 }),
            realtime_period: Some(api::OptionalUInt64 { value: 2 }),
            cpus: "0-3".into(),
            mems: "0".into(),
        }),
        hugepage_limits: vec![api::HugepageLimit {
            page_size: "2MB".into(),
            limit: 1 << 21,
        }],
        blockio_class: None,
        rdt_class: None,
        unified: [("memory.high".into(), "1G".into())].into(),
        devices: vec![api::LinuxDeviceCgroup {
            allow: true,
            r#type: "c".into(),
            major: Some(api::OptionalInt64 { value: 1 }),
            minor: None,
            access: "rw".into(),
        }],
        pids: Some(api::LinuxPids { limit: 10 }),
    };
    assert_eq!(resources_from_oci(&resources_to_oci(&r)), r);
}

#[test]
fn a_device_rule_of_unknown_type_does_not_become_all_devices() {
    let r = resources_to_oci(&api::LinuxResources {
        devices: vec![api::LinuxDeviceCgroup {
            allow: true,
            r#type: "x".into(),
            access: "rwm".into(),
            ..Default::default()
        }],
        ..Default::default()
    });
    assert!(r.devices().as_ref().unwrap().is_empty());
}

#[test]
fn annotations_are_added_and_removed() {
    let s = applied(&adjust(|a| {
        a.annotations.insert("new".into(), "v".into());
        a.annotations
            .insert("-io.kubernetes.cri.container-type".into(), String::new());
    }));
    let ann = s.annotations().as_ref().unwrap();
    assert_eq!(ann.get("new").map(String::as_str), Some("v"));
    assert!(!ann.contains_key("io.kubernetes.cri.container-type"));
}

#[test]
fn env_is_set_replaced_in_place_and_removed() {
    let s = applied(&adjust(|a| {
        a.env = vec![kv("HOME", "/home/app"), kv("-LANG", ""), kv("NEW", "1=2")];
    }));
    assert_eq!(
        env_of(&s),
        ["PATH=/usr/bin:/bin", "HOME=/home/app", "NEW=1=2"]
    );
}

#[test]
fn args_are_replaced() {
    let s = applied(&adjust(|a| a.args = vec!["/bin/sh".into(), "-c".into()]));
    assert_eq!(
        s.process().as_ref().unwrap().args().as_deref().unwrap(),
        ["/bin/sh", "-c"]
    );
    // No args: the process's stay.
    let s = applied(&api::ContainerAdjustment::default());
    assert_eq!(
        s.process().as_ref().unwrap().args().as_deref().unwrap(),
        ["/app", "--serve"]
    );
}

#[test]
fn hooks_are_appended_per_kind() {
    let hook = |p: &str| api::Hook {
        path: p.into(),
        args: vec![p.into(), "x".into()],
        timeout: Some(api::OptionalInt { value: 5 }),
        ..Default::default()
    };
    let a = adjust(|a| {
        a.hooks = Some(api::Hooks {
            create_runtime: vec![hook("/bin/one")],
            poststop: vec![hook("/bin/two")],
            ..Default::default()
        })
    });
    let mut s = spec();
    apply(&mut s, &a).unwrap();
    apply(&mut s, &a).unwrap();
    let h = s.hooks().as_ref().unwrap();
    let cr = h.create_runtime().as_ref().unwrap();
    assert_eq!(cr.len(), 2);
    assert_eq!(cr[0].path(), Path::new("/bin/one"));
    assert_eq!(cr[0].timeout(), Some(5));
    assert_eq!(h.poststop().as_ref().unwrap().len(), 2);
    assert!(h.start_container().is_none());
}

#[test]
fn devices_come_with_their_cgroup_rule_and_go_with_it() {
    let dev = |path: &str, t: &str, major, minor| api::LinuxDevice {
        path: path.into(),
        r#type: t.into(),
        major,
        minor,
        file_mode: Some(api::OptionalFileMode { value: 0o4666 }),
        ..Default::default()
    };
    let s = applied(&linux_adj(|l| {
        l.devices = vec![
            dev("/dev/nvidia0", "c", 195, 0),
            dev("-/dev/fuse", "", 0, 0),
        ];
    }));
    let devs = linux_of(&s).devices().as_ref().unwrap();
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0].path(), Path::new("/dev/nvidia0"));
    // Only permission bits reach the device node.
    assert_eq!(devs[0].file_mode(), Some(0o666));
    let rules = resources_of(&s).devices().as_ref().unwrap();
    let shown: Vec<_> = rules.iter().map(|r| (r.allow(), r.to_string())).collect();
    assert_eq!(
        shown,
        [(false, "a *:* rwm".into()), (true, "c 195:0 rwm".into())]
    );
    // Replacing a device replaces its rule.
    let s = applied(&linux_adj(|l| {
        l.devices = vec![dev("/dev/fuse", "c", 10, 230)]
    }));
    let rules = resources_of(&s).devices().as_ref().unwrap();
    let shown: Vec<_> = rules.iter().map(|r| r.to_string()).collect();
    assert_eq!(shown, ["a *:* rwm", "c 10:230 rwm"]);
    // A FIFO gets no rule, an unbuffered character device a character device's.
    let s = applied(&linux_adj(|l| {
        l.devices = vec![dev("/dev/fifo", "p", 0, 0), dev("/dev/u", "u", 4, 1)];
    }));
    let rules = resources_of(&s).devices().as_ref().unwrap();
    let shown: Vec<_> = rules.iter().map(|r| r.to_string()).collect();
    assert_eq!(shown, ["a *:* rwm", "c 10:229 rwm", "c 4:1 rwm"]);
    assert_eq!(linux_of(&s).devices().as_ref().unwrap().len(), 3);
}

#[test]
fn mounts_are_added_replaced_removed_and_ordered() {
    let m = |dest: &str, opts: &[&str]| api::Mount {
        destination: dest.into(),
        r#type: "bind".into(),
        source: "/host/data".into(),
        options: opts.iter().map(|o| o.to_string()).collect(),
    };
    let s = applied(&adjust(|a| {
        a.mounts = vec![
            m("/data/sub", &["rbind"]),
            m("/data", &["rbind", "rslave"]),
            m("/dev/shm", &["rbind"]),
            api::Mount {
                destination: "-/sys".into(),
                ..Default::default()
            },
        ];
    }));
    let mounts = s.mounts().as_ref().unwrap();
    let dests: Vec<_> = mounts.iter().map(|m| m.destination().clone()).collect();
    assert!(!dests.contains(&PathBuf::from("/sys")));
    assert_eq!(
        dests
            .iter()
            .filter(|d| d.as_path() == Path::new("/dev/shm"))
            .count(),
        1
    );
    let shm = mounts
        .iter()
        .find(|m| m.destination() == Path::new("/dev/shm"))
        .unwrap();
    assert_eq!(shm.typ().as_deref(), Some("bind"));
    let at = |d: &str| {
        dests
            .iter()
            .position(|x| x.as_path() == Path::new(d))
            .unwrap()
    };
    assert!(at("/data") < at("/data/sub"));
    assert!(at("/proc") < at("/dev/pts"));
    assert_eq!(linux_of(&s).rootfs_propagation().as_deref(), Some("rslave"));
}

#[test]
fn rlimits_are_set_by_kind() {
    let rl = |t: &str, n| api::PosixRlimit {
        r#type: t.into(),
        hard: n,
        soft: n,
    };
    let s = applied(&adjust(|a| {
        a.rlimits = vec![rl("RLIMIT_NOFILE", 4096), rl("RLIMIT_NPROC", 64)]
    }));
    let got = s.process().as_ref().unwrap().rlimits().clone().unwrap();
    let got: Vec<_> = got
        .iter()
        .map(|r| (r.typ().to_string(), r.hard()))
        .collect();
    assert_eq!(
        got,
        [("RLIMIT_NOFILE".into(), 4096), ("RLIMIT_NPROC".into(), 64)]
    );
    let mut s = spec();
    let err = apply(&mut s, &adjust(|a| a.rlimits = vec![rl("RLIMIT_BOGUS", 1)])).unwrap_err();
    assert!(matches!(err, ApplyError::Invalid { what: "rlimit", .. }));
}

#[test]
fn oom_score_adj_and_cgroups_path() {
    let s = applied(&linux_adj(|l| {
        l.oom_score_adj = Some(api::OptionalInt { value: 500 });
        l.cgroups_path = "/kubepods/besteffort/x".into();
    }));
    assert_eq!(s.process().as_ref().unwrap().oom_score_adj(), Some(500));
    assert_eq!(
        linux_of(&s).cgroups_path().as_deref(),
        Some(Path::new("/kubepods/besteffort/x"))
    );
    let mut s = spec();
    let a = linux_adj(|l| l.oom_score_adj = Some(api::OptionalInt { value: i64::MAX }));
    assert!(apply(&mut s, &a).is_err());
}

#[test]
fn resources_are_overlaid() {
    let a = linux_adj(|l| {
        l.resources = Some(api::LinuxResources {
            memory: Some(api::LinuxMemory {
                limit: Some(api::OptionalInt64 { value: 2 << 30 }),
                reservation: Some(api::OptionalInt64 { value: 1 << 30 }),
                swappiness: Some(api::OptionalUInt64 { value: 0 }),
                ..Default::default()
            }),
            cpu: Some(api::LinuxCpu {
                quota: Some(api::OptionalInt64 { value: 50_000 }),
                period: Some(api::OptionalUInt64 { value: 100_000 }),
                cpus: "2-3".into(),
                ..Default::default()
            }),
            hugepage_limits: vec![api::HugepageLimit {
                page_size: "1GB".into(),
                limit: 1 << 30,
            }],
            unified: [("memory.high".into(), "max".into())].into(),
            pids: Some(api::LinuxPids { limit: 100 }),
            blockio_class: Some(api::OptionalString {
                value: "slow".into(),
            }),
            ..Default::default()
        })
    });
    let mut s = spec();
    let applied = apply(&mut s, &a).unwrap();
    let r = resources_of(&s);
    let m = r.memory().unwrap();
    assert_eq!(m.limit(), Some(2 << 30));
    // The new limit also limits swap, or the old, lower swap limit would be invalid.
    assert_eq!(m.swap(), Some(2 << 30));
    assert_eq!(m.reservation(), Some(1 << 30));
    assert_eq!(m.swappiness(), Some(0));
    let c = r.cpu().as_ref().unwrap();
    // What the adjustment does not set stays.
    assert_eq!(c.shares(), Some(1024));
    assert_eq!((c.quota(), c.period()), (Some(50_000), Some(100_000)));
    assert_eq!(c.cpus().as_deref(), Some("2-3"));
    assert_eq!(r.hugepage_limits().as_ref().unwrap()[0].limit(), 1 << 30);
    assert_eq!(r.unified().as_ref().unwrap()["memory.high"], "max");
    assert_eq!(r.pids().unwrap().limit(), 100);
    assert_eq!(applied.ignored, [r#"blockio class "slow""#]);
}

#[test]
fn sysctl_namespaces_and_net_devices() {
    let ns = |t: &str, p: &str| api::LinuxNamespace {
        r#type: t.into(),
        path: p.into(),
    };
    let s = applied(&linux_adj(|l| {
        l.sysctl.insert("net.ipv4.ip_forward".into(), "1".into());
        l.namespaces = vec![
            ns("network", "/var/run/netns/x"),
            ns("-cgroup", ""),
            ns("user", ""),
        ];
        l.net_devices.insert(
            "eth1".into(),
            api::LinuxNetDevice {
                name: "net1".into(),
            },
        );
    }));
    let l = linux_of(&s);
    assert_eq!(l.sysctl().as_ref().unwrap()["net.ipv4.ip_forward"], "1");
    let nss = l.namespaces().as_ref().unwrap();
    let net = nss
        .iter()
        .find(|n| n.typ() == LinuxNamespaceType::Network)
        .unwrap();
    assert_eq!(net.path().as_deref(), Some(Path::new("/var/run/netns/x")));
    assert!(nss.iter().all(|n| n.typ() != LinuxNamespaceType::Cgroup));
    assert!(nss.iter().any(|n| n.typ() == LinuxNamespaceType::User));
    assert_eq!(
        nss.iter()
            .filter(|n| n.typ() == LinuxNamespaceType::Network)
            .count(),
        1
    );
    let nd = &l.net_devices().as_ref().unwrap()["eth1"];
    assert_eq!(nd.name().as_deref(), Some("net1"));
    // Removal of a sysctl.
    let mut s2 = s.clone();
    let a = linux_adj(|l| {
        l.sysctl
            .insert("-net.ipv4.ip_forward".into(), String::new());
    });
    apply(&mut s2, &a).unwrap();
    assert!(linux_of(&s2).sysctl().as_ref().unwrap().is_empty());
}

#[test]
fn io_priority_scheduler_memory_policy_and_rdt() {
    let s = applied(&linux_adj(|l| {
        l.io_priority = Some(api::LinuxIoPriority {
            class: api::IoPrioClass::IoprioClassIdle as i32,
            priority: 7,
        });
        l.scheduler = Some(api::LinuxScheduler {
            policy: api::LinuxSchedulerPolicy::SchedBatch as i32,
            nice: 5,
            flags: vec![api::LinuxSchedulerFlag::SchedFlagResetOnFork as i32],
            ..Default::default()
        });
        l.memory_policy = Some(api::LinuxMemoryPolicy {
            mode: api::MpolMode::MpolInterleave as i32,
            nodes: "0-1".into(),
            flags: vec![api::MpolFlag::MpolFStaticNodes as i32],
        });
        l.rdt = Some(api::LinuxRdt {
            clos_id: Some(api::OptionalString {
                value: "gold".into(),
            }),
            enable_monitoring: Some(api::OptionalBool { value: true }),
            ..Default::default()
        });
    }));
    let p = s.process().as_ref().unwrap();
    let io = p.io_priority().unwrap();
    assert_eq!(
        (io.class(), io.priority()),
        (IOPriorityClass::IoprioClassIdle, 7)
    );
    let sch = p.scheduler().as_ref().unwrap();
    assert_eq!(*sch.policy(), oci::LinuxSchedulerPolicy::SchedBatch);
    assert_eq!(*sch.nice(), Some(5));
    assert_eq!(sch.flags().as_ref().unwrap().len(), 1);
    let l = linux_of(&s);
    let mp = l.memory_policy().as_ref().unwrap();
    assert_eq!(mp.mode(), oci::MemoryPolicyModeType::MpolInterleave);
    assert_eq!(mp.nodes().as_deref(), Some("0-1"));
    let rdt = l.intel_rdt().as_ref().unwrap();
    assert_eq!(rdt.clos_id().as_deref(), Some("gold"));
    assert_eq!(*rdt.enable_monitoring(), Some(true));
    // Class none clears the I/O priority; RDT removal clears RDT.
    let mut s = s;
    let a = linux_adj(|l| {
        l.io_priority = Some(api::LinuxIoPriority::default());
        l.rdt = Some(api::LinuxRdt {
            remove: true,
            ..Default::default()
        });
    });
    apply(&mut s, &a).unwrap();
    assert!(s.process().as_ref().unwrap().io_priority().is_none());
    assert!(linux_of(&s).intel_rdt().is_none());
}

#[test]
fn a_seccomp_policy_replaces_the_specs() {
    let policy = api::LinuxSeccomp {
        default_action: "SCMP_ACT_ERRNO".into(),
        default_errno: Some(api::OptionalUInt32 { value: 1 }),
        architectures: vec!["SCMP_ARCH_X86_64".into()],
        flags: vec!["SECCOMP_FILTER_FLAG_LOG".into()],
        syscalls: vec![api::LinuxSyscall {
            names: vec!["read".into(), "write".into()],
            action: "SCMP_ACT_ALLOW".into(),
            errno_ret: None,
            args: vec![api::LinuxSeccompArg {
                index: 0,
                value: 1,
                value_two: 0,
                op: "SCMP_CMP_EQ".into(),
            }],
        }],
        ..Default::default()
    };
    let s = applied(&linux_adj(|l| l.seccomp_policy = Some(policy.clone())));
    let sc = linux_of(&s).seccomp().as_ref().unwrap();
    assert_eq!(sc.default_action(), oci::LinuxSeccompAction::ScmpActErrno);
    assert_eq!(sc.default_errno_ret(), Some(1));
    assert_eq!(
        sc.architectures().as_ref().unwrap(),
        &[oci::Arch::ScmpArchX86_64]
    );
    let rule = &sc.syscalls().as_ref().unwrap()[0];
    assert_eq!(rule.names(), &["read", "write"]);
    assert_eq!(
        rule.args().as_ref().unwrap()[0].op(),
        oci::LinuxSeccompOperator::ScmpCmpEq
    );
    let mut bad = policy;
    bad.syscalls[0].action = "SCMP_ACT_BOGUS".into();
    let mut s = spec();
    let err = apply(&mut s, &linux_adj(|l| l.seccomp_policy = Some(bad))).unwrap_err();
    assert!(
        matches!(
            err,
            ApplyError::Invalid {
                what: "seccomp action",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn cdi_devices_are_left_to_the_caller() {
    let mut s = spec();
    let before = s.clone();
    let out = apply(
        &mut s,
        &adjust(|a| {
            a.cdi_devices = vec![api::CdiDevice {
                name: "nvidia.com/gpu=0".into(),
            }]
        }),
    )
    .unwrap();
    assert_eq!(out.cdi_devices, ["nvidia.com/gpu=0"]);
    assert_eq!(s, before);
}

#[test]
fn a_spec_without_a_process_cannot_take_env() {
    let mut s = spec();
    s.set_process(None);
    let err = apply(&mut s, &adjust(|a| a.env = vec![kv("A", "1")])).unwrap_err();
    assert_eq!(err, ApplyError::Missing("process"));
    // What needs no process still applies to a bare spec, without inventing one.
    let mut bare = Spec::default();
    bare.set_process(None).set_linux(None);
    apply(&mut bare, &linux_adj(|l| l.cgroups_path = "/x".into())).unwrap();
    let l = bare.linux().as_ref().unwrap();
    assert!(l.namespaces().is_none() && l.masked_paths().is_none());
    assert!(bare.process().is_none());
}

#[test]
fn merged_plugins_apply_end_to_end() {
    let spec0 = spec();
    let view = container(
        &spec0,
        ContainerMeta {
            id: "c1".into(),
            ..Default::default()
        },
    );
    let mut m = Merge::new(&view);
    m.adjust(
        "10-a",
        adjust(|a| a.env = vec![kv("A", "1"), kv("-HOME", "")]),
    )
    .unwrap();
    m.adjust(
        "20-b",
        linux_adj(|l| {
            l.resources = Some(api::LinuxResources {
                pids: Some(api::LinuxPids { limit: 5 }),
                ..Default::default()
            })
        }),
    )
    .unwrap();
    let merged = m.finish();
    let mut s = spec0;
    apply(&mut s, &merged.adjust).unwrap();
    assert_eq!(env_of(&s), ["PATH=/usr/bin:/bin", "LANG=C", "A=1"]);
    assert_eq!(resources_of(&s).pids().unwrap().limit(), 5);
    // The next plugin's view is the adjusted spec's.
    let next = container(&s, ContainerMeta::default());
    assert!(next.env.contains(&"A=1".to_string()));
}

/// Hostile replies: a rich reply's encoding with a few bytes changed, decoded, merged and
/// applied. Whatever a plugin sends, nothing panics: it is merged, refused, or refused to apply.
#[test]
fn mutated_replies_never_panic() {
    use prost::Message;
    let rich = api::CreateContainerResponse {
        adjust: Some(adjust(|a| {
            a.annotations.insert("-a".into(), "b".into());
            a.env = vec![kv("A", "1"), kv("-B", "")];
            a.args = vec![String::new(), "x".into()];
            a.mounts = vec![api::Mount {
                destination: "/d".into(),
                source: "/s".into(),
                r#type: "bind".into(),
                options: vec!["rshared".into()],
            }];
            a.rlimits = vec![api::PosixRlimit {
                r#type: "RLIMIT_NOFILE".into(),
                hard: 2,
                soft: 1,
            }];
            a.cdi_devices = vec![api::CdiDevice {
                name: "v.com/c=n".into(),
            }];
            a.hooks = Some(api::Hooks {
                prestart: vec![api::Hook {
                    path: "/h".into(),
                    timeout: Some(api::OptionalInt { value: 1 }),
                    ..Default::default()
                }],
                ..Default::default()
            });
            a.linux = Some(api::LinuxContainerAdjustment {
                devices: vec![api::LinuxDevice {
                    path: "/dev/x".into(),
                    r#type: "c".into(),
                    major: 1,
                    minor: 2,
                    file_mode: Some(api::OptionalFileMode { value: 0o600 }),
                    ..Default::default()
                }],
                resources: Some(api::LinuxResources {
                    memory: Some(api::LinuxMemory {
                        limit: Some(api::OptionalInt64 { value: 1 }),
                        ..Default::default()
                    }),
                    hugepage_limits: vec![api::HugepageLimit {
                        page_size: "2MB".into(),
                        limit: u64::MAX,
                    }],
                    unified: [("a.b".into(), "c".into())].into(),
                    ..Default::default()
                }),
                oom_score_adj: Some(api::OptionalInt { value: 1 }),
                io_priority: Some(api::LinuxIoPriority {
                    class: 1,
                    priority: 1,
                }),
                namespaces: vec![api::LinuxNamespace {
                    r#type: "net".into(),
                    path: "/p".into(),
                }],
                sysctl: [("a.b".into(), "1".into())].into(),
                scheduler: Some(api::LinuxScheduler {
                    policy: 2,
                    flags: vec![1],
                    ..Default::default()
                }),
                seccomp_policy: Some(api::LinuxSeccomp {
                    default_action: "SCMP_ACT_LOG".into(),
                    syscalls: vec![api::LinuxSyscall {
                        names: vec!["read".into()],
                        action: "SCMP_ACT_ALLOW".into(),
                        args: vec![api::LinuxSeccompArg {
                            index: 1,
                            op: "SCMP_CMP_NE".into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                memory_policy: Some(api::LinuxMemoryPolicy {
                    mode: 2,
                    nodes: "0".into(),
                    flags: vec![1],
                }),
                rdt: Some(api::LinuxRdt {
                    remove: true,
                    clos_id: Some(api::OptionalString { value: "g".into() }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        })),
        update: vec![api::ContainerUpdate {
            container_id: "other".into(),
            linux: Some(api::LinuxContainerUpdate {
                resources: Some(api::LinuxResources {
                    pids: Some(api::LinuxPids { limit: 1 }),
                    ..Default::default()
                }),
            }),
            ignore_failure: true,
        }],
        evict: vec![api::ContainerEviction {
            container_id: "e".into(),
            reason: "r".into(),
        }],
    };
    let bytes = rich.encode_to_vec();
    let view = container(&spec(), ContainerMeta::default());
    // xorshift: a fixed sequence, so a failure reproduces.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut mutated = || loop {
        let mut b = bytes.clone();
        for _ in 0..=next() % 4 {
            let at = (next() % b.len() as u64) as usize;
            b[at] = next() as u8;
        }
        if let Ok(reply) = api::CreateContainerResponse::decode(&b[..]) {
            break reply;
        }
    };
    let mut merged = 0;
    for _ in 0..3000 {
        let mut m = Merge::new(&view);
        if m.reply("10-a", mutated()).is_err() {
            continue;
        }
        merged += 1;
        // A second plugin mostly conflicts with the first; either way the merge holds.
        let _ = m.reply("20-b", mutated());
        let out = m.finish();
        let mut s = spec();
        let _ = apply(&mut s, &out.adjust);
        for u in &out.updates {
            if let Some(r) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) {
                let _ = resources_from_oci(&resources_to_oci(r));
            }
        }
    }
    assert!(merged > 300, "merged {merged}");
}
