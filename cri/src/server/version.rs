//! `Version`.

use super::errors::Error;
use crishim_proto::cri::{VersionRequest, VersionResponse};

use super::runtime_service::RuntimeService;

impl RuntimeService {
    pub(super) async fn do_version(&self, _req: VersionRequest) -> Result<VersionResponse, Error> {
        Ok(VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "crishim".into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            runtime_api_version: "v1".into(),
        })
    }
}
