//! The crate's error; its own module so that every other module can use it without importing
//! the crate root, which imports them all.

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// A bad request; `InvalidArgument`.
    #[error("{0}")]
    Invalid(String),
    /// The node cannot serve it (no driver, no interceptor); `FailedPrecondition`.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl GpuError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        GpuError::Io {
            what: what.into(),
            source,
        }
    }
}
