//! What the pod path does to the host, behind three narrow traits (as youki's `Syscall` and
//! containerd's fake CNI plugin): the pod's shim process ([`PodShims`]), its network
//! ([`PodNetwork`]: CNI ADD/DEL and the pinned network namespace) and its host files
//! ([`PodFiles`]: /dev/shm and the hostname, hosts and resolv.conf on their tmpfs). The
//! handlers' logic (ordering, rollback, records) is then tested against fakes
//! (`fakes.rs`, `sandbox_tests.rs`); the real implementations here are the code the handlers
//! ran directly before.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use super::errors::Error;
use crishim_proto::shim::{InfraSpec, OciRuntimeSpec};

use super::runtime_service::SHIM_TIMEOUT;
use crishim_cni::{netns, Cni, CniError, NetworkResult};
use crishim_sys::blocking::read_capped;

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

/// The real shims: `crishim-shim start` and `crishim-shim cleanup` processes, and signals.
pub struct ProcessPodShims {
    binary: PathBuf,
    seccomp_cache: PathBuf,
}

impl ProcessPodShims {
    /// Shims run from `binary`, caching compiled seccomp filters in `seccomp_cache`.
    pub fn new(binary: PathBuf, seccomp_cache: PathBuf) -> Self {
        ProcessPodShims {
            binary,
            seccomp_cache,
        }
    }
}

#[tonic::async_trait]
impl PodShims for ProcessPodShims {
    async fn start(
        &self,
        _pod_id: &str,
        dir: &Path,
        infra: &InfraSpec,
        oci: Option<&OciRuntimeSpec>,
    ) -> Result<i32, Error> {
        let infra_json =
            serde_json::to_string(infra).map_err(|e| Error::internal(e.to_string()))?;
        let mut cmd = tokio::process::Command::new(&self.binary);
        cmd.arg("start")
            .arg("--dir")
            .arg(dir)
            .arg("--infra")
            .arg(infra_json)
            .arg("--seccomp-cache")
            .arg(&self.seccomp_cache);
        if let Some(oci) = oci {
            let json = serde_json::to_string(oci).map_err(|e| Error::internal(e.to_string()))?;
            cmd.arg("--oci-runtime").arg(json);
        }
        // `crishim-shim start` exits once the shim it forked is ready, printing `ok <infra pid>`
        // (so no request needs to ask). Bounded: a shim that never gets ready is killed (on
        // drop), and only the first bytes of what it prints are kept.
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::internal(format!("running shim {}: {e}", self.binary.display())))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let run = async {
            let (stdout, stderr) = tokio::join!(
                read_capped(stdout, SHIM_REPORT_MAX),
                read_capped(stderr, SHIM_REPORT_MAX)
            );
            Ok::<_, std::io::Error>((child.wait().await?, stdout?, stderr?))
        };
        let (status, stdout, stderr) = match tokio::time::timeout(SHIM_TIMEOUT, run).await {
            Ok(out) => out.map_err(|e| {
                Error::internal(format!("waiting for shim {}: {e}", self.binary.display()))
            })?,
            Err(_) => {
                return Err(Error::internal(format!(
                    "the pod's shim did not report ready in {}s",
                    SHIM_TIMEOUT.as_secs()
                )))
            }
        };
        if !status.success() {
            return Err(Error::internal(format!(
                "starting the pod's shim failed: {}",
                String::from_utf8_lossy(&stderr).trim()
            )));
        }
        crishim_proto::shim::parse_ready(&stdout)
            .map_err(|why| Error::internal(format!("starting the pod's shim failed: {why}")))
    }

    async fn cleanup_dead(&self, dir: &Path) {
        super::sandbox_stop::cleanup_dead_shim(&self.binary, dir).await
    }

    async fn kill_orphan(&self, pid: i32) {
        super::sandbox_stop::kill_child(pid);
        super::sandbox_stop::reap(pid).await;
    }

    async fn kill_shim_then_infra(&self, _pod_id: &str, dir: &Path) {
        super::sandbox_stop::kill_shim_then_infra(dir).await
    }

    fn remove_cgroups(&self, owned: &[String]) {
        crishim_spec::cgroups::remove(owned)
    }
}

/// At most this much of a starting shim's report, and of its error, is kept: the report is a
/// line, and the error goes into a gRPC status, whose message must fit the client's header limit.
const SHIM_REPORT_MAX: u64 = 4 * 1024;

/// The real network: CNI plugins, and namespaces pinned by bind mounts (made ahead as spares).
pub struct CniPodNetwork {
    cni: Cni,
    spares: Arc<netns::Spares>,
}

impl CniPodNetwork {
    pub fn new(cni: Cni, spares: Arc<netns::Spares>) -> Self {
        CniPodNetwork { cni, spares }
    }
}

#[tonic::async_trait]
impl PodNetwork for CniPodNetwork {
    fn config(&self) -> Result<(), CniError> {
        self.cni.network().map(drop)
    }

    fn ready(&self) -> Result<(), String> {
        self.cni.ready()
    }

    fn take_netns(&self, path: &Path) -> std::io::Result<()> {
        self.spares.take(path)
    }

    fn pin_netns(&self, pid: u32, path: &Path) -> std::io::Result<()> {
        netns::pin(pid, path)
    }

    fn remove_netns(&self, path: &Path) -> std::io::Result<()> {
        netns::unpin(path)
    }

    async fn add(&self, req: &crishim_cni::PodNetwork) -> Result<NetworkResult, CniError> {
        self.cni.setup(req).await
    }

    async fn del(&self, req: &crishim_cni::PodNetwork) -> Result<(), CniError> {
        self.cni.teardown(req).await
    }

    fn has_result(&self, pod_id: &str) -> bool {
        self.cni.cached_result(pod_id).ok().flatten().is_some()
    }

    fn drain_spares(&self) {
        let spares = self.spares.clone();
        tokio::task::spawn_blocking(move || spares.drain());
    }

    fn close(&self) {
        self.spares.close()
    }
}

/// The real files: tmpfs mounts and files on the node.
pub struct HostPodFiles;

impl PodFiles for HostPodFiles {
    fn mount_shm(&self, dir: &Path) -> Result<(), Error> {
        super::sandbox_run::mount_shm(dir)
    }

    fn unmount_shm(&self, dir: &Path) -> std::io::Result<()> {
        if crate::container_images::is_mountpoint(dir) {
            nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH)?;
        }
        Ok(())
    }

    fn write(&self, dir: &Path, files: &[(&str, String); 3]) -> Result<(), Error> {
        super::sandbox_run::write_pod_files(dir, files)
    }

    fn remove_dir(&self, dir: &Path) -> std::io::Result<()> {
        super::runtime_service::remove_pod_dir(dir)
    }
}
