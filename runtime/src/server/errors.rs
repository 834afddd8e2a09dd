//! Mapping of image errors onto gRPC status codes, with the error's full message.

use crishim_images::{ErrorKind, ImageError};
use tonic::{Code, Status};

pub fn from_image_error(e: ImageError) -> Status {
    let code = match e.kind() {
        ErrorKind::InvalidArgument | ErrorKind::BadContent => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::DataLoss => Code::DataLoss,
        ErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ErrorKind::ResourceExhausted => Code::ResourceExhausted,
        ErrorKind::Internal => Code::Internal,
    };
    Status::new(code, e.to_string())
}
