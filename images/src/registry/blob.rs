//! Blobs: image configs read whole and verified, layers streamed for the caller to verify.

use bytes::Bytes;
use futures::Stream;

use super::{error_chain, Repository};
use crate::digest::Digest;
use crate::error::{ImageError, Result};

/// Configs are capped by the bytes actually read, with room for long histories.
pub const MAX_CONFIG: u64 = 8 << 20;

/// The most one range request asks for: a lazy layer's TOC, or one chunk.
pub const MAX_RANGE: u64 = 128 << 20;

/// What a range request got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ranged {
    /// Exactly the bytes asked for.
    Bytes(Bytes),
    /// The registry answered with the whole blob (it does not honour `Range`); nothing of it
    /// was read. The caller pulls the blob whole instead.
    Ignored,
}

impl Repository<'_> {
    /// Fetch a small blob (an image config) whole, verified.
    pub async fn small_blob(&self, digest: &Digest) -> Result<Bytes> {
        let what = format!("blob {digest}");
        let resp = self.blob_response(digest).await?;
        let bytes = self.read_capped(resp, MAX_CONFIG, &what).await?;
        let actual = Digest::of(&bytes);
        if &actual != digest {
            return Err(ImageError::DigestMismatch {
                what: "blob",
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(bytes)
    }

    /// Stream a blob. The caller verifies the digest as it consumes the stream.
    pub async fn blob_stream(
        &self,
        digest: &Digest,
    ) -> Result<impl Stream<Item = Result<Bytes>> + Send + 'static> {
        use futures::TryStreamExt as _;
        let resp = self.blob_response(digest).await?;
        let registry = self.registry();
        Ok(resp
            .bytes_stream()
            .map_err(move |e| ImageError::RegistryUnavailable {
                registry: registry.clone(),
                detail: format!("reading blob: {}", error_chain(&e)),
            }))
    }

    /// Bytes `range` of a blob, with a range request (at most [`MAX_RANGE`]): exactly those, or
    /// [`Ranged::Ignored`]. A reply that claims another range, or brings fewer or more bytes, is
    /// refused. The bytes are the caller's to verify.
    pub async fn blob_range(&self, digest: &Digest, range: std::ops::Range<u64>) -> Result<Ranged> {
        let what = format!("bytes {}..{} of blob {digest}", range.start, range.end);
        let len = range.end.saturating_sub(range.start);
        if len == 0 || len > MAX_RANGE {
            return Err(ImageError::BadContent(format!(
                "{what}: a range of {len} bytes (1 to {MAX_RANGE})"
            )));
        }
        let asked = format!("bytes={}-{}", range.start, range.end - 1);
        let resp = self
            .get_with(
                &self.url("blobs", digest.as_str()),
                &[(reqwest::header::RANGE, asked)],
            )
            .await?;
        if resp.status() == reqwest::StatusCode::OK {
            return Ok(Ranged::Ignored);
        }
        if resp.status() != reqwest::StatusCode::PARTIAL_CONTENT {
            return Err(self.check(what, resp).await.err().unwrap_or_else(|| {
                ImageError::BadContent("a range request answered neither 200 nor 206".into())
            }));
        }
        let claimed = resp
            .headers()
            .get(reqwest::header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        if content_range(&claimed) != Some((range.start, range.end - 1)) {
            return Err(ImageError::BadContent(format!(
                "{what}: the registry answered with Content-Range {:?}",
                crishim_sys::shown::shown(&claimed)
            )));
        }
        let body = self.read_capped(resp, len, &what).await?;
        if body.len() as u64 != len {
            return Err(ImageError::BadContent(format!(
                "{what}: {} bytes arrived",
                body.len()
            )));
        }
        Ok(Ranged::Bytes(body))
    }

    async fn blob_response(&self, digest: &Digest) -> Result<reqwest::Response> {
        let resp = self.get(&self.url("blobs", digest.as_str()), None).await?;
        self.check(format!("blob {digest}"), resp).await
    }
}

/// `bytes FIRST-LAST/TOTAL` (TOTAL may be `*`): (FIRST, LAST).
fn content_range(v: &str) -> Option<(u64, u64)> {
    let (span, _total) = v.strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    Some((first.parse().ok()?, last.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{repo, serve};
    use super::*;
    use crate::registry::{RegistryClient, RegistryConfig};

    #[test]
    fn content_ranges_parse() {
        assert_eq!(content_range("bytes 0-99/1000"), Some((0, 99)));
        assert_eq!(content_range("bytes 5-9/*"), Some((5, 9)));
        assert_eq!(content_range("bytes 5-9"), None);
        assert_eq!(content_range("items 5-9/10"), None);
        assert_eq!(content_range("bytes -5/10"), None);
    }

    /// A registry that honours Range gives exactly the bytes; one that ignores it is said to;
    /// one that claims another range, or sends too few or too many bytes, is refused.
    #[tokio::test]
    async fn range_requests_get_exactly_their_bytes_or_say_why_not() {
        let digest = Digest::of(b"whatever");
        let client = RegistryClient::new(RegistryConfig::default()).unwrap();
        let reply = |head: &'static str, body: &'static [u8]| {
            move |req: &str, _| {
                assert!(req.to_lowercase().contains("range: bytes=10-14"), "{req}");
                [head.as_bytes(), body].concat()
            }
        };
        let cases: Vec<(&'static str, &'static [u8], Result<Ranged, &str>)> = vec![
            (
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-14/100\r\nContent-Length: 5\r\n\r\n",
                b"hello",
                Ok(Ranged::Bytes(Bytes::from_static(b"hello"))),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
                &[b'x'; 100],
                Ok(Ranged::Ignored),
            ),
            (
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-4/100\r\nContent-Length: 5\r\n\r\n",
                b"hello",
                Err("Content-Range"),
            ),
            (
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-14/100\r\nConnection: close\r\n\r\n",
                b"hel",
                Err("3 bytes arrived"),
            ),
            (
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-14/100\r\nConnection: close\r\n\r\n",
                b"hello, and more",
                Err("larger than 5 bytes"),
            ),
            (
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n\r\n",
                b"",
                Err("416"),
            ),
        ];
        for (head, body, want) in cases {
            let port = serve(reply(head, body)).await;
            let got = repo(&client, port, None).blob_range(&digest, 10..15).await;
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{head}"),
                (Err(e), Err(needle)) => assert!(e.to_string().contains(needle), "{head}: {e}"),
                (g, w) => panic!("{head}: got {g:?}, want {w:?}"),
            }
        }
        for bad in [10..10, 0..MAX_RANGE + 1] {
            let port = serve(|_, _| b"HTTP/1.1 500 X\r\n\r\n".to_vec()).await;
            assert!(repo(&client, port, None)
                .blob_range(&digest, bad)
                .await
                .is_err());
        }
    }
}
