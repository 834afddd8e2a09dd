//! Wire protocols spoken by crishim.
//!
//! - `cri`: the Kubernetes CRI v1 API, generated from the project's own `cri/runtime_v1.proto`
//!   (at [`CRI_API_VERSION`]).
//! - `shim`: the daemon ⇄ per-pod shim protocol, and `record`: the atomic record files both read.
//! - `hostfs`: creating and tightening root-only directories and files.
//! - `mountinfo`: the mounts of `/proc/self/mountinfo`; `idmap`: detached (and idmapped) mount
//!   trees; `empty_ns`: an empty mount namespace.
//! - `cgroups_path`: the OCI cgroupsPath forms (cgroupfs and systemd) and the directory each names.
//! - `random`: ids and tokens from `getrandom(2)`.
//! - `vgpu`: the config the runtime writes for the GPU interceptor in a container.
//! - `walk`: walking a tree others may be changing (volumes, writable layers) by descriptor.

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
pub const CRI_API_VERSION: &str = "v0.36.3";
pub mod cgroups_path;
pub mod confined;
pub mod empty_ns;
pub mod hostfs;
pub mod idmap;
pub mod mountinfo;
pub mod net;
pub mod random;
pub mod record;
pub mod shim;
pub mod shown;
pub mod testing;
pub mod vgpu;
pub mod walk;
