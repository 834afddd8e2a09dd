//! The edge of the server: the tonic traits wired to the handlers. Each call is timed, logged
//! once and counted, and its error becomes the gRPC status the client gets, here and nowhere
//! else (containerd's `instrumented_service.go`).

use crishim_proto::cri;
use tonic::{Request, Response, Status};
use tracing::{debug, warn};

use super::errors::Error;
use super::events::EventStream;
use super::list_streams::Chunks;
use super::runtime_service::RuntimeService;
use super::ImageService;

/// The edge: run one call, log its outcome once, count it in the metrics, and turn its error
/// into the gRPC status the client gets (the only place one is made, `From<Error> for Status`).
pub(super) async fn logged<T>(
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

    type StreamImagesStream = Chunks<cri::StreamImagesResponse>;

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

#[tonic::async_trait]
impl cri::runtime_service_server::RuntimeService for RuntimeService {
    async fn version(
        &self,
        r: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        logged("Version", self.do_version(r.into_inner())).await
    }
    async fn run_pod_sandbox(
        &self,
        r: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        logged("RunPodSandbox", self.do_run_pod_sandbox(r.into_inner())).await
    }
    async fn stop_pod_sandbox(
        &self,
        r: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        logged("StopPodSandbox", self.do_stop_pod_sandbox(r.into_inner())).await
    }
    async fn remove_pod_sandbox(
        &self,
        r: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        logged(
            "RemovePodSandbox",
            self.do_remove_pod_sandbox(r.into_inner()),
        )
        .await
    }
    async fn pod_sandbox_status(
        &self,
        r: Request<cri::PodSandboxStatusRequest>,
    ) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
        logged(
            "PodSandboxStatus",
            self.do_pod_sandbox_status(r.into_inner()),
        )
        .await
    }
    async fn list_pod_sandbox(
        &self,
        r: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        logged("ListPodSandbox", self.do_list_pod_sandbox(r.into_inner())).await
    }
    async fn create_container(
        &self,
        r: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        logged("CreateContainer", self.do_create_container(r.into_inner())).await
    }
    async fn start_container(
        &self,
        r: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        logged("StartContainer", self.do_start_container(r.into_inner())).await
    }
    async fn stop_container(
        &self,
        r: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        logged("StopContainer", self.do_stop_container(r.into_inner())).await
    }
    async fn remove_container(
        &self,
        r: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        logged("RemoveContainer", self.do_remove_container(r.into_inner())).await
    }
    async fn list_containers(
        &self,
        r: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        logged("ListContainers", self.do_list_containers(r.into_inner())).await
    }
    async fn container_status(
        &self,
        r: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        logged("ContainerStatus", self.do_container_status(r.into_inner())).await
    }
    async fn reopen_container_log(
        &self,
        r: Request<cri::ReopenContainerLogRequest>,
    ) -> Result<Response<cri::ReopenContainerLogResponse>, Status> {
        logged(
            "ReopenContainerLog",
            self.do_reopen_container_log(r.into_inner()),
        )
        .await
    }
    async fn exec_sync(
        &self,
        r: Request<cri::ExecSyncRequest>,
    ) -> Result<Response<cri::ExecSyncResponse>, Status> {
        logged("ExecSync", self.do_exec_sync(r.into_inner())).await
    }
    async fn update_runtime_config(
        &self,
        r: Request<cri::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<cri::UpdateRuntimeConfigResponse>, Status> {
        logged(
            "UpdateRuntimeConfig",
            self.do_update_runtime_config(r.into_inner()),
        )
        .await
    }
    async fn status(
        &self,
        r: Request<cri::StatusRequest>,
    ) -> Result<Response<cri::StatusResponse>, Status> {
        logged("Status", self.do_status(r.into_inner())).await
    }
    async fn runtime_config(
        &self,
        r: Request<cri::RuntimeConfigRequest>,
    ) -> Result<Response<cri::RuntimeConfigResponse>, Status> {
        logged("RuntimeConfig", self.do_runtime_config(r.into_inner())).await
    }

    async fn update_container_resources(
        &self,
        r: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
        logged(
            "UpdateContainerResources",
            self.do_update_container_resources(r.into_inner()),
        )
        .await
    }
    async fn exec(
        &self,
        r: Request<cri::ExecRequest>,
    ) -> Result<Response<cri::ExecResponse>, Status> {
        logged("Exec", self.do_exec(r.into_inner())).await
    }
    async fn attach(
        &self,
        r: Request<cri::AttachRequest>,
    ) -> Result<Response<cri::AttachResponse>, Status> {
        logged("Attach", self.do_attach(r.into_inner())).await
    }
    async fn port_forward(
        &self,
        r: Request<cri::PortForwardRequest>,
    ) -> Result<Response<cri::PortForwardResponse>, Status> {
        logged("PortForward", self.do_port_forward(r.into_inner())).await
    }
    async fn container_stats(
        &self,
        r: Request<cri::ContainerStatsRequest>,
    ) -> Result<Response<cri::ContainerStatsResponse>, Status> {
        logged("ContainerStats", self.do_container_stats(r.into_inner())).await
    }
    async fn list_container_stats(
        &self,
        r: Request<cri::ListContainerStatsRequest>,
    ) -> Result<Response<cri::ListContainerStatsResponse>, Status> {
        logged(
            "ListContainerStats",
            self.do_list_container_stats(r.into_inner()),
        )
        .await
    }
    async fn pod_sandbox_stats(
        &self,
        r: Request<cri::PodSandboxStatsRequest>,
    ) -> Result<Response<cri::PodSandboxStatsResponse>, Status> {
        logged("PodSandboxStats", self.do_pod_sandbox_stats(r.into_inner())).await
    }
    async fn list_pod_sandbox_stats(
        &self,
        r: Request<cri::ListPodSandboxStatsRequest>,
    ) -> Result<Response<cri::ListPodSandboxStatsResponse>, Status> {
        logged(
            "ListPodSandboxStats",
            self.do_list_pod_sandbox_stats(r.into_inner()),
        )
        .await
    }
    async fn checkpoint_container(
        &self,
        _r: Request<cri::CheckpointContainerRequest>,
    ) -> Result<Response<cri::CheckpointContainerResponse>, Status> {
        logged(
            "CheckpointContainer",
            unsupported_checkpoint("CheckpointContainer"),
        )
        .await
    }
    async fn checkpoint_pod(
        &self,
        _r: Request<cri::CheckpointPodRequest>,
    ) -> Result<Response<cri::CheckpointPodResponse>, Status> {
        logged("CheckpointPod", unsupported_checkpoint("CheckpointPod")).await
    }
    async fn restore_pod(
        &self,
        _r: Request<cri::RestorePodRequest>,
    ) -> Result<Response<cri::RestorePodResponse>, Status> {
        logged("RestorePod", unsupported_checkpoint("RestorePod")).await
    }
    async fn list_metric_descriptors(
        &self,
        r: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
        logged(
            "ListMetricDescriptors",
            self.do_list_metric_descriptors(r.into_inner()),
        )
        .await
    }
    async fn list_pod_sandbox_metrics(
        &self,
        r: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
        logged(
            "ListPodSandboxMetrics",
            self.do_list_pod_sandbox_metrics(r.into_inner()),
        )
        .await
    }

    async fn update_pod_sandbox_resources(
        &self,
        r: Request<cri::UpdatePodSandboxResourcesRequest>,
    ) -> Result<Response<cri::UpdatePodSandboxResourcesResponse>, Status> {
        logged(
            "UpdatePodSandboxResources",
            self.do_update_pod_sandbox_resources(r.into_inner()),
        )
        .await
    }

    type StreamPodSandboxesStream = Chunks<cri::StreamPodSandboxesResponse>;

    async fn stream_pod_sandboxes(
        &self,
        r: Request<cri::StreamPodSandboxesRequest>,
    ) -> Result<Response<Self::StreamPodSandboxesStream>, Status> {
        logged(
            "StreamPodSandboxes",
            self.do_stream_pod_sandboxes(r.into_inner()),
        )
        .await
    }

    type StreamContainersStream = Chunks<cri::StreamContainersResponse>;

    async fn stream_containers(
        &self,
        r: Request<cri::StreamContainersRequest>,
    ) -> Result<Response<Self::StreamContainersStream>, Status> {
        logged(
            "StreamContainers",
            self.do_stream_containers(r.into_inner()),
        )
        .await
    }

    type StreamContainerStatsStream = Chunks<cri::StreamContainerStatsResponse>;

    async fn stream_container_stats(
        &self,
        r: Request<cri::StreamContainerStatsRequest>,
    ) -> Result<Response<Self::StreamContainerStatsStream>, Status> {
        logged(
            "StreamContainerStats",
            self.do_stream_container_stats(r.into_inner()),
        )
        .await
    }

    type StreamPodSandboxStatsStream = Chunks<cri::StreamPodSandboxStatsResponse>;

    async fn stream_pod_sandbox_stats(
        &self,
        r: Request<cri::StreamPodSandboxStatsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxStatsStream>, Status> {
        logged(
            "StreamPodSandboxStats",
            self.do_stream_pod_sandbox_stats(r.into_inner()),
        )
        .await
    }

    type StreamPodSandboxMetricsStream = Chunks<cri::StreamPodSandboxMetricsResponse>;

    async fn stream_pod_sandbox_metrics(
        &self,
        r: Request<cri::StreamPodSandboxMetricsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxMetricsStream>, Status> {
        logged(
            "StreamPodSandboxMetrics",
            self.do_stream_pod_sandbox_metrics(r.into_inner()),
        )
        .await
    }

    type GetContainerEventsStream = EventStream;

    async fn get_container_events(
        &self,
        r: Request<cri::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        Ok(Response::new(self.do_get_container_events(r.into_inner())))
    }
}

/// Checkpoints (KEP-2008) and their restore need CRIU, which crishim does not drive.
async fn unsupported_checkpoint<T>(rpc: &str) -> Result<T, Error> {
    Err(Error::unimplemented(format!(
        "{rpc} is not supported: checkpointing and restoring need CRIU, which crishim does not \
         drive"
    )))
}
