//! `ListImages`, with the optional image filter resolved like any image reference.

use super::errors::Error;
use crishim_proto::cri::{ListImagesRequest, ListImagesResponse};

use super::{errors::from_image_error, ImageService};

impl ImageService {
    pub(super) async fn do_list_images(
        &self,
        req: ListImagesRequest,
    ) -> Result<ListImagesResponse, Error> {
        let filter = req
            .filter
            .and_then(|f| f.image)
            .map(|i| i.image)
            .filter(|s| !s.is_empty());
        let records = match filter {
            Some(f) => self
                .store
                .resolve(&f)
                .map_err(from_image_error)?
                .into_iter()
                .collect(),
            None => self.store.list().map_err(from_image_error)?,
        };
        Ok(ListImagesResponse {
            images: records.iter().map(|r| self.to_cri(r)).collect(),
        })
    }
}
