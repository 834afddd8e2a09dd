//! What the streaming server asks of the runtime: run a process, attach to a container, or open a
//! connection inside a pod. Stdio travels over channels, whichever protocol carries it.

use bytes::Bytes;
use crishim_proto::cri;
use futures::future::BoxFuture;
use serde::Deserialize;
use tokio::sync::{mpsc, watch};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct TermSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// The client's side of a process's stdio. A `None` stream was not requested; `stdin` ends at the
/// client's EOF; `gone` turns true when the client disconnects.
pub struct Stdio {
    pub stdin: Option<mpsc::Receiver<Bytes>>,
    pub stdout: Option<mpsc::Sender<Bytes>>,
    pub stderr: Option<mpsc::Sender<Bytes>>,
    pub resize: Option<mpsc::Receiver<TermSize>>,
    pub tty: bool,
    pub gone: watch::Receiver<bool>,
}

/// How a remote command ended: an exit code (exec), or done (attach).
pub type Outcome = Result<Option<i32>, String>;

pub trait Backend: Send + Sync + 'static {
    /// Run `req.cmd` in the container with `io`; the exit code.
    fn exec(&self, req: cri::ExecRequest, io: Stdio) -> BoxFuture<'static, Outcome>;
    /// Connect `io` to the container's stdio until it exits or the client leaves.
    fn attach(&self, req: cri::AttachRequest, io: Stdio) -> BoxFuture<'static, Outcome>;
    /// A TCP connection to `localhost:port` in the pod's network namespace.
    fn port_forward(
        &self,
        pod_sandbox_id: String,
        port: u16,
    ) -> BoxFuture<'static, std::io::Result<tokio::net::TcpStream>>;
}
