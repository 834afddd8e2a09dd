//! The systemd cgroup driver against a real systemd: one booted in its own namespaces on this
//! host's cgroup v2 tree (`crishim_tests::systemd`), with the daemon running inside it. Pods use
//! the node's network, since the CNI bridge would live outside systemd's namespaces.

use std::time::Duration;

use crishim_proto::cri;
use crishim_tests::daemon::serve_expecting_exit;
use crishim_tests::pods::{namespaces, PodEnv, LOOP_UNTIL_TERM, NS_CONTAINER, NS_NODE, NS_POD};
use crishim_tests::systemd::NestedSystemd;
use crishim_tests::{random_hex, DaemonOptions};

const SYSTEMD_DRIVER: &str = "cgroup_driver = \"systemd\"\n";

#[tokio::test]
async fn containers_are_scopes_in_the_pods_slice_under_the_systemd_driver() {
    let sd = NestedSystemd::boot().expect("booting systemd");
    let env = PodEnv::start_with(
        DaemonOptions::new()
            .extra_toml(SYSTEMD_DRIVER)
            .wrapper(sd.enter()),
    )
    .await;
    let driver = env.d.runtime_config().await.unwrap().linux.unwrap();
    assert_eq!(driver.cgroup_driver, cri::CgroupDriver::Systemd as i32);

    let mut pod_cfg = env.pod_config("sd");
    let linux = pod_cfg.linux.as_mut().unwrap();
    linux.security_context.as_mut().unwrap().namespace_options =
        Some(namespaces(NS_NODE, NS_CONTAINER, NS_POD));
    pod_cfg.hostname.clear();

    // A cgroupfs parent is refused, naming the kubelet flag that fixes it.
    let e = env
        .d
        .run_pod(&pod_cfg)
        .await
        .expect_err("a cgroupfs parent");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("--cgroup-driver=systemd"), "{e:?}");

    // The kubelet's systemd name for a BestEffort pod.
    let uid = random_hex(8);
    let slice = format!("kubepods-besteffort-pod{uid}.slice");
    pod_cfg.linux.as_mut().unwrap().cgroup_parent = slice.clone();
    let pod = env.d.run_pod(&pod_cfg).await.expect("RunPodSandbox");
    let mut c = env.container_config("c", &["sh", "-c", LOOP_UNTIL_TERM]);
    c.linux = Some(cri::LinuxContainerConfig {
        resources: Some(cri::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 64 << 20,
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = env
        .d
        .run_container(&pod, &c, &pod_cfg)
        .await
        .expect("running a container");

    let scope = format!("crishim-{id}.scope");
    let want = format!(
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/{scope}"
    );
    assert_eq!(sd.property(&scope, "ActiveState"), "active");
    assert_eq!(sd.property(&scope, "Slice"), slice);
    assert_eq!(sd.property(&scope, "ControlGroup"), want);
    let procs = std::fs::read_to_string(sd.cgroup_dir(&want).join("cgroup.procs"))
        .expect("reading the scope's cgroup.procs");
    assert!(
        !procs.trim().is_empty(),
        "the container's process is in its scope"
    );

    // Limits become the scope's properties, at create and live.
    let limits =
        |sd: &NestedSystemd| ["CPUQuotaPerSecUSec", "MemoryMax"].map(|p| sd.property(&scope, p));
    assert_eq!(limits(&sd), ["500ms", &(64u64 << 20).to_string()]);
    // libcgroups (youki 0.7) gives up on a D-Bus connection to this nested systemd when its
    // socket answers EAGAIN 7 times in a row, which this loaded 2-core machine sees in about one
    // run in two (see docs/kubelet.md, the known stall); only that transport error is tried again.
    for attempt in 1..=3 {
        let r = update(&env, &id, 20_000, 128 << 20).await;
        match r {
            Ok(_) => break,
            // A D-Bus stall is Unavailable, which the kubelet retries; any other code fails.
            Err(e) if attempt < 3 && e.code() == tonic::Code::Unavailable => {
                eprintln!(
                    "UpdateContainerResources, attempt {attempt}: {}",
                    e.message()
                );
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
            Err(e) => panic!("UpdateContainerResources: {e:?}"),
        }
    }
    assert_eq!(limits(&sd), ["200ms", &(128u64 << 20).to_string()]);
    // Each update's D-Bus connection is closed again: the shim, which lives as long as the pod,
    // holds no more descriptors after three more updates than before them.
    let shim_pid = crishim_proto::shim::pid_file::read(
        &env.d.state_dir().join("pods").join(&pod).join("shim.pid"),
    )
    .expect("the shim's pid file")
    .pid
    .to_string();
    // (Its pid is one of systemd's pid namespace, where the daemon runs.)
    let shim_fds = || {
        sd.run(&[
            "sh",
            "-c",
            &format!("ls /proc/{}/fd | wc -l", shim_pid.trim()),
        ])
    };
    let before = shim_fds();
    assert!(
        before.parse::<usize>().is_ok_and(|n| n > 2),
        "the shim's descriptors: {before:?}"
    );
    for _ in 0..3 {
        update(&env, &id, 20_000, 128 << 20)
            .await
            .expect("UpdateContainerResources");
    }
    assert_eq!(shim_fds(), before, "the shim leaked descriptors on updates");
    // Stats are read from the scope's cgroup.
    let stats = env
        .d
        .runtime_client()
        .container_stats(cri::ContainerStatsRequest {
            container_id: id.clone(),
        })
        .await
        .expect("ContainerStats")
        .into_inner()
        .stats
        .unwrap();
    let cpu = stats.cpu.unwrap().usage_core_nano_seconds.unwrap().value;
    assert!(cpu > 0, "CPU usage read from the scope's cpu.stat");

    // libcgroups never closes its D-Bus connections (root's, to systemd): none may reach the
    // container's processes, where one would be a way onto the host (StartTransientUnit).
    for pid in ["1", "$$"] {
        let fds = env
            .d
            .exec_ok(&id, &["sh", "-c", &format!("ls -l /proc/{pid}/fd")])
            .await;
        assert!(
            !fds.contains("socket:"),
            "process {pid} holds a socket: {fds}"
        );
    }

    env.d.stop_container(&id, 10).await.unwrap();
    env.d.remove_container(&id).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sd.property(&scope, "ActiveState") == "active" || sd.cgroup_dir(&want).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the scope outlived its container: {}, {}",
            sd.property(&scope, "ActiveState"),
            sd.cgroup_dir(&want).display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    // Killing systemd's namespace ends the daemon too.
    drop(sd);
}

/// On a host without cgroup v2 at /sys/fs/cgroup or without a reachable systemd, the daemon
/// refuses to start with the systemd driver, rather than failing every pod later.
#[tokio::test]
async fn the_systemd_driver_is_refused_where_it_cannot_work() {
    if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        && std::path::Path::new("/run/systemd/private").exists()
    {
        eprintln!("this host can run the systemd driver; nothing to refuse");
        return;
    }
    let opts = DaemonOptions::new().extra_toml(SYSTEMD_DRIVER);
    let out = serve_expecting_exit(&opts, Duration::from_secs(30))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exited {}", out.status);
    assert!(
        stderr.contains("cgroup_driver = \"systemd\""),
        "stderr does not say why: {stderr}"
    );
}

async fn update(env: &PodEnv, id: &str, cpu_quota: i64, memory: i64) -> Result<(), tonic::Status> {
    env.d
        .runtime_client()
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: id.to_string(),
            linux: Some(cri::LinuxContainerResources {
                cpu_period: 100_000,
                cpu_quota,
                cpu_shares: 512,
                memory_limit_in_bytes: memory,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .map(|_| ())
}
