//! Wire protocols spoken by crishim.
//!
//! - `cri`: the Kubernetes CRI v1 API (generated tonic/prost bindings from `k8s-cri`).
//! - `shim`: the daemon ⇄ per-pod shim protocol, and `record`: the atomic record files both read.
//! - `hostfs`: creating and tightening root-only directories and files.
//! - `cgroups_path`: the OCI cgroupsPath forms (cgroupfs and systemd) and the directory each names.
//! - `random`: ids and tokens from `getrandom(2)`.
//! - `vgpu`: the config the runtime writes for the GPU interceptor in a container.

pub use k8s_cri::v1 as cri;
pub mod cgroups_path;
pub mod hostfs;
pub mod random;
pub mod record;
pub mod shim;
pub mod shown;
pub mod vgpu;
