//! Exec and Attach over SPDY (the kubelet's and crictl's `remotecommand` protocol) and WebSocket
//! (the channel protocols of newer clients).

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::backend::{Outcome, Stdio, TermSize};
use crate::spdy::{self, Connection, Role, StreamWriter};
use crate::status::error_stream_bytes;

/// How long a client has to open all its streams (the kubelet's `streamCreationTimeout`).
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// SPDY subprotocols, best first.
pub const SPDY_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

/// WebSocket subprotocols, best first.
pub const WS_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

/// Which streams a request wants.
#[derive(Debug, Clone, Copy)]
pub struct Opts {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl Opts {
    pub fn new(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> Self {
        Opts {
            stdin,
            stdout,
            stderr,
            tty,
        }
    }
}

/// Runs the command once the streams are wired up.
pub type Run = Box<dyn FnOnce(Stdio) -> futures::future::BoxFuture<'static, Outcome> + Send>;

fn version_of(protocol: &str) -> u8 {
    match protocol.split('.').next() {
        Some("v5") => 5,
        Some("v4") => 4,
        Some("v3") => 3,
        Some("v2") => 2,
        _ => 1,
    }
}

/// Copy a channel to a SPDY stream, then half-close it.
fn pump_to_stream(mut rx: mpsc::Receiver<Bytes>, tx: StreamWriter) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(b) = rx.recv().await {
            if tx.write(&b).await.is_err() {
                return;
            }
        }
        let _ = tx.close().await;
    })
}

/// Most bytes of a resize stream kept while waiting for a complete JSON object (one is ~30 bytes).
const MAX_RESIZE_PENDING: usize = 4096;

/// Decode the resize stream: JSON `{"Width":..,"Height":..}` objects, one after another. Garbage
/// that never completes an object ends the stream instead of growing the buffer.
fn resizes(mut rx: mpsc::Receiver<Bytes>) -> mpsc::Receiver<TermSize> {
    let (tx, out) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut buf = Vec::new();
        while let Some(b) = rx.recv().await {
            buf.extend_from_slice(&b);
            let mut de = serde_json::Deserializer::from_slice(&buf).into_iter::<TermSize>();
            let mut used = 0;
            while let Some(Ok(size)) = de.next() {
                used = de.byte_offset();
                if tx.send(size).await.is_err() {
                    return;
                }
            }
            buf.drain(..used);
            if buf.len() > MAX_RESIZE_PENDING {
                tracing::debug!("resize stream: no JSON object in {} bytes", buf.len());
                return;
            }
        }
    });
    out
}

pub async fn serve_spdy<IO>(io: IO, protocol: &str, opts: Opts, run: Run)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let version = version_of(protocol);
    let mut conn = Connection::new(io, Role::Server);
    let mut wanted = vec!["error"];
    if opts.stdin {
        wanted.push("stdin");
    }
    if opts.stdout {
        wanted.push("stdout");
    }
    if opts.stderr && !(opts.tty && version >= 2) {
        wanted.push("stderr");
    }
    if opts.tty && version >= 3 {
        wanted.push("resize");
    }
    let mut streams: HashMap<String, spdy::Stream> = HashMap::new();
    let gathered = tokio::time::timeout(STREAM_CREATION_TIMEOUT, async {
        while !wanted.iter().all(|w| streams.contains_key(*w)) {
            let s = conn.accept().await?;
            let kind = spdy::header(&s.headers, "streamType")
                .unwrap_or_default()
                .to_string();
            streams.insert(kind, s);
        }
        Some(())
    })
    .await;
    if !matches!(gathered, Ok(Some(()))) {
        tracing::debug!(?wanted, "the client did not open its streams");
        conn.close().await;
        return;
    }
    let (gone_tx, gone) = watch::channel(false);
    let mut pumps = Vec::new();
    let mut output = |name: &str| {
        streams.remove(name).map(|s| {
            let (tx, rx) = mpsc::channel(16);
            pumps.push(pump_to_stream(rx, s.tx));
            tx
        })
    };
    let stdout = output("stdout");
    let stderr = output("stderr");
    // Only the error stream's writer is kept: nothing is read from it.
    let error = streams.remove("error").map(|s| s.tx);
    let stdin = streams.remove("stdin").map(|s| s.rx);
    let resize = streams.remove("resize").map(|s| resizes(s.rx));
    // Streams of other types go now: held unread, data a client sent on them would stall the
    // connection's reader, and with it stdin and the watch for the client going away.
    drop(streams);
    // The client going away shows as the connection ending: watch for it alongside.
    let mut watcher = conn;
    let watch_task = tokio::spawn(async move {
        while watcher.accept().await.is_some() {}
        let _ = gone_tx.send(true);
        watcher
    });
    let outcome = run(Stdio {
        stdin,
        stdout,
        stderr,
        resize,
        tty: opts.tty,
        gone,
    })
    .await;
    for p in pumps {
        let _ = p.await;
    }
    if let Some(e) = error {
        if let Some(bytes) = error_stream_bytes(&outcome, version >= 4) {
            let _ = e.write(&bytes).await;
        }
        let _ = e.close().await;
    }
    watch_task.abort();
    if let Ok(conn) = watch_task.await {
        conn.close().await;
    }
}

/// WebSocket channel numbers.
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
/// v5: `[255, channel]` closes that channel (stdin's EOF).
const CLOSE: u8 = 255;

/// Encode one channel message for `protocol`.
pub fn ws_message(protocol: &str, channel: u8, data: &[u8]) -> Message {
    if protocol.starts_with("base64.") {
        use base64::Engine;
        let mut s = String::with_capacity(1 + data.len() * 4 / 3 + 4);
        s.push((b'0' + channel) as char);
        s.push_str(&base64::engine::general_purpose::STANDARD.encode(data));
        Message::Text(s.into())
    } else {
        let mut b = Vec::with_capacity(1 + data.len());
        b.push(channel);
        b.extend_from_slice(data);
        Message::Binary(b.into())
    }
}

/// Decode one channel message: (channel, payload).
pub fn ws_decode(msg: Message) -> Option<(u8, Bytes)> {
    match msg {
        Message::Binary(b) if !b.is_empty() => Some((b[0], b.slice(1..))),
        Message::Text(t) if !t.is_empty() => {
            use base64::Engine;
            let t = t.as_str();
            let ch = t.as_bytes()[0].checked_sub(b'0')?;
            let data = base64::engine::general_purpose::STANDARD
                .decode(&t.as_bytes()[1..])
                .ok()?;
            Some((ch, Bytes::from(data)))
        }
        _ => None,
    }
}

/// A task sending (channel, data) messages on a WebSocket, closing it once every sender is gone.
pub(crate) fn ws_writer<IO>(
    mut sink: futures_util::stream::SplitSink<WebSocketStream<IO>, Message>,
    protocol: String,
) -> (mpsc::Sender<(u8, Bytes)>, tokio::task::JoinHandle<()>)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<(u8, Bytes)>(16);
    let task = tokio::spawn(async move {
        while let Some((ch, data)) = rx.recv().await {
            if sink.send(ws_message(&protocol, ch, &data)).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    (tx, task)
}

pub async fn serve_ws<IO>(ws: WebSocketStream<IO>, protocol: String, opts: Opts, run: Run)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let version = version_of(&protocol);
    let (sink, mut source) = ws.split();
    let (out_tx, writer) = ws_writer(sink, protocol.clone());
    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(16);
    let (resize_tx, resize_rx) = mpsc::channel::<Bytes>(4);
    let (gone_tx, gone) = watch::channel(false);
    let reader = tokio::spawn(async move {
        let mut stdin_tx = Some(stdin_tx);
        while let Some(Ok(msg)) = source.next().await {
            if msg.is_close() {
                break;
            }
            match ws_decode(msg) {
                Some((STDIN, data)) => {
                    if let Some(tx) = &stdin_tx {
                        let _ = tx.send(data).await;
                    }
                }
                Some((RESIZE, data)) => {
                    let _ = resize_tx.send(data).await;
                }
                Some((CLOSE, data)) if data.first() == Some(&STDIN) => stdin_tx = None,
                _ => {}
            }
        }
        let _ = gone_tx.send(true);
    });
    // Outputs go to the writer tagged with their channel.
    let output = |ch: u8| {
        let (tx, mut rx) = mpsc::channel::<Bytes>(16);
        let out = out_tx.clone();
        let task = tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if out.send((ch, b)).await.is_err() {
                    return;
                }
            }
        });
        (tx, task)
    };
    let (stdout, t1) = output(STDOUT);
    let (stderr, t2) = output(STDERR);
    let outcome = run(Stdio {
        stdin: opts.stdin.then_some(stdin_rx),
        stdout: opts.stdout.then_some(stdout),
        stderr: (opts.stderr && !opts.tty).then_some(stderr),
        resize: (opts.tty && version >= 3).then(|| resizes(resize_rx)),
        tty: opts.tty,
        gone,
    })
    .await;
    let _ = t1.await;
    let _ = t2.await;
    if let Some(bytes) = error_stream_bytes(&outcome, version >= 4) {
        let _ = out_tx.send((ERROR, Bytes::from(bytes))).await;
    }
    drop(out_tx);
    let _ = writer.await;
    reader.abort();
}

#[cfg(test)]
mod tests {
    use crate::spdy::{Connection, Role};
    use std::time::Duration;

    /// A stream of a type the session does not use, filled with data, must not hold the
    /// connection's reader: stdin still reaches its EOF and the session ends.
    #[tokio::test(start_paused = true)]
    async fn an_unused_stream_filled_with_data_does_not_hold_stdin() {
        let (client_io, server_io) = tokio::io::duplex(4 << 20);
        let run: super::Run = Box::new(|mut io: crate::Stdio| {
            Box::pin(async move {
                let mut stdin = io.stdin.take().expect("stdin was asked for");
                while stdin.recv().await.is_some() {}
                Ok(Some(0))
            })
        });
        let opts = super::Opts::new(true, true, false, false);
        let session = tokio::spawn(async move {
            super::serve_spdy(server_io, "v4.channel.k8s.io", opts, run).await
        });
        let client = Connection::new(client_io, Role::Client);
        let mut open = Vec::new();
        for kind in ["error", "stdout", "bogus", "stdin"] {
            let h = vec![("streamType".to_string(), kind.to_string())];
            open.push(client.open(h).await.unwrap());
        }
        for _ in 0..64 {
            open[2].tx.write(&[7u8; 1024]).await.unwrap();
        }
        open[3].tx.close().await.unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(60), session).await;
        assert!(ended.is_ok(), "stdin never reached its end");
        drop((open, client));
    }

    #[tokio::test]
    async fn a_resize_stream_of_garbage_ends_instead_of_growing() {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut sizes = super::resizes(rx);
        tx.send(bytes::Bytes::from_static(b"{\"Width\":80,\"Height\":24}"))
            .await
            .unwrap();
        assert_eq!(
            sizes.recv().await.map(|s| (s.width, s.height)),
            Some((80, 24))
        );
        // An object that never closes.
        tx.send(bytes::Bytes::from_static(b"{\"Width\":"))
            .await
            .unwrap();
        let junk = bytes::Bytes::from(vec![b' '; 1024]);
        for _ in 0..8 {
            if tx.send(junk.clone()).await.is_err() {
                break;
            }
        }
        assert!(sizes.recv().await.is_none());
    }
}
