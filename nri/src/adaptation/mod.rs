//! The runtime's side of NRI: plugins register (over the socket, or launched from
//! `plugin_path`), are configured and synchronized, and then hear of each pod and container
//! event in index order. Their adjustments to a container being created come back merged, and
//! their updates to other containers go to the [`Runtime`].
//!
//! A plugin is hostile until bounded. Every call waits at most `plugin_request_timeout`; a
//! plugin that times out, disconnects or breaks the protocol is dropped and the event goes on
//! without it. A plugin that answers with an error fails the request it was asked about (for
//! the events that can fail), and the error names it.

mod events;
mod launch;
mod listen;
mod plugin;
mod register;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::api;
use crate::merge::MergeError;

use plugin::Plugin;

/// Plugins registered at once; connections beyond are refused.
pub const MAX_PLUGINS: usize = 32;

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
}

#[cfg(test)]
mod tests;
