//! Runtime basics: version and status, SIGPIPE's disposition, host-network hostnames and short
//! ids, start errors, runtime handlers.

use std::path::Path;
use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::pods::{
    container_state_filter, namespaces, set_pod_namespaces, PodEnv, NS_NODE, NS_POD,
};
use crishim_tests::{Daemon, DaemonOptions};
use tonic::Code;

#[tokio::test]
async fn version_status_and_runtime_config() {
    let d = Daemon::start(DaemonOptions::new())
        .await
        .expect("starting crishim serve");
    let v = d.version().await.expect("Version");
    assert_eq!(v.runtime_name, "crishim", "{v:?}");
    assert_eq!(v.runtime_api_version, "v1", "{v:?}");
    assert!(!v.runtime_version.is_empty(), "{v:?}");
    assert!(!v.version.is_empty(), "{v:?}");

    let s = d.runtime_status().await.expect("Status");
    let conds = s.status.map(|s| s.conditions).unwrap_or_default();
    assert!(
        conds.iter().any(|c| c.r#type == "RuntimeReady" && c.status),
        "RuntimeReady is not true: {conds:#?}"
    );

    let rc = d.runtime_config().await.expect("RuntimeConfig");
    assert_eq!(
        rc.linux.map(|l| l.cgroup_driver),
        Some(cri::CgroupDriver::Cgroupfs as i32)
    );
    d.update_runtime_config("10.88.0.0/16")
        .await
        .expect("UpdateRuntimeConfig");
    d.stop();
}

/// The SigIgn mask of `/proc/self/status` as `cat` (exec'd by `sh`) sees it.
fn sigign(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no SigIgn line in {status:?}"))
}

#[tokio::test]
async fn container_processes_start_with_sigpipe_at_its_default() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("sigpipe");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let c = env.container_config("main", &["sh", "-c", "cat /proc/self/status; sleep 1000"]);
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run container");
    let log = Path::new(&cfg.log_directory).join("main.log");
    let t0 = std::time::Instant::now();
    let status = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("SigIgn:") {
            break text;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no status in the log"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let pipe = 1u64 << (libc::SIGPIPE - 1);
    let line = status.lines().find(|l| l.contains("SigIgn:")).unwrap();
    let mask = sigign(line.split(" F ").nth(1).unwrap_or(line));
    assert_eq!(
        mask & pipe,
        0,
        "the container's process ignores SIGPIPE: {line}"
    );
    let out = d.exec_ok(&id, &["cat", "/proc/self/status"]).await;
    assert_eq!(
        sigign(&out) & pipe,
        0,
        "an ExecSync process ignores SIGPIPE"
    );
    // What that is for: a pipeline whose reader left ends by SIGPIPE, silently.
    let r = d
        .exec_sync(&id, &["sh", "-c", "yes | head -n 1"], 10)
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.stderr.as_slice()), (0, &b""[..]), "{r:?}");
    d.stop_pod(&pod).await.unwrap();
    d.remove_pod(&pod).await.unwrap();
    env.stop();
}

/// A pod on the node's network shares its UTS namespace, so a hostname of its own is refused (as
/// containerd refuses it), and pods and containers are found by the 13-character ids `crictl ps`
/// prints, over every RPC that takes an id.
#[tokio::test]
async fn host_network_hostnames_are_refused_and_short_ids_work() {
    let env = PodEnv::start().await;
    let mut host = env.pod_config("hostnet");
    set_pod_namespaces(&mut host, namespaces(NS_NODE, NS_POD, NS_POD));
    host.hostname = "mine".into();
    let e = env.d.run_pod(&host).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("hostname"), "{e:?}");

    let (pod, id) = env.run_sleeping("short-ids").await;
    let (short_pod, short) = (&pod[..13], &id[..13]);
    let rc = env.d.runtime_client();
    let st = env
        .d
        .container_status(short)
        .await
        .expect("ContainerStatus by a short id");
    assert_eq!(st.id, id);
    let ps = rc
        .clone()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: short_pod.into(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus by a short id")
        .into_inner();
    assert_eq!(ps.status.map(|s| s.id), Some(pod.clone()));
    let r = env
        .d
        .exec_sync(short, &["echo", "hi"], 10)
        .await
        .expect("ExecSync");
    assert_eq!(r.stdout, b"hi\n");
    rc.clone()
        .container_stats(cri::ContainerStatsRequest {
            container_id: short.into(),
        })
        .await
        .expect("ContainerStats by a short id");
    rc.clone()
        .exec(cri::ExecRequest {
            container_id: short.into(),
            cmd: vec!["true".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .expect("Exec by a short id");
    // A prefix of both the pod's and the container's id is not one of either kind.
    let e = env.d.container_status("zz").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    rc.clone()
        .stop_container(cri::StopContainerRequest {
            container_id: short.into(),
            timeout: 0,
        })
        .await
        .expect("StopContainer by a short id");
    rc.clone()
        .remove_container(cri::RemoveContainerRequest {
            container_id: short.into(),
        })
        .await
        .expect("RemoveContainer by a short id");
    assert_eq!(
        env.d.container_status(&id).await.unwrap_err().code(),
        tonic::Code::NotFound,
        "removed through its short id"
    );
    rc.clone()
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: short_pod.into(),
        })
        .await
        .expect("StopPodSandbox by a short id");
    rc.clone()
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: short_pod.into(),
        })
        .await
        .expect("RemovePodSandbox by a short id");
    env.stop();
}

/// A command that is not in the image fails at `StartContainer`, not at create, and leaves the
/// container exited with 128 and `StartError`, which `kubectl describe` shows (containerd's way).
#[tokio::test]
async fn a_missing_executable_is_a_start_error() {
    let env = PodEnv::start().await;
    let cfg = env.pod_config("start-error");
    let pod = env.d.run_pod(&cfg).await.expect("RunPodSandbox");
    let c = env.container_config("main", &["no-such-command-here"]);
    let id = env
        .d
        .create_container(&pod, &c, &cfg)
        .await
        .expect("CreateContainer accepts a command it cannot find yet");
    let created = env.d.container_status(&id).await.expect("ContainerStatus");
    assert_eq!(created.state, cri::ContainerState::ContainerCreated as i32);

    let e = env.d.start_container(&id).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("no-such-command-here"), "{e:?}");
    let st = env.d.container_status(&id).await.expect("ContainerStatus");
    assert_eq!(st.state, cri::ContainerState::ContainerExited as i32);
    assert_eq!((st.exit_code, st.reason.as_str()), (128, "StartError"));
    assert!(st.message.contains("not found"), "{st:?}");
    assert!(st.finished_at > 0 && st.started_at == 0, "{st:?}");
    // It is listed as exited, and goes away like any exited container.
    let exited = env
        .d
        .list_container_ids(Some(container_state_filter(
            cri::ContainerState::ContainerExited,
        )))
        .await
        .expect("ListContainers");
    assert_eq!(exited, vec![id.clone()]);
    env.d.remove_container(&id).await.expect("RemoveContainer");

    // A request-sized command is not echoed whole, in the error or in the recorded status.
    let long = "x".repeat(64 << 10);
    let huge = env.container_config("huge", &[long.as_str()]);
    let id = env
        .d
        .create_container(&pod, &huge, &cfg)
        .await
        .expect("CreateContainer");
    let e = env.d.start_container(&id).await.unwrap_err();
    assert!(e.message().len() < 1024, "{} bytes", e.message().len());
    let st = env.d.container_status(&id).await.expect("ContainerStatus");
    assert_eq!(st.reason, "StartError");
    assert!(st.message.len() < 1024, "{} bytes", st.message.len());
    env.d.remove_container(&id).await.expect("RemoveContainer");

    // Stopped before it was started, it is exited at once (nothing would ever exit).
    let id = env
        .d
        .create_container(&pod, &c, &cfg)
        .await
        .expect("CreateContainer");
    let t = Instant::now();
    env.d.stop_container(&id, 30).await.expect("StopContainer");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    let st = env.d.container_status(&id).await.expect("ContainerStatus");
    assert_eq!(st.state, cri::ContainerState::ContainerExited as i32);
    env.d.remove_container(&id).await.expect("RemoveContainer");
    env.d.stop_pod(&pod).await.expect("StopPodSandbox");
    env.d.remove_pod(&pod).await.expect("RemovePodSandbox");
    env.stop();
}

/// A RuntimeClass handler the node lacks (a sandboxed one, say) is refused by name, not run
/// without the isolation it asked for; `Status` lists the handlers there are.
#[tokio::test]
async fn an_unknown_runtime_handler_is_refused() {
    let env = PodEnv::start().await;
    let cfg = env.pod_config("handler");
    let e = env
        .d
        .runtime_client()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cfg.clone()),
            runtime_handler: "kata".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("\"kata\""), "{e:?}");
    assert!(env.d.list_pod_ids(None).await.unwrap().is_empty());
    let status = env.d.runtime_status().await.expect("Status");
    let names: Vec<&str> = status
        .runtime_handlers
        .iter()
        .map(|h| h.name.as_str())
        .collect();
    assert_eq!(names, [""]);
    // PullImage names a handler too (one image store serves them all).
    let e = env
        .d
        .image_client()
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: env.image(),
                runtime_handler: "kata".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    // Labels and annotations are capped (every relist repeats them).
    let mut fat = cfg.clone();
    fat.annotations = (0..300)
        .map(|i| (format!("a{i}"), "x".repeat(1024)))
        .collect();
    let e = env.d.run_pod(&fat).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("annotations"), "{e:?}");
    assert!(env.d.list_pod_ids(None).await.unwrap().is_empty());
    // The same pod with the default handler runs.
    let pod = env.d.run_pod(&cfg).await.expect("RunPodSandbox");
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    env.stop();
}
