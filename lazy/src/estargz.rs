//! eStargz: a gzip layer whose files (or their chunks) are gzip members of their own, with the TOC
//! (`stargz.index.json`, a tar entry of its own gzip member) and a 51-byte footer at the end.
//! The TOC's digest, of its JSON, is the layer annotation [`TOC_DIGEST`].

use std::io::Read as _;

/// The layer annotation holding the TOC JSON's digest.
pub const TOC_DIGEST: &str = crishim_images::lazy::ESTARGZ_TOC_DIGEST;
/// The layer annotation holding the uncompressed layer's size.
pub const UNCOMPRESSED_SIZE: &str = "io.containers.estargz.uncompressed-size";
/// The TOC's name in its tar entry.
pub const TOC_NAME: &str = "stargz.index.json";
/// The footer: an empty gzip member whose Extra field holds `%016xSTARGZ`, the TOC's offset.
pub const FOOTER_SIZE: usize = 51;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EstargzError {
    #[error("the eStargz footer is malformed: {0}")]
    Footer(&'static str),
    #[error(
        "the TOC offset {offset} does not lie within the blob's {size} bytes before the footer"
    )]
    TocOffset { offset: u64, size: u64 },
    #[error("the TOC member: {0}")]
    Member(String),
    #[error("the TOC is over {limit} bytes")]
    TooBig { limit: u64 },
    #[error("the TOC's digest is {got}, not the {want} the layer's annotation says")]
    Digest { got: String, want: String },
}

/// The TOC's offset from the footer (the blob's last [`FOOTER_SIZE`] bytes) of a blob of
/// `blob_size` bytes.
pub fn parse_footer(footer: &[u8], blob_size: u64) -> Result<u64, EstargzError> {
    let f: &[u8; FOOTER_SIZE] = footer
        .try_into()
        .map_err(|_| EstargzError::Footer("not 51 bytes"))?;
    // Gzip magic, deflate, FEXTRA set.
    if f[0..3] != [0x1f, 0x8b, 8] || f[3] & 4 == 0 {
        return Err(EstargzError::Footer(
            "not a gzip member with an Extra field",
        ));
    }
    if u16::from_le_bytes([f[10], f[11]]) != 26 || &f[12..14] != b"SG" {
        return Err(EstargzError::Footer("no SG subfield of 26 bytes"));
    }
    if u16::from_le_bytes([f[14], f[15]]) != 22 || &f[32..38] != b"STARGZ" {
        return Err(EstargzError::Footer("no %016xSTARGZ subfield"));
    }
    let hex =
        std::str::from_utf8(&f[16..32]).map_err(|_| EstargzError::Footer("offset not hex"))?;
    let offset =
        u64::from_str_radix(hex, 16).map_err(|_| EstargzError::Footer("offset not hex"))?;
    let size = blob_size.saturating_sub(FOOTER_SIZE as u64);
    if offset >= size {
        return Err(EstargzError::TocOffset { offset, size });
    }
    Ok(offset)
}

/// The TOC JSON from `member`, the blob's bytes from the TOC's offset to the footer: a gzip
/// member holding one tar entry named [`TOC_NAME`]. At most `limit` bytes are decompressed.
pub fn toc_json(member: &[u8], limit: u64) -> Result<Vec<u8>, EstargzError> {
    let gz = flate2::read::GzDecoder::new(member);
    // The tar header and padding on top of the JSON.
    let mut archive = tar::Archive::new(gz.take(limit.saturating_add(2048)));
    let mut entries = archive
        .entries()
        .map_err(|e| EstargzError::Member(e.to_string()))?;
    let mut entry = entries
        .next()
        .ok_or_else(|| EstargzError::Member("no tar entry".into()))?
        .map_err(|e| EstargzError::Member(e.to_string()))?;
    let name = entry.path_bytes().into_owned();
    if name != TOC_NAME.as_bytes() {
        return Err(EstargzError::Member(format!(
            "its tar entry is {:?}, not {TOC_NAME}",
            String::from_utf8_lossy(&name)
        )));
    }
    if entry.header().size().unwrap_or(u64::MAX) > limit {
        return Err(EstargzError::TooBig { limit });
    }
    let mut json = Vec::new();
    (&mut entry)
        .take(limit + 1)
        .read_to_end(&mut json)
        .map_err(|e| EstargzError::Member(e.to_string()))?;
    if json.len() as u64 > limit {
        return Err(EstargzError::TooBig { limit });
    }
    Ok(json)
}

/// `json` is the TOC the layer annotation [`TOC_DIGEST`] names.
pub fn check_digest(json: &[u8], want: &str) -> Result<(), EstargzError> {
    let got = crate::sha256(json);
    if got == want {
        Ok(())
    } else {
        Err(EstargzError::Digest {
            got,
            want: want.to_string(),
        })
    }
}

/// The uncompressed bytes of the TOC's gzip member: the TOC as the tar's last entry
/// (`stargz.index.json`, read-only, root's), then the tar's end.
pub fn toc_member(toc: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_ustar();
    // A fixed name of 17 bytes: the ustar name field holds it.
    let _ = h.set_path(TOC_NAME);
    h.set_size(toc.len() as u64);
    h.set_mode(0o444);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut member = h.as_bytes().to_vec();
    member.extend_from_slice(toc);
    member.resize(member.len().div_ceil(512) * 512 + 1024, 0);
    member
}

/// The footer of a blob whose TOC starts at `offset` (as eStargz writers make it).
pub fn footer(offset: u64) -> [u8; FOOTER_SIZE] {
    let mut f = [0u8; FOOTER_SIZE];
    f[0..4].copy_from_slice(&[0x1f, 0x8b, 8, 4]);
    f[9] = 255; // OS unknown
    f[10..12].copy_from_slice(&26u16.to_le_bytes());
    f[12..14].copy_from_slice(b"SG");
    f[14..16].copy_from_slice(&22u16.to_le_bytes());
    f[16..38].copy_from_slice(format!("{offset:016x}STARGZ").as_bytes());
    // A final stored block of no bytes, then CRC32 and ISIZE of nothing.
    f[38..43].copy_from_slice(&[1, 0, 0, 0xff, 0xff]);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_footer_round_trips_and_decompresses_to_nothing() {
        let f = footer(0x1234);
        assert_eq!(parse_footer(&f, 0x1234 + 51 + 10), Ok(0x1234));
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&f[..])
            .read_to_end(&mut out)
            .unwrap();
        assert!(
            out.is_empty(),
            "an empty gzip member, as gzip readers expect"
        );
    }

    #[test]
    fn hostile_footers_are_refused() {
        let f = footer(100);
        assert!(matches!(
            parse_footer(&f, 120),
            Err(EstargzError::TocOffset { offset: 100, .. })
        ));
        assert!(parse_footer(&f[..50], 1000).is_err());
        let mut bad = f;
        bad[20] = b'g';
        assert_eq!(
            parse_footer(&bad, 1000),
            Err(EstargzError::Footer("offset not hex"))
        );
        let mut bad = f;
        bad[33] = b'X';
        assert!(parse_footer(&bad, 1000).is_err());
        let mut bad = f;
        bad[3] = 0;
        assert!(parse_footer(&bad, 1000).is_err());
        let big = footer(u64::MAX);
        assert!(parse_footer(&big, u64::MAX).is_err(), "past the end");
    }

    fn toc_member(name: &str, json: &[u8]) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(json.len() as u64);
        h.set_mode(0o644);
        tar.append_data(&mut h, name, json).unwrap();
        let tar = tar.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &tar).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn the_toc_is_read_from_its_member_within_the_limit_and_checked() {
        let json = br#"{"version":1,"entries":[]}"#;
        let m = toc_member(TOC_NAME, json);
        assert_eq!(toc_json(&m, 1 << 20).unwrap(), json);
        assert_eq!(
            toc_json(&m, 10),
            Err(EstargzError::TooBig { limit: 10 }),
            "over the limit"
        );
        assert!(toc_json(&toc_member("other.json", json), 1 << 20).is_err());
        assert!(toc_json(b"not gzip", 1 << 20).is_err());
        check_digest(json, &crate::sha256(json)).unwrap();
        assert!(matches!(
            check_digest(json, &crate::sha256(b"another")),
            Err(EstargzError::Digest { .. })
        ));
    }
}
