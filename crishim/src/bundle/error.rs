//! What `crishim bundle` refuses, each with the words a user needs to fix it. I/O causes are
//! sources, not part of the message: the command line prints the whole chain on one line.

use std::path::PathBuf;

use crishim_proto::shim::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("invalid container id {0:?}: use letters, digits, '_', '.' and '-', starting with a letter or digit")]
    InvalidId(String),
    #[error("bundle directory {path}")]
    NoBundle {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bundle directory {0}: not a directory")]
    NotADirectory(PathBuf),
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("rootfs {path} of the bundle: {message}")]
    Rootfs { path: PathBuf, message: String },
    #[error("container {id} already exists (its state is in {dir}; `crishim bundle delete {id}` removes it)")]
    AlreadyExists { id: String, dir: PathBuf },
    #[error("container {0} does not exist")]
    NotFound(String),
    #[error("container {id} is {status}: {hint}")]
    WrongStatus {
        id: String,
        status: &'static str,
        hint: &'static str,
    },
    #[error("unknown signal {0:?}: use a name like TERM or SIGKILL, or a number")]
    UnknownSignal(String),
    #[error("{0} already exists; not overwriting it")]
    SpecExists(PathBuf),
    #[error("shim binary {path}")]
    ShimBinary {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the shim failed: {0}")]
    ShimFailed(String),
    /// The shim's own error answer.
    #[error("{message}")]
    Shim { kind: ErrorKind, message: String },
    #[error(transparent)]
    Unreachable(#[from] crishim_cri::shim_client::ShimError),
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl BundleError {
    pub(super) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BundleError::Io {
            what,
            path: path.into(),
            source,
        }
    }
}
