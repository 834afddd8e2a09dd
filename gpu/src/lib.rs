//! GPUs: discovery, the driver mirror, and what a GPU container gets at `CreateContainer`.
//!
//! - `discover`: GPUs from `device_root` and `proc_root`;
//! - `ldcache`, `libraries`, `elf`: the driver's files under `driver_root`, by capability;
//! - `mirror`: `vdriver_dir` (`origin/`, `shared/`, capability views);
//! - `probe`: device memory sizes through NVML, in a child process;
//! - `request`: what a container asks for; `cdi`: CDI devices; `compat`: can the image load
//!   the interceptor;
//! - `inject`: the spec edits; `container`: the per-container host directory;
//! - `config`: `[gpu]` in config.toml (`GpuConfig`, which the daemon's `Config` holds).
//!
//! `crishim gpu list` and `crishim gpu probe` are the binary's (`crishim::gpu_cli`); the
//! daemon maps [`GpuError`] to gRPC statuses (`cri/src/server/errors.rs`).
//!
//! [`Gpus::plan`] decides what a container gets and prepares it on the host; the spec builder
//! makes the plan's edits with [`Plan::apply_to`], which touches nothing but the spec. A
//! container that asks for nothing gets an empty plan: its spec is left exactly as it was.

pub mod cdi;
pub mod compat;
pub mod config;
pub mod container;
pub mod discover;
pub mod elf;
pub mod error;
pub mod inject;
pub mod ldcache;
pub mod libraries;
pub mod mirror;
pub mod probe;
pub mod request;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crishim_proto::cri;
use oci_spec::runtime::{LinuxDevice, LinuxDeviceType, Spec};
use tracing::{info, warn};

pub use config::{GpuConfig, InjectMode};
use container::{ContainerDir, Grant, VgpuConfig};
use discover::{Gpu as Device, Inventory, NVIDIA_MAJOR};
pub use error::GpuError;
use inject::Edit;
use libraries::Capability;
use mirror::{Mirror, Tree};
use request::{Ident, Limits, Request};

/// The container a request is applied for.
pub struct Target<'a> {
    pub container_id: &'a str,
    pub config: &'a cri::ContainerConfig,
    pub pod: &'a cri::PodSandboxConfig,
    /// The image config's `Env`.
    pub image_env: &'a [String],
    /// The mounted root filesystem (its own `/etc/ld.so.preload` is kept).
    pub rootfs: &'a Path,
    /// The device nodes its spec has before the GPU's edits: CDI devices grant the GPUs whose
    /// nodes are among these once the devices are applied.
    pub devices: &'a [LinuxDevice],
}

/// What a container gets, decided and prepared on the host by [`Gpus::plan`], as plain data.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// The CDI devices' edits, made first.
    pub cdi: Option<cdi::Edits>,
    /// Then these, in order: each sees the spec as the ones before left it.
    pub edits: Vec<Edit>,
    /// What the container is granted (written to its GPU directory); `None` when it gets
    /// neither a GPU nor the driver.
    pub grant: Option<Grant>,
}

impl Plan {
    /// Make the plan's edits in `spec`; nothing else is touched.
    pub fn apply_to(&self, spec: &mut Spec) -> Result<(), GpuError> {
        if let Some(cdi) = &self.cdi {
            cdi.apply(spec)?;
        }
        self.edits.iter().try_for_each(|e| e.apply(spec))
    }
}

/// The node's GPUs and driver, and what containers get of them.
pub struct Gpus {
    config: GpuConfig,
    inventory: Inventory,
    /// The driver mirror; `Ok(None)` without a driver, `Err` with why it could not be built.
    mirror: Result<Option<Mirror>, String>,
    interceptor: PathBuf,
    containers_dir: PathBuf,
    /// What NVML knows, probed on first need (it can take seconds).
    probed: std::sync::OnceLock<probe::NvmlView>,
}

/// What the NVIDIA toolkit injects from the host where present: (path, a writable directory
/// rather than a socket). MPS clients talk to the control daemon through its pipe directory.
const TOOLKIT_PATHS: &[(&str, bool)] = &[
    ("/run/nvidia-persistenced/socket", false),
    ("/run/nvidia-fabricmanager/socket", false),
    ("/tmp/nvidia-mps", true),
];

/// The MPS control daemon's pipe in its pipe directory: MPS runs on the node.
const MPS_CONTROL: &str = "tmp/nvidia-mps/control";

/// A container's limits as MPS takes them, for its clients under MPS: the core limit as the
/// active thread percentage (the SMs its kernels may use), the memory limit as the pinned
/// device memory limit of each of its GPUs, by the ordinals it sees them with.
fn mps_limits(grant: &Grant) -> Vec<Edit> {
    let mut edits = Vec::new();
    if let Some(c) = grant.core_percent {
        edits.push(Edit::env(
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            &c.to_string(),
        ));
    }
    if let Some(m) = grant.memory_limit_bytes {
        let per_gpu = (m >> 20).max(1);
        let limits: Vec<String> = (0..grant.uuids.len().max(1))
            .map(|i| format!("{i}={per_gpu}MB"))
            .collect();
        edits.push(Edit::env(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            &limits.join(","),
        ));
    }
    edits
}

/// Host directory of the per-container GPU directories, under the daemon's state dir.
pub fn containers_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("gpu/containers")
}

impl Gpus {
    /// Discover GPUs and build the driver mirror. Never fails: a node whose GPUs cannot be used
    /// still runs every other container (why is logged, and GPU requests are refused with it).
    pub fn new(config: &GpuConfig, state_dir: &Path) -> Gpus {
        let inventory =
            discover::discover(&config.device_root, &config.proc_root).unwrap_or_else(|e| {
                warn!(error = %e, "GPU discovery failed; no GPUs will be offered");
                Inventory::default()
            });
        let interceptor = config.interceptor_path();
        let mirror = libraries::locate(&config.driver_root)
            .and_then(|driver| {
                driver
                    .map(|d| Mirror::build(&config.vdriver_dir, d, &interceptor))
                    .transpose()
            })
            .map_err(|e| {
                warn!(error = %e, "GPU driver unusable");
                e.to_string()
            });
        if let Ok(Some(m)) = &mirror {
            info!(gpus = inventory.gpus.len(), driver = %m.driver.version, "GPUs ready");
        } else if matches!(mirror, Ok(None)) && !inventory.gpus.is_empty() {
            warn!(gpus = inventory.gpus.len(), driver_root = %config.driver_root.display(), "GPUs found but no driver libraries (libcuda) under driver_root");
        }
        let gpus = Gpus {
            config: config.clone(),
            inventory,
            mirror,
            interceptor,
            containers_dir: containers_dir(state_dir),
            probed: std::sync::OnceLock::new(),
        };
        gpus.collect_garbage();
        gpus
    }

    /// What NVML (the mirror's) can tell, asked once.
    fn probed(&self) -> &probe::NvmlView {
        self.probed.get_or_init(|| {
            let nvml = self
                .config
                .vdriver_dir
                .join("origin/lib64/libnvidia-ml.so.1");
            if !(matches!(self.mirror, Ok(Some(_))) && nvml.exists()) {
                return probe::NvmlView::default();
            }
            probe::NvmlView::of(
                &nvml,
                &self.inventory,
                &self.config.device_root,
                &self.config.proc_root,
            )
        })
    }

    /// A GPU's (or MIG device's) memory in bytes, if NVML can tell.
    fn memory_of(&self, gpu: &Device) -> Option<u64> {
        gpu.memory
            .or_else(|| self.probed().memory.get(&gpu.uuid).copied())
    }

    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    fn container_dir(&self, id: &str) -> PathBuf {
        self.containers_dir.join(id)
    }

    /// Remove a container's GPU directory. Idempotent.
    pub fn release(&self, container_id: &str) {
        let dir = self.container_dir(container_id);
        if let Err(e) = container::release_accounting(&dir) {
            warn!(container = %container_id, error = %e, dir = %dir.display(), "detaching the GPU accounting tmpfs");
        }
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                warn!(container = %container_id, error = %e, dir = %dir.display(), "removing the GPU directory")
            }
            Err(_) => {}
            Ok(()) => self.collect_garbage(),
        }
    }

    /// Drop the mirror views of older drivers that no container uses any more.
    fn collect_garbage(&self) {
        let Ok(Some(m)) = &self.mirror else { return };
        let in_use: Vec<PathBuf> = container::grants(&self.containers_dir)
            .into_iter()
            .filter_map(|g| g.driver_view)
            .collect();
        if let Err(e) = m.collect_garbage(&in_use) {
            warn!(error = %e, "removing old generations of the GPU driver mirror");
        }
    }

    /// Decide what the container asks for and prepare it on the host (its GPU directory, the
    /// grant, the limits' files): the spec's edits are returned, to be made by
    /// [`Plan::apply_to`]. An empty plan: it asks for nothing. On error the caller undoes the
    /// create (and [`Self::release`]s).
    pub fn plan(&self, t: &Target<'_>) -> Result<Plan, GpuError> {
        let policy = request::Policy {
            accept_env_requests: self.config.accept_env_requests,
            limit_annotations: self.config.limit_annotations,
        };
        let req = request::parse(t.config, t.image_env, policy)?;
        let mut plan = Plan::default();
        let mut granted: Vec<&Device> = Vec::new();
        if !req.cdi.is_empty() {
            let edits = cdi::resolve(&self.config.cdi_spec_dirs, &req.cdi)?;
            // What the CDI devices grant: the GPU nodes among the spec's devices once they are
            // applied (to those devices alone, here).
            let mut seen = Spec::default();
            seen.linux_mut()
                .get_or_insert_with(Default::default)
                .set_devices(Some(t.devices.to_vec()));
            edits.apply(&mut seen)?;
            let devices = seen.linux().as_ref().and_then(|l| l.devices().clone());
            for d in devices.unwrap_or_default() {
                let minor = u32::try_from(d.minor()).unwrap_or(u32::MAX);
                if d.typ() == LinuxDeviceType::C && d.major() == i64::from(NVIDIA_MAJOR) {
                    granted.extend(self.inventory.by_minor(minor));
                }
            }
            plan.cdi = Some(edits);
        }
        if !req.wants_driver() && granted.is_empty() {
            if let Some(key) = request::container_limit_key(t.config, policy) {
                return Err(GpuError::Invalid(format!(
                    "{key} is set but the container requests no GPU"
                )));
            }
            return Ok(plan);
        }
        granted.extend(self.resolve(&req)?);
        granted.sort_by_key(|g| g.index);
        granted.dedup_by_key(|g| g.index);
        let capabilities = req.capabilities()?;
        let mut limits = request::limits(t.config, t.pod, policy)?;
        if granted.is_empty() && request::container_limit_key(t.config, policy).is_none() {
            // The pod's limits are for its GPU containers, not one with the driver alone.
            limits = Limits::default();
        }
        self.check_limits(&limits, &granted)?;
        let mirror = match &self.mirror {
            Ok(Some(m)) => m,
            Ok(None) => {
                return Err(GpuError::Unavailable(format!(
                    "GPUs requested but no NVIDIA driver libraries (libcuda) were found under driver_root {}",
                    self.config.driver_root.display()
                )))
            }
            Err(e) => {
                return Err(GpuError::Unavailable(format!(
                    "GPUs requested but the driver is unusable: {e}"
                )))
            }
        };
        let limited = limits.any();
        let tree = if limited && self.config.inject == InjectMode::Replace {
            Tree::Shared
        } else {
            Tree::Origin
        };
        if limited && !self.interceptor.is_file() {
            return Err(GpuError::Unavailable(format!(
                "GPU limits requested but the interceptor {} does not exist",
                self.interceptor.display()
            )));
        }
        if limited {
            compat::check_image(t.rootfs, &self.interceptor)?;
        }
        if tree == Tree::Shared && !mirror.has_shared {
            return Err(GpuError::Unavailable(
                "inject = \"replace\" but the driver mirror has no shared/ tree (the interceptor was missing at start-up; restart crishim)".into(),
            ));
        }
        let view = mirror.view(&capabilities, tree)?;
        let mut grant = self.grant(t, &capabilities, &limits, &granted);
        grant.driver_view = view.parent().map(Path::to_path_buf);
        let dir = ContainerDir::create(self.container_dir(t.container_id))?;
        dir.write_grant(&grant)?;

        let edits = &mut plan.edits;
        // Devices: the GPUs (a MIG device's GPU, and the capability nodes that grant the MIG
        // device), and the control nodes whenever there is one.
        for g in &granted {
            edits.push(Edit::Device(self.inventory.node(g)?));
            for cap in g.mig.iter().flat_map(|m| &m.caps) {
                edits.push(Edit::Device(cap.clone()));
            }
        }
        if !granted.is_empty() {
            for n in &self.inventory.control {
                edits.push(Edit::Device(n.clone()));
            }
        }
        // The driver's daemons where the host runs them, as the NVIDIA toolkit injects them.
        if !granted.is_empty() {
            self.add_toolkit_sockets(edits);
        }
        // The driver, read-only.
        edits.push(Edit::bind(
            &view.join("lib64"),
            mirror::CONTAINER_LIB,
            false,
        ));
        edits.push(Edit::bind(&view.join("bin"), mirror::CONTAINER_BIN, false));
        if tree == Tree::Shared {
            let origin = mirror.view(&capabilities, Tree::Origin)?;
            edits.push(Edit::bind(
                &origin.join("lib64"),
                mirror::CONTAINER_ORIGIN_LIB,
                false,
            ));
        }
        // Env: the driver's directories first, never replacing the image's or the request's.
        let image_ld = request::image_value(t.image_env, "LD_LIBRARY_PATH");
        let request_ld = request::request_value(t.config, "LD_LIBRARY_PATH");
        edits.push(Edit::env(
            "LD_LIBRARY_PATH",
            &inject::path_list(
                mirror::CONTAINER_LIB,
                &[image_ld.as_deref(), request_ld.as_deref()],
            ),
        ));
        edits.push(Edit::AppendPath(mirror::CONTAINER_BIN.to_string()));
        let visible = if grant.uuids.is_empty() {
            "none".to_string()
        } else {
            grant.uuids.join(",")
        };
        edits.push(Edit::env(request::ENV_VISIBLE_DEVICES, &visible));
        let caps: Vec<&str> = capabilities.iter().map(|c| c.name()).collect();
        edits.push(Edit::env(request::ENV_DRIVER_CAPABILITIES, &caps.join(",")));
        if limited {
            self.limit(t, &capabilities, &grant, &dir, tree, edits)?;
        }
        info!(container = %t.container_id, gpus = ?grant.uuids, memory = ?grant.memory_limit_bytes, cores = ?grant.core_percent, "GPU access granted");
        plan.grant = Some(grant);
        Ok(plan)
    }

    /// Whether the node's GPUs run under MPS (`[gpu] mps`).
    fn runs_mps(&self) -> bool {
        match self.config.mps {
            config::MpsMode::On => true,
            config::MpsMode::Off => false,
            config::MpsMode::Auto => {
                std::fs::symlink_metadata(self.config.driver_root.join(MPS_CONTROL)).is_ok()
            }
        }
    }

    /// The persistence daemon's and the fabric manager's sockets (read-only: connecting needs
    /// no write access to the mount), and the MPS pipe directory, each where it exists under
    /// `driver_root`, at the same path in the container.
    fn add_toolkit_sockets(&self, edits: &mut Vec<Edit>) {
        use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
        for (path, writable) in TOOLKIT_PATHS {
            let host = self.config.driver_root.join(path.trim_start_matches('/'));
            let Ok(meta) = std::fs::symlink_metadata(&host) else {
                continue;
            };
            let fits = if *writable {
                meta.is_dir()
            } else {
                meta.file_type().is_socket()
            };
            // Root's only: the driver's daemons make them as root. `/tmp/nvidia-mps` sits in
            // the world-writable `/tmp`, where any host user could make it first (and, as its
            // owner, swap it for a symlink to `/etc` before the bind): such a path is skipped.
            if fits && meta.uid() != 0 {
                warn!(path = %host.display(), uid = meta.uid(), "not passing a GPU toolkit path that root does not own to GPU containers");
                continue;
            }
            if fits {
                edits.push(Edit::bind(&host, path, *writable));
            }
        }
    }

    /// The GPUs the request names (CDI aside).
    fn resolve(&self, req: &Request) -> Result<Vec<&Device>, GpuError> {
        let known = || {
            let list: Vec<String> = self
                .inventory
                .gpus
                .iter()
                .map(|g| format!("{} {}", g.index, g.uuid))
                .collect();
            if list.is_empty() {
                "this node has no GPUs".to_string()
            } else {
                format!("this node has {}", list.join(", "))
            }
        };
        let mut out = Vec::new();
        if req.all {
            if self.inventory.gpus.is_empty() {
                return Err(GpuError::Unavailable(format!(
                    "{}=all but no GPUs were found under {}",
                    request::ENV_VISIBLE_DEVICES,
                    self.config.device_root.display()
                )));
            }
            out.extend(self.inventory.gpus.iter());
        }
        for ident in &req.named {
            let g = match ident {
                Ident::Index(i) => self.inventory.by_index(*i),
                Ident::Uuid(u) if u.starts_with("MIG-") => self
                    .probed()
                    .migs
                    .iter()
                    .find(|m| m.uuid.eq_ignore_ascii_case(u)),
                Ident::Uuid(u) => self.inventory.by_uuid(u),
            };
            out.push(g.ok_or_else(|| {
                let what = match ident {
                    Ident::Index(i) => format!("GPU index {i}"),
                    Ident::Uuid(u) if u.starts_with("MIG-") => {
                        format!("MIG device {u:?} (MIG devices are listed by `crishim gpu list`)")
                    }
                    Ident::Uuid(u) => format!("GPU UUID {u:?}"),
                };
                GpuError::Invalid(format!(
                    "{}: unknown {what} ({})",
                    request::ENV_VISIBLE_DEVICES,
                    known()
                ))
            })?);
        }
        for (path, minor) in &req.nodes {
            out.push(self.inventory.by_minor(*minor).ok_or_else(|| {
                GpuError::Invalid(format!(
                    "device {path:?} is NVIDIA GPU node {NVIDIA_MAJOR}:{minor}, but no GPU with minor {minor} was discovered ({})",
                    known()
                ))
            })?);
        }
        Ok(out)
    }

    fn check_limits(&self, limits: &Limits, granted: &[&Device]) -> Result<(), GpuError> {
        if !limits.any() {
            return Ok(());
        }
        if granted.is_empty() {
            let key = limits
                .memory
                .as_ref()
                .map(|l| l.key)
                .or(limits.cores.as_ref().map(|l| l.key))
                .unwrap_or_default();
            return Err(GpuError::Invalid(format!(
                "{key} limits a GPU, but the container is granted none"
            )));
        }
        if let Some(m) = &limits.memory {
            for g in granted {
                if let Some(total) = self.memory_of(g).filter(|t| m.value > *t) {
                    return Err(GpuError::Invalid(format!(
                        "{} {:?} ({} bytes) is larger than GPU {} ({}: {total} bytes)",
                        m.key, m.text, m.value, g.index, g.uuid
                    )));
                }
            }
        }
        if let Some(c) = &limits.cores {
            if c.value > 100 {
                return Err(GpuError::Invalid(format!(
                    "{} {:?} is larger than one GPU (100)",
                    c.key, c.text
                )));
            }
        }
        Ok(())
    }

    fn grant(
        &self,
        t: &Target<'_>,
        capabilities: &BTreeSet<Capability>,
        limits: &Limits,
        granted: &[&Device],
    ) -> Grant {
        let meta = t.pod.metadata.clone().unwrap_or_default();
        Grant {
            container_id: t.container_id.to_string(),
            container_name: t
                .config
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            pod_name: meta.name,
            pod_namespace: meta.namespace,
            pod_uid: meta.uid,
            uuids: granted.iter().map(|g| g.uuid.clone()).collect(),
            memory_limit_bytes: limits.memory.as_ref().map(|l| l.value),
            // 100% of a GPU is no limit at all.
            core_percent: limits.cores.as_ref().map(|l| l.value).filter(|p| *p < 100),
            capabilities: capabilities.iter().copied().collect(),
            driver_view: None,
        }
    }

    /// The limits: config and accounting files, env, the interceptor.
    fn limit(
        &self,
        t: &Target<'_>,
        capabilities: &BTreeSet<Capability>,
        grant: &Grant,
        dir: &ContainerDir,
        tree: Tree,
        edits: &mut Vec<Edit>,
    ) -> Result<(), GpuError> {
        let real_lib = match tree {
            Tree::Shared => mirror::CONTAINER_ORIGIN_LIB,
            Tree::Origin => mirror::CONTAINER_LIB,
        };
        let has = |c: Capability| capabilities.contains(&c);
        let mps = self.runs_mps();
        let config = dir.write_config(&VgpuConfig {
            version: container::VGPU_CONFIG_VERSION,
            container_id: t.container_id.to_string(),
            pod_uid: grant.pod_uid.clone(),
            device_uuids: grant.uuids.clone(),
            memory_limit_bytes: grant.memory_limit_bytes,
            core_percent: grant.core_percent,
            libcuda: format!("{real_lib}/libcuda.so.1").into(),
            libnvidia_ml: has(Capability::Utility)
                .then(|| format!("{real_lib}/libnvidia-ml.so.1").into()),
            accounting_file: container::ACCOUNTING_FILE.into(),
            core_policy: Some(self.config.core_policy),
            mps: mps && grant.core_percent.is_some(),
        })?;
        edits.push(Edit::bind(&config, container::CONFIG_PATH, false));
        let shared = dir.create_accounting()?;
        edits.push(Edit::bind(&shared, container::SHARED_DIR, true));
        if let Some(m) = grant.memory_limit_bytes {
            edits.push(Edit::env("CRISHIM_VGPU_MEMORY_LIMIT", &m.to_string()));
        }
        if let Some(c) = grant.core_percent {
            edits.push(Edit::env("CRISHIM_VGPU_CORE_LIMIT", &c.to_string()));
        }
        if mps {
            edits.extend(mps_limits(grant));
        }
        if self.config.inject == InjectMode::Preload {
            let inside = format!("{}/{}", container::VGPU_DIR, config::INTERCEPTOR_NAME);
            let own = read_in_rootfs(t.rootfs, "etc/ld.so.preload")?;
            let preload = dir.write_preload(&inside, own.as_deref())?;
            edits.push(Edit::bind(&self.interceptor, &inside, false));
            edits.push(Edit::bind(&preload, container::PRELOAD_PATH, false));
        }
        Ok(())
    }
}

/// The most of the image's `/etc/ld.so.preload` read (a list of a few library paths; glibc
/// itself reads no more than a page or two of it in practice).
const MAX_PRELOAD_BYTES: u64 = 64 << 10;

/// A file of the image, resolved inside the root filesystem (never through a link out of it),
/// through the bounded reader: a device, a FIFO or a file over `MAX_PRELOAD_BYTES` is refused
/// with `FailedPrecondition`, never read.
fn read_in_rootfs(rootfs: &Path, rel: &str) -> Result<Option<String>, GpuError> {
    use crishim_sys::confined::{self, Limits};
    confined::read_text(rootfs, rel, Limits::in_root(MAX_PRELOAD_BYTES)).map_err(|e| {
        if e.is_refusal() {
            GpuError::Unavailable(format!(
                "GPU limits need the interceptor named in the image's /etc/ld.so.preload, and the image's own could not be read: {e}"
            ))
        } else {
            GpuError::Internal(e.to_string())
        }
    })
}

#[cfg(test)]
mod tests;
