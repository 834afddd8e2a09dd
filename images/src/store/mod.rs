//! On-disk layout of the image store and its crash-safe metadata.
//!
//! ```text
//! <root>/blobs/sha256/<hex>        verified content, by digest
//! <root>/ingest/<n>                blobs being downloaded (cleared at start-up)
//! <root>/snapshots/<chain hex>/    one unpacked layer each, shared by every image using it
//! <root>/snapshots/tmp/<n>/        layers being unpacked (cleared at start-up)
//! <root>/containers/<id>/          a container's overlay upper and work dirs
//! <root>/meta.redb                 images, names and container references (redb transactions)
//! ```
//! Files are written first and renamed into place once verified; an image becomes visible only when
//! its metadata transaction commits. Anything on disk that no committed record references is garbage,
//! collected at start-up and after removals.

pub mod meta;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::digest::Digest;
use crate::error::{IoContext, Result};

#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Layout {
    pub fn new(root: &Path) -> Self {
        Layout {
            root: root.to_path_buf(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs/sha256")
    }

    pub fn blob(&self, d: &Digest) -> PathBuf {
        self.blobs().join(d.hex())
    }

    pub fn ingest(&self) -> PathBuf {
        self.root.join("ingest")
    }

    pub fn snapshots(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    pub fn snapshot(&self, chain_id: &Digest) -> PathBuf {
        self.snapshots().join(chain_id.hex())
    }

    pub fn snapshots_tmp(&self) -> PathBuf {
        self.snapshots().join("tmp")
    }

    pub fn containers(&self) -> PathBuf {
        self.root.join("containers")
    }

    pub fn container(&self, id: &str) -> PathBuf {
        self.containers().join(id)
    }

    pub fn meta(&self) -> PathBuf {
        self.root.join("meta.redb")
    }

    /// A unique name for a temporary file or directory in this process.
    pub fn tmp_name() -> String {
        format!(
            "{}-{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Create the directory tree; clear what a crash left half-written.
    pub fn init(&self) -> Result<()> {
        for d in [
            self.blobs(),
            self.ingest(),
            self.snapshots_tmp(),
            self.containers(),
        ] {
            std::fs::create_dir_all(&d).ctx(|| format!("creating {}", d.display()))?;
        }
        for d in [self.ingest(), self.snapshots_tmp()] {
            for entry in std::fs::read_dir(&d).ctx(|| format!("reading {}", d.display()))? {
                let path = entry.ctx(|| format!("reading {}", d.display()))?.path();
                remove_any(&path)?;
            }
        }
        Ok(())
    }

    /// Write small verified content (a manifest, a config) into the blob store atomically.
    pub fn write_blob(&self, digest: &Digest, data: &[u8]) -> Result<()> {
        let path = self.blob(digest);
        if path.exists() {
            return Ok(());
        }
        let tmp = self.ingest().join(Self::tmp_name());
        std::fs::write(&tmp, data).ctx(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).ctx(|| format!("storing blob {digest}"))
    }

    pub fn read_blob(&self, digest: &Digest) -> Result<Vec<u8>> {
        std::fs::read(self.blob(digest)).ctx(|| format!("reading blob {digest}"))
    }
}

/// Remove a file or a directory tree; a missing path is fine.
pub(crate) fn remove_any(path: &Path) -> Result<()> {
    let res = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    res.ctx(|| format!("removing {}", path.display()))
}
