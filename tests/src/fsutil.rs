//! Filesystem inspection helpers for checking what the daemon wrote.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

/// Every path under `root` (not `root` itself), depth first, without following symlinks.
/// A missing `root` gives an empty list.
pub fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// Paths under `root` whose file name contains `needle`.
pub fn paths_named_like(root: &Path, needle: &str) -> Vec<PathBuf> {
    walk(root)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

/// The names in `dir`; empty when it does not exist.
pub fn dir_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// An extended attribute of `path` itself (not following symlinks).
pub fn lgetxattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = CString::new(path.as_os_str().as_bytes()).ok()?;
    let n = CString::new(name).ok()?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: both strings are NUL-terminated, buf is valid for buf.len() bytes.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return None;
    }
    buf.truncate(r as usize);
    Some(buf)
}

/// `<root_dir>/images/snapshots/*` directories, except the `tmp` staging directory.
pub fn snapshot_dirs(root_dir: &Path) -> Vec<PathBuf> {
    let base = root_dir.join("images/snapshots");
    dir_entries(&base)
        .into_iter()
        .filter(|n| n != "tmp")
        .map(|n| base.join(n))
        .filter(|p| p.is_dir())
        .collect()
}
