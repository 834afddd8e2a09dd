//! Host files that are root's alone: the directories under `root_dir` and `state_dir` that hold
//! image content, root filesystems, bundles, records and sockets, and the files that carry a
//! container's environment (records, `config.json`, exec specs). Both the daemon and the shim
//! create them through these helpers, so no umask can make them readable by other users, and
//! there is no moment where a directory exists with a looser mode.

use std::fs::{DirBuilder, OpenOptions, Permissions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Directories: only root may list or enter them.
pub const DIR_MODE: u32 = 0o700;
/// Files holding a container's config or environment: only root may read them.
pub const FILE_MODE: u32 = 0o600;

/// A configuration file the node's admin wrote (a registry's `hosts.toml`, a PEM, an NRI
/// plugin's configuration), read whole up to `max` bytes: a larger one is an `InvalidData`
/// error, "larger than `max` bytes", before more than `max + 1` bytes are held.
pub fn read_capped(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(max.saturating_add(1))
        .read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        ));
    }
    Ok(out)
}

/// Create `path` and any missing parents with mode `mode` (never wider, whatever the umask), then
/// set `path` itself to exactly `mode`, which also tightens a directory that already existed.
pub fn create_dir(path: &Path, mode: u32) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(mode).create(path)?;
    std::fs::set_permissions(path, Permissions::from_mode(mode))
}

/// [`create_dir`] with [`DIR_MODE`].
pub fn create_private_dir(path: &Path) -> std::io::Result<()> {
    create_dir(path, DIR_MODE)
}

/// Write `data` to a new file at `path` created with [`FILE_MODE`] (a file already there is
/// replaced, so an old, looser mode never carries over).
pub fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = create_private_file(path)?;
    f.write_all(data)
}

/// A new file at `path` created with [`FILE_MODE`], for writing; one already there is removed.
pub fn create_private_file(path: &Path) -> std::io::Result<std::fs::File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Clear the bits of `path`'s mode that `mode` does not have (`0o755` with `0o700` gives `0o700`).
/// Symlinks are left alone, never followed. Returns whether the mode changed; a missing path is
/// not an error.
pub fn tighten(path: &Path, mode: u32) -> std::io::Result<bool> {
    let md = match std::fs::symlink_metadata(path) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if md.file_type().is_symlink() {
        return Ok(false);
    }
    let current = md.mode() & 0o7777;
    let tight = current & mode;
    if tight == current {
        return Ok(false);
    }
    std::fs::set_permissions(path, Permissions::from_mode(tight))?;
    Ok(true)
}

/// [`tighten`] `dir` to [`DIR_MODE`] and the regular files directly in it to [`FILE_MODE`];
/// nothing deeper. `report` hears of each path tried.
pub fn tighten_dir_and_files(dir: &Path, mut report: impl FnMut(&Path, std::io::Result<bool>)) {
    report(dir, tighten(dir, DIR_MODE));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_file()) {
            let p = e.path();
            report(&p, tighten(&p, FILE_MODE));
        }
    }
}

/// `fsync` the directory `dir`, so that a rename or a new entry in it survives a crash.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("crishim-hostfs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn capped_reads_take_the_whole_file_up_to_the_cap_and_refuse_more() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, [7u8; 16]).unwrap();
        assert_eq!(read_capped(&p, 16).unwrap(), [7u8; 16]);
        let e = read_capped(&p, 15).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(e.to_string(), "larger than 15 bytes");
        assert_eq!(
            read_capped(&dir.path().join("absent"), 1)
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::NotFound
        );
    }

    #[test]
    fn directories_are_private_whatever_the_umask() {
        let d = tmp("dirs");
        // SAFETY: umask only changes this process's creation mask; restored below.
        let old = unsafe { libc_umask(0) };
        create_private_dir(&d.join("a/b")).unwrap();
        unsafe { libc_umask(old) };
        assert_eq!(mode(&d.join("a")), 0o700, "parents too");
        assert_eq!(mode(&d.join("a/b")), 0o700);
        std::fs::set_permissions(d.join("a/b"), Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&d.join("a/b")).unwrap();
        assert_eq!(
            mode(&d.join("a/b")),
            0o700,
            "an existing directory is tightened"
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn private_files_replace_looser_ones() {
        let d = tmp("files");
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("config.json");
        std::fs::write(&f, b"old").unwrap();
        std::fs::set_permissions(&f, Permissions::from_mode(0o644)).unwrap();
        write_private(&f, b"new").unwrap();
        assert_eq!(mode(&f), 0o600);
        assert_eq!(std::fs::read(&f).unwrap(), b"new");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn tighten_clears_bits_and_leaves_symlinks() {
        let d = tmp("tighten");
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("f");
        std::fs::write(&f, b"").unwrap();
        std::fs::set_permissions(&f, Permissions::from_mode(0o4755)).unwrap();
        assert!(tighten(&f, 0o600).unwrap());
        assert_eq!(mode(&f), 0o600);
        assert!(!tighten(&f, 0o600).unwrap(), "already tight");
        let target = d.join("target");
        std::fs::write(&target, b"").unwrap();
        std::fs::set_permissions(&target, Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&target, d.join("link")).unwrap();
        assert!(!tighten(&d.join("link"), 0o600).unwrap());
        assert_eq!(mode(&target), 0o644, "a symlink's target is never touched");
        assert!(!tighten(&d.join("missing"), 0o600).unwrap());
        std::fs::remove_dir_all(d).unwrap();
    }

    extern "C" {
        #[link_name = "umask"]
        fn libc_umask(mask: u32) -> u32;
    }
}
