//! One chunk's bytes from the blob, checked against its digest before anyone sees them: the
//! compressed range a range request fetched is decompressed (a gzip member for eStargz, zstd
//! frames for zstd:chunked), `inner_offset` bytes are skipped, exactly `size` bytes are kept, and
//! their sha256 must be the chunk's digest. Nothing past `inner_offset + size` is decompressed,
//! so a hostile member that inflates without end costs one chunk's bytes at most.

use std::io::Read as _;

use crate::toc::{Chunk, Format};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChunkError {
    #[error("{got} compressed bytes where the chunk takes {want}")]
    Length { got: u64, want: u64 },
    #[error("the chunk does not decompress: {0}")]
    Decompress(String),
    #[error("the chunk decompresses to {got} bytes, short of {want}")]
    Short { got: u64, want: u64 },
    #[error("the chunk's digest is {got}, not the {want} its TOC says")]
    Digest { got: String, want: String },
}

/// The chunk's `chunk.size` bytes from `compressed`, the blob's bytes in `chunk.compressed`;
/// checked against its digest. A chunk of zeros needs no bytes.
pub fn read_chunk(format: Format, chunk: &Chunk, compressed: &[u8]) -> Result<Vec<u8>, ChunkError> {
    if chunk.zeros {
        return Ok(vec![0; chunk.size as usize]);
    }
    let want = chunk.compressed.end - chunk.compressed.start;
    if compressed.len() as u64 != want {
        return Err(ChunkError::Length {
            got: compressed.len() as u64,
            want,
        });
    }
    let total = chunk.inner_offset.saturating_add(chunk.size);
    let mut out = Vec::with_capacity(chunk.size as usize);
    let decompressed: Box<dyn std::io::Read + '_> = match format {
        // One member, not the rest of the blob: a member ends where the next chunk's starts.
        Format::Estargz => Box::new(flate2::read::GzDecoder::new(compressed)),
        // The unpacker's bound on the window a frame may ask for.
        Format::ZstdChunked => Box::new(
            crishim_images::unpack::zstd_decoder(compressed)
                .map_err(|e| ChunkError::Decompress(e.to_string()))?,
        ),
    };
    let mut limited = decompressed.take(total);
    std::io::copy(
        &mut (&mut limited).take(chunk.inner_offset),
        &mut std::io::sink(),
    )
    .map_err(|e| ChunkError::Decompress(e.to_string()))?;
    limited
        .read_to_end(&mut out)
        .map_err(|e| ChunkError::Decompress(e.to_string()))?;
    if (out.len() as u64) < chunk.size {
        return Err(ChunkError::Short {
            got: out.len() as u64,
            want: chunk.size,
        });
    }
    let got = crate::sha256(&out);
    match &chunk.digest {
        Some(want) if *want == got => Ok(out),
        Some(want) => Err(ChunkError::Digest {
            got,
            want: want.clone(),
        }),
        None => Err(ChunkError::Digest {
            got,
            want: "none".into(),
        }),
    }
}
