//! Lazy layers: eStargz and zstd:chunked, gzip and zstd layers with an index (a TOC) that lets a
//! runtime fetch a layer's files one chunk at a time.
//!
//! Everything here reads what a registry serves, so it is hostile until bounded: the footers
//! ([`estargz::parse_footer`], [`zstd_chunked::parse_footer`]), the TOC (its size, entry count,
//! names, link targets, xattrs), and every offset and size in it. [`toc::Toc::parse`] turns a
//! TOC into the layer's entries with every path inside the layer (the unpacker's rules: no
//! `..`, only the xattrs a layer may set) and every chunk inside the blob, each with the digest
//! it must match before it is served.

pub mod cache;
pub mod chunk;
pub mod convert;
pub mod estargz;
pub mod fetch;
pub mod fs;
pub mod server;
pub mod snapshotter;
pub mod spec;
pub mod toc;
pub mod tree;
pub mod write;
pub mod zstd_chunked;

pub use toc::{Chunk, Entry, Format, Kind, Limits, Toc, TocError};

/// `sha256:<64 lowercase hex>`, as TOCs and annotations write digests.
pub fn is_sha256(d: &str) -> bool {
    d.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// The `sha256:` digest of `data`.
pub fn sha256(data: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)))
}
