//! `GetContainerEvents`, and the transitions that feed it: every lifecycle change of a container
//! or a sandbox is broadcast with the pod's status attached, as the kubelet's evented PLEG
//! expects. Exits come from one `Watch` connection per pod to its shim, which also tells us
//! when a shim dies.

use std::sync::Arc;

use crishim_proto::cri::{self, ContainerEventResponse, ContainerEventType, GetEventsRequest};
use crishim_proto::shim::{ContainerState, Response, Status as ShimStatus};
use crishim_state::records::{now_nanos, ContainerRecord, PodState};
use futures::StreamExt;
use tracing::warn;

use super::events::EventStream;
use super::runtime_service::{Inner, RuntimeService};

impl RuntimeService {
    pub(super) fn do_get_container_events(&self, _req: GetEventsRequest) -> EventStream {
        self.inner.events.subscribe()
    }
}

impl Inner {
    /// Broadcast a container event, with its pod's status and its own. An exit that happened
    /// before this daemon started is also kept for late subscribers.
    pub(super) async fn emit_container(&self, c: &ContainerRecord, kind: ContainerEventType) {
        let exited_while_down = kind == ContainerEventType::ContainerStoppedEvent
            && c.last
                .as_ref()
                .is_some_and(|s| self.events.before_start(s.finished_at));
        if !self.events.has_subscribers() && !exited_while_down {
            return;
        }
        // Every container of the pod, as containerd sends (the kubelet's evented PLEG takes the
        // list as the pod's): `c` as given, and not at all once deleted.
        let mut containers = self.store.pod_containers(&c.pod_id);
        containers.retain(|o| o.id != c.id);
        if kind != ContainerEventType::ContainerDeletedEvent {
            containers.push(c.clone());
        }
        let event = self.event(&c.id, &c.pod_id, kind, statuses_of(&containers));
        if exited_while_down {
            self.events.keep_for_replay(&event);
        }
        self.events.send(event);
    }

    /// Broadcast a sandbox event (its id stands in the container id, as containerd does).
    pub(super) fn emit_pod(&self, pod_id: &str, kind: ContainerEventType) {
        if !self.events.has_subscribers() {
            return;
        }
        let statuses = statuses_of(&self.store.pod_containers(pod_id));
        self.broadcast(pod_id, pod_id, kind, statuses);
    }

    fn broadcast(
        &self,
        id: &str,
        pod_id: &str,
        kind: ContainerEventType,
        statuses: Vec<cri::ContainerStatus>,
    ) {
        self.events.send(self.event(id, pod_id, kind, statuses));
    }

    fn event(
        &self,
        id: &str,
        pod_id: &str,
        kind: ContainerEventType,
        statuses: Vec<cri::ContainerStatus>,
    ) -> ContainerEventResponse {
        ContainerEventResponse {
            container_id: id.to_string(),
            container_event_type: kind as i32,
            created_at: now_nanos(),
            pod_sandbox_status: self
                .store
                .pod(pod_id)
                .ok()
                .map(|p| super::sandbox_status::pod_status(&p)),
            containers_statuses: statuses,
        }
    }

    /// Record a state the shim reported; a container that just exited is announced once.
    pub(super) async fn update_state(
        &self,
        id: &str,
        state: ContainerState,
    ) -> Option<ContainerRecord> {
        let (record, exited) = self.store.record_state(id, state)?;
        if exited && record.last.as_ref().is_some_and(|s| s.oom_killed) {
            crate::metrics::global().oom_killed();
        }
        if exited {
            self.emit_container(&record, ContainerEventType::ContainerStoppedEvent)
                .await;
            // However it stopped (StopContainer, or its program ended), as containerd tells NRI.
            self.nri_container_event(&record, super::nri::ContainerEvent::Stop)
                .await;
        }
        Some(record)
    }

    /// Follow a pod's container exits as they happen, until its shim goes away.
    pub(super) fn watch_pod(&self, pod_id: &str) {
        let Some(me) = self.me.upgrade() else { return };
        let pod_id = pod_id.to_string();
        tokio::spawn(async move { me.watch(pod_id).await });
    }

    async fn watch(self: Arc<Self>, pod_id: String) {
        if let Ok(mut answers) = self.shims.watch(&pod_id).await {
            let mut following = false;
            while let Some(answer) = answers.next().await {
                let caught_up = matches!(answer, Response::Ok);
                if let Response::State(s) = answer {
                    self.update_state(&s.id.clone(), s).await;
                }
                // The shim sends the exits it already had, then `Ok`: from there on the
                // recorded states are current. (A shim older than that never says so, and is
                // asked each time, as before.)
                if !following && caught_up {
                    following = true;
                    // Records on disk keep a start only in memory (after a restart they say
                    // `created`): ask the shim once for what has not exited, then follow. A
                    // record without any state is an interrupted create, which recovery rolls
                    // back: left alone.
                    for c in self.store.pod_containers(&pod_id) {
                        if c.last
                            .as_ref()
                            .is_some_and(|s| s.status != ShimStatus::Exited)
                        {
                            self.refresh(&c).await;
                        }
                    }
                    self.store.set_watched(&pod_id, true);
                }
            }
        }
        self.store.set_watched(&pod_id, false);
        self.shim_gone(&pod_id).await;
    }

    /// The pod's shim ended. Expected while the pod is stopped; otherwise the shim died: kill what
    /// it left, record its containers as exited with the reason, and mark the pod not ready.
    pub(super) async fn shim_gone(&self, pod_id: &str) {
        let _guard = self.store.lock(pod_id).await;
        let Ok(mut pod) = self.store.pod(pod_id) else {
            return;
        };
        // Only a shim that is really gone: a reset connection or a slow answer is not that.
        if pod.state != PodState::Ready || self.shim_alive(pod_id).await {
            return;
        }
        warn!(pod = %pod_id, "the pod's shim died; cleaning up after it");
        self.teardown_pod(pod_id).await;
        for c in self.store.pod_containers(pod_id) {
            self.refresh(&c).await;
        }
        pod.state = PodState::NotReady;
        if self.store.save_pod(&pod).is_ok() {
            self.emit_pod(pod_id, ContainerEventType::ContainerStoppedEvent);
        }
    }
}

/// The CRI statuses of the containers that have a known state.
fn statuses_of(containers: &[ContainerRecord]) -> Vec<cri::ContainerStatus> {
    containers
        .iter()
        .filter_map(|c| {
            c.last
                .as_ref()
                .map(|s| super::container_status::container_status(c, s))
        })
        .collect()
}
