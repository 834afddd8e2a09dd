//! `Error`: the runtime is ready once serving; the network only when a CNI config exists.

use std::collections::HashMap;

use super::errors::Error;
use crishim_proto::cri::{
    RuntimeCondition, RuntimeFeatures, RuntimeHandler, RuntimeHandlerFeatures, RuntimeStatus,
    StatusRequest, StatusResponse,
};

use super::runtime_service::RuntimeService;

impl RuntimeService {
    pub(super) async fn do_status(&self, req: StatusRequest) -> Result<StatusResponse, Error> {
        // Read afresh on every call: a config that appears later turns the network ready.
        let ready = self.inner.network.ready();
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
            // Which NRI plugins are registered, as `crictl info` shows containerd's.
            let nri = &self.inner.config.nri;
            info.insert(
                "nri".into(),
                serde_json::json!({
                    "enable": nri.enable,
                    "socketPath": nri.socket_path,
                    "plugins": self.inner.nri.get().map(|n| n.plugins()).unwrap_or_default(),
                })
                .to_string(),
            );
        }
        Ok(StatusResponse {
            status: Some(RuntimeStatus {
                conditions: vec![runtime, network],
            }),
            info,
            // Each handler RunPodSandbox accepts, so that the kubelet knows the node's set.
            runtime_handlers: self
                .inner
                .handlers
                .iter()
                .map(|(name, handler)| RuntimeHandler {
                    name: name.to_string(),
                    features: Some(RuntimeHandlerFeatures {
                        // An external runtime's support is unknown (runc has it from 1.2).
                        recursive_read_only_mounts: handler.binary().is_none()
                            && has_mount_setattr(),
                        // hostUsers: false pods, where idmapped mounts work on the image
                        // filesystem; not through an external runtime.
                        user_namespaces: handler.binary().is_none()
                            && idmap_works(self.inner.images.root()),
                    }),
                })
                .collect(),
            features: Some(RuntimeFeatures {
                supplemental_groups_policy: true,
                user_namespaces_host_network: false,
                // `Mount.mount_options` that only take away (nosuid, nodev, noexec, ro).
                mount_options: true,
            }),
        })
    }
}

/// Whether idmapped mounts work where images live, asked once.
fn idmap_works(images: &std::path::Path) -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| crishim_spec::userns::idmap_supported(images))
}

/// Whether the kernel has `mount_setattr(2)` (5.12 and later), which recursive read-only mounts
/// (`rro`) need. Asked once: an empty path on fd -1 fails at once, with ENOSYS only where the call
/// does not exist.
pub(super) fn has_mount_setattr() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        // SAFETY: a null attr with size 0 and an empty path; the kernel reads nothing.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                -1,
                c"".as_ptr(),
                0,
                std::ptr::null::<u8>(),
                0,
            )
        };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS)
    })
}
