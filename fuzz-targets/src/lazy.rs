//! Lazy layers: what a registry serves for eStargz and zstd:chunked blobs.

use crishim_lazy::chunk::read_chunk;
use crishim_lazy::tree::{NodeKind, Tree};
use crishim_lazy::{estargz, zstd_chunked, Chunk, Format, Kind, Limits, Toc};

/// The first byte picks the format; the rest is the blob's tail as a registry serves it: the
/// footer is its last bytes, the TOC JSON the bytes before (and, for eStargz, the TOC member
/// itself is tried). What a TOC yields lies inside the layer and inside the blob's data.
pub fn lazy_toc(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let limits = Limits {
        toc_bytes: 1 << 20,
        ..Limits::default()
    };
    let blob_size = rest.len() as u64 + 1_000_000;
    let (format, data_end) = if which & 1 == 0 {
        let footer = &rest[rest.len().saturating_sub(estargz::FOOTER_SIZE)..];
        let _ = estargz::parse_footer(footer, blob_size);
        let _ = estargz::toc_json(rest, limits.toc_bytes);
        (Format::Estargz, 500_000)
    } else {
        let footer = &rest[rest.len().saturating_sub(zstd_chunked::FOOTER_SIZE)..];
        let _ = zstd_chunked::parse_footer(footer, blob_size, limits.toc_bytes);
        if let Ok(s) = std::str::from_utf8(rest) {
            let _ = zstd_chunked::parse_position(s, blob_size, limits.toc_bytes);
        }
        (Format::ZstdChunked, 500_000)
    };
    // The input as a chunk's compressed bytes: what decompresses is bounded by the chunk, and
    // nothing is returned that does not match its digest.
    let chunk = Chunk {
        file_offset: 0,
        size: 4096,
        compressed: 0..rest.len() as u64,
        inner_offset: u64::from(which >> 1) * 512,
        digest: Some(crishim_lazy::sha256(&[0; 4096])),
        zeros: false,
    };
    if let Ok(bytes) = read_chunk(format, &chunk, rest) {
        assert_eq!(
            bytes,
            vec![0; 4096],
            "a chunk returned that is not its digest's"
        );
    }
    let Ok(toc) = Toc::parse(rest, format, data_end, &limits) else {
        return;
    };
    for e in &toc.entries {
        assert!(
            !e.path.split('/').any(|p| p == ".." || p == ".") && !e.path.starts_with('/'),
            "{:?} is not a clean path in the layer",
            e.path
        );
        if let Kind::File { size, chunks, .. } = &e.kind {
            let mut at = 0;
            for c in chunks {
                assert_eq!(c.file_offset, at, "chunks in order, without gaps");
                at += c.size;
                assert!(c.size <= limits.chunk_bytes);
                if !c.zeros {
                    assert!(c.digest.is_some(), "a chunk that cannot be checked");
                    assert!(
                        c.compressed.start < c.compressed.end && c.compressed.end <= data_end,
                        "{:?} outside the data",
                        c.compressed
                    );
                }
            }
            assert!(at <= *size);
        }
    }
    // The tree the FUSE mount shows: every inode reachable, every child's parent a directory,
    // every file's chunks its own.
    let tree = Tree::build(&toc, Some(("stargz.index.json", rest.to_vec())));
    let owners = tree.chunk_owners();
    for (i, n) in tree.nodes.iter().enumerate() {
        let ino = i as u64 + 1;
        assert!(
            matches!(tree.node(n.parent).kind, NodeKind::Dir { .. }),
            "inode {ino}'s parent is not a directory"
        );
        match &n.kind {
            NodeKind::Dir { children } => {
                for (name, child) in children {
                    assert!(!name.is_empty() && !name.contains('/') && name != "..");
                    assert!(tree.get(*child).is_some(), "{name:?} names no inode");
                }
            }
            NodeKind::File { chunks, .. } => {
                assert!(chunks.clone().all(|c| owners[c] == ino));
            }
            _ => {}
        }
    }
}
