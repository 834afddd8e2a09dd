//! The real [`PodNetwork`]: CNI plugins, and namespaces pinned by bind mounts.

use std::path::Path;
use std::sync::Arc;

use crishim_cni::{netns, Cni, CniError, NetworkResult};

use super::PodNetwork;

/// The real network: CNI plugins, and namespaces pinned by bind mounts (made ahead as spares).
pub struct CniPodNetwork {
    cni: Cni,
    spares: Arc<netns::Spares>,
}

impl CniPodNetwork {
    pub fn new(cni: Cni, spares: Arc<netns::Spares>) -> Self {
        CniPodNetwork { cni, spares }
    }
}

#[tonic::async_trait]
impl PodNetwork for CniPodNetwork {
    fn config(&self) -> Result<(), CniError> {
        self.cni.network().map(drop)
    }

    fn ready(&self) -> Result<(), String> {
        self.cni.ready()
    }

    fn take_netns(&self, path: &Path) -> std::io::Result<()> {
        self.spares.take(path)
    }

    fn pin_netns(&self, pid: u32, path: &Path) -> std::io::Result<()> {
        netns::pin(pid, path)
    }

    fn remove_netns(&self, path: &Path) -> std::io::Result<()> {
        netns::unpin(path)
    }

    async fn add(&self, req: &crishim_cni::PodNetwork) -> Result<NetworkResult, CniError> {
        self.cni.setup(req).await
    }

    async fn del(&self, req: &crishim_cni::PodNetwork) -> Result<(), CniError> {
        self.cni.teardown(req).await
    }

    fn has_result(&self, pod_id: &str) -> bool {
        self.cni.cached_result(pod_id).ok().flatten().is_some()
    }

    fn drain_spares(&self) {
        let spares = self.spares.clone();
        tokio::task::spawn_blocking(move || spares.drain());
    }

    fn close(&self) {
        self.spares.close()
    }
}
