//! Making lazy layers: a layer's tar written again as eStargz or zstd:chunked, the same tar
//! stream once decompressed (eStargz adds its TOC as the last entry, as the format says), with
//! every regular file's payload in members (frames) of its own, cut into chunks of at most
//! `chunk_size` bytes, and the TOC, footer and annotations that let a runtime fetch them one by
//! one.
//!
//! The tar is taken as it is: headers (PAX records, long names, xattrs included) are copied
//! byte for byte, so a file's metadata is what it was.

use std::io::Write;

use serde::Serialize;
use sha2::Digest as _;

use crate::toc::Format;
use crate::{estargz, zstd_chunked};

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("reading the layer's tar: {0}")]
    Tar(std::io::Error),
    #[error("writing the blob: {0}")]
    Io(#[from] std::io::Error),
    #[error("chunk size 0")]
    ChunkSize,
}

/// What a conversion made, besides the blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The blob's size and digest, for the manifest.
    pub size: u64,
    pub digest: String,
    /// The digest of the blob decompressed: the layer's diff ID in the image config.
    pub diff_id: String,
    /// The layer annotations that make it lazy.
    pub annotations: Vec<(String, String)>,
}

/// A TOC entry as both formats write it.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct TocEntry {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "is_zero")]
    size: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    modtime: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    link_name: String,
    mode: u64,
    uid: u64,
    gid: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    user_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    group_name: String,
    #[serde(skip_serializing_if = "is_zero")]
    dev_major: u64,
    #[serde(skip_serializing_if = "is_zero")]
    dev_minor: u64,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    xattrs: std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    digest: String,
    #[serde(skip_serializing_if = "is_zero")]
    offset: u64,
    #[serde(skip_serializing_if = "is_zero")]
    end_offset: u64,
    #[serde(skip_serializing_if = "is_zero")]
    chunk_offset: u64,
    #[serde(skip_serializing_if = "is_zero")]
    chunk_size: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    chunk_digest: String,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Serialize)]
struct TocJson {
    version: u32,
    entries: Vec<TocEntry>,
}

/// The blob being written: members (gzip) or frames (zstd), the decompressed stream hashed.
struct Out<W: Write> {
    w: W,
    format: Format,
    at: u64,
    blob: sha2::Sha256,
    plain: sha2::Sha256,
    plain_len: u64,
}

impl<W: Write> Out<W> {
    fn raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.w.write_all(bytes)?;
        self.blob.update(bytes);
        self.at += bytes.len() as u64;
        Ok(())
    }

    /// `bytes` as one member (frame) of their own: where it starts and ends in the blob.
    fn member(&mut self, bytes: &[u8]) -> std::io::Result<(u64, u64)> {
        let start = self.at;
        let compressed = match self.format {
            Format::Estargz => {
                let mut gz =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                gz.write_all(bytes)?;
                gz.finish()?
            }
            Format::ZstdChunked => zstd::bulk::compress(bytes, 3)?,
        };
        self.raw(&compressed)?;
        self.plain.update(bytes);
        self.plain_len += bytes.len() as u64;
        Ok((start, self.at))
    }
}

/// Write the layer `tar` (uncompressed) to `out` as `format`, regular files cut into chunks of
/// at most `chunk_size` bytes.
pub fn write_layer<W: Write>(
    tar: &[u8],
    format: Format,
    chunk_size: u64,
    out: W,
) -> Result<Written, WriteError> {
    if chunk_size == 0 {
        return Err(WriteError::ChunkSize);
    }
    let mut o = Out {
        w: out,
        format,
        at: 0,
        blob: sha2::Sha256::new(),
        plain: sha2::Sha256::new(),
        plain_len: 0,
    };
    let mut entries = Vec::new();
    // The tar bytes copied so far; the end of the last entry (its padded payload).
    let (mut copied, mut last_end) = (0usize, 0usize);
    let mut archive = tar::Archive::new(tar);
    for e in archive.entries().map_err(WriteError::Tar)? {
        let mut e = e.map_err(WriteError::Tar)?;
        let payload = e.raw_file_position() as usize;
        let size = e.size();
        let end = payload + (size as usize).div_ceil(512) * 512;
        last_end = end;
        let mut t = toc_entry(&mut e).map_err(WriteError::Tar)?;
        if t.kind == "reg" && size > 0 {
            // The headers before it, then the payload chunk by chunk, each its own member.
            if payload > copied {
                o.member(&tar[copied..payload])?;
            }
            let data = &tar[payload..payload + size as usize];
            t.digest = crate::sha256(data);
            let count = data.len().div_ceil(chunk_size as usize);
            let name = t.name.clone();
            for (i, piece) in data.chunks(chunk_size as usize).enumerate() {
                let (start, stop) = o.member(piece)?;
                // The first chunk is the file's own entry; the others follow it by name.
                let mut c = if i == 0 {
                    std::mem::take(&mut t)
                } else {
                    TocEntry {
                        name: name.clone(),
                        kind: "chunk",
                        ..TocEntry::default()
                    }
                };
                c.offset = start;
                if format == Format::ZstdChunked {
                    c.end_offset = stop;
                }
                c.chunk_offset = i as u64 * chunk_size;
                // The last (or only) chunk's size is 0: "to the end of the file".
                c.chunk_size = if i + 1 == count {
                    0
                } else {
                    piece.len() as u64
                };
                c.chunk_digest = crate::sha256(piece);
                entries.push(c);
            }
            copied = payload + size as usize;
        } else {
            entries.push(t);
        }
    }
    let toc = serde_json::to_vec(&TocJson {
        version: 1,
        entries,
    })
    .map_err(|e| WriteError::Io(e.into()))?;
    let mut annotations = Vec::new();
    match format {
        Format::Estargz => {
            // The rest of the last entry, then the TOC as the last entry, then the tar's end.
            if last_end > copied {
                o.member(&tar[copied..last_end])?;
            }
            let toc_offset = o.at;
            o.member(&estargz::toc_member(&toc))?;
            o.raw(&estargz::footer(toc_offset))?;
            annotations.push((estargz::TOC_DIGEST.to_string(), crate::sha256(&toc)));
            annotations.push((
                estargz::UNCOMPRESSED_SIZE.to_string(),
                o.plain_len.to_string(),
            ));
        }
        Format::ZstdChunked => {
            // The rest of the tar, its end included.
            if tar.len() > copied {
                o.member(&tar[copied..])?;
            }
            let compressed = zstd::bulk::compress(&toc, 3)?;
            let p = zstd_chunked::Position {
                offset: o.at + 8,
                length: compressed.len() as u64,
                uncompressed: toc.len() as u64,
            };
            o.raw(&[0x50, 0x2a, 0x4d, 0x18])?;
            o.raw(&(compressed.len() as u32).to_le_bytes())?;
            o.raw(&compressed)?;
            o.raw(&zstd_chunked::footer(p))?;
            annotations.push((
                zstd_chunked::MANIFEST_POSITION.to_string(),
                format!(
                    "{}:{}:{}:{}",
                    p.offset,
                    p.length,
                    p.uncompressed,
                    zstd_chunked::MANIFEST_TYPE_CRFS
                ),
            ));
            annotations.push((
                zstd_chunked::MANIFEST_CHECKSUM.to_string(),
                crate::sha256(&compressed),
            ));
        }
    }
    o.w.flush()?;
    Ok(Written {
        size: o.at,
        digest: format!("sha256:{}", hex::encode(o.blob.finalize())),
        diff_id: format!("sha256:{}", hex::encode(o.plain.finalize())),
        annotations,
    })
}

/// The TOC entry of a tar entry (without its chunks).
fn toc_entry(e: &mut tar::Entry<'_, &[u8]>) -> std::io::Result<TocEntry> {
    use base64::Engine as _;
    let h = e.header();
    let kind = match h.entry_type() {
        tar::EntryType::Directory => "dir",
        tar::EntryType::Symlink => "symlink",
        tar::EntryType::Link => "hardlink",
        tar::EntryType::Char => "char",
        tar::EntryType::Block => "block",
        tar::EntryType::Fifo => "fifo",
        _ => "reg",
    };
    let mtime = h.mtime().unwrap_or(0);
    let mut t = TocEntry {
        name: String::from_utf8_lossy(&e.path_bytes()).into_owned(),
        kind,
        size: if kind == "reg" { e.size() } else { 0 },
        modtime: humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime),
        )
        .to_string(),
        link_name: e
            .link_name_bytes()
            .map(|l| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_default(),
        mode: u64::from(h.mode().unwrap_or(0)),
        uid: h.uid().unwrap_or(0),
        gid: h.gid().unwrap_or(0),
        user_name: h.username().ok().flatten().unwrap_or_default().to_string(),
        group_name: h.groupname().ok().flatten().unwrap_or_default().to_string(),
        dev_major: u64::from(h.device_major().ok().flatten().unwrap_or(0)),
        dev_minor: u64::from(h.device_minor().ok().flatten().unwrap_or(0)),
        ..TocEntry::default()
    };
    if let Some(pax) = e.pax_extensions()? {
        for ext in pax.flatten() {
            if let Some(name) = ext.key().ok().and_then(|k| k.strip_prefix("SCHILY.xattr.")) {
                let value = base64::engine::general_purpose::STANDARD.encode(ext.value_bytes());
                t.xattrs.insert(name.to_string(), value);
            }
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests;
