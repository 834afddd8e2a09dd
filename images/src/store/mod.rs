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
//!
//! Every directory of the store is root's alone (0700), so no host user reaches a setuid binary
//! or a device node that a layer holds. Only the roots of content that a container sees as its `/`
//! (a snapshot, an upper dir) are 0755: past the mount, its non-root user must traverse them.

pub mod meta;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crishim_proto::hostfs::{self, create_private_dir};

use crate::digest::Digest;
use crate::error::{IoContext, Result};

#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The root of a layer or of a container's upper dir: overlay's `/` for the container.
pub(crate) const CONTENT_DIR_MODE: u32 = 0o755;

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

    /// Create the directory tree, root-only, tightening one that exists; clear what a crash left
    /// half-written.
    pub fn init(&self) -> Result<()> {
        for d in [
            self.root.clone(),
            self.root.join("blobs"),
            self.blobs(),
            self.ingest(),
            self.snapshots(),
            self.snapshots_tmp(),
            self.containers(),
        ] {
            create_private_dir(&d).ctx(|| format!("creating {}", d.display()))?;
        }
        for d in [self.ingest(), self.snapshots_tmp()] {
            for entry in std::fs::read_dir(&d).ctx(|| format!("reading {}", d.display()))? {
                let path = entry.ctx(|| format!("reading {}", d.display()))?.path();
                remove_any(&path)?;
            }
        }
        Ok(())
    }

    /// What an older daemon (or an admin) left looser than the layout wants: each container's
    /// directory and its work dir, and the metadata database. Never anything inside a snapshot or
    /// an upper dir: that is image and container content. Run once the database is open (redb
    /// creates its file with the umask's mode).
    pub fn tighten(&self) -> Result<()> {
        let mut paths = vec![(self.meta(), hostfs::FILE_MODE)];
        for entry in std::fs::read_dir(self.containers())
            .ctx(|| format!("reading {}", self.containers().display()))?
        {
            let dir = entry
                .ctx(|| format!("reading {}", self.containers().display()))?
                .path();
            paths.push((dir.join("work"), hostfs::DIR_MODE));
            paths.push((dir, hostfs::DIR_MODE));
        }
        for (p, mode) in paths {
            if hostfs::tighten(&p, mode).ctx(|| format!("chmod {}", p.display()))? {
                tracing::info!(path = %p.display(), "tightened the mode of a root-only path");
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
