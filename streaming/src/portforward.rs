//! PortForward: `portforward.k8s.io` over SPDY (a data and an error stream per port and request)
//! and the WebSocket channel protocol (channels 2n and 2n+1 for the n-th port).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

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
/// How long the first stream of a request waits for its pair (the kubelet's stream creation
/// timeout). A waiting stream is not read, so data sent on it holds the connection's reader:
/// without this deadline a client could stall its connection, and its slot, for good.
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);
/// How long resetting an expired stream may wait on a client that does not read.
const RESET_TIMEOUT: Duration = Duration::from_secs(5);
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

/// The streams of one request received so far, and when the request gives up on the rest.
struct HalfOpen {
    data: Option<spdy::Stream>,
    error: Option<spdy::Stream>,
    deadline: tokio::time::Instant,
}

pub async fn serve_spdy<IO>(io: IO, pod: String, ports: Vec<u16>, backend: Arc<dyn Backend>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut conn = Connection::new(io, Role::Server);
    // Streams by request id, until both of a pair are there.
    let mut half: HashMap<String, HalfOpen> = HashMap::new();
    loop {
        let expiry = half.values().map(|h| h.deadline).min();
        let s = tokio::select! {
            s = conn.accept() => match s {
                Some(s) => s,
                None => break,
            },
            _ = sleep_until(expiry) => {
                let now = tokio::time::Instant::now();
                half.retain(|_, h| {
                    let keep = h.deadline > now;
                    if !keep {
                        h.data.take().into_iter().chain(h.error.take()).for_each(reset_later);
                    }
                    keep
                });
                continue;
            }
        };
        let id = spdy::header(&s.headers, "requestID")
            .unwrap_or_default()
            .to_string();
        // Requests waiting for their second stream are bounded: past that, new ones are reset.
        if !half.contains_key(&id) && half.len() >= MAX_HALF_OPEN {
            reset_later(s);
            continue;
        }
        let kind = spdy::header(&s.headers, "streamType").unwrap_or_default();
        let entry = half.entry(id.clone()).or_insert_with(|| HalfOpen {
            data: None,
            error: None,
            deadline: tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT,
        });
        match kind {
            "data" => entry.data = Some(s),
            "error" => entry.error = Some(s),
            _ => {
                reset_later(s);
                continue;
            }
        }
        if entry.data.is_some() && entry.error.is_some() {
            let Some(HalfOpen {
                data: Some(data),
                error: Some(error),
                ..
            }) = half.remove(&id)
            else {
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

/// Sleep until `deadline`; forever when there is none.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Drop a stream the server will not use and reset it in the background. Its receiver goes at
/// once, so data the client sent on it no longer holds the connection's reader; the reset waits
/// at most [`RESET_TIMEOUT`] on a client that does not read.
fn reset_later(s: spdy::Stream) {
    let tx = s.tx;
    drop(s.rx);
    tokio::spawn(async move {
        let _ = tokio::time::timeout(RESET_TIMEOUT, tx.reset()).await;
    });
}

async fn forward_pair(
    data: spdy::Stream,
    error: spdy::Stream,
    pod: String,
    allowed: Vec<u16>,
    backend: Arc<dyn Backend>,
) {
    // Nothing is read from the error stream: its receiver goes now, so that data a client sends
    // on it cannot hold the connection's reader.
    let error_tx = error.tx;
    drop(error.rx);
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
                error_tx,
                data.tx,
            )
            .await
        }
    };
    match backend.port_forward(pod.clone(), port).await {
        Ok(tcp) => {
            let tx = data.tx.clone();
            let (closing, closing_err) = (data.tx.clone(), error_tx.clone());
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
                error_tx,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Stdio;
    use crishim_proto::cri;
    use futures::future::BoxFuture;
    use std::time::Duration;

    struct NoPods;

    impl Backend for NoPods {
        fn exec(&self, _: cri::ExecRequest, _: Stdio) -> BoxFuture<'static, crate::Outcome> {
            Box::pin(async { Err("no containers".into()) })
        }
        fn attach(&self, _: cri::AttachRequest, _: Stdio) -> BoxFuture<'static, crate::Outcome> {
            Box::pin(async { Err("no containers".into()) })
        }
        fn port_forward(
            &self,
            _: String,
            port: u16,
        ) -> BoxFuture<'static, std::io::Result<tokio::net::TcpStream>> {
            Box::pin(async move { Err(std::io::Error::other(format!("nothing on {port}"))) })
        }
    }

    fn headers(kind: &str) -> spdy::Headers {
        vec![
            ("streamType".into(), kind.into()),
            ("port".into(), "80".into()),
            ("requestID".into(), "1".into()),
        ]
    }

    /// A request that opens only its data stream and fills it, then leaves (found by the
    /// `portforward_spdy` fuzz target): the unread stream held the connection's reader, so the
    /// session never saw the client go. It is dropped at the stream creation timeout.
    #[tokio::test(start_paused = true)]
    async fn a_half_open_request_filled_with_data_does_not_hold_the_session() {
        let (client_io, server_io) = tokio::io::duplex(4 << 20);
        let session = tokio::spawn(serve_spdy(
            server_io,
            "pod".into(),
            vec![],
            Arc::new(NoPods),
        ));
        let client = Connection::new(client_io, Role::Client);
        let s = client.open(headers("data")).await.unwrap();
        for _ in 0..64 {
            s.tx.write(&[7u8; 1024]).await.unwrap();
        }
        drop(s);
        drop(client);
        let ended = tokio::time::timeout(Duration::from_secs(60), session).await;
        assert!(
            ended.is_ok(),
            "the session outlived the stream creation timeout"
        );
    }

    /// A pod whose every port accepts and then stays silent.
    struct SilentPod(std::net::SocketAddr);

    impl Backend for SilentPod {
        fn exec(&self, _: cri::ExecRequest, _: Stdio) -> BoxFuture<'static, crate::Outcome> {
            Box::pin(async { Err("no containers".into()) })
        }
        fn attach(&self, _: cri::AttachRequest, _: Stdio) -> BoxFuture<'static, crate::Outcome> {
            Box::pin(async { Err("no containers".into()) })
        }
        fn port_forward(
            &self,
            _: String,
            _: u16,
        ) -> BoxFuture<'static, std::io::Result<tokio::net::TcpStream>> {
            Box::pin(tokio::net::TcpStream::connect(self.0))
        }
    }

    /// Data a client writes on a forward's error stream is never read; it must not hold the
    /// connection's reader while the forward runs, or the session never sees the client go.
    /// (Real time: the forward goes through a real TCP connection.)
    #[tokio::test]
    async fn data_on_the_error_stream_does_not_hold_the_session() {
        let pod = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = Arc::new(SilentPod(pod.local_addr().unwrap()));
        let held = tokio::spawn(async move {
            let (conn, _) = pod.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(conn);
        });
        let (client_io, server_io) = tokio::io::duplex(4 << 20);
        let session = tokio::spawn(serve_spdy(server_io, "pod".into(), vec![], backend));
        let client = Connection::new(client_io, Role::Client);
        let err = client.open(headers("error")).await.unwrap();
        let data = client.open(headers("data")).await.unwrap();
        for _ in 0..64 {
            err.tx.write(&[7u8; 1024]).await.unwrap();
        }
        drop((err, data, client));
        let ended = tokio::time::timeout(Duration::from_secs(10), session).await;
        held.abort();
        assert!(ended.is_ok(), "the session never saw the client go");
    }
}
