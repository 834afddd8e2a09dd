//! `/etc/crishim/vgpu/config.json`: what crishim tells the GPU interceptor in a container with
//! limits. The runtime writes it at `CreateContainer` (`runtime/src/gpu`); the interceptor
//! (`interceptor/src/config.rs`) reads it. Unknown keys are refused: a config the interceptor
//! does not fully understand is a broken one, and a broken config fails closed.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where the config is mounted in the container.
pub const CONFIG_PATH: &str = "/etc/crishim/vgpu/config.json";

pub const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub version: u32,
    pub container_id: String,
    pub pod_uid: String,
    /// The granted GPUs, `GPU-…`.
    pub device_uuids: Vec<String>,
    /// Per GPU.
    pub memory_limit_bytes: Option<u64>,
    /// Percent of one GPU, 1..=100.
    pub core_percent: Option<u32>,
    /// The real driver libraries, as seen in the container.
    pub libcuda: PathBuf,
    pub libnvidia_ml: Option<PathBuf>,
    /// The accounting file all the container's processes share.
    pub accounting_file: PathBuf,
}
