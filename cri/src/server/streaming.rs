//! The runtime behind the streaming server: exec'd processes and attached stdio go through the
//! pod's shim (which owns the containers' stdio), port forwards connect from inside the pod's
//! network namespace.

use super::errors::Error;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use crishim_proto::cri;
use crishim_proto::shim::{frames, Request, Response};
use crishim_state::records::ContainerRecord;
use crishim_streaming::{Backend, Outcome, Stdio};
use futures::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use super::runtime_service::{Inner, RuntimeService};

pub(super) struct StreamingBackend {
    inner: Weak<Inner>,
}

impl RuntimeService {
    /// Start the streaming server the `Exec`, `Attach` and `PortForward` URLs point at.
    pub async fn start_streaming(&self) -> anyhow::Result<()> {
        let config = self
            .inner
            .config
            .streaming_server()
            .map_err(anyhow::Error::msg)?;
        let backend = Arc::new(StreamingBackend {
            inner: Arc::downgrade(&self.inner),
        });
        let server = crishim_streaming::Server::start(config, backend).await?;
        tracing::info!(url = %server.base_url(), "streaming server listening");
        let _ = self.inner.streaming.set(server);
        Ok(())
    }
}

impl Inner {
    pub(super) fn streaming(&self) -> Result<&crishim_streaming::Server, Error> {
        self.streaming
            .get()
            .ok_or_else(|| Error::unavailable("the streaming server is not running"))
    }
}

impl StreamingBackend {
    #[cfg(test)]
    pub(super) fn for_test(inner: &Arc<Inner>) -> StreamingBackend {
        StreamingBackend {
            inner: Arc::downgrade(inner),
        }
    }

    fn inner(&self) -> Result<Arc<Inner>, String> {
        self.inner
            .upgrade()
            .ok_or_else(|| "the runtime is shutting down".to_string())
    }
}

impl Backend for StreamingBackend {
    fn exec(&self, req: cri::ExecRequest, io: Stdio) -> BoxFuture<'static, Outcome> {
        let inner = self.inner();
        Box::pin(async move {
            let open = |c: &ContainerRecord| Request::ExecStream {
                id: c.id.clone(),
                args: req.cmd,
                tty: req.tty,
                stdin: req.stdin,
            };
            relay(connect(inner?, &req.container_id, open).await?, io).await
        })
    }

    fn attach(&self, req: cri::AttachRequest, io: Stdio) -> BoxFuture<'static, Outcome> {
        let inner = self.inner();
        Box::pin(async move {
            let open = |c: &ContainerRecord| Request::Attach {
                id: c.id.clone(),
                stdin: req.stdin,
                close_stdin: c.config.stdin_once,
            };
            relay(connect(inner?, &req.container_id, open).await?, io)
                .await
                .map(|_| None)
        })
    }

    fn port_forward(
        &self,
        pod_sandbox_id: String,
        port: u16,
    ) -> BoxFuture<'static, std::io::Result<tokio::net::TcpStream>> {
        let inner = self.inner();
        Box::pin(async move {
            let inner = inner.map_err(std::io::Error::other)?;
            let pod = inner
                .store
                .pod(&pod_sandbox_id)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()))?;
            // Never `/proc/<infra pid>/ns/net`: once the pod stops, that pid may be anyone's.
            connect_in_netns(inner.forward_netns(&pod).await?, port).await
        })
    }
}

/// Open the streaming request `open` makes for container `id` on its pod's shim.
async fn connect(
    inner: Arc<Inner>,
    id: &str,
    open: impl FnOnce(&ContainerRecord) -> Request,
) -> Result<UnixStream, String> {
    let c = inner.store.container(id).map_err(|e| e.to_string())?;
    inner
        .pod_ready(&c.pod_id, "streaming")
        .map_err(|s| s.message().to_string())?;
    match inner.shims.open_stream(&c.pod_id, &open(&c)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(Response::Error { message, .. })) => Err(message),
        Ok(Err(other)) => Err(format!("unexpected shim answer: {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

/// The next item of an optional channel; never, once there is none.
async fn next<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// The detach sequence of a TTY session: ctrl-p ctrl-q, as docker's default.
const DETACH_KEYS: [u8; 2] = [0x10, 0x11];

/// Finds the detach sequence in a TTY session's input, across chunk boundaries. A ctrl-p is held
/// back until the next byte shows whether it starts the sequence.
#[derive(Default)]
struct DetachScanner {
    held: bool,
}

impl DetachScanner {
    /// The bytes to forward, and whether the sequence ended the input.
    fn scan(&mut self, data: &[u8]) -> (Vec<u8>, bool) {
        let mut out = Vec::with_capacity(data.len() + 1);
        for &b in data {
            if std::mem::take(&mut self.held) {
                if b == DETACH_KEYS[1] {
                    return (out, true);
                }
                out.push(DETACH_KEYS[0]);
            }
            if b == DETACH_KEYS[0] {
                self.held = true;
            } else {
                out.push(b);
            }
        }
        (out, false)
    }
}

/// How the client's side of a relay ended.
enum ClientEnd {
    Gone,
    Detached,
}

/// Relay between the client's stdio and the shim's frames until the process exits (`Some`
/// code), a TTY client detaches (`None`: the process runs on), or the client leaves (an error; the
/// connection closes, and the shim kills an exec'd process).
async fn relay(conn: UnixStream, io: Stdio) -> Result<Option<i32>, String> {
    let (mut r, mut w) = conn.into_split();
    let Stdio {
        mut stdin,
        stdout,
        stderr,
        mut resize,
        mut gone,
        tty,
    } = io;
    let mut detach = DetachScanner::default();
    let to_shim = async {
        loop {
            tokio::select! {
                data = next(&mut stdin) => match data {
                    Some(b) => {
                        let (b, detached) = match tty {
                            true => detach.scan(&b),
                            false => (b.to_vec(), false),
                        };
                        for chunk in b.chunks(frames::MAX_PAYLOAD) {
                            w.write_all(&frames::encode(frames::STDIN, chunk)).await.ok()?;
                        }
                        if detached {
                            w.write_all(&frames::encode(frames::DETACH, &[])).await.ok()?;
                            return Some(ClientEnd::Detached);
                        }
                    }
                    None => {
                        w.write_all(&frames::encode(frames::STDIN_EOF, &[])).await.ok()?;
                        stdin = None;
                    }
                },
                size = next(&mut resize) => match size {
                    Some(s) => {
                        let mut p = s.width.to_be_bytes().to_vec();
                        p.extend_from_slice(&s.height.to_be_bytes());
                        w.write_all(&frames::encode(frames::RESIZE, &p)).await.ok()?;
                    }
                    None => resize = None,
                },
                changed = gone.changed() => {
                    if changed.is_err() || *gone.borrow() {
                        return Some(ClientEnd::Gone);
                    }
                }
            }
        }
    };
    let from_shim = async {
        loop {
            let mut h = [0u8; frames::HEADER];
            r.read_exact(&mut h)
                .await
                .map_err(|_| "the shim closed the stream before the process exited".to_string())?;
            let (kind, len) = frames::decode_header(h);
            // The shim splits frames to MAX_PAYLOAD; a longer one is not allocated.
            if len > frames::MAX_PAYLOAD {
                return Err(format!("the shim sent a frame of {len} bytes"));
            }
            let mut payload = vec![0u8; len];
            r.read_exact(&mut payload)
                .await
                .map_err(|e| format!("reading from the shim: {e}"))?;
            let out = match kind {
                frames::STDOUT => &stdout,
                frames::STDERR => &stderr,
                frames::EXIT => {
                    let code = payload
                        .get(..4)
                        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                        .unwrap_or(-1);
                    return Ok(Some(code));
                }
                _ => continue,
            };
            if let Some(tx) = out {
                if tx.send(Bytes::from(payload)).await.is_err() {
                    return Err("the client went away".to_string());
                }
            }
        }
    };
    tokio::select! {
        code = from_shim => code,
        end = to_shim => match end {
            Some(ClientEnd::Detached) => Ok(None),
            _ => Err("the client went away".to_string()),
        },
    }
}

/// A TCP connection to `localhost:port` made from inside `netns` (None: the host's). The socket
/// belongs to the namespace it was created in, so only its creation needs the namespace: a
/// short-lived thread of our own enters it (setns changes the calling thread only) and exits.
async fn connect_in_netns(
    netns: Option<std::fs::File>,
    port: u16,
) -> std::io::Result<tokio::net::TcpStream> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("crishim-portfwd".into())
        .spawn(move || {
            let result = (|| -> std::io::Result<std::net::TcpStream> {
                if let Some(f) = &netns {
                    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::from)?;
                }
                let timeout = std::time::Duration::from_secs(10);
                let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
                let s = std::net::TcpStream::connect_timeout(&v4, timeout).or_else(|e| {
                    std::net::TcpStream::connect_timeout(&v6, timeout).map_err(|_| e)
                })?;
                s.set_nonblocking(true)?;
                Ok(s)
            })();
            let _ = tx.send(result);
        })?;
    let s = rx
        .await
        .map_err(|_| std::io::Error::other("the port-forward thread died"))??;
    tokio::net::TcpStream::from_std(s)
}

/// Why a one-time URL could not be made, as a status: too many outstanding is retryable.
pub(super) fn url_status(e: crishim_streaming::StreamingError) -> Error {
    match e {
        crishim_streaming::StreamingError::TooManyInFlight => {
            Error::resource_exhausted(e.to_string())
        }
        other => Error::internal(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::DetachScanner;

    #[test]
    fn the_detach_sequence_is_found_across_chunks_and_held_back() {
        let mut d = DetachScanner::default();
        assert_eq!(d.scan(b"ab\x10"), (b"ab".to_vec(), false));
        assert_eq!(
            d.scan(b"c"),
            (b"\x10c".to_vec(), false),
            "a lone ctrl-p is passed on"
        );
        assert_eq!(d.scan(b"x\x10\x10"), (b"x\x10".to_vec(), false));
        assert_eq!(d.scan(b"\x11rest"), (Vec::new(), true));
    }
}
