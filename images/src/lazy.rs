//! The hook through which a pull serves a layer lazily instead of downloading it whole, and
//! through which a container's root filesystem finds such a layer. The store knows nothing of
//! the formats or of FUSE: `crishim-lazy` implements [`LazyLayers`].

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use oci_spec::image::Descriptor;
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::reference::Reference;
use crate::registry::Credentials;

/// The layer annotation that marks an eStargz layer: its TOC's digest.
pub const ESTARGZ_TOC_DIGEST: &str = "containerd.io/snapshot/stargz/toc.digest";
/// The layer annotations that mark a zstd:chunked layer: where its TOC is, and its digest.
pub const ZSTD_CHUNKED_MANIFEST_POSITION: &str =
    "io.github.containers.zstd-chunked.manifest-position";
pub const ZSTD_CHUNKED_MANIFEST_CHECKSUM: &str =
    "io.github.containers.zstd-chunked.manifest-checksum";

/// Whether a layer's annotations say it is in a lazy format.
pub fn is_lazy_format(annotations: &std::collections::HashMap<String, String>) -> bool {
    annotations.contains_key(ESTARGZ_TOC_DIGEST)
        || annotations.contains_key(ZSTD_CHUNKED_MANIFEST_POSITION)
}

/// One layer of a pull that may be served lazily.
pub struct LazyRequest<'a> {
    /// The image, by its manifest's digest: where the layer's bytes are fetched from.
    pub image: &'a Reference,
    pub creds: Option<&'a Credentials>,
    pub layer: &'a Descriptor,
    pub diff_id: &'a Digest,
    pub chain: &'a Digest,
}

/// What became of a [`LazyRequest`].
#[derive(Debug)]
pub enum LazyOutcome {
    /// Mounted: its TOC is in and checked, and its files are served.
    Mounted,
    /// Pull it whole, for this reason (not a lazy format, no `Range`, a TOC refused…).
    Whole(String),
}

/// Where a lazy layer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LazyState {
    /// Served on demand while the prefetch runs.
    Lazy,
    /// Every byte is local and checked: an ordinary snapshot.
    Local,
    /// The whole blob failed its digest: no new container uses it.
    Quarantined,
}

/// A lazy layer's progress, as its server reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LazyStatus {
    pub state: LazyState,
    /// Compressed bytes of the blob held locally (chunks fetched, or the prefetch's progress).
    pub local_bytes: u64,
    /// The blob's size.
    pub size_bytes: u64,
    /// Bytes fetched from the registry, reads and prefetch together.
    #[serde(default)]
    pub fetched_bytes: u64,
    /// Chunks that failed their digest (each refused with `EIO`).
    #[serde(default)]
    pub chunk_errors: u64,
    /// Why it is quarantined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

pub type LazyFuture<'a> = Pin<Box<dyn Future<Output = LazyOutcome> + Send + 'a>>;

/// Lazy layers, served outside the daemon.
pub trait LazyLayers: Send + Sync {
    /// Serve `req`'s layer lazily if it can be: its TOC fetched and checked, and its files
    /// mounted, before this returns [`LazyOutcome::Mounted`].
    fn mount<'a>(&'a self, req: LazyRequest<'a>) -> LazyFuture<'a>;

    /// The mount to use as the lower layer of `chain`: `Ok(None)` where there is no lazy layer,
    /// `Err(why)` where it may not be used (quarantined, or its server is gone).
    fn lower(&self, chain: &Digest) -> Result<Option<PathBuf>, String>;

    /// Let go of lazy layers: those whose chain is not in `live` entirely, and the mounts of
    /// those now local (an ordinary snapshot) that no container in `held` may still read.
    fn collect(&self, live: &HashSet<&str>, held: &HashSet<&str>);

    /// `chain`'s lazy layer, if it has one.
    fn status(&self, chain: &Digest) -> Option<LazyStatus>;

    /// Every lazy layer (its chain ID's hex) and where it stands.
    fn all(&self) -> Vec<(String, LazyStatus)>;
}

/// How much of an image is local, layer by layer: what `ImageStatus` (verbose) reports under
/// `info["lazy"]` and `crishim images` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LazySummary {
    /// `quarantined` if any layer is, else `lazy` while any layer is served on demand, else
    /// `local`.
    pub state: LazyState,
    pub local_bytes: u64,
    pub size_bytes: u64,
    /// The lazy layers only; every other layer is local.
    pub layers: Vec<LazyLayerSummary>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LazyLayerSummary {
    pub digest: Digest,
    #[serde(flatten)]
    pub status: LazyStatus,
}

impl LazySummary {
    /// The summary of an image of `size` bytes whose lazy layers stand as `layers` say.
    pub fn of(size: u64, layers: Vec<(Digest, LazyStatus)>) -> LazySummary {
        let missing: u64 = layers
            .iter()
            .map(|(_, s)| s.size_bytes.saturating_sub(s.local_bytes))
            .sum();
        let state = if layers
            .iter()
            .any(|(_, s)| s.state == LazyState::Quarantined)
        {
            LazyState::Quarantined
        } else if layers.iter().any(|(_, s)| s.state == LazyState::Lazy) {
            LazyState::Lazy
        } else {
            LazyState::Local
        };
        LazySummary {
            state,
            local_bytes: size.saturating_sub(missing),
            size_bytes: size,
            layers: layers
                .into_iter()
                .map(|(digest, status)| LazyLayerSummary { digest, status })
                .collect(),
        }
    }
}
