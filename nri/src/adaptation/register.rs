//! A plugin's way in: registration (within the registration timeout), configuration, and
//! synchronization with every pod and container, after which it hears events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tracing::{info, warn};

use super::launch::Launched;
use super::plugin::{Plugin, Registration, RuntimeHandler};
use super::{Inner, NriError, MAX_PLUGINS};
use crate::api::{self, EventMask};
use crate::conn::{CallError, Endpoint, Role};

/// A synchronization message stays under ttrpc's limit with room to spare.
const SYNC_MESSAGE_BUDGET: usize = 3 << 20;

impl Inner {
    /// Takes a plugin through registration, configuration and synchronization, and adds it.
    /// `launched` names a pre-installed plugin (and holds its process and configuration).
    pub(super) async fn register(
        self: &Arc<Self>,
        stream: tokio::net::UnixStream,
        launched: Option<Launched>,
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
