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

    /// The directory holding the container's writable layer (`upper/`), for its disk usage.
    fn writable_dir(&self, container_id: &str) -> PathBuf;

    /// Where image content lives, reported as the image filesystem.
    fn root(&self) -> &Path;
}

#[tonic::async_trait]
impl ContainerImages for ImageStore {
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
pub fn unmount_rootfs(id: &str, target: &Path) {
    if is_mountpoint(target) {
        if let Err(e) = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(id = %id, target = %target.display(), error = %e, "unmounting");
        }
    }
}

/// Whether `path` is a mount point of this process's mount namespace: statx's mount-root
/// attribute, not a scan of `/proc/self/mountinfo`, which grows with every pod. Kernels before
/// 5.8 lack the attribute and get the scan.
pub fn is_mountpoint(path: &Path) -> bool {
    match crishim_proto::mountinfo::is_mount_root(path) {
        Some(root) => root,
        None => {
            path.symlink_metadata().is_ok()
                && crishim_proto::mountinfo::read()
                    .iter()
                    .any(|m| m.mount_point == path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_mountpoint;
    use std::path::Path;

    #[test]
    fn mount_points_are_told_from_plain_directories() {
        assert!(is_mountpoint(Path::new("/proc")));
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mountpoint(dir.path()));
        assert!(!is_mountpoint(&dir.path().join("missing")));
    }
}
