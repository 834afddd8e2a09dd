//! Image volumes (KEP-4639): a `Mount` that names an image gets that image's root filesystem,
//! mounted read-only under the container's bundle (`volumes/<n>`) and bound into the container
//! read-only, `nosuid`, `nodev` and `noexec`. `image_sub_path` picks a directory (or file) of the
//! image, resolved inside it: its symlinks cannot lead out. A volume holds its image: RemoveImage
//! refuses while one is mounted.

use std::os::fd::AsRawFd;
use std::path::{Component, Path, PathBuf};

use super::errors::Error;
use crishim_proto::cri;
use crishim_sys::shown::shown;

use super::runtime_service::Inner;
use crishim_spec::{is_image_volume, ImageVolume};

/// The most image volumes one container may mount.
const MAX_IMAGE_VOLUMES: usize = 32;

impl Inner {
    /// Mount every image volume of `config` under `bundle`; what was mounted before a failure is
    /// released by the caller's undo (`release_image_volumes`).
    pub(super) async fn mount_image_volumes(
        &self,
        id: &str,
        config: &cri::ContainerConfig,
        bundle: &Path,
    ) -> Result<Vec<ImageVolume>, Error> {
        let wanted: Vec<&cri::Mount> = config
            .mounts
            .iter()
            .filter(|m| is_image_volume(m))
            .collect();
        if wanted.len() > MAX_IMAGE_VOLUMES {
            return Err(Error::invalid_argument(format!(
                "CreateContainer: {} image volumes, over the limit of {MAX_IMAGE_VOLUMES}",
                wanted.len()
            )));
        }
        let mut volumes = Vec::with_capacity(wanted.len());
        for (n, m) in wanted.into_iter().enumerate() {
            let name = m.image.as_ref().map_or("", |i| i.image.as_str());
            let image = self.images.resolve(name)?.ok_or_else(|| {
                Error::not_found(format!(
                    "CreateContainer: image {:?} of the volume at {} not found: pull it first",
                    shown(name),
                    shown(&m.container_path)
                ))
            })?;
            let target = bundle.join("volumes").join(n.to_string());
            crishim_sys::hostfs::create_private_dir(&target)
                .map_err(|e| Error::internal(format!("creating {}: {e}", target.display())))?;
            self.images
                .mount_volume(&image, &volume_id(id, n), &target)
                .await?;
            let source = resolve_in_root(&target, &m.image_sub_path).map_err(|why| {
                Error::invalid_argument(format!(
                    "CreateContainer: image_sub_path {:?} of the volume at {}: {why}",
                    shown(&m.image_sub_path),
                    shown(&m.container_path)
                ))
            })?;
            volumes.push(ImageVolume {
                container_path: m.container_path.clone(),
                source,
            });
        }
        Ok(volumes)
    }

    /// Unmount and release every image volume of container `id`. Idempotent.
    pub(super) async fn release_image_volumes(&self, id: &str, bundle: &Path) {
        let Ok(entries) = std::fs::read_dir(bundle.join("volumes")) else {
            return;
        };
        for e in entries.flatten() {
            let Some(n) = e.file_name().to_str().and_then(|s| s.parse::<usize>().ok()) else {
                continue;
            };
            if let Err(e) = self
                .images
                .release_rootfs(&volume_id(id, n), &e.path())
                .await
            {
                tracing::warn!(container = %id, volume = n, error = %e, "releasing an image volume");
            }
        }
    }
}

/// The image store's id of a container's `n`th image volume.
fn volume_id(container_id: &str, n: usize) -> String {
    format!("{container_id}-vol{n}")
}

/// `sub` inside `root`, as a path the kernel resolved with `RESOLVE_IN_ROOT` (symlinks,
/// absolute ones included, stay inside `root`). Empty: `root` itself.
fn resolve_in_root(root: &Path, sub: &str) -> Result<PathBuf, String> {
    if sub.is_empty() {
        return Ok(root.to_path_buf());
    }
    let rel = Path::new(sub);
    if rel.is_absolute() || rel.components().any(|c| c == Component::ParentDir) {
        return Err("must be relative and stay inside the image".into());
    }
    let dir = std::fs::File::open(root).map_err(|e| e.to_string())?;
    let fd = crishim_images::unpack::openat2(
        &dir,
        rel,
        libc::O_PATH | libc::O_CLOEXEC,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "does not exist in the image".to_string(),
        _ => e.to_string(),
    })?;
    let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| e.to_string())?;
    // Belt and braces: what the kernel found is under the volume.
    if !path.starts_with(root) {
        return Err("resolves outside the image".into());
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_paths_resolve_inside_the_image_only() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("data/models")).unwrap();
        std::os::unix::fs::symlink("/data", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../../etc", root.join("climb")).unwrap();
        assert_eq!(resolve_in_root(&root, "").unwrap(), root);
        assert_eq!(
            resolve_in_root(&root, "data/models").unwrap(),
            root.join("data/models")
        );
        // An absolute symlink is the image's own /data, not the host's.
        assert_eq!(resolve_in_root(&root, "abs").unwrap(), root.join("data"));
        // A climbing symlink stops at the image's root: the host's /etc is never reached.
        let climbed = resolve_in_root(&root, "climb");
        assert!(
            climbed.as_ref().map_or(true, |p| p.starts_with(&root)),
            "{climbed:?}"
        );
        assert!(resolve_in_root(&root, "../etc").is_err());
        assert!(resolve_in_root(&root, "/etc").is_err());
        assert!(resolve_in_root(&root, "nope")
            .unwrap_err()
            .contains("does not exist"));
    }
}
