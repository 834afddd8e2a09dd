//! zstd:chunked: a zstd layer whose files (or their chunks) are zstd frames of their own, with
//! the TOC (the "manifest", zstd-compressed) in a skippable frame near the end and a 64-byte
//! footer in a last skippable frame. The manifest's place is the layer annotation
//! [`MANIFEST_POSITION`] (`offset:length:uncompressed length:type`), its digest, of its
//! compressed bytes, [`MANIFEST_CHECKSUM`].

/// `offset:length:uncompressed length:type` of the compressed manifest.
pub const MANIFEST_POSITION: &str = crishim_images::lazy::ZSTD_CHUNKED_MANIFEST_POSITION;
/// The digest of the compressed manifest.
pub const MANIFEST_CHECKSUM: &str = crishim_images::lazy::ZSTD_CHUNKED_MANIFEST_CHECKSUM;
/// The manifest type of a CRFS-compatible TOC, the only one there is.
pub const MANIFEST_TYPE_CRFS: u64 = 1;
/// The footer: a skippable frame's 8-byte header, then 64 bytes of data.
pub const FOOTER_SIZE: usize = 8 + 64;
const SKIPPABLE_MAGIC: [u8; 4] = [0x50, 0x2a, 0x4d, 0x18];
const FOOTER_MAGIC: &[u8; 8] = b"GNUlInUx";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ZstdChunkedError {
    #[error("the zstd:chunked footer is malformed: {0}")]
    Footer(&'static str),
    #[error("{MANIFEST_POSITION} {0:?} is not offset:length:uncompressed:type")]
    Position(String),
    #[error("the manifest is of type {0}, not {MANIFEST_TYPE_CRFS} (CRFS)")]
    Type(u64),
    #[error("the manifest at {offset}+{length} does not lie within the blob's {size} bytes")]
    Outside { offset: u64, length: u64, size: u64 },
    #[error("the manifest is over {limit} bytes")]
    TooBig { limit: u64 },
    #[error("the manifest does not decompress: {0}")]
    Decompress(String),
    #[error("the manifest's digest is {got}, not the {want} the layer's annotation says")]
    Digest { got: String, want: String },
}

/// Where the compressed manifest is, and how big it is uncompressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub offset: u64,
    pub length: u64,
    pub uncompressed: u64,
}

impl Position {
    /// Checked against a blob of `blob_size` bytes and the TOC limit `limit` (uncompressed).
    fn check(self, kind: u64, blob_size: u64, limit: u64) -> Result<Position, ZstdChunkedError> {
        if kind != MANIFEST_TYPE_CRFS {
            return Err(ZstdChunkedError::Type(kind));
        }
        if self
            .offset
            .checked_add(self.length)
            .is_none_or(|end| end > blob_size)
            || self.length == 0
        {
            return Err(ZstdChunkedError::Outside {
                offset: self.offset,
                length: self.length,
                size: blob_size,
            });
        }
        if self.uncompressed > limit || self.length > limit {
            return Err(ZstdChunkedError::TooBig { limit });
        }
        Ok(self)
    }
}

/// The annotation [`MANIFEST_POSITION`] of a blob of `blob_size` bytes.
pub fn parse_position(
    annotation: &str,
    blob_size: u64,
    limit: u64,
) -> Result<Position, ZstdChunkedError> {
    let bad = || ZstdChunkedError::Position(annotation.chars().take(100).collect());
    let parts: Vec<u64> = annotation
        .split(':')
        .map(|p| p.parse::<u64>().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let [offset, length, uncompressed, kind] = parts[..] else {
        return Err(bad());
    };
    Position {
        offset,
        length,
        uncompressed,
    }
    .check(kind, blob_size, limit)
}

/// The manifest's position from the footer (the blob's last [`FOOTER_SIZE`] bytes).
pub fn parse_footer(
    footer: &[u8],
    blob_size: u64,
    limit: u64,
) -> Result<Position, ZstdChunkedError> {
    let f: &[u8; FOOTER_SIZE] = footer
        .try_into()
        .map_err(|_| ZstdChunkedError::Footer("not 72 bytes"))?;
    if f[0..4] != SKIPPABLE_MAGIC || u32::from_le_bytes([f[4], f[5], f[6], f[7]]) != 64 {
        return Err(ZstdChunkedError::Footer(
            "not a skippable frame of 64 bytes",
        ));
    }
    if &f[64..72] != FOOTER_MAGIC {
        return Err(ZstdChunkedError::Footer("no GNUlInUx magic"));
    }
    let u = |i: usize| u64::from_le_bytes(f[8 + 8 * i..16 + 8 * i].try_into().unwrap_or_default());
    Position {
        offset: u(0),
        length: u(1),
        uncompressed: u(2),
    }
    .check(u(3), blob_size, limit)
}

/// The manifest JSON from its compressed bytes, checked against the annotation
/// [`MANIFEST_CHECKSUM`] first, decompressed to at most `p.uncompressed` bytes.
pub fn manifest_json(
    compressed: &[u8],
    p: Position,
    checksum: &str,
) -> Result<Vec<u8>, ZstdChunkedError> {
    let got = crate::sha256(compressed);
    if got != checksum {
        return Err(ZstdChunkedError::Digest {
            got,
            want: checksum.to_string(),
        });
    }
    let json = zstd::bulk::decompress(compressed, p.uncompressed as usize)
        .map_err(|e| ZstdChunkedError::Decompress(e.to_string()))?;
    if json.len() as u64 != p.uncompressed {
        return Err(ZstdChunkedError::Decompress(format!(
            "{} bytes, not the {} announced",
            json.len(),
            p.uncompressed
        )));
    }
    Ok(json)
}

/// The footer of a blob whose manifest is at `p` (as zstd:chunked writers make it; the tar-split
/// fields are left zero).
pub fn footer(p: Position) -> [u8; FOOTER_SIZE] {
    let mut f = [0u8; FOOTER_SIZE];
    f[0..4].copy_from_slice(&SKIPPABLE_MAGIC);
    f[4..8].copy_from_slice(&64u32.to_le_bytes());
    for (i, v) in [p.offset, p.length, p.uncompressed, MANIFEST_TYPE_CRFS]
        .into_iter()
        .enumerate()
    {
        f[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    f[64..72].copy_from_slice(FOOTER_MAGIC);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Position = Position {
        offset: 100,
        length: 50,
        uncompressed: 200,
    };

    #[test]
    fn footers_and_positions_round_trip_and_bound_the_manifest() {
        assert_eq!(parse_footer(&footer(P), 1000, 1 << 20), Ok(P));
        assert_eq!(parse_position("100:50:200:1", 1000, 1 << 20), Ok(P));
        for (annotation, why) in [
            ("100:50:200", "three fields"),
            ("100:50:200:1:9", "five fields"),
            ("-1:50:200:1", "negative"),
            ("100:x:200:1", "not a number"),
        ] {
            assert!(
                matches!(
                    parse_position(annotation, 1000, 1 << 20),
                    Err(ZstdChunkedError::Position(_))
                ),
                "{why}"
            );
        }
        assert_eq!(
            parse_position("100:50:200:2", 1000, 1 << 20),
            Err(ZstdChunkedError::Type(2))
        );
        assert!(matches!(
            parse_position("990:50:200:1", 1000, 1 << 20),
            Err(ZstdChunkedError::Outside { .. })
        ));
        assert!(matches!(
            parse_position(&format!("{}:2:2:1", u64::MAX), 1000, 1 << 20),
            Err(ZstdChunkedError::Outside { .. })
        ));
        assert_eq!(
            parse_position("100:50:2000000:1", 1000, 1 << 20),
            Err(ZstdChunkedError::TooBig { limit: 1 << 20 })
        );
        let mut bad = footer(P);
        bad[70] = b'X';
        assert!(parse_footer(&bad, 1000, 1 << 20).is_err());
        assert!(parse_footer(&footer(P)[..71], 1000, 1 << 20).is_err());
    }

    #[test]
    fn the_manifest_is_checked_before_it_is_decompressed_and_bounded() {
        let json = br#"{"version":1,"entries":[]}"#;
        let compressed = zstd::bulk::compress(json, 3).unwrap();
        let p = Position {
            offset: 8,
            length: compressed.len() as u64,
            uncompressed: json.len() as u64,
        };
        let sum = crate::sha256(&compressed);
        assert_eq!(manifest_json(&compressed, p, &sum).unwrap(), json);
        assert!(matches!(
            manifest_json(&compressed, p, &crate::sha256(b"x")),
            Err(ZstdChunkedError::Digest { .. })
        ));
        let short = Position {
            uncompressed: 5,
            ..p
        };
        assert!(
            manifest_json(&compressed, short, &sum).is_err(),
            "more than announced is not decompressed"
        );
    }
}
