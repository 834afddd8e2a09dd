//! The `[images]` table of config.toml: how much one image may unpack to, and how full a pull may
//! leave the image filesystem. [`Budget`] enforces them across the concurrent layers of one pull.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;

use crate::error::{ImageError, Result};

/// Defaults no real image reaches; the largest public images (CUDA, conda) unpack to tens of GiB
/// and a few hundred thousand files.
pub const DEFAULT_MAX_UNPACKED_BYTES: u64 = 64 << 30;
pub const DEFAULT_MAX_LAYER_ENTRIES: u64 = 1_000_000;
pub const DEFAULT_MIN_FREE_PERCENT: u8 = 5;

/// Uncompressed bytes and entries between two free-space checks during an unpack.
const FREE_CHECK_BYTES: u64 = 8 << 20;
const FREE_CHECK_ENTRIES: u64 = 4096;

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ImagesConfig {
    /// The image's layers' uncompressed tar streams, summed.
    #[serde(default = "default_max_unpacked_bytes")]
    pub max_unpacked_bytes: u64,
    /// Tar entries over all of the image's layers (files, directories, links, whiteouts).
    #[serde(default = "default_max_layer_entries")]
    pub max_layer_entries: u64,
    /// A pull stops rather than leave the image filesystem with less free space than this.
    #[serde(default = "default_min_free_percent")]
    pub min_free_percent: u8,
    /// A layer download that receives no bytes for this long is cancelled (`DeadlineExceeded`),
    /// as containerd's `image_pull_progress_timeout`; one that makes progress runs as long as it
    /// needs. `"5m"`, `"90s"`, `"1h"`: 1 s to 1 h.
    #[serde(
        default = "default_pull_progress_timeout",
        deserialize_with = "progress_timeout"
    )]
    pub pull_progress_timeout: std::time::Duration,
    /// Serve eStargz and zstd:chunked layers on demand through FUSE while a background prefetch
    /// downloads the rest (lazy pull). Only layers that carry those formats' annotations are
    /// affected; every other layer is pulled whole as before.
    #[serde(default = "default_lazy")]
    pub lazy: bool,
    /// A read of a lazy layer whose chunk fetch makes no progress for this long fails with
    /// `EIO` rather than hang. `"30s"`: 1 s to 1 h.
    #[serde(
        default = "default_lazy_read_timeout",
        deserialize_with = "lazy_read_timeout"
    )]
    pub lazy_read_timeout: std::time::Duration,
    /// Bytes per second that every lazy layer's background prefetch may use together; 0: no
    /// limit.
    #[serde(default)]
    pub lazy_prefetch_bandwidth: u64,
    /// Lazy layers prefetched at once (1 to 64).
    #[serde(default = "default_lazy_prefetch_concurrency")]
    pub lazy_prefetch_concurrency: u32,
}

pub const DEFAULT_LAZY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
pub const DEFAULT_LAZY_PREFETCH_CONCURRENCY: u32 = 2;

fn default_lazy() -> bool {
    true
}
fn default_lazy_read_timeout() -> std::time::Duration {
    DEFAULT_LAZY_READ_TIMEOUT
}
fn default_lazy_prefetch_concurrency() -> u32 {
    DEFAULT_LAZY_PREFETCH_CONCURRENCY
}

fn lazy_read_timeout<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<std::time::Duration, D::Error> {
    duration_in("lazy_read_timeout", "30s", d)
}

/// containerd's default `image_pull_progress_timeout`.
pub const DEFAULT_PULL_PROGRESS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);
const PULL_PROGRESS_TIMEOUT_RANGE: (u64, u64) = (1, 3600);

fn default_pull_progress_timeout() -> std::time::Duration {
    DEFAULT_PULL_PROGRESS_TIMEOUT
}

fn progress_timeout<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<std::time::Duration, D::Error> {
    duration_in("pull_progress_timeout", "5m", d)
}

/// A duration written as `"5m"`, `"90s"`: 1 s to 1 h.
fn duration_in<'de, D: serde::Deserializer<'de>>(
    key: &str,
    example: &str,
    d: D,
) -> std::result::Result<std::time::Duration, D::Error> {
    let s = String::deserialize(d)?;
    let t = humantime::parse_duration(&s)
        .map_err(|e| serde::de::Error::custom(format!("{key} {s:?}: {e} (e.g. \"{example}\")")))?;
    let (lo, hi) = PULL_PROGRESS_TIMEOUT_RANGE;
    if t.as_secs() < lo || t.as_secs() > hi {
        return Err(serde::de::Error::custom(format!(
            "{key} {s:?} is outside {lo} s to {hi} s"
        )));
    }
    Ok(t)
}

fn default_max_unpacked_bytes() -> u64 {
    DEFAULT_MAX_UNPACKED_BYTES
}
fn default_max_layer_entries() -> u64 {
    DEFAULT_MAX_LAYER_ENTRIES
}
fn default_min_free_percent() -> u8 {
    DEFAULT_MIN_FREE_PERCENT
}

impl Default for ImagesConfig {
    fn default() -> Self {
        ImagesConfig {
            max_unpacked_bytes: DEFAULT_MAX_UNPACKED_BYTES,
            max_layer_entries: DEFAULT_MAX_LAYER_ENTRIES,
            min_free_percent: DEFAULT_MIN_FREE_PERCENT,
            pull_progress_timeout: DEFAULT_PULL_PROGRESS_TIMEOUT,
            lazy: true,
            lazy_read_timeout: DEFAULT_LAZY_READ_TIMEOUT,
            lazy_prefetch_bandwidth: 0,
            lazy_prefetch_concurrency: DEFAULT_LAZY_PREFETCH_CONCURRENCY,
        }
    }
}

impl ImagesConfig {
    /// No limits at all (tools and tests that unpack outside a store).
    pub fn unlimited() -> Self {
        ImagesConfig {
            max_unpacked_bytes: u64::MAX,
            max_layer_entries: u64::MAX,
            min_free_percent: 0,
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.max_unpacked_bytes == 0 {
            return Err("[images] max_unpacked_bytes must be at least 1".into());
        }
        if self.max_layer_entries == 0 {
            return Err("[images] max_layer_entries must be at least 1".into());
        }
        if self.min_free_percent > 100 {
            return Err(format!(
                "[images] min_free_percent must be 0 to 100, got {}",
                self.min_free_percent
            ));
        }
        if !(1..=64).contains(&self.lazy_prefetch_concurrency) {
            return Err(format!(
                "[images] lazy_prefetch_concurrency must be 1 to 64, got {}",
                self.lazy_prefetch_concurrency
            ));
        }
        Ok(())
    }
}

/// What one pull has unpacked so far, shared by its layers.
#[derive(Debug)]
pub struct Budget {
    limits: ImagesConfig,
    bytes: AtomicU64,
    entries: AtomicU64,
}

impl Budget {
    pub fn new(limits: &ImagesConfig) -> Self {
        Budget {
            limits: limits.clone(),
            bytes: AtomicU64::new(0),
            entries: AtomicU64::new(0),
        }
    }

    pub fn unlimited() -> Self {
        Budget::new(&ImagesConfig::unlimited())
    }

    /// Count `n` more uncompressed bytes; `fs` (a directory on the image filesystem) is checked for
    /// free space each time another [`FREE_CHECK_BYTES`] have gone by.
    pub fn add_bytes(&self, n: u64, fs: &impl AsFd) -> Result<()> {
        let before = self.bytes.fetch_add(n, Ordering::Relaxed);
        let after = before.saturating_add(n);
        if after > self.limits.max_unpacked_bytes {
            return Err(ImageError::ResourceExhausted(format!(
                "the image unpacks to more than [images] max_unpacked_bytes = {} bytes",
                self.limits.max_unpacked_bytes
            )));
        }
        if before / FREE_CHECK_BYTES != after / FREE_CHECK_BYTES {
            self.check_free_space(fs, 0)?;
        }
        Ok(())
    }

    /// Would `n` more bytes stay within `max_unpacked_bytes`? Checked before a file is written.
    pub fn fits(&self, n: u64) -> Result<()> {
        let used = self.bytes.load(Ordering::Relaxed);
        if used.saturating_add(n) > self.limits.max_unpacked_bytes {
            return Err(ImageError::ResourceExhausted(format!(
                "the image unpacks to more than [images] max_unpacked_bytes = {} bytes \
                 (an entry of {n} bytes after {used})",
                self.limits.max_unpacked_bytes
            )));
        }
        Ok(())
    }

    /// Count one more tar entry.
    pub fn add_entry(&self, fs: &impl AsFd) -> Result<()> {
        let n = self.entries.fetch_add(1, Ordering::Relaxed) + 1;
        if n > self.limits.max_layer_entries {
            return Err(ImageError::ResourceExhausted(format!(
                "the image has more than [images] max_layer_entries = {} entries",
                self.limits.max_layer_entries
            )));
        }
        if n.is_multiple_of(FREE_CHECK_ENTRIES) {
            self.check_free_space(fs, 0)?;
        }
        Ok(())
    }

    /// Fail when writing `need` more bytes to the filesystem holding `fs` would leave less than
    /// `min_free_percent` of it free, counted as `df` does: available blocks (reserved ones
    /// excluded) out of used plus available.
    pub fn check_free_space(&self, fs: &impl AsFd, need: u64) -> Result<()> {
        let min = u64::from(self.limits.min_free_percent);
        if min == 0 {
            return Ok(());
        }
        let st = nix::sys::statvfs::fstatvfs(fs).map_err(|e| {
            ImageError::io("statvfs of the image filesystem", std::io::Error::from(e))
        })?;
        let frsize = st.fragment_size().max(1) as u128;
        let used = (st.blocks() as u128).saturating_sub(st.blocks_free() as u128) * frsize;
        let avail = st.blocks_available() as u128 * frsize;
        let total = used + avail;
        let avail = avail.saturating_sub(need as u128);
        if total == 0 || avail * 100 < total * min as u128 {
            return Err(ImageError::ResourceExhausted(format!(
                "the image filesystem would have {} of {} MiB free{}, under [images] \
                 min_free_percent = {min}",
                avail >> 20,
                total >> 20,
                if need > 0 {
                    format!(" after this pull's {} MiB of layers", need >> 20)
                } else {
                    String::new()
                }
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_entries_stop_at_their_limits() {
        let dir = tempfile::tempdir().unwrap();
        let fd = std::fs::File::open(dir.path()).unwrap();
        let b = Budget::new(&ImagesConfig {
            max_unpacked_bytes: 100,
            max_layer_entries: 2,
            min_free_percent: 0,
            ..ImagesConfig::default()
        });
        b.add_bytes(60, &fd).unwrap();
        assert!(b.fits(40).is_ok() && b.fits(41).is_err());
        let e = b.add_bytes(41, &fd).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::ResourceExhausted, "{e}");
        b.add_entry(&fd).unwrap();
        b.add_entry(&fd).unwrap();
        assert!(b
            .add_entry(&fd)
            .unwrap_err()
            .to_string()
            .contains("max_layer_entries = 2"));
    }

    #[test]
    fn a_full_percentage_can_never_be_met() {
        let dir = tempfile::tempdir().unwrap();
        let fd = std::fs::File::open(dir.path()).unwrap();
        // The host's own free space decides what may pass: CI's disk can be under 5 % free.
        let st = nix::sys::statvfs::fstatvfs(&fd).unwrap();
        let free_percent = st.blocks_available() * 100 / st.blocks().max(1);
        let mut limits = ImagesConfig::default();
        if free_percent >= 2 {
            limits.min_free_percent = 1;
            assert!(Budget::new(&limits).check_free_space(&fd, 0).is_ok());
        }
        limits.min_free_percent = 100;
        let e = Budget::new(&limits).check_free_space(&fd, 0).unwrap_err();
        assert!(e.to_string().contains("min_free_percent = 100"), "{e}");
        assert!(ImagesConfig {
            min_free_percent: 101,
            ..limits
        }
        .validate()
        .is_err());
    }
}
