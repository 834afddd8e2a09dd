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
use crate::error::{ImageError, Result, StreamAborted};
use crate::limits::Budget;
use crishim_sys::shown::{shown, shown_bytes};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
const OPAQUE_XATTR: &[u8] = b"trusted.overlay.opaque";

/// Tar extension headers (GNU long names and links, PAX local and global headers) are read into
/// memory, so their size is checked against this cap before a byte of them is read. Go's
/// `archive/tar` uses the same 1 MiB.
pub const MAX_EXTENSION_HEADER: u64 = 1 << 20;

/// zstd frames may ask for a window of up to 2 GiB; refuse those over 32 MiB (zstd's levels up to
/// 19 use at most 8 MiB), so one layer's decoder stays within the daemon's memory budget.
const ZSTD_WINDOW_LOG_MAX: u32 = 25;

/// A zstd decoder of `input` whose frames may ask for a window of at most
/// 2^[`ZSTD_WINDOW_LOG_MAX`] bytes: what reads a layer's (or a lazy layer's chunk's) zstd.
pub fn zstd_decoder<'a, R: BufRead + 'a>(
    input: R,
) -> io::Result<zstd::stream::read::Decoder<'a, R>> {
    let mut d = zstd::stream::read::Decoder::with_buffer(input)?;
    d.window_log_max(ZSTD_WINDOW_LOG_MAX)?;
    Ok(d)
}

/// Directory paths kept for restoring mtimes at the end; past this, later directories keep the
/// time of the unpack rather than let a layer of a million directories grow this list.
const MAX_DEFERRED_DIR_BYTES: usize = 16 << 20;

/// What an unpack produced.
#[derive(Debug)]
pub struct Unpacked {
    /// sha256 of the uncompressed tar stream, to check against the config's `diff_ids`.
    pub diff_id: Digest,
    pub entries: u64,
    /// Extended attributes the layer carried that were not applied (see [`layer_xattr_allowed`]).
    pub dropped_xattrs: u64,
}

/// Unpack a (possibly compressed) layer stream into the existing, empty directory `dest`, with no
/// limits but the fixed caps on extension headers. See [`unpack_with`].
pub fn unpack(reader: impl Read, dest: &Path, layer: &str) -> Result<Unpacked> {
    unpack_with(reader, dest, layer, &Budget::unlimited())
}

/// Unpack a (possibly compressed) layer stream into the existing, empty directory `dest`, counting
/// its uncompressed bytes and entries against `budget`, which also checks the free space of
/// `dest`'s filesystem as it goes. The whole stream is consumed, so a hashing reader underneath
/// sees every byte.
pub fn unpack_with(
    reader: impl Read,
    dest: &Path,
    layer: &str,
    budget: &Budget,
) -> Result<Unpacked> {
    let hostile = |reason: String| ImageError::HostileLayer {
        layer: layer.to_string(),
        reason,
    };
    let root = sys::open_dir(dest)
        .map_err(|e| ImageError::io(format!("opening {}", dest.display()), e))?;
    let mut buffered = BufReader::with_capacity(256 * 1024, reader);
    let head = buffered.fill_buf().map_err(|e| read_error(layer, e))?;
    let decoder: Box<dyn Read> = match head {
        [0x1f, 0x8b, ..] => Box::new(flate2::bufread::MultiGzDecoder::new(buffered)),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => {
            Box::new(zstd_decoder(buffered).map_err(|e| read_error(layer, e))?)
        }
        _ => Box::new(buffered),
    };
    let mut hashed = HashingReader {
        inner: decoder,
        hasher: Hasher::default(),
        budget,
        fs: &root,
    };
    let mut state = Extractor {
        root: root.try_clone().map_err(|e| ImageError::io("dup", e))?,
        layer,
        dirs: Vec::new(),
        dir_bytes: 0,
        entries: 0,
        dropped_xattrs: 0,
    };
    {
        let mut archive = tar::Archive::new(&mut hashed);
        // Raw entries: extension headers come to us unread, so we cap them before reading them.
        let entries = archive
            .entries()
            .map_err(|e| read_error(layer, e))?
            .raw(true);
        let mut ext = Extensions::default();
        for entry in entries {
            let mut entry = entry.map_err(|e| read_error(layer, e))?;
            budget.add_entry(&state.root)?;
            let kind = entry.header().entry_type();
            if let Some(what) = extension_kind(kind) {
                ext.read(&mut entry, kind, what)
                    .map_err(|e| entry_error(layer, e))?;
                continue;
            }
            if kind == EntryType::GNUSparse {
                return Err(hostile("GNU sparse entries are not supported".into()));
            }
            let meta = std::mem::take(&mut ext)
                .resolve(entry.header())
                .map_err(hostile)?;
            state
                .entry(&mut entry, &meta, budget)
                .map_err(|e| entry_error(layer, e))?;
        }
        if !ext.is_empty() {
            return Err(hostile(
                "extension headers at the end of the archive describe no entry".into(),
            ));
        }
    }
    // Trailing padding after the end-of-archive blocks still belongs to the diff ID.
    io::copy(&mut hashed, &mut io::sink()).map_err(|e| read_error(layer, e))?;
    state.finish_dirs();
    // The last few MiB since the previous check.
    budget.check_free_space(&state.root, 0)?;
    if state.dropped_xattrs > 0 {
        tracing::info!(
            layer,
            dropped = state.dropped_xattrs,
            "extended attributes outside user.*, security.capability and POSIX ACLs were not applied"
        );
    }
    Ok(Unpacked {
        diff_id: hashed.hasher.finish(),
        entries: state.entries,
        dropped_xattrs: state.dropped_xattrs,
    })
}

/// The extension header kinds, named for messages; `None` for an ordinary entry.
fn extension_kind(kind: EntryType) -> Option<&'static str> {
    match kind {
        EntryType::GNULongName => Some("GNU long name"),
        EntryType::GNULongLink => Some("GNU long link"),
        EntryType::XHeader => Some("PAX"),
        EntryType::XGlobalHeader => Some("PAX global"),
        _ => None,
    }
}

/// Extension headers seen since the last entry; they describe the next one.
#[derive(Default)]
struct Extensions {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
}

/// An entry's names and PAX records, resolved from its header and the extensions before it.
struct EntryMeta {
    path: Vec<u8>,
    link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
    uid: Option<u64>,
    gid: Option<u64>,
}

impl Extensions {
    fn is_empty(&self) -> bool {
        self.long_name.is_none() && self.long_link.is_none() && self.pax.is_none()
    }

    /// Read one extension header's body, refusing it before reading when it is over the cap.
    fn read<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        kind: EntryType,
        what: &str,
    ) -> Result<(), EntryError> {
        let size = entry.size();
        if size > MAX_EXTENSION_HEADER {
            return Err(EntryError::Hostile(format!(
                "{what} header of {size} bytes is over the {MAX_EXTENSION_HEADER} byte cap"
            )));
        }
        if kind == EntryType::XGlobalHeader {
            // Global records (Go writes none that matter here) are skipped unread by the archive.
            return Ok(());
        }
        let slot = match kind {
            EntryType::GNULongName => &mut self.long_name,
            EntryType::GNULongLink => &mut self.long_link,
            _ => &mut self.pax,
        };
        if slot.is_some() {
            return Err(EntryError::Hostile(format!(
                "two {what} headers describe the same entry"
            )));
        }
        let mut body = Vec::with_capacity(size as usize);
        entry
            .take(MAX_EXTENSION_HEADER)
            .read_to_end(&mut body)
            .map_err(|e| EntryError::Io(format!("{what} header"), e))?;
        if (body.len() as u64) < size {
            return Err(EntryError::Io(
                format!("{what} header"),
                io::Error::new(io::ErrorKind::UnexpectedEof, "truncated extension header"),
            ));
        }
        *slot = Some(body);
        Ok(())
    }

    /// Names as GNU tar and Go resolve them: a long name or PAX `path` over the header's field.
    fn resolve(self, header: &tar::Header) -> Result<EntryMeta, String> {
        let trim = |mut v: Vec<u8>| {
            while v.last() == Some(&0) {
                v.pop();
            }
            v
        };
        let mut meta = EntryMeta {
            path: header.path_bytes().into_owned(),
            link: header.link_name_bytes().map(|l| l.into_owned()),
            pax: None,
            uid: None,
            gid: None,
        };
        if let Some(pax) = &self.pax {
            for record in tar::PaxExtensions::new(pax) {
                let record = record.map_err(|e| format!("malformed PAX header: {e}"))?;
                let number = || {
                    record
                        .value()
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                        .ok_or_else(|| {
                            format!(
                                "PAX record {} is not a number",
                                shown_bytes(record.key_bytes())
                            )
                        })
                };
                match record.key_bytes() {
                    b"path" => meta.path = record.value_bytes().to_vec(),
                    b"linkpath" => meta.link = Some(record.value_bytes().to_vec()),
                    b"uid" => meta.uid = Some(number()?),
                    b"gid" => meta.gid = Some(number()?),
                    // The archive is framed by the header's size; a different PAX size would make
                    // this parser and others see different entries.
                    b"size" if Some(number()?) != header.entry_size().ok() => return Err(
                        "a PAX size record that differs from the header's size is not supported"
                            .into(),
                    ),
                    _ => {}
                }
            }
        }
        if let Some(name) = self.long_name {
            meta.path = trim(name);
        }
        if let Some(link) = self.long_link {
            meta.link = Some(trim(link));
        }
        meta.pax = self.pax;
        Ok(meta)
    }
}

fn entry_error(layer: &str, e: EntryError) -> ImageError {
    match e {
        EntryError::Fatal(e) => e,
        EntryError::Hostile(reason) => ImageError::HostileLayer {
            layer: layer.to_string(),
            reason,
        },
        EntryError::Io(_, e) if is_read_error(&e) => read_error(layer, e),
        EntryError::Io(what, e) => ImageError::io(format!("layer {layer}: {what}"), e),
    }
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
    if let Some(inner) = e.get_ref().and_then(|i| i.downcast_ref::<StreamAborted>()) {
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
            // The tar crate's messages quote entry names.
            reason: format!("malformed layer stream: {}", shown(&e.to_string())),
        },
    }
}

/// Hashes the uncompressed stream and counts it against the pull's budget.
struct HashingReader<'b, R> {
    inner: R,
    hasher: Hasher,
    budget: &'b Budget,
    fs: &'b OwnedFd,
}

impl<R: Read> Read for HashingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.budget
            .add_bytes(n as u64, self.fs)
            .map_err(|e| io::Error::other(StreamAborted(std::sync::Mutex::new(Some(e)))))?;
        Ok(n)
    }
}

enum EntryError {
    Hostile(String),
    Io(String, io::Error),
    /// Passed through as is (a limit of the pull's budget).
    Fatal(ImageError),
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
    dir_bytes: usize,
    entries: u64,
    dropped_xattrs: u64,
}

/// The extended attributes a layer may set: `user.*`, file capabilities and POSIX ACLs. Never
/// `trusted.*`: `trusted.overlay.*` (redirect, metacopy, origin, opaque, upper) steer the node's
/// overlayfs, and a redirect would send lookups out of the layer; the opaque marker comes from a
/// `.wh..wh..opq` entry alone, set by the unpacker itself. Nor the other `security.*` (SELinux
/// labels are the runtime's to set, IMA/EVM the node's).
pub fn layer_xattr_allowed(key: &[u8]) -> bool {
    key.starts_with(b"user.")
        || matches!(
            key,
            b"security.capability" | b"system.posix_acl_access" | b"system.posix_acl_default"
        )
}

/// Split an archive path into clean components, refusing any `..`.
fn clean_path(raw: &[u8], what: &str) -> Result<Vec<Vec<u8>>, EntryError> {
    let mut out = Vec::new();
    for comp in raw.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                return Err(EntryError::Hostile(format!(
                    "{what} \"{}\" contains '..' and escapes the layer",
                    shown_bytes(raw)
                )))
            }
            c => out.push(c.to_vec()),
        }
    }
    Ok(out)
}

fn shown_path(p: &Path) -> String {
    shown_bytes(p.as_os_str().as_bytes())
}

fn join(components: &[Vec<u8>]) -> PathBuf {
    PathBuf::from(std::ffi::OsStr::from_bytes(&components.join(&b'/')))
}

fn c(name: &[u8]) -> Result<CString, EntryError> {
    CString::new(name).map_err(|_| EntryError::Hostile("entry name contains a NUL byte".into()))
}

impl Extractor<'_> {
    fn entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        meta: &EntryMeta,
        budget: &Budget,
    ) -> Result<(), EntryError> {
        self.entries += 1;
        let raw = &meta.path;
        let shown = shown_bytes(raw);
        let comps = clean_path(raw, "entry")?;
        let Some((name, parent)) = comps.split_last() else {
            return Ok(()); // the layer root itself ("./"): its directory already exists
        };
        let kind = entry.header().entry_type();
        let parent_path = join(parent);
        let dir = self.ensure_dir(parent)?;

        if name.as_slice() == OPAQUE_MARKER {
            return sys::lsetxattrat(&dir, c(b".")?.as_c_str(), OPAQUE_XATTR, b"y").at(|| {
                format!(
                    "marking \"{}\" opaque",
                    shown_bytes(parent_path.as_os_str().as_bytes())
                )
            });
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            let cname = c(hidden)?;
            self.remove_existing(&dir, &cname, &shown)?;
            return sys::mknodat(&dir, &cname, libc::S_IFCHR, 0, 0)
                .at(|| format!("whiteout \"{shown}\""));
        }

        let cname = c(name)?;
        let header = entry.header();
        let mode = header
            .mode()
            .map_err(|e| EntryError::Io(format!("mode of \"{shown}\""), e))?
            & 0o7777;
        let id = |pax: Option<u64>, field: io::Result<u64>, what: &str| {
            let v = match pax {
                Some(v) => v,
                None => field.map_err(|e| EntryError::Io(format!("{what} of \"{shown}\""), e))?,
            };
            // Truncating would turn uid 2^32 into root.
            u32::try_from(v).map_err(|_| {
                EntryError::Hostile(format!("{what} {v} of \"{shown}\" is out of range"))
            })
        };
        let uid = id(meta.uid, header.uid(), "uid")?;
        let gid = id(meta.gid, header.gid(), "gid")?;
        let mtime = header.mtime().unwrap_or(0) as i64;

        match kind {
            EntryType::Directory => {
                match sys::lstatat(&dir, &cname) {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
                    Ok(_) => {
                        self.remove_existing(&dir, &cname, &shown)?;
                        sys::mkdirat(&dir, &cname, 0o700)
                            .at(|| format!("creating directory \"{shown}\""))?;
                    }
                    Err(_) => sys::mkdirat(&dir, &cname, 0o700)
                        .at(|| format!("creating directory \"{shown}\""))?,
                }
                let path = parent_path.join(std::ffi::OsStr::from_bytes(name));
                if self.dir_bytes + path.as_os_str().len() <= MAX_DEFERRED_DIR_BYTES {
                    self.dir_bytes += path.as_os_str().len();
                    self.dirs.push((path, mtime));
                }
            }
            EntryType::Regular | EntryType::Continuous => {
                budget.fits(entry.size()).map_err(EntryError::Fatal)?;
                self.remove_existing(&dir, &cname, &shown)?;
                let mut file =
                    sys::create_file(&dir, &cname).at(|| format!("creating \"{shown}\""))?;
                let expected = entry.size();
                let copied = io::copy(entry, &mut file)
                    .map_err(|e| EntryError::Io(format!("writing \"{shown}\""), e))?;
                if copied != expected {
                    return Err(EntryError::Io(
                        format!("writing \"{shown}\""),
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("\"{shown}\" has {copied} of its {expected} bytes: layer stream is truncated"),
                        ),
                    ));
                }
            }
            EntryType::Symlink => {
                let target = meta.link.as_deref().ok_or_else(|| {
                    EntryError::Hostile(format!("symlink \"{shown}\" has no target"))
                })?;
                self.remove_existing(&dir, &cname, &shown)?;
                sys::symlinkat(&c(target)?, &dir, &cname).at(|| format!("symlink \"{shown}\""))?;
            }
            EntryType::Link => {
                let target = meta.link.as_deref().ok_or_else(|| {
                    EntryError::Hostile(format!("hardlink \"{shown}\" has no target"))
                })?;
                let tcomps = clean_path(target, "hardlink target")?;
                let Some((tname, tparent)) = tcomps.split_last() else {
                    return Err(EntryError::Hostile(format!(
                        "hardlink \"{shown}\" points at the layer root"
                    )));
                };
                let not_in_layer = || {
                    EntryError::Hostile(format!(
                        "hardlink \"{shown}\" -> \"{}\": the target is not a file in this layer",
                        shown_bytes(target)
                    ))
                };
                let tdir = match sys::open_dir_beneath(&self.root, &join(tparent)) {
                    Ok(d) => d,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Err(not_in_layer()),
                    Err(e) => return Err(e).at(|| format!("hardlink \"{shown}\" target")),
                };
                let tname = c(tname)?;
                match sys::lstatat(&tdir, &tname) {
                    Ok(st) if st.st_mode & libc::S_IFMT != libc::S_IFDIR => {}
                    _ => return Err(not_in_layer()),
                }
                self.remove_existing(&dir, &cname, &shown)?;
                return sys::linkat(&tdir, &tname, &dir, &cname)
                    .at(|| format!("hardlink \"{shown}\""));
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
                    .at(|| format!("device \"{shown}\""))?;
            }
            other => {
                tracing::debug!(layer = self.layer, entry = %shown, kind = ?other, "skipping unsupported tar entry");
                return Ok(());
            }
        }

        // Ownership before mode: chown clears set-id bits.
        sys::lchownat(&dir, &cname, uid, gid).at(|| format!("chown \"{shown}\""))?;
        if kind != EntryType::Symlink {
            sys::chmodat(&dir, &cname, mode).at(|| format!("chmod \"{shown}\""))?;
        }
        if let Some(pax) = &meta.pax {
            for ext in tar::PaxExtensions::new(pax).flatten() {
                if let Some(key) = ext.key_bytes().strip_prefix(b"SCHILY.xattr.") {
                    if !layer_xattr_allowed(key) {
                        self.dropped_xattrs += 1;
                        tracing::debug!(
                            layer = self.layer,
                            entry = %shown,
                            xattr = %shown_bytes(key),
                            "not applying a layer's extended attribute"
                        );
                        continue;
                    }
                    sys::lsetxattrat(&dir, &cname, key, ext.value_bytes())
                        .at(|| format!("xattr \"{}\" on \"{shown}\"", shown_bytes(key)))?;
                }
            }
        }
        if kind != EntryType::Directory {
            sys::lutimesat(&dir, &cname, mtime).at(|| format!("mtime of \"{shown}\""))?;
        }
        Ok(())
    }

    /// Open (creating as needed) the directory at `comps`, never leaving the layer.
    fn ensure_dir(&self, comps: &[Vec<u8>]) -> Result<OwnedFd, EntryError> {
        let path = join(comps);
        match sys::open_dir_beneath(&self.root, &path) {
            Ok(fd) => return Ok(fd),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e).at(|| format!("parent directory \"{}\"", shown_path(&path))),
        }
        let mut fd = sys::open_dir_beneath(&self.root, Path::new("")).at(|| "layer root".into())?;
        for (i, comp) in comps.iter().enumerate() {
            let prefix = join(&comps[..=i]);
            match sys::open_dir_beneath(&self.root, &prefix) {
                Ok(next) => fd = next,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    let name = c(comp)?;
                    sys::mkdirat(&fd, &name, 0o755)
                        .at(|| format!("creating directory \"{}\"", shown_path(&prefix)))?;
                    fd = sys::open_dir_beneath(&self.root, &prefix)
                        .at(|| format!("directory \"{}\"", shown_path(&prefix)))?;
                }
                Err(e) => {
                    return Err(e).at(|| format!("parent directory \"{}\"", shown_path(&prefix)))
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
                .at(|| format!("replacing directory \"{shown}\" (it must be empty)")),
            Ok(_) => sys::unlinkat(dir, name, false).at(|| format!("replacing \"{shown}\"")),
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
