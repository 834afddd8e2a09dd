//! `Status`: the runtime is ready once serving; the network only when a CNI config exists.

use std::collections::HashMap;

use crishim_proto::cri::{RuntimeCondition, RuntimeStatus, StatusRequest, StatusResponse};
use tonic::Status;

use super::runtime_service::RuntimeService;

impl RuntimeService {
    pub(super) async fn do_status(&self, req: StatusRequest) -> Result<StatusResponse, Status> {
        let dir = &self.inner.config.cni.conf_dir;
        let has_cni = std::fs::read_dir(dir).is_ok_and(|d| {
            d.flatten().any(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.ends_with(".conflist") || n.ends_with(".conf") || n.ends_with(".json")
            })
        });
        let network = RuntimeCondition {
            r#type: "NetworkReady".into(),
            status: has_cni,
            reason: if has_cni {
                String::new()
            } else {
                "NetworkPluginNotReady".into()
            },
            message: if has_cni {
                String::new()
            } else {
                format!("no CNI network config found in {}", dir.display())
            },
        };
        let runtime = RuntimeCondition {
            r#type: "RuntimeReady".into(),
            status: true,
            ..Default::default()
        };
        let mut info = HashMap::new();
        if req.verbose {
            info.insert(
                "config".into(),
                serde_json::json!({ "cniConfDir": dir, "rootDir": self.inner.config.root_dir })
                    .to_string(),
            );
        }
        Ok(StatusResponse {
            status: Some(RuntimeStatus {
                conditions: vec![runtime, network],
            }),
            info,
            ..Default::default()
        })
    }
}
