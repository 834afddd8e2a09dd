//! SPDY/3 header blocks: name/value pairs, zlib-compressed with the protocol's dictionary in one
//! stream per direction for the whole connection.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::SpdyError;

/// Header names the SPDY/3 dictionary holds, each with a 4-byte big-endian length before it.
const DICTIONARY_WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The raw text the SPDY/3 dictionary ends with: status codes and lines, dates, common values.
const DICTIONARY_TAIL: &str = "100101201202205206300302303304305306307402405406407408409410411412\
413414415416417502504505203 Non-Authoritative Information204 No Content301 Moved Permanently400 \
Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not \
Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, \
Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,application/xml,\
application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=\
utf-8charset=iso-8859-1,utf-,*,enq=0.";

/// The SPDY/3 zlib dictionary (section 2.6.10.1 of the draft).
pub fn dictionary() -> Vec<u8> {
    let mut d = Vec::with_capacity(1423);
    for w in DICTIONARY_WORDS {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    d.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    d
}

/// Name/value pairs; names are lowercase on the wire, values of one name are NUL-separated.
pub type Headers = Vec<(String, String)>;

/// Look a header up by name, case-insensitively.
pub fn get<'a>(h: &'a Headers, name: &str) -> Option<&'a str> {
    h.iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A header block larger than this is refused (the kubelet's streams carry a handful of headers).
const MAX_HEADER_BLOCK: usize = 1 << 20;

pub struct Encoder {
    z: Compress,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    pub fn new() -> Self {
        let mut z = Compress::new(Compression::default(), true);
        z.set_dictionary(&dictionary())
            .expect("setting a dictionary on a fresh deflate stream");
        Encoder { z }
    }

    pub fn encode(&mut self, headers: &Headers) -> Vec<u8> {
        let mut raw = Vec::new();
        raw.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (n, v) in headers {
            let n = n.to_ascii_lowercase();
            raw.extend_from_slice(&(n.len() as u32).to_be_bytes());
            raw.extend_from_slice(n.as_bytes());
            raw.extend_from_slice(&(v.len() as u32).to_be_bytes());
            raw.extend_from_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut consumed = 0;
        loop {
            let before = self.z.total_in();
            out.reserve(raw.len() + 64);
            self.z
                .compress_vec(&raw[consumed..], &mut out, FlushCompress::Sync)
                .expect("deflate of an in-memory buffer");
            consumed += (self.z.total_in() - before) as usize;
            // A sync flush is complete once all input is in and the output did not fill up.
            if consumed == raw.len() && out.len() < out.capacity() {
                return out;
            }
        }
    }
}

pub struct Decoder {
    z: Decompress,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    pub fn new() -> Self {
        Decoder {
            z: Decompress::new(true),
        }
    }

    pub fn decode(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        let raw = self.inflate(block)?;
        parse(&raw)
    }

    fn inflate(&mut self, block: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(block.len() * 4 + 256);
        let mut consumed = 0;
        loop {
            let before = self.z.total_in();
            if out.capacity() - out.len() < 256 {
                out.reserve(out.capacity());
            }
            let ended =
                match self
                    .z
                    .decompress_vec(&block[consumed..], &mut out, FlushDecompress::Sync)
                {
                    Ok(Status::Ok) | Ok(Status::BufError) => false,
                    Ok(Status::StreamEnd) => true,
                    Err(e) if e.needs_dictionary().is_some() => {
                        self.z
                            .set_dictionary(&dictionary())
                            .map_err(|e| SpdyError::Protocol(format!("header dictionary: {e}")))?;
                        false
                    }
                    Err(e) => return Err(SpdyError::Protocol(format!("header block: {e}"))),
                };
            consumed += (self.z.total_in() - before) as usize;
            // An ended stream consumes nothing more: bytes after it would be retried for ever.
            if ended && consumed < block.len() {
                return Err(SpdyError::Protocol(
                    "data after the end of the header compression stream".into(),
                ));
            }
            if out.len() > MAX_HEADER_BLOCK {
                return Err(SpdyError::Protocol("header block too large".into()));
            }
            if consumed == block.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

fn parse(raw: &[u8]) -> Result<Headers, SpdyError> {
    let bad = || SpdyError::Protocol("truncated header block".into());
    let mut at = 0usize;
    let u32_at = |at: &mut usize| -> Result<usize, SpdyError> {
        let b = raw.get(*at..*at + 4).ok_or_else(bad)?;
        *at += 4;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let n = u32_at(&mut at)?;
    let mut headers = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let len = u32_at(&mut at)?;
        let name = raw.get(at..at + len).ok_or_else(bad)?;
        at += len;
        let len = u32_at(&mut at)?;
        let value = raw.get(at..at + len).ok_or_else(bad)?;
        at += len;
        headers.push((
            String::from_utf8_lossy(name).into_owned(),
            String::from_utf8_lossy(value).into_owned(),
        ));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_is_the_specs() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        // The Adler-32 that zlib streams name the dictionary by (DICTID).
        let mut z = Compress::new(Compression::default(), true);
        assert_eq!(z.set_dictionary(&d).unwrap(), 0xe3c6_a7c2);
    }

    #[test]
    fn header_blocks_round_trip_across_one_stream() {
        let mut enc = Encoder::new();
        let mut dec = Decoder::new();
        for i in 0..3 {
            let h: Headers = vec![
                ("streamType".into(), "stdout".into()),
                ("port".into(), format!("80{i}")),
            ];
            let block = enc.encode(&h);
            let back = dec.decode(&block).unwrap();
            assert_eq!(back[0], ("streamtype".to_string(), "stdout".to_string()));
            assert_eq!(get(&back, "PORT"), Some(format!("80{i}").as_str()));
        }
    }

    #[test]
    fn bytes_after_the_end_of_the_zlib_stream_are_an_error_not_a_loop() {
        let mut z = Compress::new(Compression::default(), true);
        z.set_dictionary(&dictionary()).unwrap();
        let mut block = Vec::with_capacity(256);
        z.compress_vec(&[0, 0, 0, 0], &mut block, FlushCompress::Finish)
            .unwrap();
        block.push(0);
        assert!(Decoder::new().decode(&block).is_err());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut dec = Decoder::new();
        assert!(dec.decode(b"\x78\xbb\x00\x01garbage").is_err());
    }
}
