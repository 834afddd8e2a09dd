//! `subPath` mounts without symlink escapes, the way the kubelet does them: the path is resolved
//! inside its volume with `openat2(RESOLVE_IN_ROOT)`, so a symlink a container planted in the
//! volume (`ln -s / /data/esc`) resolves within the volume, never out of it; the descriptor is then
//! bind-mounted (through `/proc/self/fd/N`, the object itself, not a path that could change) onto
//! a root-only path of the run, which is what the CRI mount names.
//!
//! Layout: `<run_dir>/subpaths/<container>/<attempt>/<mount index>`, unmounted when the attempt's
//! container is removed and, whatever happened, before the run's directory is removed.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::error::WorkflowError;

/// Directory modes of the bind targets: only root walks to them.
const PRIVATE_DIR: u32 = 0o700;

/// Where one attempt's subPath binds live.
pub fn attempt_dir(run_dir: &Path, container: &str, attempt: u32) -> PathBuf {
    subpaths_dir(run_dir)
        .join(container)
        .join(attempt.to_string())
}

fn subpaths_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("subpaths")
}

/// Resolve `sub` inside `volume` and bind it to `<dir>/<index>`; returns that path. A missing
/// subPath is created as a directory, as the kubelet does, each component inside the volume.
pub fn bind(volume: &Path, sub: &str, dir: &Path, index: usize) -> Result<PathBuf, WorkflowError> {
    let fail = |what: &str, e: io::Error| {
        WorkflowError::Setup(format!(
            "subPath {sub:?} of {}: {what}: {e}",
            volume.display()
        ))
    };
    let root = std::fs::File::open(volume).map_err(|e| fail("opening the volume", e))?;
    let source = resolve_or_create(&root, sub).map_err(|e| fail("resolving it", e))?;
    let is_dir = nix::sys::stat::fstat(source.as_raw_fd())
        .map_err(|e| fail("stat", e.into()))?
        .st_mode
        & libc::S_IFMT
        == libc::S_IFDIR;
    create_private_dir(dir).map_err(|e| fail(&format!("creating {}", dir.display()), e))?;
    let target = dir.join(index.to_string());
    // The mount point has the source's type; a bind of a directory onto a file fails.
    let made = if is_dir {
        std::fs::DirBuilder::new().mode(PRIVATE_DIR).create(&target)
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&target)
            .map(drop)
    };
    made.map_err(|e| fail(&format!("creating {}", target.display()), e))?;
    // Not recursive: what is mounted below the subPath in the host's view does not come along,
    // as with the kubelet's subPath binds.
    mount(
        Some(&PathBuf::from(format!(
            "/proc/self/fd/{}",
            source.as_raw_fd()
        ))),
        &target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| fail(&format!("binding it to {}", target.display()), e.into()))?;
    Ok(target)
}

fn create_private_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR)
        .create(dir)
}

/// `sub` of `volume`, resolved inside it, as a directory to read outputs from (nothing created).
pub fn open_dir(volume: &Path, sub: &str) -> io::Result<std::fs::File> {
    let root = std::fs::File::open(volume)?;
    open_in(&root, sub.trim_start_matches('/'), true).map(std::fs::File::from)
}

/// `O_PATH` descriptor of `sub` resolved inside `root`; missing directories are created on the way
/// with `mkdirat` in their parent as resolved (so also inside `root`).
fn resolve_or_create(root: &std::fs::File, sub: &str) -> io::Result<OwnedFd> {
    let mut parent = open_in(root, "", true)?;
    let mut prefix = PathBuf::new();
    let parts: Vec<&str> = sub
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    for (i, part) in parts.iter().enumerate() {
        prefix.push(part);
        let last = i + 1 == parts.len();
        let rel = prefix.to_string_lossy().into_owned();
        let next = match open_in(root, &rel, !last) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                // A dangling symlink makes mkdirat fail with EEXIST, and the open below ENOENT.
                match nix::sys::stat::mkdirat(
                    Some(parent.as_raw_fd()),
                    *part,
                    nix::sys::stat::Mode::from_bits_truncate(0o755),
                ) {
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                open_in(root, &rel, !last)?
            }
            other => other?,
        };
        parent = next;
    }
    Ok(parent)
}

/// openat2(`O_PATH`, `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`) of `rel` in `root`.
fn open_in(root: &std::fs::File, rel: &str, directory: bool) -> io::Result<OwnedFd> {
    let mut flags = libc::O_PATH | libc::O_CLOEXEC;
    if directory {
        flags |= libc::O_DIRECTORY;
    }
    crishim_images::unpack::openat2(
        root,
        Path::new(rel),
        flags,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )
}

/// Unmount every bind under `dir` (deepest first). Errors are returned, not skipped: the caller
/// must not remove a directory that still has a volume mounted below it.
pub fn release(dir: &Path) -> Result<(), String> {
    for m in crishim_images::mounts_under(dir) {
        if let Err(e) = umount2(&m, MntFlags::MNT_DETACH) {
            if e != nix::errno::Errno::EINVAL {
                return Err(format!("unmounting {}: {e}", m.display()));
            }
        }
    }
    let left = crishim_images::mounts_under(dir);
    if !left.is_empty() {
        return Err(format!("still mounted: {left:?}"));
    }
    Ok(())
}

/// [`release`] of every container's subPath binds of the run.
pub fn release_all(run_dir: &Path) -> Result<(), String> {
    release(&subpaths_dir(run_dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_in_the_volume_resolves_inside_it() {
        let vol = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/", vol.path().join("esc")).unwrap();
        std::os::unix::fs::symlink("../../..", vol.path().join("up")).unwrap();
        std::fs::create_dir(vol.path().join("etc")).unwrap();
        let root = std::fs::File::open(vol.path()).unwrap();
        for sub in ["esc", "up", "esc/etc", "up/etc/"] {
            let fd = resolve_or_create(&root, sub).unwrap();
            let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
            assert!(
                real.starts_with(vol.path()),
                "{sub} resolved to {}",
                real.display()
            );
        }
        // A missing path is created inside the volume, also through the symlink.
        let fd = resolve_or_create(&root, "esc/new/dir").unwrap();
        let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert_eq!(real, vol.path().join("new/dir"));
        assert!(!Path::new("/new").exists());
    }

    #[test]
    fn a_dangling_symlink_is_an_error_not_a_directory_elsewhere() {
        let vol = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("made");
        std::os::unix::fs::symlink(&target, vol.path().join("dangling")).unwrap();
        let root = std::fs::File::open(vol.path()).unwrap();
        let fd = resolve_or_create(&root, "dangling");
        assert!(!target.exists(), "created outside the volume");
        // Resolved inside the volume: <vol>/<outside>/made does not exist.
        assert!(fd.is_err());
    }
}
