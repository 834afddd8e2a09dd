//! Every mapping of an error onto a gRPC status, in one place: the code says what the client can
//! do about it, and the message is the error's own, with its context.

use crishim_images::{ErrorKind as ImageErrorKind, ImageError};
use crishim_proto::shim::{ErrorKind as ShimErrorKind, Response};
use crishim_state::store::StoreError;
use tonic::{Code, Status};

use crate::shim_client::ShimError;
use crishim_gpu::GpuError;
use crishim_spec::SpecError;

pub fn from_image_error(e: ImageError) -> Status {
    let code = match e.kind() {
        ImageErrorKind::InvalidArgument | ImageErrorKind::BadContent => Code::InvalidArgument,
        ImageErrorKind::NotFound => Code::NotFound,
        ImageErrorKind::Unauthenticated => Code::Unauthenticated,
        ImageErrorKind::Unavailable => Code::Unavailable,
        ImageErrorKind::DataLoss => Code::DataLoss,
        ImageErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ImageErrorKind::DeadlineExceeded => Code::DeadlineExceeded,
        ImageErrorKind::ResourceExhausted => Code::ResourceExhausted,
        ImageErrorKind::Internal => Code::Internal,
    };
    Status::new(code, e.to_string())
}

/// A spec that cannot be built for `rpc`'s request.
pub fn from_spec_error(rpc: &str, e: SpecError) -> Status {
    match e {
        SpecError::Invalid(m) => Status::invalid_argument(format!("{rpc}: {m}")),
        SpecError::Internal(m) => Status::internal(format!("{rpc}: {m}")),
    }
}

/// GPUs are asked for only at `CreateContainer`.
pub fn from_gpu_error(e: GpuError) -> Status {
    let code = match e {
        GpuError::Invalid(_) => Code::InvalidArgument,
        GpuError::Unavailable(_) => Code::FailedPrecondition,
        GpuError::Internal(_) | GpuError::Io { .. } => Code::Internal,
    };
    Status::new(code, format!("CreateContainer: {e}"))
}

/// A shim that cannot be reached is unavailable (the kubelet retries); one that is slow, late.
impl From<ShimError> for Status {
    fn from(e: ShimError) -> Status {
        match e {
            ShimError::Timeout(..) => Status::deadline_exceeded(e.to_string()),
            _ => Status::unavailable(e.to_string()),
        }
    }
}

/// A lookup, a name reservation or a record write of the store. A function, not `From`: neither
/// type is this crate's.
pub fn from_store_error(e: StoreError) -> Status {
    let code = match e {
        StoreError::EmptyId { .. } | StoreError::Ambiguous { .. } => Code::InvalidArgument,
        StoreError::NotFound { .. } => Code::NotFound,
        StoreError::NameReserved { .. } => Code::AlreadyExists,
        StoreError::Io { .. } => Code::Internal,
    };
    Status::new(code, e.to_string())
}

/// A fresh record id for an RPC: a failure is `Internal`.
pub fn new_id_status() -> Result<String, Status> {
    crishim_state::records::new_id().map_err(|e| Status::internal(format!("generating an id: {e}")))
}

/// A shim's error answer.
pub fn from_shim_error(kind: ShimErrorKind, message: String) -> Status {
    let code = match kind {
        ShimErrorKind::NotFound => Code::NotFound,
        ShimErrorKind::AlreadyExists => Code::AlreadyExists,
        ShimErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ShimErrorKind::InvalidArgument => Code::InvalidArgument,
        ShimErrorKind::Unavailable => Code::Unavailable,
        ShimErrorKind::Internal => Code::Internal,
    };
    Status::new(code, message)
}

/// Any shim answer other than the one expected.
pub fn unexpected(resp: Response) -> Status {
    match resp {
        Response::Error { kind, message } => from_shim_error(kind, message),
        other => Status::internal(format!("unexpected shim answer: {other:?}")),
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
        let gpu = from_gpu_error(GpuError::Unavailable("no driver".into()));
        assert_eq!(gpu.code(), Code::FailedPrecondition);
        let late: Status =
            ShimError::Timeout("/s".into(), std::time::Duration::from_secs(1)).into();
        assert_eq!(late.code(), Code::DeadlineExceeded);
        let gone: Status = ShimError::Protocol("/s".into(), "x".into()).into();
        assert_eq!(gone.code(), Code::Unavailable);
        let answer = Response::error(ShimErrorKind::Unavailable, "dbus");
        assert_eq!(unexpected(answer).code(), Code::Unavailable);
        assert_eq!(unexpected(Response::Ok).code(), Code::Internal);
        let taken = from_store_error(StoreError::NameReserved {
            what: "pod sandbox",
            name: "a_b_c_0".into(),
            holder: "f00".into(),
        });
        assert_eq!(taken.code(), Code::AlreadyExists);
        assert_eq!(
            taken.message(),
            "pod sandbox name \"a_b_c_0\" is reserved by pod sandbox f00"
        );
        let missing = from_store_error(StoreError::NotFound {
            what: "container",
            id: "11d7".into(),
        });
        assert_eq!(missing.code(), Code::NotFound);
    }
}
