//! `CreateContainer`: mount the image's rootfs with a writable layer, build the OCI spec from the
//! image and the CRI config, and have the pod's shim create the container (it does not run yet).

use std::path::{Component, Path, PathBuf};

use super::errors::Error;
use crishim_images::ImageRecord;
use crishim_proto::cri::{self, CreateContainerRequest, CreateContainerResponse, NamespaceMode};
use crishim_proto::shim::{Request, Response};
use crishim_state::records::{container_name, now_nanos, ContainerRecord, PodRecord, PodState};
use tracing::{info, warn};

use super::errors::{from_spec_error, new_id, unexpected};
use super::lsm::{check_lsm_options, selinux_labels, Lsm};
use super::nri::ContainerEvent;
use super::runtime_service::{Inner, RuntimeService};
use super::stop_signal::parse_signal;
use crishim_spec::{self as spec, PodFiles, PodNamespaces, SpecInputs};

/// `"true"` or `"false"` on a pod or a container: run it under crishim's init.
pub const ANNOTATION_INIT: &str = "crishim.io/init";

impl RuntimeService {
    pub(super) async fn do_create_container(
        &self,
        req: CreateContainerRequest,
    ) -> Result<CreateContainerResponse, Error> {
        let inner = &self.inner;
        let config = req
            .config
            .ok_or_else(|| Error::invalid_argument("CreateContainer: config is required"))?;
        let meta = config
            .metadata
            .clone()
            .ok_or_else(|| Error::invalid_argument("CreateContainer: metadata is required"))?;
        if meta.name.is_empty() {
            return Err(Error::invalid_argument(
                "CreateContainer: metadata.name is empty",
            ));
        }
        let image_name = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        if image_name.is_empty() {
            return Err(Error::invalid_argument("CreateContainer: image is empty"));
        }
        crate::bounds::check_metadata("CreateContainer", &config.labels, &config.annotations)?;
        let pod = inner.store.pod(&req.pod_sandbox_id)?;
        // The container's first process joins its cgroup in a few ms: keep that lock fast until then.
        crishim_spec::cgroups::warm_migration(std::time::Duration::from_millis(300));
        let log_path = log_path(&pod, &config.log_path)?;
        let _pod_guard = inner.store.lock(&pod.id).await;
        let pod = inner.store.pod(&pod.id)?;
        if pod.state != PodState::Ready {
            return Err(Error::failed_precondition(format!(
                "pod sandbox {} is not ready",
                pod.id
            )));
        }
        let image = inner.images.resolve(&image_name)?.ok_or_else(|| {
            Error::not_found(format!(
                "image {:?} not found: pull it first",
                crishim_sys::shown::shown(&image_name)
            ))
        })?;

        let id = new_id()?;
        let name = container_name(
            &meta,
            pod.config.metadata.as_ref().unwrap_or(&Default::default()),
        );
        inner.store.reserve_container_name(&name, &id)?;
        match inner
            .create_container(&id, &pod, config, &image, image_name, log_path)
            .await
        {
            Ok(()) => {
                info!(container = %id, pod = %pod.id, name = %name, "container created");
                if let Ok(c) = inner.store.container(&id) {
                    inner
                        .nri_container_event(&c, ContainerEvent::PostCreate)
                        .await;
                }
                Ok(CreateContainerResponse { container_id: id })
            }
            Err(e) => {
                inner.undo_create(&pod.id, &id).await;
                inner.store.release_name(&name, &id);
                Err(e)
            }
        }
    }
}

/// `log_path` is relative to the pod's `log_directory` and may not climb out of it.
fn log_path(pod: &PodRecord, rel: &str) -> Result<PathBuf, Error> {
    if rel.is_empty() {
        return Ok(PathBuf::new());
    }
    let p = Path::new(rel);
    if p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(Error::invalid_argument(format!(
            "CreateContainer: log_path {rel:?} must be relative to the pod's log_directory and stay inside it"
        )));
    }
    if pod.config.log_directory.is_empty() {
        return Err(Error::invalid_argument(format!(
            "CreateContainer: log_path {rel:?} given but the pod has no log_directory"
        )));
    }
    Ok(Path::new(&pod.config.log_directory).join(p))
}

impl Inner {
    async fn create_container(
        &self,
        id: &str,
        pod: &PodRecord,
        config: cri::ContainerConfig,
        image: &ImageRecord,
        image_name: String,
        log_path: PathBuf,
    ) -> Result<(), Error> {
        // Refused before anything is recorded or mounted.
        let handler = self.handler("CreateContainer", &pod.runtime_handler)?;
        let userns = crishim_spec::userns::from_pod(&pod.config)
            .map_err(|m| Error::invalid_argument(format!("CreateContainer: {m}")))?;
        if userns.is_some() {
            if crishim_gpu::request::is_privileged(&config) {
                return Err(Error::invalid_argument(
                    "CreateContainer: a privileged container cannot run in a pod with its own \
                     user namespace (hostUsers: false)",
                ));
            }
            if handler.binary().is_some() {
                return Err(Error::invalid_argument(format!(
                    "CreateContainer: runtime handler {:?} does not support user namespaces \
                     (Error reports it without the feature)",
                    pod.runtime_handler
                )));
            }
        }
        if handler.binary().is_some() && config.mounts.iter().any(|m| m.recursive_read_only) {
            return Err(Error::invalid_argument(format!(
                "CreateContainer: runtime handler {:?} does not support recursive read-only \
                 mounts (Error reports it without the feature)",
                pod.runtime_handler
            )));
        }
        // The infra process, proven to be the pod's while held: `ns/user` is read through it, and
        // a pod whose infra is gone is refused before anything is made (the shim checks the
        // namespace paths again against the child it has not reaped).
        let infra = self.infra_process(pod, "CreateContainer")?;
        let bundle = self.bundle_dir(id);
        let rootfs = bundle.join("rootfs");
        let image_config = self.images.config(image)?;
        let image_signal = || {
            image_config
                .config()
                .as_ref()
                .and_then(|c| c.stop_signal().clone())
                .and_then(|s| parse_signal(&s))
        };
        let stop_signal = super::stop_signal::from_cri(config.stop_signal)?
            .or_else(image_signal)
            .unwrap_or(libc::SIGTERM);
        let image_ref = image
            .repo_digests
            .first()
            .cloned()
            .unwrap_or_else(|| image.id.to_string());
        let mut record = ContainerRecord {
            id: id.to_string(),
            pod_id: pod.id.clone(),
            image: image_name,
            image_id: image.id.to_string(),
            image_ref,
            created_at: now_nanos(),
            log_path: log_path.clone(),
            bundle: bundle.clone(),
            stop_signal,
            last: None,
            user: None,
            config,
        };
        let mut phases = super::sandbox_stop::Phases::new("CreateContainer", id);
        // Recorded before anything else happens: a record without a shim state (`last`) after a
        // crash means "half created", and start-up recovery undoes it.
        self.store.save_container(&record)?;
        phases.done("record");

        // The bundle is root's alone; `rootfs` is only the mount point of the overlay, whose own
        // root (the upper dir) has the mode the container sees.
        crishim_sys::hostfs::create_private_dir(&rootfs)
            .map_err(|e| Error::internal(format!("creating {}: {e}", rootfs.display())))?;
        if let Some(maps) = &userns {
            let containers = self.config.state_dir.join("containers");
            crishim_spec::userns::open_path(
                &[&self.config.state_dir, &containers],
                &bundle,
                maps.host_root().1,
            )
            .map_err(|e| {
                Error::internal(format!(
                    "opening {} to the pod's root: {e}",
                    bundle.display()
                ))
            })?;
        }
        let idmap = match &userns {
            Some(maps) => Some(crishim_images::rootfs::Idmap {
                userns: infra.open_proc("ns/user").map_err(|e| {
                    Error::failed_precondition(format!(
                        "CreateContainer: the pod's user namespace: {e}"
                    ))
                })?,
                root: maps.host_root(),
            }),
            None => None,
        };
        let selinux = selinux_labels(pod, &record.config, Lsm::of_host());
        if let Some(labels) = &selinux {
            // Volumes that ask for it get the container's file label, as `chcon -R` would.
            for m in record.config.mounts.iter().filter(|m| m.selinux_relabel) {
                if m.host_path.is_empty() {
                    continue;
                }
                let path = PathBuf::from(&m.host_path);
                let file = labels.file.clone();
                tokio::task::spawn_blocking(move || {
                    crishim_spec::selinux::relabel(
                        &path,
                        &file,
                        crishim_spec::selinux::set_file_label,
                    )
                })
                .await
                .map_err(|e| Error::internal(format!("CreateContainer: relabelling: {e}")))?
                .map_err(|m| Error::failed_precondition(format!("CreateContainer: {m}")))?;
            }
        }
        self.images
            .mount_rootfs(
                image,
                id,
                &rootfs,
                idmap.as_ref(),
                selinux.as_ref().map(|l| l.file.as_str()),
            )
            .await?;

        phases.done("rootfs");
        let image_volumes = self
            .mount_image_volumes(id, &record.config, &bundle)
            .await?;
        let pod_files = self.pod_files_dir(&pod.id);
        // What the host must do or check first; the spec is then built whole from its outcome.
        let apparmor_profile = check_lsm_options(&record.config, Lsm::of_host())?;
        if apparmor_profile.as_deref() == Some(crishim_spec::apparmor::DEFAULT_PROFILE) {
            crishim_spec::apparmor::ensure_default_loaded().map_err(|e| {
                Error::failed_precondition(format!("CreateContainer: AppArmor: {e}"))
            })?;
        }
        let init = if self.wants_init(pod, &record.config) {
            Some(self.init_binary()?)
        } else {
            None
        };
        // The handler's `pod_annotations` (a sandboxed runtime's settings, say).
        let passed_annotations = pod
            .config
            .annotations
            .iter()
            .filter(|(key, _)| handler.passes_annotation(key))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        // The daemon's own: no container gets less, from the CRI or from an NRI plugin.
        let oom_floor = own_oom_score_adj();
        let mut inputs = SpecInputs {
            container_id: id,
            config: &record.config,
            sandbox: &pod.config,
            image: &image_config,
            rootfs: rootfs.clone(),
            namespaces: self.namespaces(pod, &record.config, userns.is_some())?,
            files: PodFiles {
                hostname: Some(pod_files.join("hostname")),
                resolv_conf: Some(pod_files.join("resolv.conf")),
                hosts: Some(pod_files.join("hosts")),
                shm: pod.shm.clone(),
            },
            image_volumes: &image_volumes,
            cgroups_path: pod.cgroup_driver.container_path(&pod.cgroup_parent, id),
            min_oom_score_adj: oom_floor,
            privileged_host_devices: !handler.privileged_without_host_devices,
            apparmor_profile,
            selinux: selinux.as_ref(),
            init,
            // For an env value that is not UTF-8 (the spec refuses it when init is missing).
            init_binary: Some(self.init_binary.clone()).filter(|b| b.is_file()),
            gpu: None,
            passed_annotations,
            sandbox_id: Some(&pod.id),
        };
        let gpu = if handler.gpu {
            let image_env = image_config
                .config()
                .as_ref()
                .and_then(|c| c.env().clone())
                .unwrap_or_default();
            // What CDI devices grant is judged among the devices the spec gives.
            let devices =
                spec::devices(&inputs).map_err(|e| from_spec_error("CreateContainer", e))?;
            let target = crishim_gpu::Target {
                container_id: id,
                config: &record.config,
                pod: &pod.config,
                image_env: &image_env,
                rootfs: &rootfs,
                devices: &devices,
            };
            Some(self.gpu.plan(&target)?)
        } else {
            None
        };
        inputs.gpu = gpu.as_ref();
        let spec::Built {
            mut spec,
            pod_binds: own_binds,
        } = spec::build(&inputs).map_err(|e| from_spec_error("CreateContainer", e))?;
        // NRI plugins adjust the built spec, as containerd has them do; if the create fails
        // after that, they hear that it is gone again.
        let adjust = self.nri_create_container(pod, &record, &spec).await?;
        let finished = async {
            if let Some(adjust) = &adjust {
                self.apply_nri_adjustment(&mut spec, adjust)?;
                // A plugin's OOM score is restricted as the CRI's is: never below the daemon's.
                if let (Some(floor), Some(process)) = (oom_floor, spec.process_mut()) {
                    if process.oom_score_adj().is_some_and(|v| v < floor) {
                        process.set_oom_score_adj(Some(floor));
                    }
                }
            }
            record.user = spec.process().as_ref().map(|p| {
                let u = p.user();
                crishim_state::records::ProcessUser {
                    uid: u.uid(),
                    gid: u.gid(),
                    groups: u.additional_gids().clone().unwrap_or_default(),
                }
            });
            // Staging for the user namespace mounts on the host: done here, on the built spec, and
            // not by the spec builder.
            let devices = match &userns {
                Some(maps) => Some(
                    crishim_spec::userns::stage_devices(&mut spec, &bundle.join("devs"), maps)
                        .map_err(|e| Error::internal(format!("CreateContainer: {e}")))?,
                ),
                None => None,
            };
            // The bind mounts, staged until the shim has made the container, which keeps its own
            // copies: the pod's idmapped for its user namespace, the node's (GPU driver,
            // interceptor, init) host root's and locked read-only.
            let staged = match &idmap {
                Some(idmap) => Some(
                    crishim_spec::userns::stage_binds(
                        &mut spec,
                        &bundle.join("idmap"),
                        &idmap.userns,
                        idmap.root.1,
                        &own_binds,
                    )
                    .map_err(|e| Error::failed_precondition(format!("CreateContainer: {e}")))?,
                ),
                None => None,
            };
            // It holds the container's environment: 0600 from the start.
            let json = serde_json::to_vec(&spec)
                .map_err(|e| Error::internal(format!("encoding config.json: {e}")))?;
            crishim_sys::hostfs::write_private(&bundle.join("config.json"), &json)
                .map_err(|e| Error::internal(format!("writing config.json: {e}")))?;
            phases.done("spec");

            let req = Request::Create {
                id: id.to_string(),
                bundle,
                log_path,
                log_root: pod.config.log_directory.clone().into(),
                stdin: record.config.stdin,
                tty: record.config.tty,
                start_error_at_start: true,
            };
            let created = self
                .shim_call(&pod.id, &req, self.cgroup_request_timeout())
                .await;
            drop(staged);
            drop(devices);
            match created? {
                Response::State(s) => {
                    phases.done("shim create");
                    record.created_at = s.created_at;
                    record.last = Some(s);
                    self.store.save_container(&record)?;
                    phases.done("record created");
                    self.emit_container(&record, cri::ContainerEventType::ContainerCreatedEvent)
                        .await;
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
        .await;
        if finished.is_err() && adjust.is_some() {
            self.nri_container_event(&record, ContainerEvent::UndoCreate)
                .await;
        }
        finished
    }

    /// The container's annotation wins over the pod's, which wins over the config default.
    fn wants_init(&self, pod: &PodRecord, config: &cri::ContainerConfig) -> bool {
        let flag = |m: &std::collections::HashMap<String, String>| {
            m.get(ANNOTATION_INIT).map(|v| v == "true")
        };
        flag(&config.annotations)
            .or_else(|| flag(&pod.config.annotations))
            .unwrap_or(self.config.init)
    }

    /// The `crishim-init` binary, which the spec bind-mounts at [`spec::INIT_PATH`].
    fn init_binary(&self) -> Result<PathBuf, Error> {
        let binary = self.init_binary.clone();
        if !binary.is_file() {
            return Err(Error::failed_precondition(format!(
                "CreateContainer: init requested but {} does not exist",
                binary.display()
            )));
        }
        Ok(binary)
    }

    /// The namespaces a container of `pod` joins (the pod's user namespace with `userns`).
    fn namespaces(
        &self,
        pod: &PodRecord,
        config: &cri::ContainerConfig,
        userns: bool,
    ) -> Result<PodNamespaces, Error> {
        let ns = |kind: &str| Some(PathBuf::from(format!("/proc/{}/ns/{kind}", pod.infra_pid)));
        let opts = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref());
        let pid_mode = opts.and_then(|o| NamespaceMode::try_from(o.pid).ok());
        let pid = match pid_mode {
            Some(NamespaceMode::Target) => {
                let target = opts.map(|o| o.target_id.clone()).unwrap_or_default();
                let t = self.store.container(&target).map_err(|_| {
                    Error::invalid_argument(format!(
                        "CreateContainer: pid namespace target {target:?} not found"
                    ))
                })?;
                // The target's pid is checked by this pod's shim, whose child it must be.
                if t.pod_id != pod.id {
                    return Err(Error::invalid_argument(format!(
                        "CreateContainer: pid namespace target {target} is not in pod sandbox {}",
                        pod.id
                    )));
                }
                let pid = t.last.as_ref().map_or(0, |s| s.pid);
                if pid <= 0 {
                    return Err(Error::failed_precondition(format!(
                        "pid namespace target {target} is not running"
                    )));
                }
                Some(PathBuf::from(format!("/proc/{pid}/ns/pid")))
            }
            Some(NamespaceMode::Pod) if !pod.host_pid => ns("pid"),
            None if pod.shared_pid => ns("pid"),
            _ => None,
        };
        Ok(PodNamespaces {
            user: if userns { ns("user") } else { None },
            net: if pod.host_network { None } else { ns("net") },
            ipc: if pod.host_ipc { None } else { ns("ipc") },
            uts: if pod.host_network { None } else { ns("uts") },
            pid,
            host_pid: pod.host_pid || pid_mode == Some(NamespaceMode::Node),
        })
    }

    /// Undo a failed or abandoned create: the shim's container, the rootfs mount, the writable layer,
    /// the bundle and the record. Idempotent.
    pub(super) async fn undo_create(&self, pod_id: &str, id: &str) {
        if let Err(e) = self.try_undo_create(pod_id, id).await {
            warn!(container = %id, error = %e, "undoing a create");
        }
    }

    /// [`undo_create`](Self::undo_create), refusing (`FailedPrecondition`, naming the mount) to
    /// delete a bundle that still has a mount below it: the bundle and the record stay, for a
    /// later removal to retry.
    pub(super) async fn try_undo_create(&self, pod_id: &str, id: &str) -> Result<(), Error> {
        let mut phases = super::sandbox_stop::Phases::new("RemoveContainer", id);
        if let Err(e) = self
            .shim_ok(pod_id, Request::Delete { id: id.to_string() })
            .await
        {
            if e.code() != tonic::Code::Unavailable {
                warn!(container = %id, error = %e, "shim delete failed");
            }
        }
        phases.done("shim delete");
        let bundle = self.bundle_dir(id);
        crishim_spec::userns::release_staged(&bundle.join("idmap"));
        crishim_spec::userns::release_staged_devices(&bundle.join("devs"));
        self.release_image_volumes(id, &bundle).await;
        if let Err(e) = self.images.release_rootfs(id, &bundle.join("rootfs")).await {
            // Its writable layer still has a mount below it: kept, and so is the container.
            if e.kind() == crishim_images::ErrorKind::FailedPrecondition {
                return Err(Error::from(e));
            }
            warn!(container = %id, error = %e, "removing the rootfs");
        }
        phases.done("rootfs");
        crate::container_images::remove_unmounted(&bundle)
            .map_err(|m| Error::failed_precondition(format!("RemoveContainer {id}: {m}")))?;
        self.gpu.release(id);
        self.store.delete_container(id);
        phases.done("bundle and record");
        Ok(())
    }
}

fn own_oom_score_adj() -> Option<i32> {
    std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}
