//! NRI plugins on the CRI path. The handlers tell them of each pod and container event through
//! the methods here; what plugins ask of other containers comes back through [`NriRuntime`],
//! which applies it as `UpdateContainerResources` and `StopContainer` would, without telling
//! the plugins again.
//!
//! With `[nri]` off, or no plugin registered, each call here returns at once without building
//! a message.

use std::sync::{Arc, Weak};

use crishim_nri::adaptation::{BoxFuture, Nri, NriError, Runtime};
use crishim_nri::api;
use crishim_proto::cri;
use crishim_proto::shim::Status as ShimStatus;
use crishim_state::records::{ContainerRecord, PodRecord};
use tracing::{info, warn};

use super::errors::Error;
use super::runtime_service::{Inner, RuntimeService};

impl RuntimeService {
    /// Starts NRI when `[nri] enable` is set: pre-installed plugins are launched and
    /// synchronized with the pods and containers already here, then the socket opens.
    pub async fn start_nri(&self) -> Result<(), String> {
        let config = &self.inner.config.nri;
        if !config.enable {
            return Ok(());
        }
        let nri_config = crishim_nri::adaptation::Config {
            socket_path: config.socket_path.clone(),
            plugin_path: config.plugin_path.clone(),
            plugin_config_path: config.plugin_config_path.clone(),
            registration_timeout: config.registration_timeout()?,
            request_timeout: config.request_timeout()?,
            disable_connections: config.disable_connections,
            runtime_name: "crishim".into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
        };
        let runtime = Arc::new(NriRuntime {
            inner: Arc::downgrade(&self.inner),
        });
        let nri = Nri::start(nri_config, runtime)
            .await
            .map_err(|e| e.to_string())?;
        info!(plugins = ?nri.plugins(), "NRI started");
        let _ = self.inner.nri.set(nri);
        Ok(())
    }

    /// Drops NRI's plugins (those crishim launched are killed) and closes its socket.
    pub fn stop_nri(&self) {
        if let Some(nri) = self.inner.nri.get() {
            nri.shutdown();
        }
    }
}

impl Inner {
    /// NRI, when it is on and some plugin is registered.
    pub(super) fn nri(&self) -> Option<&Nri> {
        self.nri.get().filter(|n| n.has_plugins())
    }

    pub(super) async fn nri_run_pod(&self, pod: &PodRecord) -> Result<(), Error> {
        let Some(nri) = self.nri() else { return Ok(()) };
        nri.run_pod_sandbox(&pod_sandbox(pod))
            .await
            .map_err(|e| nri_error("RunPodSandbox", e))
    }

    pub(super) async fn nri_stop_pod(&self, pod: &PodRecord) {
        if let Some(nri) = self.nri() {
            nri.stop_pod_sandbox(&pod_sandbox(pod)).await;
        }
    }

    pub(super) async fn nri_remove_pod(&self, pod: &PodRecord) {
        if let Some(nri) = self.nri() {
            nri.remove_pod_sandbox(&pod_sandbox(pod)).await;
        }
    }

    pub(super) async fn nri_update_pod(
        &self,
        pod: &PodRecord,
        overhead: Option<&cri::LinuxContainerResources>,
        resources: Option<&cri::LinuxContainerResources>,
    ) -> Result<(), Error> {
        let Some(nri) = self.nri() else { return Ok(()) };
        nri.update_pod_sandbox(
            &pod_sandbox(pod),
            overhead.map(resources_to_nri),
            resources.map(resources_to_nri),
        )
        .await
        .map_err(|e| nri_error("UpdatePodSandboxResources", e))
    }

    pub(super) async fn nri_post_update_pod(&self, pod: &PodRecord) {
        if let Some(nri) = self.nri() {
            nri.post_update_pod_sandbox(&pod_sandbox(pod)).await;
        }
    }

    /// The event for a container other than at its creation or update.
    pub(super) async fn nri_container_event(&self, c: &ContainerRecord, event: ContainerEvent) {
        let Some(nri) = self.nri() else { return };
        let Ok(pod) = self.store.pod(&c.pod_id) else {
            return;
        };
        let (p, ctr) = (pod_sandbox(&pod), container(c, &pod));
        match event {
            ContainerEvent::PostCreate => nri.post_create_container(&p, &ctr).await,
            ContainerEvent::PostStart => nri.post_start_container(&p, &ctr).await,
            ContainerEvent::PostUpdate => nri.post_update_container(&p, &ctr).await,
            ContainerEvent::Stop => {
                let updates = nri.stop_container(&p, &ctr).await;
                if !updates.is_empty() {
                    self.nri_apply(updates, Vec::new()).await;
                }
            }
            ContainerEvent::Remove => nri.remove_container(&p, &ctr).await,
            ContainerEvent::UndoCreate => nri.undo_create_container(&p, &ctr).await,
        }
    }

    pub(super) async fn nri_start_container(&self, c: &ContainerRecord) -> Result<(), Error> {
        let Some(nri) = self.nri() else { return Ok(()) };
        let pod = self.store.pod(&c.pod_id)?;
        nri.start_container(&pod_sandbox(&pod), &container(c, &pod))
            .await
            .map_err(|e| nri_error("StartContainer", e))
    }

    /// The plugins' adjustments for a container being created, from its built spec; their
    /// updates to other containers are applied before it returns.
    pub(super) async fn nri_create_container(
        &self,
        pod: &PodRecord,
        record: &ContainerRecord,
        spec: &oci_spec::runtime::Spec,
    ) -> Result<Option<api::ContainerAdjustment>, Error> {
        let Some(nri) = self.nri() else {
            return Ok(None);
        };
        let meta = crishim_nri::oci::ContainerMeta {
            id: record.id.clone(),
            pod_sandbox_id: pod.id.clone(),
            name: record
                .config
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            state: api::ContainerState::ContainerCreated,
            labels: record.config.labels.clone(),
            created_at: record.created_at,
            ..Default::default()
        };
        let ctr = crishim_nri::oci::container(spec, meta);
        let merged = nri
            .create_container(&pod_sandbox(pod), &ctr)
            .await
            .map_err(|e| nri_error("CreateContainer", e))?;
        if !merged.updates.is_empty() || !merged.evictions.is_empty() {
            self.nri_apply(merged.updates, merged.evictions).await;
        }
        Ok(Some(merged.adjust))
    }

    /// Applies merged NRI adjustments to a built spec; CDI devices they name are resolved from
    /// `[gpu] cdi_spec_dirs`, as the CRI's own are.
    pub(super) fn apply_nri_adjustment(
        &self,
        spec: &mut oci_spec::runtime::Spec,
        adjust: &api::ContainerAdjustment,
    ) -> Result<(), Error> {
        let applied = crishim_nri::oci::apply(spec, adjust)
            .map_err(|e| Error::failed_precondition(format!("CreateContainer: NRI: {e}")))?;
        if !applied.ignored.is_empty() {
            info!(ignored = ?applied.ignored, "NRI adjustments this runtime does not apply");
        }
        if !applied.cdi_devices.is_empty() {
            let edits =
                crishim_gpu::cdi::resolve(&self.config.gpu.cdi_spec_dirs, &applied.cdi_devices)
                    .map_err(|e| {
                        Error::failed_precondition(format!("CreateContainer: NRI: {e}"))
                    })?;
            edits
                .apply(spec)
                .map_err(|e| Error::failed_precondition(format!("CreateContainer: NRI: {e}")))?;
        }
        Ok(())
    }

    /// The resources an update should apply, once plugins have had their say: theirs for this
    /// container replace the fields they set. Updates to other containers are applied here.
    pub(super) async fn nri_update_container(
        &self,
        c: &ContainerRecord,
        asked: cri::LinuxContainerResources,
    ) -> Result<cri::LinuxContainerResources, Error> {
        let Some(nri) = self.nri() else {
            return Ok(asked);
        };
        let pod = self.store.pod(&c.pod_id)?;
        let merged = nri
            .update_container(
                &pod_sandbox(&pod),
                &container(c, &pod),
                &resources_to_nri(&asked),
            )
            .await
            .map_err(|e| nri_error("UpdateContainerResources", e))?;
        let mut resources = asked;
        let mut others = Vec::new();
        for u in merged.updates {
            if u.container_id == c.id {
                if let Some(r) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) {
                    overlay(&mut resources, r);
                }
            } else {
                others.push(u);
            }
        }
        if !others.is_empty() || !merged.evictions.is_empty() {
            self.nri_apply(others, merged.evictions).await;
        }
        Ok(resources)
    }

    /// Applies plugins' updates and evictions; returns the updates that failed (those marked
    /// `ignore_failure` are not reported).
    async fn nri_apply(
        &self,
        updates: Vec<api::ContainerUpdate>,
        evictions: Vec<api::ContainerEviction>,
    ) -> Vec<api::ContainerUpdate> {
        let mut failed = Vec::new();
        for u in updates {
            let Some(r) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) else {
                continue;
            };
            let result = match self.store.container(&u.container_id) {
                // Only a running container's cgroup can change; and the caller may hold the
                // lock of one that just stopped.
                Ok(c) if c.last.as_ref().map(|s| &s.status) != Some(&ShimStatus::Running) => Err(
                    Error::failed_precondition(format!("container {} is not running", c.id)),
                ),
                Ok(c) => {
                    let mut resources = c
                        .config
                        .linux
                        .as_ref()
                        .and_then(|l| l.resources.clone())
                        .unwrap_or_default();
                    overlay(&mut resources, r);
                    self.apply_resources(&c.id, resources).await
                }
                Err(e) => Err(e.into()),
            };
            if let Err(e) = result {
                warn!(container = %u.container_id, error = %e, "NRI: update failed");
                if !u.ignore_failure {
                    failed.push(u);
                }
            }
        }
        for e in evictions {
            warn!(container = %e.container_id, reason = %crishim_sys::shown::shown(&e.reason), "NRI: plugin evicts container");
            if let Ok(c) = self.store.container(&e.container_id) {
                self.evict(c);
            }
        }
        failed
    }

    /// An eviction is a `StopContainer` with no grace period, under the container's lock, run in
    /// the background so that no event or plugin call waits for it. One that is not running is
    /// left alone: there is nothing to stop.
    fn evict(&self, c: ContainerRecord) {
        let running = c
            .last
            .as_ref()
            .is_some_and(|s| s.status == ShimStatus::Running);
        let Some(me) = self.me.upgrade().filter(|_| running) else {
            return;
        };
        // Boxed: stopping records the exit, which tells NRI, whose plugins may evict again.
        let stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
            Box::pin(async move {
                let _guard = me.store.lock(&c.id).await;
                if let Err(e) = me.stop_container(&c, std::time::Duration::ZERO).await {
                    warn!(container = %c.id, error = %e, "NRI: eviction failed");
                }
            });
        tokio::spawn(stop);
    }
}

/// Container events that cannot fail.
#[derive(Debug, Clone, Copy)]
pub(super) enum ContainerEvent {
    PostCreate,
    PostStart,
    PostUpdate,
    Stop,
    Remove,
    UndoCreate,
}

/// The runtime as NRI's plugins reach it.
struct NriRuntime {
    inner: Weak<Inner>,
}

impl Runtime for NriRuntime {
    fn snapshot(&self) -> BoxFuture<(Vec<api::PodSandbox>, Vec<api::Container>)> {
        let inner = self.inner.upgrade();
        Box::pin(async move {
            let Some(inner) = inner else {
                return (Vec::new(), Vec::new());
            };
            let pods = inner.store.pods_where(|_| true);
            let mut containers = Vec::new();
            for pod in &pods {
                for c in inner.store.pod_containers(&pod.id) {
                    containers.push(container(&c, pod));
                }
            }
            (pods.iter().map(pod_sandbox).collect(), containers)
        })
    }

    fn update_containers(
        &self,
        updates: Vec<api::ContainerUpdate>,
        evictions: Vec<api::ContainerEviction>,
    ) -> BoxFuture<Vec<api::ContainerUpdate>> {
        let inner = self.inner.upgrade();
        Box::pin(async move {
            match inner {
                Some(inner) => inner.nri_apply(updates, evictions).await,
                None => updates,
            }
        })
    }
}

/// A plugin's error, a conflict or a rejection: the request cannot go on as the node is set up.
fn nri_error(rpc: &str, e: NriError) -> Error {
    Error::failed_precondition(format!("{rpc}: {e}"))
}

/// A pod as NRI shows it.
pub(super) fn pod_sandbox(pod: &PodRecord) -> api::PodSandbox {
    let meta = pod.config.metadata.clone().unwrap_or_default();
    api::PodSandbox {
        id: pod.id.clone(),
        name: meta.name,
        uid: meta.uid,
        namespace: meta.namespace,
        labels: pod.config.labels.clone(),
        annotations: pod.config.annotations.clone(),
        runtime_handler: pod.runtime_handler.clone(),
        linux: Some(api::LinuxPodSandbox {
            cgroup_parent: pod.cgroup_parent.clone(),
            pod_resources: pod
                .config
                .linux
                .as_ref()
                .and_then(|l| l.resources.as_ref())
                .map(resources_to_nri),
            pod_overhead: pod
                .config
                .linux
                .as_ref()
                .and_then(|l| l.overhead.as_ref())
                .map(resources_to_nri),
            ..Default::default()
        }),
        pid: u32::try_from(pod.infra_pid).unwrap_or(0),
        ips: pod.ips.clone(),
    }
}

/// A container as NRI shows it, from its record.
pub(super) fn container(c: &ContainerRecord, pod: &PodRecord) -> api::Container {
    let state = c.last.as_ref();
    let linux = c.config.linux.as_ref();
    let resources = linux.and_then(|l| l.resources.as_ref());
    api::Container {
        id: c.id.clone(),
        pod_sandbox_id: pod.id.clone(),
        name: c
            .config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default(),
        state: match state.map(|s| &s.status) {
            Some(ShimStatus::Created) => api::ContainerState::ContainerCreated,
            Some(ShimStatus::Running) => api::ContainerState::ContainerRunning,
            Some(ShimStatus::Exited) => api::ContainerState::ContainerStopped,
            _ => api::ContainerState::ContainerUnknown,
        } as i32,
        labels: c.config.labels.clone(),
        annotations: c.config.annotations.clone(),
        args: c
            .config
            .command
            .iter()
            .chain(&c.config.args)
            .cloned()
            .collect(),
        // NRI carries strings: a value that is not UTF-8 is left out, never altered.
        env: c
            .config
            .envs
            .iter()
            .filter_map(|kv| {
                Some(format!(
                    "{}={}",
                    kv.key,
                    std::str::from_utf8(&kv.value).ok()?
                ))
            })
            .collect(),
        mounts: c
            .config
            .mounts
            .iter()
            .map(|m| api::Mount {
                destination: m.container_path.clone(),
                r#type: "bind".into(),
                source: m.host_path.clone(),
                options: if m.readonly {
                    vec!["rbind".into(), "ro".into()]
                } else {
                    vec!["rbind".into(), "rw".into()]
                },
            })
            .collect(),
        linux: Some(api::LinuxContainer {
            resources: resources.map(resources_to_nri),
            oom_score_adj: resources.map(|r| api::OptionalInt {
                value: r.oom_score_adj,
            }),
            ..Default::default()
        }),
        pid: state.map_or(0, |s| u32::try_from(s.pid).unwrap_or(0)),
        created_at: c.created_at,
        started_at: state.map_or(0, |s| s.started_at),
        finished_at: state.map_or(0, |s| s.finished_at),
        exit_code: state.map_or(0, |s| s.exit_code),
        status_reason: state.map(|s| s.reason.clone()).unwrap_or_default(),
        status_message: state.map(|s| s.message.clone()).unwrap_or_default(),
        ..Default::default()
    }
}

/// CRI resources as NRI's; a zero means unset, as in the CRI.
pub(super) fn resources_to_nri(r: &cri::LinuxContainerResources) -> api::LinuxResources {
    let nz_i = |v: i64| (v != 0).then_some(api::OptionalInt64 { value: v });
    let nz_u = |v: i64| (v > 0).then_some(api::OptionalUInt64 { value: v as u64 });
    api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: nz_i(r.memory_limit_in_bytes),
            swap: nz_i(r.memory_swap_limit_in_bytes),
            ..Default::default()
        }),
        cpu: Some(api::LinuxCpu {
            shares: nz_u(r.cpu_shares),
            quota: nz_i(r.cpu_quota),
            period: nz_u(r.cpu_period),
            cpus: r.cpuset_cpus.clone(),
            mems: r.cpuset_mems.clone(),
            ..Default::default()
        }),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| api::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            })
            .collect(),
        unified: r.unified.clone(),
        ..Default::default()
    }
}

/// Sets on `r` each field an NRI update sets (CRI has no pids limit: that one is not applied).
pub(super) fn overlay(r: &mut cri::LinuxContainerResources, u: &api::LinuxResources) {
    if let Some(m) = &u.memory {
        if let Some(v) = &m.limit {
            r.memory_limit_in_bytes = v.value;
        }
        if let Some(v) = &m.swap {
            r.memory_swap_limit_in_bytes = v.value;
        }
    }
    if let Some(c) = &u.cpu {
        if let Some(v) = &c.shares {
            r.cpu_shares = i64::try_from(v.value).unwrap_or(i64::MAX);
        }
        if let Some(v) = &c.quota {
            r.cpu_quota = v.value;
        }
        if let Some(v) = &c.period {
            r.cpu_period = i64::try_from(v.value).unwrap_or(i64::MAX);
        }
        if !c.cpus.is_empty() {
            r.cpuset_cpus = c.cpus.clone();
        }
        if !c.mems.is_empty() {
            r.cpuset_mems = c.mems.clone();
        }
    }
    for h in &u.hugepage_limits {
        match r
            .hugepage_limits
            .iter_mut()
            .find(|x| x.page_size == h.page_size)
        {
            Some(x) => x.limit = h.limit,
            None => r.hugepage_limits.push(cri::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            }),
        }
    }
    for (k, v) in &u.unified {
        r.unified.insert(k.clone(), v.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_sets_only_what_it_names_and_cri_zero_is_unset() {
        let mut r = cri::LinuxContainerResources {
            cpu_shares: 1024,
            memory_limit_in_bytes: 1 << 30,
            ..Default::default()
        };
        let n = resources_to_nri(&r);
        assert_eq!(
            n.memory.as_ref().unwrap().limit.as_ref().unwrap().value,
            1 << 30
        );
        assert!(n.cpu.as_ref().unwrap().quota.is_none(), "zero is unset");
        overlay(
            &mut r,
            &api::LinuxResources {
                memory: Some(api::LinuxMemory {
                    limit: Some(api::OptionalInt64 { value: 64 << 20 }),
                    ..Default::default()
                }),
                cpu: Some(api::LinuxCpu {
                    shares: Some(api::OptionalUInt64 { value: u64::MAX }),
                    cpus: "0".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
        assert_eq!(r.cpu_shares, i64::MAX, "saturated, not wrapped");
        assert_eq!(r.cpuset_cpus, "0");
        assert_eq!(r.cpu_period, 0);
    }
}
