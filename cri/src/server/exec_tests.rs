//! Unit tests of ExecSync, Exec, Attach and PortForward against the fake shims (`fakes.rs`):
//! what reaches the shim, what comes back, and which state refuses which request with which code.
//! No process runs: the fake shim answers `Exec` itself, and the streaming sessions behind the
//! URLs are left to the integration tests in `tests/`.

use crishim_proto::cri::runtime_service_server::RuntimeService as _;
use crishim_proto::cri::{self, ExecSyncResponse};
use crishim_proto::shim::{Request as ShimRequest, Response, MAX_EXEC_OUTPUT};
use tonic::{Code, Request, Status};

use super::fakes::TestNode;

type Node = TestNode;

impl TestNode {
    async fn exec_sync(
        &self,
        id: &str,
        cmd: &[&str],
        timeout: i64,
    ) -> Result<ExecSyncResponse, Status> {
        let req = cri::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|a| a.to_string()).collect(),
            timeout,
        };
        Ok(self.svc.exec_sync(Request::new(req)).await?.into_inner())
    }

    /// Exec of `sh` in `id` with stdout only, as `kubectl exec` without `-i`.
    async fn exec(&self, id: &str) -> Result<String, Status> {
        let req = cri::ExecRequest {
            container_id: id.into(),
            cmd: vec!["sh".into()],
            stdout: true,
            ..Default::default()
        };
        Ok(self.svc.exec(Request::new(req)).await?.into_inner().url)
    }

    /// Attach to `id`'s stdout.
    async fn attach(&self, id: &str) -> Result<String, Status> {
        let req = cri::AttachRequest {
            container_id: id.into(),
            stdout: true,
            ..Default::default()
        };
        Ok(self.svc.attach(Request::new(req)).await?.into_inner().url)
    }

    async fn port_forward(&self, pod: &str, ports: &[i32]) -> Result<String, Status> {
        let req = cri::PortForwardRequest {
            pod_sandbox_id: pod.into(),
            port: ports.to_vec(),
        };
        Ok(self
            .svc
            .port_forward(Request::new(req))
            .await?
            .into_inner()
            .url)
    }

    /// The `Exec` requests the shims got: pod, container, command and timeout.
    fn execs(&self) -> Vec<(String, String, Vec<String>, u64)> {
        let exec = |(pod, r)| match r {
            ShimRequest::Exec { id, args, timeout } => Some((pod, id, args, timeout)),
            _ => None,
        };
        self.shims.sent().into_iter().filter_map(exec).collect()
    }
}

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|a| a.to_string()).collect()
}

/// ExecSync by the 13-character id `crictl ps` prints: the command, with its timeout, goes to
/// the container's shim under its full id, and the shim's exit code and output come back as
/// they are.
#[tokio::test]
async fn exec_sync_runs_the_command_through_the_shim_and_returns_its_exit_code_and_output() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;

    let r = node.exec_sync(&c[..13], &["echo", "hi"], 10).await.unwrap();
    // The fake answers the command line it got.
    assert_eq!(
        (r.exit_code, r.stdout, r.stderr),
        (0, b"echo hi\n".to_vec(), Vec::new())
    );
    assert_eq!(
        node.execs(),
        [(pod.clone(), c.clone(), strings(&["echo", "hi"]), 10)]
    );

    node.shims.answer_next_exec(Response::Exec {
        exit_code: 3,
        stdout: b"partial".to_vec(),
        stderr: b"boom".to_vec(),
        timed_out: false,
    });
    let r = node.exec_sync(&c, &["false"], 0).await.unwrap();
    assert_eq!(
        (r.exit_code, r.stdout, r.stderr),
        (3, b"partial".to_vec(), b"boom".to_vec()),
        "a failing command is an answer, not an error"
    );
}

/// A command the shim killed at its timeout is `DeadlineExceeded`, naming the container, with
/// none of its output passed off as a result.
#[tokio::test]
async fn exec_sync_that_timed_out_in_the_shim_is_deadline_exceeded() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;
    node.shims.answer_next_exec(Response::Exec {
        exit_code: 137,
        stdout: b"half".to_vec(),
        stderr: Vec::new(),
        timed_out: true,
    });
    let e = node.exec_sync(&c, &["sleep", "60"], 1).await.unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(
        e.message().contains(&c) && e.message().contains("timed out after 1s"),
        "{e:?}"
    );
}

/// Output past what one gRPC message holds is cut, keeping the start of each stream and half
/// the room for stderr, so the reply can still be sent.
#[tokio::test]
async fn exec_sync_output_is_cut_to_fit_one_grpc_message() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;
    node.shims.answer_next_exec(Response::Exec {
        exit_code: 0,
        stdout: vec![b'o'; MAX_EXEC_OUTPUT],
        stderr: vec![b'e'; MAX_EXEC_OUTPUT],
        timed_out: false,
    });
    let r = node.exec_sync(&c, &["yes"], 0).await.unwrap();
    assert_eq!(r.stdout.len() + r.stderr.len(), MAX_EXEC_OUTPUT);
    assert_eq!(r.stderr.len(), MAX_EXEC_OUTPUT / 2);
}

/// ExecSync leaves the container's state to its shim, which refuses a container that is not
/// running (created, or exited): `FailedPrecondition` naming it.
#[tokio::test]
async fn exec_sync_in_a_container_that_is_not_running_is_failed_precondition() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let created = node.create(&pod, "created").await.unwrap();
    let exited = node.running(&pod, "exited").await;
    node.stop(&exited, 1).await.unwrap();
    for id in [&created, &exited] {
        let e = node.exec_sync(id, &["true"], 0).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message().contains(id.as_str()) && e.message().contains("not running"),
            "{e:?}"
        );
    }
}

/// An unknown or empty id, and an empty command, are refused before any shim is asked.
#[tokio::test]
async fn exec_sync_refuses_unknown_ids_and_empty_commands_before_asking_a_shim() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;

    let e = node.exec_sync("zz", &["true"], 0).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("\"zz\""), "{e:?}");
    let e = node.exec_sync("", &["true"], 0).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = node.exec_sync(&c, &[], 0).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("cmd is empty"), "{e:?}");
    assert!(node.execs().is_empty(), "{:?}", node.execs());
}

/// A timeout of `i64::MAX` seconds reaches the shim clamped, not wrapped (nor panics adding the
/// shim's own guard); a negative one is none.
#[tokio::test]
async fn exec_sync_with_a_huge_or_negative_timeout_sends_a_bounded_one() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;
    node.exec_sync(&c, &["true"], i64::MAX).await.unwrap();
    node.exec_sync(&c, &["true"], i64::MIN).await.unwrap();
    let timeouts: Vec<_> = node.execs().into_iter().map(|e| e.3).collect();
    assert_eq!(timeouts, [crate::bounds::MAX_REQUEST_DURATION.as_secs(), 0]);
}

/// Without a streaming server there is nowhere for a URL to point: `Unavailable`, which the
/// kubelet retries.
#[tokio::test]
async fn exec_attach_and_port_forward_are_unavailable_without_a_streaming_server() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;
    for e in [
        node.exec(&c).await.unwrap_err(),
        node.attach(&c).await.unwrap_err(),
        node.port_forward(&pod, &[8080]).await.unwrap_err(),
    ] {
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        assert!(e.message().contains("streaming server"), "{e:?}");
    }
}

/// With the streaming server on 127.0.0.1:0, Exec, Attach and PortForward on a running
/// container and a ready pod each get a one-time URL of it; no shim is asked to open anything
/// until the client connects.
#[tokio::test]
async fn exec_attach_and_port_forward_return_one_time_urls_of_the_streaming_server() {
    let node = Node::new();
    node.svc.start_streaming().await.unwrap();
    let base = node.svc.inner.streaming().unwrap().base_url().to_string();
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;
    let asked = node.shims.requests();

    let exec = node.exec(&c[..13]).await.unwrap();
    assert!(exec.starts_with(&format!("{base}/exec/")), "{exec}");
    let again = node.exec(&c).await.unwrap();
    assert_ne!(exec, again, "each URL is for one session");
    let attach = node.attach(&c).await.unwrap();
    assert!(attach.starts_with(&format!("{base}/attach/")), "{attach}");
    let forward = node.port_forward(&pod[..13], &[80, 8080]).await.unwrap();
    assert!(
        forward.starts_with(&format!("{base}/portforward/")),
        "{forward}"
    );
    let opened: Vec<_> = node.shims.requests()[asked.len()..]
        .iter()
        .filter(|r| *r != "State")
        .cloned()
        .collect();
    assert!(opened.is_empty(), "{opened:?}");
}

/// An exited container, and any container of a stopped pod, get `FailedPrecondition` naming
/// it, even with the streaming server up: no URL is made for a session that cannot run.
#[tokio::test]
async fn exec_and_attach_need_a_running_container_and_port_forward_a_ready_pod() {
    let node = Node::new();
    node.svc.start_streaming().await.unwrap();
    let pod = node.run_pod("web").await.unwrap();
    let exited = node.running(&pod, "exited").await;
    node.stop(&exited, 1).await.unwrap();
    for e in [
        node.exec(&exited).await.unwrap_err(),
        node.attach(&exited).await.unwrap_err(),
    ] {
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message().contains(&exited) && e.message().contains("not running"),
            "{e:?}"
        );
    }

    let c = node.running(&pod, "app").await;
    node.stop_pod(&pod).await.unwrap();
    for e in [
        node.exec(&c).await.unwrap_err(),
        node.attach(&c).await.unwrap_err(),
        node.port_forward(&pod, &[8080]).await.unwrap_err(),
    ] {
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message().contains(&pod) && e.message().contains("not ready"),
            "{e:?}"
        );
    }
}

/// Requests that can never be served are refused as such, before a URL: no stdio or a tty with
/// stderr, no command, a port out of range, stdin of a container made without one, and ids
/// that name nothing.
#[tokio::test]
async fn streaming_requests_that_cannot_be_served_are_refused_before_a_url() {
    let node = Node::new();
    node.svc.start_streaming().await.unwrap();
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;
    let exec = |req: cri::ExecRequest| node.svc.exec(Request::new(req));
    let attach = |req: cri::AttachRequest| node.svc.attach(Request::new(req));
    let code = |r: Result<_, Status>| r.map(drop).unwrap_err().code();

    let sh = cri::ExecRequest {
        container_id: c.clone(),
        cmd: vec!["sh".into()],
        ..Default::default()
    };
    assert_eq!(
        code(exec(sh.clone()).await),
        Code::InvalidArgument,
        "no stdio"
    );
    let tty_stderr = cri::ExecRequest {
        tty: true,
        stdout: true,
        stderr: true,
        ..sh.clone()
    };
    assert_eq!(code(exec(tty_stderr).await), Code::InvalidArgument);
    let no_cmd = cri::ExecRequest {
        cmd: Vec::new(),
        stdout: true,
        ..sh
    };
    assert_eq!(code(exec(no_cmd).await), Code::InvalidArgument);

    let stdin = cri::AttachRequest {
        container_id: c.clone(),
        stdin: true,
        ..Default::default()
    };
    let e = attach(stdin).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("not created with stdin"), "{e:?}");

    for port in [0, 65536, -1] {
        let e = node.port_forward(&pod, &[80, port]).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains(&format!("{port} is not a port")),
            "{e:?}"
        );
    }

    for e in [
        node.exec("zz").await.unwrap_err(),
        node.attach("zz").await.unwrap_err(),
        node.port_forward("zz", &[80]).await.unwrap_err(),
    ] {
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        assert!(e.message().contains("\"zz\""), "{e:?}");
    }
}
