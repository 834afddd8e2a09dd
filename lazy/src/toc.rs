//! The TOC both formats share (the CRFS `stargz.index.json` shape: `{"version": 1, "entries":
//! [...]}`), checked and turned into a layer's entries.
//!
//! What is refused, with the entry named: a TOC over [`Limits`]; an unknown version or entry type;
//! a path or hard-link target with `..` or a NUL; a data chunk without a `sha256:` digest, outside
//! the blob's data, or out of order within its file; chunks that do not add up to their file's
//! size; a `chunk` entry that follows no regular file of its name. Xattrs a layer may not set
//! (`trusted.*`, most of `security.*`) are dropped and counted, as the unpacker drops them.

use std::collections::HashMap;

use base64::Engine as _;
use serde::Deserialize;

use crate::is_sha256;

/// Which format a TOC came from: their chunk entries differ in how a chunk's compressed end is
/// known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A chunk's gzip member ends where the next one (or the TOC) starts.
    Estargz,
    /// A chunk's zstd frames end at its `endOffset`.
    ZstdChunked,
}

/// Bounds on a TOC. The defaults hold any real image: a CUDA image's layer has some 100,000
/// entries and a TOC of a few tens of MiB.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of TOC JSON (uncompressed).
    pub toc_bytes: u64,
    pub entries: usize,
    /// Bytes of a name or link target.
    pub name_bytes: usize,
    /// Bytes of an entry's xattrs, names and decoded values together.
    pub xattr_bytes: usize,
    /// Uncompressed bytes of one chunk: what one read may make the runtime fetch and hold.
    pub chunk_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            toc_bytes: 64 << 20,
            entries: 1 << 20,
            name_bytes: 4096,
            xattr_bytes: 64 << 10,
            chunk_bytes: 64 << 20,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TocError {
    #[error("the TOC is {got} bytes, over the {limit}-byte limit")]
    TooBig { got: u64, limit: u64 },
    #[error("the TOC has over {limit} entries")]
    TooManyEntries { limit: usize },
    #[error("the TOC is not valid JSON: {0}")]
    Json(String),
    #[error("TOC version {0} is not 1")]
    Version(i64),
    #[error("TOC entry {index} ({name:?}): {why}")]
    Entry {
        index: usize,
        name: String,
        why: String,
    },
}

/// One regular file's piece: `size` bytes at `file_offset` of the file, held compressed at
/// `compressed` of the blob (from `inner_offset` bytes into what decompresses there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub file_offset: u64,
    pub size: u64,
    /// Where its compressed bytes start and end in the blob; the end is the next chunk's start
    /// for eStargz, set by [`Toc::parse`] from every chunk's offset and the TOC's.
    pub compressed: std::ops::Range<u64>,
    pub inner_offset: u64,
    /// What its uncompressed bytes must hash to; `None` only for a chunk of zeros.
    pub digest: Option<String>,
    /// A hole: zeros, nothing to fetch (zstd:chunked's `chunkType: "zeros"`).
    pub zeros: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File {
        size: u64,
        /// The whole file's digest, where the TOC gives one.
        digest: Option<String>,
        chunks: Vec<Chunk>,
    },
    Symlink {
        target: String,
    },
    /// A hard link to the earlier entry at `target` (a path in the layer).
    Hardlink {
        target: String,
    },
    Char {
        major: u32,
        minor: u32,
    },
    Block {
        major: u32,
        minor: u32,
    },
    Fifo,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// In the layer, clean, relative: `usr/bin/env`.
    pub path: String,
    pub kind: Kind,
    /// Permission bits (with setuid, setgid, sticky).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since the epoch; `None` when the TOC gives none.
    pub mtime: Option<i64>,
    pub xattrs: Vec<(String, Vec<u8>)>,
}

/// A layer's entries, in the TOC's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toc {
    pub entries: Vec<Entry>,
    /// Entries before this index are prefetched first (eStargz's `.prefetch.landmark`); `None`
    /// when the layer names none (or says `.no.prefetch.landmark`).
    pub prefetch_before: Option<usize>,
    /// Xattrs the layer may not set, dropped.
    pub dropped_xattrs: u64,
}

/// Marks the end of the files to prefetch first.
pub const PREFETCH_LANDMARK: &str = ".prefetch.landmark";
/// Says no file is to be prefetched first.
pub const NO_PREFETCH_LANDMARK: &str = ".no.prefetch.landmark";

#[derive(Deserialize)]
struct RawToc {
    version: i64,
    #[serde(default)]
    entries: Vec<RawEntry>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawEntry {
    #[serde(default)]
    name: String,
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    size: i64,
    #[serde(default)]
    modtime: Option<String>,
    #[serde(default)]
    link_name: String,
    #[serde(default)]
    mode: i64,
    #[serde(default)]
    uid: i64,
    #[serde(default)]
    gid: i64,
    #[serde(default)]
    dev_major: i64,
    #[serde(default)]
    dev_minor: i64,
    #[serde(default)]
    xattrs: HashMap<String, String>,
    #[serde(default)]
    digest: String,
    #[serde(default)]
    offset: i64,
    #[serde(default)]
    end_offset: i64,
    #[serde(default)]
    chunk_offset: i64,
    #[serde(default)]
    chunk_size: i64,
    #[serde(default)]
    chunk_digest: String,
    #[serde(default)]
    chunk_type: String,
    #[serde(default)]
    inner_offset: i64,
}

impl Toc {
    /// Check the TOC JSON `json` of a blob in `format` whose file data ends at `data_end` (where
    /// the TOC starts), and return the layer's entries.
    pub fn parse(
        json: &[u8],
        format: Format,
        data_end: u64,
        limits: &Limits,
    ) -> Result<Toc, TocError> {
        if json.len() as u64 > limits.toc_bytes {
            return Err(TocError::TooBig {
                got: json.len() as u64,
                limit: limits.toc_bytes,
            });
        }
        let raw: RawToc =
            serde_json::from_slice(json).map_err(|e| TocError::Json(e.to_string()))?;
        if raw.version != 1 {
            return Err(TocError::Version(raw.version));
        }
        if raw.entries.len() > limits.entries {
            return Err(TocError::TooManyEntries {
                limit: limits.entries,
            });
        }
        let mut b = Builder {
            format,
            data_end,
            limits,
            toc: Toc {
                entries: Vec::new(),
                prefetch_before: None,
                dropped_xattrs: 0,
            },
            files: HashMap::new(),
            last_file: None,
        };
        for (index, e) in raw.entries.into_iter().enumerate() {
            let name = e.name.clone();
            b.entry(e)
                .map_err(|why| TocError::Entry { index, name, why })?;
        }
        b.finish()
            .map_err(|(index, name, why)| TocError::Entry { index, name, why })?;
        Ok(b.toc)
    }
}

struct Builder<'a> {
    format: Format,
    data_end: u64,
    limits: &'a Limits,
    toc: Toc,
    /// Path → index in `toc.entries` of each regular file so far (hard-link targets).
    files: HashMap<String, usize>,
    /// The regular file the next `chunk` entry may continue.
    last_file: Option<usize>,
}

impl Builder<'_> {
    fn entry(&mut self, e: RawEntry) -> Result<(), String> {
        let path = self.path(&e.name, "name")?;
        if e.kind == "chunk" {
            return self.chunk(&path, &e);
        }
        self.last_file = None;
        // The landmarks sit at the layer's root.
        if path == PREFETCH_LANDMARK {
            self.toc.prefetch_before = Some(self.toc.entries.len());
        } else if path == NO_PREFETCH_LANDMARK {
            self.toc.prefetch_before = None;
        }
        let id = |v: i64, what: &str| {
            u32::try_from(v).map_err(|_| format!("{what} {v} is not a 32-bit id"))
        };
        let dev = |v: i64, what: &str| {
            u32::try_from(v).map_err(|_| format!("{what} {v} is out of range"))
        };
        let kind = match e.kind.as_str() {
            "dir" => Kind::Dir,
            "reg" => {
                let size =
                    u64::try_from(e.size).map_err(|_| format!("size {} is negative", e.size))?;
                let digest = (!e.digest.is_empty()).then(|| e.digest.clone());
                if let Some(d) = &digest {
                    if !is_sha256(d) {
                        return Err(format!("digest {d:?} is not sha256:<64 hex>"));
                    }
                }
                let mut chunks = Vec::new();
                if size > 0 {
                    chunks.push(self.chunk_of(&e, size, 0, digest.as_deref())?);
                }
                Kind::File {
                    size,
                    digest,
                    chunks,
                }
            }
            "symlink" => Kind::Symlink {
                target: self.name(&e.link_name, "link target")?.to_string(),
            },
            "hardlink" => {
                let target = self.path(&e.link_name, "hard-link target")?;
                if !self.files.contains_key(&target) {
                    return Err(format!(
                        "hard link to {target:?}, which no earlier regular file is"
                    ));
                }
                Kind::Hardlink { target }
            }
            "char" => Kind::Char {
                major: dev(e.dev_major, "devMajor")?,
                minor: dev(e.dev_minor, "devMinor")?,
            },
            "block" => Kind::Block {
                major: dev(e.dev_major, "devMajor")?,
                minor: dev(e.dev_minor, "devMinor")?,
            },
            "fifo" => Kind::Fifo,
            other => return Err(format!("unknown entry type {other:?}")),
        };
        let xattrs = self.xattrs(&e.xattrs)?;
        let mtime = match e.modtime.as_deref() {
            None | Some("") => None,
            Some(t) => Some(
                humantime::parse_rfc3339_weak(t)
                    .map_err(|err| format!("modtime {t:?}: {err}"))
                    .map(|st| match st.duration_since(std::time::UNIX_EPOCH) {
                        Ok(d) => d.as_secs() as i64,
                        Err(before) => -(before.duration().as_secs() as i64),
                    })?,
            ),
        };
        let entry = Entry {
            path: path.clone(),
            kind,
            mode: (e.mode & 0o7777) as u32,
            uid: id(e.uid, "uid")?,
            gid: id(e.gid, "gid")?,
            mtime,
            xattrs,
        };
        let index = self.toc.entries.len();
        if matches!(entry.kind, Kind::File { .. }) {
            self.files.insert(path, index);
            self.last_file = Some(index);
        }
        self.toc.entries.push(entry);
        Ok(())
    }

    /// A `chunk` entry: the next piece of the regular file just before it.
    fn chunk(&mut self, path: &str, e: &RawEntry) -> Result<(), String> {
        let Some(index) = self.last_file.filter(|i| self.toc.entries[*i].path == path) else {
            return Err("a chunk that follows no regular file of its name".into());
        };
        let Kind::File { size, chunks, .. } = &self.toc.entries[index].kind else {
            unreachable!("last_file is a regular file")
        };
        let (size, expected) = (*size, chunks.last().map_or(0, |c| c.file_offset + c.size));
        let chunk = self.chunk_of(e, size, expected, None)?;
        if let Kind::File { chunks, .. } = &mut self.toc.entries[index].kind {
            chunks.push(chunk);
        }
        Ok(())
    }

    /// The chunk `e` describes of a file of `size` bytes, which must start at `expected`. A
    /// chunk that is the whole file may go by the file's digest.
    fn chunk_of(
        &self,
        e: &RawEntry,
        size: u64,
        expected: u64,
        file_digest: Option<&str>,
    ) -> Result<Chunk, String> {
        let file_offset = u64::try_from(e.chunk_offset)
            .map_err(|_| format!("chunkOffset {} is negative", e.chunk_offset))?;
        if file_offset != expected {
            return Err(format!(
                "chunkOffset {file_offset} where the file's previous chunks end at {expected}"
            ));
        }
        // chunkSize 0 is "to the end of the file".
        let len = match u64::try_from(e.chunk_size) {
            Ok(0) => size - file_offset,
            Ok(n) => n,
            Err(_) => return Err(format!("chunkSize {} is negative", e.chunk_size)),
        };
        if len == 0 || file_offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(format!(
                "a chunk of {len} bytes at {file_offset} of a file of {size}"
            ));
        }
        if len > self.limits.chunk_bytes {
            return Err(format!(
                "a chunk of {len} bytes, over the {}-byte limit",
                self.limits.chunk_bytes
            ));
        }
        let zeros = e.chunk_type == "zeros";
        if !zeros && !e.chunk_type.is_empty() {
            return Err(format!("unknown chunkType {:?}", e.chunk_type));
        }
        let whole = file_offset == 0 && len == size;
        let digest = if zeros {
            None
        } else if is_sha256(&e.chunk_digest) {
            Some(e.chunk_digest.clone())
        } else if let (true, true, Some(d)) = (e.chunk_digest.is_empty(), whole, file_digest) {
            Some(d.to_string())
        } else {
            return Err(format!(
                "chunkDigest {:?} is not sha256:<64 hex>: the chunk could not be checked",
                e.chunk_digest
            ));
        };
        let start =
            u64::try_from(e.offset).map_err(|_| format!("offset {} is negative", e.offset))?;
        let inner_offset = u64::try_from(e.inner_offset)
            .map_err(|_| format!("innerOffset {} is negative", e.inner_offset))?;
        let end = match self.format {
            // Set in `finish`, from the next chunk's offset.
            Format::Estargz => start,
            Format::ZstdChunked if zeros => start,
            Format::ZstdChunked => u64::try_from(e.end_offset)
                .ok()
                .filter(|end| *end > start)
                .ok_or_else(|| format!("endOffset {} is not past offset {start}", e.end_offset))?,
        };
        if !zeros && (start >= self.data_end || end > self.data_end) {
            return Err(format!(
                "compressed bytes {start}..{end} lie outside the blob's data (0..{})",
                self.data_end
            ));
        }
        Ok(Chunk {
            file_offset,
            size: len,
            compressed: start..end,
            inner_offset,
            digest,
            zeros,
        })
    }

    /// An entry's name as a clean relative path, with no `..` and no NUL.
    fn path(&self, raw: &str, what: &str) -> Result<String, String> {
        let raw = self.name(raw, what)?;
        let mut parts = Vec::new();
        for part in raw.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    return Err(format!(
                        "{what} {raw:?} contains '..' and escapes the layer"
                    ))
                }
                p => parts.push(p),
            }
        }
        Ok(parts.join("/"))
    }

    fn name<'s>(&self, raw: &'s str, what: &str) -> Result<&'s str, String> {
        if raw.len() > self.limits.name_bytes {
            return Err(format!(
                "{what} of {} bytes, over the {}-byte limit",
                raw.len(),
                self.limits.name_bytes
            ));
        }
        if raw.contains('\0') {
            return Err(format!("{what} contains a NUL byte"));
        }
        Ok(raw)
    }

    fn xattrs(&mut self, raw: &HashMap<String, String>) -> Result<Vec<(String, Vec<u8>)>, String> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for (k, v) in raw {
            let over = || format!("xattrs over the {}-byte limit", self.limits.xattr_bytes);
            // What the value decodes to at least: refused before it is decoded.
            let least = (v.len() / 4 * 3).saturating_sub(2);
            if bytes.saturating_add(k.len()).saturating_add(least) > self.limits.xattr_bytes {
                return Err(over());
            }
            if !crishim_images::unpack::layer_xattr_allowed(k.as_bytes()) {
                self.toc.dropped_xattrs += 1;
                continue;
            }
            let value = base64::engine::general_purpose::STANDARD
                .decode(v)
                .map_err(|e| format!("xattr {k:?} is not base64: {e}"))?;
            bytes += k.len() + value.len();
            if bytes > self.limits.xattr_bytes {
                return Err(over());
            }
            out.push((k.clone(), value));
        }
        out.sort();
        Ok(out)
    }

    /// eStargz: each data chunk's compressed bytes end where the next chunk's start, or at the
    /// TOC. Chunks sharing one gzip member (`innerOffset`) end where the member does.
    fn finish(&mut self) -> Result<(), (usize, String, String)> {
        if self.format != Format::Estargz {
            return Ok(());
        }
        let mut starts: Vec<u64> = self
            .toc
            .entries
            .iter()
            .flat_map(|e| match &e.kind {
                Kind::File { chunks, .. } => chunks.iter().map(|c| c.compressed.start).collect(),
                _ => Vec::new(),
            })
            .collect();
        starts.push(self.data_end);
        starts.sort_unstable();
        starts.dedup();
        for (index, e) in self.toc.entries.iter_mut().enumerate() {
            let path = e.path.clone();
            if let Kind::File { chunks, .. } = &mut e.kind {
                for c in chunks.iter_mut() {
                    let next = starts.partition_point(|s| *s <= c.compressed.start);
                    let Some(end) = starts.get(next) else {
                        return Err((index, path, "a chunk starts at the TOC".into()));
                    };
                    c.compressed.end = *end;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
