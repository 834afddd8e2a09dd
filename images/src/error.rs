//! Typed errors of the image layer. The daemon maps [`ErrorKind`] onto gRPC status codes.

use std::path::PathBuf;

use crishim_sys::shown::shown;

/// What went wrong, coarsely, so callers can choose a status code without parsing messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller's input is malformed (a reference, a digest).
    InvalidArgument,
    /// The image, manifest or blob does not exist.
    NotFound,
    /// The registry refused our credentials, or wanted some we did not have.
    Unauthenticated,
    /// The registry could not be reached or failed.
    Unavailable,
    /// Content did not match its digest.
    DataLoss,
    /// Content from the registry is malformed or hostile (bad manifest, a layer escaping its directory).
    BadContent,
    /// The operation conflicts with current state (an image in use).
    FailedPrecondition,
    /// A pull made no progress for its progress timeout.
    DeadlineExceeded,
    /// A limit was reached: `[images]` size, entry or free-space limits.
    ResourceExhausted,
    /// A local failure (disk, database, kernel).
    Internal,
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    // Fields holding names from images or requests are shown cut (see `crate::shown`).
    #[error("invalid image reference {:?}: {reason}", shown(reference))]
    InvalidReference { reference: String, reason: String },
    #[error("invalid digest {:?}: expected sha256:<64 hex digits>", shown(.0))]
    InvalidDigest(String),
    #[error("image {:?} not found", shown(.0))]
    ImageNotFound(String),
    #[error("{} not found in registry {registry}: {}", shown(what), shown(detail))]
    RegistryNotFound {
        what: String,
        registry: String,
        detail: String,
    },
    #[error("registry {registry} refused authentication: {detail}")]
    Unauthorized { registry: String, detail: String },
    #[error("registry {registry} unavailable: {detail}")]
    RegistryUnavailable { registry: String, detail: String },
    #[error("digest mismatch for {what} {expected}: content hashes to {actual}")]
    DigestMismatch {
        what: &'static str,
        expected: String,
        actual: String,
    },
    #[error("{0}")]
    BadContent(String),
    #[error("layer {layer}: {reason}")]
    HostileLayer { layer: String, reason: String },
    /// An `[images]` limit: `max_unpacked_bytes`, `max_layer_entries` or `min_free_percent`.
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("no manifest in index {digest} matches platform {platform}")]
    NoMatchingPlatform { digest: String, platform: String },
    #[error("image {image} is in use by container {container}")]
    InUse { image: String, container: String },
    #[error(
        "pulling layer {layer} stalled: no bytes for {timeout:?} after {received} bytes \
         (images.pull_progress_timeout)"
    )]
    PullStalled {
        layer: String,
        received: u64,
        timeout: std::time::Duration,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("metadata store: {0}")]
    Metadata(String),
    /// A directory to delete still has a mount below it that would not come off: deleting it
    /// would delete the mounted files, so it is kept.
    #[error("layer {chain} cannot be used: {reason}")]
    LayerUnusable { chain: String, reason: String },
    #[error("{} is kept: {} is still mounted below it", dir.display(), mount.display())]
    StillMounted { dir: PathBuf, mount: PathBuf },
    #[error("mount {target}: {source}")]
    Mount {
        target: PathBuf,
        #[source]
        source: nix::Error,
    },
}

impl ImageError {
    pub fn kind(&self) -> ErrorKind {
        use ImageError::*;
        match self {
            InvalidReference { .. } | InvalidDigest(_) => ErrorKind::InvalidArgument,
            ImageNotFound(_) | RegistryNotFound { .. } | NoMatchingPlatform { .. } => {
                ErrorKind::NotFound
            }
            Unauthorized { .. } => ErrorKind::Unauthenticated,
            RegistryUnavailable { .. } => ErrorKind::Unavailable,
            DigestMismatch { .. } => ErrorKind::DataLoss,
            BadContent(_) | HostileLayer { .. } => ErrorKind::BadContent,
            ResourceExhausted(_) => ErrorKind::ResourceExhausted,
            InUse { .. } | StillMounted { .. } | LayerUnusable { .. } => {
                ErrorKind::FailedPrecondition
            }
            PullStalled { .. } => ErrorKind::DeadlineExceeded,
            Io { .. } | Metadata(_) | Mount { .. } => ErrorKind::Internal,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ImageError::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = ImageError> = std::result::Result<T, E>;

/// Attach a context string to io errors, as `anyhow::Context` would.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| ImageError::io(context(), e))
    }
}

macro_rules! metadata_err {
    ($($t:ty),*) => {$(
        impl From<$t> for ImageError {
            fn from(e: $t) -> Self { ImageError::Metadata(e.to_string()) }
        }
    )*};
}
metadata_err!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    serde_json::Error
);

/// Carries an [`ImageError`] through `std::io::Read`, from the download into the unpacker, so the
/// unpacker's caller sees the download's own error (a digest mismatch, a dropped connection).
#[derive(Debug)]
pub(crate) struct StreamAborted(pub std::sync::Mutex<Option<ImageError>>);

impl std::fmt::Display for StreamAborted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("layer download aborted")
    }
}

impl std::error::Error for StreamAborted {}
