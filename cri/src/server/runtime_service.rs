//! The CRI `RuntimeService`: pods and containers. Each RPC is in its own file (`sandbox_run.rs`,
//! `container_create.rs`, …); this file holds the state they share, and `instrumented.rs` wires
//! the tonic trait to them.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crishim_images::ImageStore;
use crishim_proto::shim::{ContainerState, Request, Response, Status as ShimStatus};
use crishim_state::records::ContainerRecord;

use super::errors::{unexpected, Error};
use super::{CniPodNetwork, HostPodFiles, PodFiles, PodNetwork, PodShims, ProcessPodShims};
use crate::config::Config;
use crate::container_images::ContainerImages;
use crate::shim_client::{Shims, SocketShims, SHIM_TIMEOUT};
use crishim_state::store::Store;

/// Under the systemd driver, requests that change cgroups go through systemd over D-Bus, where
/// libcgroups (youki 0.7) can wait out a 10 s receive timeout more than once (the known stall in
/// docs/kubelet.md, "Cgroup drivers"). They get up to just under the kubelet's 2-minute runtime
/// request timeout.
const SHIM_SYSTEMD_TIMEOUT: Duration = Duration::from_secs(110);

/// What the daemon drives on the host: the real ones in [`RuntimeService::new`], fakes in the
/// handlers' unit tests.
pub struct Parts {
    /// Requests to running shims.
    pub shims: Arc<dyn Shims>,
    /// Container root filesystems and images.
    pub images: Arc<dyn ContainerImages>,
    /// Pods' shim processes.
    pub pod_shims: Arc<dyn PodShims>,
    /// Pods' networks.
    pub network: Arc<dyn PodNetwork>,
    /// Pods' host files.
    pub pod_files: Arc<dyn PodFiles>,
}

#[derive(Clone)]
pub struct RuntimeService {
    pub(super) inner: Arc<Inner>,
}

/// The daemon: the store of pods and containers, and the parts it drives (shims, images, CNI,
/// GPUs, events). Each RPC's file adds its operations to it.
pub struct Inner {
    pub(super) config: Config,
    pub(super) store: Store,
    pub(super) shims: Arc<dyn Shims>,
    pub(super) images: Arc<dyn ContainerImages>,
    /// Starting and killing pods' shims.
    pub(super) pod_shims: Arc<dyn PodShims>,
    /// Pods' networks: CNI and network namespaces.
    pub(super) network: Arc<dyn PodNetwork>,
    /// Pods' /dev/shm and hostname, hosts and resolv.conf.
    pub(super) pod_files: Arc<dyn PodFiles>,
    pub(super) init_binary: PathBuf,
    pub(super) pod_cidr: Mutex<String>,
    pub(super) events: super::events::Events,
    /// Ourselves, for background tasks (exit watchers) that outlive a request.
    pub(super) me: std::sync::Weak<Inner>,
    /// Pods whose shim was found dead, for the task that cleans up after them.
    pub(super) dead_shims: tokio::sync::mpsc::UnboundedSender<String>,
    /// The previous CPU sample of each container (by id) and pod (`pod/<id>`), for CPU rates.
    pub(super) cpu_rates: crate::stats::CpuRates,
    /// The node's GPUs and driver mirror, for GPU requests at CreateContainer.
    pub(super) gpu: crishim_gpu::Gpus,
    /// The server behind the `Exec`, `Attach` and `PortForward` URLs, once started.
    pub(super) streaming: std::sync::OnceLock<crishim_streaming::Server>,
    /// The RuntimeClass handlers (`[runtimes]`).
    pub(super) handlers: crate::runtimes::Handlers,
    /// The empty mount namespace infra processes join (`empty_mnt.rs`), once made.
    pub(super) empty_mnt: std::sync::OnceLock<PathBuf>,
    /// NRI, once started (`[nri] enable`).
    pub(super) nri: std::sync::OnceLock<crishim_nri::adaptation::Nri>,
}

impl RuntimeService {
    /// The empty mount namespace each pod's infra process joins (`empty_mnt.rs`).
    pub fn set_empty_mnt(&self, path: PathBuf) {
        let _ = self.inner.empty_mnt.set(path);
    }

    /// The daemon on this node: records under `<root_dir>/records`, shims under
    /// `<state_dir>/pods`, container filesystems from `images`.
    pub fn new(config: Config, images: Arc<ImageStore>) -> std::io::Result<Self> {
        let store = Store::open(&config.root_dir.join("records"))?;
        let shim_binary = config
            .shim_binary
            .clone()
            .unwrap_or_else(|| sibling_binary("crishim-shim"));
        // The CNI result cache lives with the records: IPs outlive a reboot in host-local's store.
        let cni = crishim_cni::Cni::new(crishim_cni::CniConfig::new(
            config.cni.conf_dir.clone(),
            config.cni.bin_dirs.clone(),
            config.root_dir.join("cni-cache"),
        ));
        // Network namespaces made ahead of the pods that take them.
        let netns_spares = crishim_cni::netns::Spares::new(config.state_dir.join("netns"));
        let parts = Parts {
            shims: Arc::new(SocketShims::new(config.state_dir.join("pods"))),
            images,
            pod_shims: Arc::new(ProcessPodShims::new(
                shim_binary,
                config.state_dir.join("seccomp"),
            )),
            network: Arc::new(CniPodNetwork::new(cni, netns_spares)),
            pod_files: Arc::new(HostPodFiles),
        };
        Ok(Self::with_parts(config, store, parts))
    }

    /// The daemon over the given parts (tests pass fakes).
    pub fn with_parts(config: Config, store: Store, parts: Parts) -> Self {
        let Parts {
            shims,
            images,
            pod_shims,
            network,
            pod_files,
        } = parts;
        let init_binary = config
            .init_binary
            .clone()
            .unwrap_or_else(|| sibling_binary("crishim-init"));
        let (dead_shims, mut dead_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let gpu = crishim_gpu::Gpus::new(&config.gpu, &config.state_dir);
        let handlers = crate::runtimes::Handlers::new(&config.runtimes);
        let service = RuntimeService {
            inner: Arc::new_cyclic(|me| Inner {
                config,
                store,
                shims,
                images,
                pod_shims,
                network,
                pod_files,
                init_binary,
                pod_cidr: Mutex::default(),
                events: super::events::Events::new(),
                me: me.clone(),
                dead_shims,
                cpu_rates: Default::default(),
                gpu,
                streaming: std::sync::OnceLock::new(),
                handlers,
                empty_mnt: std::sync::OnceLock::new(),
                nri: std::sync::OnceLock::new(),
            }),
        };
        let me = Arc::downgrade(&service.inner);
        tokio::spawn(async move {
            while let Some(pod) = dead_rx.recv().await {
                let Some(inner) = me.upgrade() else { return };
                inner.shim_gone(&pod).await;
            }
        });
        service
    }
}

impl RuntimeService {
    /// Pods and containers by state, and the shims followed, for a metrics scrape.
    pub fn gauges(&self) -> crate::metrics::Gauges {
        use crishim_state::records::PodState;
        let store = &self.inner.store;
        let mut g = crate::metrics::Gauges {
            shims: store.watched_count() as u64,
            ..Default::default()
        };
        for state in store.pods_viewed(|p| Some(p.state)) {
            let name = match state {
                PodState::Creating => "creating",
                PodState::Ready => "ready",
                PodState::NotReady => "notready",
            };
            *g.pods.entry(name).or_default() += 1;
        }
        // Followed or exited: current. The others: the state recorded last (a scrape asks no
        // shim).
        let (mut states, others) = store.containers_by_state(|_| true, |_, s| s.status);
        states.extend(
            others
                .iter()
                .map(|c| c.last.as_ref().map_or(ShimStatus::Created, |s| s.status)),
        );
        for status in states {
            let name = match status {
                ShimStatus::Created => "created",
                ShimStatus::Running => "running",
                ShimStatus::Exited => "exited",
                ShimStatus::Unknown => "unknown",
            };
            *g.containers.entry(name).or_default() += 1;
        }
        // Files the containers write: read on a thread of their own, for at most 2 s.
        g.lazy = self.inner.images.lazy_layers();
        g.gpu = crishim_gpu::container::usage_within(
            &crishim_gpu::containers_dir(&self.inner.config.state_dir),
            crishim_gpu::container::USAGE_DEADLINE,
        )
        .unwrap_or_else(|| {
            tracing::warn!(
                "the GPU accounting files took over 2 s to read; GPU gauges left out of this scrape"
            );
            Vec::new()
        });
        g
    }

    /// Reconcile records with what runs, after a restart (see `Inner::recover`).
    pub async fn recover(&self) {
        self.inner.recover().await
    }

    /// The pods' network, to close once serving has stopped.
    pub fn pod_network(&self) -> Arc<dyn PodNetwork> {
        self.inner.network.clone()
    }
}

/// What we know of a container the shim has not reported on.
fn unknown_state(c: &ContainerRecord) -> ContainerState {
    ContainerState::new(c.id.clone(), ShimStatus::Unknown, 0, c.created_at)
}

/// A helper binary next to the running `crishim` (both are installed together).
pub(crate) fn sibling_binary(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from("/usr/local/bin").join(name))
}

impl Inner {
    pub(super) fn pod_state_dir(&self, pod_id: &str) -> PathBuf {
        self.config.state_dir.join("pods").join(pod_id)
    }

    /// hostname, hosts and resolv.conf of a pod, bind-mounted into its containers. They live on
    /// the state tmpfs: they matter only while the pod runs, and a pod start then makes no files
    /// on the node's disk. A pod made by an older daemon keeps its files under `root_dir`.
    pub(super) fn pod_files_dir(&self, pod_id: &str) -> PathBuf {
        let legacy = self.legacy_pod_files_dir(pod_id);
        if legacy.exists() {
            return legacy;
        }
        self.state_pod_files_dir(pod_id)
    }

    /// Where this daemon keeps a pod's files: `<state_dir>/pod-files/<id>`.
    pub(super) fn state_pod_files_dir(&self, pod_id: &str) -> PathBuf {
        self.config
            .state_dir
            .join(crate::host_files::POD_FILES)
            .join(pod_id)
    }

    /// Where daemons before the move to the state tmpfs kept a pod's files.
    pub(super) fn legacy_pod_files_dir(&self, pod_id: &str) -> PathBuf {
        self.config.root_dir.join("pods").join(pod_id)
    }

    /// Every directory a pod owns apart from its containers': its shim's, and its files' (where
    /// this daemon keeps them and where older daemons did).
    pub(super) fn pod_dirs(&self, pod_id: &str) -> [PathBuf; 3] {
        [
            self.pod_state_dir(pod_id),
            self.state_pod_files_dir(pod_id),
            self.legacy_pod_files_dir(pod_id),
        ]
    }

    pub(super) fn bundle_dir(&self, container_id: &str) -> PathBuf {
        self.config.state_dir.join("containers").join(container_id)
    }

    /// One request to the pod's shim.
    pub(super) async fn shim_call(
        &self,
        pod_id: &str,
        req: &Request,
        timeout: Duration,
    ) -> Result<Response, crate::shim_client::ShimError> {
        self.shims.call(pod_id, req, timeout).await
    }

    /// The container's current state: from its shim while it runs, else the last known one.
    /// A container whose shim is gone and which never recorded an exit is reported exited, with why.
    pub(super) async fn refresh(&self, c: &ContainerRecord) -> ContainerState {
        if let Some(last) = &c.last {
            if last.status == ShimStatus::Exited {
                return last.clone();
            }
        }
        // Followed by its pod's Watch stream: the index holds the current state (`c` may be an
        // older copy). The relist and status calls then cost no shim round trip.
        if let Some(s) = self.store.watched_state(c) {
            return s;
        }
        let asked = self
            .shim_call(
                &c.pod_id,
                &Request::State { id: c.id.clone() },
                SHIM_TIMEOUT,
            )
            .await;
        let state = match asked {
            Ok(Response::State(s)) => s,
            // A live shim that never heard of it (a create a crash cut short): nothing runs.
            Ok(Response::Error {
                kind: crishim_proto::shim::ErrorKind::NotFound,
                ..
            }) => ContainerState {
                status: ShimStatus::Exited,
                finished_at: crishim_state::records::now_nanos(),
                exit_code: 255,
                message:
                    "the container is unknown to its pod's shim (its creation was interrupted)"
                        .into(),
                ..unknown_state(c)
            },
            // Busy or slow is not dead: keep what we knew.
            Ok(_)
            | Err(crate::shim_client::ShimError::Timeout(..))
            | Err(crate::shim_client::ShimError::Protocol(..)) => {
                return c.last.clone().unwrap_or_else(|| unknown_state(c));
            }
            Err(crate::shim_client::ShimError::Unreachable(..)) => {
                let recorded = self.state_file(c).or_else(|| c.last.clone());
                match recorded {
                    Some(s) if s.status == ShimStatus::Exited => s,
                    other => {
                        // Its shim is gone without recording an exit: have it cleaned up (in the
                        // background; that takes the pod's lock, which our caller may hold).
                        let _ = self.dead_shims.send(c.pod_id.clone());
                        let base = other.unwrap_or_else(|| unknown_state(c));
                        ContainerState {
                            status: ShimStatus::Exited,
                            exit_code: 255,
                            finished_at: crishim_state::records::now_nanos(),
                            message:
                                "the pod's shim is gone; the container's exit was not recorded"
                                    .into(),
                            ..base
                        }
                    }
                }
            }
        };
        self.update_state(&c.id, state.clone()).await;
        state
    }

    fn state_file(&self, c: &ContainerRecord) -> Option<ContainerState> {
        let p = self
            .pod_state_dir(&c.pod_id)
            .join(crishim_proto::shim::paths::state_file(&c.id));
        serde_json::from_slice(&std::fs::read(p).ok()?).ok()
    }

    pub(super) async fn shim_alive(&self, pod_id: &str) -> bool {
        matches!(
            self.shim_call(pod_id, &Request::Ping, Duration::from_secs(5))
                .await,
            Ok(Response::Pong { .. })
        )
    }

    /// How long a shim request that creates, changes or removes cgroups may take.
    pub(super) fn cgroup_request_timeout(&self) -> Duration {
        match self.config.cgroup_driver {
            crishim_spec::cgroups::CgroupDriver::Cgroupfs => SHIM_TIMEOUT,
            crishim_spec::cgroups::CgroupDriver::Systemd => SHIM_SYSTEMD_TIMEOUT,
        }
    }

    /// Send a shim request that answers `Ok` (updates, kills, deletes: cgroup work under the
    /// systemd driver).
    pub(super) async fn shim_ok(&self, pod_id: &str, req: Request) -> Result<(), Error> {
        let timeout = self.cgroup_request_timeout();
        match self.shim_call(pod_id, &req, timeout).await? {
            Response::Ok | Response::State(_) => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}
