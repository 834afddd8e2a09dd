//! PID namespaces: a pod's shared namespace, a container's own, the node's, and the cgroups of a
//! container that joins a busy pod namespace.

use std::path::Path;

use crishim_tests::pods::{
    assert_no_leaks, marker, namespaces, set_pod_namespaces, sh_container, PodEnv, PodTraces,
    LOOP_UNTIL_TERM, NS_CONTAINER, NS_NODE, NS_POD,
};
use crishim_tests::Daemon;

use super::text;

/// `/proc/1/cmdline` in the container, NULs as spaces.
async fn pid1_command(d: &Daemon, id: &str) -> String {
    d.exec_ok(id, &["cat", "/proc/1/cmdline"])
        .await
        .split('\0')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn pid_namespace_pod_is_shared_under_infra_and_container_is_private() {
    let env = PodEnv::start().await;
    let d = &env.d;

    // pid: POD — the infra process is PID 1 and every container sees the others.
    let mut shared_cfg = env.pod_config("pid-shared");
    set_pod_namespaces(&mut shared_cfg, namespaces(NS_POD, NS_POD, NS_POD));
    let shared = d.run_pod(&shared_cfg).await.expect("RunPodSandbox pid POD");
    let mut shared_traces = PodTraces::new(&shared, &shared_cfg);
    let (m1, m2) = (marker("a1"), marker("a2"));
    let a1 = d
        .run_container(
            &shared,
            &sh_container(&env, "a1", LOOP_UNTIL_TERM, &m1),
            &shared_cfg,
        )
        .await
        .expect("run a1");
    let a2 = d
        .run_container(
            &shared,
            &sh_container(&env, "a2", LOOP_UNTIL_TERM, &m2),
            &shared_cfg,
        )
        .await
        .expect("run a2");
    shared_traces.add_container(&a1);
    shared_traces.add_container(&a2);
    shared_traces.capture(d).await;
    assert_eq!(pid1_command(d, &a2).await, "crishim-pause");
    let ps = d.exec_ok(&a2, &["ps"]).await;
    for want in ["crishim-pause", m1.as_str(), m2.as_str()] {
        assert!(ps.contains(want), "ps in a2 does not show {want:?}:\n{ps}");
    }
    let ps = d.exec_ok(&a1, &["ps"]).await;
    assert!(ps.contains(&m2), "ps in a1 does not show a2:\n{ps}");

    // pid: CONTAINER — the container's own process is PID 1 and it sees nothing else.
    let private_cfg = env.pod_config("pid-private");
    assert_eq!(
        private_cfg
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .map(|n| n.pid),
        Some(NS_CONTAINER)
    );
    let private = d
        .run_pod(&private_cfg)
        .await
        .expect("RunPodSandbox pid CONTAINER");
    let mut private_traces = PodTraces::new(&private, &private_cfg);
    let mb = marker("b1");
    let b1 = d
        .run_container(
            &private,
            &sh_container(&env, "b1", LOOP_UNTIL_TERM, &mb),
            &private_cfg,
        )
        .await
        .expect("run b1");
    private_traces.add_container(&b1);
    private_traces.capture(d).await;
    let pid1 = pid1_command(d, &b1).await;
    assert!(
        pid1.starts_with("/bin/sh -c") && pid1.ends_with(&mb),
        "PID 1 of a pid-CONTAINER container is {pid1:?}, not its own command"
    );
    let ps = d.exec_ok(&b1, &["ps"]).await;
    for unwanted in ["crishim-shim", m1.as_str(), m2.as_str()] {
        assert!(
            !ps.contains(unwanted),
            "ps in a private pid namespace shows {unwanted:?}:\n{ps}"
        );
    }

    d.remove_pod(&shared).await.expect("RemovePodSandbox");
    d.remove_pod(&private).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &shared_traces).await;
    assert_no_leaks(d, &private_traces).await;
    env.stop();
}

#[tokio::test]
async fn pid_namespace_node_shows_host_processes() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut cfg = env.pod_config("pid-node");
    set_pod_namespaces(&mut cfg, namespaces(NS_POD, NS_NODE, NS_POD));
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox pid NODE");
    let mut traces = PodTraces::new(&pod, &cfg);
    let c = sh_container(&env, "node", LOOP_UNTIL_TERM, &marker("node"));
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run container");
    traces.add_container(&id);
    traces.capture(d).await;

    let host_pid1 = std::fs::read("/proc/1/cmdline").unwrap();
    let host_pid1: Vec<String> = host_pid1
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(text)
        .collect();
    assert_eq!(pid1_command(d, &id).await, host_pid1.join(" "));
    let me = std::process::id().to_string();
    let r = d
        .exec_sync(&id, &["test", "-d", &format!("/proc/{me}")], 10)
        .await
        .unwrap();
    assert_eq!(
        r.exit_code, 0,
        "the test process {me} is not visible in a host-pid container"
    );

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// A container joining its pod's pid namespace on a cgroup v1 node, whose pid in the pod is one
/// no host process has: libcontainer would look that pid up in the host's /proc to mount the
/// cgroup hierarchies ("failed to prepare rootfs"). crishim binds the container's own cgroups
/// instead, and the container sees its own limits there. (On a cgroup v2 node there is nothing
/// to check: the container mounts cgroup2 in its own cgroup namespace.)
#[tokio::test]
async fn a_container_joining_a_busy_pod_pid_namespace_gets_its_own_cgroups() {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        eprintln!("cgroup v2 node: the v1 emulation is not used");
        return;
    }
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut cfg = env.pod_config("pid-busy");
    set_pod_namespaces(&mut cfg, namespaces(NS_POD, NS_POD, NS_POD));
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox pid POD");
    let mut traces = PodTraces::new(&pod, &cfg);
    // The next pid in the pod's namespace: one above every host pid, so no host process has it.
    let highest = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .max()
        .unwrap();
    let next = highest + 1000;
    let infra = d.infra_pid(&pod).await.unwrap();
    let o = std::process::Command::new("nsenter")
        .args(["-t", &infra.to_string(), "-p", "--", "sh", "-c"])
        .arg(format!("echo {} > /proc/sys/kernel/ns_last_pid", next - 1))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!Path::new(&format!("/proc/{next}")).exists());
    let mut c = sh_container(&env, "busy", LOOP_UNTIL_TERM, &marker("busy"));
    c.linux
        .get_or_insert_with(Default::default)
        .resources
        .get_or_insert_with(Default::default)
        .memory_limit_in_bytes = 64 << 20;
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("a container whose pod pid has no host process");
    traces.add_container(&id);
    let pid_in_pod = d
        .exec_ok(
            &id,
            &["sh", "-c", "cat /proc/1/status | grep -c shim; echo $$"],
        )
        .await;
    assert!(
        pid_in_pod.starts_with("1\n"),
        "the pod's infra is pid 1: {pid_in_pod}"
    );
    assert_eq!(
        d.exec_ok(&id, &["cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"])
            .await
            .trim(),
        (64u64 << 20).to_string(),
        "the container's own memory cgroup"
    );
    let listing = d.exec_ok(&id, &["ls", "/sys/fs/cgroup"]).await;
    for want in ["cpu", "cpuacct", "memory", "pids"] {
        assert!(
            listing.split_whitespace().any(|n| n == want),
            "{want} in {listing}"
        );
    }
    let r = d
        .exec_sync(
            &id,
            &[
                "sh",
                "-c",
                "echo 1 > /sys/fs/cgroup/memory/memory.limit_in_bytes",
            ],
            30,
        )
        .await
        .unwrap();
    assert_ne!(r.exit_code, 0, "the cgroups are read-only");
    env.finish_pod(&pod, traces).await;
}
