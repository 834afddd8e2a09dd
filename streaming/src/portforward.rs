//! PortForward: `portforward.k8s.io` over SPDY (a data and an error stream per port and request)
//! and the WebSocket channel protocol (channels 2n and 2n+1 for the n-th port).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;

use crate::backend::Backend;
use crate::remotecommand::{ws_decode, ws_writer};
use crate::spdy::{self, Connection, Role, StreamWriter};

pub const SPDY_PROTOCOL: &str = "portforward.k8s.io";
/// Port-forward requests that have opened one of their two streams, per connection.
const MAX_HALF_OPEN: usize = 128;
pub const WS_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "portforward.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

/// Copy between a TCP connection and a stream's channels until the pod's side closes; `ended`
/// runs then. Clients (client-go) wait for the error stream to end before they close their own
/// side, so the forward ends with the pod's side, as containerd's does; a client's half-close
/// only shuts the pod connection's write side.
async fn splice(
    tcp: tokio::net::TcpStream,
    mut from_client: mpsc::Receiver<Bytes>,
    to_client: impl Fn(Bytes) -> futures::future::BoxFuture<'static, bool> + Send + 'static,
    ended: futures::future::BoxFuture<'static, ()>,
) {
    let (mut r, mut w) = tcp.into_split();
    let up = async move {
        while let Some(b) = from_client.recv().await {
            if w.write_all(&b).await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    };
    let down = async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if !to_client(Bytes::copy_from_slice(&buf[..n])).await {
                        break;
                    }
                }
            }
        }
        ended.await;
    };
    let up = tokio::spawn(up);
    down.await;
    up.abort();
}

pub async fn serve_spdy<IO>(io: IO, pod: String, ports: Vec<u16>, backend: Arc<dyn Backend>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut conn = Connection::new(io, Role::Server);
    // Streams by request id, until both of a pair are there.
    let mut half: HashMap<String, (Option<spdy::Stream>, Option<spdy::Stream>)> = HashMap::new();
    while let Some(s) = conn.accept().await {
        let id = spdy::header(&s.headers, "requestID")
            .unwrap_or_default()
            .to_string();
        // Requests waiting for their second stream are bounded: past that, new ones are reset.
        if !half.contains_key(&id) && half.len() >= MAX_HALF_OPEN {
            let _ = s.tx.reset().await;
            continue;
        }
        let kind = spdy::header(&s.headers, "streamType").unwrap_or_default();
        let entry = half.entry(id.clone()).or_default();
        match kind {
            "data" => entry.0 = Some(s),
            "error" => entry.1 = Some(s),
            _ => {
                let _ = s.tx.reset().await;
                continue;
            }
        }
        if let (Some(_), Some(_)) = entry {
            let (Some(data), Some(error)) = half.remove(&id).unwrap_or_default() else {
                continue;
            };
            tokio::spawn(forward_pair(
                data,
                error,
                pod.clone(),
                ports.clone(),
                backend.clone(),
            ));
        }
    }
}

async fn forward_pair(
    data: spdy::Stream,
    error: spdy::Stream,
    pod: String,
    allowed: Vec<u16>,
    backend: Arc<dyn Backend>,
) {
    let port_text = spdy::header(&data.headers, "port").unwrap_or_default();
    let fail = |msg: String, error: StreamWriter, data: StreamWriter| async move {
        let _ = error.write(msg.as_bytes()).await;
        let _ = error.close().await;
        let _ = data.close().await;
    };
    let port = match port_text.parse::<u16>() {
        Ok(p) if p > 0 && (allowed.is_empty() || allowed.contains(&p)) => p,
        _ => {
            return fail(
                format!("port {port_text:?} is not a port this request may forward"),
                error.tx,
                data.tx,
            )
            .await
        }
    };
    match backend.port_forward(pod.clone(), port).await {
        Ok(tcp) => {
            let tx = data.tx.clone();
            let (closing, closing_err) = (data.tx.clone(), error.tx.clone());
            splice(
                tcp,
                data.rx,
                move |b| {
                    let tx = tx.clone();
                    Box::pin(async move { tx.write(&b).await.is_ok() })
                },
                Box::pin(async move {
                    let _ = closing.close().await;
                    let _ = closing_err.close().await;
                }),
            )
            .await;
        }
        Err(e) => {
            fail(
                format!("error forwarding port {port} to pod {pod}: {e}"),
                error.tx,
                data.tx,
            )
            .await
        }
    }
}

pub async fn serve_ws<IO>(
    ws: WebSocketStream<IO>,
    protocol: String,
    pod: String,
    ports: Vec<u16>,
    backend: Arc<dyn Backend>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sink, mut source) = ws.split();
    let (out_tx, writer) = ws_writer(sink, protocol);
    let mut inputs = Vec::new();
    let mut tasks = Vec::new();
    for (i, port) in ports.iter().copied().enumerate() {
        let (data_ch, err_ch) = ((2 * i) as u8, (2 * i + 1) as u8);
        // Each channel starts with its port, little-endian, as the kubelet's server does.
        for ch in [data_ch, err_ch] {
            let _ = out_tx
                .send((ch, Bytes::copy_from_slice(&port.to_le_bytes())))
                .await;
        }
        let (in_tx, in_rx) = mpsc::channel::<Bytes>(16);
        inputs.push(in_tx);
        let out = out_tx.clone();
        let backend = backend.clone();
        let pod = pod.clone();
        tasks.push(tokio::spawn(async move {
            match backend.port_forward(pod.clone(), port).await {
                Ok(tcp) => {
                    splice(
                        tcp,
                        in_rx,
                        move |b| {
                            let out = out.clone();
                            Box::pin(async move { out.send((data_ch, b)).await.is_ok() })
                        },
                        Box::pin(async {}),
                    )
                    .await
                }
                Err(e) => {
                    let msg = format!("error forwarding port {port} to pod {pod}: {e}");
                    let _ = out.send((err_ch, Bytes::from(msg))).await;
                }
            }
        }));
    }
    drop(out_tx);
    while let Some(Ok(msg)) = source.next().await {
        if msg.is_close() {
            break;
        }
        if let Some((ch, data)) = ws_decode(msg) {
            if let Some(tx) = inputs.get((ch / 2) as usize).filter(|_| ch % 2 == 0) {
                let _ = tx.send(data).await;
            }
        }
    }
    drop(inputs);
    for t in tasks {
        let _ = t.await;
    }
    let _ = writer.await;
}
