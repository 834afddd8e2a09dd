//! What the pod path does to the host, behind three narrow traits (as youki's `Syscall` and
//! containerd's fake CNI plugin): the pod's shim process ([`PodShims`]), its network
//! ([`PodNetwork`]: CNI ADD/DEL and the pinned network namespace) and its host files
//! ([`PodFiles`]: /dev/shm and the hostname, hosts and resolv.conf on their tmpfs). The
//! handlers' logic (ordering, rollback, records) is then tested against fakes
//! (`fakes.rs`, `sandbox_tests.rs`); the real implementations here are the code the handlers
//! ran directly before.

use std::path::Path;

use super::errors::Error;
use crishim_proto::shim::{InfraSpec, OciRuntimeSpec};

use crishim_cni::{CniError, NetworkResult};

/// Starting a pod's shim (which starts its infra process) and getting rid of what is left of
/// it. Requests to a running shim go through [`crate::shim_client::Shims`].
#[tonic::async_trait]
pub trait PodShims: Send + Sync {
    /// Start pod `pod_id`'s shim over its state directory `dir`, with its infra process as
    /// `infra` says and, for an external OCI runtime, `oci`. Returns once the shim is ready:
    /// the infra process's pid.
    async fn start(
        &self,
        pod_id: &str,
        dir: &Path,
        infra: &InfraSpec,
        oci: Option<&OciRuntimeSpec>,
    ) -> Result<i32, Error>;

    /// Kill and delete the containers a dead shim left in `dir`.
    async fn cleanup_dead(&self, dir: &Path);

    /// SIGKILL container process `pid` a dead shim left (re-parented to the daemon, its
    /// subreaper) if it is still our unreaped child, and reap it.
    async fn kill_orphan(&self, pid: i32);

    /// Kill what is left of pod `pod_id`'s shim and then of its infra process (their pid files
    /// are in `dir`), and reap both. Idempotent.
    async fn kill_shim_then_infra(&self, pod_id: &str, dir: &Path);

    /// Remove the pod's cgroup parent directories the daemon made (`owned`), if empty.
    fn remove_cgroups(&self, owned: &[String]);
}

/// The pod's network: its network namespace, pinned at a path, and CNI ADD/DEL in it.
#[tonic::async_trait]
pub trait PodNetwork: Send + Sync {
    /// Whether there is a CNI network config: [`CniError::NoConfig`] (with why) when not.
    fn config(&self) -> Result<(), CniError>;

    /// Ok when there is a network config and all its plugins are installed; else the reason.
    fn ready(&self) -> Result<(), String>;

    /// A new network namespace, pinned at `path`.
    fn take_netns(&self, path: &Path) -> std::io::Result<()>;

    /// Pin the network namespace of process `pid` at `path`.
    fn pin_netns(&self, pid: u32, path: &Path) -> std::io::Result<()>;

    /// Unpin and remove the namespace pinned at `path`; a missing one is fine.
    fn remove_netns(&self, path: &Path) -> std::io::Result<()>;

    /// CNI ADD.
    async fn add(&self, req: &crishim_cni::PodNetwork) -> Result<NetworkResult, CniError>;

    /// CNI DEL; on failure what is needed to retry it is kept.
    async fn del(&self, req: &crishim_cni::PodNetwork) -> Result<(), CniError>;

    /// Whether an ADD of pod `pod_id` left a result (which a DEL removes).
    fn has_result(&self, pod_id: &str) -> bool;

    /// No pod is left: drop the spare network namespace, in the background.
    fn drain_spares(&self);

    /// Serving has stopped: no more spares, and the one held is dropped.
    fn close(&self);
}

/// The pod's files on the host that its containers bind-mount.
pub trait PodFiles: Send + Sync {
    /// Mount the pod's /dev/shm (a bounded tmpfs) at `dir`, made first.
    fn mount_shm(&self, dir: &Path) -> Result<(), Error>;

    /// Unmount the pod's /dev/shm at `dir`, where it is mounted.
    fn unmount_shm(&self, dir: &Path) -> std::io::Result<()>;

    /// Mount the pod files' own tmpfs at `dir` and write each `(name, content)` there, 0644.
    fn write(&self, dir: &Path, files: &[(&str, String); 3]) -> Result<(), Error>;

    /// Remove one of the pod's directories, detaching a mount at it first; a missing one is
    /// fine.
    fn remove_dir(&self, dir: &Path) -> std::io::Result<()>;
}

pub mod files;
pub mod network;
pub mod shims;
