//! A lazy layer opened in its registry: its TOC fetched with range requests and checked against
//! the layer's annotations, and any chunk fetched the same way and checked against the TOC.
//! Fetches go through the registry client as every pull does (mirrors, `hosts.toml`, auth).

use std::collections::HashMap;

use crishim_images::registry::Ranged;
use crishim_images::registry::Repository;
use crishim_images::{Digest, ImageError};

use crate::chunk::{read_chunk, ChunkError};
use crate::estargz::{self, EstargzError};
use crate::toc::{Chunk, Format, Limits, Toc, TocError};
use crate::zstd_chunked::{self, ZstdChunkedError};

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Registry(#[from] ImageError),
    #[error(transparent)]
    Estargz(#[from] EstargzError),
    #[error(transparent)]
    ZstdChunked(#[from] ZstdChunkedError),
    #[error(transparent)]
    Toc(#[from] TocError),
    #[error(transparent)]
    Chunk(#[from] ChunkError),
    #[error("the layer annotation {0} is missing")]
    Annotation(&'static str),
    #[error("the blob of {size} bytes is too small for a lazy layer")]
    TooSmall { size: u64 },
}

/// A layer whose files can be fetched one chunk at a time.
#[derive(Debug, Clone)]
pub struct LazyLayer {
    pub digest: Digest,
    pub size: u64,
    pub format: Format,
    pub toc: Toc,
    /// The eStargz TOC as the blob holds it: a full pull unpacks it as `stargz.index.json`.
    pub toc_json: Vec<u8>,
}

/// What opening a layer found.
#[derive(Debug)]
pub enum Opened {
    Lazy(LazyLayer),
    /// Not in a lazy format: pull it whole.
    NotLazy,
    /// The registry does not honour `Range`: pull it whole.
    RangeIgnored,
}

/// The format a layer's annotations say it is in.
pub fn format_of(annotations: &HashMap<String, String>) -> Option<Format> {
    if annotations.contains_key(estargz::TOC_DIGEST) {
        Some(Format::Estargz)
    } else if annotations.contains_key(zstd_chunked::MANIFEST_POSITION) {
        Some(Format::ZstdChunked)
    } else {
        None
    }
}

macro_rules! ranged {
    ($repo:expr, $digest:expr, $range:expr) => {
        match $repo.blob_range($digest, $range).await? {
            Ranged::Bytes(b) => b,
            Ranged::Ignored => return Ok(Opened::RangeIgnored),
        }
    };
}

/// Open the layer `digest` of `size` bytes with the annotations its manifest gives it: its TOC
/// fetched (the eStargz footer, then the TOC member; or the zstd:chunked manifest where its
/// position annotation says), checked against the annotation's digest, and parsed.
pub async fn open(
    repo: &Repository<'_>,
    digest: &Digest,
    size: u64,
    annotations: &HashMap<String, String>,
    limits: &Limits,
) -> Result<Opened, FetchError> {
    let Some(format) = format_of(annotations) else {
        return Ok(Opened::NotLazy);
    };
    let (toc, toc_json) = match format {
        Format::Estargz => {
            let want = annotations
                .get(estargz::TOC_DIGEST)
                .ok_or(FetchError::Annotation(estargz::TOC_DIGEST))?;
            let footer_at = size
                .checked_sub(estargz::FOOTER_SIZE as u64)
                .ok_or(FetchError::TooSmall { size })?;
            let footer = ranged!(repo, digest, footer_at..size);
            let toc_at = estargz::parse_footer(&footer, size)?;
            // The TOC member is compressed JSON: no larger than the JSON may be (gzip of JSON
            // only grows by its headers).
            if footer_at - toc_at > limits.toc_bytes + 4096 {
                return Err(EstargzError::TooBig {
                    limit: limits.toc_bytes,
                }
                .into());
            }
            let member = ranged!(repo, digest, toc_at..footer_at);
            let json = estargz::toc_json(&member, limits.toc_bytes)?;
            estargz::check_digest(&json, want)?;
            (Toc::parse(&json, format, toc_at, limits)?, json)
        }
        Format::ZstdChunked => {
            let position = annotations
                .get(zstd_chunked::MANIFEST_POSITION)
                .ok_or(FetchError::Annotation(zstd_chunked::MANIFEST_POSITION))?;
            let checksum = annotations
                .get(zstd_chunked::MANIFEST_CHECKSUM)
                .ok_or(FetchError::Annotation(zstd_chunked::MANIFEST_CHECKSUM))?;
            let p = zstd_chunked::parse_position(position, size, limits.toc_bytes)?;
            let compressed = ranged!(repo, digest, p.offset..p.offset + p.length);
            let json = zstd_chunked::manifest_json(&compressed, p, checksum)?;
            // The manifest's skippable frame header is where the data ends.
            let toc = Toc::parse(&json, format, p.offset.saturating_sub(8), limits)?;
            (toc, Vec::new())
        }
    };
    Ok(Opened::Lazy(LazyLayer {
        digest: digest.clone(),
        size,
        format,
        toc,
        toc_json,
    }))
}

impl LazyLayer {
    /// `chunk`'s bytes, fetched with one range request and checked against its digest. `None`
    /// where the registry stopped honouring `Range`.
    pub async fn fetch(
        &self,
        repo: &Repository<'_>,
        chunk: &Chunk,
    ) -> Result<Option<Vec<u8>>, FetchError> {
        if chunk.zeros {
            return Ok(Some(read_chunk(self.format, chunk, &[])?));
        }
        match repo
            .blob_range(&self.digest, chunk.compressed.clone())
            .await?
        {
            Ranged::Bytes(b) => Ok(Some(read_chunk(self.format, chunk, &b)?)),
            Ranged::Ignored => Ok(None),
        }
    }
}
