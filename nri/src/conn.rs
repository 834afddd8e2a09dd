//! One NRI connection: a unix socket that carries, through the [`mux`](crate::mux), ttrpc
//! calls in both directions. The runtime calls the plugin's services and serves its own; a
//! plugin does the reverse. [`Endpoint`] is either side, chosen by [`Role`].
//!
//! The peer is hostile until bounded: frames and messages are capped by the decoders, a call
//! waits at most its timeout, requests served at once are capped, and any protocol error closes
//! the connection, which fails every pending call at once.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use prost::Message as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use crate::mux::{self, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::ttrpc::{self, Kind, Message};

/// Requests from the peer served at once; more are answered `ResourceExhausted`.
pub const MAX_CONCURRENT_SERVED: usize = 16;
/// Writes queued for the socket before senders wait.
const WRITE_QUEUE: usize = 64;
/// What one read takes from the socket.
const READ_CHUNK: usize = 64 << 10;

/// gRPC codes NRI's peers send and expect.
pub mod code {
    pub const OK: i32 = 0;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const NOT_FOUND: i32 = 5;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const UNIMPLEMENTED: i32 = 12;
    pub const INTERNAL: i32 = 13;
}

/// Which services each side calls and serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Calls the plugin's services (mux connection 1), serves the runtime's (2).
    Runtime,
    /// Calls the runtime's services (2), serves the plugin's (1).
    Plugin,
}

impl Role {
    fn calls_on(self) -> u32 {
        match self {
            Role::Runtime => PLUGIN_SERVICE_CONN,
            Role::Plugin => RUNTIME_SERVICE_CONN,
        }
    }

    fn serves_on(self) -> u32 {
        match self {
            Role::Runtime => RUNTIME_SERVICE_CONN,
            Role::Plugin => PLUGIN_SERVICE_CONN,
        }
    }
}

/// A failed call.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CallError {
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    #[error("connection closed")]
    Closed,
    #[error("the reply is not a valid message: {0}")]
    Decode(String),
    /// The peer answered with an error status.
    #[error("{message} (code {code})")]
    Status { code: i32, message: String },
}

impl CallError {
    /// Whether the peer does not have this method (a plugin built before it existed).
    pub fn is_unimplemented(&self) -> bool {
        matches!(self, CallError::Status { code, .. } if *code == code::UNIMPLEMENTED)
    }

    /// Whether the connection is of no more use: it is closed, or the peer failed to answer in
    /// time or sent nonsense. NRI drops such a plugin.
    pub fn is_fatal(&self) -> bool {
        !matches!(self, CallError::Status { .. })
    }
}

/// An error a handler answers with: a gRPC code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: i32,
    pub message: String,
}

impl Status {
    pub fn new(code: i32, message: impl Into<String>) -> Status {
        Status {
            code,
            message: message.into(),
        }
    }
}

pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Bytes, Status>> + Send>>;

/// Serves the requests the peer sends: `(service, method, payload)` to a reply's payload.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, service: String, method: String, payload: Bytes) -> HandlerFuture;
}

/// Decodes a request's payload as `T`, or the status a handler answers with.
pub fn decode<T: prost::Message + Default>(payload: &[u8]) -> Result<T, Status> {
    T::decode(payload).map_err(|e| Status::new(code::INVALID_ARGUMENT, format!("bad request: {e}")))
}

/// One end of an NRI connection. Cloning shares it.
#[derive(Clone)]
pub struct Endpoint {
    shared: Arc<Shared>,
}

struct Shared {
    role: Role,
    writes: mpsc::Sender<Bytes>,
    pending: Mutex<HashMap<u32, oneshot::Sender<ttrpc::Response>>>,
    next_stream: AtomicU32,
    closed_tx: watch::Sender<bool>,
    /// Why the connection closed, once it has.
    reason: Mutex<Option<String>>,
}

impl Endpoint {
    /// Starts both directions on `stream`. Requests from the peer go to `handler`.
    pub fn start(stream: UnixStream, role: Role, handler: Arc<dyn Handler>) -> Endpoint {
        let (reader, writer) = stream.into_split();
        let (writes, queue) = mpsc::channel(WRITE_QUEUE);
        let (closed_tx, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            role,
            writes,
            pending: Mutex::new(HashMap::new()),
            // ttrpc clients use odd stream ids.
            next_stream: AtomicU32::new(1),
            closed_tx,
            reason: Mutex::new(None),
        });
        let endpoint = Endpoint { shared };
        tokio::spawn(endpoint.clone().write_loop(writer, queue));
        tokio::spawn(endpoint.clone().read_loop(reader, handler));
        endpoint
    }

    /// Calls `service.method` on the peer and waits at most `timeout` for its reply.
    pub async fn call(
        &self,
        service: &str,
        method: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        if self.is_closed() {
            return Err(CallError::Closed);
        }
        let stream_id = self.shared.next_stream.fetch_add(2, Ordering::Relaxed);
        let request = ttrpc::Request {
            service: service.to_string(),
            method: method.to_string(),
            payload: payload.into(),
            timeout_nano: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
            metadata: Vec::new(),
        };
        let (tx, rx) = oneshot::channel();
        self.pending().insert(stream_id, tx);
        let sent = self
            .send(
                self.shared.role.calls_on(),
                Message {
                    stream_id,
                    kind: Kind::Request,
                    flags: 0,
                    payload: request.encode_to_vec().into(),
                },
            )
            .await;
        let reply = match sent {
            Err(e) => Err(e),
            Ok(()) => match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(_)) => Err(CallError::Closed),
                Err(_) => Err(CallError::Timeout(timeout)),
            },
        };
        self.pending().remove(&stream_id);
        let reply = reply?;
        match reply.status {
            Some(s) if s.code != code::OK => Err(CallError::Status {
                code: s.code,
                message: s.message,
            }),
            _ => Ok(reply.payload),
        }
    }

    /// [`call`](Self::call) with a message, decoding the reply as `R`.
    pub async fn call_message<R: prost::Message + Default>(
        &self,
        service: &str,
        method: &str,
        request: &impl prost::Message,
        timeout: Duration,
    ) -> Result<R, CallError> {
        let reply = self
            .call(service, method, request.encode_to_vec(), timeout)
            .await?;
        R::decode(reply).map_err(|e| CallError::Decode(e.to_string()))
    }

    /// Closes the connection: pending calls fail, and the socket is shut.
    pub fn close(&self, reason: &str) {
        {
            let mut r = self.shared.reason.lock().unwrap_or_else(|e| e.into_inner());
            if r.is_none() {
                *r = Some(reason.to_string());
            }
        }
        self.shared.closed_tx.send_replace(true);
        self.pending().clear();
    }

    pub fn is_closed(&self) -> bool {
        *self.shared.closed_tx.borrow()
    }

    /// Why it closed, once it has.
    pub fn close_reason(&self) -> Option<String> {
        self.shared
            .reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Resolves once the connection has closed.
    pub async fn closed(&self) {
        until_closed(&mut self.shared.closed_tx.subscribe()).await;
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u32, oneshot::Sender<ttrpc::Response>>> {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    async fn send(&self, conn: u32, message: Message) -> Result<(), CallError> {
        let mut inner = BytesMut::new();
        ttrpc::encode(&message, &mut inner).map_err(|e| CallError::Decode(e.to_string()))?;
        let mut framed = BytesMut::new();
        mux::encode(conn, &inner, &mut framed);
        self.shared
            .writes
            .send(framed.freeze())
            .await
            .map_err(|_| CallError::Closed)
    }

    async fn write_loop(
        self,
        mut writer: tokio::net::unix::OwnedWriteHalf,
        mut queue: mpsc::Receiver<Bytes>,
    ) {
        let mut closed = self.shared.closed_tx.subscribe();
        loop {
            tokio::select! {
                next = queue.recv() => match next {
                    Some(bytes) => {
                        if let Err(e) = writer.write_all(&bytes).await {
                            self.close(&format!("writing: {e}"));
                            break;
                        }
                    }
                    None => break,
                },
                _ = until_closed(&mut closed) => break,
            }
        }
        let _ = writer.shutdown().await;
    }

    async fn read_loop(
        self,
        mut reader: tokio::net::unix::OwnedReadHalf,
        handler: Arc<dyn Handler>,
    ) {
        let mut closed = self.shared.closed_tx.subscribe();
        let mut frames = mux::Decoder::default();
        let mut replies = ttrpc::Decoder::default();
        let mut requests = ttrpc::Decoder::default();
        let serving = Arc::new(Semaphore::new(MAX_CONCURRENT_SERVED));
        let mut buf = vec![0u8; READ_CHUNK];
        let reason = loop {
            let n = tokio::select! {
                r = reader.read(&mut buf) => match r {
                    Ok(0) => break "the peer closed the connection".to_string(),
                    Ok(n) => n,
                    Err(e) => break format!("reading: {e}"),
                },
                _ = until_closed(&mut closed) => return,
            };
            frames.extend(&buf[..n]);
            if let Err(e) = self.drain(&mut frames, &mut replies, &mut requests, &handler, &serving)
            {
                break e;
            }
        };
        self.close(&reason);
    }

    /// Handles every whole frame read so far; an error is a protocol error that ends the
    /// connection.
    fn drain(
        &self,
        frames: &mut mux::Decoder,
        replies: &mut ttrpc::Decoder,
        requests: &mut ttrpc::Decoder,
        handler: &Arc<dyn Handler>,
        serving: &Arc<Semaphore>,
    ) -> Result<(), String> {
        while let Some(frame) = frames.next_frame().map_err(|e| e.to_string())? {
            if frame.conn == self.shared.role.calls_on() {
                replies.extend(&frame.payload);
                while let Some(m) = replies.next_message().map_err(|e| e.to_string())? {
                    self.on_reply(m)?;
                }
            } else if frame.conn == self.shared.role.serves_on() {
                requests.extend(&frame.payload);
                while let Some(m) = requests.next_message().map_err(|e| e.to_string())? {
                    self.on_request(m, handler, serving)?;
                }
            }
            // Frames for a connection nobody opened are dropped, as NRI's mux does.
        }
        Ok(())
    }

    fn on_reply(&self, m: Message) -> Result<(), String> {
        if m.kind != Kind::Response {
            return Err(format!("unexpected {:?} on the calling connection", m.kind));
        }
        let reply = ttrpc::Response::decode(m.payload).map_err(|e| format!("bad response: {e}"))?;
        // A reply to a call that timed out, or to none, is dropped.
        if let Some(tx) = self.pending().remove(&m.stream_id) {
            let _ = tx.send(reply);
        }
        Ok(())
    }

    fn on_request(
        &self,
        m: Message,
        handler: &Arc<dyn Handler>,
        serving: &Arc<Semaphore>,
    ) -> Result<(), String> {
        if m.kind != Kind::Request {
            return Err(format!("unexpected {:?} on the serving connection", m.kind));
        }
        let stream_id = m.stream_id;
        let request = ttrpc::Request::decode(m.payload).map_err(|e| format!("bad request: {e}"))?;
        let this = self.clone();
        let Ok(permit) = serving.clone().try_acquire_owned() else {
            tokio::spawn(async move {
                let status = Status::new(
                    code::RESOURCE_EXHAUSTED,
                    format!("more than {MAX_CONCURRENT_SERVED} requests at once"),
                );
                this.reply(stream_id, Err(status)).await;
            });
            return Ok(());
        };
        let fut = handler.handle(request.service, request.method, request.payload);
        tokio::spawn(async move {
            let result = fut.await;
            drop(permit);
            this.reply(stream_id, result).await;
        });
        Ok(())
    }

    async fn reply(&self, stream_id: u32, result: Result<Bytes, Status>) {
        let response = match result {
            Ok(payload) => ttrpc::Response {
                status: None,
                payload,
            },
            Err(s) => ttrpc::Response {
                status: Some(ttrpc::Status {
                    code: s.code,
                    message: s.message,
                    details: Vec::new(),
                }),
                payload: Bytes::new(),
            },
        };
        let message = Message {
            stream_id,
            kind: Kind::Response,
            flags: 0,
            payload: response.encode_to_vec().into(),
        };
        if self
            .send(self.shared.role.serves_on(), message)
            .await
            .is_err()
        {
            // Closed: the peer will not read it.
        }
    }
}

/// Resolves once `closed` turns true (its guard is not held across an await).
async fn until_closed(closed: &mut watch::Receiver<bool>) {
    let _ = closed.wait_for(|c| *c).await;
}

#[cfg(test)]
mod tests;
