//! The `Stream*` RPCs (KEP-5825): each answers what its `List*` twin answers, from the same
//! code, in messages of at least one item that each stay well under the gRPC message limit, so
//! a node with many pods never builds one oversized answer. No items: no message, then EOF.

use std::pin::Pin;

use crishim_proto::cri;
use futures::Stream;
use prost::Message;
use tonic::Status;

use super::errors::Error;

use super::runtime_service::RuntimeService;
use super::ImageService;

/// A server stream of list chunks.
pub(super) type Chunks<R> = Pin<Box<dyn Stream<Item = Result<R, Status>> + Send + 'static>>;

/// The most encoded bytes of items in one message (a quarter of the kubelet's 16 MiB limit).
const CHUNK_BYTES: usize = 4 << 20;

/// `items` in order, as messages `wrap` builds from runs of items of at most [`CHUNK_BYTES`]
/// (an item larger than that goes alone).
pub(super) fn chunked<T: Message, R: Send + 'static>(
    items: Vec<T>,
    wrap: impl Fn(Vec<T>) -> R,
) -> Chunks<R> {
    let mut chunks = Vec::new();
    let (mut run, mut bytes) = (Vec::new(), 0usize);
    for item in items {
        let len = item.encoded_len();
        if !run.is_empty() && bytes.saturating_add(len) > CHUNK_BYTES {
            chunks.push(Ok(wrap(std::mem::take(&mut run))));
            bytes = 0;
        }
        bytes = bytes.saturating_add(len);
        run.push(item);
    }
    if !run.is_empty() {
        chunks.push(Ok(wrap(run)));
    }
    Box::pin(futures::stream::iter(chunks))
}

impl RuntimeService {
    pub(super) async fn do_stream_pod_sandboxes(
        &self,
        req: cri::StreamPodSandboxesRequest,
    ) -> Result<Chunks<cri::StreamPodSandboxesResponse>, Error> {
        let list = cri::ListPodSandboxRequest { filter: req.filter };
        let items = self.do_list_pod_sandbox(list).await?.items;
        Ok(chunked(items, |pod_sandboxes| {
            cri::StreamPodSandboxesResponse { pod_sandboxes }
        }))
    }

    pub(super) async fn do_stream_containers(
        &self,
        req: cri::StreamContainersRequest,
    ) -> Result<Chunks<cri::StreamContainersResponse>, Error> {
        let list = cri::ListContainersRequest { filter: req.filter };
        let items = self.do_list_containers(list).await?.containers;
        Ok(chunked(items, |containers| cri::StreamContainersResponse {
            containers,
        }))
    }

    pub(super) async fn do_stream_container_stats(
        &self,
        req: cri::StreamContainerStatsRequest,
    ) -> Result<Chunks<cri::StreamContainerStatsResponse>, Error> {
        let list = cri::ListContainerStatsRequest { filter: req.filter };
        let items = self.do_list_container_stats(list).await?.stats;
        Ok(chunked(items, |container_stats| {
            cri::StreamContainerStatsResponse { container_stats }
        }))
    }

    pub(super) async fn do_stream_pod_sandbox_stats(
        &self,
        req: cri::StreamPodSandboxStatsRequest,
    ) -> Result<Chunks<cri::StreamPodSandboxStatsResponse>, Error> {
        let list = cri::ListPodSandboxStatsRequest { filter: req.filter };
        let items = self.do_list_pod_sandbox_stats(list).await?.stats;
        Ok(chunked(items, |pod_sandbox_stats| {
            cri::StreamPodSandboxStatsResponse { pod_sandbox_stats }
        }))
    }

    pub(super) async fn do_stream_pod_sandbox_metrics(
        &self,
        _req: cri::StreamPodSandboxMetricsRequest,
    ) -> Result<Chunks<cri::StreamPodSandboxMetricsResponse>, Error> {
        let list = cri::ListPodSandboxMetricsRequest {};
        let items = self.do_list_pod_sandbox_metrics(list).await?.pod_metrics;
        Ok(chunked(items, |pod_sandbox_metrics| {
            cri::StreamPodSandboxMetricsResponse {
                pod_sandbox_metrics,
            }
        }))
    }
}

impl ImageService {
    pub(super) async fn do_stream_images(
        &self,
        req: cri::StreamImagesRequest,
    ) -> Result<Chunks<cri::StreamImagesResponse>, Error> {
        let list = cri::ListImagesRequest { filter: req.filter };
        let items = self.do_list_images(list).await?.images;
        Ok(chunked(items, |images| cri::StreamImagesResponse {
            images,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn pod(id: usize, label_bytes: usize) -> cri::PodSandbox {
        cri::PodSandbox {
            id: format!("{id:064}"),
            labels: [("l".to_string(), "x".repeat(label_bytes))].into(),
            ..Default::default()
        }
    }

    async fn sizes(items: Vec<cri::PodSandbox>) -> Vec<usize> {
        let chunks: Vec<_> = chunked(items, |pod_sandboxes| cri::StreamPodSandboxesResponse {
            pod_sandboxes,
        })
        .collect()
        .await;
        chunks
            .into_iter()
            .map(|c| c.unwrap().pod_sandboxes.len())
            .collect()
    }

    #[tokio::test]
    async fn lists_are_cut_into_messages_under_the_limit_each_item_once() {
        assert!(sizes(Vec::new()).await.is_empty(), "no items: no message");
        assert_eq!(sizes((0..110).map(|i| pod(i, 10)).collect()).await, [110]);
        // 10 pods of 1 MiB labels: 3 fit in 4 MiB.
        let big: Vec<_> = (0..10).map(|i| pod(i, 1 << 20)).collect();
        assert_eq!(sizes(big).await, [3, 3, 3, 1]);
        // One item over the budget still goes, alone.
        let huge = vec![pod(0, 10), pod(1, 5 << 20), pod(2, 10)];
        assert_eq!(sizes(huge).await, [1, 1, 1]);
        let ids: Vec<String> = chunked((0..7).map(|i| pod(i, 1 << 20)).collect(), |p| p)
            .flat_map(|c| futures::stream::iter(c.unwrap()))
            .map(|p| p.id)
            .collect()
            .await;
        let want: Vec<String> = (0..7).map(|i| format!("{i:064}")).collect();
        assert_eq!(ids, want, "every item once, in order");
    }
}
