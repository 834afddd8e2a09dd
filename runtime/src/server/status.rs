//! `Status`: the runtime is ready once serving; the network only when a CNI config exists.

use std::collections::HashMap;

use crishim_proto::cri::{
    RuntimeCondition, RuntimeHandler, RuntimeHandlerFeatures, RuntimeStatus, StatusRequest,
    StatusResponse,
};
use tonic::Status;

use super::runtime_service::RuntimeService;
use super::sandbox_run::RUNTIME_HANDLERS;

impl RuntimeService {
    pub(super) async fn do_status(&self, req: StatusRequest) -> Result<StatusResponse, Status> {
        // Read afresh on every call: a config that appears later turns the network ready.
        let ready = self.inner.cni.ready();
        let network = RuntimeCondition {
            r#type: "NetworkReady".into(),
            status: ready.is_ok(),
            reason: if ready.is_ok() {
                String::new()
            } else {
                "NetworkPluginNotReady".into()
            },
            message: ready.err().unwrap_or_default(),
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
                serde_json::json!({ "cniConfDir": self.inner.config.cni.conf_dir, "rootDir": self.inner.config.root_dir })
                    .to_string(),
            );
        }
        Ok(StatusResponse {
            status: Some(RuntimeStatus {
                conditions: vec![runtime, network],
            }),
            info,
            // Each handler RunPodSandbox accepts, so that the kubelet knows the node's set.
            runtime_handlers: RUNTIME_HANDLERS
                .iter()
                .map(|name| RuntimeHandler {
                    name: name.to_string(),
                    features: Some(RuntimeHandlerFeatures::default()),
                })
                .collect(),
            ..Default::default()
        })
    }
}
