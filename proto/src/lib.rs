//! Wire protocols spoken by crishim.
//!
//! - `cri`: the Kubernetes CRI v1 API, generated from the project's own `cri/runtime_v1.proto`
//!   (at [`CRI_API_VERSION`]).
//! - `shim`: the daemon ⇄ per-pod shim protocol (its records are written with
//!   `crishim_sys::record`).
//! - `cgroups_path`: the OCI cgroupsPath forms (cgroupfs and systemd) and the directory each names.
//! - `vgpu`: the config the runtime writes for the GPU interceptor in a container.
//! - `net`: bringing up a network namespace's loopback (the daemon and the shim's infra both do).
//!
//! Host helpers (files, mounts, bounded reads, tree walks, random ids) are in `crishim-sys`.

/// The CRI v1 services and messages (package `runtime.v1`).
pub mod cri {
    tonic::include_proto!("runtime.v1");
}

/// Registry credentials never reach a log: the secret fields show only whether they are set.
impl std::fmt::Debug for cri::AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |s: &String| if s.is_empty() { "" } else { "[redacted]" };
        f.debug_struct("AuthConfig")
            .field("username", &self.username)
            .field("password", &redacted(&self.password))
            .field("auth", &redacted(&self.auth))
            .field("server_address", &self.server_address)
            .field("identity_token", &redacted(&self.identity_token))
            .field("registry_token", &redacted(&self.registry_token))
            .finish()
    }
}

/// The `k8s.io/cri-api` release whose `runtime.v1` the proto follows.
pub const CRI_API_VERSION: &str = "v0.37.0";
pub mod cgroups_path;
pub mod codec;
pub mod init;
pub mod net;
pub mod shim;
pub mod vgpu;
