//! The optional init (`crishim.io/init: "true"`): a container whose own program does not reap
//! gets crishim's minimal init as PID 1, which reaps orphans and forwards signals.
//!
//! Needs the static init that `hack/test.sh` builds (`CRISHIM_INIT_BIN`); skipped without it.

use crishim_proto::cri;
use std::time::{Duration, Instant};

use crishim_tests::pods::{
    assert_no_leaks, host_processes, PodEnv, PodTraces, NS_CONTAINER, NS_POD,
};

/// Orphans for PID 1: each subshell exits at once, leaving its `sleep` to the namespace's init.
const ORPHANS: &[&str] = &["sh", "-c", "for i in $(seq 20); do (sleep 0.01 &); done"];

/// Zombie children of the container's PID 1 (a zombie has left its cgroup, so the process tree is
/// what finds them).
async fn zombies_in(env: &PodEnv, container_id: &str) -> usize {
    let status = env
        .d
        .runtime_client()
        .container_status(crishim_proto::cri::ContainerStatusRequest {
            container_id: container_id.into(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&status.info["info"]).unwrap();
    let init = info["pid"].as_i64().unwrap() as i32;
    host_processes()
        .iter()
        .filter(|p| p.ppid == init && p.is_zombie())
        .count()
}

async fn run(env: &PodEnv, name: &str, init: bool) -> (String, String, PodTraces) {
    let mut pod_cfg = env.pod_config(name);
    crishim_tests::pods::set_pod_namespaces(
        &mut pod_cfg,
        crishim_tests::pods::namespaces(NS_POD, NS_CONTAINER, NS_POD),
    );
    // `sleep` as PID 1 never reaps.
    let mut cfg = env.container_config(name, &["sleep", "3600"]);
    cfg.annotations
        .insert("crishim.io/init".into(), init.to_string());
    env.run_traced(&pod_cfg, &cfg).await
}

#[tokio::test]
async fn init_reaps_orphans_and_forwards_stop_signals() {
    if std::env::var_os("CRISHIM_INIT_BIN").is_none() {
        eprintln!("skipped: CRISHIM_INIT_BIN is not set (run through hack/test.sh)");
        return;
    }
    let env = PodEnv::start().await;

    // Without init, the orphans stay zombies under `sleep`: what the init is for.
    let (pod, ctr, traces) = run(&env, "noinit", false).await;
    env.d.exec_ok(&ctr, ORPHANS).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let z = zombies_in(&env, &ctr).await;
    assert!(z >= 10, "expected zombies without an init, found {z}");
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;

    let (pod, ctr, traces) = run(&env, "init", true).await;
    let pid1 = env.d.exec_ok(&ctr, &["cat", "/proc/1/cmdline"]).await;
    assert!(pid1.starts_with("/.crishim/init"), "PID 1 is {pid1:?}");
    env.d.exec_ok(&ctr, ORPHANS).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while zombies_in(&env, &ctr).await > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        zombies_in(&env, &ctr).await,
        0,
        "the init must reap every orphan"
    );

    // SIGTERM reaches `sleep` through the init: it ends long before the grace period.
    let started = Instant::now();
    env.d.stop_container(&ctr, 20).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stop took {:?}",
        started.elapsed()
    );
    let status = env.d.container_status(&ctr).await.unwrap();
    assert_eq!(
        status.exit_code,
        128 + 15,
        "killed by the forwarded SIGTERM"
    );
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}

/// The CRI carries env values as bytes. One that is not UTF-8 (an OCI spec cannot hold it)
/// reaches the container's process and every exec'd process exactly, through crishim-init, with
/// or without init asked for; the process's PID 1 stays the program when it was not.
#[tokio::test]
async fn an_env_value_that_is_not_utf8_reaches_the_process_and_execs_exactly() {
    if std::env::var_os("CRISHIM_INIT_BIN").is_none() {
        eprintln!("skipped: CRISHIM_INIT_BIN is not set (run through hack/test.sh)");
        return;
    }
    let env = PodEnv::start().await;
    let pod_cfg = env.pod_config("rawenv");
    let mut cfg = env.container_config(
        "rawenv",
        &[
            "sh",
            "-c",
            "printf %s \"$BLOB\" > /tmp/blob; exec sleep 3600",
        ],
    );
    cfg.envs.push(cri::KeyValue {
        key: "BLOB".into(),
        value: vec![b'a', 0xff, 0xfe, b'\n', b'z'],
    });
    cfg.envs.push(cri::KeyValue {
        key: "PLAIN".into(),
        value: b"yes".to_vec(),
    });
    let (pod, ctr, traces) = env.run_traced(&pod_cfg, &cfg).await;
    let hex = |cmd: &str| {
        let env = &env;
        let ctr = ctr.clone();
        let cmd = cmd.to_string();
        async move {
            env.d
                .exec_ok(&ctr, &["sh", "-c", &cmd])
                .await
                .trim()
                .to_string()
        }
    };
    // The container's own process.
    assert_eq!(
        hex("od -An -tx1 /tmp/blob | tr -d ' \\n'").await,
        "61fffe0a7a"
    );
    // An exec'd process, and the carrier is gone from both.
    assert_eq!(
        hex("printf %s \"$BLOB\" | od -An -tx1 | tr -d ' \\n'").await,
        "61fffe0a7a"
    );
    assert_eq!(
        hex("echo $PLAIN ${CRISHIM_RAW_ENV:-unset}").await,
        "yes unset"
    );
    let pid1 = env.d.exec_ok(&ctr, &["cat", "/proc/1/cmdline"]).await;
    assert!(
        pid1.starts_with("sleep"),
        "init execs in place: PID 1 is {pid1:?}"
    );
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}
