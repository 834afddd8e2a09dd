//! Pods and containers: thin helpers over the CRI RuntimeService (as methods on [`Daemon`]), a
//! per-test environment ([`PodEnv`]: registry + busybox image + daemon), the CRI log format, host
//! inspection (processes, mounts, cgroups) and the leak checker [`assert_no_leaks`].
//!
//! The typical test:
//!
//! ```ignore
//! let env = PodEnv::start().await;
//! let cfg = env.pod_config("web");
//! let pod = env.d.run_pod(&cfg).await.unwrap();
//! let mut traces = PodTraces::new(&pod, &cfg);
//! let c = env.d.run_container(&pod, &env.container_config("c", &["/bin/sh", "-c", LOOP]), &cfg)
//!     .await.unwrap();
//! traces.capture(&env.d).await;           // while it runs: containers, shim, infra, processes
//! env.d.remove_pod(&pod).await.unwrap();
//! assert_no_leaks(&env.d, &traces).await;
//! env.stop();
//! ```

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crishim_proto::cri;
use tonic::Status;

use crate::cri::spec;
use crate::daemon::Daemon;
use crate::{busybox_image, random_hex, DaemonOptions, Image, PushedImage, Registry};

/// `sh` script: run until SIGTERM, then exit 0. (A shell that is PID 1 of its own pid namespace
/// ignores SIGTERM unless it has a handler; `sleep 0.1` keeps the handler's latency low.)
pub const LOOP_UNTIL_TERM: &str = "trap 'exit 0' TERM; while true; do sleep 0.1; done";

/// `sh` script: ignore SIGTERM for ever, so only SIGKILL ends it.
pub const IGNORE_TERM: &str = "trap '' TERM; while true; do sleep 1; done";

// ---------------------------------------------------------------------------------------------
// Namespace options

pub const NS_POD: i32 = cri::NamespaceMode::Pod as i32;
pub const NS_CONTAINER: i32 = cri::NamespaceMode::Container as i32;
pub const NS_NODE: i32 = cri::NamespaceMode::Node as i32;

/// `NamespaceOption { network, pid, ipc }`.
pub fn namespaces(network: i32, pid: i32, ipc: i32) -> cri::NamespaceOption {
    cri::NamespaceOption {
        network,
        pid,
        ipc,
        ..Default::default()
    }
}

/// Set the pod's namespace modes (creating `linux.security_context` as needed).
/// A pod on the node's network gets no hostname, as the kubelet sends none.
/// Give the pod a user namespace (`mode`) mapping container ids 0..65536 to host ids from
/// `host_base`, uids and gids alike, as the kubelet does for `hostUsers: false`.
pub fn set_pod_userns(cfg: &mut cri::PodSandboxConfig, mode: cri::NamespaceMode, host_base: u32) {
    let map = vec![cri::IdMapping {
        container_id: 0,
        host_id: host_base,
        length: 65536,
    }];
    cfg.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(cri::UserNamespace {
        mode: mode as i32,
        uids: map.clone(),
        gids: map,
    });
}

pub fn set_pod_namespaces(cfg: &mut cri::PodSandboxConfig, ns: cri::NamespaceOption) {
    if ns.network == NS_NODE {
        cfg.hostname.clear();
    }
    let linux = cfg.linux.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    sc.namespace_options = Some(ns);
}

/// Mark the pod privileged (`linux.security_context.privileged`).
pub fn set_pod_privileged(cfg: &mut cri::PodSandboxConfig) {
    let linux = cfg.linux.get_or_insert_with(Default::default);
    linux
        .security_context
        .get_or_insert_with(Default::default)
        .privileged = true;
}

/// Mark the container privileged (`linux.security_context.privileged`).
pub fn set_container_privileged(c: &mut cri::ContainerConfig) {
    let linux = c.linux.get_or_insert_with(Default::default);
    linux
        .security_context
        .get_or_insert_with(Default::default)
        .privileged = true;
}

/// The container's `linux.security_context`, created as needed.
pub fn container_security(c: &mut cri::ContainerConfig) -> &mut cri::LinuxContainerSecurityContext {
    c.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
}

/// The pod's `linux.cgroup_parent` ("" when none).
pub fn cgroup_parent(cfg: &cri::PodSandboxConfig) -> &str {
    cfg.linux
        .as_ref()
        .map(|l| l.cgroup_parent.as_str())
        .unwrap_or("")
}

/// A 64-character lowercase hex ID.
pub fn is_id(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

// ---------------------------------------------------------------------------------------------
// Filters

pub fn container_filter() -> cri::ContainerFilter {
    cri::ContainerFilter::default()
}

pub fn container_state_filter(state: cri::ContainerState) -> cri::ContainerFilter {
    cri::ContainerFilter {
        state: Some(cri::ContainerStateValue {
            state: state as i32,
        }),
        ..Default::default()
    }
}

pub fn pod_state_filter(state: cri::PodSandboxState) -> cri::PodSandboxFilter {
    cri::PodSandboxFilter {
        state: Some(cri::PodSandboxStateValue {
            state: state as i32,
        }),
        ..Default::default()
    }
}

pub fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// RuntimeService calls

impl Daemon {
    /// RunPodSandbox; returns the pod ID.
    pub async fn run_pod(&self, config: &cri::PodSandboxConfig) -> Result<String, Status> {
        self.run_pod_with_handler(config, "").await
    }

    /// RunPodSandbox with a RuntimeClass handler; returns the pod ID.
    pub async fn run_pod_with_handler(
        &self,
        config: &cri::PodSandboxConfig,
        handler: &str,
    ) -> Result<String, Status> {
        Ok(self
            .runtime_client()
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: handler.to_string(),
            })
            .await?
            .into_inner()
            .pod_sandbox_id)
    }

    pub async fn stop_pod(&self, pod_id: &str) -> Result<(), Status> {
        self.runtime_client()
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: pod_id.to_string(),
            })
            .await?;
        Ok(())
    }

    pub async fn remove_pod(&self, pod_id: &str) -> Result<(), Status> {
        self.runtime_client()
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: pod_id.to_string(),
            })
            .await?;
        Ok(())
    }

    /// PodSandboxStatus (not verbose).
    pub async fn pod_status(&self, pod_id: &str) -> Result<cri::PodSandboxStatus, Status> {
        let resp = self
            .runtime_client()
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: pod_id.to_string(),
                verbose: false,
            })
            .await?
            .into_inner();
        resp.status
            .ok_or_else(|| Status::internal("PodSandboxStatus answered without a status"))
    }

    /// The pod's infra process, as the verbose PodSandboxStatus reports it.
    pub async fn infra_pid(&self, pod_id: &str) -> Result<i32, Status> {
        let info = self
            .runtime_client()
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: pod_id.to_string(),
                verbose: true,
            })
            .await?
            .into_inner()
            .info;
        info.get("info")
            .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
            .and_then(|v| v["pid"].as_i64())
            .map(|pid| pid as i32)
            .ok_or_else(|| Status::internal("the verbose PodSandboxStatus has no pid"))
    }

    pub async fn list_pods(
        &self,
        filter: Option<cri::PodSandboxFilter>,
    ) -> Result<Vec<cri::PodSandbox>, Status> {
        Ok(self
            .runtime_client()
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter })
            .await?
            .into_inner()
            .items)
    }

    /// IDs of ListPodSandbox(filter), sorted.
    pub async fn list_pod_ids(
        &self,
        filter: Option<cri::PodSandboxFilter>,
    ) -> Result<Vec<String>, Status> {
        let mut ids: Vec<String> = self
            .list_pods(filter)
            .await?
            .into_iter()
            .map(|p| p.id)
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// CreateContainer; returns the container ID.
    pub async fn create_container(
        &self,
        pod_id: &str,
        config: &cri::ContainerConfig,
        sandbox_config: &cri::PodSandboxConfig,
    ) -> Result<String, Status> {
        Ok(self
            .runtime_client()
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod_id.to_string(),
                config: Some(config.clone()),
                sandbox_config: Some(sandbox_config.clone()),
            })
            .await?
            .into_inner()
            .container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<(), Status> {
        self.runtime_client()
            .start_container(cri::StartContainerRequest {
                container_id: id.to_string(),
            })
            .await?;
        Ok(())
    }

    /// CreateContainer + StartContainer; returns the container ID.
    pub async fn run_container(
        &self,
        pod_id: &str,
        config: &cri::ContainerConfig,
        sandbox_config: &cri::PodSandboxConfig,
    ) -> Result<String, Status> {
        let id = self
            .create_container(pod_id, config, sandbox_config)
            .await?;
        self.start_container(&id).await?;
        Ok(id)
    }

    /// StopContainer with a timeout in seconds.
    pub async fn stop_container(&self, id: &str, timeout: i64) -> Result<(), Status> {
        self.runtime_client()
            .stop_container(cri::StopContainerRequest {
                container_id: id.to_string(),
                timeout,
            })
            .await?;
        Ok(())
    }

    pub async fn remove_container(&self, id: &str) -> Result<(), Status> {
        self.runtime_client()
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await?;
        Ok(())
    }

    /// The host pid of the container's init (`ContainerStatus` verbose info).
    pub async fn container_pid(&self, id: &str) -> i32 {
        let info = self
            .runtime_client()
            .container_status(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: true,
            })
            .await
            .expect("ContainerStatus")
            .into_inner()
            .info;
        let v: serde_json::Value = serde_json::from_str(&info["info"]).expect("verbose info");
        v["pid"].as_i64().expect("a pid in the verbose info") as i32
    }

    /// ContainerStatus (not verbose).
    pub async fn container_status(&self, id: &str) -> Result<cri::ContainerStatus, Status> {
        let resp = self
            .runtime_client()
            .container_status(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await?
            .into_inner();
        resp.status
            .ok_or_else(|| Status::internal("ContainerStatus answered without a status"))
    }

    pub async fn list_containers(
        &self,
        filter: Option<cri::ContainerFilter>,
    ) -> Result<Vec<cri::Container>, Status> {
        Ok(self
            .runtime_client()
            .list_containers(cri::ListContainersRequest { filter })
            .await?
            .into_inner()
            .containers)
    }

    /// IDs of ListContainers(filter), sorted.
    pub async fn list_container_ids(
        &self,
        filter: Option<cri::ContainerFilter>,
    ) -> Result<Vec<String>, Status> {
        let mut ids: Vec<String> = self
            .list_containers(filter)
            .await?
            .into_iter()
            .map(|c| c.id)
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// ExecSync with a timeout in seconds (0: none).
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: &[&str],
        timeout: i64,
    ) -> Result<cri::ExecSyncResponse, Status> {
        Ok(self
            .runtime_client()
            .exec_sync(cri::ExecSyncRequest {
                container_id: id.to_string(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout,
            })
            .await?
            .into_inner())
    }

    /// ExecSync that must succeed with exit code 0; returns stdout as text.
    pub async fn exec_ok(&self, id: &str, cmd: &[&str]) -> String {
        let r = self
            .exec_sync(id, cmd, 30)
            .await
            .unwrap_or_else(|e| panic!("ExecSync {cmd:?} in {id}: {e:?}"));
        assert_eq!(
            r.exit_code,
            0,
            "ExecSync {cmd:?} exited with {}; stdout {:?}, stderr {:?}",
            r.exit_code,
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        );
        String::from_utf8_lossy(&r.stdout).into_owned()
    }

    pub async fn reopen_container_log(&self, id: &str) -> Result<(), Status> {
        self.runtime_client()
            .reopen_container_log(cri::ReopenContainerLogRequest {
                container_id: id.to_string(),
            })
            .await?;
        Ok(())
    }

    pub async fn version(&self) -> Result<cri::VersionResponse, Status> {
        Ok(self
            .runtime_client()
            .version(cri::VersionRequest {
                version: "v1".to_string(),
            })
            .await?
            .into_inner())
    }

    /// The RuntimeService `Status` call.
    pub async fn runtime_status(&self) -> Result<cri::StatusResponse, Status> {
        Ok(self
            .runtime_client()
            .status(cri::StatusRequest { verbose: false })
            .await?
            .into_inner())
    }

    pub async fn runtime_config(&self) -> Result<cri::RuntimeConfigResponse, Status> {
        Ok(self
            .runtime_client()
            .runtime_config(cri::RuntimeConfigRequest {})
            .await?
            .into_inner())
    }

    pub async fn update_runtime_config(&self, pod_cidr: &str) -> Result<(), Status> {
        self.runtime_client()
            .update_runtime_config(cri::UpdateRuntimeConfigRequest {
                runtime_config: Some(cri::RuntimeConfig {
                    network_config: Some(cri::NetworkConfig {
                        pod_cidr: pod_cidr.to_string(),
                    }),
                }),
            })
            .await?;
        Ok(())
    }

    /// Poll ContainerStatus until the container is in `state`; panics after `timeout`.
    pub async fn wait_container_state(
        &self,
        id: &str,
        state: cri::ContainerState,
        timeout: Duration,
    ) -> cri::ContainerStatus {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self
                .container_status(id)
                .await
                .unwrap_or_else(|e| panic!("ContainerStatus({id}): {e:?}"));
            if st.state == state as i32 {
                return st;
            }
            if Instant::now() > deadline {
                panic!("container {id} not {state:?} after {timeout:?}: {st:#?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The per-test environment

/// A registry holding `busybox_image()` as `<registry>/busybox:latest`, a daemon that pulled it,
/// and a [`Janitor`] that force-cleans whatever a failed test leaves on the host.
///
/// Fields drop in order: the janitor first (while the daemon's directory still exists), then the
/// daemon, then the registry.
pub struct PodEnv {
    pub janitor: Janitor,
    pub d: Daemon,
    pub reg: Registry,
    pub busybox: PushedImage,
}

impl PodEnv {
    pub async fn start() -> PodEnv {
        Self::start_with(DaemonOptions::new()).await
    }

    pub async fn start_with(opts: DaemonOptions) -> PodEnv {
        let reg = Registry::start(Default::default())
            .await
            .expect("starting docker-registry");
        let busybox = reg
            .push("busybox", "latest", &busybox_image())
            .await
            .expect("pushing busybox");
        let d = Daemon::start(opts).await.expect("starting crishim serve");
        let janitor = Janitor::new(&d);
        let env = PodEnv {
            janitor,
            d,
            reg,
            busybox,
        };
        env.d
            .pull(&env.busybox.tag_ref())
            .await
            .expect("pulling busybox through the daemon");
        env
    }

    /// Push `image` to this env's registry as `<repo>:latest` and pull it through the daemon.
    pub async fn push_and_pull(&self, repo: &str, image: &Image) -> PushedImage {
        let p = self
            .reg
            .push(repo, "latest", image)
            .await
            .expect("pushing test image");
        self.d.pull(&p.tag_ref()).await.expect("pulling test image");
        p
    }

    /// Run a pod of `pod_cfg` with one container of `cfg` started in it; returns (pod, container,
    /// traces of both, captured for the leak check).
    pub async fn run_traced(
        &self,
        pod_cfg: &cri::PodSandboxConfig,
        cfg: &cri::ContainerConfig,
    ) -> (String, String, PodTraces) {
        let pod = self.d.run_pod(pod_cfg).await.expect("RunPodSandbox");
        let ctr = self
            .d
            .run_container(&pod, cfg, pod_cfg)
            .await
            .expect("create and start");
        let mut traces = PodTraces::new(&pod, pod_cfg);
        traces.add_container(&ctr);
        traces.capture(&self.d).await;
        (pod, ctr, traces)
    }

    /// Run pod `name` with one container `main` running `sleep 1000`; returns (pod, container).
    pub async fn run_sleeping(&self, name: &str) -> (String, String) {
        let cfg = self.pod_config(name);
        let pod = self.d.run_pod(&cfg).await.expect("RunPodSandbox");
        let c = self.container_config("main", &["sleep", "1000"]);
        let id = self
            .d
            .run_container(&pod, &c, &cfg)
            .await
            .expect("run container");
        (pod, id)
    }

    /// The busybox reference containers use (`<registry>/busybox:latest`).
    pub fn image(&self) -> String {
        self.busybox.tag_ref()
    }

    /// A pod config as the kubelet sends it: metadata (`name`, a random uid, namespace
    /// `crishim-test`), hostname = name, a log directory `<daemon dir>/pod-logs/<ns>_<name>_<uid>`
    /// (created), cgroup parent `/crishim-test-<random>` (created in every v1 hierarchy first,
    /// as the kubelet's cgroupfs driver does; removed by the janitor at the end), namespaces
    /// network POD, pid CONTAINER, ipc POD, and label `crishim-test=<name>`.
    pub fn pod_config(&self, name: &str) -> cri::PodSandboxConfig {
        self.pod_config_with(name, true)
    }

    /// [`Self::pod_config`], creating the cgroup parent first or not (then the daemon has to).
    pub fn pod_config_with(&self, name: &str, create_cgroup_parent: bool) -> cri::PodSandboxConfig {
        let uid = format!(
            "{}-{}-{}-{}-{}",
            random_hex(4),
            random_hex(2),
            random_hex(2),
            random_hex(2),
            random_hex(6)
        );
        let namespace = "crishim-test".to_string();
        let log_dir = self
            .d
            .dir()
            .join("pod-logs")
            .join(format!("{namespace}_{name}_{uid}"));
        std::fs::create_dir_all(&log_dir).expect("creating the pod log directory");
        let cgroup_parent = format!("/crishim-test-{}", random_hex(6));
        self.janitor.add_cgroup_parent(&cgroup_parent);
        if create_cgroup_parent {
            create_cgroup_dirs(&cgroup_parent).expect("creating the pod's cgroup parent");
        }
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.to_string(),
                uid,
                namespace,
                attempt: 0,
            }),
            hostname: name.to_string(),
            log_directory: log_dir.to_string_lossy().into_owned(),
            labels: labels(&[("crishim-test", name)]),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent,
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces(NS_POD, NS_CONTAINER, NS_POD)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A container config for busybox: metadata `name`, `command` (no args), log path
    /// `<name>.log`, label `crishim-test-container=<name>`.
    pub fn container_config(&self, name: &str, command: &[&str]) -> cri::ContainerConfig {
        container_config(name, &self.image(), command)
    }

    /// Capture `pod`'s traces, stop and remove it, assert it left nothing, then [`Self::stop`].
    pub async fn finish_pod(self, pod: &str, mut traces: PodTraces) {
        traces.capture(&self.d).await;
        self.d.stop_pod(pod).await.unwrap();
        self.d.remove_pod(pod).await.unwrap();
        assert_no_leaks(&self.d, &traces).await;
        self.stop();
    }

    /// SIGTERM the daemon and assert a clean exit (after the janitor ran).
    pub fn stop(self) {
        let PodEnv {
            janitor, d, reg, ..
        } = self;
        drop(janitor);
        d.stop();
        drop(reg);
    }
}

/// A `/bin/sh -c SCRIPT MARKER` command: `MARKER` becomes `$0`, so the shell is found on the
/// host by its command line.
pub fn sh(script: &str, marker: &str) -> Vec<String> {
    vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        script.to_string(),
        marker.to_string(),
    ]
}

/// A unique marker for a command line, found again on the host with `ps`.
pub fn marker(what: &str) -> String {
    format!("crishim-{what}-{}", random_hex(6))
}

/// A container config running `sh -c script marker`.
pub fn sh_container(env: &PodEnv, name: &str, script: &str, marker: &str) -> cri::ContainerConfig {
    let mut c = env.container_config(name, &[]);
    c.command = sh(script, marker);
    c
}

/// A container config: metadata `name`, image `image`, `command`, log path `<name>.log`, label
/// `crishim-test-container=<name>`.
pub fn container_config(name: &str, image: &str, command: &[&str]) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(spec(image)),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        labels: labels(&[("crishim-test-container", name)]),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// CRI log files

/// One record of a CRI log file: `<RFC3339Nano> <stdout|stderr> <P|F> <text>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    pub time: String,
    pub stream: String,
    pub partial: bool,
    pub text: Vec<u8>,
}

/// `2006-01-02T15:04:05[.fraction up to 9 digits](Z|±hh:mm)`.
pub fn is_rfc3339_nano(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        b.get(r.clone())
            .is_some_and(|x| x.len() == r.len() && x.iter().all(u8::is_ascii_digit))
    };
    if !(digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && b.get(7) == Some(&b'-')
        && digits(8..10)
        && b.get(10) == Some(&b'T')
        && digits(11..13)
        && b.get(13) == Some(&b':')
        && digits(14..16)
        && b.get(16) == Some(&b':')
        && digits(17..19))
    {
        return false;
    }
    let mut i = 19;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start || i - start > 9 {
            return false;
        }
    }
    match b.get(i) {
        Some(b'Z') => i + 1 == b.len(),
        Some(b'+') | Some(b'-') => {
            i + 6 == b.len() && digits(i + 1..i + 3) && b[i + 3] == b':' && digits(i + 4..i + 6)
        }
        _ => false,
    }
}

/// Parse a whole CRI log file; every line must be well formed.
pub fn parse_cri_log(bytes: &[u8]) -> Result<Vec<LogRecord>, String> {
    let mut out = Vec::new();
    if bytes.is_empty() {
        return Ok(out);
    }
    let Some(body) = bytes.strip_suffix(b"\n") else {
        return Err(format!(
            "log does not end with a newline: ...{:?}",
            String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(80)..])
        ));
    };
    for (n, line) in body.split(|&b| b == b'\n').enumerate() {
        let show = || String::from_utf8_lossy(&line[..line.len().min(120)]).into_owned();
        let mut parts = line.splitn(4, |&b| b == b' ');
        let (Some(time), Some(stream), Some(tag), Some(text)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "line {n}: not 4 space-separated fields: {:?}",
                show()
            ));
        };
        let time = String::from_utf8_lossy(time).into_owned();
        if !is_rfc3339_nano(&time) {
            return Err(format!("line {n}: bad timestamp {time:?}: {:?}", show()));
        }
        let stream = String::from_utf8_lossy(stream).into_owned();
        if stream != "stdout" && stream != "stderr" {
            return Err(format!("line {n}: bad stream {stream:?}: {:?}", show()));
        }
        let partial = match tag {
            b"P" => true,
            b"F" => false,
            _ => return Err(format!("line {n}: bad tag: {:?}", show())),
        };
        out.push(LogRecord {
            time,
            stream,
            partial,
            text: text.to_vec(),
        });
    }
    Ok(out)
}

/// The full lines of one stream: `P` records joined up to and including their `F` record.
pub fn reassemble(records: &[LogRecord], stream: &str) -> Vec<Vec<u8>> {
    let mut lines = Vec::new();
    let mut cur = Vec::new();
    for r in records.iter().filter(|r| r.stream == stream) {
        cur.extend_from_slice(&r.text);
        if !r.partial {
            lines.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

/// Wait until the file at `path` is a valid CRI log holding a full `stream` line equal to `line`;
/// returns its records. Panics after `timeout`.
pub async fn wait_for_log_line(
    path: &Path,
    stream: &str,
    line: &str,
    timeout: Duration,
) -> Vec<LogRecord> {
    let deadline = Instant::now() + timeout;
    loop {
        let bytes = std::fs::read(path).unwrap_or_default();
        // A record may be half written; only judge complete files.
        if bytes.is_empty() || bytes.ends_with(b"\n") {
            let records = parse_cri_log(&bytes)
                .unwrap_or_else(|e| panic!("{} is not a CRI log: {e}", path.display()));
            if reassemble(&records, stream)
                .iter()
                .any(|l| l == line.as_bytes())
            {
                return records;
            }
        }
        if Instant::now() > deadline {
            panic!(
                "{} has no {stream} line {line:?} after {timeout:?}; it holds:\n{}",
                path.display(),
                String::from_utf8_lossy(&bytes[..bytes.len().min(4000)])
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Host processes

/// A process on the host, from `/proc/<pid>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostProcess {
    pub pid: i32,
    pub ppid: i32,
    /// `R`, `S`, `Z`, ...
    pub state: char,
    /// Clock ticks after boot; (pid, starttime) names a process uniquely.
    pub starttime: u64,
    pub cmdline: Vec<String>,
}

impl HostProcess {
    /// The command line joined with spaces.
    pub fn command(&self) -> String {
        self.cmdline.join(" ")
    }

    pub fn is_zombie(&self) -> bool {
        self.state == 'Z'
    }

    /// `/proc/<pid>/environ` as `K=V` strings (empty when unreadable).
    pub fn environ(&self) -> Vec<String> {
        std::fs::read(format!("/proc/{}/environ", self.pid))
            .map(|b| split_nul(&b))
            .unwrap_or_default()
    }

    /// `/proc/<pid>/cgroup` (empty when unreadable).
    pub fn cgroups(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/cgroup", self.pid)).unwrap_or_default()
    }

    /// The path of this process's cgroup in the v1 hierarchy holding `controller`, e.g. `memory`.
    pub fn cgroup_of(&self, controller: &str) -> Option<String> {
        self.cgroups().lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            ctrls
                .split(',')
                .any(|c| c == controller)
                .then(|| path.to_string())
        })
    }

    /// Still the same process (same pid and start time) and not a zombie.
    pub fn is_alive(&self) -> bool {
        read_process(self.pid).is_some_and(|p| p.starttime == self.starttime && !p.is_zombie())
    }
}

fn split_nul(b: &[u8]) -> Vec<String> {
    b.split(|&c| c == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// One process, or `None` when it is gone.
pub fn read_process(pid: i32) -> Option<HostProcess> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let state = f.first()?.chars().next()?;
    let ppid = f.get(1)?.parse().ok()?;
    // Field 22 of stat; `after` starts at field 3.
    let starttime = f.get(19)?.parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| split_nul(&b))
        .unwrap_or_default();
    Some(HostProcess {
        pid,
        ppid,
        state,
        starttime,
        cmdline,
    })
}

/// Every process on the host (kernel threads included; they have an empty command line).
pub fn host_processes() -> Vec<HostProcess> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) {
                if let Some(p) = read_process(pid) {
                    out.push(p);
                }
            }
        }
    }
    out.sort_by_key(|p| p.pid);
    out
}

/// Live (non-zombie) processes whose command line contains `needle`.
pub fn processes_with_command(needle: &str) -> Vec<HostProcess> {
    host_processes()
        .into_iter()
        .filter(|p| !p.is_zombie() && p.command().contains(needle))
        .collect()
}

/// `roots` and all their descendants among `procs`.
pub fn with_descendants(procs: &[HostProcess], roots: &[i32]) -> Vec<HostProcess> {
    let mut keep: BTreeSet<i32> = roots.iter().copied().collect();
    loop {
        let before = keep.len();
        for p in procs {
            if keep.contains(&p.ppid) {
                keep.insert(p.pid);
            }
        }
        if keep.len() == before {
            break;
        }
    }
    procs
        .iter()
        .filter(|p| keep.contains(&p.pid))
        .cloned()
        .collect()
}

/// Wait until no live process's command line contains `needle`; returns those still there.
pub async fn wait_no_process_with_command(needle: &str, timeout: Duration) -> Vec<HostProcess> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = processes_with_command(needle);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Mounts

/// One line of a `mountinfo` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub root: String,
    pub mount_point: String,
    pub fstype: String,
    pub source: String,
    /// The whole line, as read.
    pub line: String,
}

/// `\040` etc. back to bytes.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            out.push((v & 0xff) as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount table of `/proc/<pid>/mountinfo` (`None`: our own).
pub fn mounts_of(pid: Option<i32>) -> Vec<MountEntry> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/mountinfo"),
        None => "/proc/self/mountinfo".to_string(),
    };
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            Some(MountEntry {
                root: unescape_mountinfo(l.get(3)?),
                mount_point: unescape_mountinfo(l.get(4)?),
                fstype: r.first()?.to_string(),
                source: unescape_mountinfo(r.get(1).copied().unwrap_or("")),
                line: line.to_string(),
            })
        })
        .collect()
}

/// Our own mount table.
pub fn mounts() -> Vec<MountEntry> {
    mounts_of(None)
}

/// Mounts whose mount point is `dir` or lies below it.
pub fn mounts_under(dir: &Path) -> Vec<MountEntry> {
    mounts()
        .into_iter()
        .filter(|m| Path::new(&m.mount_point).starts_with(dir))
        .collect()
}

fn same_mount_ns(pid: i32) -> bool {
    let a = std::fs::read_link("/proc/self/ns/mnt");
    let b = std::fs::read_link(format!("/proc/{pid}/ns/mnt"));
    match (a, b) {
        (Ok(a), Ok(b)) => a == b,
        _ => true,
    }
}

// ---------------------------------------------------------------------------------------------
// cgroups

/// The roots of every cgroup hierarchy: `/sys/fs/cgroup/<controller>` (v1, hybrid), and
/// `/sys/fs/cgroup/unified` or `/sys/fs/cgroup` itself (v2). Symlinked aliases (`cpu,cpuacct`)
/// are skipped.
pub fn cgroup_roots() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        return vec![base.to_path_buf()];
    }
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(base) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// The roots a pod-level cgroup is created in by the kubelet: every v1 controller hierarchy
/// (not `systemd` nor the hybrid `unified`), or the v2 root.
pub fn controller_roots() -> Vec<PathBuf> {
    cgroup_roots()
        .into_iter()
        .filter(|r| {
            r == Path::new("/sys/fs/cgroup")
                || !matches!(
                    r.file_name().and_then(|n| n.to_str()),
                    Some("systemd" | "unified")
                )
        })
        .collect()
}

/// `mkdir` the cgroup `path` (e.g. `/crishim-test-x`) in every [`controller_roots`] hierarchy,
/// filling an empty v1 `cpuset.cpus`/`cpuset.mems` from the root (as libcontainer does), so
/// processes can join its children. Returns the directories made.
pub fn create_cgroup_dirs(path: &str) -> std::io::Result<Vec<PathBuf>> {
    let rel = path.trim_matches('/');
    let mut made = Vec::new();
    for root in controller_roots() {
        let mut dir = root.clone();
        for part in rel.split('/') {
            dir.push(part);
            if !dir.is_dir() {
                std::fs::create_dir(&dir)?;
                made.push(dir.clone());
            }
            for f in ["cpuset.cpus", "cpuset.mems"] {
                // v1 only: a v2 root has no cpuset.cpus, and an empty one there means "inherit".
                let file = dir.join(f);
                if file.exists()
                    && root.join(f).exists()
                    && std::fs::read_to_string(&file).is_ok_and(|v| v.trim().is_empty())
                {
                    let v = std::fs::read_to_string(root.join(f))?;
                    std::fs::write(&file, v.trim())?;
                }
            }
        }
    }
    Ok(made)
}

/// cgroup directories (down to `max_depth` below each hierarchy root) whose name satisfies `f`.
pub fn cgroup_dirs_where(max_depth: usize, f: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for root in cgroup_roots() {
        let mut stack = vec![(root, 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            if depth >= max_depth {
                continue;
            }
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    continue;
                }
                let p = e.path();
                if f(&e.file_name().to_string_lossy()) {
                    out.push(p.clone());
                }
                stack.push((p, depth + 1));
            }
        }
    }
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------------
// Leak checking

/// What a pod had while it ran, to check after its removal that none of it is left: its ID and
/// uid, cgroup parent, container IDs, the state directory its shim was given (`--dir`), and the
/// processes seen (the shim, the infra process and every container process).
#[derive(Clone, Debug, Default)]
pub struct PodTraces {
    pub pod_id: String,
    pub pod_uid: String,
    pub cgroup_parent: String,
    /// The cgroup parent existed before the pod ran (made by the test, as by a kubelet): then it
    /// is not the daemon's to remove, only whatever it made inside. Otherwise the daemon made it
    /// and has to remove it too.
    pub cgroup_parent_preexisting: bool,
    pub container_ids: BTreeSet<String>,
    pub pod_dirs: BTreeSet<PathBuf>,
    pub processes: Vec<HostProcess>,
}

impl PodTraces {
    pub fn new(pod_id: &str, config: &cri::PodSandboxConfig) -> Self {
        PodTraces {
            pod_id: pod_id.to_string(),
            pod_uid: config
                .metadata
                .as_ref()
                .map(|m| m.uid.clone())
                .unwrap_or_default(),
            cgroup_parent: cgroup_parent(config).to_string(),
            cgroup_parent_preexisting: {
                let rel = cgroup_parent(config).trim_matches('/');
                !rel.is_empty() && cgroup_roots().iter().any(|r| r.join(rel).is_dir())
            },
            ..Default::default()
        }
    }

    /// Remember a container of this pod (one that may be gone by the time of [`Self::capture`]).
    pub fn add_container(&mut self, id: &str) {
        self.container_ids.insert(id.to_string());
    }

    /// Record, while the pod runs: its containers (ListContainers), its shim (a process whose
    /// command line holds the daemon's state dir and the pod ID; or, when this is the daemon's
    /// only pod, every such process), the shim's `--dir`, and the shim's whole process tree plus
    /// any process in a cgroup named after a container or the pod's cgroup parent.
    pub async fn capture(&mut self, d: &Daemon) {
        let filter = cri::ContainerFilter {
            pod_sandbox_id: self.pod_id.clone(),
            ..Default::default()
        };
        if let Ok(ids) = d.list_container_ids(Some(filter)).await {
            self.container_ids.extend(ids);
        }
        let only_pod = d
            .list_pod_ids(None)
            .await
            .is_ok_and(|ids| ids == [self.pod_id.clone()]);
        let procs = host_processes();
        let state = d.state_dir().to_string_lossy().into_owned();
        let mut roots: Vec<i32> = procs
            .iter()
            .filter(|p| {
                let c = p.command();
                !p.is_zombie() && c.contains(&state) && (only_pod || c.contains(&self.pod_id))
            })
            .map(|p| p.pid)
            .collect();
        for p in &procs {
            if roots.contains(&p.pid) {
                if let Some(i) = p.cmdline.iter().position(|a| a == "--dir") {
                    if let Some(dir) = p.cmdline.get(i + 1) {
                        self.pod_dirs.insert(PathBuf::from(dir));
                    }
                }
            }
        }
        let needles = self.cgroup_needles();
        for p in &procs {
            if p.is_zombie() || p.pid == std::process::id() as i32 {
                continue;
            }
            let cg = p.cgroups();
            if needles.iter().any(|n| cg.contains(n.as_str())) {
                roots.push(p.pid);
            }
        }
        for p in with_descendants(&procs, &roots) {
            if !p.is_zombie() && !self.processes.iter().any(|q| q.pid == p.pid) {
                self.processes.push(p);
            }
        }
    }

    /// Strings that name this pod or its containers: full IDs, their 12-character short forms,
    /// and the pod uid.
    pub fn needles(&self) -> Vec<String> {
        let mut n = Vec::new();
        for id in std::iter::once(&self.pod_id).chain(self.container_ids.iter()) {
            if id.is_empty() {
                continue;
            }
            n.push(id.clone());
            if id.len() > 12 {
                n.push(id[..12].to_string());
            }
        }
        if !self.pod_uid.is_empty() {
            n.push(self.pod_uid.clone());
        }
        n
    }

    fn cgroup_needles(&self) -> Vec<String> {
        let mut n = self.needles();
        if let Some(last) = self
            .cgroup_parent
            .trim_matches('/')
            .rsplit('/')
            .next()
            .filter(|s| !s.is_empty())
        {
            n.push(last.to_string());
        }
        n
    }
}

/// Everything of the pod still on the host, as readable descriptions (empty: no leak). See
/// [`assert_no_leaks`].
pub async fn find_leaks(d: &Daemon, t: &PodTraces) -> Vec<String> {
    let mut leaks = Vec::new();
    let needles = t.needles();
    let cg_needles = t.cgroup_needles();
    let hit = |s: &str| needles.iter().find(|n| s.contains(n.as_str())).cloned();
    let daemon_pid = d.pid().map(|p| p as i32);
    let me = std::process::id() as i32;
    let state = d.state_dir().to_string_lossy().into_owned();

    // The daemon's own records.
    let pods_left = match d.list_pod_ids(None).await {
        Ok(ids) => {
            if ids.contains(&t.pod_id) {
                leaks.push(format!("ListPodSandbox still lists pod {}", t.pod_id));
            }
            ids
        }
        Err(e) => {
            leaks.push(format!("ListPodSandbox failed: {e:?}"));
            vec![t.pod_id.clone()]
        }
    };
    let no_pods = pods_left.is_empty();
    match d.list_container_ids(None).await {
        Ok(ids) => {
            for id in ids.iter().filter(|id| t.container_ids.contains(*id)) {
                leaks.push(format!("ListContainers still lists container {id}"));
            }
        }
        Err(e) => leaks.push(format!("ListContainers failed: {e:?}")),
    }

    // Processes.
    for p in host_processes() {
        if p.pid == me || Some(p.pid) == daemon_pid {
            continue;
        }
        if p.is_zombie() {
            if Some(p.ppid) == daemon_pid {
                leaks.push(format!(
                    "zombie child {} of the daemon was never reaped",
                    p.pid
                ));
            }
            continue;
        }
        let cmd = p.command();
        if let Some(n) = hit(&cmd) {
            leaks.push(format!("process {} ({cmd}) names {n}", p.pid));
            continue;
        }
        if no_pods && cmd.contains(&state) {
            leaks.push(format!(
                "process {} ({cmd}) names the daemon's state dir and no pod is left",
                p.pid
            ));
            continue;
        }
        let env = p.environ();
        if let Some(v) = env
            .iter()
            .find(|v| hit(v).is_some() || (no_pods && v.contains(&state)))
        {
            leaks.push(format!(
                "process {} ({cmd}) has {v:?} in its environment",
                p.pid
            ));
            continue;
        }
        let cg = p.cgroups();
        if let Some(n) = cg_needles.iter().find(|n| cg.contains(n.as_str())) {
            leaks.push(format!(
                "process {} ({cmd}) is in a cgroup named {n}",
                p.pid
            ));
            continue;
        }
        if let Some(q) = t
            .processes
            .iter()
            .find(|q| q.pid == p.pid && q.starttime == p.starttime)
        {
            leaks.push(format!(
                "process {} ({}) of the pod is still alive (state {})",
                p.pid,
                q.command(),
                p.state
            ));
        }
    }

    // Mounts, in our mount namespace and the daemon's (if it has its own).
    let mut tables = vec![("host", mounts())];
    if let Some(pid) = daemon_pid.filter(|p| !same_mount_ns(*p)) {
        tables.push(("the daemon's namespace", mounts_of(Some(pid))));
    }
    for (ns, table) in &tables {
        for m in table {
            let mp = Path::new(&m.mount_point);
            let why = if let Some(n) = hit(&m.line) {
                Some(format!("names {n}"))
            } else if t.pod_dirs.iter().any(|dir| mp.starts_with(dir)) {
                Some("is in the pod's state dir".to_string())
            } else if daemons_own(d, mp) {
                None
            } else {
                [d.dir().to_path_buf(), d.state_dir(), d.root_dir()]
                    .into_iter()
                    .find(|dir| no_pods && mp.starts_with(dir))
                    .map(|dir| {
                        format!("is under the daemon's {} and no pod is left", dir.display())
                    })
            };
            if let Some(why) = why {
                leaks.push(format!(
                    "mount ({ns}) {} type {} {why}: {}",
                    m.mount_point, m.fstype, m.line
                ));
            }
        }
    }
    for netns in ["/run/netns", "/var/run/netns"] {
        for name in crate::fsutil::dir_entries(Path::new(netns)) {
            if let Some(n) = hit(&name) {
                leaks.push(format!("network namespace {netns}/{name} names {n}"));
            }
        }
    }

    // cgroups: named after the pod or a container anywhere; inside the cgroup parent; the
    // parent itself when the daemon made it.
    let parent_rel = t.cgroup_parent.trim_matches('/').to_string();
    let parent_name = parent_rel.rsplit('/').next().unwrap_or("").to_string();
    for dir in cgroup_dirs_where(6, |name| {
        needles.iter().any(|n| name.contains(n.as_str()))
            || (!t.cgroup_parent_preexisting && !parent_name.is_empty() && name == parent_name)
    }) {
        let why = if t.cgroup_parent_preexisting || !dir.ends_with(&parent_rel) {
            "is left"
        } else {
            "(the pod's cgroup parent, which did not exist before the pod) is left"
        };
        leaks.push(format!("cgroup {} {why}", dir.display()));
    }
    if !parent_rel.is_empty() {
        for root in cgroup_roots() {
            for name in crate::fsutil::dir_entries(&root.join(&parent_rel)) {
                let p = root.join(&parent_rel).join(&name);
                if p.is_dir() && !needles.iter().any(|n| name.contains(n.as_str())) {
                    leaks.push(format!(
                        "cgroup {} is left inside the pod's cgroup parent",
                        p.display()
                    ));
                }
            }
        }
    }

    // Files of the daemon.
    for root in [d.state_dir(), d.root_dir()] {
        for p in crate::fsutil::walk(&root) {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let full_ids = std::iter::once(&t.pod_id).chain(t.container_ids.iter());
            if let Some(id) = full_ids.into_iter().find(|id| name.contains(id.as_str())) {
                leaks.push(format!("{} is left (named after {id})", p.display()));
            }
        }
    }
    for dir in &t.pod_dirs {
        if dir.exists() {
            leaks.push(format!(
                "the pod's state dir {} still exists: {:?}",
                dir.display(),
                crate::fsutil::dir_entries(dir)
            ));
        }
    }
    leaks
}

/// Assert that nothing of the pod is left (polling up to 5 s, since a killed process needs a
/// moment to go): not in ListPodSandbox/ListContainers; no live process whose command line or
/// environment names the pod or a container (IDs, short IDs, pod uid), whose cgroup is named
/// after them or the cgroup parent, or that was seen in [`PodTraces::capture`]; no mount naming
/// them or inside the pod's state dir (in our and the daemon's mount namespace); no netns file
/// naming them; no cgroup directory (any hierarchy, depth 6) named after a container or the pod,
/// none left inside the cgroup parent, and the parent itself gone when the daemon made it (see
/// [`PodTraces::cgroup_parent_preexisting`]); no file in the daemon's state or root dir named after
/// the pod or a container; the pod's state dir gone; no zombie child of the daemon. When the daemon
/// has no pod left at all, also: no process naming the daemon's state dir, no mount under the
/// daemon's directories.
pub async fn assert_no_leaks(d: &Daemon, t: &PodTraces) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let leaks = find_leaks(d, t).await;
        if leaks.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "pod {} left {} thing(s) behind:\n  {}",
                t.pod_id,
                leaks.len(),
                leaks.join("\n  ")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The daemon's own mount, which it keeps with no pod left: the state directory's private mount
/// (`host_files::private_mount`).
fn daemons_own(d: &Daemon, mp: &Path) -> bool {
    mp == d.state_dir()
}

// ---------------------------------------------------------------------------------------------
// Forced cleanup

/// Force-cleans what a test's pods left on the host when it is dropped (a failed test must not
/// leave processes, mounts and cgroups on the machine): SIGKILLs every process whose command
/// line names the daemon's state dir, the infra processes recorded in its `infra.pid` files,
/// processes in the registered cgroup parents, and all their descendants (each by its pid, after
/// checking it is still the same process); lazily unmounts everything under the daemon's
/// directory and state dir; removes the registered cgroup parents. It prints what it had to do.
pub struct Janitor {
    daemon_dir: PathBuf,
    state_dir: PathBuf,
    daemon_pid: Option<i32>,
    cgroup_parents: Mutex<Vec<String>>,
}

impl Janitor {
    pub fn new(d: &Daemon) -> Self {
        Janitor {
            daemon_dir: d.dir().to_path_buf(),
            state_dir: d.state_dir(),
            daemon_pid: d.pid().map(|p| p as i32),
            cgroup_parents: Mutex::new(Vec::new()),
        }
    }

    /// A cgroup parent (`/name`) to remove at the end.
    pub fn add_cgroup_parent(&self, parent: &str) {
        self.cgroup_parents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(parent.to_string());
    }

    /// Clean now; returns what was done.
    pub fn clean(&self) -> Vec<String> {
        let mut did = Vec::new();
        let me = std::process::id() as i32;
        let parents: Vec<String> = self
            .cgroup_parents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let parent_names: Vec<String> = parents
            .iter()
            .filter_map(|p| p.trim_matches('/').rsplit('/').next().map(str::to_string))
            .filter(|s| !s.is_empty())
            .collect();
        let state = self.state_dir.to_string_lossy().into_owned();

        let procs = host_processes();
        let mut roots: Vec<i32> = Vec::new();
        for p in &procs {
            if p.pid == me || Some(p.pid) == self.daemon_pid || p.is_zombie() {
                continue;
            }
            let cg = p.cgroups();
            if p.command().contains(&state)
                || parent_names.iter().any(|n| cg.contains(&format!("/{n}")))
            {
                roots.push(p.pid);
            }
        }
        for f in crate::fsutil::walk(&self.state_dir) {
            if f.file_name().is_some_and(|n| n == "infra.pid") {
                let pid = crishim_proto::shim::pid_file::read(&f).map(|r| r.pid);
                if let Some(p) = pid.and_then(|pid| procs.iter().find(|p| p.pid == pid)) {
                    if p.cmdline.first().is_some_and(|a| a == "crishim-pause") {
                        roots.push(p.pid);
                    }
                }
            }
        }
        let victims: Vec<HostProcess> = with_descendants(&procs, &roots)
            .into_iter()
            .filter(|p| p.pid != me && Some(p.pid) != self.daemon_pid && !p.is_zombie())
            .collect();
        for p in &victims {
            if p.is_alive() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                did.push(format!("killed {} ({})", p.pid, p.command()));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while victims.iter().any(HostProcess::is_alive) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }

        for _ in 0..5 {
            let mut left: Vec<MountEntry> = mounts()
                .into_iter()
                .filter(|m| {
                    let mp = Path::new(&m.mount_point);
                    mp.starts_with(&self.daemon_dir) || mp.starts_with(&self.state_dir)
                })
                .collect();
            if left.is_empty() {
                break;
            }
            left.sort_by_key(|m| std::cmp::Reverse(m.mount_point.len()));
            for m in left {
                match nix::mount::umount2(m.mount_point.as_str(), nix::mount::MntFlags::MNT_DETACH)
                {
                    Ok(()) => did.push(format!("unmounted {} ({})", m.mount_point, m.fstype)),
                    Err(e) => did.push(format!("unmounting {}: {e}", m.mount_point)),
                }
            }
        }

        for parent in &parents {
            let rel = parent.trim_matches('/');
            if rel.is_empty() || rel.contains("..") {
                continue;
            }
            for root in cgroup_roots() {
                let top = root.join(rel);
                if !top.is_dir() {
                    continue;
                }
                let mut dirs: Vec<PathBuf> = crate::fsutil::walk(&top)
                    .into_iter()
                    .filter(|p| p.is_dir())
                    .collect();
                dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
                dirs.push(top.clone());
                for dir in dirs {
                    let mut ok = false;
                    for _ in 0..20 {
                        if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                            ok = true;
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    // The parent itself is the test's (made by `pod_config`, as by a kubelet):
                    // removing it is routine, not worth a word.
                    if !ok {
                        did.push(format!("could not remove cgroup {}", dir.display()));
                    } else if dir != top {
                        did.push(format!("removed cgroup {}", dir.display()));
                    }
                }
            }
        }
        did
    }
}

impl Drop for Janitor {
    fn drop(&mut self) {
        if std::thread::panicking() && std::env::var_os("CRISHIM_TEST_QUIET").is_none() {
            for f in crate::fsutil::walk(&self.state_dir) {
                if f.file_name().is_some_and(|n| n == "shim.log") {
                    let text = std::fs::read_to_string(&f).unwrap_or_default();
                    eprintln!(
                        "---- {} ----\n{}",
                        f.display(),
                        crate::registry::tail(&text, 4000)
                    );
                }
            }
        }
        let did = self.clean();
        if !did.is_empty() {
            eprintln!(
                "---- janitor for {} ----\n  {}",
                self.daemon_dir.display(),
                did.join("\n  ")
            );
        }
    }
}
