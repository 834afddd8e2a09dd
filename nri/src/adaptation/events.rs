//! The events plugins hear, in index order, one at a time: each the RPC of its own name, or
//! `StateChange` for a plugin built before that RPC existed.

use std::sync::Arc;

use tracing::warn;

use super::plugin::Plugin;
use super::{Inner, Nri, NriError};
use crate::api::{self, Event};
use crate::conn::CallError;
use crate::merge::{Merge, Merged};

impl Nri {
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
    /// One call to `p`. `None`: go on without its answer, because it does not have the RPC, or
    /// because it is gone, late or speaks nonsense (it is then dropped). A plugin that answers
    /// with an error fails the event.
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
            // Subscribed to everything (events 0) but without this RPC: it has nothing to say.
            Err(e) if e.is_unimplemented() => Ok(None),
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
}
