//! What starting the streaming server or making a URL can fail with.

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
