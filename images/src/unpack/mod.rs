//! Safe layer unpacking: a tar stream (gzip, zstd or plain) into one layer directory.
//!
//! Every entry is created relative to a directory fd that was opened with `RESOLVE_BENEATH`, so no
//! path, symlink or hardlink in the archive can write outside the layer. Docker whiteouts become
//! overlayfs whiteouts (0/0 character devices and the `trusted.overlay.opaque` xattr).

mod sys;

use std::ffi::{CStr, CString};
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use tar::EntryType;

pub use sys::openat2;
pub(crate) use sys::{open_dir, syncfs};

use crate::digest::{Digest, Hasher};
use crate::error::{ImageError, Result};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
const OPAQUE_XATTR: &[u8] = b"trusted.overlay.opaque";

/// What an unpack produced.
#[derive(Debug)]
pub struct Unpacked {
    /// sha256 of the uncompressed tar stream, to check against the config's `diff_ids`.
    pub diff_id: Digest,
    pub entries: u64,
}

/// Unpack a (possibly compressed) layer stream into the existing, empty directory `dest`.
/// The whole stream is consumed, so a hashing reader underneath sees every byte.
pub fn unpack(reader: impl Read, dest: &Path, layer: &str) -> Result<Unpacked> {
    let hostile = |reason: String| ImageError::HostileLayer {
        layer: layer.to_string(),
        reason,
    };
    let mut buffered = BufReader::with_capacity(256 * 1024, reader);
    let head = buffered.fill_buf().map_err(|e| read_error(layer, e))?;
    let decoder: Box<dyn Read> = match head {
        [0x1f, 0x8b, ..] => Box::new(flate2::bufread::MultiGzDecoder::new(buffered)),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Box::new(
            zstd::stream::read::Decoder::with_buffer(buffered).map_err(|e| read_error(layer, e))?,
        ),
        _ => Box::new(buffered),
    };
    let mut hashed = HashingReader {
        inner: decoder,
        hasher: Hasher::default(),
    };
    let root = sys::open_dir(dest)
        .map_err(|e| ImageError::io(format!("opening {}", dest.display()), e))?;
    let mut state = Extractor {
        root,
        layer,
        dirs: Vec::new(),
        entries: 0,
    };
    {
        let mut archive = tar::Archive::new(&mut hashed);
        for entry in archive.entries().map_err(|e| read_error(layer, e))? {
            let mut entry = entry.map_err(|e| read_error(layer, e))?;
            state.entry(&mut entry).map_err(|e| match e {
                EntryError::Hostile(reason) => hostile(reason),
                EntryError::Io(what, e) => {
                    if is_read_error(&e) {
                        read_error(layer, e)
                    } else {
                        ImageError::io(format!("layer {layer}: {what}"), e)
                    }
                }
            })?;
        }
    }
    // Trailing padding after the end-of-archive blocks still belongs to the diff ID.
    io::copy(&mut hashed, &mut io::sink()).map_err(|e| read_error(layer, e))?;
    state.finish_dirs();
    Ok(Unpacked {
        diff_id: hashed.hasher.finish(),
        entries: state.entries,
    })
}

fn is_read_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidData | io::ErrorKind::Other
    ) && e.raw_os_error().is_none()
}

/// Errors from the stream itself: a cut or corrupt archive, or a failed download underneath.
fn read_error(layer: &str, e: io::Error) -> ImageError {
    // The download side reports its own error through the reader; keep it intact.
    if let Some(inner) = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<crate::error::StreamAborted>())
    {
        return inner
            .0
            .lock()
            .unwrap()
            .take()
            .unwrap_or_else(|| ImageError::BadContent(format!("layer {layer}: download aborted")));
    }
    match e.kind() {
        io::ErrorKind::UnexpectedEof => ImageError::HostileLayer {
            layer: layer.to_string(),
            reason: "layer stream is truncated (unexpected end of data)".into(),
        },
        _ => ImageError::HostileLayer {
            layer: layer.to_string(),
            reason: format!("malformed layer stream: {e}"),
        },
    }
}

struct HashingReader<R> {
    inner: R,
    hasher: Hasher,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

enum EntryError {
    Hostile(String),
    Io(String, io::Error),
}

trait Ctx<T> {
    fn at(self, what: impl FnOnce() -> String) -> Result<T, EntryError>;
}

impl<T> Ctx<T> for io::Result<T> {
    fn at(self, what: impl FnOnce() -> String) -> Result<T, EntryError> {
        self.map_err(|e| match e.raw_os_error() {
            Some(libc::EXDEV) | Some(libc::ELOOP) => {
                EntryError::Hostile(format!("{} escapes the layer through a symlink", what()))
            }
            _ => EntryError::Io(what(), e),
        })
    }
}

struct Extractor<'a> {
    root: OwnedFd,
    layer: &'a str,
    /// Directories and their mtimes, applied last because creating children changes them.
    dirs: Vec<(PathBuf, i64)>,
    entries: u64,
}

/// Split an archive path into clean components, refusing any `..`.
fn clean_path(raw: &[u8], what: &str) -> Result<Vec<Vec<u8>>, EntryError> {
    let mut out = Vec::new();
    for comp in raw.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                return Err(EntryError::Hostile(format!(
                    "{what} {:?} contains '..' and escapes the layer",
                    String::from_utf8_lossy(raw)
                )))
            }
            c => out.push(c.to_vec()),
        }
    }
    Ok(out)
}

fn join(components: &[Vec<u8>]) -> PathBuf {
    PathBuf::from(std::ffi::OsStr::from_bytes(&components.join(&b'/')))
}

fn c(name: &[u8]) -> Result<CString, EntryError> {
    CString::new(name).map_err(|_| EntryError::Hostile("entry name contains a NUL byte".into()))
}

impl Extractor<'_> {
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), EntryError> {
        self.entries += 1;
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let comps = clean_path(&raw, "entry")?;
        let Some((name, parent)) = comps.split_last() else {
            return Ok(()); // the layer root itself ("./"): its directory already exists
        };
        let kind = entry.header().entry_type();
        let parent_path = join(parent);
        let dir = self.ensure_dir(parent)?;

        if name.as_slice() == OPAQUE_MARKER {
            return sys::lsetxattrat(&dir, c(b".")?.as_c_str(), OPAQUE_XATTR, b"y")
                .at(|| format!("marking {} opaque", parent_path.display()));
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            let cname = c(hidden)?;
            self.remove_existing(&dir, &cname, &shown)?;
            return sys::mknodat(&dir, &cname, libc::S_IFCHR, 0, 0)
                .at(|| format!("whiteout {shown:?}"));
        }

        let cname = c(name)?;
        let header = entry.header();
        let mode = header
            .mode()
            .map_err(|e| EntryError::Io(format!("mode of {shown:?}"), e))?
            & 0o7777;
        let uid = header
            .uid()
            .map_err(|e| EntryError::Io(format!("uid of {shown:?}"), e))? as u32;
        let gid = header
            .gid()
            .map_err(|e| EntryError::Io(format!("gid of {shown:?}"), e))? as u32;
        let mtime = header.mtime().unwrap_or(0) as i64;

        match kind {
            EntryType::Directory => {
                match sys::lstatat(&dir, &cname) {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
                    Ok(_) => {
                        self.remove_existing(&dir, &cname, &shown)?;
                        sys::mkdirat(&dir, &cname, 0o700)
                            .at(|| format!("creating directory {shown:?}"))?;
                    }
                    Err(_) => sys::mkdirat(&dir, &cname, 0o700)
                        .at(|| format!("creating directory {shown:?}"))?,
                }
                self.dirs
                    .push((parent_path.join(std::ffi::OsStr::from_bytes(name)), mtime));
            }
            EntryType::Regular | EntryType::Continuous => {
                self.remove_existing(&dir, &cname, &shown)?;
                let mut file =
                    sys::create_file(&dir, &cname).at(|| format!("creating {shown:?}"))?;
                let expected = entry.size();
                let copied = io::copy(entry, &mut file)
                    .map_err(|e| EntryError::Io(format!("writing {shown:?}"), e))?;
                if copied != expected {
                    return Err(EntryError::Io(
                        format!("writing {shown:?}"),
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("{shown:?} has {copied} of its {expected} bytes: layer stream is truncated"),
                        ),
                    ));
                }
            }
            EntryType::Symlink => {
                let target = entry.link_name_bytes().ok_or_else(|| {
                    EntryError::Hostile(format!("symlink {shown:?} has no target"))
                })?;
                self.remove_existing(&dir, &cname, &shown)?;
                sys::symlinkat(&c(&target)?, &dir, &cname).at(|| format!("symlink {shown:?}"))?;
            }
            EntryType::Link => {
                let target = entry.link_name_bytes().ok_or_else(|| {
                    EntryError::Hostile(format!("hardlink {shown:?} has no target"))
                })?;
                let tcomps = clean_path(&target, "hardlink target")?;
                let Some((tname, tparent)) = tcomps.split_last() else {
                    return Err(EntryError::Hostile(format!(
                        "hardlink {shown:?} points at the layer root"
                    )));
                };
                let not_in_layer = || {
                    EntryError::Hostile(format!(
                        "hardlink {shown:?} -> {:?}: the target is not a file in this layer",
                        String::from_utf8_lossy(&target)
                    ))
                };
                let tdir = match sys::open_dir_beneath(&self.root, &join(tparent)) {
                    Ok(d) => d,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Err(not_in_layer()),
                    Err(e) => return Err(e).at(|| format!("hardlink {shown:?} target")),
                };
                let tname = c(tname)?;
                match sys::lstatat(&tdir, &tname) {
                    Ok(st) if st.st_mode & libc::S_IFMT != libc::S_IFDIR => {}
                    _ => return Err(not_in_layer()),
                }
                self.remove_existing(&dir, &cname, &shown)?;
                return sys::linkat(&tdir, &tname, &dir, &cname)
                    .at(|| format!("hardlink {shown:?}"));
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let fmt = match kind {
                    EntryType::Char => libc::S_IFCHR,
                    EntryType::Block => libc::S_IFBLK,
                    _ => libc::S_IFIFO,
                };
                let major = header.device_major().ok().flatten().unwrap_or(0);
                let minor = header.device_minor().ok().flatten().unwrap_or(0);
                self.remove_existing(&dir, &cname, &shown)?;
                sys::mknodat(&dir, &cname, fmt | mode, major, minor)
                    .at(|| format!("device {shown:?}"))?;
            }
            other => {
                tracing::debug!(layer = self.layer, entry = %shown, kind = ?other, "skipping unsupported tar entry");
                return Ok(());
            }
        }

        // Ownership before mode: chown clears set-id bits.
        sys::lchownat(&dir, &cname, uid, gid).at(|| format!("chown {shown:?}"))?;
        if kind != EntryType::Symlink {
            sys::chmodat(&dir, &cname, mode).at(|| format!("chmod {shown:?}"))?;
        }
        if let Some(exts) = entry
            .pax_extensions()
            .map_err(|e| EntryError::Io(format!("pax headers of {shown:?}"), e))?
        {
            for ext in exts.flatten() {
                if let Some(key) = ext.key_bytes().strip_prefix(b"SCHILY.xattr.") {
                    sys::lsetxattrat(&dir, &cname, key, ext.value_bytes())
                        .at(|| format!("xattr {} on {shown:?}", String::from_utf8_lossy(key)))?;
                }
            }
        }
        if kind != EntryType::Directory {
            sys::lutimesat(&dir, &cname, mtime).at(|| format!("mtime of {shown:?}"))?;
        }
        Ok(())
    }

    /// Open (creating as needed) the directory at `comps`, never leaving the layer.
    fn ensure_dir(&self, comps: &[Vec<u8>]) -> Result<OwnedFd, EntryError> {
        let path = join(comps);
        match sys::open_dir_beneath(&self.root, &path) {
            Ok(fd) => return Ok(fd),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => {
                return Err(e).at(|| format!("parent directory {:?}", path.display().to_string()))
            }
        }
        let mut fd = sys::open_dir_beneath(&self.root, Path::new("")).at(|| "layer root".into())?;
        for (i, comp) in comps.iter().enumerate() {
            let prefix = join(&comps[..=i]);
            match sys::open_dir_beneath(&self.root, &prefix) {
                Ok(next) => fd = next,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    let name = c(comp)?;
                    sys::mkdirat(&fd, &name, 0o755)
                        .at(|| format!("creating directory {:?}", prefix.display().to_string()))?;
                    fd = sys::open_dir_beneath(&self.root, &prefix)
                        .at(|| format!("directory {:?}", prefix.display().to_string()))?;
                }
                Err(e) => {
                    return Err(e)
                        .at(|| format!("parent directory {:?}", prefix.display().to_string()))
                }
            }
        }
        Ok(fd)
    }

    /// Tar semantics: a later entry replaces an earlier one of the same name.
    fn remove_existing(&self, dir: &OwnedFd, name: &CStr, shown: &str) -> Result<(), EntryError> {
        match sys::lstatat(dir, name) {
            Err(_) => Ok(()),
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => sys::unlinkat(dir, name, true)
                .at(|| format!("replacing directory {shown:?} (it must be empty)")),
            Ok(_) => sys::unlinkat(dir, name, false).at(|| format!("replacing {shown:?}")),
        }
    }

    fn finish_dirs(&mut self) {
        // Deepest first, so setting a child's mtime does not disturb its parent's afterwards.
        for (path, mtime) in self.dirs.drain(..).rev() {
            let (parent, name) = match (path.parent(), path.file_name()) {
                (Some(p), Some(n)) => (p.to_path_buf(), n.as_bytes().to_vec()),
                _ => continue,
            };
            if let (Ok(dir), Ok(name)) = (
                sys::open_dir_beneath(&self.root, &parent),
                CString::new(name),
            ) {
                let _ = sys::lutimesat(&dir, &name, mtime);
            }
        }
    }
}

#[cfg(test)]
mod tests;
