//! Pod processes are held by pidfd, not by pid. Once a pod's infra process is gone, its pid may
//! be any process's (the host's namespaces included); a port-forward, an exec or a create must
//! then be refused, never land in the namespaces of whatever took the pid. The pid reuse is made
//! real here: `ns_last_pid` hands the infra's old pid to a `sleep` in the host's namespaces.

use std::time::Duration;

use crishim_proto::cri;
use crishim_streaming::client;
use crishim_tests::pods::PodEnv;

/// A `sleep` in the host's namespaces that holds `pid`, if the kernel gives it that pid within
/// a few tries (another process may fork in between).
fn take_pid(pid: i32) -> Option<std::process::Child> {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", pid - 1)).ok()?;
        let child = std::process::Command::new("sleep").arg("60").spawn().ok()?;
        if child.id() as i32 == pid {
            return Some(child);
        }
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }
    None
}

fn killed(child: Option<std::process::Child>) {
    if let Some(mut c) = child {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// After StopPodSandbox: PortForward, CreateContainer, ExecSync and Exec are FailedPrecondition,
/// and a port-forward URL handed out before the stop reaches nothing, even with the infra's pid
/// taken by a process in the host's network namespace where a listener waits on the port.
#[tokio::test]
async fn a_stopped_pod_is_reached_through_no_reused_pid() {
    let env = PodEnv::start().await;
    let (pod, ctr) = env.run_sleeping("pidfd-stop").await;
    let infra = env.d.infra_pid(&pod).await.expect("infra pid");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let early = env
        .d
        .runtime_client()
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: pod.clone(),
            port: vec![port as i32],
        })
        .await
        .expect("PortForward while ready")
        .into_inner()
        .url;
    env.d.stop_pod(&pod).await.expect("StopPodSandbox");
    let taker = take_pid(infra);
    eprintln!(
        "pid {infra} retaken in the host's namespaces: {}",
        taker.is_some()
    );

    // (a) A new PortForward is refused; the early URL forwards nowhere.
    let e = env
        .d
        .runtime_client()
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: pod.clone(),
            port: vec![port as i32],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let (conn, _) = client::spdy_connect(&early, &["portforward.k8s.io"])
        .await
        .expect("the early URL still upgrades");
    let h = |kind: &str| {
        vec![
            ("streamType".to_string(), kind.to_string()),
            ("port".to_string(), port.to_string()),
            ("requestID".to_string(), "0".to_string()),
        ]
    };
    let mut err = conn.open(h("error")).await.unwrap();
    let data = conn.open(h("data")).await.unwrap();
    let _ = data.tx.write(b"hello").await;
    let msg = tokio::time::timeout(Duration::from_secs(20), err.rx.recv())
        .await
        .expect("an answer on the error stream")
        .map(|m| String::from_utf8_lossy(&m).into_owned());
    assert!(
        msg.as_deref().is_some_and(|m| m.contains("not ready")),
        "{msg:?}"
    );
    let reached = listener.accept();
    assert!(
        matches!(&reached, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the host's listener was reached through the stopped pod: {reached:?}"
    );

    // (b) CreateContainer.
    let cfg = env.pod_config("pidfd-stop");
    let c = env.container_config("late", &["sleep", "1000"]);
    let e = env.d.create_container(&pod, &c, &cfg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");

    // (c) ExecSync and Exec on the stopped pod's container.
    let e = env
        .d
        .exec_sync(&ctr, &["true"], 5)
        .await
        .expect_err("ExecSync on a stopped pod");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let e = env
        .d
        .runtime_client()
        .exec(cri::ExecRequest {
            container_id: ctr.clone(),
            cmd: vec!["true".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    killed(taker);
    env.stop();
}

/// A ready pod whose infra process died and whose pid a host process took: a create is refused
/// (it would join the host's network, IPC and UTS namespaces through `/proc/<pid>/ns/*`).
#[tokio::test]
async fn a_create_never_joins_the_namespaces_of_a_reused_infra_pid() {
    let env = PodEnv::start().await;
    let cfg = env.pod_config("pidfd-reuse");
    let pod = env.d.run_pod(&cfg).await.expect("RunPodSandbox");
    let infra = env.d.infra_pid(&pod).await.expect("infra pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(infra),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Its shim reaps it; then the pid is free.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{infra}")).exists() {
        assert!(std::time::Instant::now() < deadline, "infra never reaped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let taker = take_pid(infra);
    eprintln!(
        "pid {infra} retaken in the host's namespaces: {}",
        taker.is_some()
    );
    let c = env.container_config("main", &["sleep", "1000"]);
    let e = env.d.create_container(&pod, &c, &cfg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("infra process"),
        "names the gone infra process: {e:?}"
    );
    killed(taker);
    env.stop();
}
