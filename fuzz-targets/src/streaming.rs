//! The streaming server's protocols, each fed as a client would feed them: the input is
//! everything the client sends, then it half-closes and reads whatever the server answers.
//!
//! Sessions run on tokio's paused clock: when every task waits, time jumps to the next timer,
//! so the protocols' deadlines pass at once, and a session that outlives them all is a hang.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crishim_proto::cri;
use crishim_streaming::remotecommand::{self, Opts, Run};
use crishim_streaming::spdy::{self, headers::Decoder, Connection, Role};
use crishim_streaming::{portforward, Backend, Outcome, Stdio};
use futures::future::BoxFuture;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_tungstenite::tungstenite::protocol::Role as WsRole;
use tokio_tungstenite::WebSocketStream;

/// How long (paused time) a session may run on after the client closed: past every deadline
/// of the protocols (30 s to open the streams).
const SESSION_LIMIT: Duration = Duration::from_secs(120);

fn run_paused(session: impl Future<Output = ()>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        if tokio::time::timeout(SESSION_LIMIT, session).await.is_err() {
            panic!("the session still ran {SESSION_LIMIT:?} after the client had closed");
        }
    });
}

/// The server's end of a connection whose client sends `data`, half-closes, and reads (and
/// drops) everything the server writes. Call within the runtime.
fn client_sending(data: &[u8]) -> DuplexStream {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let data = data.to_vec();
    tokio::spawn(async move {
        let (mut r, mut w) = tokio::io::split(client);
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8192];
            while matches!(r.read(&mut buf).await, Ok(n) if n > 0) {}
        });
        let _ = w.write_all(&data).await;
        let _ = w.shutdown().await;
        let _ = reader.await;
    });
    server
}

/// A process that copies stdin to stdout until stdin ends, as `cat` would.
async fn cat(mut io: Stdio) -> Outcome {
    if let Some(mut resize) = io.resize.take() {
        tokio::spawn(async move { while resize.recv().await.is_some() {} });
    }
    if let Some(mut stdin) = io.stdin.take() {
        while let Some(b) = stdin.recv().await {
            if let Some(out) = &io.stdout {
                let _ = out.send(b).await;
            }
        }
    }
    if let Some(err) = &io.stderr {
        let _ = err.send(Bytes::from_static(b"done\n")).await;
    }
    Ok(Some(3))
}

fn run_cat() -> Run {
    Box::new(|io| Box::pin(cat(io)))
}

/// A runtime whose processes are [`cat`] and whose pods have no network.
struct CatBackend;

impl Backend for CatBackend {
    fn exec(&self, _: cri::ExecRequest, io: Stdio) -> BoxFuture<'static, Outcome> {
        Box::pin(cat(io))
    }
    fn attach(&self, _: cri::AttachRequest, io: Stdio) -> BoxFuture<'static, Outcome> {
        Box::pin(cat(io))
    }
    fn port_forward(
        &self,
        _: String,
        port: u16,
    ) -> BoxFuture<'static, std::io::Result<tokio::net::TcpStream>> {
        Box::pin(async move { Err(std::io::Error::other(format!("no pod listens on {port}"))) })
    }
}

/// The first byte picks the request's streams (low bits) and the negotiated protocol.
fn opts(sel: u8) -> Opts {
    Opts::new(sel & 1 != 0, sel & 2 != 0, sel & 4 != 0, sel & 8 != 0)
}

fn pick<'a>(list: &[&'a str], sel: u8) -> &'a str {
    list[usize::from(sel >> 4) % list.len()]
}

/// The ports a PortForward request named: none (any) up to three.
fn ports(sel: u8) -> Vec<u16> {
    [80, 443, 8080][..usize::from(sel & 3)].to_vec()
}

/// SPDY/3.1 frames, header blocks and streams, as the server side of a connection.
pub fn spdy_frames(data: &[u8]) {
    run_paused(async {
        let mut conn = Connection::new(client_sending(data), Role::Server);
        let mut drains = Vec::new();
        while let Some(mut s) = conn.accept().await {
            let _ = spdy::header(&s.headers, "streamType");
            drains.push(tokio::spawn(
                async move { while s.rx.recv().await.is_some() {} },
            ));
        }
        for d in drains {
            let _ = d.await;
        }
    });
}

/// Header blocks through one decompression context: each a big-endian u16 length, then the
/// block. The first error ends the input, as it ends a connection.
pub fn spdy_headers(mut data: &[u8]) {
    let mut dec = Decoder::new();
    while let [a, b, rest @ ..] = data {
        let len = usize::from(u16::from_be_bytes([*a, *b])).min(rest.len());
        let (block, next) = rest.split_at(len);
        if dec.decode(block).is_err() {
            return;
        }
        data = next;
    }
}

/// WebSocket frames from a client, and the channel messages they carry.
pub fn websocket_frames(data: &[u8]) {
    run_paused(async {
        let mut ws =
            WebSocketStream::from_raw_socket(client_sending(data), WsRole::Server, None).await;
        while let Some(Ok(msg)) = ws.next().await {
            let _ = remotecommand::ws_decode(msg);
        }
    });
}

/// Exec/Attach over SPDY: byte 0 picks the streams and the protocol, the rest is the wire.
pub fn remotecommand_spdy(data: &[u8]) {
    let Some((&sel, wire)) = data.split_first() else {
        return;
    };
    let protocol = pick(remotecommand::SPDY_PROTOCOLS, sel);
    run_paused(async {
        remotecommand::serve_spdy(client_sending(wire), protocol, opts(sel), run_cat()).await
    });
}

/// Exec/Attach over WebSocket: byte 0 picks the streams and the protocol, the rest is the wire.
pub fn remotecommand_ws(data: &[u8]) {
    let Some((&sel, wire)) = data.split_first() else {
        return;
    };
    let protocol = pick(remotecommand::WS_PROTOCOLS, sel).to_string();
    run_paused(async {
        let ws = WebSocketStream::from_raw_socket(client_sending(wire), WsRole::Server, None).await;
        remotecommand::serve_ws(ws, protocol, opts(sel), run_cat()).await
    });
}

/// PortForward over SPDY: byte 0 picks the request's ports, the rest is the wire.
pub fn portforward_spdy(data: &[u8]) {
    let Some((&sel, wire)) = data.split_first() else {
        return;
    };
    run_paused(async {
        let io = client_sending(wire);
        portforward::serve_spdy(io, "pod".into(), ports(sel), Arc::new(CatBackend)).await
    });
}

/// PortForward over WebSocket: byte 0 picks the ports and the protocol, the rest is the wire.
pub fn portforward_ws(data: &[u8]) {
    let Some((&sel, wire)) = data.split_first() else {
        return;
    };
    let protocol = pick(portforward::WS_PROTOCOLS, sel).to_string();
    run_paused(async {
        let ws = WebSocketStream::from_raw_socket(client_sending(wire), WsRole::Server, None).await;
        portforward::serve_ws(ws, protocol, "pod".into(), ports(sel), Arc::new(CatBackend)).await
    });
}
