//! One registered plugin: its connection, its name and index, the events it subscribed to,
//! and the process crishim launched for it, if any.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use prost::Message as _;
use tokio::sync::oneshot;
use tracing::warn;

use crate::api::{self, Event, EventMask};
use crate::conn::{self, code, CallError, Endpoint, Handler, HandlerFuture, Status};

use super::Runtime;

pub(super) struct Plugin {
    pub(super) idx: String,
    pub(super) base: String,
    pub(super) endpoint: Endpoint,
    pub(super) events: EventMask,
    /// The process crishim launched for a pre-installed plugin; killed with the connection.
    pub(super) child: Mutex<Option<tokio::process::Child>>,
}

impl Plugin {
    /// `idx-base`, as NRI names plugins in its messages and logs.
    pub(super) fn name(&self) -> String {
        format!("{}-{}", self.idx, self.base)
    }

    pub(super) fn subscribed(&self, e: Event) -> bool {
        self.events.is_set(e)
    }

    pub(super) async fn call<R: prost::Message + Default>(
        &self,
        method: &str,
        request: &impl prost::Message,
        timeout: Duration,
    ) -> Result<R, CallError> {
        self.endpoint
            .call_message(api::PLUGIN_SERVICE, method, request, timeout)
            .await
    }

    /// Drops the plugin: its connection closes and a launched process is killed.
    pub(super) fn close(&self, reason: &str) {
        self.endpoint.close(reason);
        let child = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = child {
            let _ = child.start_kill();
            // Reaped off the caller's path.
            tokio::spawn(async move {
                let _ = child.wait().await;
            });
        }
    }
}

/// What a plugin said in `RegisterPlugin`.
#[derive(Debug, Clone)]
pub(super) struct Registration {
    pub(super) name: String,
    pub(super) idx: String,
    pub(super) nri_version: String,
}

/// Serves the runtime's services to one plugin connection.
pub(super) struct RuntimeHandler {
    pub(super) registered: Mutex<Option<oneshot::Sender<Registration>>>,
    pub(super) runtime: Arc<dyn Runtime>,
    /// Updates are taken only once the plugin is registered and synchronized.
    pub(super) ready: Arc<std::sync::atomic::AtomicBool>,
    /// The name it registered with, for messages about what it sends.
    pub(super) name: Mutex<String>,
}

impl Handler for RuntimeHandler {
    fn handle(&self, service: String, method: String, payload: Bytes) -> HandlerFuture {
        if service != api::RUNTIME_SERVICE {
            return unimplemented(service, method);
        }
        match method.as_str() {
            "RegisterPlugin" => {
                let result = conn::decode::<api::RegisterPluginRequest>(&payload)
                    .and_then(|req| {
                        check_name(&req.plugin_name)?;
                        check_index(&req.plugin_idx)?;
                        Ok(req)
                    })
                    .and_then(|req| {
                        let tx = self
                            .registered
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .take()
                            .ok_or_else(|| {
                                Status::new(code::FAILED_PRECONDITION, "plugin already registered")
                            })?;
                        *self.name.lock().unwrap_or_else(|e| e.into_inner()) =
                            format!("{}-{}", req.plugin_idx, req.plugin_name);
                        let _ = tx.send(Registration {
                            name: req.plugin_name,
                            idx: req.plugin_idx,
                            nri_version: req.nri_version,
                        });
                        Ok(api::Empty {}.encode_to_vec().into())
                    });
                Box::pin(async move { result })
            }
            "UpdateContainers" => {
                if !self.ready.load(std::sync::atomic::Ordering::Acquire) {
                    return Box::pin(async {
                        Err(Status::new(
                            code::FAILED_PRECONDITION,
                            "UpdateContainers before the plugin is synchronized",
                        ))
                    });
                }
                let runtime = self.runtime.clone();
                let name = self.name.lock().unwrap_or_else(|e| e.into_inner()).clone();
                Box::pin(async move {
                    let req = conn::decode::<api::UpdateContainersRequest>(&payload)?;
                    crate::limits::check_updates(&name, &req.update)
                        .and_then(|()| crate::limits::check_evictions(&name, &req.evict))
                        .map_err(|e| Status::new(code::INVALID_ARGUMENT, e.to_string()))?;
                    let failed = runtime.update_containers(req.update, req.evict).await;
                    Ok(api::UpdateContainersResponse { failed }
                        .encode_to_vec()
                        .into())
                })
            }
            _ => unimplemented(service, method),
        }
    }
}

fn unimplemented(service: String, method: String) -> HandlerFuture {
    warn!(%service, %method, "NRI plugin called an unknown method");
    Box::pin(async move {
        Err(Status::new(
            code::UNIMPLEMENTED,
            format!("{service}/{method} is not implemented"),
        ))
    })
}

/// A plugin's name, as a status for its registration.
pub(super) fn check_name(name: &str) -> Result<(), Status> {
    api::check_plugin_name(name).map_err(|m| Status::new(code::INVALID_ARGUMENT, m))
}

/// A plugin's index, as a status for its registration.
pub(super) fn check_index(idx: &str) -> Result<(), Status> {
    api::check_plugin_index(idx).map_err(|m| Status::new(code::INVALID_ARGUMENT, m))
}
