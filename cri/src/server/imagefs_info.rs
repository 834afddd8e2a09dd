//! `ImageFsInfo`: bytes and inodes used under the image store.

use std::time::{SystemTime, UNIX_EPOCH};

use super::errors::Error;
use crishim_proto::cri::{
    FilesystemIdentifier, FilesystemUsage, ImageFsInfoRequest, ImageFsInfoResponse, UInt64Value,
};

use super::ImageService;

impl ImageService {
    pub(super) async fn do_image_fs_info(
        &self,
        _req: ImageFsInfoRequest,
    ) -> Result<ImageFsInfoResponse, Error> {
        let store = self.store.clone();
        let usage = tokio::task::spawn_blocking(move || store.usage())
            .await
            .map_err(|e| Error::internal(format!("ImageFsInfo: {e}")))??;
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let fs = FilesystemUsage {
            timestamp,
            fs_id: Some(FilesystemIdentifier {
                mountpoint: self.store.root().display().to_string(),
            }),
            used_bytes: Some(UInt64Value { value: usage.bytes }),
            inodes_used: Some(UInt64Value {
                value: usage.inodes,
            }),
        };
        // Writable layers live in the image store too: one filesystem, reported as both (so
        // the kubelet sees no split image filesystem, KEP-4191).
        Ok(ImageFsInfoResponse {
            image_filesystems: vec![fs.clone()],
            container_filesystems: vec![fs],
        })
    }
}
