//! The pod's network through CNI: ADD when the sandbox starts (in the infra process's network
//! namespace, pinned by a bind mount so DEL still works after the infra process is gone), DEL when
//! it stops, retried on remove until it succeeds, so no IP address is leaked.

use std::path::PathBuf;

use super::errors::Error;
use crishim_state::records::PodRecord;
use tracing::info;

use super::runtime_service::Inner;
use crishim_cni::{CniError, Dns, PodNetwork, PortMapping};

impl Inner {
    /// Where the pod's network namespace is pinned.
    pub(super) fn netns_path(&self, pod_id: &str) -> PathBuf {
        self.config.state_dir.join("netns").join(pod_id)
    }

    fn cni_request(&self, pod: &PodRecord) -> PodNetwork {
        let meta = pod.config.metadata.clone().unwrap_or_default();
        PodNetwork {
            id: pod.id.clone(),
            netns: self.netns_path(&pod.id),
            ifname: "eth0".into(),
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            port_mappings: pod
                .config
                .port_mappings
                .iter()
                .map(|p| PortMapping {
                    host_port: p.host_port,
                    container_port: p.container_port,
                    protocol: match crishim_proto::cri::Protocol::try_from(p.protocol) {
                        Ok(crishim_proto::cri::Protocol::Udp) => "udp".into(),
                        Ok(crishim_proto::cri::Protocol::Sctp) => "sctp".into(),
                        _ => "tcp".into(),
                    },
                    host_ip: p.host_ip.clone(),
                })
                .collect(),
            dns: pod.config.dns_config.as_ref().map(|d| Dns {
                servers: d.servers.clone(),
                searches: d.searches.clone(),
                options: d.options.clone(),
            }),
            capability_args: Default::default(),
        }
    }

    /// CNI ADD for a pod with its own network namespace: the daemon's, made and pinned at
    /// [`Self::netns_path`] before the shim started (without a CNI config, RunPodSandbox makes
    /// none and the pod keeps only the infra's loopback). Returns the pod's IPs, primary first.
    pub(super) async fn setup_network(&self, pod: &PodRecord) -> Result<Vec<String>, Error> {
        let result = self
            .network
            .add(&self.cni_request(pod))
            .await
            .map_err(|source| Error::Cni {
                what: "setting up",
                source,
            })?;
        let mut ips: Vec<String> = result.ips.iter().map(|ip| ip.to_string()).collect();
        if let Some(primary) = result.pod_ip() {
            // Primary first, as PodSandboxStatus reports it.
            ips.retain(|ip| *ip != primary.to_string());
            ips.insert(0, primary.to_string());
        }
        info!(pod = %pod.id, ips = ?ips, "pod network ready");
        Ok(ips)
    }

    /// With no pod left, the spare network namespace goes too: an idle node holds none. In the
    /// background: it may wait for a spare being made and for the unmount, which no caller needs.
    pub(super) fn drop_spare_netns_if_idle(&self) {
        if !self.store.has_pods() {
            self.network.drain_spares();
        }
    }

    /// CNI DEL and unpinning; idempotent. On failure the pin and the CNI cache stay, so a later
    /// stop or remove retries it.
    pub(super) async fn teardown_network(&self, pod: &PodRecord) -> Result<(), Error> {
        if pod.host_network {
            return Ok(());
        }
        let path = self.netns_path(&pod.id);
        let cached = self.network.has_result(&pod.id);
        if cached || path.exists() {
            match self.network.del(&self.cni_request(pod)).await {
                Ok(()) | Err(CniError::NoConfig(_)) => {}
                Err(source) => {
                    return Err(Error::Cni {
                        what: "tearing down",
                        source,
                    })
                }
            }
        }
        self.network
            .remove_netns(&path)
            .map_err(|e| Error::internal(format!("unpinning {}: {e}", path.display())))
    }
}
