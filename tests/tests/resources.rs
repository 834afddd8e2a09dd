//! Container resources: limits reach the container's cgroup, and a container that goes over its
//! memory limit ends with reason `OOMKilled`.

use std::time::Duration;

use crishim_proto::cri;
use crishim_tests::pods::{assert_no_leaks, PodEnv, PodTraces};

const MIB: i64 = 1 << 20;

/// The container's v1 cgroup directory for `controller`, from its process's /proc/<pid>/cgroup.
fn cgroup_dir(pid: i32, controller: &str) -> std::path::PathBuf {
    let p = crishim_tests::pods::read_process(pid).expect("container process");
    let rel = p.cgroup_of(controller).expect("cgroup of the container");
    std::path::Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(rel.trim_start_matches('/'))
}

#[tokio::test]
async fn limits_reach_the_cgroup_and_going_over_memory_is_oom_killed() {
    if !std::path::Path::new("/sys/fs/cgroup/memory").exists() {
        eprintln!("skipped: this test reads cgroup v1 files");
        return;
    }
    let env = PodEnv::start().await;
    let pod_cfg = env.pod_config("res");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);

    let mut cfg = env.container_config("limited", &["sleep", "3600"]);
    cfg.linux.get_or_insert_with(Default::default).resources = Some(cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 512,
        memory_limit_in_bytes: 64 * MIB,
        ..Default::default()
    });
    let limited = env.d.create_container(&pod, &cfg, &pod_cfg).await.unwrap();
    traces.add_container(&limited);
    // From creation on, before it starts, as the kubelet's in-place resize expects.
    let created = env.d.container_status(&limited).await.unwrap();
    let asked = created
        .resources
        .expect("ContainerStatus.resources of a created container")
        .linux
        .unwrap();
    assert_eq!(
        (asked.cpu_quota, asked.memory_limit_in_bytes),
        (50_000, 64 * MIB)
    );
    env.d.start_container(&limited).await.unwrap();
    let info = env
        .d
        .runtime_client()
        .container_status(cri::ContainerStatusRequest {
            container_id: limited.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let pid = serde_json::from_str::<serde_json::Value>(&info.info["info"]).unwrap()["pid"]
        .as_i64()
        .unwrap() as i32;
    let read = |controller: &str, file: &str| {
        std::fs::read_to_string(cgroup_dir(pid, controller).join(file))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(
        read("memory", "memory.limit_in_bytes"),
        (64 * MIB).to_string()
    );
    assert_eq!(read("cpu", "cpu.cfs_quota_us"), "50000");
    assert_eq!(read("cpu", "cpu.cfs_period_us"), "100000");
    assert_eq!(read("cpu", "cpu.shares"), "512");
    // ContainerStatus reports what the cgroup enforces (KEP-1287).
    let in_force = |st: cri::ContainerStatus| {
        let r = st
            .resources
            .expect("ContainerStatus.resources")
            .linux
            .unwrap();
        (
            r.cpu_period,
            r.cpu_quota,
            r.cpu_shares,
            r.memory_limit_in_bytes,
        )
    };
    let st = env.d.container_status(&limited).await.unwrap();
    assert_eq!(in_force(st), (100_000, 50_000, 512, 64 * MIB));

    // Changed live, while it runs.
    env.d
        .runtime_client()
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: limited.clone(),
            linux: Some(cri::LinuxContainerResources {
                cpu_period: 100_000,
                cpu_quota: 25_000,
                memory_limit_in_bytes: 128 * MIB,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("UpdateContainerResources");
    assert_eq!(
        read("memory", "memory.limit_in_bytes"),
        (128 * MIB).to_string()
    );
    assert_eq!(read("cpu", "cpu.cfs_quota_us"), "25000");
    let st = env.d.container_status(&limited).await.unwrap();
    assert_eq!(in_force(st), (100_000, 25_000, 512, 128 * MIB));
    let r = env
        .d
        .runtime_client()
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: "no-such-container".into(),
            linux: Some(Default::default()),
            ..Default::default()
        })
        .await;
    assert_eq!(r.unwrap_err().code(), tonic::Code::NotFound);

    // `tail -n 1` of data without newlines holds it all: far past 32 MiB.
    let mut hog = env.container_config(
        "hog",
        &[
            "sh",
            "-c",
            "head -c 300000000 /dev/zero | tail -n 1 > /dev/null",
        ],
    );
    hog.linux.get_or_insert_with(Default::default).resources = Some(cri::LinuxContainerResources {
        memory_limit_in_bytes: 32 * MIB,
        ..Default::default()
    });
    let hog = env.d.run_container(&pod, &hog, &pod_cfg).await.unwrap();
    traces.add_container(&hog);
    traces.capture(&env.d).await;
    let status = env
        .d
        .wait_container_state(
            &hog,
            cri::ContainerState::ContainerExited,
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(status.reason, "OOMKilled", "status: {status:?}");
    assert_ne!(status.exit_code, 0);

    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}
