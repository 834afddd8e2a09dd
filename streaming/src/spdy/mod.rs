//! SPDY/3.1 as the Kubernetes streaming protocols use it (the framing of moby/spdystream): streams
//! opened by the client with SYN_STREAM and answered with SYN_REPLY, data frames with FIN for a
//! half-close, RST_STREAM, PING and GOAWAY. Flow-control windows are not enforced, as the Go peers
//! do not enforce them either. Memory is bounded instead by one byte budget per connection
//! ([`CONNECTION_BUFFER`]): a data frame waits for budget before it is queued to its stream, and
//! gives it back only once its consumer has taken it, so a peer that fills streams nobody reads
//! stalls its own connection (TCP backpressure) rather than growing the daemon.

mod error;
pub mod frame;
pub mod headers;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

pub use error::SpdyError;
pub use headers::{get as header, Headers};

/// Frames written at most this large; bigger writes are split.
const MAX_DATA_FRAME: usize = 32 * 1024;
/// Frames of one stream buffered before the reader waits for its consumer.
const STREAM_BUFFER: usize = 16;
/// Streams the peer may have open at once on one connection; more are reset. Exec uses five,
/// a port-forward two per connection it forwards.
const MAX_STREAMS: usize = 256;
/// Bytes of received data frames one connection may hold, over all its streams, before its
/// reader waits for consumers: 16 data frames of the largest size.
pub const CONNECTION_BUFFER: usize = 16 * frame::MAX_DATA_PAYLOAD;

/// A received frame and the share of its connection's budget it holds until consumed.
type Metered = (Bytes, OwnedSemaphorePermit);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

type Io = Box<dyn AsyncWrite + Send + Unpin>;

/// The write side: header compression state and the socket, under one lock so that header blocks
/// reach the wire in the order they were compressed.
struct Writer {
    out: tokio::sync::Mutex<(Io, headers::Encoder)>,
    next_id: AtomicU32,
    replies: Mutex<HashMap<u32, oneshot::Sender<()>>>,
    streams: Mutex<HashMap<u32, mpsc::Sender<Metered>>>,
    budget: Arc<Semaphore>,
}

impl Writer {
    /// A stream's inbound channel: the reader queues metered frames; a forwarding task hands
    /// them to the consumer's plain `Receiver<Bytes>` one at a time, returning each frame's
    /// budget once the consumer has taken it.
    fn stream_channel(&self) -> (mpsc::Sender<Metered>, mpsc::Receiver<Bytes>) {
        let (metered_tx, mut metered_rx) = mpsc::channel::<Metered>(STREAM_BUFFER);
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            while let Some((data, permit)) = metered_rx.recv().await {
                if tx.send(data).await.is_err() {
                    return;
                }
                // With one slot, a free slot means the consumer took the frame.
                if tx.reserve().await.is_err() {
                    return;
                }
                drop(permit);
            }
        });
        (metered_tx, rx)
    }

    async fn raw(&self, frame: &[u8]) -> Result<(), SpdyError> {
        let mut out = self.out.lock().await;
        out.0.write_all(frame).await?;
        out.0.flush().await?;
        Ok(())
    }

    async fn with_headers(
        &self,
        kind: u16,
        flags: u8,
        prefix: &[u8],
        h: &Headers,
    ) -> Result<(), SpdyError> {
        let mut out = self.out.lock().await;
        let block = out.1.encode(h);
        let mut payload = prefix.to_vec();
        payload.extend_from_slice(&block);
        let f = frame::control(kind, flags, &payload);
        out.0.write_all(&f).await?;
        out.0.flush().await?;
        Ok(())
    }
}

/// The sending half of one stream.
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    w: Arc<Writer>,
}

impl StreamWriter {
    pub async fn write(&self, data: &[u8]) -> Result<(), SpdyError> {
        for chunk in data.chunks(MAX_DATA_FRAME) {
            self.w.raw(&frame::data(self.id, false, chunk)).await?;
        }
        Ok(())
    }

    /// Half-close: the peer reads EOF.
    pub async fn close(&self) -> Result<(), SpdyError> {
        self.w.raw(&frame::data(self.id, true, &[])).await
    }

    pub async fn reset(&self) -> Result<(), SpdyError> {
        let mut p = self.id.to_be_bytes().to_vec();
        p.extend_from_slice(&frame::RST_CANCEL.to_be_bytes());
        self.w.raw(&frame::control(frame::RST_STREAM, 0, &p)).await
    }
}

/// One stream: its headers, the data the peer sends (the channel ends at the peer's FIN or
/// reset), and the writer for our side.
pub struct Stream {
    pub id: u32,
    pub headers: Headers,
    pub rx: mpsc::Receiver<Bytes>,
    pub tx: StreamWriter,
}

pub struct Connection {
    w: Arc<Writer>,
    incoming: mpsc::Receiver<Stream>,
    reader: tokio::task::JoinHandle<()>,
}

impl Connection {
    pub fn new<IO>(io: IO, role: Role) -> Self
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (r, wr) = tokio::io::split(io);
        let w = Arc::new(Writer {
            out: tokio::sync::Mutex::new((Box::new(wr), headers::Encoder::new())),
            // Clients open odd streams, servers even ones.
            next_id: AtomicU32::new(if role == Role::Client { 1 } else { 2 }),
            replies: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            budget: Arc::new(Semaphore::new(CONNECTION_BUFFER)),
        });
        let (tx, incoming) = mpsc::channel(64);
        let reader = tokio::spawn(read_loop(r, w.clone(), tx));
        Connection {
            w,
            incoming,
            reader,
        }
    }

    /// The next stream the peer opened; None once the connection is gone.
    pub async fn accept(&mut self) -> Option<Stream> {
        self.incoming.recv().await
    }

    /// Open a stream with `headers` and wait for the peer's SYN_REPLY.
    pub async fn open(&self, headers: Headers) -> Result<Stream, SpdyError> {
        let id = self.w.next_id.fetch_add(2, Ordering::Relaxed);
        let (reply_tx, reply_rx) = oneshot::channel();
        let (data_tx, rx) = self.w.stream_channel();
        lock(&self.w.replies).insert(id, reply_tx);
        lock(&self.w.streams).insert(id, data_tx);
        let mut prefix = id.to_be_bytes().to_vec();
        prefix.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        self.w
            .with_headers(frame::SYN_STREAM, 0, &prefix, &headers)
            .await?;
        reply_rx.await.map_err(|_| SpdyError::Closed)?;
        Ok(Stream {
            id,
            headers,
            rx,
            tx: StreamWriter {
                id,
                w: self.w.clone(),
            },
        })
    }

    /// Tell the peer no new streams will be accepted, and close our side of the connection.
    pub async fn close(&self) {
        let p = [0u8; 8];
        let _ = self.w.raw(&frame::control(frame::GOAWAY, 0, &p)).await;
        let _ = self.w.out.lock().await.0.shutdown().await;
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn read_loop<R: AsyncRead + Unpin>(mut r: R, w: Arc<Writer>, incoming: mpsc::Sender<Stream>) {
    let mut dec = headers::Decoder::new();
    if let Err(e) = read_frames(&mut r, &w, &incoming, &mut dec).await {
        tracing::debug!(error = %e, "SPDY connection ended");
    }
    // Every stream sees EOF; pending opens fail.
    lock(&w.streams).clear();
    lock(&w.replies).clear();
}

async fn read_frames<R: AsyncRead + Unpin>(
    r: &mut R,
    w: &Arc<Writer>,
    incoming: &mpsc::Sender<Stream>,
    dec: &mut headers::Decoder,
) -> Result<(), SpdyError> {
    while let Some(f) = frame::read(r).await? {
        match f {
            frame::Frame::Data { stream, fin, data } => {
                let tx = lock(&w.streams).get(&stream).cloned();
                if let Some(tx) = tx {
                    if !data.is_empty() {
                        // Frames are capped at MAX_DATA_PAYLOAD, well under the budget.
                        let permit = w
                            .budget
                            .clone()
                            .acquire_many_owned(data.len() as u32)
                            .await
                            .map_err(|_| SpdyError::Closed)?;
                        let _ = tx.send((data, permit)).await;
                    }
                }
                if fin {
                    lock(&w.streams).remove(&stream);
                }
            }
            frame::Frame::Control {
                kind,
                flags,
                payload,
            } => match kind {
                frame::SYN_STREAM => {
                    let id = frame::stream_id(&payload)?;
                    let block = payload
                        .get(10..)
                        .ok_or_else(|| SpdyError::Protocol("short SYN_STREAM".into()))?;
                    let headers = dec.decode(block)?;
                    if lock(&w.streams).len() >= MAX_STREAMS {
                        let mut p = id.to_be_bytes().to_vec();
                        p.extend_from_slice(&frame::RST_REFUSED_STREAM.to_be_bytes());
                        w.raw(&frame::control(frame::RST_STREAM, 0, &p)).await?;
                        continue;
                    }
                    let (data_tx, rx) = w.stream_channel();
                    if flags & frame::FLAG_FIN == 0 {
                        lock(&w.streams).insert(id, data_tx);
                    }
                    w.with_headers(frame::SYN_REPLY, 0, &id.to_be_bytes(), &Vec::new())
                        .await?;
                    let s = Stream {
                        id,
                        headers,
                        rx,
                        tx: StreamWriter { id, w: w.clone() },
                    };
                    if incoming.send(s).await.is_err() {
                        return Ok(());
                    }
                }
                frame::SYN_REPLY => {
                    let id = frame::stream_id(&payload)?;
                    // The reply's headers carry nothing the streaming protocols use, but they
                    // advance the shared decompression state.
                    dec.decode(payload.get(4..).unwrap_or_default())?;
                    if let Some(tx) = lock(&w.replies).remove(&id) {
                        let _ = tx.send(());
                    }
                }
                frame::HEADERS => {
                    dec.decode(payload.get(4..).unwrap_or_default())?;
                }
                frame::RST_STREAM => {
                    let id = frame::stream_id(&payload)?;
                    lock(&w.streams).remove(&id);
                    lock(&w.replies).remove(&id);
                }
                frame::PING => {
                    w.raw(&frame::control(frame::PING, 0, &payload)).await?;
                }
                frame::SETTINGS | frame::WINDOW_UPDATE | frame::GOAWAY => {}
                other => tracing::debug!(kind = other, "ignoring SPDY control frame"),
            },
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn streams_past_the_cap_are_refused() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let client = Connection::new(a, Role::Client);
        let mut server = Connection::new(b, Role::Server);
        let held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(s) = server.accept().await {
                held.push(s);
            }
            held
        });
        let mut open = Vec::new();
        for _ in 0..MAX_STREAMS {
            open.push(
                client
                    .open(Vec::new())
                    .await
                    .expect("a stream under the cap"),
            );
        }
        assert!(matches!(
            client.open(Vec::new()).await,
            Err(SpdyError::Closed)
        ));
        drop(client);
        held.abort();
    }

    /// A peer that fills streams nobody reads gets its connection stalled once the budget is
    /// held, instead of the server queueing 16 frames on each of its 256 streams.
    #[tokio::test]
    async fn unread_streams_hold_at_most_the_connection_budget() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let client = Connection::new(a, Role::Client);
        let mut server = Connection::new(b, Role::Server);
        let budget = server.w.budget.clone();
        let held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(s) = server.accept().await {
                held.push(s);
            }
            held
        });
        // One largest data frame on each of 40 streams: 40 MiB if each stream's queue took one.
        let chunk = vec![1u8; frame::MAX_DATA_PAYLOAD];
        let mut sent = 0usize;
        for _ in 0..40 {
            let one = async {
                let s = client.open(Vec::new()).await?;
                client.w.raw(&frame::data(s.id, false, &chunk)).await
            };
            let wrote = tokio::time::timeout(std::time::Duration::from_millis(300), one).await;
            if !matches!(wrote, Ok(Ok(()))) {
                break;
            }
            sent += 1;
        }
        assert_eq!(budget.available_permits(), 0, "the budget is all held");
        assert!(
            sent <= CONNECTION_BUFFER / frame::MAX_DATA_PAYLOAD + 4,
            "the peer was stalled once the budget was held, not after {sent} frames"
        );
        drop(client);
        held.abort();
    }

    #[tokio::test]
    async fn a_client_and_a_server_exchange_data_on_streams() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let client = Connection::new(a, Role::Client);
        let mut server = Connection::new(b, Role::Server);
        let srv = tokio::spawn(async move {
            let mut s = server.accept().await.unwrap();
            assert_eq!(header(&s.headers, "streamType"), Some("stdin"));
            let mut got = Vec::new();
            while let Some(d) = s.rx.recv().await {
                got.extend_from_slice(&d);
            }
            s.tx.write(&got).await.unwrap();
            s.tx.close().await.unwrap();
            server
        });
        let mut s = client
            .open(vec![("streamType".into(), "stdin".into())])
            .await
            .unwrap();
        let big = vec![7u8; 100_000];
        s.tx.write(&big).await.unwrap();
        s.tx.close().await.unwrap();
        let mut back = Vec::new();
        while let Some(d) = s.rx.recv().await {
            back.extend_from_slice(&d);
        }
        assert_eq!(back, big);
        srv.await.unwrap();
    }
}
