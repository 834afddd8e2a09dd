//! The streaming server's protocols end to end over real TCP, with a backend that runs no
//! container: exec echoes stdin to stdout and exits with the code its command names; port forwards
//! go to a local TCP echo server. The runtime's backend is tested in tests/tests/streaming.rs.

use std::sync::Arc;

use bytes::Bytes;
use crishim_proto::cri;
use crishim_streaming::client::{self, Input};
use crishim_streaming::remotecommand::{ws_decode, ws_message};
use crishim_streaming::{Backend, Config, Outcome, Server, Stdio};
use futures::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};

struct Echo {
    echo_port: u16,
}

impl Backend for Echo {
    fn exec(&self, req: cri::ExecRequest, mut io: Stdio) -> BoxFuture<'static, Outcome> {
        Box::pin(async move {
            if let Some(size) = match io.resize.as_mut() {
                Some(r) => r.recv().await,
                None => None,
            } {
                let msg = format!("{} {}\n", size.height, size.width);
                io.stdout
                    .as_ref()
                    .unwrap()
                    .send(Bytes::from(msg))
                    .await
                    .ok();
            }
            if let (Some(mut stdin), Some(out)) = (io.stdin.take(), io.stdout.clone()) {
                while let Some(b) = stdin.recv().await {
                    out.send(b).await.map_err(|_| "client gone".to_string())?;
                }
            }
            if let Some(err) = &io.stderr {
                err.send(Bytes::from_static(b"to stderr\n")).await.ok();
            }
            Ok(Some(
                req.cmd.last().and_then(|c| c.parse().ok()).unwrap_or(0),
            ))
        })
    }

    fn attach(&self, _req: cri::AttachRequest, _io: Stdio) -> BoxFuture<'static, Outcome> {
        Box::pin(async { Ok(None) })
    }

    fn port_forward(
        &self,
        _pod: String,
        port: u16,
    ) -> BoxFuture<'static, std::io::Result<tokio::net::TcpStream>> {
        let echo = self.echo_port;
        Box::pin(async move {
            if port != 80 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "connection refused",
                ));
            }
            tokio::net::TcpStream::connect(("127.0.0.1", echo)).await
        })
    }
}

async fn server() -> Server {
    server_with(Config::default()).await
}

async fn server_with(config: Config) -> Server {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    Server::start(config, Arc::new(Echo { echo_port }))
        .await
        .unwrap()
}

fn port_forward(ports: Vec<i32>) -> cri::PortForwardRequest {
    cri::PortForwardRequest {
        pod_sandbox_id: "p".into(),
        port: ports,
    }
}

fn exec(cmd: &str, stdin: bool, tty: bool) -> cri::ExecRequest {
    cri::ExecRequest {
        container_id: "c".into(),
        cmd: vec!["sh".into(), cmd.into()],
        stdin,
        stdout: true,
        stderr: !tty,
        tty,
    }
}

#[tokio::test]
async fn spdy_exec_pipes_stdin_and_reports_the_exit_code() {
    let s = server().await;
    let url = s.exec_url(exec("3", true, false)).unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let r = client::spdy_remotecommand(
        &url,
        Input {
            stdin: Some(data.clone()),
            stderr: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(r.stdout.len(), data.len());
    assert!(r.stdout == data);
    assert_eq!(r.stderr, b"to stderr\n");
    assert_eq!(
        r.exit_code,
        Some(3),
        "{}",
        String::from_utf8_lossy(&r.status)
    );

    // One use only.
    let again = client::spdy_remotecommand(&url, Input::default()).await;
    assert!(
        matches!(again, Err(client::ClientError::Refused(code, _)) if code == 404),
        "{again:?}"
    );
}

#[tokio::test]
async fn spdy_tty_exec_gets_resize_events() {
    let s = server().await;
    let url = s.exec_url(exec("0", false, true)).unwrap();
    let r = client::spdy_remotecommand(
        &url,
        Input {
            tty: true,
            resize: Some(crishim_streaming::TermSize {
                width: 120,
                height: 40,
            }),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(r.stdout, b"40 120\n");
    assert_eq!(r.exit_code, Some(0));
}

#[tokio::test]
async fn websocket_exec_with_v5_closes_stdin() {
    let s = server().await;
    for proto in ["v5.channel.k8s.io", "base64.channel.k8s.io"] {
        let url = s.exec_url(exec("7", true, false)).unwrap();
        let (mut ws, chosen) = client::ws_connect(&url, &[proto]).await.unwrap();
        assert_eq!(chosen.as_deref(), Some(proto));
        ws.send(ws_message(proto, 0, b"hello")).await.unwrap();
        if proto.starts_with("v5") {
            ws.send(ws_message(proto, 255, &[0])).await.unwrap();
        }
        let mut out = Vec::new();
        let mut status = Vec::new();
        while let Some(Ok(m)) = ws.next().await {
            match ws_decode(m) {
                Some((1, d)) => {
                    out.extend_from_slice(&d);
                    // Without v5's close there is no stdin EOF: hang up once echoed.
                    if !proto.starts_with("v5") && out == b"hello" {
                        break;
                    }
                }
                Some((3, d)) => status.extend_from_slice(&d),
                _ => {}
            }
        }
        assert_eq!(out, b"hello", "{proto}");
        if proto.starts_with("v5") {
            assert_eq!(
                crishim_streaming::status::exit_code_of(&status),
                Some(7),
                "{}",
                String::from_utf8_lossy(&status)
            );
        }
    }
}

#[tokio::test]
async fn spdy_port_forward_pairs_streams_and_reports_refusals() {
    let s = server().await;
    let url = s
        .port_forward_url(cri::PortForwardRequest {
            pod_sandbox_id: "p".into(),
            port: vec![],
        })
        .unwrap();
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
    let mut err = conn.open(h("error", "80", "0")).await.unwrap();
    let mut data = conn.open(h("data", "80", "0")).await.unwrap();
    data.tx.write(b"ping").await.unwrap();
    let got = data.rx.recv().await.unwrap();
    assert_eq!(&got[..], b"ping");
    data.tx.close().await.unwrap();
    assert!(data.rx.recv().await.is_none());
    assert!(err.rx.recv().await.is_none(), "no error on a good port");

    let mut err = conn.open(h("error", "81", "1")).await.unwrap();
    let _data = conn.open(h("data", "81", "1")).await.unwrap();
    let msg = err.rx.recv().await.unwrap();
    let msg = String::from_utf8_lossy(&msg);
    assert!(msg.contains("port 81") && msg.contains("refused"), "{msg}");
}

#[tokio::test]
async fn websocket_port_forward_announces_ports_and_echoes() {
    let s = server().await;
    let url = s
        .port_forward_url(cri::PortForwardRequest {
            pod_sandbox_id: "p".into(),
            port: vec![80],
        })
        .unwrap();
    let (mut ws, _) = client::ws_connect(&url, &["v4.channel.k8s.io"])
        .await
        .unwrap();
    let mut announced = 0;
    while announced < 2 {
        let (ch, d) = ws_decode(ws.next().await.unwrap().unwrap()).unwrap();
        assert!(ch < 2);
        assert_eq!(&d[..], &80u16.to_le_bytes());
        announced += 1;
    }
    ws.send(ws_message("v4.channel.k8s.io", 0, b"abc"))
        .await
        .unwrap();
    let (ch, d) = ws_decode(ws.next().await.unwrap().unwrap()).unwrap();
    assert_eq!((ch, &d[..]), (0, &b"abc"[..]));
}

/// The WebSocket `?ports=` may only pick among the ports the PortForward request named, as the
/// SPDY path enforces: it used to override them.
#[tokio::test]
async fn websocket_port_forward_refuses_ports_the_request_did_not_name() {
    let s = server().await;
    let url = s.port_forward_url(port_forward(vec![80])).unwrap();
    let r = client::ws_connect(&format!("{url}?ports=80,22"), &["v4.channel.k8s.io"]).await;
    match r {
        Err(client::ClientError::Ws(tokio_tungstenite::tungstenite::Error::Http(resp))) => {
            assert_eq!(resp.status(), 403);
            let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default());
            assert!(body.contains("port 22"), "{body}");
        }
        other => panic!("port 22 must be refused: {:?}", other.map(|(_, p)| p)),
    }
    // A port the request named is served.
    let url = s.port_forward_url(port_forward(vec![80, 81])).unwrap();
    let (mut ws, _) = client::ws_connect(&format!("{url}?ports=80"), &["v4.channel.k8s.io"])
        .await
        .unwrap();
    let (ch, d) = ws_decode(ws.next().await.unwrap().unwrap()).unwrap();
    assert_eq!((ch, &d[..]), (0, &80u16.to_le_bytes()[..]));
}

/// A connection that never completes its request is closed at the handshake deadline.
#[tokio::test]
async fn connections_that_never_finish_their_request_are_closed_at_the_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = server_with(Config {
        handshake_timeout: std::time::Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let addr = s.base_url().trim_start_matches("http://").to_string();
    for partial in [&b""[..], b"POST /exec/abc HTTP/1.1\r\nHost: x\r\n"] {
        let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        tcp.write_all(partial).await.unwrap();
        let t0 = std::time::Instant::now();
        let mut rest = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tcp.read_to_end(&mut rest),
        )
        .await
        .expect("the server must close a stalled connection")
        .ok();
        let took = t0.elapsed();
        assert!(
            took >= std::time::Duration::from_millis(250),
            "closed after {took:?}"
        );
    }
}

/// `max_connections` sessions at once; the next one gets 503 until one ends.
#[tokio::test]
async fn connections_over_max_connections_get_503() {
    let s = server_with(Config {
        max_connections: 2,
        ..Default::default()
    })
    .await;
    let open = || async {
        let url = s.port_forward_url(port_forward(vec![80])).unwrap();
        client::spdy_connect(&url, &["portforward.k8s.io"]).await
    };
    let a = open().await.unwrap();
    let _b = open().await.unwrap();
    let over = open().await;
    assert!(
        matches!(&over, Err(client::ClientError::Refused(code, _)) if code.as_u16() == 503),
        "{:?}",
        over.map(|(_, p)| p)
    );
    // A session that ends gives its slot back.
    drop(a);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match open().await {
            Ok(_) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            Err(e) => panic!("the slot was not given back: {e}"),
        }
    }
}
