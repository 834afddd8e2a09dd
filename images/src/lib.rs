//! crishim's image service: references, a registry client, a content store of verified blobs,
//! one unpacked snapshot per layer, and overlayfs root filesystems for containers.
//!
//! [`ImageStore`] is the entry point; the daemon's CRI `ImageService` is a thin layer over it.

pub mod digest;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod lazy;
pub mod limits;
mod locks;
mod platform;
pub mod pull;
pub mod reference;
pub mod registry;
pub mod rootfs;
pub mod store;
pub mod unpack;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crishim_sys::hostfs::{self, create_private_dir};
use oci_spec::image::ImageConfiguration;
use tracing::{info, warn};

pub use crate::digest::Digest;
use crate::error::IoContext;
pub use crate::error::{ErrorKind, ImageError, Result};
pub use crate::lazy::{LazyLayers, LazyState, LazyStatus, LazySummary};
pub use crate::limits::ImagesConfig;
pub use crate::platform::host_arch;
pub use crate::reference::Reference;
use crate::registry::RegistryClient;
pub use crate::registry::{Credentials, RegistryConfig};
pub use crate::rootfs::RootfsMount;
use crate::store::meta::Meta;
pub use crate::store::meta::{ContainerRef, ImageRecord};
use crate::store::CONTENT_DIR_MODE;
use crate::store::{remove_any, Layout};

pub struct ImageStore {
    layout: Layout,
    meta: Meta,
    client: RegistryClient,
    /// `[images]`: limits every pull is held to.
    limits: ImagesConfig,
    /// Shared by pulls and prepares, exclusive for garbage collection.
    gc_lock: tokio::sync::RwLock<()>,
    inflight: locks::KeyedLocks,
    trash: store::Trash,
    /// Mount roots whose submounts are never a container's (the daemon's state directory, with
    /// every pod's): [`cleanup`](Self::cleanup) leaves them out unread.
    mounts_elsewhere: Vec<PathBuf>,
    /// Serves layers in a lazy format on demand, where enabled.
    lazy: Option<std::sync::Arc<dyn LazyLayers>>,
}

/// Space used by the store.
#[derive(Debug, Clone, Copy, Default)]
pub struct FsUsage {
    pub bytes: u64,
    pub inodes: u64,
}

impl ImageStore {
    /// Open (creating) the store at `root`, clear half-finished work and collect garbage. Every
    /// pull is held to `limits` (the `[images]` table). The HTTP client's own read timeout sits
    /// past the pull progress timeout, so that the progress timeout is the one that fires on a
    /// stalled layer.
    pub async fn open(root: &Path, registry: RegistryConfig, limits: ImagesConfig) -> Result<Self> {
        let layout = Layout::new(root);
        layout.init()?;
        let layout_trash = layout.trash();
        let meta = Meta::open(&layout.meta())?;
        layout.tighten()?;
        let read = limits.pull_progress_timeout + std::time::Duration::from_secs(30);
        let store = ImageStore {
            layout,
            meta,
            client: RegistryClient::with_read_timeout(registry, read)?,
            limits,
            gc_lock: Default::default(),
            inflight: Default::default(),
            trash: store::Trash::new(layout_trash)?,
            mounts_elsewhere: Vec::new(),
            lazy: None,
        };
        store.gc().await?;
        Ok(store)
    }

    /// Mounts below these directories, where each is a mount's root, are not a container's:
    /// [`cleanup`](Self::cleanup)'s search for what is left mounted skips them unread.
    pub fn with_mounts_elsewhere(mut self, roots: Vec<PathBuf>) -> Self {
        self.mounts_elsewhere = roots;
        self
    }

    /// Serve layers in a lazy format (eStargz, zstd:chunked) through `lazy` from now on.
    pub async fn with_lazy(mut self, lazy: std::sync::Arc<dyn LazyLayers>) -> Result<Self> {
        self.lazy = Some(lazy);
        self.gc().await?;
        Ok(self)
    }

    /// Every lazy layer (its chain ID's hex) and where it stands.
    pub fn lazy_layers(&self) -> Vec<(String, LazyStatus)> {
        self.lazy.as_ref().map(|l| l.all()).unwrap_or_default()
    }

    /// How much of `image` is local: its lazy layers and where each stands.
    pub fn lazy_summary(&self, image: &ImageRecord) -> LazySummary {
        let layers = match &self.lazy {
            Some(lazy) => image
                .layers
                .iter()
                .zip(&image.chain_ids)
                .filter(|(_, chain)| !self.layout.snapshot(chain).is_dir())
                .filter_map(|(layer, chain)| lazy.status(chain).map(|s| (layer.clone(), s)))
                .collect(),
            None => Vec::new(),
        };
        LazySummary::of(image.size, layers)
    }

    pub fn root(&self) -> &Path {
        self.layout.root()
    }

    /// Pull `reference` (normalised first) and register it.
    pub async fn pull(&self, reference: &str, creds: Option<&Credentials>) -> Result<ImageRecord> {
        let r = Reference::parse(reference)?;
        self.pull_image(&r, creds).await
    }

    /// Find an image by ID (`sha256:…`, bare hex, or a unique hex prefix) or by reference.
    pub fn resolve(&self, ref_or_id: &str) -> Result<Option<ImageRecord>> {
        let s = ref_or_id.trim();
        if s.is_empty() {
            return Err(ImageError::InvalidReference {
                reference: s.into(),
                reason: "empty image name".into(),
            });
        }
        if let Ok(d) = Digest::parse(s) {
            return self.meta.image(d.as_str());
        }
        if digest::is_hex64(s) {
            return self.meta.image(&format!("sha256:{s}"));
        }
        if let Ok(r) = Reference::parse(s) {
            let by_name = match (&r.digest, r.tagged()) {
                (Some(d), _) => self.meta.image_by_name(&r.with_digest(d))?,
                (None, Some(t)) => self.meta.image_by_name(&t)?,
                _ => None,
            };
            if by_name.is_some() {
                return Ok(by_name);
            }
        }
        // A truncated ID, as `crictl images` prints them.
        let hex = s.strip_prefix("sha256:").unwrap_or(s);
        if hex.len() >= 4 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            let hits: Vec<ImageRecord> = self
                .meta
                .images()?
                .into_iter()
                .filter(|i| i.id.hex().starts_with(hex))
                .collect();
            if hits.len() == 1 {
                return Ok(hits.into_iter().next());
            }
        }
        match Reference::parse(s) {
            Ok(_) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn list(&self) -> Result<Vec<ImageRecord>> {
        self.meta.images()
    }

    /// The image's config as stored (raw JSON) and parsed.
    pub fn config(&self, image: &ImageRecord) -> Result<(Vec<u8>, ImageConfiguration)> {
        let raw = self.layout.read_blob(&image.config)?;
        let parsed = ImageConfiguration::from_reader(&raw[..])
            .map_err(|e| ImageError::BadContent(format!("stored config of {}: {e}", image.id)))?;
        Ok((raw, parsed))
    }

    /// Remove an image with all its names; a missing image is not an error. Returns what was removed.
    pub async fn remove(&self, ref_or_id: &str) -> Result<Option<ImageRecord>> {
        let Some(image) = self.resolve(ref_or_id)? else {
            return Ok(None);
        };
        // A mounted image volume (KEP-4639: prepared read-only) keeps its image, as the kubelet
        // expects; a container's own rootfs does not (its layers stay until it goes, as in
        // containerd).
        let volume = self
            .meta
            .containers()?
            .into_iter()
            .find(|(_, r)| r.readonly && r.image == image.id);
        if let Some((id, _)) = volume {
            return Err(ImageError::InUse {
                image: image.id.to_string(),
                container: format!("{id} (an image volume)"),
            });
        }
        self.meta.remove_image(image.id.as_str())?;
        info!(id = %image.id, "removed image");
        self.gc().await?;
        Ok(Some(image))
    }

    /// Create a container's writable layer over `image` and return the mount for its rootfs.
    pub async fn prepare(
        &self,
        image: &ImageRecord,
        container_id: &str,
        readonly: bool,
    ) -> Result<RootfsMount> {
        validate_id(container_id)?;
        let _gc = self.gc_lock.read().await;
        let mut lowers = Vec::with_capacity(image.chain_ids.len());
        let mut lazy_chains = Vec::new();
        // A layer now local whose lazy mount is still there: maybe nothing reads through it.
        let mut lazy_left = false;
        for chain in image.chain_ids.iter().rev() {
            let (lower, lazy) = self.lower(chain, image)?;
            lowers.push(lower);
            if lazy {
                lazy_chains.push(chain.clone());
            } else if let Some(l) = &self.lazy {
                lazy_left |= l.status(chain).is_some();
            }
        }
        let r = ContainerRef {
            image: image.id.clone(),
            chain_ids: image.chain_ids.clone(),
            readonly,
            lazy_chains,
        };
        if !self.meta.add_container(container_id, &r)? {
            return Err(ImageError::InUse {
                image: image.id.to_string(),
                container: container_id.into(),
            });
        }
        let dir = self.layout.container(container_id);
        let made = (|| {
            let private =
                |d: &Path| create_private_dir(d).ctx(|| format!("creating {}", d.display()));
            private(&dir)?;
            if readonly {
                return Ok(RootfsMount::overlay(lowers, None));
            }
            let (upper, work) = (dir.join("upper"), dir.join("work"));
            // The upper dir's mode becomes the mode of the container's `/`.
            hostfs::create_dir(&upper, CONTENT_DIR_MODE)
                .ctx(|| format!("creating {}", upper.display()))?;
            private(&work)?;
            Ok(RootfsMount::overlay(lowers, Some((upper, work))))
        })();
        if made.is_err() {
            let _ = remove_any(&dir);
            self.meta.remove_container(container_id)?;
        } else if lazy_left {
            self.collect_lazy()?;
        }
        made
    }

    /// Where `chain`'s files are: its snapshot, or else its lazy layer's mount (`true`).
    fn lower(&self, chain: &Digest, image: &ImageRecord) -> Result<(PathBuf, bool)> {
        let snapshot = self.layout.snapshot(chain);
        if snapshot.is_dir() {
            return Ok((snapshot, false));
        }
        match self.lazy.as_ref().map(|l| l.lower(chain)) {
            Some(Ok(Some(mount))) => Ok((mount, true)),
            Some(Err(reason)) => Err(ImageError::LayerUnusable {
                chain: chain.to_string(),
                reason,
            }),
            _ => Err(ImageError::BadContent(format!(
                "snapshot {} of image {} is missing",
                snapshot.display(),
                image.id
            ))),
        }
    }

    /// A container's private directory (its upper and work dirs live here).
    pub fn container_dir(&self, container_id: &str) -> PathBuf {
        self.layout.container(container_id)
    }

    /// Undo [`prepare`](Self::prepare): unmount anything still mounted under the container's
    /// directory, delete it and drop its reference. Idempotent.
    pub async fn cleanup(&self, container_id: &str) -> Result<()> {
        validate_id(container_id)?;
        let dir = self.layout.container(container_id);
        // Deleting a directory with a mount still below it would delete the mounted files (a
        // privileged container's own mounts can propagate here): it is kept, and so is the
        // record, for a later removal to retry.
        if let Some(mount) = unmount_all_under(&dir, &self.mounts_elsewhere)
            .into_iter()
            .next()
        {
            return Err(ImageError::StillMounted { dir, mount });
        }
        self.trash.discard(&dir)?;
        let held = self.meta.container(container_id)?;
        self.meta.remove_container(container_id)?;
        // The last holder of a removed image's layers lets them go now, not at the next start-up;
        // so does the last reader of a lazy mount whose layer is now an ordinary snapshot.
        if let Some(r) = held {
            if self.meta.image(r.image.as_str())?.is_none() {
                self.gc().await?;
            } else if !r.lazy_chains.is_empty() {
                self.collect_lazy()?;
            }
        }
        Ok(())
    }

    /// Delete blobs and snapshots that no image or container references.
    pub async fn gc(&self) -> Result<()> {
        let _gc = self.gc_lock.write().await;
        let images = self.meta.images()?;
        let containers = self.meta.containers()?;
        let live_blobs: HashSet<&str> = images
            .iter()
            .flat_map(|i| i.blobs())
            .map(|d| d.hex())
            .collect();
        let live_snaps = live_chains(&images, &containers);
        let mut removed = 0;
        for (dir, live) in [
            (self.layout.blobs(), &live_blobs),
            (self.layout.snapshots(), &live_snaps),
        ] {
            for entry in std::fs::read_dir(&dir).ctx(|| format!("reading {}", dir.display()))? {
                let entry = entry.ctx(|| format!("reading {}", dir.display()))?;
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name == "tmp" || live.contains(name.as_ref()) {
                    continue;
                }
                remove_any(&entry.path())?;
                removed += 1;
            }
        }
        if removed > 0 {
            info!(removed, "garbage collected blobs and snapshots");
        }
        if let Some(lazy) = &self.lazy {
            lazy.collect(&live_snaps, &lazy_held(&containers));
        }
        Ok(())
    }

    /// Let go of the lazy mounts of layers that are ordinary snapshots now and that no
    /// container reads through (their servers exit once the kernel drops the mounts).
    fn collect_lazy(&self) -> Result<()> {
        let Some(lazy) = &self.lazy else {
            return Ok(());
        };
        let images = self.meta.images()?;
        let containers = self.meta.containers()?;
        lazy.collect(&live_chains(&images, &containers), &lazy_held(&containers));
        Ok(())
    }

    /// Bytes (allocated blocks) and inodes used by the store, below its root.
    ///
    /// Containers write their layers while this reads them, so the store is walked by
    /// descriptor ([`crishim_sys::walk`]): no symlink is followed and no other mount counted
    /// (containers' mounted root filesystems included), so an entry swapped for a link to `/`
    /// never adds the host's files. At most [`USAGE_ENTRIES`] entries and [`USAGE_TIME`] are
    /// spent; beyond either, or where part of the store cannot be read, what was counted is
    /// the answer, with a warning.
    pub fn usage(&self) -> Result<FsUsage> {
        use crishim_sys::walk;
        let root = self.layout.root();
        let limits = walk::Limits {
            deadline: Some(std::time::Instant::now() + USAGE_TIME),
            ..walk::Limits::entries(USAGE_ENTRIES)
        };
        let mut usage = FsUsage::default();
        let walked = walk::walk(root, &limits, |e| {
            if e.depth() > 0 {
                usage.bytes = usage
                    .bytes
                    .saturating_add(e.stat().blocks.saturating_mul(512));
                usage.inodes += 1;
            }
            Ok(())
        });
        match walked {
            Ok(walk::Walked { stopped: None, .. }) => {}
            Ok(walk::Walked {
                stopped: Some(stop),
                ..
            }) => warn!(
                root = %root.display(),
                bytes = usage.bytes,
                inodes = usage.inodes,
                "image store usage counted in part: {stop}"
            ),
            Err(e) => warn!(
                bytes = usage.bytes,
                inodes = usage.inodes,
                "image store usage counted in part: {e}"
            ),
        }
        Ok(usage)
    }
}

/// The layers (chain IDs' hex) an image or a container keeps alive.
fn live_chains<'a>(
    images: &'a [ImageRecord],
    containers: &'a [(String, ContainerRef)],
) -> HashSet<&'a str> {
    images
        .iter()
        .flat_map(|i| i.chain_ids.iter())
        .chain(containers.iter().flat_map(|(_, c)| c.chain_ids.iter()))
        .map(|d| d.hex())
        .collect()
}

/// The layers containers read through lazy mounts.
fn lazy_held(containers: &[(String, ContainerRef)]) -> HashSet<&str> {
    containers
        .iter()
        .flat_map(|(_, c)| c.lazy_chains.iter())
        .map(|d| d.hex())
        .collect()
}

/// Entries [`ImageStore::usage`] counts at most (every image's layers and every container's
/// writable layer), and the time it spends at most.
const USAGE_ENTRIES: u64 = 20_000_000;
const USAGE_TIME: std::time::Duration = std::time::Duration::from_secs(20);

/// Container IDs become directory names: keep them to one safe path component.
fn validate_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(ImageError::InvalidReference {
            reference: id.into(),
            reason: "container id must be [A-Za-z0-9_.-]{1,128}".into(),
        })
    }
}

/// Mount points at or below `dir`, deepest first, from /proc/self/mountinfo.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    mounts_under_except(dir, &[])
}

/// [`mounts_under`], leaving out unread the mounts strictly below each of `elsewhere` that is a
/// mount's root and neither holds `dir` nor lies below it, where the kernel can (`statmount`):
/// mountinfo grows with every pod and formats each overlay's layers, 1 ms of the daemon's CPU
/// per removed container at 110 pods.
pub fn mounts_under_except(dir: &Path, elsewhere: &[PathBuf]) -> Vec<PathBuf> {
    let skip: Vec<PathBuf> = elsewhere
        .iter()
        .filter(|r| !dir.starts_with(r) && !r.starts_with(dir))
        .cloned()
        .collect();
    let (mounts, _) = crishim_sys::mountinfo::read_outside(&skip).unwrap_or_default();
    let mut out: Vec<PathBuf> = mounts
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// Passes [`unmount_all_under`] makes at most: mounts stacked on one point come off one a pass.
const UNMOUNT_PASSES: usize = 16;

/// Detach every mount at or below `dir`, deepest first, stacked ones included (a pass per layer,
/// at most [`UNMOUNT_PASSES`]), `elsewhere` as [`mounts_under_except`] takes it. Returns what is
/// still mounted then, deepest first: empty when `dir` is free to delete.
pub fn unmount_all_under(dir: &Path, elsewhere: &[PathBuf]) -> Vec<PathBuf> {
    let mut left = mounts_under_except(dir, elsewhere);
    for _ in 0..UNMOUNT_PASSES {
        if left.is_empty() {
            break;
        }
        for mp in &left {
            if let Err(e) = nix::mount::umount2(mp, nix::mount::MntFlags::MNT_DETACH) {
                warn!(mountpoint = %mp.display(), error = %e, "unmount failed");
            }
        }
        left = mounts_under_except(dir, elsewhere);
    }
    left
}

#[cfg(test)]
mod mounts_tests {
    use super::{mounts_under_except, unmount_all_under};
    use std::path::Path;

    /// Three mounts stacked on one point and one below another: all come off (one pass took only
    /// the top of a stack), and the directory is left free to delete.
    #[test]
    fn stacked_mounts_all_come_off() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("c1");
        let seen = crishim_sys::testing::in_child_mount_ns(|| {
            use nix::mount::{mount, MsFlags};
            let none: Option<&str> = None;
            let tmpfs_at = |p: &Path| {
                std::fs::create_dir_all(p).ok()?;
                mount(Some("tmpfs"), p, Some("tmpfs"), MsFlags::empty(), none).ok()
            };
            let stacked = dir.join("rootfs/mnt");
            for _ in 0..3 {
                tmpfs_at(&stacked)?;
            }
            tmpfs_at(&dir.join("upper/a"))?;
            tmpfs_at(&dir.join("upper/a/b"))?;
            let before = mounts_under_except(&dir, &[]).len();
            let left = unmount_all_under(&dir, &[]);
            Some(vec![
                before == 3,
                left.is_empty(),
                mounts_under_except(&dir, &[]).is_empty(),
            ])
        });
        assert_eq!(seen, Some(vec![true; 3]));
    }

    /// In a child mount namespace: what is mounted below a container's directory is found
    /// whether or not the state directory's mounts are skipped, a mount below the skipped root
    /// is not (it is no container's), and a root that holds the directory is not skipped.
    #[test]
    fn mounts_below_a_container_are_found_and_the_pods_are_skipped() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let top = tempfile::tempdir().unwrap();
        let seen = crishim_sys::testing::in_child_mount_ns(|| {
            use nix::mount::{mount, MsFlags};
            let none: Option<&str> = None;
            let tmpfs_at = |p: &Path| {
                std::fs::create_dir_all(p).ok()?;
                mount(Some("tmpfs"), p, Some("tmpfs"), MsFlags::empty(), none).ok()
            };
            let (state, dir) = (top.path().join("state"), top.path().join("root/c1"));
            tmpfs_at(&state)?;
            tmpfs_at(&state.join("pods/p1/shm"))?;
            tmpfs_at(&dir.join("upper/left"))?;
            let inside_state = state.join("c2");
            tmpfs_at(&inside_state.join("upper/left"))?;
            let skip = [state.clone()];
            let found = mounts_under_except(&dir, &skip);
            Some(vec![
                found == [dir.join("upper/left")],
                mounts_under_except(&dir, &[]) == found,
                mounts_under_except(&state, &skip).contains(&state.join("pods/p1/shm")),
                mounts_under_except(&inside_state, &skip) == [inside_state.join("upper/left")],
            ])
        });
        assert_eq!(seen, Some(vec![true; 4]));
    }
}

#[cfg(test)]
mod usage_tests {
    use super::*;

    /// A container's writable layer with an entry made a link to a directory outside the store:
    /// the store's usage counts the link, never what it names.
    #[tokio::test]
    async fn usage_never_counts_what_a_link_in_a_writable_layer_names() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        for i in 0..50 {
            std::fs::write(outside.join(format!("f{i}")), vec![1u8; 8192]).unwrap();
        }
        let store = ImageStore::open(
            &t.path().join("store"),
            RegistryConfig::default(),
            ImagesConfig::default(),
        )
        .await
        .unwrap();
        let before = store.usage().unwrap();
        let upper = store.layout.containers().join("c1/upper");
        std::fs::create_dir_all(&upper).unwrap();
        std::os::unix::fs::symlink(&outside, upper.join("x")).unwrap();
        let after = store.usage().unwrap();
        // c1, upper and the link.
        assert_eq!(after.inodes, before.inodes + 3, "{before:?} {after:?}");
        assert!(
            after.bytes < before.bytes + 50 * 8192,
            "{before:?} {after:?}"
        );
    }
}
