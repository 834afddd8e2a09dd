//! `RemoveImage`: by ID, tag or digest; removing what is not there succeeds (the CRI wants it idempotent).

use super::errors::Error;
use crishim_proto::cri::{RemoveImageRequest, RemoveImageResponse};

use super::ImageService;

impl ImageService {
    pub(super) async fn do_remove_image(
        &self,
        req: RemoveImageRequest,
    ) -> Result<RemoveImageResponse, Error> {
        let name = req.image.map(|i| i.image).unwrap_or_default();
        if name.is_empty() {
            return Err(Error::invalid_argument("RemoveImage: image is empty"));
        }
        self.store.remove(&name).await?;
        Ok(RemoveImageResponse {})
    }
}
