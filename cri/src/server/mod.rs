//! The CRI gRPC services. Each RPC lives in its own file (`image_pull.rs`, …), as in containerd's CRI
//! server; `instrumented.rs` wires them to the generated tonic traits and is the one place their
//! errors become gRPC statuses.

mod container_attach;
mod container_create;
mod container_events;
mod container_exec;
mod container_exec_sync;
mod container_list;
mod container_remove;
mod container_reopen_log;
mod container_start;
mod container_stats;
mod container_status;
mod container_stop;
mod container_update_resources;
pub mod errors;
mod events;
#[cfg(test)]
mod exec_tests;
#[cfg(test)]
mod fakes;
mod image;
mod image_list;
mod image_pull;
mod image_remove;
mod image_status;
mod image_volumes;
mod imagefs_info;
mod instrumented;
#[cfg(test)]
mod lifecycle_tests;
mod list_streams;
mod lsm;
mod nri;
mod pod_host;
mod pod_process;
mod recovery;
mod runtime_config;
mod runtime_service;
#[cfg(test)]
mod sandbox_id_tests;
mod sandbox_list;
mod sandbox_metrics;
mod sandbox_network;
mod sandbox_port_forward;
mod sandbox_remove;
mod sandbox_run;
mod sandbox_stats;
mod sandbox_status;
mod sandbox_stop;
#[cfg(test)]
mod sandbox_tests;
mod sandbox_update_resources;
mod status;
mod stop_signal;
mod streaming;
mod update_runtime_config;
#[cfg(test)]
mod update_tests;
mod version;

pub use pod_host::files::HostPodFiles;
pub use pod_host::network::CniPodNetwork;
pub use pod_host::shims::ProcessPodShims;
pub use pod_host::{PodFiles, PodNetwork, PodShims};
pub(crate) use runtime_service::sibling_binary;
pub use runtime_service::{Parts, RuntimeService};

use std::collections::HashSet;
use std::sync::Arc;

use crishim_images::ImageStore;

/// The CRI `ImageService`.
#[derive(Clone)]
pub struct ImageService {
    store: Arc<ImageStore>,
    pinned: Arc<HashSet<String>>,
    /// The node's RuntimeClass handlers: `ImageSpec.runtime_handler` must name one.
    handlers: Arc<crate::runtimes::Handlers>,
}

impl ImageService {
    pub fn new(store: Arc<ImageStore>, pinned: impl IntoIterator<Item = String>) -> Self {
        // Pinned names are compared in normalised form, so `pause:3.9` pins `docker.io/library/pause:3.9`.
        let pinned = pinned
            .into_iter()
            .map(|p| match crishim_images::Reference::parse(&p) {
                Ok(r) => r.tagged().unwrap_or(p),
                Err(_) => p,
            })
            .collect();
        ImageService {
            store,
            pinned: Arc::new(pinned),
            handlers: Arc::new(crate::runtimes::Handlers::new(&Default::default())),
        }
    }

    /// Accept the handlers of `[runtimes]` in `ImageSpec.runtime_handler`, not only the default.
    pub fn with_handlers(mut self, handlers: crate::runtimes::Handlers) -> Self {
        self.handlers = Arc::new(handlers);
        self
    }
}

/// A CRI label selector: every key must be present with the same value.
fn labels_match(
    selector: &std::collections::HashMap<String, String>,
    labels: &std::collections::HashMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl runtime_service::Inner {
    /// `view` of each pod whose id starts with `id` (any, when empty) and whose labels match
    /// `selector`, with no copy of the records; `None` leaves a pod out.
    fn pods_viewed<T>(
        &self,
        id: &str,
        selector: &std::collections::HashMap<String, String>,
        view: impl Fn(&crishim_state::records::PodRecord) -> Option<T>,
    ) -> Vec<T> {
        self.store.pods_viewed(|p| {
            (p.id.starts_with(id) && labels_match(selector, &p.config.labels))
                .then(|| view(p))
                .flatten()
        })
    }
}
