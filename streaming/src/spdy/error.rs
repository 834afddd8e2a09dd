//! What a SPDY connection can fail with.

#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("SPDY protocol error: {0}")]
    Protocol(String),
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the connection is closed")]
    Closed,
}
