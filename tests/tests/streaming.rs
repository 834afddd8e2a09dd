//! Exec, Attach and PortForward through the daemon's streaming server, with real containers and
//! the project's own SPDY client (crishim-streaming's client side) and a real WebSocket client
//! (tokio-tungstenite).

use std::path::Path;
use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_streaming::client::{self, Input};
use crishim_streaming::remotecommand::{ws_decode, ws_message};
use crishim_streaming::TermSize;
use crishim_tests::daemon::DaemonOptions;
use crishim_tests::pods::{host_processes, wait_for_log_line, PodEnv};
use futures_util::{SinkExt, StreamExt};
use sha2::{Digest, Sha256};

const WAIT: Duration = Duration::from_secs(20);

async fn running(
    env: &PodEnv,
    name: &str,
    command: &[&str],
) -> (String, String, cri::PodSandboxConfig) {
    let cfg = env.pod_config(name);
    let pod = env.d.run_pod(&cfg).await.expect("RunPodSandbox");
    let c = env.container_config("main", command);
    let id = env
        .d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run container");
    (pod, id, cfg)
}

async fn exec_url(env: &PodEnv, id: &str, cmd: &[&str], stdin: bool, tty: bool) -> String {
    env.d
        .runtime_client()
        .exec(cri::ExecRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            tty,
            stdin,
            stdout: true,
            stderr: !tty,
        })
        .await
        .expect("Exec")
        .into_inner()
        .url
}

#[tokio::test]
async fn exec_pipes_10_mb_through_cat_and_propagates_exit_codes() {
    let env = PodEnv::start().await;
    let (pod, id, _) = running(&env, "exec", &["sleep", "1000"]).await;
    let data: Vec<u8> = (0..10 << 20)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let url = exec_url(&env, &id, &["cat"], true, false).await;
    let t0 = Instant::now();
    let r = client::spdy_remotecommand(
        &url,
        Input {
            stdin: Some(data.clone()),
            stderr: true,
            ..Default::default()
        },
    )
    .await
    .expect("exec cat");
    let took = t0.elapsed();
    assert_eq!(
        r.stdout.len(),
        data.len(),
        "{}",
        String::from_utf8_lossy(&r.status)
    );
    assert_eq!(Sha256::digest(&r.stdout), Sha256::digest(&data));
    assert_eq!(
        r.exit_code,
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.status)
    );
    eprintln!(
        "10 MiB stdin round trip through cat: {took:?} ({:.0} MiB/s)",
        10.0 / took.as_secs_f64()
    );

    let url = exec_url(
        &env,
        &id,
        &["sh", "-c", "echo out; echo err >&2; exit 3"],
        false,
        false,
    )
    .await;
    let r = client::spdy_remotecommand(
        &url,
        Input {
            stderr: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(r.stdout, b"out\n");
    assert_eq!(r.stderr, b"err\n");
    assert_eq!(
        r.exit_code,
        Some(3),
        "{}",
        String::from_utf8_lossy(&r.status)
    );

    // The same over WebSocket (v5, which closes stdin explicitly).
    let url = exec_url(&env, &id, &["sh", "-c", "cat; exit 4"], true, false).await;
    let (mut ws, proto) = client::ws_connect(&url, &["v5.channel.k8s.io"])
        .await
        .unwrap();
    assert_eq!(proto.as_deref(), Some("v5.channel.k8s.io"));
    ws.send(ws_message("v5.channel.k8s.io", 0, b"over websocket\n"))
        .await
        .unwrap();
    ws.send(ws_message("v5.channel.k8s.io", 255, &[0]))
        .await
        .unwrap();
    let (mut out, mut status) = (Vec::new(), Vec::new());
    while let Some(Ok(m)) = ws.next().await {
        match ws_decode(m) {
            Some((1, d)) => out.extend_from_slice(&d),
            Some((3, d)) => status.extend_from_slice(&d),
            _ => {}
        }
    }
    assert_eq!(out, b"over websocket\n");
    assert_eq!(crishim_streaming::status::exit_code_of(&status), Some(4));

    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    env.stop();
}

#[tokio::test]
async fn exec_with_a_tty_sees_its_window_size() {
    let env = PodEnv::start().await;
    let (_pod, id, _) = running(&env, "tty", &["sleep", "1000"]).await;
    // The size arrives on the resize stream right after the streams open; give it a moment.
    let url = exec_url(
        &env,
        &id,
        &[
            "sh",
            "-c",
            "sleep 0.5; busybox stty size; test -t 0 && echo tty",
        ],
        false,
        true,
    )
    .await;
    let r = client::spdy_remotecommand(
        &url,
        Input {
            tty: true,
            resize: Some(TermSize {
                width: 123,
                height: 45,
            }),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(out.contains("45 123"), "stty size in the exec: {out:?}");
    assert!(out.contains("tty"), "stdin is a terminal: {out:?}");
    assert_eq!(r.exit_code, Some(0));
    env.stop();
}

#[tokio::test]
async fn a_disconnected_client_kills_its_exec() {
    let env = PodEnv::start().await;
    let (_pod, id, _) = running(&env, "gone", &["sleep", "1000"]).await;
    let url = exec_url(&env, &id, &["sleep", "4242"], true, false).await;
    let (conn, _) = client::spdy_connect(&url, &["v4.channel.k8s.io"])
        .await
        .unwrap();
    let open = |k: &str| vec![("streamType".to_string(), k.to_string())];
    for k in ["error", "stdin", "stdout", "stderr"] {
        conn.open(open(k)).await.unwrap();
    }
    let sleeping = || {
        host_processes()
            .into_iter()
            .any(|p| !p.is_zombie() && p.command() == "sleep 4242")
    };
    let t0 = Instant::now();
    while !sleeping() {
        assert!(t0.elapsed() < WAIT, "the exec never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(conn);
    let t0 = Instant::now();
    while sleeping() {
        assert!(t0.elapsed() < WAIT, "the exec outlived its client");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.stop();
}

#[tokio::test]
async fn attach_streams_a_running_containers_output_which_still_reaches_the_log() {
    let env = PodEnv::start().await;
    let (_pod, id, cfg) = running(
        &env,
        "attach",
        &[
            "sh",
            "-c",
            "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.1; done",
        ],
    )
    .await;
    let url = env
        .d
        .runtime_client()
        .attach(cri::AttachRequest {
            container_id: id.clone(),
            stdin: false,
            tty: false,
            stdout: true,
            stderr: true,
        })
        .await
        .expect("Attach")
        .into_inner()
        .url;
    let (conn, _) = client::spdy_connect(&url, &["v4.channel.k8s.io"])
        .await
        .unwrap();
    let open = |k: &str| vec![("streamType".to_string(), k.to_string())];
    let _error = conn.open(open("error")).await.unwrap();
    let mut stdout = conn.open(open("stdout")).await.unwrap();
    let _stderr = conn.open(open("stderr")).await.unwrap();
    let mut seen = String::new();
    let t0 = Instant::now();
    while seen.lines().filter(|l| l.starts_with("tick ")).count() < 5 {
        assert!(t0.elapsed() < WAIT, "attach got only {seen:?}");
        let chunk = tokio::time::timeout(WAIT, stdout.rx.recv())
            .await
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let ticks: Vec<u64> = seen
        .lines()
        .filter_map(|l| l.strip_prefix("tick ")?.parse().ok())
        .collect();
    assert!(
        ticks.windows(2).all(|w| w[1] == w[0] + 1),
        "a counter: {ticks:?}"
    );
    let last = ticks.last().unwrap();
    wait_for_log_line(
        &Path::new(&cfg.log_directory).join("main.log"),
        "stdout",
        &format!("tick {last}"),
        WAIT,
    )
    .await;
    // Attach with stdin to a container created without it is refused up front.
    let err = env
        .d
        .runtime_client()
        .attach(cri::AttachRequest {
            container_id: id,
            stdin: true,
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    env.stop();
}

async fn port_forward_url(env: &PodEnv, pod: &str, ports: Vec<i32>) -> String {
    env.d
        .runtime_client()
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: pod.into(),
            port: ports,
        })
        .await
        .expect("PortForward")
        .into_inner()
        .url
}

#[tokio::test]
async fn port_forward_reaches_httpd_in_the_pod_and_reports_a_closed_port() {
    let env = PodEnv::start().await;
    let (pod, _id, _) = running(
        &env,
        "httpd",
        &["sh", "-c", "mkdir -p /www && echo hello from the pod > /www/index.html && exec busybox httpd -f -p 8080 -h /www"],
    )
    .await;
    let url = port_forward_url(&env, &pod, vec![8080]).await;
    let (conn, proto) = client::spdy_connect(&url, &["portforward.k8s.io"])
        .await
        .unwrap();
    assert_eq!(proto, "portforward.k8s.io");
    let h = |kind: &str, port: &str, id: &str| {
        vec![
            ("streamType".to_string(), kind.to_string()),
            ("port".to_string(), port.to_string()),
            ("requestID".to_string(), id.to_string()),
        ]
    };
    let mut body = String::new();
    let t0 = Instant::now();
    // httpd may still be starting: retry the request a few times.
    for attempt in 0.. {
        let mut err = conn
            .open(h("error", "8080", &attempt.to_string()))
            .await
            .unwrap();
        let mut data = conn
            .open(h("data", "8080", &attempt.to_string()))
            .await
            .unwrap();
        data.tx
            .write(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        body.clear();
        while let Some(d) = data.rx.recv().await {
            body.push_str(&String::from_utf8_lossy(&d));
        }
        data.tx.close().await.unwrap();
        let e = err.rx.recv().await;
        if body.contains("hello from the pod") {
            assert!(e.is_none(), "no error on success: {e:?}");
            break;
        }
        assert!(t0.elapsed() < WAIT, "no answer from httpd: {body:?} {e:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");

    // A port nobody listens on: the error stream says so.
    let url = port_forward_url(&env, &pod, vec![]).await;
    let (conn, _) = client::spdy_connect(&url, &["portforward.k8s.io"])
        .await
        .unwrap();
    let mut err = conn.open(h("error", "9", "0")).await.unwrap();
    let _data = conn.open(h("data", "9", "0")).await.unwrap();
    let msg = String::from_utf8_lossy(&err.rx.recv().await.expect("an error message")).into_owned();
    assert!(
        msg.contains("port 9") && msg.to_lowercase().contains("refused"),
        "{msg}"
    );

    // WebSocket: the port is announced on both channels, then data flows.
    let url = port_forward_url(&env, &pod, vec![8080]).await;
    let (mut ws, _) = client::ws_connect(&url, &["v4.channel.k8s.io"])
        .await
        .unwrap();
    for _ in 0..2 {
        let (_, d) = ws_decode(ws.next().await.unwrap().unwrap()).unwrap();
        assert_eq!(&d[..], &8080u16.to_le_bytes());
    }
    ws.send(ws_message(
        "v4.channel.k8s.io",
        0,
        b"GET / HTTP/1.0\r\n\r\n",
    ))
    .await
    .unwrap();
    let mut got = String::new();
    while !got.contains("hello from the pod") {
        let m = tokio::time::timeout(WAIT, ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some((0, d)) = ws_decode(m) {
            got.push_str(&String::from_utf8_lossy(&d));
        }
    }
    env.stop();
}

#[tokio::test]
async fn urls_work_once_and_expire() {
    let env =
        PodEnv::start_with(DaemonOptions::new().extra_toml("[streaming]\ntoken_ttl_seconds = 1\n"))
            .await;
    let (_pod, id, _) = running(&env, "tokens", &["sleep", "1000"]).await;
    let url = exec_url(&env, &id, &["true"], false, false).await;
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let input = || Input {
        stderr: true,
        ..Default::default()
    };
    let r = client::spdy_remotecommand(&url, input()).await.unwrap();
    assert_eq!(r.exit_code, Some(0));
    let again = client::spdy_remotecommand(&url, input()).await;
    assert!(
        matches!(&again, Err(client::ClientError::Refused(s, _)) if s.as_u16() == 404),
        "a used URL is refused: {again:?}"
    );
    let late = exec_url(&env, &id, &["true"], false, false).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = client::spdy_remotecommand(&late, input()).await;
    assert!(
        matches!(&r, Err(client::ClientError::Refused(s, _)) if s.as_u16() == 404),
        "an expired URL is refused: {r:?}"
    );
    // Bad requests get a clear status before any URL.
    let mut rt = env.d.runtime_client();
    let e = rt
        .exec(cri::ExecRequest {
            container_id: id.clone(),
            cmd: vec![],
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = rt
        .exec(cri::ExecRequest {
            container_id: "nope".into(),
            cmd: vec!["true".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let e = rt
        .exec(cri::ExecRequest {
            container_id: id,
            cmd: vec!["true".into()],
            tty: true,
            stdout: true,
            stderr: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = rt
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: "nope".into(),
            port: vec![80],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    env.stop();
}

/// By hand, with crictl (not built by the suite): `cargo test -p crishim-tests --test streaming
/// crictl -- --ignored`. Drives exec -i, exec -it (through `script` for a pty), attach and
/// port-forward with the Go client that kubelets and crictl use.
#[tokio::test]
#[ignore = "needs crictl on PATH"]
async fn crictl_exec_attach_and_port_forward() {
    let env = PodEnv::start().await;
    let (pod, id, _) = running(
        &env,
        "crictl",
        &["sh", "-c", "mkdir -p /www && echo via crictl > /www/index.html && busybox httpd -p 8080 -h /www && i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done"],
    )
    .await;
    let endpoint = format!("unix://{}", env.d.socket().display());
    let crictl = |args: &[&str], stdin: &[u8]| {
        use std::io::Write;
        let mut c = std::process::Command::new("crictl")
            .args(["--runtime-endpoint", &endpoint, "--timeout", "20s"])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("crictl on PATH");
        c.stdin.take().unwrap().write_all(stdin).unwrap();
        c
    };
    let out = crictl(
        &["exec", "-i", &id, "sh", "-c", "cat; exit 5"],
        b"piped through crictl\n",
    )
    .wait_with_output()
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "piped through crictl\n",
        "{out:?}"
    );
    // crictl exits 1 and names the code.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exit code 5"),
        "{out:?}"
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &format!("crictl --runtime-endpoint {endpoint} exec -it {id} sh -c 'test -t 0 && echo is-a-tty'"), "/dev/null"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("is-a-tty"),
        "{out:?}"
    );
    let mut attach = crictl(&["attach", &id], b"");
    std::thread::sleep(Duration::from_secs(2));
    let _ = attach.kill();
    let out = attach.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("tick "),
        "{out:?}"
    );
    let mut pf = crictl(&["port-forward", &pod, "18093:8080"], b"");
    let mut body = String::new();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(200));
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", 18093)) {
            use std::io::{Read, Write};
            s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
            let _ = s.read_to_string(&mut body);
            if body.contains("via crictl") {
                break;
            }
        }
    }
    let _ = pf.kill();
    let _ = pf.wait();
    assert!(body.contains("via crictl"), "{body:?}");
    // The ids as `crictl ps` and `crictl pods` print them (13 characters).
    let (short_pod, short) = (&pod[..13], &id[..13]);
    for args in [
        vec!["inspect", short],
        vec!["logs", "--tail", "1", short],
        vec!["exec", "-s", short, "echo", "short-id"],
        vec!["inspectp", short_pod],
        vec!["stop", short],
        vec!["stopp", short_pod],
        vec!["rmp", short_pod],
    ] {
        let out = crictl(&args, b"").wait_with_output().unwrap();
        assert!(out.status.success(), "crictl {args:?}: {out:?}");
    }
    env.stop();
}

#[tokio::test]
async fn a_tty_client_detaches_with_ctrl_p_ctrl_q_and_its_process_runs_on() {
    let env = PodEnv::start().await;
    let (_pod, id, _) = running(&env, "detach", &["sleep", "1000"]).await;
    let url = exec_url(
        &env,
        &id,
        &[
            "sh",
            "-c",
            "sleep 2; touch /tmp/after-detach; exec sleep 4343",
        ],
        true,
        true,
    )
    .await;
    let (conn, _) = client::spdy_connect(&url, &["v4.channel.k8s.io"])
        .await
        .unwrap();
    let open = |k: &str| vec![("streamType".to_string(), k.to_string())];
    let mut error = conn.open(open("error")).await.unwrap();
    let stdin = conn.open(open("stdin")).await.unwrap();
    let _stdout = conn.open(open("stdout")).await.unwrap();
    let _resize = conn.open(open("resize")).await.unwrap();
    stdin.tx.write(b"typed\x10\x11").await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), error.rx.recv())
        .await
        .expect("the session ends at the detach sequence")
        .unwrap_or_default();
    assert_eq!(
        crishim_streaming::status::exit_code_of(&status),
        Some(0),
        "{}",
        String::from_utf8_lossy(&status)
    );
    drop(conn);
    // The process was not killed: it finishes its work after the client left.
    let t0 = Instant::now();
    loop {
        let r = env
            .d
            .exec_sync(&id, &["test", "-e", "/tmp/after-detach"], 10)
            .await
            .unwrap();
        if r.exit_code == 0 {
            break;
        }
        assert!(t0.elapsed() < WAIT, "the detached process did not run on");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        host_processes()
            .iter()
            .any(|p| !p.is_zombie() && p.command() == "sleep 4343"),
        "the detached process is still running"
    );
    env.stop();
}

/// A SPDY `SYN_STREAM` whose header block is a complete zlib stream followed by one more byte made
/// the header decoder spin forever on the daemon's executor. Each such session must now be closed,
/// and the CRI socket must answer promptly even with 8 of them.
#[tokio::test]
async fn hostile_spdy_header_blocks_close_their_session_and_leave_cri_responsive() {
    use crishim_streaming::spdy::{frame, headers};
    use flate2::{Compress, Compression, FlushCompress};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let env = PodEnv::start().await;
    let pod = env.d.run_pod(&env.pod_config("hostile")).await.unwrap();
    // SYN_STREAM payload: stream id, associated id, priority and slot, then the block.
    let mut z = Compress::new(Compression::default(), true);
    z.set_dictionary(&headers::dictionary()).unwrap();
    let mut block = Vec::with_capacity(256);
    z.compress_vec(&[0, 0, 0, 0], &mut block, FlushCompress::Finish)
        .unwrap();
    block.push(0);
    let mut payload = 1u32.to_be_bytes().to_vec();
    payload.extend_from_slice(&[0; 6]);
    payload.extend_from_slice(&block);
    let syn = frame::control(frame::SYN_STREAM, 0, &payload);

    let mut sessions = Vec::new();
    for _ in 0..8 {
        let url = port_forward_url(&env, &pod, vec![]).await;
        let (mut io, _) = client::spdy_upgrade(&url, &["portforward.k8s.io"])
            .await
            .expect("upgrade");
        io.write_all(&syn).await.unwrap();
        sessions.push(io);
    }
    let mut rt = env.d.runtime_client();
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let t0 = Instant::now();
        tokio::time::timeout(WAIT, rt.version(cri::VersionRequest::default()))
            .await
            .expect("Version must answer")
            .expect("Version");
        slowest = slowest.max(t0.elapsed());
    }
    assert!(
        slowest < Duration::from_millis(100),
        "Version took {slowest:?} with 8 hostile sessions open"
    );
    // The server closed every session (a GOAWAY at most, then EOF).
    for mut io in sessions {
        let mut rest = Vec::new();
        tokio::time::timeout(WAIT, io.read_to_end(&mut rest))
            .await
            .expect("the session must be closed")
            .ok();
    }
    assert!(!env.d.log_text().contains("panicked"));
    env.stop();
}

/// critest's "runtime should support attach": a `sh` created with `stdin` and `stdin_once`, an
/// attach that types `echo hello` and then closes its stdin. The container's stdin closes with
/// the client's, so `sh` exits, and the session ends with a v4 Success status. (Before, the shim
/// kept a second descriptor of the stdin pipe for window sizes: `sh` never saw EOF and the
/// session never ended.)
#[tokio::test]
async fn attach_with_stdin_once_ends_when_the_client_closes_stdin() {
    let env = PodEnv::start().await;
    let cfg = env.pod_config("attach-once");
    let pod = env.d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut c = env.container_config("main", &["sh"]);
    c.stdin = true;
    c.stdin_once = true;
    let id = env
        .d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run container");
    let url = env
        .d
        .runtime_client()
        .attach(cri::AttachRequest {
            container_id: id.clone(),
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        })
        .await
        .expect("Attach")
        .into_inner()
        .url;
    let (conn, _) = client::spdy_connect(&url, &["v4.channel.k8s.io"])
        .await
        .unwrap();
    let open = |k: &str| vec![("streamType".to_string(), k.to_string())];
    let mut error = conn.open(open("error")).await.unwrap();
    let stdin = conn.open(open("stdin")).await.unwrap();
    let mut stdout = conn.open(open("stdout")).await.unwrap();
    let _stderr = conn.open(open("stderr")).await.unwrap();
    stdin.tx.write(b"echo hello\n").await.unwrap();
    let mut seen = Vec::new();
    while !seen.ends_with(b"hello\n") {
        let chunk = tokio::time::timeout(WAIT, stdout.rx.recv())
            .await
            .expect("hello within the wait")
            .expect("stdout open until hello");
        seen.extend_from_slice(&chunk);
    }
    stdin.tx.close().await.unwrap();
    let status = tokio::time::timeout(WAIT, error.rx.recv())
        .await
        .expect("the session ends once the container's stdin closed")
        .unwrap_or_default();
    assert_eq!(
        crishim_streaming::status::exit_code_of(&status),
        Some(0),
        "{}",
        String::from_utf8_lossy(&status)
    );
    let t0 = Instant::now();
    loop {
        let s = env.d.container_status(&id).await.unwrap();
        if s.state == cri::ContainerState::ContainerExited as i32 {
            assert_eq!(s.exit_code, 0);
            break;
        }
        assert!(t0.elapsed() < WAIT, "sh did not exit at its stdin's end");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.stop();
}

/// Output that ends without a newline is a partial record (`P`), as the CRI log format has it.
#[tokio::test]
async fn output_without_a_final_newline_is_logged_partial() {
    let env = PodEnv::start().await;
    let (_pod, id, cfg) = running(&env, "partial", &["printf", "abcd"]).await;
    let log = Path::new(&cfg.log_directory).join("main.log");
    let records = wait_for_log_line(&log, "stdout", "abcd", WAIT).await;
    let r = records
        .iter()
        .find(|r| r.text == b"abcd")
        .expect("a record of abcd");
    assert!(r.partial, "abcd has no newline, so its record is P");
    let _ = id;
    env.stop();
}
