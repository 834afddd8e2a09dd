//! The real [`PodFiles`]: the pod's /dev/shm and its hostname, hosts and resolv.conf, each on
//! a bounded tmpfs of its own.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::mount::MsFlags;

use super::PodFiles;
use crate::server::errors::Error;

/// Kubernetes' default pod /dev/shm size.
const SHM_SIZE: &str = "size=65536k";
/// The pod's hostname, hosts and resolv.conf are writable by its containers and live on the
/// node's `/run`: they get a tmpfs of their own, so a container writing them fills this, not the
/// node's `/run`.
const POD_FILES_TMPFS: &str = "mode=0700,size=1m,nr_inodes=16";

/// The real files: tmpfs mounts and files on the node.
pub struct HostPodFiles;

impl PodFiles for HostPodFiles {
    fn mount_shm(&self, dir: &Path) -> Result<(), Error> {
        mount_shm(dir)
    }

    fn unmount_shm(&self, dir: &Path) -> std::io::Result<()> {
        if crate::container_images::is_mountpoint(dir) {
            nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH)?;
        }
        Ok(())
    }

    fn write(&self, dir: &Path, files: &[(&str, String); 3]) -> Result<(), Error> {
        write_pod_files(dir, files)
    }

    fn remove_dir(&self, dir: &Path) -> std::io::Result<()> {
        remove_pod_dir(dir)
    }
}

/// The pod-wide /dev/shm: a tmpfs bind-mounted into each container.
fn mount_shm(dir: &Path) -> Result<(), Error> {
    crishim_sys::hostfs::create_private_dir(dir)
        .map_err(|e| Error::internal(format!("creating {}: {e}", dir.display())))?;
    nix::mount::mount(
        Some("shm"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(format!("mode=1777,{SHM_SIZE}").as_str()),
    )
    .map_err(|e| {
        Error::internal(format!(
            "mounting the pod's /dev/shm at {}: {e}",
            dir.display()
        ))
    })
}

/// The pod files' own bounded tmpfs (see [`POD_FILES_TMPFS`]), at their directory.
fn mount_pod_files(dir: &Path) -> Result<(), Error> {
    nix::mount::mount(
        Some("crishim-pod-files"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(POD_FILES_TMPFS),
    )
    .map_err(|e| {
        Error::internal(format!(
            "mounting the pod files' tmpfs at {}: {e}",
            dir.display()
        ))
    })
}

/// The pod's files on their own tmpfs at `dir`.
fn write_pod_files(dir: &Path, files: &[(&str, String); 3]) -> Result<(), Error> {
    // Bind-mounted into every container, whose non-root users read them: 0644 whatever the umask
    // (the directory holding them is root's alone).
    mount_pod_files(dir)?;
    for (name, data) in files {
        let path = dir.join(name);
        std::fs::write(&path, data)
            .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)))
            .map_err(|e| Error::internal(format!("writing pod {name}: {e}")))?;
    }
    Ok(())
}

/// Remove one of a pod's directories; one that is a mount (the pod files' tmpfs) is detached
/// first. A missing directory is not an error.
fn remove_pod_dir(dir: &Path) -> std::io::Result<()> {
    if crate::container_images::is_mountpoint(dir) {
        nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH).map_err(std::io::Error::from)?;
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
