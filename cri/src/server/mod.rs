//! The CRI gRPC services. Each RPC lives in its own file (`image_pull.rs`, …), as in containerd's CRI
//! server; this module only wires them to the generated tonic traits.

mod container_attach;
mod container_create;
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
mod fakes;
mod image;
mod image_list;
mod image_pull;
mod image_remove;
mod image_status;
mod image_volumes;
mod imagefs_info;
#[cfg(test)]
mod lifecycle_tests;
mod list_streams;
mod pod_host;
mod pod_process;
mod recovery;
mod runtime_config;
mod runtime_service;
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
mod version;

pub use pod_host::{CniPodNetwork, HostPodFiles, PodFiles, PodNetwork, PodShims, ProcessPodShims};
pub use runtime_service::{Parts, RuntimeService};

use std::collections::HashSet;
use std::sync::Arc;

use crishim_images::ImageStore;
use crishim_proto::cri;
use tonic::{Request, Response, Status};

use errors::Error;
use tracing::{debug, warn};

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

/// The edge: run one call, log its outcome once, count it in the metrics, and turn its error
/// into the gRPC status the client gets (the only place one is made, `From<Error> for Status`).
async fn logged<T>(
    rpc: &'static str,
    call: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<Response<T>, Status> {
    let t0 = std::time::Instant::now();
    let r = call.await;
    let code = r.as_ref().map_or_else(|e| e.code(), |_| tonic::Code::Ok);
    crate::metrics::global().request(rpc, code, t0.elapsed());
    match r {
        Ok(v) => {
            debug!(rpc, "ok");
            Ok(Response::new(v))
        }
        Err(e) => {
            warn!(rpc, code = ?e.code(), message = %e, "failed");
            Err(e.into())
        }
    }
}

#[tonic::async_trait]
impl cri::image_service_server::ImageService for ImageService {
    async fn list_images(
        &self,
        r: Request<cri::ListImagesRequest>,
    ) -> Result<Response<cri::ListImagesResponse>, Status> {
        logged("ListImages", self.do_list_images(r.into_inner())).await
    }

    async fn image_status(
        &self,
        r: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        logged("ImageStatus", self.do_image_status(r.into_inner())).await
    }

    async fn pull_image(
        &self,
        r: Request<cri::PullImageRequest>,
    ) -> Result<Response<cri::PullImageResponse>, Status> {
        logged("PullImage", self.do_pull_image(r.into_inner())).await
    }

    async fn remove_image(
        &self,
        r: Request<cri::RemoveImageRequest>,
    ) -> Result<Response<cri::RemoveImageResponse>, Status> {
        logged("RemoveImage", self.do_remove_image(r.into_inner())).await
    }

    type StreamImagesStream = list_streams::Chunks<cri::StreamImagesResponse>;

    async fn stream_images(
        &self,
        r: Request<cri::StreamImagesRequest>,
    ) -> Result<Response<Self::StreamImagesStream>, Status> {
        logged("StreamImages", self.do_stream_images(r.into_inner())).await
    }

    async fn image_fs_info(
        &self,
        r: Request<cri::ImageFsInfoRequest>,
    ) -> Result<Response<cri::ImageFsInfoResponse>, Status> {
        logged("ImageFsInfo", self.do_image_fs_info(r.into_inner())).await
    }
}
