//! Manifests and indexes: what a pull asks for first, by tag or by digest.

use bytes::Bytes;
use reqwest::header::CONTENT_TYPE;
use tracing::debug;

use super::Repository;
use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crishim_sys::shown::shown;

/// Media types we accept for manifests, most preferred first.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// Manifests are capped by the bytes actually read, as containerd caps them.
pub const MAX_MANIFEST: u64 = 4 << 20;

pub struct Manifest {
    pub bytes: Bytes,
    pub media_type: String,
    pub digest: Digest,
}

impl Repository<'_> {
    /// Fetch a manifest or index by tag or digest; verify it when fetched by digest.
    pub async fn manifest(&self, reference: &str) -> Result<Manifest> {
        let what = format!("manifest {}:{}", self.repository, shown(reference));
        let resp = self
            .get(&self.url("manifests", reference), Some(MANIFEST_ACCEPT))
            .await?;
        let resp = self.check(what.clone(), resp).await?;
        let media_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|s| shown(s.split(';').next().unwrap_or(s).trim()).into_owned())
            .unwrap_or_default();
        let bytes = self.read_capped(resp, MAX_MANIFEST, &what).await?;
        let digest = Digest::of(&bytes);
        if let Ok(expected) = Digest::parse(reference) {
            if expected != digest {
                return Err(ImageError::DigestMismatch {
                    what: "manifest",
                    expected: expected.to_string(),
                    actual: digest.to_string(),
                });
            }
        }
        debug!(%digest, %media_type, "fetched manifest");
        Ok(Manifest {
            bytes,
            media_type,
            digest,
        })
    }
}
