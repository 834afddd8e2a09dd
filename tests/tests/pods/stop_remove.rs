//! Stopping and removing containers and pods.

use std::path::Path;
use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::pods::{
    assert_no_leaks, marker, mounts, processes_with_command, sh_container, wait_for_log_line,
    wait_no_process_with_command, PodEnv, PodTraces, IGNORE_TERM, LOOP_UNTIL_TERM,
};
use tonic::Code;

use cri::ContainerState::{ContainerCreated, ContainerExited, ContainerRunning};
use cri::PodSandboxState::SandboxNotready;

use super::{assert_code, WAIT};

/// A pod with one container that ignores SIGTERM, running (it has logged "ready"): the pod id, the
/// container id, the pod config, its traces and the container's command-line marker.
async fn stubborn_container(
    env: &PodEnv,
    name: &str,
) -> (String, String, cri::PodSandboxConfig, PodTraces, String) {
    let d = &env.d;
    let cfg = env.pod_config(name);
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let m = marker(name);
    let c = sh_container(
        env,
        name,
        &format!("trap '' TERM; echo ready; {IGNORE_TERM}"),
        &m,
    );
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run container");
    traces.add_container(&id);
    traces.capture(d).await;
    let log = Path::new(&cfg.log_directory).join(format!("{name}.log"));
    wait_for_log_line(&log, "stdout", "ready", WAIT).await;
    (pod, id, cfg, traces, m)
}

#[tokio::test]
async fn stop_container_ignoring_sigterm_is_killed_after_the_timeout() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let (pod, id, _cfg, traces, m) = stubborn_container(&env, "stubborn").await;

    let t0 = Instant::now();
    d.stop_container(&id, 2).await.expect("StopContainer");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(8),
        "StopContainer(timeout 2) of a process ignoring SIGTERM returned after {took:?}"
    );
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.state, ContainerExited as i32, "{st:#?}");
    assert_eq!(st.exit_code, 137, "{st:#?}");
    assert_eq!(st.reason, "Error", "{st:#?}");
    let left = wait_no_process_with_command(&m, Duration::from_secs(3)).await;
    assert!(left.is_empty(), "killed container still runs: {left:#?}");

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// `ContainerConfig.stop_signal` (Kubernetes 1.33+) comes before the image's STOPSIGNAL: a
/// container that ignores SIGTERM and exits 42 on SIGUSR1 stops on the first signal, before the
/// grace period, and its status reports the signal.
#[tokio::test]
async fn stop_signal_from_the_container_config_reaches_the_container() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("usr1");
    let m = marker("usr1");
    let mut c = sh_container(
        &env,
        "usr1",
        &format!("trap '' TERM; trap 'echo got-usr1; exit 42' USR1; echo ready; {IGNORE_TERM}"),
        &m,
    );
    c.stop_signal = cri::Signal::Sigusr1 as i32;
    let (pod, id, traces) = env.run_traced(&cfg, &c).await;
    let log = Path::new(&cfg.log_directory).join("usr1.log");
    wait_for_log_line(&log, "stdout", "ready", WAIT).await;
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.stop_signal, cri::Signal::Sigusr1 as i32, "{st:#?}");

    let t0 = Instant::now();
    d.stop_container(&id, 30).await.expect("StopContainer");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    wait_for_log_line(&log, "stdout", "got-usr1", WAIT).await;
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.exit_code, 42, "the trap's exit, not SIGKILL: {st:#?}");

    let mut bad = sh_container(&env, "badsig", "true", &marker("badsig"));
    bad.stop_signal = 4242;
    let e = d.create_container(&pod, &bad, &cfg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// `StopContainer` with `timeout = i64::MAX` overflowed `Instant + Duration` and panicked in the
/// handler after SIGTERM. It must wait (the client gives up at its deadline), panic nothing, and
/// leave the container stoppable: a later stop with timeout 1 kills it.
#[tokio::test]
async fn stop_container_with_an_i64_max_timeout_panics_nothing_and_a_later_stop_kills() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let (pod, id, _cfg, traces, m) = stubborn_container(&env, "forever").await;

    let mut req = tonic::Request::new(cri::StopContainerRequest {
        container_id: id.clone(),
        timeout: i64::MAX,
    });
    req.set_timeout(Duration::from_secs(2));
    let r = d.runtime_client().stop_container(req).await;
    assert!(
        matches!(&r, Err(e) if matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled)),
        "a stop with i64::MAX seconds waits on a process ignoring SIGTERM: {r:?}"
    );
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.state, ContainerRunning as i32, "{st:#?}");

    let t0 = Instant::now();
    d.stop_container(&id, 1).await.expect("StopContainer(1)");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.state, ContainerExited as i32, "{st:#?}");
    assert_eq!(st.exit_code, 137, "{st:#?}");
    let left = wait_no_process_with_command(&m, Duration::from_secs(3)).await;
    assert!(left.is_empty(), "killed container still runs: {left:#?}");
    let log = d.log_text();
    assert!(!log.contains("panicked"), "the daemon panicked:\n{log}");

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

#[tokio::test]
async fn remove_pod_sandbox_with_running_containers_removes_everything() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("rm-running");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let mut markers = Vec::new();
    let mut ctrs = Vec::new();
    for name in ["one", "two"] {
        let m = marker(name);
        let script = if name == "one" {
            LOOP_UNTIL_TERM
        } else {
            IGNORE_TERM
        };
        let id = d
            .run_container(&pod, &sh_container(&env, name, script, &m), &cfg)
            .await
            .expect("run container");
        traces.add_container(&id);
        markers.push(m);
        ctrs.push(id);
    }
    traces.capture(d).await;
    for m in &markers {
        assert!(!processes_with_command(m).is_empty(), "{m} is not running");
    }

    d.remove_pod(&pod)
        .await
        .expect("RemovePodSandbox of a running pod");
    assert_code(d.pod_status(&pod).await, Code::NotFound, "PodSandboxStatus");
    for id in &ctrs {
        assert_code(
            d.container_status(id).await,
            Code::NotFound,
            "ContainerStatus",
        );
    }
    assert!(d.list_container_ids(None).await.unwrap().is_empty());
    assert!(d.list_pod_ids(None).await.unwrap().is_empty());
    for m in &markers {
        let left = wait_no_process_with_command(m, Duration::from_secs(5)).await;
        assert!(
            left.is_empty(),
            "container of a removed pod runs: {left:#?}"
        );
    }
    assert_no_leaks(d, &traces).await;
    env.stop();
}

#[tokio::test]
async fn stopping_and_removing_twice_is_fine_for_containers_and_pods() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("twice-stop");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let running = d
        .run_container(
            &pod,
            &sh_container(&env, "running", LOOP_UNTIL_TERM, &marker("r")),
            &cfg,
        )
        .await
        .expect("run container");
    let created = d
        .create_container(
            &pod,
            &sh_container(&env, "created", LOOP_UNTIL_TERM, &marker("c")),
            &cfg,
        )
        .await
        .expect("create container");
    traces.add_container(&running);
    traces.add_container(&created);
    traces.capture(d).await;

    d.stop_container(&running, 10).await.expect("StopContainer");
    d.stop_container(&running, 10)
        .await
        .expect("StopContainer of an exited container");
    assert_eq!(
        d.container_status(&running).await.unwrap().state,
        ContainerExited as i32
    );
    d.remove_container(&running).await.expect("RemoveContainer");
    d.remove_container(&running)
        .await
        .expect("RemoveContainer of a removed container");
    assert_code(
        d.container_status(&running).await,
        Code::NotFound,
        "ContainerStatus",
    );

    assert_eq!(
        d.container_status(&created).await.unwrap().state,
        ContainerCreated as i32
    );
    d.remove_container(&created)
        .await
        .expect("RemoveContainer of a created container");
    d.remove_container(&created)
        .await
        .expect("RemoveContainer of a removed container");
    assert_code(
        d.container_status(&created).await,
        Code::NotFound,
        "ContainerStatus",
    );

    d.stop_pod(&pod).await.expect("StopPodSandbox");
    d.stop_pod(&pod)
        .await
        .expect("StopPodSandbox of a stopped pod");
    assert_eq!(
        d.pod_status(&pod).await.unwrap().state,
        SandboxNotready as i32
    );
    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    d.remove_pod(&pod)
        .await
        .expect("RemovePodSandbox of a removed pod");
    assert_code(d.pod_status(&pod).await, Code::NotFound, "PodSandboxStatus");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// StopPodSandbox unmounts its containers' rootfs (while the CNI DEL runs); what they wrote
/// stays in the writable layer, and the container's status with it, until RemovePodSandbox.
#[tokio::test]
async fn a_stopped_pods_containers_keep_their_writable_layer_but_not_their_rootfs_mount() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("stop-unmounts");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let id = d
        .run_container(
            &pod,
            &sh_container(&env, "writer", LOOP_UNTIL_TERM, &marker("w")),
            &cfg,
        )
        .await
        .expect("run container");
    traces.add_container(&id);
    traces.capture(d).await;
    d.exec_ok(&id, &["sh", "-c", "echo kept > /written"]).await;
    let rootfs = d.state_dir().join("containers").join(&id).join("rootfs");
    let is_mounted = || mounts().iter().any(|m| Path::new(&m.mount_point) == rootfs);
    assert!(
        is_mounted(),
        "{} is not mounted while the container runs",
        rootfs.display()
    );

    d.stop_pod(&pod).await.expect("StopPodSandbox");
    assert!(
        !is_mounted(),
        "{} is still mounted after StopPodSandbox",
        rootfs.display()
    );
    let written = d
        .root_dir()
        .join("images/containers")
        .join(&id)
        .join("upper/written");
    assert_eq!(
        std::fs::read_to_string(&written).ok().as_deref(),
        Some("kept\n"),
        "the writable layer lost what the container wrote"
    );
    assert_eq!(
        d.container_status(&id).await.unwrap().state,
        ContainerExited as i32
    );

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert!(
        !written.exists(),
        "the writable layer outlived RemovePodSandbox"
    );
    assert_no_leaks(d, &traces).await;
    env.stop();
}
