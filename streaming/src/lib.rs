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
mod error;
pub mod portforward;
pub mod remotecommand;
pub mod server;
pub mod spdy;
pub mod status;
mod tls;

pub use backend::{Backend, Outcome, Stdio, TermSize};
pub use error::StreamingError;
pub use server::{Config, Server};
