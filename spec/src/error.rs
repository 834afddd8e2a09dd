//! What building a spec can fail with.

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Bad input from the CRI caller; maps to `InvalidArgument`.
    #[error("{0}")]
    Invalid(String),
    /// A local failure reading the rootfs etc.; maps to `Internal`.
    #[error("{0}")]
    Internal(String),
}

impl SpecError {
    pub(crate) fn internal(what: impl std::fmt::Display, err: impl std::fmt::Display) -> Self {
        SpecError::Internal(format!("{what}: {err}"))
    }
}
