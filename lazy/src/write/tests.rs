use std::io::Read as _;

use super::*;
use crate::chunk::{read_chunk, ChunkError};
use crate::toc::{Kind, Limits, Toc};

/// A layer with every kind of entry: a long name, xattrs in PAX records, a file of three
/// chunks, an empty file, links and a FIFO.
fn layer() -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let mut b = tar::Builder::new(Vec::new());
    let mut files = Vec::new();
    let add = |b: &mut tar::Builder<Vec<u8>>,
               path: &str,
               kind: tar::EntryType,
               data: &[u8],
               link: &str| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o640
        });
        h.set_uid(1000);
        h.set_gid(100);
        h.set_mtime(1_700_000_000);
        if !link.is_empty() {
            b.append_link(&mut h, path, link).unwrap();
        } else {
            b.append_data(&mut h, path, data).unwrap();
        }
    };
    add(&mut b, "etc", tar::EntryType::Directory, b"", "");
    let small = b"hello, lazy world\n".to_vec();
    add(&mut b, "etc/hello", tar::EntryType::Regular, &small, "");
    files.push(("etc/hello".to_string(), small));
    let big: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    b.append_pax_extensions([("SCHILY.xattr.user.color", &b"blue"[..])])
        .unwrap();
    add(&mut b, "data/big", tar::EntryType::Regular, &big, "");
    files.push(("data/big".to_string(), big));
    add(&mut b, "data/empty", tar::EntryType::Regular, b"", "");
    let long = format!("deep/{}/file", "x".repeat(150));
    add(&mut b, &long, tar::EntryType::Regular, b"far", "");
    files.push((long, b"far".to_vec()));
    add(&mut b, "etc/link", tar::EntryType::Symlink, b"", "hello");
    add(&mut b, "etc/again", tar::EntryType::Link, b"", "etc/hello");
    add(&mut b, "run/pipe", tar::EntryType::Fifo, b"", "");
    (b.into_inner().unwrap(), files)
}

/// Each file's bytes, read chunk by chunk from the blob as a runtime reads them.
fn read_files(blob: &[u8], toc: &Toc, format: Format) -> Vec<(String, Vec<u8>)> {
    toc.entries
        .iter()
        .filter_map(|e| match &e.kind {
            Kind::File { chunks, size, .. } if *size > 0 => {
                let mut data = Vec::new();
                for c in chunks {
                    let range = c.compressed.start as usize..c.compressed.end as usize;
                    data.extend(read_chunk(format, c, &blob[range]).unwrap());
                }
                Some((e.path.clone(), data))
            }
            _ => None,
        })
        .collect()
}

fn annotation<'a>(w: &'a Written, key: &str) -> &'a str {
    &w.annotations.iter().find(|(k, _)| k == key).unwrap().1
}

#[test]
fn an_estargz_layer_reads_back_chunk_by_chunk_and_whole() {
    let (tar, files) = layer();
    let mut blob = Vec::new();
    let w = write_layer(&tar, Format::Estargz, 4096, &mut blob).unwrap();
    assert_eq!(
        (w.size, w.digest.clone()),
        (blob.len() as u64, crate::sha256(&blob))
    );
    // A runtime that knows nothing of eStargz: one gzip stream, the same tar plus the TOC.
    let mut plain = Vec::new();
    flate2::read::MultiGzDecoder::new(&blob[..])
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(w.diff_id, crate::sha256(&plain));
    let mut names: Vec<String> = tar::Archive::new(&plain[..])
        .entries()
        .unwrap()
        .map(|e| String::from_utf8_lossy(&e.unwrap().path_bytes()).into_owned())
        .collect();
    assert_eq!(
        names.pop().as_deref(),
        Some(estargz::TOC_NAME),
        "the TOC is the last entry"
    );
    let originals: Vec<String> = tar::Archive::new(&tar[..])
        .entries()
        .unwrap()
        .map(|e| String::from_utf8_lossy(&e.unwrap().path_bytes()).into_owned())
        .collect();
    assert_eq!(names, originals);
    // A lazy runtime: footer, TOC, then chunks.
    let size = blob.len() as u64;
    let toc_at = estargz::parse_footer(&blob[blob.len() - estargz::FOOTER_SIZE..], size).unwrap();
    let json = estargz::toc_json(
        &blob[toc_at as usize..blob.len() - estargz::FOOTER_SIZE],
        1 << 20,
    )
    .unwrap();
    estargz::check_digest(&json, annotation(&w, estargz::TOC_DIGEST)).unwrap();
    let toc = Toc::parse(&json, Format::Estargz, toc_at, &Limits::default()).unwrap();
    assert_eq!(read_files(&blob, &toc, Format::Estargz), files);
    let big = toc.entries.iter().find(|e| e.path == "data/big").unwrap();
    let Kind::File { chunks, .. } = &big.kind else {
        panic!()
    };
    assert_eq!(chunks.len(), 3, "10,000 bytes in chunks of 4,096");
    assert_eq!(
        big.xattrs,
        vec![("user.color".to_string(), b"blue".to_vec())]
    );
    assert_eq!(
        (big.mode, big.uid, big.gid, big.mtime),
        (0o640, 1000, 100, Some(1_700_000_000))
    );
    assert!(toc.entries.iter().any(|e| e.path == "etc/again"
        && e.kind
            == Kind::Hardlink {
                target: "etc/hello".into()
            }));
}

#[test]
fn a_zstd_chunked_layer_reads_back_chunk_by_chunk_and_whole() {
    let (tar, files) = layer();
    let mut blob = Vec::new();
    let w = write_layer(&tar, Format::ZstdChunked, 4096, &mut blob).unwrap();
    // A runtime that knows nothing of zstd:chunked: the same tar, skippable frames skipped.
    let mut plain = Vec::new();
    zstd::stream::read::Decoder::new(&blob[..])
        .unwrap()
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(plain, tar);
    assert_eq!(w.diff_id, crate::sha256(&tar));
    let size = blob.len() as u64;
    let p = zstd_chunked::parse_footer(
        &blob[blob.len() - zstd_chunked::FOOTER_SIZE..],
        size,
        1 << 20,
    )
    .unwrap();
    assert_eq!(
        zstd_chunked::parse_position(
            annotation(&w, zstd_chunked::MANIFEST_POSITION),
            size,
            1 << 20
        ),
        Ok(p)
    );
    let compressed = &blob[p.offset as usize..(p.offset + p.length) as usize];
    let json = zstd_chunked::manifest_json(
        compressed,
        p,
        annotation(&w, zstd_chunked::MANIFEST_CHECKSUM),
    )
    .unwrap();
    let toc = Toc::parse(&json, Format::ZstdChunked, p.offset - 8, &Limits::default()).unwrap();
    assert_eq!(read_files(&blob, &toc, Format::ZstdChunked), files);
}

#[test]
fn a_tampered_or_inflating_chunk_is_never_served() {
    let (tar, _) = layer();
    for format in [Format::Estargz, Format::ZstdChunked] {
        let mut blob = Vec::new();
        let w = write_layer(&tar, format, 4096, &mut blob).unwrap();
        let (json, data_end) = match format {
            Format::Estargz => {
                let at =
                    estargz::parse_footer(&blob[blob.len() - 51..], blob.len() as u64).unwrap();
                (
                    estargz::toc_json(&blob[at as usize..blob.len() - 51], 1 << 20).unwrap(),
                    at,
                )
            }
            Format::ZstdChunked => {
                let p = zstd_chunked::parse_position(
                    annotation(&w, zstd_chunked::MANIFEST_POSITION),
                    blob.len() as u64,
                    1 << 20,
                )
                .unwrap();
                let c = &blob[p.offset as usize..(p.offset + p.length) as usize];
                let sum = annotation(&w, zstd_chunked::MANIFEST_CHECKSUM).to_string();
                (
                    zstd_chunked::manifest_json(c, p, &sum).unwrap(),
                    p.offset - 8,
                )
            }
        };
        let toc = Toc::parse(&json, format, data_end, &Limits::default()).unwrap();
        let Kind::File { chunks, .. } = &toc
            .entries
            .iter()
            .find(|e| e.path == "data/big")
            .unwrap()
            .kind
        else {
            panic!()
        };
        let c = &chunks[1];
        let mut bytes = blob[c.compressed.start as usize..c.compressed.end as usize].to_vec();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        assert!(
            read_chunk(format, c, &bytes).is_err(),
            "{format:?}: a flipped byte"
        );
        // Another chunk's bytes where this one's should be: they decompress, but do not match.
        let other = &chunks[0];
        let wrong = &blob[other.compressed.start as usize..other.compressed.end as usize];
        let mut swapped = c.clone();
        swapped.compressed = other.compressed.clone();
        assert!(
            matches!(
                read_chunk(format, &swapped, wrong),
                Err(ChunkError::Digest { .. })
            ),
            "{format:?}: another chunk's bytes"
        );
        // A member that inflates to 64 MiB for a chunk of 4,096 bytes: no more than the chunk
        // is decompressed, and it fails its digest.
        let bomb = match format {
            Format::Estargz => {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                std::io::Write::write_all(&mut gz, &vec![0u8; 64 << 20]).unwrap();
                gz.finish().unwrap()
            }
            Format::ZstdChunked => zstd::bulk::compress(&vec![0u8; 64 << 20], 19).unwrap(),
        };
        let mut b = c.clone();
        b.compressed = 0..bomb.len() as u64;
        let t = std::time::Instant::now();
        assert!(matches!(
            read_chunk(format, &b, &bomb),
            Err(ChunkError::Digest { .. })
        ));
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(
            read_chunk(format, c, &bytes[..10]),
            Err(ChunkError::Length {
                got: 10,
                want: c.compressed.end - c.compressed.start
            })
        );
    }
}

#[test]
fn a_zstd_chunk_asking_for_a_window_over_the_unpackers_bound_is_refused() {
    let data = vec![7u8; 4096];
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    enc.window_log(27).unwrap();
    std::io::Write::write_all(&mut enc, &data).unwrap();
    let frame = enc.finish().unwrap();
    let chunk = crate::Chunk {
        file_offset: 0,
        size: 4096,
        compressed: 0..frame.len() as u64,
        inner_offset: 0,
        digest: Some(crate::sha256(&data)),
        zeros: false,
    };
    assert!(
        matches!(
            read_chunk(Format::ZstdChunked, &chunk, &frame),
            Err(ChunkError::Decompress(_))
        ),
        "a 128 MiB window for a 4 KiB chunk"
    );
    let small = zstd::bulk::compress(&data, 3).unwrap();
    let chunk = crate::Chunk {
        compressed: 0..small.len() as u64,
        ..chunk
    };
    assert_eq!(
        read_chunk(Format::ZstdChunked, &chunk, &small).unwrap(),
        data
    );
}
