use super::*;
use crate::limits::*;

const A: &str = "10-a";
const B: &str = "20-b";

fn merge() -> Merge {
    Merge::new(&api::Container {
        id: "ctr".into(),
        ..Default::default()
    })
}

fn kv(k: &str, v: &str) -> api::KeyValue {
    api::KeyValue {
        key: k.into(),
        value: v.into(),
    }
}

fn env(vars: &[(&str, &str)]) -> api::ContainerAdjustment {
    api::ContainerAdjustment {
        env: vars.iter().map(|(k, v)| kv(k, v)).collect(),
        ..Default::default()
    }
}

fn linux(l: api::LinuxContainerAdjustment) -> api::ContainerAdjustment {
    api::ContainerAdjustment {
        linux: Some(l),
        ..Default::default()
    }
}

fn resources(r: api::LinuxResources) -> api::ContainerAdjustment {
    linux(api::LinuxContainerAdjustment {
        resources: Some(r),
        ..Default::default()
    })
}

fn mem_limit(v: i64) -> api::LinuxResources {
    api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: Some(api::OptionalInt64 { value: v }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mount(dest: &str) -> api::Mount {
    api::Mount {
        destination: dest.into(),
        source: "/src".into(),
        r#type: "bind".into(),
        options: vec!["rbind".into()],
    }
}

fn device(path: &str) -> api::LinuxDevice {
    api::LinuxDevice {
        path: path.into(),
        r#type: "c".into(),
        major: 1,
        minor: 3,
        ..Default::default()
    }
}

fn conflict(what: &str) -> MergeError {
    MergeError::Conflict {
        what: what.into(),
        first: A.into(),
        second: B.into(),
    }
}

fn hook(path: &str) -> api::Hook {
    api::Hook {
        path: path.into(),
        ..Default::default()
    }
}

#[test]
fn two_plugins_setting_one_env_var_conflict_naming_both() {
    let mut m = merge();
    m.adjust(A, env(&[("FOO", "1"), ("BAR", "1")])).unwrap();
    let err = m.adjust(B, env(&[("FOO", "2")])).unwrap_err();
    assert_eq!(err, conflict("environment variable FOO"));
    assert_eq!(
        err.to_string(),
        r#"plugins "10-a" and "20-b" both adjust environment variable FOO"#
    );
}

#[test]
fn different_keys_merge_and_the_same_plugin_may_set_a_key_again() {
    let mut m = merge();
    m.adjust(A, env(&[("FOO", "1")])).unwrap();
    m.adjust(B, env(&[("BAR", "2")])).unwrap();
    m.adjust(A, env(&[("FOO", "3")])).unwrap();
    let out = m.finish();
    assert_eq!(out.adjust.env, vec![kv("BAR", "2"), kv("FOO", "3")]);
    let owners = &out.owners.owners["ctr"].compound[&(Field::Env as i32)].owners;
    assert_eq!(owners["FOO"], A);
    assert_eq!(owners["BAR"], B);
}

#[test]
fn a_removal_takes_a_key_and_owns_it() {
    let mut m = merge();
    m.adjust(A, env(&[("FOO", "1")])).unwrap();
    // B may remove what A set (as in NRI) ...
    m.adjust(B, env(&[("-FOO", "")])).unwrap();
    assert_eq!(m.adjustment().env, vec![kv("-FOO", "")]);
    // ... and then owns it: A may not set it again, nor may a third plugin.
    let err = m.adjust(A, env(&[("FOO", "2")])).unwrap_err();
    assert_eq!(
        err,
        MergeError::Conflict {
            what: "environment variable FOO".into(),
            first: B.into(),
            second: A.into(),
        }
    );
    let out = merge_with(|m| {
        m.adjust(A, env(&[("-FOO", "")]))?;
        m.adjust(A, env(&[("FOO", "x")]))
    });
    assert_eq!(out.adjust.env, vec![kv("FOO", "x")]);
}

fn merge_with(f: impl FnOnce(&mut Merge) -> Result<(), MergeError>) -> Merged {
    let mut m = merge();
    f(&mut m).unwrap();
    m.finish()
}

#[test]
fn removing_and_setting_in_one_reply_replaces_whoever_set_it() {
    let out = merge_with(|m| {
        m.adjust(A, env(&[("FOO", "1")]))?;
        m.adjust(B, env(&[("-FOO", ""), ("FOO", "2")]))
    });
    assert_eq!(out.adjust.env, vec![kv("FOO", "2")]);
    assert_eq!(
        out.owners.owners["ctr"].compound[&(Field::Env as i32)].owners["FOO"],
        B
    );
}

#[test]
fn a_removal_of_what_no_plugin_set_is_kept_for_the_spec() {
    let out = merge_with(|m| {
        m.adjust(
            A,
            api::ContainerAdjustment {
                mounts: vec![mount("-/data")],
                env: vec![kv("-HOME", "")],
                annotations: [("-note".to_string(), String::new())].into(),
                ..linux(api::LinuxContainerAdjustment {
                    devices: vec![device("-/dev/kmsg")],
                    sysctl: [("-net.ipv4.ip_forward".to_string(), String::new())].into(),
                    namespaces: vec![api::LinuxNamespace {
                        r#type: "-network".into(),
                        path: String::new(),
                    }],
                    ..Default::default()
                })
            },
        )
    });
    let a = &out.adjust;
    assert_eq!(a.mounts, vec![mount("-/data")]);
    assert_eq!(a.env, vec![kv("-HOME", "")]);
    assert!(a.annotations.contains_key("-note"));
    let l = a.linux.as_ref().unwrap();
    assert_eq!(l.devices, vec![device("-/dev/kmsg")]);
    assert!(l.sysctl.contains_key("-net.ipv4.ip_forward"));
    assert_eq!(l.namespaces[0].r#type, "-network");
    let owners = &out.owners.owners["ctr"].compound[&(Field::Mounts as i32)].owners;
    assert_eq!(owners["/data"], "-10-a");
}

#[test]
fn keyed_fields_conflict_per_key() {
    type Adj = fn(&str) -> api::ContainerAdjustment;
    let cases: [(Adj, &str); 9] = [
        (
            |k| api::ContainerAdjustment {
                annotations: [(k.to_string(), "v".to_string())].into(),
                ..Default::default()
            },
            "annotation",
        ),
        (
            |k| api::ContainerAdjustment {
                mounts: vec![mount(&format!("/{k}"))],
                ..Default::default()
            },
            "mount /",
        ),
        (
            |k| {
                linux(api::LinuxContainerAdjustment {
                    devices: vec![device(&format!("/dev/{k}"))],
                    ..Default::default()
                })
            },
            "device /dev/",
        ),
        (
            |k| api::ContainerAdjustment {
                cdi_devices: vec![api::CdiDevice {
                    name: format!("vendor.com/gpu={k}"),
                }],
                ..Default::default()
            },
            "CDI device vendor.com/gpu=",
        ),
        (
            |k| {
                linux(api::LinuxContainerAdjustment {
                    sysctl: [(format!("net.{k}"), "1".to_string())].into(),
                    ..Default::default()
                })
            },
            "sysctl net.",
        ),
        (
            |k| {
                linux(api::LinuxContainerAdjustment {
                    net_devices: [(k.to_string(), api::LinuxNetDevice::default())].into(),
                    ..Default::default()
                })
            },
            "network device",
        ),
        (
            |k| {
                resources(api::LinuxResources {
                    unified: [(format!("memory.{k}"), "1".to_string())].into(),
                    ..Default::default()
                })
            },
            "unified cgroup setting memory.",
        ),
        (
            |k| {
                resources(api::LinuxResources {
                    hugepage_limits: vec![api::HugepageLimit {
                        page_size: k.into(),
                        limit: 1,
                    }],
                    ..Default::default()
                })
            },
            "hugepage limit",
        ),
        (
            |k| {
                linux(api::LinuxContainerAdjustment {
                    namespaces: vec![api::LinuxNamespace {
                        r#type: if k == "x" { "ipc" } else { "uts" }.into(),
                        path: String::new(),
                    }],
                    ..Default::default()
                })
            },
            "namespace",
        ),
    ];
    for (adj, what) in cases {
        let mut m = merge();
        m.adjust(A, adj("x")).unwrap();
        m.adjust(B, adj("y")).unwrap();
        let err = m.adjust(B, adj("x")).unwrap_err();
        let MergeError::Conflict {
            what: w,
            first,
            second,
        } = err
        else {
            panic!("{what}: {err}")
        };
        assert!(w.starts_with(what.trim_end()), "{w} vs {what}");
        assert_eq!((first.as_str(), second.as_str()), (A, B), "{what}");
    }
}

#[test]
fn rlimits_conflict_per_type_and_replace_by_type() {
    let rl = |t: &str, n| api::ContainerAdjustment {
        rlimits: vec![api::PosixRlimit {
            r#type: t.into(),
            hard: n,
            soft: n,
        }],
        ..Default::default()
    };
    let mut m = merge();
    m.adjust(A, rl("RLIMIT_NOFILE", 10)).unwrap();
    m.adjust(A, rl("RLIMIT_NOFILE", 20)).unwrap();
    m.adjust(B, rl("RLIMIT_NPROC", 5)).unwrap();
    assert_eq!(m.adjustment().rlimits.len(), 2);
    assert_eq!(m.adjustment().rlimits[0].hard, 20);
    let err = m.adjust(B, rl("RLIMIT_NOFILE", 1)).unwrap_err();
    assert_eq!(err, conflict("rlimit RLIMIT_NOFILE"));
}

#[test]
fn simple_fields_conflict() {
    let cpu = |c: api::LinuxCpu| {
        resources(api::LinuxResources {
            cpu: Some(c),
            ..Default::default()
        })
    };
    let cases: Vec<(api::ContainerAdjustment, &str)> = vec![
        (resources(mem_limit(1 << 30)), "memory limit"),
        (
            resources(api::LinuxResources {
                memory: Some(api::LinuxMemory {
                    swappiness: Some(api::OptionalUInt64 { value: 10 }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            "memory swappiness",
        ),
        (
            cpu(api::LinuxCpu {
                shares: Some(api::OptionalUInt64 { value: 2 }),
                ..Default::default()
            }),
            "CPU shares",
        ),
        (
            cpu(api::LinuxCpu {
                quota: Some(api::OptionalInt64 { value: 2 }),
                ..Default::default()
            }),
            "CPU quota",
        ),
        (
            cpu(api::LinuxCpu {
                period: Some(api::OptionalUInt64 { value: 2 }),
                ..Default::default()
            }),
            "CPU period",
        ),
        (
            cpu(api::LinuxCpu {
                cpus: "0-1".into(),
                ..Default::default()
            }),
            "cpuset CPUs",
        ),
        (
            cpu(api::LinuxCpu {
                mems: "0".into(),
                ..Default::default()
            }),
            "cpuset memory nodes",
        ),
        (
            resources(api::LinuxResources {
                pids: Some(api::LinuxPids { limit: 10 }),
                ..Default::default()
            }),
            "pids limit",
        ),
        (
            resources(api::LinuxResources {
                blockio_class: Some(api::OptionalString { value: "x".into() }),
                ..Default::default()
            }),
            "blockio class",
        ),
        (
            resources(api::LinuxResources {
                rdt_class: Some(api::OptionalString { value: "x".into() }),
                ..Default::default()
            }),
            "RDT class",
        ),
        (
            linux(api::LinuxContainerAdjustment {
                oom_score_adj: Some(api::OptionalInt { value: 5 }),
                ..Default::default()
            }),
            "OOM score adjustment",
        ),
        (
            linux(api::LinuxContainerAdjustment {
                cgroups_path: "/kubepods/x".into(),
                ..Default::default()
            }),
            "cgroups path",
        ),
        (
            api::ContainerAdjustment {
                args: vec!["sleep".into()],
                ..Default::default()
            },
            "arguments",
        ),
        (
            linux(api::LinuxContainerAdjustment {
                seccomp_policy: Some(api::LinuxSeccomp::default()),
                ..Default::default()
            }),
            "seccomp policy",
        ),
        (
            linux(api::LinuxContainerAdjustment {
                io_priority: Some(api::LinuxIoPriority {
                    class: api::IoPrioClass::IoprioClassBe as i32,
                    priority: 4,
                }),
                ..Default::default()
            }),
            "I/O priority",
        ),
        (
            linux(api::LinuxContainerAdjustment {
                scheduler: Some(api::LinuxScheduler {
                    policy: api::LinuxSchedulerPolicy::SchedBatch as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            "scheduling policy",
        ),
        (
            linux(api::LinuxContainerAdjustment {
                rdt: Some(api::LinuxRdt {
                    clos_id: Some(api::OptionalString { value: "g".into() }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            "RDT CLOS id",
        ),
        (
            linux(api::LinuxContainerAdjustment {
                memory_policy: Some(api::LinuxMemoryPolicy {
                    mode: api::MpolMode::MpolBind as i32,
                    nodes: "0".into(),
                    flags: vec![],
                }),
                ..Default::default()
            }),
            "memory policy",
        ),
    ];
    for (adj, what) in cases {
        let mut m = merge();
        m.adjust(A, adj.clone()).unwrap();
        m.adjust(A, adj.clone())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(m.adjust(B, adj).unwrap_err(), conflict(what));
    }
}

#[test]
fn resources_of_different_kinds_merge() {
    let out = merge_with(|m| {
        m.adjust(A, resources(mem_limit(100)))?;
        m.adjust(
            B,
            resources(api::LinuxResources {
                cpu: Some(api::LinuxCpu {
                    cpus: "2".into(),
                    ..Default::default()
                }),
                devices: vec![api::LinuxDeviceCgroup {
                    allow: true,
                    r#type: "c".into(),
                    access: "rw".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        )
    });
    let r = out.adjust.linux.unwrap().resources.unwrap();
    assert_eq!(r.memory.unwrap().limit.unwrap().value, 100);
    assert_eq!(r.cpu.unwrap().cpus, "2");
    assert_eq!(r.devices.len(), 1);
}

#[test]
fn hooks_accumulate_without_conflict() {
    let hooks = |p: &str| api::ContainerAdjustment {
        hooks: Some(api::Hooks {
            create_runtime: vec![hook(p)],
            ..Default::default()
        }),
        ..Default::default()
    };
    let out = merge_with(|m| {
        m.adjust(A, hooks("/bin/a"))?;
        m.adjust(B, hooks("/bin/b"))
    });
    let h = out.adjust.hooks.unwrap();
    assert_eq!(h.create_runtime, vec![hook("/bin/a"), hook("/bin/b")]);
    assert_eq!(
        out.owners.owners["ctr"].simple[&(Field::OciHooks as i32)],
        "10-a,20-b"
    );
}

#[test]
fn an_empty_first_argument_replaces_another_plugins_args() {
    let args = |a: &[&str]| api::ContainerAdjustment {
        args: a.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let out = merge_with(|m| {
        m.adjust(A, args(&["a"]))?;
        m.adjust(B, args(&["", "b", "c"]))
    });
    assert_eq!(out.adjust.args, ["b", "c"]);
}

#[test]
fn rdt_removal_clears_and_a_later_setting_wins_back() {
    let rdt = |r: api::LinuxRdt| {
        linux(api::LinuxContainerAdjustment {
            rdt: Some(r),
            ..Default::default()
        })
    };
    let clos = |v: &str| api::LinuxRdt {
        clos_id: Some(api::OptionalString { value: v.into() }),
        ..Default::default()
    };
    let mut m = merge();
    m.adjust(A, rdt(clos("gold"))).unwrap();
    m.adjust(
        B,
        rdt(api::LinuxRdt {
            remove: true,
            ..Default::default()
        }),
    )
    .unwrap();
    let got = m.adjustment().linux.as_ref().unwrap().rdt.clone().unwrap();
    assert!(got.remove && got.clos_id.is_none());
    m.adjust(B, rdt(clos("silver"))).unwrap();
    let got = m.adjustment().linux.as_ref().unwrap().rdt.clone().unwrap();
    assert!(!got.remove);
    assert_eq!(got.clos_id.unwrap().value, "silver");
    let err = m.adjust(A, rdt(clos("gold"))).unwrap_err();
    assert!(matches!(err, MergeError::Conflict { .. }), "{err}");
}

fn upd(id: &str, r: api::LinuxResources, ignore_failure: bool) -> api::ContainerUpdate {
    api::ContainerUpdate {
        container_id: id.into(),
        linux: Some(api::LinuxContainerUpdate { resources: Some(r) }),
        ignore_failure,
    }
}

#[test]
fn updates_merge_per_container_and_conflict_per_field() {
    let mut m = merge();
    m.update(A, vec![upd("other", mem_limit(1), false)])
        .unwrap();
    let cpu = api::LinuxResources {
        cpu: Some(api::LinuxCpu {
            shares: Some(api::OptionalUInt64 { value: 9 }),
            ..Default::default()
        }),
        ..Default::default()
    };
    m.update(
        B,
        vec![upd("other", cpu, false), upd("third", mem_limit(2), false)],
    )
    .unwrap();
    // Another container's fields are its own: the created one's memory limit is free.
    m.adjust(B, resources(mem_limit(3))).unwrap();
    let err = m
        .update(B, vec![upd("other", mem_limit(4), false)])
        .unwrap_err();
    assert_eq!(err, conflict(r#"memory limit of container "other""#));
    let out = m.finish();
    assert_eq!(out.updates.len(), 2);
    let r = out.updates[0].linux.clone().unwrap().resources.unwrap();
    assert_eq!(r.memory.unwrap().limit.unwrap().value, 1);
    assert_eq!(r.cpu.unwrap().shares.unwrap().value, 9);
}

#[test]
fn a_conflicting_update_that_may_fail_is_dropped_whole() {
    let mut m = merge();
    m.update(A, vec![upd("other", mem_limit(1), true)]).unwrap();
    let mut both = mem_limit(5);
    both.pids = Some(api::LinuxPids { limit: 7 });
    m.update(B, vec![upd("other", both, true)]).unwrap();
    let out = m.finish();
    let r = out.updates[0].linux.clone().unwrap().resources.unwrap();
    assert_eq!(r.memory.unwrap().limit.unwrap().value, 1);
    // Nothing of the dropped update was taken, not even its free pids limit.
    assert!(r.pids.is_none());
    assert!(out.updates[0].ignore_failure);
    let owners = &out.owners.owners["other"];
    assert!(!owners.simple.contains_key(&(Field::PidsLimit as i32)));
}

#[test]
fn updating_the_container_being_created_is_refused() {
    let mut m = merge();
    let err = m
        .update(A, vec![upd("ctr", mem_limit(1), false)])
        .unwrap_err();
    assert!(matches!(err, MergeError::Invalid { plugin, .. } if plugin == A));
}

#[test]
fn evictions_are_collected_once_per_container() {
    let ev = |id: &str, why: &str| api::ContainerEviction {
        container_id: id.into(),
        reason: why.into(),
    };
    let out = merge_with(|m| {
        m.evict(A, vec![ev("x", "first")])?;
        m.evict(B, vec![ev("x", "second"), ev("y", "why")])
    });
    assert_eq!(out.evictions, vec![ev("x", "first"), ev("y", "why")]);
}

#[test]
fn a_whole_reply_merges() {
    let mut m = merge();
    m.reply(
        A,
        api::CreateContainerResponse {
            adjust: Some(env(&[("A", "1")])),
            update: vec![upd("other", mem_limit(1), false)],
            evict: vec![api::ContainerEviction {
                container_id: "z".into(),
                reason: String::new(),
            }],
        },
    )
    .unwrap();
    let out = m.finish();
    assert_eq!(out.adjust.env.len(), 1);
    assert_eq!(out.updates.len(), 1);
    assert_eq!(out.evictions.len(), 1);
}

// -- bounds: every limit refuses one more than it allows, naming the plugin.

fn refused(a: api::ContainerAdjustment) -> MergeError {
    merge().adjust(A, a).unwrap_err()
}

fn too_large(err: MergeError, limit: usize) {
    match err {
        MergeError::TooLarge {
            plugin, limit: l, ..
        } => {
            assert_eq!((plugin.as_str(), l), (A, limit))
        }
        e => panic!("expected TooLarge at {limit}, got {e}"),
    }
}

fn invalid(err: MergeError, needle: &str) {
    match &err {
        MergeError::Invalid { plugin, reason } => {
            assert_eq!(plugin, A);
            assert!(reason.contains(needle), "{reason:?} lacks {needle:?}");
        }
        e => panic!("expected Invalid ({needle}), got {e}"),
    }
}

#[test]
fn env_bounds() {
    let many: Vec<_> = (0..=MAX_ENV)
        .map(|i| (format!("V{i}"), String::new()))
        .collect();
    let many: Vec<_> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    merge().adjust(A, env(&many[..MAX_ENV])).unwrap();
    too_large(refused(env(&many)), MAX_ENV);
    too_large(
        refused(env(&[(&"K".repeat(MAX_ENV_KEY + 1), "")])),
        MAX_ENV_KEY,
    );
    too_large(
        refused(env(&[("K", &"v".repeat(MAX_ENV_VALUE + 1))])),
        MAX_ENV_VALUE,
    );
    let big = "v".repeat(MAX_ENV_VALUE);
    let bulk: Vec<_> = (0..9).map(|i| (format!("B{i}"), big.clone())).collect();
    let bulk: Vec<_> = bulk.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    too_large(refused(env(&bulk)), MAX_ENV_BYTES);
    invalid(refused(env(&[("A=B", "")])), "not a name");
    invalid(refused(env(&[("", "x")])), "not a name");
    invalid(refused(env(&[("K", "a\0b")])), "NUL");
}

#[test]
fn merged_totals_are_bounded_as_one_reply() {
    let mut m = merge();
    let half: Vec<_> = (0..MAX_ENV / 2 + 1)
        .map(|i| (format!("A{i}"), String::new()))
        .collect();
    let other: Vec<_> = (0..MAX_ENV / 2)
        .map(|i| (format!("B{i}"), String::new()))
        .collect();
    let as_ref = |v: &[(String, String)]| -> api::ContainerAdjustment {
        api::ContainerAdjustment {
            env: v.iter().map(|(k, v)| kv(k, v)).collect(),
            ..Default::default()
        }
    };
    m.adjust(A, as_ref(&half)).unwrap();
    match m.adjust(B, as_ref(&other)).unwrap_err() {
        MergeError::TooLarge { plugin, limit, .. } => {
            assert_eq!((plugin.as_str(), limit), (B, MAX_ENV))
        }
        e => panic!("{e}"),
    }
}

#[test]
fn annotation_bounds() {
    let ann = |n: usize, len: usize| api::ContainerAdjustment {
        annotations: (0..n).map(|i| (format!("k{i}"), "v".repeat(len))).collect(),
        ..Default::default()
    };
    merge().adjust(A, ann(MAX_ANNOTATIONS, 1)).unwrap();
    too_large(refused(ann(MAX_ANNOTATIONS + 1, 1)), MAX_ANNOTATIONS);
    too_large(
        refused(ann(2, MAX_ANNOTATION_BYTES / 2)),
        MAX_ANNOTATION_BYTES,
    );
}

#[test]
fn mount_bounds() {
    let mounts = |m: Vec<api::Mount>| api::ContainerAdjustment {
        mounts: m,
        ..Default::default()
    };
    let many = (0..=MAX_MOUNTS)
        .map(|i| mount(&format!("/m{i}")))
        .collect::<Vec<_>>();
    merge()
        .adjust(A, mounts(many[..MAX_MOUNTS].to_vec()))
        .unwrap();
    too_large(refused(mounts(many)), MAX_MOUNTS);
    invalid(refused(mounts(vec![mount("relative")])), "not absolute");
    invalid(refused(mounts(vec![mount("-relative")])), "not absolute");
    invalid(refused(mounts(vec![mount("/a/../etc")])), "'..'");
    invalid(refused(mounts(vec![mount("/a\0b")])), "NUL");
    too_large(
        refused(mounts(vec![mount(&format!("/{}", "a".repeat(MAX_PATH)))])),
        MAX_PATH,
    );
    let mut m = mount("/x");
    m.options = vec!["o".into(); MAX_MOUNT_OPTIONS + 1];
    too_large(refused(mounts(vec![m])), MAX_MOUNT_OPTIONS);
}

#[test]
fn hook_bounds() {
    let hooks = |h: api::Hooks| api::ContainerAdjustment {
        hooks: Some(h),
        ..Default::default()
    };
    let half = vec![hook("/bin/h"); MAX_HOOKS / 2];
    merge()
        .adjust(
            A,
            hooks(api::Hooks {
                prestart: half.clone(),
                poststop: half.clone(),
                ..Default::default()
            }),
        )
        .unwrap();
    // The bound is on all kinds together.
    too_large(
        refused(hooks(api::Hooks {
            prestart: half.clone(),
            poststop: half,
            poststart: vec![hook("/bin/h")],
            ..Default::default()
        })),
        MAX_HOOKS,
    );
    invalid(
        refused(hooks(api::Hooks {
            poststart: vec![hook("bin/h")],
            ..Default::default()
        })),
        "not absolute",
    );
    let mut h = hook("/bin/h");
    h.args = vec!["a".into(); MAX_HOOK_ARGS + 1];
    too_large(
        refused(hooks(api::Hooks {
            poststart: vec![h],
            ..Default::default()
        })),
        MAX_HOOK_ARGS,
    );
    let mut m = merge();
    for _ in 0..MAX_HOOKS {
        m.adjust(
            A,
            hooks(api::Hooks {
                poststart: vec![hook("/h")],
                ..Default::default()
            }),
        )
        .unwrap();
    }
    too_large(
        m.adjust(
            A,
            hooks(api::Hooks {
                poststart: vec![hook("/h")],
                ..Default::default()
            }),
        )
        .unwrap_err(),
        MAX_HOOKS,
    );
}

#[test]
fn device_bounds() {
    let devs = |d: Vec<api::LinuxDevice>| {
        linux(api::LinuxContainerAdjustment {
            devices: d,
            ..Default::default()
        })
    };
    let many = (0..=MAX_DEVICES)
        .map(|i| device(&format!("/dev/d{i}")))
        .collect::<Vec<_>>();
    merge()
        .adjust(A, devs(many[..MAX_DEVICES].to_vec()))
        .unwrap();
    too_large(refused(devs(many)), MAX_DEVICES);
    invalid(refused(devs(vec![device("/etc/shadow")])), "not under /dev");
    invalid(refused(devs(vec![device("/dev/../etc/shadow")])), "'..'");
    invalid(
        refused(devs(vec![device("-/etc/passwd")])),
        "not under /dev",
    );
    let mut d = device("/dev/x");
    d.r#type = "a".into();
    invalid(refused(devs(vec![d])), "not c, b, u or p");
    let mut d = device("/dev/x");
    d.major = -1;
    invalid(refused(devs(vec![d])), "number");
    let mut d = device("/dev/x");
    d.minor = 1 << 20;
    invalid(refused(devs(vec![d])), "number");
}

#[test]
fn cdi_bounds() {
    let cdi = |names: Vec<String>| api::ContainerAdjustment {
        cdi_devices: names
            .into_iter()
            .map(|name| api::CdiDevice { name })
            .collect(),
        ..Default::default()
    };
    let many = (0..=MAX_CDI_DEVICES)
        .map(|i| format!("nvidia.com/gpu={i}"))
        .collect::<Vec<_>>();
    merge()
        .adjust(A, cdi(many[..MAX_CDI_DEVICES].to_vec()))
        .unwrap();
    too_large(refused(cdi(many)), MAX_CDI_DEVICES);
    too_large(
        refused(cdi(vec![format!("v/c={}", "n".repeat(MAX_CDI_NAME))])),
        MAX_CDI_NAME,
    );
    invalid(refused(cdi(vec!["gpu0".into()])), "vendor/class=name");
    invalid(
        refused(cdi(vec!["-nvidia.com/gpu=0".into()])),
        "vendor/class=name",
    );
}

#[test]
fn args_bounds() {
    let args = |a: Vec<String>| api::ContainerAdjustment {
        args: a,
        ..Default::default()
    };
    merge().adjust(A, args(vec!["a".into(); MAX_ARGS])).unwrap();
    too_large(refused(args(vec!["a".into(); MAX_ARGS + 1])), MAX_ARGS);
    too_large(
        refused(args(vec!["a".repeat(MAX_ARGS_BYTES / 2 + 1); 2])),
        MAX_ARGS_BYTES,
    );
    invalid(refused(args(vec!["a\0".into()])), "NUL");
}

#[test]
fn rlimit_bounds() {
    let rl = |t: &str, soft, hard| api::PosixRlimit {
        r#type: t.into(),
        soft,
        hard,
    };
    let rls = |r: Vec<api::PosixRlimit>| api::ContainerAdjustment {
        rlimits: r,
        ..Default::default()
    };
    let all: Vec<_> = RLIMITS.iter().map(|t| rl(t, 1, 1)).collect();
    merge().adjust(A, rls(all.clone())).unwrap();
    let mut over = all;
    over.push(rl("RLIMIT_NOFILE", 1, 1));
    too_large(refused(rls(over)), MAX_RLIMITS);
    invalid(
        refused(rls(vec![rl("RLIMIT_BOGUS", 1, 1)])),
        "unknown rlimit",
    );
    invalid(
        refused(rls(vec![rl("RLIMIT_NOFILE", 2, 1)])),
        "soft limit over hard",
    );
}

#[test]
fn sysctl_bounds() {
    let sys = |m: HashMap<String, String>| {
        linux(api::LinuxContainerAdjustment {
            sysctl: m,
            ..Default::default()
        })
    };
    let many = |n| {
        (0..n)
            .map(|i| (format!("net.k{i}"), "1".to_string()))
            .collect()
    };
    merge().adjust(A, sys(many(MAX_SYSCTL))).unwrap();
    too_large(refused(sys(many(MAX_SYSCTL + 1))), MAX_SYSCTL);
    for bad in ["net..x", "../x", "net/../../x", ".net", "net x", ""] {
        invalid(
            refused(sys([(bad.to_string(), "1".to_string())].into())),
            "sysctl name",
        );
    }
    merge()
        .adjust(
            A,
            sys([("net/ipv4/conf/eth0.1/forwarding".into(), "1".into())].into()),
        )
        .unwrap();
}

#[test]
fn resource_bounds() {
    let unified = |m: HashMap<String, String>| {
        resources(api::LinuxResources {
            unified: m,
            ..Default::default()
        })
    };
    let many = |n| {
        (0..n)
            .map(|i| (format!("memory.k{i}"), "1".to_string()))
            .collect()
    };
    merge().adjust(A, unified(many(MAX_UNIFIED))).unwrap();
    too_large(refused(unified(many(MAX_UNIFIED + 1))), MAX_UNIFIED);
    for bad in ["../cgroup.procs", "a/b", "..", "-memory.max", ""] {
        let err = refused(unified([(bad.to_string(), "1".to_string())].into()));
        assert!(matches!(err, MergeError::Invalid { .. }), "{bad}: {err}");
    }
    let pages = |n| {
        resources(api::LinuxResources {
            hugepage_limits: (0..n)
                .map(|i| api::HugepageLimit {
                    page_size: format!("{i}MB"),
                    limit: 1,
                })
                .collect(),
            ..Default::default()
        })
    };
    merge().adjust(A, pages(MAX_HUGEPAGE_LIMITS)).unwrap();
    too_large(refused(pages(MAX_HUGEPAGE_LIMITS + 1)), MAX_HUGEPAGE_LIMITS);
    let rules = |n, t: &str, access: &str| {
        resources(api::LinuxResources {
            devices: vec![
                api::LinuxDeviceCgroup {
                    allow: true,
                    r#type: t.into(),
                    access: access.into(),
                    ..Default::default()
                };
                n
            ],
            ..Default::default()
        })
    };
    too_large(
        refused(rules(MAX_DEVICE_RULES + 1, "c", "rw")),
        MAX_DEVICE_RULES,
    );
    invalid(refused(rules(1, "x", "rw")), "device cgroup rule");
    invalid(refused(rules(1, "c", "rwx")), "device cgroup rule");
}

#[test]
fn linux_scalar_bounds() {
    let l = |l: api::LinuxContainerAdjustment| refused(linux(l));
    invalid(
        l(api::LinuxContainerAdjustment {
            cgroups_path: "/kubepods/../../etc".into(),
            ..Default::default()
        }),
        "'..'",
    );
    invalid(
        l(api::LinuxContainerAdjustment {
            cgroups_path: "system.slice:..:x".into(),
            ..Default::default()
        }),
        "'..'",
    );
    too_large(
        l(api::LinuxContainerAdjustment {
            cgroups_path: "a".repeat(MAX_PATH + 1),
            ..Default::default()
        }),
        MAX_PATH,
    );
    invalid(
        l(api::LinuxContainerAdjustment {
            oom_score_adj: Some(api::OptionalInt { value: 1001 }),
            ..Default::default()
        }),
        "OOM score",
    );
    invalid(
        l(api::LinuxContainerAdjustment {
            io_priority: Some(api::LinuxIoPriority {
                class: 9,
                priority: 0,
            }),
            ..Default::default()
        }),
        "I/O priority",
    );
    invalid(
        l(api::LinuxContainerAdjustment {
            namespaces: vec![api::LinuxNamespace {
                r#type: "bogus".into(),
                path: String::new(),
            }],
            ..Default::default()
        }),
        "unknown namespace",
    );
    invalid(
        l(api::LinuxContainerAdjustment {
            rdt: Some(api::LinuxRdt {
                clos_id: Some(api::OptionalString {
                    value: "../x".into(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        "not a file name",
    );
    invalid(
        l(api::LinuxContainerAdjustment {
            net_devices: [("eth0/../x".to_string(), api::LinuxNetDevice::default())].into(),
            ..Default::default()
        }),
        "network device",
    );
    too_large(
        l(api::LinuxContainerAdjustment {
            seccomp_policy: Some(api::LinuxSeccomp {
                syscalls: vec![api::LinuxSyscall::default(); MAX_SECCOMP_SYSCALLS + 1],
                ..Default::default()
            }),
            ..Default::default()
        }),
        MAX_SECCOMP_SYSCALLS,
    );
}

#[test]
fn update_and_eviction_bounds() {
    let ups = (0..=MAX_UPDATES).map(|i| upd(&format!("c{i}"), mem_limit(1), false));
    too_large(merge().update(A, ups.collect()).unwrap_err(), MAX_UPDATES);
    let ev = |id: String| api::ContainerEviction {
        container_id: id,
        reason: String::new(),
    };
    let evs = (0..=MAX_EVICTIONS).map(|i| ev(format!("c{i}")));
    too_large(merge().evict(A, evs.collect()).unwrap_err(), MAX_EVICTIONS);
    invalid(
        merge().evict(A, vec![ev(String::new())]).unwrap_err(),
        "empty container id",
    );
    let bad = api::LinuxResources {
        unified: [("../../x".to_string(), String::new())].into(),
        ..Default::default()
    };
    invalid(
        merge().update(A, vec![upd("c", bad, true)]).unwrap_err(),
        "unified",
    );
}

#[test]
fn a_huge_hostile_key_is_shortened_in_errors() {
    let key = "\u{1F600}".repeat(100_000);
    let err = refused(api::ContainerAdjustment {
        mounts: vec![mount(&format!("x{key}"))],
        ..Default::default()
    });
    assert!(err.to_string().len() < 400, "{}", err.to_string().len());
}
