//! `ListImages`, with the optional image filter resolved like any image reference.

use super::errors::Error;
use crishim_proto::cri::{ListImagesRequest, ListImagesResponse};

use super::ImageService;

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
            Some(f) => self.store.resolve(&f)?.into_iter().collect(),
            None => self.store.list()?,
        };
        Ok(ListImagesResponse {
            images: records.iter().map(|r| self.to_cri(r)).collect(),
        })
    }
}
