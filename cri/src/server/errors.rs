//! The server's one error type, and the one place it becomes a gRPC status.
//!
//! Handlers return [`Error`]: a kind per gRPC code for what they decide themselves, or an area's
//! own error (images, store, shims, spec, GPUs, CNI, streaming) through `#[from]`. [`logged`],
//! where a request's result leaves the server, turns it into a `tonic::Status` with
//! `From<Error> for Status`, the only place a status is built. The code says what the client can
//! do about it; the message is the error's own, with its context.
//!
//! [`logged`]: super::instrumented::logged

use crishim_images::{ErrorKind as ImageErrorKind, ImageError};
use crishim_proto::shim::{ErrorKind as ShimErrorKind, Response};
use crishim_state::store::StoreError;
use tonic::{Code, Status};

use crate::bounds::OverLimit;
use crate::shim_client::ShimError;
use crishim_cni::CniError;
use crishim_gpu::GpuError;
use crishim_spec::SpecError;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong; retrying it unchanged fails again.
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    /// The request is fine but the pod, container or node is not in a state to serve it.
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    ResourceExhausted(String),
    /// Retryable: a shim or server that is not there right now.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    Unimplemented(String),
    /// A failure of the node (a plugin that failed for its own reasons).
    #[error("{0}")]
    Unknown(String),
    #[error("{0}")]
    Internal(String),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Shim(#[from] ShimError),
    /// A shim's error answer, with the kind it gave.
    #[error("{message}")]
    ShimAnswer {
        kind: ShimErrorKind,
        message: String,
    },
    /// GPUs are asked for only at `CreateContainer`.
    #[error("CreateContainer: {0}")]
    Gpu(#[from] GpuError),
    /// A spec that cannot be built for `rpc`'s request.
    #[error("{rpc}: {source}")]
    Spec {
        rpc: &'static str,
        source: SpecError,
    },
    /// A CNI plugin's own failure while `what` (setting up or tearing down the pod network),
    /// which the kubelet reports and retries.
    #[error("{what} the pod network: {source}")]
    Cni {
        what: &'static str,
        source: CniError,
    },
    #[error(transparent)]
    OverLimit(#[from] OverLimit),
}

impl Error {
    pub fn invalid_argument(m: impl Into<String>) -> Self {
        Error::InvalidArgument(m.into())
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Error::NotFound(m.into())
    }
    pub fn already_exists(m: impl Into<String>) -> Self {
        Error::AlreadyExists(m.into())
    }
    pub fn failed_precondition(m: impl Into<String>) -> Self {
        Error::FailedPrecondition(m.into())
    }
    pub fn resource_exhausted(m: impl Into<String>) -> Self {
        Error::ResourceExhausted(m.into())
    }
    pub fn unavailable(m: impl Into<String>) -> Self {
        Error::Unavailable(m.into())
    }
    pub fn deadline_exceeded(m: impl Into<String>) -> Self {
        Error::DeadlineExceeded(m.into())
    }
    pub fn unimplemented(m: impl Into<String>) -> Self {
        Error::Unimplemented(m.into())
    }
    pub fn unknown(m: impl Into<String>) -> Self {
        Error::Unknown(m.into())
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Error::Internal(m.into())
    }

    /// The gRPC code: what the client can do about it.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) | Error::OverLimit(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Unavailable(_) => Code::Unavailable,
            Error::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Error::Unimplemented(_) => Code::Unimplemented,
            Error::Unknown(_) | Error::Cni { .. } => Code::Unknown,
            Error::Internal(_) => Code::Internal,
            Error::Image(e) => match e.kind() {
                ImageErrorKind::InvalidArgument | ImageErrorKind::BadContent => {
                    Code::InvalidArgument
                }
                ImageErrorKind::NotFound => Code::NotFound,
                ImageErrorKind::Unauthenticated => Code::Unauthenticated,
                ImageErrorKind::Unavailable => Code::Unavailable,
                ImageErrorKind::DataLoss => Code::DataLoss,
                ImageErrorKind::FailedPrecondition => Code::FailedPrecondition,
                ImageErrorKind::DeadlineExceeded => Code::DeadlineExceeded,
                ImageErrorKind::ResourceExhausted => Code::ResourceExhausted,
                ImageErrorKind::Internal => Code::Internal,
            },
            Error::Store(e) => match e {
                StoreError::EmptyId { .. } | StoreError::Ambiguous { .. } => Code::InvalidArgument,
                StoreError::NotFound { .. } => Code::NotFound,
                StoreError::NameReserved { .. } => Code::AlreadyExists,
                StoreError::Io { .. } => Code::Internal,
            },
            // A shim that cannot be reached is unavailable (the kubelet retries); one that is
            // slow, late.
            Error::Shim(ShimError::Timeout(..)) => Code::DeadlineExceeded,
            Error::Shim(_) => Code::Unavailable,
            Error::ShimAnswer { kind, .. } => match kind {
                ShimErrorKind::NotFound => Code::NotFound,
                ShimErrorKind::AlreadyExists => Code::AlreadyExists,
                ShimErrorKind::FailedPrecondition => Code::FailedPrecondition,
                ShimErrorKind::InvalidArgument => Code::InvalidArgument,
                ShimErrorKind::Unavailable => Code::Unavailable,
                ShimErrorKind::Internal => Code::Internal,
            },
            Error::Gpu(e) => match e {
                GpuError::Invalid(_) => Code::InvalidArgument,
                GpuError::Unavailable(_) => Code::FailedPrecondition,
                GpuError::Internal(_) | GpuError::Io { .. } => Code::Internal,
            },
            Error::Spec { source, .. } => match source {
                SpecError::Invalid(_) => Code::InvalidArgument,
                SpecError::Internal(_) => Code::Internal,
            },
        }
    }

    /// The message the client gets.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

/// The one place a request's error becomes a gRPC status.
impl From<Error> for Status {
    fn from(e: Error) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

/// A spec that cannot be built for `rpc`'s request.
pub fn from_spec_error(rpc: &'static str, e: SpecError) -> Error {
    Error::Spec { rpc, source: e }
}

/// A fresh record id for an RPC: a failure is `Internal`.
pub fn new_id() -> Result<String, Error> {
    crishim_state::records::new_id().map_err(|e| Error::internal(format!("generating an id: {e}")))
}

/// A shim's error answer.
pub fn from_shim_error(kind: ShimErrorKind, message: String) -> Error {
    Error::ShimAnswer { kind, message }
}

/// Any shim answer other than the one expected.
pub fn unexpected(resp: Response) -> Error {
    match resp {
        Response::Error { kind, message } => from_shim_error(kind, message),
        other => Error::internal(format!("unexpected shim answer: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_gets_the_code_a_client_can_act_on() {
        let spec = from_spec_error("CreateContainer", SpecError::Invalid("bad".into()));
        assert_eq!(spec.code(), Code::InvalidArgument);
        assert_eq!(spec.message(), "CreateContainer: bad");
        let gpu = Error::from(GpuError::Unavailable("no driver".into()));
        assert_eq!(gpu.code(), Code::FailedPrecondition);
        let late: Error = ShimError::Timeout("/s".into(), std::time::Duration::from_secs(1)).into();
        assert_eq!(late.code(), Code::DeadlineExceeded);
        let gone: Error = ShimError::Protocol("/s".into(), "x".into()).into();
        assert_eq!(gone.code(), Code::Unavailable);
        let answer = Response::error(ShimErrorKind::Unavailable, "dbus");
        assert_eq!(unexpected(answer).code(), Code::Unavailable);
        assert_eq!(unexpected(Response::Ok).code(), Code::Internal);
        let taken = Error::from(StoreError::NameReserved {
            what: "pod sandbox",
            name: "a_b_c_0".into(),
            holder: "f00".into(),
        });
        assert_eq!(taken.code(), Code::AlreadyExists);
        assert_eq!(
            taken.message(),
            "pod sandbox name \"a_b_c_0\" is reserved by pod sandbox f00"
        );
        let missing = Error::from(StoreError::NotFound {
            what: "container",
            id: "11d7".into(),
        });
        assert_eq!(missing.code(), Code::NotFound);
    }
}
