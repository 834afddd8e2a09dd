//! Blobs: image configs read whole and verified, layers streamed for the caller to verify.

use bytes::Bytes;
use futures::Stream;

use super::{error_chain, Repository};
use crate::digest::Digest;
use crate::error::{ImageError, Result};

/// Configs are capped by the bytes actually read, with room for long histories.
pub const MAX_CONFIG: u64 = 8 << 20;

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

    async fn blob_response(&self, digest: &Digest) -> Result<reqwest::Response> {
        let resp = self.get(&self.url("blobs", digest.as_str()), None).await?;
        self.check(format!("blob {digest}"), resp).await
    }
}
