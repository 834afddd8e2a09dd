//! The CRI streaming server: `Exec`, `Attach` and `PortForward` return one-time URLs; the client
//! (or the kubelet for it) connects there and upgrades to SPDY/3.1 or WebSocket. The runtime
//! behind it is a [`Backend`].
//!
//! - [`server`]: HTTP, one-time tokens, protocol negotiation;
//! - [`remotecommand`] and [`portforward`]: the Kubernetes protocols on top of
//! - [`spdy`] (our own SPDY/3.1 framing) and WebSocket (tokio-tungstenite);
//! - [`client`]: the client side, for tests and tools.

pub mod backend;
pub mod client;
pub mod portforward;
pub mod remotecommand;
pub mod server;
pub mod spdy;
pub mod status;
mod tls;

pub use backend::{Backend, Outcome, Stdio, TermSize};
pub use server::{Config, Server};

#[derive(Debug, thiserror::Error)]
pub enum StreamingError {
    #[error("binding the streaming server to {0}: {1}")]
    Bind(std::net::SocketAddr, std::io::Error),
    #[error("streaming TLS: {0}")]
    Tls(String),
    #[error("too many streaming requests in flight; try again later")]
    TooManyInFlight,
    #[error("no random bytes for a streaming token: {0}")]
    Random(std::io::Error),
}
