//! `ImageStatus`: an unknown image is an empty answer, not an error (the CRI contract).

use std::collections::HashMap;

use super::errors::Error;
use crishim_proto::cri::{ImageStatusRequest, ImageStatusResponse};

use super::ImageService;

impl ImageService {
    pub(super) async fn do_image_status(
        &self,
        req: ImageStatusRequest,
    ) -> Result<ImageStatusResponse, Error> {
        let name = req.image.map(|i| i.image).unwrap_or_default();
        if name.is_empty() {
            return Err(Error::invalid_argument("ImageStatus: image is empty"));
        }
        let Some(rec) = self.store.resolve(&name)? else {
            return Ok(ImageStatusResponse::default());
        };
        let mut info = HashMap::new();
        if req.verbose {
            let (raw, _) = self.store.config(&rec)?;
            let config: serde_json::Value = serde_json::from_slice(&raw)
                .map_err(|e| Error::internal(format!("stored image config: {e}")))?;
            let verbose = serde_json::json!({
                "imageSpec": config,
                "manifestDigest": rec.manifest,
                "indexDigest": rec.index,
                "chainID": rec.chain_ids.last(),
                "layers": rec.layers,
            });
            info.insert("info".to_string(), verbose.to_string());
            let lazy = serde_json::to_string(&self.store.lazy_summary(&rec))
                .map_err(|e| Error::internal(format!("lazy layers' status: {e}")))?;
            info.insert("lazy".to_string(), lazy);
        }
        Ok(ImageStatusResponse {
            image: Some(self.to_cri(&rec)),
            info,
        })
    }
}
