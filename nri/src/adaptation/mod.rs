//! The runtime's side of NRI: plugins register (over the socket, or launched from
//! `plugin_path`), are configured and synchronized, and then hear of each pod and container
//! event in index order. Their adjustments to a container being created come back merged, and
//! their updates to other containers go to the [`Runtime`].
//!
//! A plugin is hostile until bounded. Every call waits at most `plugin_request_timeout`; a
//! plugin that times out, disconnects or breaks the protocol is dropped and the event goes on
//! without it. A plugin that answers with an error fails the request it was asked about (for
//! the events that can fail), and the error names it.

mod launch;
mod listen;
mod plugin;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::api::{self, Event, EventMask};
use crate::conn::{CallError, Endpoint, Role};
use crate::merge::{Merge, MergeError, Merged};

use plugin::{Plugin, Registration, RuntimeHandler};

/// Plugins registered at once; connections beyond are refused.
pub const MAX_PLUGINS: usize = 32;
/// A synchronization message stays under ttrpc's limit with room to spare.
const SYNC_MESSAGE_BUDGET: usize = 3 << 20;

/// `[nri]`, as containerd names its keys.
#[derive(Debug, Clone)]
pub struct Config {
    pub socket_path: PathBuf,
    pub plugin_path: PathBuf,
    pub plugin_config_path: PathBuf,
    pub registration_timeout: Duration,
    pub request_timeout: Duration,
    /// No plugin may connect over the socket; only pre-installed ones run.
    pub disable_connections: bool,
    pub runtime_name: String,
    pub runtime_version: String,
}

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What NRI needs from the runtime.
pub trait Runtime: Send + Sync + 'static {
    /// Every pod and container, for a plugin's synchronization.
    fn snapshot(&self) -> BoxFuture<(Vec<api::PodSandbox>, Vec<api::Container>)>;
    /// Applies plugins' updates and evictions, as `UpdateContainerResources` and a stop would;
    /// returns the updates that failed.
    fn update_containers(
        &self,
        updates: Vec<api::ContainerUpdate>,
        evictions: Vec<api::ContainerEviction>,
    ) -> BoxFuture<Vec<api::ContainerUpdate>>;
}

#[derive(Debug, thiserror::Error)]
pub enum NriError {
    #[error("NRI plugin {plugin} failed {event}: {message}")]
    Plugin {
        plugin: String,
        event: &'static str,
        message: String,
    },
    #[error("NRI: {0}")]
    Merge(#[from] MergeError),
    #[error("NRI plugin {plugin} rejected the container's adjustments: {reason}")]
    Rejected { plugin: String, reason: String },
    #[error("NRI plugin registration: {0}")]
    Registration(String),
    #[error("NRI: {0}")]
    Setup(String),
}

/// The NRI adaptation. Cloning shares it.
#[derive(Clone)]
pub struct Nri {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    runtime: Arc<dyn Runtime>,
    /// In index order.
    plugins: RwLock<Vec<Arc<Plugin>>>,
    /// One event at a time, as NRI's own adaptation does (plugins keep state and count on it);
    /// a plugin's synchronization holds it too, so that it sees each pod and container once: in
    /// its snapshot, or as an event after it.
    gate: tokio::sync::Mutex<()>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Nri {
    /// Launches the pre-installed plugins, waits for them to register (each within the
    /// registration timeout), then listens for plugins on the socket.
    pub async fn start(config: Config, runtime: Arc<dyn Runtime>) -> Result<Nri, NriError> {
        let nri = Nri {
            inner: Arc::new(Inner {
                config,
                runtime,
                plugins: RwLock::new(Vec::new()),
                gate: tokio::sync::Mutex::new(()),
                tasks: Mutex::new(Vec::new()),
            }),
        };
        launch::launch_all(&nri.inner).await;
        if !nri.inner.config.disable_connections {
            let task = listen::listen(nri.inner.clone())?;
            nri.inner.tasks().push(task);
        }
        Ok(nri)
    }

    /// The registered plugins' names (`idx-name`), in index order.
    pub fn plugins(&self) -> Vec<String> {
        self.inner.plugins().iter().map(|p| p.name()).collect()
    }

    /// Whether any plugin is registered: callers skip building messages when none is.
    pub fn has_plugins(&self) -> bool {
        !self
            .inner
            .plugins
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Stops listening and drops every plugin (killing those crishim launched).
    pub fn shutdown(&self) {
        for t in self.inner.tasks().drain(..) {
            t.abort();
        }
        let plugins = std::mem::take(&mut *self.inner.plugins_mut());
        for p in plugins {
            p.close("the runtime is shutting down");
        }
    }

    pub async fn run_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), NriError> {
        let req = api::RunPodSandboxRequest {
            pod: Some(pod.clone()),
        };
        self.inner
            .notify(
                Event::RunPodSandbox,
                "RunPodSandbox",
                &req,
                legacy(pod, None),
            )
            .await
    }

    pub async fn stop_pod_sandbox(&self, pod: &api::PodSandbox) {
        let req = api::StopPodSandboxRequest {
            pod: Some(pod.clone()),
        };
        self.inner
            .notify_logged(
                Event::StopPodSandbox,
                "StopPodSandbox",
                &req,
                legacy(pod, None),
            )
            .await
    }

    pub async fn remove_pod_sandbox(&self, pod: &api::PodSandbox) {
        let req = api::RemovePodSandboxRequest {
            pod: Some(pod.clone()),
        };
        self.inner
            .notify_logged(
                Event::RemovePodSandbox,
                "RemovePodSandbox",
                &req,
                legacy(pod, None),
            )
            .await
    }

    pub async fn update_pod_sandbox(
        &self,
        pod: &api::PodSandbox,
        overhead: Option<api::LinuxResources>,
        resources: Option<api::LinuxResources>,
    ) -> Result<(), NriError> {
        let req = api::UpdatePodSandboxRequest {
            pod: Some(pod.clone()),
            overhead_linux_resources: overhead,
            linux_resources: resources,
        };
        // Plugins older than this event have no StateChange for it either.
        self.inner
            .notify(Event::UpdatePodSandbox, "UpdatePodSandbox", &req, None)
            .await
    }

    pub async fn post_update_pod_sandbox(&self, pod: &api::PodSandbox) {
        let req = api::PostUpdatePodSandboxRequest {
            pod: Some(pod.clone()),
        };
        self.inner
            .notify_logged(
                Event::PostUpdatePodSandbox,
                "PostUpdatePodSandbox",
                &req,
                legacy(pod, None),
            )
            .await
    }

    /// The plugins' adjustments to `container`, merged, with their updates to other
    /// containers. Two plugins that set the same field fail it, naming both.
    pub async fn create_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<Merged, NriError> {
        let _events = self.inner.gate.lock().await;
        let req = api::CreateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        let mut merge = Merge::new(container);
        let plugins = self.inner.plugins();
        for p in plugins
            .iter()
            .filter(|p| p.subscribed(Event::CreateContainer))
        {
            let reply: api::CreateContainerResponse =
                match self.inner.call(p, "CreateContainer", &req, None).await? {
                    Some(reply) => reply,
                    None => continue,
                };
            // Bounded and checked for conflicts as it merges.
            merge.reply(&p.name(), reply)?;
        }
        let merged = merge.finish();
        self.inner
            .validate(&plugins, pod, container, &merged)
            .await?;
        Ok(merged)
    }

    pub async fn post_create_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let req = api::PostCreateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        self.inner
            .notify_logged(
                Event::PostCreateContainer,
                "PostCreateContainer",
                &req,
                legacy(pod, Some(container)),
            )
            .await
    }

    /// Tells plugins a create they adjusted did not happen after all, as stop and remove.
    pub async fn undo_create_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let _ = self.stop_container(pod, container).await;
        self.remove_container(pod, container).await;
    }

    pub async fn start_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<(), NriError> {
        let req = api::StartContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        self.inner
            .notify(
                Event::StartContainer,
                "StartContainer",
                &req,
                legacy(pod, Some(container)),
            )
            .await
    }

    pub async fn post_start_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let req = api::PostStartContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        self.inner
            .notify_logged(
                Event::PostStartContainer,
                "PostStartContainer",
                &req,
                legacy(pod, Some(container)),
            )
            .await
    }

    /// The plugins' say on an update of `container` to `resources`: the merged updates, the
    /// container's own among them, which replace what was asked.
    pub async fn update_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
        resources: &api::LinuxResources,
    ) -> Result<Merged, NriError> {
        let _events = self.inner.gate.lock().await;
        let req = api::UpdateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
            linux_resources: Some(resources.clone()),
        };
        // Not a create: updates to the container itself are what plugins answer with.
        let mut merge = Merge::new(&api::Container::default());
        for p in self
            .inner
            .plugins()
            .iter()
            .filter(|p| p.subscribed(Event::UpdateContainer))
        {
            let Some(reply) = self
                .inner
                .call::<api::UpdateContainerResponse>(p, "UpdateContainer", &req, None)
                .await?
            else {
                continue;
            };
            let name = p.name();
            merge.update(&name, reply.update)?;
            merge.evict(&name, reply.evict)?;
        }
        Ok(merge.finish())
    }

    pub async fn post_update_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let req = api::PostUpdateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        self.inner
            .notify_logged(
                Event::PostUpdateContainer,
                "PostUpdateContainer",
                &req,
                legacy(pod, Some(container)),
            )
            .await
    }

    /// Tells plugins `container` stopped; returns their updates to the other containers.
    pub async fn stop_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Vec<api::ContainerUpdate> {
        let _events = self.inner.gate.lock().await;
        let req = api::StopContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        let mut merge = Merge::new(&api::Container::default());
        for p in self
            .inner
            .plugins()
            .iter()
            .filter(|p| p.subscribed(Event::StopContainer))
        {
            let reply = self
                .inner
                .call::<api::StopContainerResponse>(p, "StopContainer", &req, None)
                .await;
            let update = match reply {
                Ok(Some(r)) => r.update,
                Ok(None) => continue,
                Err(e) => {
                    warn!(error = %e, "NRI StopContainer");
                    continue;
                }
            };
            if let Err(e) = merge.update(&p.name(), update) {
                warn!(error = %e, "NRI StopContainer: updates dropped");
            }
        }
        merge.finish().updates
    }

    pub async fn remove_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let req = api::RemoveContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        self.inner
            .notify_logged(
                Event::RemoveContainer,
                "RemoveContainer",
                &req,
                legacy(pod, Some(container)),
            )
            .await
    }
}

/// The `StateChange` that plugins built before an event's own RPC get instead.
fn legacy(
    pod: &api::PodSandbox,
    container: Option<&api::Container>,
) -> Option<api::StateChangeEvent> {
    Some(api::StateChangeEvent {
        event: 0,
        pod: Some(pod.clone()),
        container: container.cloned(),
    })
}

impl Inner {
    fn plugins(&self) -> Vec<Arc<Plugin>> {
        self.plugins
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn plugins_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Arc<Plugin>>> {
        self.plugins.write().unwrap_or_else(|e| e.into_inner())
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops `p`: it leaves the list, its connection closes and a launched process is killed.
    fn drop_plugin(&self, p: &Arc<Plugin>, reason: &str) {
        self.plugins_mut().retain(|q| !Arc::ptr_eq(q, p));
        p.close(reason);
    }

    /// One call to `p`. A plugin that is gone, late or speaks nonsense is dropped (`None`: go
    /// on without it); one that answers with an error fails the event.
    async fn call<R: prost::Message + Default>(
        &self,
        p: &Arc<Plugin>,
        method: &'static str,
        req: &impl prost::Message,
        legacy: Option<(Event, api::StateChangeEvent)>,
    ) -> Result<Option<R>, NriError> {
        let timeout = self.config.request_timeout;
        let mut reply = p.call::<R>(method, req, timeout).await;
        if let (Err(e), Some((event, mut change))) = (&reply, legacy) {
            if e.is_unimplemented() {
                change.event = event as i32;
                reply = p
                    .call::<api::Empty>("StateChange", &change, timeout)
                    .await
                    .map(|_| R::default());
            }
        }
        match reply {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.is_fatal() => {
                warn!(plugin = %p.name(), %method, error = %e, "dropping NRI plugin");
                self.drop_plugin(p, &format!("{method}: {e}"));
                Ok(None)
            }
            Err(e) => Err(NriError::Plugin {
                plugin: p.name(),
                event: method,
                message: match e {
                    CallError::Status { message, .. } => message,
                    other => other.to_string(),
                },
            }),
        }
    }

    /// An event every subscribed plugin hears, in order; a plugin's error fails it.
    async fn notify(
        &self,
        event: Event,
        method: &'static str,
        req: &impl prost::Message,
        legacy: Option<api::StateChangeEvent>,
    ) -> Result<(), NriError> {
        let _events = self.gate.lock().await;
        for p in self.plugins().iter().filter(|p| p.subscribed(event)) {
            self.call::<api::Empty>(p, method, req, legacy.clone().map(|l| (event, l)))
                .await?;
        }
        Ok(())
    }

    /// [`notify`](Self::notify) for an event that cannot fail: errors are logged.
    async fn notify_logged(
        &self,
        event: Event,
        method: &'static str,
        req: &impl prost::Message,
        legacy: Option<api::StateChangeEvent>,
    ) {
        if let Err(e) = self.notify(event, method, req, legacy).await {
            warn!(error = %e, "NRI {method}");
        }
    }

    /// Asks the validating plugins whether the merged adjustment may stand.
    async fn validate(
        &self,
        plugins: &[Arc<Plugin>],
        pod: &api::PodSandbox,
        container: &api::Container,
        merged: &Merged,
    ) -> Result<(), NriError> {
        let validators: Vec<_> = plugins
            .iter()
            .filter(|p| p.subscribed(Event::ValidateContainerAdjustment))
            .collect();
        if validators.is_empty() {
            return Ok(());
        }
        let req = api::ValidateContainerAdjustmentRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
            adjust: Some(merged.adjust.clone()),
            update: merged.updates.clone(),
            owners: Some(merged.owners.clone()),
            plugins: plugins
                .iter()
                .map(|p| api::PluginInstance {
                    name: p.base.clone(),
                    index: p.idx.clone(),
                })
                .collect(),
        };
        for p in validators {
            let Some(reply) = self
                .call::<api::ValidateContainerAdjustmentResponse>(
                    p,
                    "ValidateContainerAdjustment",
                    &req,
                    None,
                )
                .await?
            else {
                continue;
            };
            if reply.reject {
                return Err(NriError::Rejected {
                    plugin: p.name(),
                    reason: reply.reason,
                });
            }
        }
        Ok(())
    }

    /// Takes a plugin through registration, configuration and synchronization, and adds it.
    /// `launched` names a pre-installed plugin (and holds its process and configuration).
    async fn register(
        self: &Arc<Self>,
        stream: tokio::net::UnixStream,
        launched: Option<launch::Launched>,
    ) -> Result<(), NriError> {
        let (tx, rx) = oneshot::channel();
        let ready = Arc::new(AtomicBool::new(false));
        let handler = Arc::new(RuntimeHandler {
            registered: Mutex::new(Some(tx)),
            runtime: self.runtime.clone(),
            ready: ready.clone(),
            name: Mutex::new(String::new()),
        });
        let endpoint = Endpoint::start(stream, Role::Runtime, handler);
        let (idx, base, config, child) = match launched {
            Some(l) => (l.idx, l.base, l.config, Some(l.child)),
            None => (String::new(), String::new(), String::new(), None),
        };
        let mut plugin = Plugin {
            idx,
            base,
            endpoint: endpoint.clone(),
            events: EventMask::default(),
            child: Mutex::new(child),
        };
        let fail = |plugin: &Plugin, why: String| {
            plugin.close(&why);
            NriError::Registration(why)
        };
        let registration: Registration = tokio::select! {
            r = tokio::time::timeout(self.config.registration_timeout, rx) => match r {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => return Err(fail(&plugin, "closed before registering".into())),
                Err(_) => return Err(fail(&plugin, format!(
                    "not registered within {:?}", self.config.registration_timeout
                ))),
            },
            _ = endpoint.closed() => return Err(fail(&plugin, "closed before registering".into())),
        };
        if plugin.idx.is_empty() {
            plugin.idx = registration.idx;
            plugin.base = registration.name;
        }
        let name = plugin.name();
        if self.plugins().len() >= MAX_PLUGINS {
            return Err(fail(
                &plugin,
                format!("{name}: already {MAX_PLUGINS} plugins"),
            ));
        }
        let nri_version = if registration.nri_version.is_empty() {
            "unknown"
        } else {
            registration.nri_version.as_str()
        };
        info!(plugin = %name, nri_version, "NRI plugin registered");

        let configure = api::ConfigureRequest {
            config,
            runtime_name: self.config.runtime_name.clone(),
            runtime_version: self.config.runtime_version.clone(),
            registration_timeout: millis(self.config.registration_timeout),
            request_timeout: millis(self.config.request_timeout),
            nri_version: api::NRI_VERSION.to_string(),
        };
        let reply: api::ConfigureResponse = match plugin
            .call("Configure", &configure, self.config.request_timeout)
            .await
        {
            Ok(r) => r,
            Err(e) => return Err(fail(&plugin, format!("{name}: Configure: {e}"))),
        };
        let events = EventMask(reply.events);
        if events.invalid() != 0 {
            return Err(fail(
                &plugin,
                format!(
                    "{name}: subscribed to unknown events {:#x}",
                    events.invalid()
                ),
            ));
        }
        plugin.events = if events.0 == 0 {
            EventMask::VALID
        } else {
            events
        };
        let plugin = Arc::new(plugin);

        // No event passes while it synchronizes: it sees each pod and container once.
        let updates = {
            let _alone = self.gate.lock().await;
            let (pods, containers) = self.runtime.snapshot().await;
            let updates = match self.synchronize(&plugin, pods, containers).await {
                Ok(u) => u,
                Err(e) => return Err(fail(&plugin, format!("{name}: Synchronize: {e}"))),
            };
            {
                let mut list = self.plugins_mut();
                list.push(plugin.clone());
                list.sort_by(|a, b| (&a.idx, &a.base).cmp(&(&b.idx, &b.base)));
            }
            ready.store(true, Ordering::Release);
            updates
        };
        info!(plugin = %name, "NRI plugin synchronized");
        // Applied once events flow again: an update waits on container locks that an event's
        // caller may hold.
        if !updates.is_empty() {
            let failed = self.runtime.update_containers(updates, Vec::new()).await;
            if !failed.is_empty() {
                warn!(plugin = %name, failed = failed.len(), "NRI: updates at synchronization failed");
            }
        }
        // Gone from the list when the connection goes.
        let inner = Arc::downgrade(self);
        tokio::spawn(async move {
            plugin.endpoint.closed().await;
            let reason = plugin.endpoint.close_reason().unwrap_or_default();
            info!(plugin = %plugin.name(), %reason, "NRI plugin disconnected");
            if let Some(inner) = inner.upgrade() {
                inner.drop_plugin(&plugin, &reason);
            }
        });
        Ok(())
    }

    /// Sends the runtime's state, split into messages under ttrpc's limit when it is large.
    async fn synchronize(
        &self,
        plugin: &Plugin,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, CallError> {
        use prost::Message as _;
        let whole = api::SynchronizeRequest {
            pods,
            containers,
            more: false,
        };
        let parts = whole.encoded_len() / SYNC_MESSAGE_BUDGET + 1;
        let timeout = self.config.request_timeout;
        if parts == 1 {
            let reply: api::SynchronizeResponse =
                plugin.call("Synchronize", &whole, timeout).await?;
            return checked_sync_updates(plugin, reply.update);
        }
        let per_pods = whole.pods.len().div_ceil(parts).max(1);
        let per_containers = whole.containers.len().div_ceil(parts).max(1);
        let mut pods = whole.pods.chunks(per_pods);
        let mut containers = whole.containers.chunks(per_containers);
        for i in 0..parts {
            let more = i + 1 < parts;
            let req = api::SynchronizeRequest {
                pods: pods.next().map(<[_]>::to_vec).unwrap_or_default(),
                containers: containers.next().map(<[_]>::to_vec).unwrap_or_default(),
                more,
            };
            let reply: api::SynchronizeResponse = plugin.call("Synchronize", &req, timeout).await?;
            if more {
                if !reply.update.is_empty() || !reply.more {
                    return Err(CallError::Decode(
                        "the plugin does not handle a split synchronization".into(),
                    ));
                }
            } else {
                return checked_sync_updates(plugin, reply.update);
            }
        }
        Ok(Vec::new())
    }
}

fn checked_sync_updates(
    plugin: &Plugin,
    updates: Vec<api::ContainerUpdate>,
) -> Result<Vec<api::ContainerUpdate>, CallError> {
    crate::limits::check_updates(&plugin.name(), &updates)
        .map_err(|e| CallError::Decode(e.to_string()))?;
    Ok(updates)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
