//! `PullImage`: normalise the reference, pick credentials, pull through the image store.

use super::errors::Error;
use crishim_images::Credentials;
use crishim_proto::cri::{PullImageRequest, PullImageResponse};

use super::ImageService;

impl ImageService {
    pub(super) async fn do_pull_image(
        &self,
        req: PullImageRequest,
    ) -> Result<PullImageResponse, Error> {
        let spec = req.image.unwrap_or_default();
        // One image store serves every handler (KEP-4216), so a known one changes nothing.
        super::sandbox_run::known_handler(&self.handlers, "PullImage", &spec.runtime_handler)?;
        let image = spec.image;
        if image.is_empty() {
            return Err(Error::invalid_argument(
                "PullImage: image reference is empty",
            ));
        }
        let creds = match req.auth {
            Some(a) => Credentials::from_fields(
                &a.username,
                &a.password,
                &a.auth,
                &a.identity_token,
                &a.registry_token,
            )
            .map_err(|e| Error::invalid_argument(format!("PullImage: auth: {e}")))?,
            None => None,
        };
        let t0 = std::time::Instant::now();
        let pulled = self.store.pull(&image, creds.as_ref()).await;
        let size = pulled.as_ref().map_or(0, |r| r.size);
        crate::metrics::global().pull(pulled.is_ok(), size, t0.elapsed());
        let record = pulled?;
        Ok(PullImageResponse {
            image_ref: record.id.to_string(),
        })
    }
}
