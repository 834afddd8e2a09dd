//! Thin helpers over the CRI ImageService, as methods on [`Daemon`].

use std::collections::HashMap;

use base64::Engine as _;
use crishim_proto::cri;
use tonic::Status;

use crate::daemon::Daemon;

/// An `ImageSpec` naming `image`.
pub fn spec(image: &str) -> cri::ImageSpec {
    cri::ImageSpec {
        image: image.to_string(),
        annotations: HashMap::new(),
        user_specified_image: image.to_string(),
        ..Default::default()
    }
}

/// `AuthConfig { username, password }`
pub fn basic_auth(username: &str, password: &str) -> cri::AuthConfig {
    cri::AuthConfig {
        username: username.to_string(),
        password: password.to_string(),
        ..Default::default()
    }
}

/// `AuthConfig { auth: base64("username:password") }`
pub fn encoded_auth(username: &str, password: &str) -> cri::AuthConfig {
    cri::AuthConfig {
        auth: base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}")),
        ..Default::default()
    }
}

impl Daemon {
    /// PullImage; returns `image_ref`.
    pub async fn pull(&self, image: &str) -> Result<String, Status> {
        self.pull_with_auth(image, None).await
    }

    pub async fn pull_with_auth(
        &self,
        image: &str,
        auth: Option<cri::AuthConfig>,
    ) -> Result<String, Status> {
        let resp = self
            .image_client()
            .pull_image(cri::PullImageRequest {
                image: Some(spec(image)),
                auth,
                sandbox_config: None,
            })
            .await?;
        Ok(resp.into_inner().image_ref)
    }

    /// ImageStatus (not verbose); `None` for an unknown image.
    pub async fn image_status(&self, image: &str) -> Result<Option<cri::Image>, Status> {
        Ok(self.image_status_full(image, false).await?.image)
    }

    pub async fn image_status_full(
        &self,
        image: &str,
        verbose: bool,
    ) -> Result<cri::ImageStatusResponse, Status> {
        Ok(self
            .image_client()
            .image_status(cri::ImageStatusRequest {
                image: Some(spec(image)),
                verbose,
            })
            .await?
            .into_inner())
    }

    /// ListImages, optionally filtered by a reference.
    pub async fn list_images(&self, filter: Option<&str>) -> Result<Vec<cri::Image>, Status> {
        Ok(self
            .image_client()
            .list_images(cri::ListImagesRequest {
                filter: filter.map(|f| cri::ImageFilter {
                    image: Some(spec(f)),
                }),
            })
            .await?
            .into_inner()
            .images)
    }

    pub async fn remove_image(&self, image: &str) -> Result<(), Status> {
        self.image_client()
            .remove_image(cri::RemoveImageRequest {
                image: Some(spec(image)),
            })
            .await?;
        Ok(())
    }

    pub async fn image_fs_info(&self) -> Result<cri::ImageFsInfoResponse, Status> {
        Ok(self
            .image_client()
            .image_fs_info(cri::ImageFsInfoRequest {})
            .await?
            .into_inner())
    }
}
