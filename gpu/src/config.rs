//! `[gpu]` in config.toml. The key names are a contract; every key is optional.

use std::path::PathBuf;

use serde::Deserialize;

/// The interceptor's file name: next to the `crishim` binary unless `interceptor` says otherwise.
pub const INTERCEPTOR_NAME: &str = "libcrishim_vgpu.so";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// Where `nvidia[0-9]*`, `nvidiactl`, `nvidia-uvm`… are found.
    #[serde(default = "default_device_root")]
    pub device_root: PathBuf,
    /// Where `driver/nvidia/gpus/*/information` is found.
    #[serde(default = "default_proc_root")]
    pub proc_root: PathBuf,
    /// The root the driver's libraries and binaries are installed under (`etc/ld.so.cache`).
    #[serde(default = "default_driver_root")]
    pub driver_root: PathBuf,
    /// The mirror of the driver files that containers get (`origin/`, `shared/`).
    #[serde(default = "default_vdriver_dir")]
    pub vdriver_dir: PathBuf,
    /// The interceptor library; default: [`INTERCEPTOR_NAME`] next to the `crishim` binary.
    #[serde(default)]
    pub interceptor: Option<PathBuf>,
    #[serde(default)]
    pub inject: InjectMode,
    /// Where CDI specs are read from, in increasing priority.
    #[serde(default = "default_cdi_spec_dirs")]
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// `NVIDIA_VISIBLE_DEVICES` in a container's CRI env requests GPUs (the NVIDIA device
    /// plugin's `envvar` strategy). When false, it does so only for privileged containers, as
    /// the toolkit's `accept-nvidia-visible-devices-envvar-when-unprivileged = false`: anyone who
    /// writes a pod could otherwise ask for every GPU; the device plugin's volume-mounts
    /// strategy still works.
    #[serde(default = "yes")]
    pub accept_env_requests: bool,
    /// Limits come from pod and container annotations. When false, only from the device
    /// plugin's env (`CRISHIM_VGPU_MEMORY_LIMIT`, `CRISHIM_VGPU_CORE_LIMIT`) or CDI, which the
    /// pod's author cannot raise.
    #[serde(default = "yes")]
    pub limit_annotations: bool,
    /// When a container's core limit holds: `force` (always, alone on the GPU or not), `shared`
    /// (only while another process uses the GPU), `disable` (measured, never enforced).
    #[serde(default)]
    pub core_policy: CorePolicy,
    /// Whether the node's GPUs run under MPS: `auto` (the MPS control daemon's pipe, `control`
    /// in `/tmp/nvidia-mps` under `driver_root`, exists), `on`, `off`. Under MPS a container's
    /// limits are also passed to MPS (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`,
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`).
    #[serde(default)]
    pub mps: MpsMode,
}

pub use crishim_proto::vgpu::CorePolicy;

/// See [`GpuConfig::mps`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MpsMode {
    #[default]
    Auto,
    On,
    Off,
}

/// How the interceptor is put between applications and the driver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InjectMode {
    /// A generated `/etc/ld.so.preload` names it.
    #[default]
    Preload,
    /// The `shared/` mirror, whose `libcuda.so.1` and `libnvidia-ml.so.1` load it.
    Replace,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            device_root: default_device_root(),
            proc_root: default_proc_root(),
            driver_root: default_driver_root(),
            vdriver_dir: default_vdriver_dir(),
            interceptor: None,
            inject: InjectMode::default(),
            cdi_spec_dirs: default_cdi_spec_dirs(),
            accept_env_requests: true,
            limit_annotations: true,
            core_policy: CorePolicy::default(),
            mps: MpsMode::default(),
        }
    }
}

fn yes() -> bool {
    true
}

fn default_device_root() -> PathBuf {
    "/dev".into()
}
fn default_proc_root() -> PathBuf {
    "/proc".into()
}
fn default_driver_root() -> PathBuf {
    "/".into()
}
fn default_vdriver_dir() -> PathBuf {
    "/var/lib/crishim/gpu/vdriver".into()
}
fn default_cdi_spec_dirs() -> Vec<PathBuf> {
    vec!["/etc/cdi".into(), "/var/run/cdi".into()]
}

impl GpuConfig {
    /// Every path must be absolute.
    pub fn validate(&self) -> Result<(), String> {
        let mut paths = vec![
            ("gpu.device_root", &self.device_root),
            ("gpu.proc_root", &self.proc_root),
            ("gpu.driver_root", &self.driver_root),
            ("gpu.vdriver_dir", &self.vdriver_dir),
        ];
        if let Some(i) = &self.interceptor {
            paths.push(("gpu.interceptor", i));
        }
        paths.extend(self.cdi_spec_dirs.iter().map(|d| ("gpu.cdi_spec_dirs", d)));
        for (key, p) in paths {
            if !p.is_absolute() {
                return Err(format!(
                    "{key} must be an absolute path, got {:?}",
                    p.display().to_string()
                ));
            }
        }
        Ok(())
    }

    /// The interceptor library's path.
    pub fn interceptor_path(&self) -> PathBuf {
        self.interceptor.clone().unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.join(INTERCEPTOR_NAME)))
                .unwrap_or_else(|| PathBuf::from("/usr/local/bin").join(INTERCEPTOR_NAME))
        })
    }
}
