//! What the daemon hands a lazy layer's FUSE server (`spec.json`, root's alone, in the layer's
//! directory), and the files they share there.
//!
//! ```text
//! <root_dir>/lazy/<chain hex>/spec.json    this, written by the daemon
//! <root_dir>/lazy/<chain hex>/status.json  where the layer stands, written by its server
//! <root_dir>/lazy/<chain hex>/pid          the server's pid
//! <root_dir>/lazy/<chain hex>/server.log   the server's log
//! <root_dir>/lazy/<chain hex>/mnt/         the FUSE mount: the layer, as overlayfs's lower
//! <root_dir>/lazy/<chain hex>/cache/       the chunk cache
//! <root_dir>/lazy/<chain hex>/unpack/      the prefetch's unpacking, renamed into snapshots/
//! ```

use std::path::{Path, PathBuf};

use crishim_images::registry::{Credentials, RegistryConfig};
use crishim_images::LazyStatus;
use oci_spec::image::Descriptor;
use serde::{Deserialize, Serialize};

pub const SPEC: &str = "spec.json";
pub const STATUS: &str = "status.json";
pub const PID: &str = "pid";
pub const LOG: &str = "server.log";
pub const MNT: &str = "mnt";
pub const CACHE: &str = "cache";
pub const UNPACK: &str = "unpack";
/// The fuse subtype of every lazy layer's mount (`fuse.crishim-lazy` in mountinfo).
pub const FS_TYPE: &str = "fuse.crishim-lazy";
/// The server's process name, as `/proc/<pid>/comm` shows it.
pub const SERVER_COMM: &str = "crishim-lazyfs";
/// Bounds on what the daemon reads back from a server's files.
pub const STATUS_MAX: u64 = 64 << 10;
pub const SPEC_MAX: u64 = 4 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    /// The image store's root (`<root_dir>/images`): where the prefetch stores the snapshot.
    pub store_root: PathBuf,
    pub chain: String,
    pub diff_id: String,
    /// The image by its manifest's digest.
    pub image: String,
    pub layer: Descriptor,
    pub registry: RegistryConfig,
    pub creds: Option<Credentials>,
    pub read_timeout_ms: u64,
    pub progress_timeout_ms: u64,
    /// Bytes per second for every prefetch together; 0: no limit.
    pub prefetch_bandwidth: u64,
    pub prefetch_concurrency: u32,
    pub max_unpacked_bytes: u64,
    pub max_layer_entries: u64,
    pub min_free_percent: u8,
}

/// The status a server wrote, bounded; `None` where there is none (yet) or it does not parse.
pub fn read_status(dir: &Path) -> Option<LazyStatus> {
    let bytes = crishim_sys::hostfs::read_capped(&dir.join(STATUS), STATUS_MAX).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Write `status` whole (a reader never sees half of it).
pub fn write_status(dir: &Path, status: &LazyStatus) -> std::io::Result<()> {
    let tmp = dir.join(format!("{STATUS}.tmp"));
    crishim_sys::hostfs::write_private(&tmp, &serde_json::to_vec(status)?)?;
    std::fs::rename(tmp, dir.join(STATUS))
}

/// Whether the server of the layer at `dir` runs and its mount is in place.
pub fn alive(dir: &Path) -> bool {
    let pid = crishim_sys::hostfs::read_capped(&dir.join(PID), 32)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|p| *p > 1);
    let Some(pid) = pid else {
        return false;
    };
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    comm.trim() == SERVER_COMM && crishim_sys::mountinfo::is_mountpoint(&dir.join(MNT))
}

pub fn layer_dir(store_root: &Path, chain_hex: &str) -> PathBuf {
    store_root.join("lazy").join(chain_hex)
}
