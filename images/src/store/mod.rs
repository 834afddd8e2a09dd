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

use crishim_sys::hostfs::{self, create_private_dir};

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

    /// Removed containers' directories, waiting for [`Trash`] to delete them.
    pub fn trash(&self) -> PathBuf {
        self.root.join("trash")
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
            self.trash(),
        ] {
            create_private_dir(&d).ctx(|| format!("creating {}", d.display()))?;
        }
        for d in [self.ingest(), self.snapshots_tmp(), self.trash()] {
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

/// Deletes removed containers' directories in a thread of its own, after RemoveContainer has
/// answered (as containerd's garbage collector deletes snapshots): a container's upper dir may
/// hold many files. A directory is first renamed into the trash, so it is gone from its place at
/// once, and [`Layout::init`] empties what a restart left there.
pub(crate) struct Trash {
    dir: PathBuf,
    tx: std::sync::mpsc::Sender<PathBuf>,
}

impl Trash {
    pub fn new(dir: PathBuf) -> Result<Trash> {
        let (tx, rx) = std::sync::mpsc::channel::<PathBuf>();
        std::thread::Builder::new()
            .name("crishim-trash".into())
            .spawn(move || {
                for path in rx {
                    if let Err(e) = remove_any(&path) {
                        tracing::warn!(error = %e, "emptying the trash");
                    }
                }
            })
            .ctx(|| "starting the trash thread".to_string())?;
        Ok(Trash { dir, tx })
    }

    /// Take `path` out of its place now and delete it later; removed here where it cannot be
    /// moved into the trash. A missing path is fine.
    pub fn discard(&self, path: &Path) -> Result<()> {
        let to = self.dir.join(Layout::tmp_name());
        match std::fs::rename(path, &to) {
            Ok(()) => {
                if let Err(e) = self.tx.send(to) {
                    remove_any(&e.0)?;
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(_) => remove_any(path),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A discarded directory leaves its place at once and is deleted later; what a restart
    /// finds in the trash is deleted by `init`; a missing path is fine.
    #[test]
    fn discarded_directories_leave_at_once_and_the_trash_empties() {
        let t = tempfile::tempdir().unwrap();
        let layout = Layout::new(t.path());
        layout.init().unwrap();
        let trash = Trash::new(layout.trash()).unwrap();
        let dir = layout.container("c1");
        std::fs::create_dir_all(dir.join("upper/a/b")).unwrap();
        std::fs::write(dir.join("upper/a/b/f"), "x").unwrap();
        trash.discard(&dir).unwrap();
        assert!(!dir.exists());
        let empty = || std::fs::read_dir(layout.trash()).unwrap().next().is_none();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(empty(), "the trash was not emptied");
        trash.discard(&dir).unwrap();

        std::fs::create_dir_all(layout.trash().join("left/x")).unwrap();
        layout.init().unwrap();
        assert!(empty(), "init left the trash as a restart found it");
    }
}
