//! Pushing: blobs (skipped where the registry has them) and manifests, with the same endpoints,
//! auth and error mapping as pulls. For `crishim image convert`.

use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::{Method, StatusCode};

use super::Repository;
use crate::digest::Digest;
use crate::error::{ImageError, Result};

impl Repository<'_> {
    /// Whether this endpoint answers the registry API at all (`/v2/`, any status but a
    /// connection failure).
    pub async fn reachable(&self) -> bool {
        self.send(Method::GET, &format!("{}/", self.endpoint.api), &[], None)
            .await
            .is_ok()
    }

    /// Upload `data` as a blob (unless the registry has it already); its digest.
    pub async fn push_blob(&self, data: Bytes) -> Result<Digest> {
        let digest = Digest::of(&data);
        let have = self
            .send(Method::HEAD, &self.url("blobs", digest.as_str()), &[], None)
            .await?;
        if have.status() == StatusCode::OK {
            return Ok(digest);
        }
        let start = self
            .send(
                Method::POST,
                &format!("{}/{}/blobs/uploads/", self.endpoint.api, self.repository),
                &[],
                Some(Bytes::new()),
            )
            .await?;
        let start = self
            .check(format!("upload of blob {digest}"), start)
            .await?;
        let location = start
            .headers()
            .get(LOCATION)
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| ImageError::BadContent("a blob upload without a Location".into()))?;
        let mut url =
            self.endpoint.base.join(location).map_err(|e| {
                ImageError::BadContent(format!("upload Location {location:?}: {e}"))
            })?;
        url.query_pairs_mut().append_pair("digest", digest.as_str());
        let put = self
            .send(
                Method::PUT,
                url.as_str(),
                &[(CONTENT_TYPE, "application/octet-stream".into())],
                Some(data),
            )
            .await?;
        self.check(format!("blob {digest}"), put).await?;
        Ok(digest)
    }

    /// PUT `bytes` as the manifest `reference` (a tag or digest) of `media_type`; its digest.
    pub async fn push_manifest(
        &self,
        reference: &str,
        media_type: &str,
        bytes: Bytes,
    ) -> Result<Digest> {
        let digest = Digest::of(&bytes);
        let put = self
            .send(
                Method::PUT,
                &self.url("manifests", reference),
                &[(CONTENT_TYPE, media_type.to_string())],
                Some(bytes),
            )
            .await?;
        self.check(format!("manifest {reference}"), put).await?;
        Ok(digest)
    }
}
