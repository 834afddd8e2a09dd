//! What the container handlers need of the image store: find an image, read its config, and
//! give a container its root filesystem and take it back. Behind a trait, so the handlers'
//! logic can be tested with a fake host that mounts nothing.

use std::path::{Path, PathBuf};

use crishim_images::rootfs::Idmap;
use crishim_images::{ImageError, ImageRecord, ImageStore};
use oci_spec::image::ImageConfiguration;

#[tonic::async_trait]
pub trait ContainerImages: Send + Sync {
    /// The image a reference or id names, if pulled.
    fn resolve(&self, name: &str) -> Result<Option<ImageRecord>, ImageError>;

    fn config(&self, image: &ImageRecord) -> Result<ImageConfiguration, ImageError>;

    /// Create the container's writable layer over `image` and mount it at `rootfs`.
    /// With `idmap`, as a pod with its own user namespace sees it; with `context`, every file
    /// labelled so for SELinux.
    async fn mount_rootfs(
        &self,
        image: &ImageRecord,
        container_id: &str,
        rootfs: &Path,
        idmap: Option<&Idmap>,
        context: Option<&str>,
    ) -> Result<(), ImageError>;

    /// Mount `image`'s root filesystem read-only at `target`, as image volume `volume_id` (an
    /// image volume keeps its image from being removed).
    async fn mount_volume(
        &self,
        image: &ImageRecord,
        volume_id: &str,
        target: &Path,
    ) -> Result<(), ImageError>;

    /// Undo [`mount_rootfs`](Self::mount_rootfs) or [`mount_volume`](Self::mount_volume):
    /// unmount `target` and delete what `id` held. Idempotent.
    async fn release_rootfs(&self, id: &str, target: &Path) -> Result<(), ImageError>;

    /// Lazy layers (chain ID hex) and where each stands, for the metrics.
    fn lazy_layers(&self) -> Vec<(String, crishim_images::LazyStatus)> {
        Vec::new()
    }

    /// The directory holding the container's writable layer (`upper/`), for its disk usage.
    fn writable_dir(&self, container_id: &str) -> PathBuf;

    /// Where image content lives, reported as the image filesystem.
    fn root(&self) -> &Path;
}

#[tonic::async_trait]
impl ContainerImages for ImageStore {
    fn lazy_layers(&self) -> Vec<(String, crishim_images::LazyStatus)> {
        ImageStore::lazy_layers(self)
    }

    fn resolve(&self, name: &str) -> Result<Option<ImageRecord>, ImageError> {
        ImageStore::resolve(self, name)
    }

    fn config(&self, image: &ImageRecord) -> Result<ImageConfiguration, ImageError> {
        ImageStore::config(self, image).map(|(_, c)| c)
    }

    async fn mount_rootfs(
        &self,
        image: &ImageRecord,
        container_id: &str,
        rootfs: &Path,
        idmap: Option<&Idmap>,
        context: Option<&str>,
    ) -> Result<(), ImageError> {
        // Always writable here: the runtime still creates mount points in the rootfs, and then
        // remounts it read-only itself when the spec says `root.readonly` (as runc does).
        let mut m = self.prepare(image, container_id, false).await?;
        if let Some(context) = context {
            m.set_selinux_context(context);
        }
        match idmap {
            Some(idmap) => m.mount_idmapped(rootfs, idmap),
            None => m.mount(rootfs),
        }
    }

    async fn mount_volume(
        &self,
        image: &ImageRecord,
        volume_id: &str,
        target: &Path,
    ) -> Result<(), ImageError> {
        self.prepare(image, volume_id, true).await?.mount(target)
    }

    async fn release_rootfs(&self, id: &str, target: &Path) -> Result<(), ImageError> {
        unmount_rootfs(id, target);
        self.cleanup(id).await
    }

    fn writable_dir(&self, container_id: &str) -> PathBuf {
        self.container_dir(container_id)
    }

    fn root(&self) -> &Path {
        ImageStore::root(self)
    }
}

/// Detach container `id`'s rootfs mount at `target`, where it is mounted. The writable layer
/// stays until the container is removed.
/// Mounts stacked at `target` (a container with shared propagation can mount over its own root)
/// come off one at a time, [`UNMOUNT_PASSES`] at most.
pub fn unmount_rootfs(id: &str, target: &Path) {
    for _ in 0..UNMOUNT_PASSES {
        if !is_mountpoint(target) {
            return;
        }
        if let Err(e) = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(id = %id, target = %target.display(), error = %e, "unmounting");
            return;
        }
    }
    tracing::warn!(id = %id, target = %target.display(), "still mounted after {UNMOUNT_PASSES} unmounts");
}

const UNMOUNT_PASSES: usize = 16;

/// Delete `dir` (a container's bundle), unless something is still mounted at or below it: with
/// bidirectional propagation a privileged container's own mounts (a host disk, say) can sit
/// under its rootfs, and deleting through them would delete the mounted files. Then nothing is
/// deleted and the error names the mount. A missing `dir` is fine.
pub fn remove_unmounted(dir: &Path) -> Result<(), String> {
    if let Some(mount) = crishim_images::mounts_under(dir).first() {
        return Err(format!(
            "{} is kept: {} is still mounted below it",
            dir.display(),
            mount.display()
        ));
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("removing {}: {e}", dir.display()))
        }
        _ => Ok(()),
    }
}

pub use crishim_sys::mountinfo::is_mountpoint;

#[cfg(test)]
mod tests {
    use super::{is_mountpoint, remove_unmounted, unmount_rootfs};

    /// A tmpfs mounted below a bundle's rootfs (as a container's own mount propagates back): the
    /// bundle is not deleted, the error names the mount, and the tmpfs's file survives; once it
    /// is unmounted the bundle goes. Stacked mounts on a rootfs all come off.
    #[test]
    fn a_directory_with_a_mount_below_it_is_kept() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let top = tempfile::tempdir().unwrap();
        let bundle = top.path().join("bundle");
        let seen = crishim_sys::testing::in_child_mount_ns(|| {
            use nix::mount::{mount, umount, MsFlags};
            let none: Option<&str> = None;
            let disk = bundle.join("rootfs/mnt/disk");
            std::fs::create_dir_all(&disk).ok()?;
            mount(Some("tmpfs"), &disk, Some("tmpfs"), MsFlags::empty(), none).ok()?;
            std::fs::write(disk.join("precious"), "data").ok()?;
            let refused = remove_unmounted(&bundle);
            let kept = std::fs::read_to_string(disk.join("precious")).ok()? == "data";
            let named = refused
                .as_ref()
                .is_err_and(|e| e.contains(&disk.display().to_string()));
            umount(&disk).ok()?;

            let rootfs = bundle.join("rootfs");
            for _ in 0..3 {
                mount(
                    Some("tmpfs"),
                    &rootfs,
                    Some("tmpfs"),
                    MsFlags::empty(),
                    none,
                )
                .ok()?;
            }
            unmount_rootfs("c1", &rootfs);
            let unstacked = !is_mountpoint(&rootfs);
            Some(vec![
                named,
                kept,
                unstacked,
                remove_unmounted(&bundle).is_ok(),
                !bundle.exists(),
                remove_unmounted(&bundle).is_ok(),
            ])
        });
        assert_eq!(seen, Some(vec![true; 6]));
    }
}
