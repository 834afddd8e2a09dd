//! The daemon's side of the shim protocol: one connection per request. Handlers reach shims
//! through the [`Shims`] trait, so their logic can be tested against a fake.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crishim_proto::shim::{paths, Request, Response, MAX_LINE};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// How long a plain shim request may take.
pub const SHIM_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("shim at {0} is not reachable: {1}")]
    Unreachable(PathBuf, std::io::Error),
    #[error("shim at {0} did not answer within {1:?}")]
    Timeout(PathBuf, Duration),
    #[error("shim at {0} sent a malformed answer: {1}")]
    Protocol(PathBuf, String),
}

/// A shim's `Watch` stream: the exits it had, `Ok`, then each exit as it happens. It ends when
/// the shim does.
pub type Watch = std::pin::Pin<Box<dyn futures::Stream<Item = Response> + Send>>;

/// Every pod's shim, by pod id.
#[tonic::async_trait]
pub trait Shims: Send + Sync {
    /// One request, one answer.
    async fn call(
        &self,
        pod_id: &str,
        req: &Request,
        timeout: Duration,
    ) -> Result<Response, ShimError>;

    /// Follow the pod's container exits.
    async fn watch(&self, pod_id: &str) -> Result<Watch, ShimError>;

    /// A streaming request (`ExecStream`, `Attach`): the connection that carries its frames, or
    /// the shim's refusal.
    async fn open_stream(
        &self,
        pod_id: &str,
        req: &Request,
    ) -> Result<Result<UnixStream, Response>, ShimError>;
}

/// The real shims: one unix socket in each pod's state directory under `pods_dir`.
pub struct SocketShims {
    pods_dir: PathBuf,
}

impl SocketShims {
    pub fn new(pods_dir: PathBuf) -> Self {
        SocketShims { pods_dir }
    }

    fn client(&self, pod_id: &str) -> ShimClient {
        ShimClient::new(&self.pods_dir.join(pod_id))
    }
}

#[tonic::async_trait]
impl Shims for SocketShims {
    async fn call(
        &self,
        pod_id: &str,
        req: &Request,
        timeout: Duration,
    ) -> Result<Response, ShimError> {
        self.client(pod_id).call(req, timeout).await
    }

    async fn watch(&self, pod_id: &str) -> Result<Watch, ShimError> {
        let client = self.client(pod_id);
        let conn = BufReader::new(client.send(&Request::Watch).await?);
        // Each line until EOF or a broken one; lines that are not answers are skipped.
        let lines = futures::stream::unfold(conn, |mut conn| async move {
            loop {
                match read_line(&mut conn).await {
                    Ok(Some(line)) => {
                        if let Ok(r) = serde_json::from_slice::<Response>(&line) {
                            return Some((r, conn));
                        }
                    }
                    _ => return None,
                }
            }
        });
        Ok(Box::pin(lines))
    }

    async fn open_stream(
        &self,
        pod_id: &str,
        req: &Request,
    ) -> Result<Result<UnixStream, Response>, ShimError> {
        self.client(pod_id).open_stream(req).await
    }
}

#[derive(Debug, Clone)]
pub struct ShimClient {
    dir: PathBuf,
    socket: PathBuf,
}

impl ShimClient {
    /// The shim of the pod whose state directory is `dir`.
    pub fn new(dir: &Path) -> Self {
        ShimClient {
            dir: dir.to_path_buf(),
            socket: dir.join(paths::SOCKET),
        }
    }

    pub async fn call(&self, req: &Request, timeout: Duration) -> Result<Response, ShimError> {
        let fut = async {
            let conn = self.send(req).await?;
            let answer = read_line(&mut BufReader::new(conn))
                .await
                .map_err(|e| ShimError::Unreachable(self.socket.clone(), e))?
                .unwrap_or_default();
            serde_json::from_slice(&answer).map_err(|e| {
                let shown = String::from_utf8_lossy(&answer[..answer.len().min(512)]);
                ShimError::Protocol(self.socket.clone(), format!("{e}: {shown:?}"))
            })
        };
        tokio::time::timeout(timeout, fut)
            .await
            .map_err(|_| ShimError::Timeout(self.socket.clone(), timeout))?
    }

    /// Connect and send `req` as one line.
    async fn send(&self, req: &Request) -> Result<UnixStream, ShimError> {
        let unreachable = |e| ShimError::Unreachable(self.socket.clone(), e);
        let (_dirfd, short) =
            paths::short_socket_path(&self.dir, paths::SOCKET).map_err(unreachable)?;
        let mut conn = UnixStream::connect(&short).await.map_err(unreachable)?;
        let mut line = serde_json::to_vec(req)
            .map_err(|e| ShimError::Protocol(self.socket.clone(), e.to_string()))?;
        line.push(b'\n');
        conn.write_all(&line).await.map_err(unreachable)?;
        Ok(conn)
    }

    /// Send a streaming request (`ExecStream`, `Attach`); after the shim's `Ok` line the
    /// connection carries frames. A refusal comes back as the shim's answer.
    pub async fn open_stream(
        &self,
        req: &Request,
    ) -> Result<Result<UnixStream, Response>, ShimError> {
        let unreachable = |e| ShimError::Unreachable(self.socket.clone(), e);
        let mut conn = self.send(req).await?;
        // Byte by byte up to the newline: what follows are frames, not to be buffered away here.
        let mut answer = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            use tokio::io::AsyncReadExt;
            let n = tokio::time::timeout(STREAM_SETUP_TIMEOUT, conn.read(&mut byte))
                .await
                .map_err(|_| ShimError::Timeout(self.socket.clone(), STREAM_SETUP_TIMEOUT))?
                .map_err(unreachable)?;
            if n == 0 || byte[0] == b'\n' {
                break;
            }
            // The answer before the frames is one small line.
            if answer.len() >= 64 << 10 {
                return Err(ShimError::Protocol(
                    self.socket.clone(),
                    "the answer line is too long".into(),
                ));
            }
            answer.push(byte[0]);
        }
        match serde_json::from_slice::<Response>(&answer) {
            Ok(Response::Ok) => Ok(Ok(conn)),
            Ok(other) => Ok(Err(other)),
            Err(e) => Err(ShimError::Protocol(
                self.socket.clone(),
                format!("{e}: {:?}", String::from_utf8_lossy(&answer)),
            )),
        }
    }
}

/// One line of the shim protocol, without its newline; `None` at EOF before any byte. A line longer
/// than [`MAX_LINE`] is an error: a peer cannot make us buffer without bound.
pub async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let n = r
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() > MAX_LINE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a shim protocol line longer than {MAX_LINE} bytes"),
        ));
    }
    Ok(Some(line))
}

/// How long a shim may take to start an exec'd process or attach.
const STREAM_SETUP_TIMEOUT: Duration = Duration::from_secs(30);
