//! One CRI client for both runtimes: tonic over a unix socket, the k8s-cri v1 types.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crishim_proto::cri;
use crishim_proto::cri::image_service_client::ImageServiceClient;
use crishim_proto::cri::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

#[derive(Clone)]
pub struct Cri {
    rt: RuntimeServiceClient<Channel>,
    img: ImageServiceClient<Channel>,
}

impl Cri {
    pub async fn connect(socket: &Path) -> Result<Cri> {
        let ch = crishim_tests::daemon::connect_unix(socket)
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?;
        Ok(Cri {
            rt: RuntimeServiceClient::new(ch.clone()),
            img: ImageServiceClient::new(ch),
        })
    }

    /// As [`Self::connect`], with each call failing after `timeout` rather than the harness's
    /// 90 s (a full pull of several GiB at a throttled rate takes longer).
    pub async fn connect_with_timeout(socket: &Path, timeout: Duration) -> Result<Cri> {
        let ch = crishim_cri::cri_client::connect_unix(socket, timeout)
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?;
        Ok(Cri {
            rt: RuntimeServiceClient::new(ch.clone()),
            img: ImageServiceClient::new(ch),
        })
    }

    /// `runtime_name runtime_version`, from Version.
    pub async fn version(&self) -> Result<String> {
        let v = self
            .rt
            .clone()
            .version(cri::VersionRequest {
                version: "v1".into(),
            })
            .await?
            .into_inner();
        Ok(format!("{} {}", v.runtime_name, v.runtime_version))
    }

    /// Wait until Status reports RuntimeReady and NetworkReady.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self
                .rt
                .clone()
                .status(cri::StatusRequest { verbose: false })
                .await?
                .into_inner();
            let conds = st.status.map(|s| s.conditions).unwrap_or_default();
            let ready = |t: &str| conds.iter().any(|c| c.r#type == t && c.status);
            if ready("RuntimeReady") && ready("NetworkReady") {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("runtime not ready after {timeout:?}: {conds:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn pull(&self, image: &str) -> Result<String> {
        let r = self
            .img
            .clone()
            .pull_image(cri::PullImageRequest {
                image: Some(crishim_tests::cri::spec(image)),
                auth: None,
                sandbox_config: None,
            })
            .await
            .with_context(|| format!("PullImage {image}"))?;
        Ok(r.into_inner().image_ref)
    }

    /// ImageStatus with `verbose`: the runtime's `info` map (empty when the image is unknown).
    pub async fn image_info(&self, image: &str) -> Result<HashMap<String, String>> {
        let r = self
            .img
            .clone()
            .image_status(cri::ImageStatusRequest {
                image: Some(crishim_tests::cri::spec(image)),
                verbose: true,
            })
            .await
            .with_context(|| format!("ImageStatus {image}"))?;
        Ok(r.into_inner().info)
    }

    pub async fn run_pod(&self, config: &cri::PodSandboxConfig) -> Result<String> {
        let r = self
            .rt
            .clone()
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await
            .context("RunPodSandbox")?;
        Ok(r.into_inner().pod_sandbox_id)
    }

    pub async fn create_container(
        &self,
        pod_id: &str,
        config: &cri::ContainerConfig,
        sandbox: &cri::PodSandboxConfig,
    ) -> Result<String> {
        let r = self
            .rt
            .clone()
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod_id.into(),
                config: Some(config.clone()),
                sandbox_config: Some(sandbox.clone()),
            })
            .await
            .context("CreateContainer")?;
        Ok(r.into_inner().container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<()> {
        self.rt
            .clone()
            .start_container(cri::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .context("StartContainer")?;
        Ok(())
    }

    /// The streaming URL of an `Exec` with stdin, stdout and stderr.
    pub async fn exec_url(&self, id: &str, cmd: &[&str]) -> Result<String> {
        Ok(self
            .rt
            .clone()
            .exec(cri::ExecRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                stdin: true,
                stdout: true,
                stderr: true,
                tty: false,
            })
            .await
            .context("Exec")?
            .into_inner()
            .url)
    }

    /// ExecSync that must exit 0.
    pub async fn exec_ok(&self, id: &str, cmd: &[&str]) -> Result<()> {
        let r = self
            .rt
            .clone()
            .exec_sync(cri::ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout: 30,
            })
            .await
            .context("ExecSync")?
            .into_inner();
        if r.exit_code != 0 {
            bail!(
                "ExecSync {cmd:?} exited {}: {}",
                r.exit_code,
                String::from_utf8_lossy(&r.stderr)
            );
        }
        Ok(())
    }

    /// ExecSync that must exit 0 within `timeout_s` seconds; returns its stdout.
    pub async fn exec_output(&self, id: &str, cmd: &[&str], timeout_s: i64) -> Result<Vec<u8>> {
        let r = self
            .rt
            .clone()
            .exec_sync(cri::ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout: timeout_s,
            })
            .await
            .with_context(|| format!("ExecSync {cmd:?}"))?
            .into_inner();
        if r.exit_code != 0 {
            bail!(
                "ExecSync {cmd:?} exited {}: {}",
                r.exit_code,
                String::from_utf8_lossy(&r.stderr)
            );
        }
        Ok(r.stdout)
    }

    pub async fn stop_pod(&self, id: &str) -> Result<()> {
        self.rt
            .clone()
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .context("StopPodSandbox")?;
        Ok(())
    }

    pub async fn remove_pod(&self, id: &str) -> Result<()> {
        self.rt
            .clone()
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .context("RemovePodSandbox")?;
        Ok(())
    }

    /// The kubelet's relist: every pod, then every container.
    pub async fn relist(&self) -> Result<(usize, usize)> {
        let pods = self
            .rt
            .clone()
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .context("ListPodSandbox")?
            .into_inner()
            .items
            .len();
        let containers = self
            .rt
            .clone()
            .list_containers(cri::ListContainersRequest { filter: None })
            .await
            .context("ListContainers")?
            .into_inner()
            .containers
            .len();
        Ok((pods, containers))
    }

    /// Stats of every container (the kubelet's summary API, with CRI stats).
    pub async fn list_container_stats(&self) -> Result<usize> {
        Ok(self
            .rt
            .clone()
            .list_container_stats(cri::ListContainerStatsRequest { filter: None })
            .await
            .context("ListContainerStats")?
            .into_inner()
            .stats
            .len())
    }

    /// IDs of every pod the runtime knows.
    pub async fn pod_ids(&self) -> Result<Vec<String>> {
        let r = self
            .rt
            .clone()
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .context("ListPodSandbox")?;
        Ok(r.into_inner().items.into_iter().map(|p| p.id).collect())
    }
}

/// A pod config as the kubelet sends it: metadata, hostname, a log directory (created), the pod's
/// cgroup parent (which the kubelet creates first, so the caller must too), pod network and IPC,
/// container PID namespace.
pub fn pod_config(
    name: &str,
    uid: &str,
    log_dir: &Path,
    cgroup_parent: &str,
) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: "crishim-bench".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.to_string_lossy().into_owned(),
        labels: HashMap::from([("app".into(), "crishim-bench".into())]),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.into(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(crishim_tests::pods::namespaces(
                    crishim_tests::pods::NS_POD,
                    crishim_tests::pods::NS_CONTAINER,
                    crishim_tests::pods::NS_POD,
                )),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
