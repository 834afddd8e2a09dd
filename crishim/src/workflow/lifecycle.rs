//! The run itself, through CRI calls like a kubelet's: pull, run the pod, init containers one after
//! another, then the main containers and sidecars; when the main work is done, stop the sidecars
//! (SIGTERM, the grace period, SIGKILL), collect exits and outputs, and tear the pod down.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crishim_proto::cri;
use crishim_proto::cri::image_service_client::ImageServiceClient;
use crishim_proto::cri::runtime_service_client::RuntimeServiceClient;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::error::WorkflowError;
use super::manifest::{Plan, RestartPolicy, Role, Step, VolumeSource};
use super::result::{self, ContainerResult, OutputResult, Phase, RunResult};
use super::subpath;
use super::translate;

/// How often container states are polled while waiting for exits.
const POLL: Duration = Duration::from_millis(50);
/// The first OnFailure restart waits this long; each next one twice as long, up to [`MAX_BACKOFF`].
const BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The CRI services a run talks to: a daemon's, or an in-process server's.
#[derive(Clone)]
pub struct Cri {
    pub rt: RuntimeServiceClient<Channel>,
    pub img: ImageServiceClient<Channel>,
}

pub struct Options {
    /// Bytes of each container's stdout kept in the result.
    pub log_tail: usize,
    /// Largest output file collected.
    pub max_output: u64,
}

/// Ctrl-C and SIGTERM, counted: the first stops the run cleanly, the second kills it.
pub struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Interrupts {
    pub fn new() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Interrupts {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    pub async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// How the main part of a run ended.
enum Ending {
    /// Every main container exited.
    Completed,
    /// This init container failed (for good).
    InitFailed(usize),
    /// Cut short: deadline, interrupt, or an error from the runtime.
    Failed {
        reason: &'static str,
        message: String,
    },
}

/// One container of the plan and what became of it.
struct Slot {
    step: Step,
    id: Option<String>,
    result: ContainerResult,
}

pub struct Runner {
    cri: Cri,
    plan: Plan,
    run_dir: PathBuf,
    opts: Options,
    /// The running pod: its id and the config it was created with (sent again with each
    /// container, as the kubelet does).
    pod: Option<(String, cri::PodSandboxConfig)>,
    slots: Vec<Slot>,
}

fn cri_error(call: &str, what: &str, s: tonic::Status) -> Ending {
    Ending::Failed {
        reason: "Error",
        message: format!("{call} {what}: {}", s.message()),
    }
}

impl Runner {
    pub fn new(cri: Cri, plan: Plan, run_dir: PathBuf, opts: Options) -> Self {
        let slots = plan
            .steps()
            .map(|s| Slot {
                step: s.clone(),
                id: None,
                result: ContainerResult {
                    name: s.container.name.clone(),
                    role: s.role,
                    exit_code: None,
                    reason: "NotStarted".into(),
                    started_at: None,
                    finished_at: None,
                    restart_count: 0,
                    stdout: String::new(),
                    stdout_truncated: false,
                },
            })
            .collect();
        Runner {
            cri,
            plan,
            run_dir,
            opts,
            pod: None,
            slots,
        }
    }

    /// Where the containers' CRI logs go: `<name>/<attempt>.log` under it.
    pub fn log_dir(&self) -> PathBuf {
        self.run_dir.join("logs")
    }

    /// Run to the end, whatever happens; the pod and the run's directory are gone afterwards.
    pub async fn run(
        mut self,
        interrupts: &mut Interrupts,
        follower: Option<super::attach::Follower>,
    ) -> RunResult {
        let started = crishim_state::records::now_nanos();
        let deadline = self.plan.deadline.map(|d| Instant::now() + d);
        let ending = tokio::select! {
            e = self.start_and_wait() => e,
            _ = sleep_until(deadline) => Ending::Failed {
                reason: "DeadlineExceeded",
                message: format!(
                    "the run took longer than activeDeadlineSeconds ({}s)",
                    self.plan.deadline.unwrap_or_default().as_secs()
                ),
            },
            _ = interrupts.next() => Ending::Failed {
                reason: "Interrupted",
                message: "interrupted; stopping the containers".into(),
            },
        };
        let grace = self.plan.grace;
        let killed = tokio::select! {
            _ = self.stop_all(grace) => false,
            _ = interrupts.next() => true,
        };
        if killed {
            eprintln!("crishim run: interrupted again; killing the containers");
            self.stop_all(Duration::ZERO).await;
        }
        self.refresh_all().await;
        let outputs = self.collect_outputs().await;
        self.collect_logs();
        if let Some(f) = follower {
            f.finish().await;
        }
        self.teardown().await;
        self.result(ending, started, outputs)
    }

    async fn start_and_wait(&mut self) -> Ending {
        if let Err(e) = self.prepare_volumes() {
            return Ending::Failed {
                reason: "Error",
                message: e.to_string(),
            };
        }
        if let Err(e) = self.pull_images().await {
            return e;
        }
        let config = translate::pod_config(&self.plan, &self.log_dir());
        match self
            .cri
            .rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await
        {
            Ok(r) => self.pod = Some((r.into_inner().pod_sandbox_id, config)),
            Err(s) => return cri_error("RunPodSandbox", &self.plan.name, s),
        }
        match self.phases().await {
            Ok(e) | Err(e) => e,
        }
    }

    async fn phases(&mut self) -> Result<Ending, Ending> {
        let n_init = self.plan.init.len();
        for i in 0..n_init {
            if self.slots[i].step.role == Role::NativeSidecar {
                self.start(i).await?;
                continue;
            }
            loop {
                self.start(i).await?;
                let code = self.wait_exit(i).await?;
                if code == 0 {
                    break;
                }
                if self.plan.restart == RestartPolicy::Never {
                    return Ok(Ending::InitFailed(i));
                }
                self.backoff(i).await;
            }
        }
        for i in n_init..self.slots.len() {
            self.start(i).await?;
        }
        loop {
            tokio::time::sleep(POLL).await;
            let mut working = false;
            for i in 0..self.slots.len() {
                let role = self.slots[i].step.role;
                if role == Role::Init {
                    continue;
                }
                let Some(code) = self.exit_code(i).await? else {
                    working |= role == Role::Main;
                    continue;
                };
                let restart = match role {
                    Role::NativeSidecar => true,
                    _ => code != 0 && self.plan.restart == RestartPolicy::OnFailure,
                };
                // A sidecar is not restarted once the main work is over.
                if restart && (role == Role::Main || self.mains_running().await?) {
                    working |= role == Role::Main;
                    self.backoff(i).await;
                    self.start(i).await?;
                }
            }
            if !working {
                return Ok(Ending::Completed);
            }
        }
    }

    async fn mains_running(&mut self) -> Result<bool, Ending> {
        for i in 0..self.slots.len() {
            if self.slots[i].step.role == Role::Main && self.exit_code(i).await?.is_none() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Remove the failed attempt and wait out the back-off before the next.
    async fn backoff(&mut self, i: usize) {
        let binds = self.binds_dir(i);
        let slot = &mut self.slots[i];
        if let Some(id) = slot.id.take() {
            let _ = self
                .cri
                .rt
                .remove_container(cri::RemoveContainerRequest { container_id: id })
                .await;
        }
        release_binds(&binds);
        slot.result.restart_count += 1;
        let wait = BACKOFF
            .saturating_mul(1 << (slot.result.restart_count - 1).min(5))
            .min(MAX_BACKOFF);
        eprintln!(
            "crishim run: container {} failed; restarting it in {wait:?} (restart {})",
            slot.result.name, slot.result.restart_count
        );
        tokio::time::sleep(wait).await;
    }

    async fn start(&mut self, i: usize) -> Result<(), Ending> {
        let (pod_id, pod_config) = self.pod.clone().unwrap_or_default();
        let slot = &self.slots[i];
        let name = slot.result.name.clone();
        let binds = self.binds_dir(i);
        let config = self
            .mount_sources(i)
            .and_then(|sources| {
                translate::container_config(
                    &self.plan,
                    &slot.step.container,
                    slot.result.restart_count,
                    &sources,
                )
            })
            .map_err(|e| Ending::Failed {
                reason: "Error",
                message: e.to_string(),
            });
        let created = match config {
            Ok(config) => self
                .cri
                .rt
                .create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: pod_id,
                    config: Some(config),
                    sandbox_config: Some(pod_config),
                })
                .await
                .map_err(|s| cri_error("CreateContainer", &name, s)),
            Err(e) => Err(e),
        };
        let id = match created {
            Ok(r) => r.into_inner().container_id,
            Err(e) => {
                release_binds(&binds);
                return Err(e);
            }
        };
        self.slots[i].id = Some(id.clone());
        self.cri
            .rt
            .start_container(cri::StartContainerRequest { container_id: id })
            .await
            .map_err(|s| cri_error("StartContainer", &name, s))?;
        Ok(())
    }

    /// Where slot `i`'s current attempt has its subPath binds (by index: names are not paths).
    fn binds_dir(&self, i: usize) -> PathBuf {
        subpath::attempt_dir(
            &self.run_dir,
            &i.to_string(),
            self.slots[i].result.restart_count,
        )
    }

    /// The host path of each of slot `i`'s volume mounts: the volume's directory, or a bind of
    /// its subPath resolved inside it. On an error, the binds made so far are undone.
    fn mount_sources(&self, i: usize) -> Result<Vec<PathBuf>, WorkflowError> {
        let dir = self.binds_dir(i);
        let c = &self.slots[i].step.container;
        let sources = c
            .volume_mounts
            .iter()
            .flatten()
            .enumerate()
            .map(|(k, m)| {
                let v = self
                    .plan
                    .volumes
                    .iter()
                    .find(|v| v.name == m.name)
                    .expect("mounts were checked against the volumes");
                let host = translate::host_dir(v, &self.run_dir);
                match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                    Some(sub) => subpath::bind(&host, sub, &dir, k),
                    None => Ok(host),
                }
            })
            .collect::<Result<Vec<_>, _>>();
        if sources.is_err() {
            release_binds(&dir);
        }
        sources
    }

    async fn status(&mut self, i: usize) -> Result<Option<cri::ContainerStatus>, Ending> {
        let Some(id) = self.slots[i].id.clone() else {
            return Ok(None);
        };
        let r = self
            .cri
            .rt
            .container_status(cri::ContainerStatusRequest {
                container_id: id,
                verbose: false,
            })
            .await
            .map_err(|s| cri_error("ContainerStatus", &self.slots[i].result.name, s))?;
        Ok(r.into_inner().status)
    }

    /// The exit code once the container has exited.
    async fn exit_code(&mut self, i: usize) -> Result<Option<i32>, Ending> {
        Ok(self
            .status(i)
            .await?
            .filter(|s| s.state == cri::ContainerState::ContainerExited as i32)
            .map(|s| s.exit_code))
    }

    async fn wait_exit(&mut self, i: usize) -> Result<i32, Ending> {
        loop {
            if let Some(code) = self.exit_code(i).await? {
                return Ok(code);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// emptyDirs are directories of the run (tmpfs for `medium: Memory`); hostPaths are checked or
    /// created as their type says.
    fn prepare_volumes(&self) -> Result<(), WorkflowError> {
        for v in &self.plan.volumes {
            let dir = translate::host_dir(v, &self.run_dir);
            let setup = |msg: String| WorkflowError::Setup(format!("volume {:?}: {msg}", v.name));
            match &v.source {
                VolumeSource::EmptyDir { memory } => {
                    std::fs::create_dir_all(&dir)
                        .map_err(|e| setup(format!("creating {}: {e}", dir.display())))?;
                    if *memory {
                        nix::mount::mount(
                            Some("tmpfs"),
                            &dir,
                            Some("tmpfs"),
                            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                            None::<&str>,
                        )
                        .map_err(|e| setup(format!("mounting tmpfs on {}: {e}", dir.display())))?;
                    }
                }
                VolumeSource::HostPath { path, kind } => match kind.as_str() {
                    "DirectoryOrCreate" => std::fs::create_dir_all(path)
                        .map_err(|e| setup(format!("creating {}: {e}", path.display())))?,
                    "FileOrCreate" => {
                        if let Some(parent) = path.parent() {
                            let _ = std::fs::create_dir_all(parent);
                        }
                        std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(path)
                            .map_err(|e| setup(format!("creating {}: {e}", path.display())))?;
                    }
                    "Directory" if !path.is_dir() => {
                        return Err(setup(format!("{} is not a directory", path.display())))
                    }
                    "File" if !path.is_file() => {
                        return Err(setup(format!("{} is not a file", path.display())))
                    }
                    _ => {}
                },
            }
        }
        Ok(())
    }

    /// Pull each image the run needs that is missing (every time for `imagePullPolicy: Always`).
    async fn pull_images(&mut self) -> Result<(), Ending> {
        let mut wanted: Vec<(String, bool)> = Vec::new();
        for s in &self.slots {
            let c = &s.step.container;
            let image = c.image.clone().unwrap_or_default();
            let always = c.image_pull_policy.as_deref() == Some("Always");
            match wanted.iter_mut().find(|(i, _)| *i == image) {
                Some(w) => w.1 |= always,
                None => wanted.push((image, always)),
            }
        }
        let pulls = wanted.into_iter().map(|(image, always)| {
            let mut img = self.cri.img.clone();
            async move {
                let spec = cri::ImageSpec {
                    image: image.clone(),
                    ..Default::default()
                };
                if !always {
                    let present = img
                        .image_status(cri::ImageStatusRequest {
                            image: Some(spec.clone()),
                            verbose: false,
                        })
                        .await
                        .map_err(|s| cri_error("ImageStatus", &image, s))?
                        .into_inner()
                        .image
                        .is_some();
                    if present {
                        return Ok(());
                    }
                }
                img.pull_image(cri::PullImageRequest {
                    image: Some(spec),
                    auth: None,
                    sandbox_config: None,
                })
                .await
                .map(|_| ())
                .map_err(|s| Ending::Failed {
                    reason: "ErrImagePull",
                    message: format!("pulling {image}: {}", s.message()),
                })
            }
        });
        futures::future::try_join_all(pulls).await.map(|_| ())
    }

    /// Stop what runs: the containers together, then the native sidecars in reverse order, each
    /// with SIGTERM, `grace`, then SIGKILL.
    async fn stop_all(&mut self, grace: Duration) {
        let stop = |ids: Vec<String>| {
            let rt = self.cri.rt.clone();
            futures::future::join_all(ids.into_iter().map(move |id| {
                let mut rt = rt.clone();
                async move {
                    let _ = rt
                        .stop_container(cri::StopContainerRequest {
                            container_id: id,
                            timeout: grace.as_secs() as i64,
                        })
                        .await;
                }
            }))
        };
        let ids = |native: bool| -> Vec<String> {
            self.slots
                .iter()
                .filter(|s| (s.step.role == Role::NativeSidecar) == native)
                .filter_map(|s| s.id.clone())
                .collect()
        };
        stop(ids(false)).await;
        for id in ids(true).into_iter().rev() {
            stop(vec![id]).await;
        }
    }

    async fn refresh_all(&mut self) {
        for i in 0..self.slots.len() {
            let Ok(Some(s)) = self.status(i).await else {
                continue;
            };
            let r = &mut self.slots[i].result;
            r.started_at = result::timestamp(s.started_at);
            r.finished_at = result::timestamp(s.finished_at);
            if s.state == cri::ContainerState::ContainerExited as i32 {
                r.exit_code = Some(s.exit_code);
                r.reason = s.reason;
            } else {
                r.reason = "Running".into();
            }
        }
    }

    /// Read each declared output: from the volume mounted at its path, else from the container's
    /// root filesystem (resolved inside it: the image's symlinks cannot point out).
    async fn collect_outputs(&mut self) -> BTreeMap<String, OutputResult> {
        let mut out = BTreeMap::new();
        for o in self.plan.outputs.clone() {
            let read = self.read_output(&o.container, &o.path).await;
            out.insert(o.name, OutputResult::new(&o.container, &o.path, read));
        }
        out
    }

    async fn read_output(&mut self, container: &str, path: &str) -> Result<Vec<u8>, String> {
        let i = self
            .slots
            .iter()
            .position(|s| s.result.name == container)
            .ok_or("no such container")?;
        let c = &self.slots[i].step.container;
        let mount = c
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| {
                let mp = m.mount_path.trim_end_matches('/');
                path == mp || path.starts_with(&format!("{mp}/"))
            })
            .max_by_key(|m| m.mount_path.len());
        let (root, sub, rel) = match mount {
            Some(m) => {
                let v = self
                    .plan
                    .volumes
                    .iter()
                    .find(|v| v.name == m.name)
                    .ok_or("no such volume")?;
                let root = translate::host_dir(v, &self.run_dir);
                let sub = m.sub_path.as_deref().unwrap_or_default();
                let rel = path[m.mount_path.trim_end_matches('/').len()..].to_string();
                (root, sub, rel)
            }
            None => (self.rootfs(i).await?, "", path.to_string()),
        };
        // The subPath too is resolved inside the volume: it may be a symlink a container made.
        let dir =
            subpath::open_dir(&root, sub).map_err(|e| format!("{}/{sub}: {e}", root.display()))?;
        // The container wrote it: read through the bounded reader (a regular file of at most
        // `max_output` bytes, resolved inside the volume or rootfs).
        crishim_sys::confined::read_at(
            &dir,
            rel.trim_start_matches('/'),
            crishim_sys::confined::Limits::in_root(self.opts.max_output),
        )
        .map_err(|e| format!("{path}: {e}"))
    }

    /// The container's root filesystem as the runtime mounted it (until it is removed).
    async fn rootfs(&mut self, i: usize) -> Result<PathBuf, String> {
        let id = self.slots[i].id.clone().ok_or("the container never ran")?;
        let r = self
            .cri
            .rt
            .container_status(cri::ContainerStatusRequest {
                container_id: id,
                verbose: true,
            })
            .await
            .map_err(|s| s.message().to_string())?
            .into_inner();
        let info: serde_json::Value = r
            .info
            .get("info")
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        let bundle = info
            .get("bundle")
            .and_then(|b| b.as_str())
            .ok_or("the runtime did not report the container's bundle")?;
        Ok(Path::new(bundle).join("rootfs"))
    }

    fn collect_logs(&mut self) {
        let log_dir = self.log_dir();
        for s in &mut self.slots {
            if s.id.is_some() {
                let p = log_dir.join(translate::log_path(&s.result.name, s.result.restart_count));
                (s.result.stdout, s.result.stdout_truncated) =
                    result::stdout_tail(&p, self.opts.log_tail);
            }
        }
    }

    /// Stop and remove the pod, unmount and remove the run's directory.
    async fn teardown(&mut self) {
        if let Some((pod, _)) = self.pod.take() {
            let rt = &mut self.cri.rt;
            if let Err(s) = rt
                .stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: pod.clone(),
                })
                .await
            {
                eprintln!("crishim run: StopPodSandbox {pod}: {}", s.message());
            }
            if let Err(s) = rt
                .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                    pod_sandbox_id: pod.clone(),
                })
                .await
            {
                eprintln!("crishim run: RemovePodSandbox {pod}: {}", s.message());
            }
        }
        if let Err(e) = subpath::release_all(&self.run_dir) {
            eprintln!("crishim run: {e}");
        }
        for v in &self.plan.volumes {
            if v.source == (VolumeSource::EmptyDir { memory: true }) {
                let dir = translate::host_dir(v, &self.run_dir);
                let _ = nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        // Removing a directory with a mount below it would delete the mounted files: a subPath
        // bind can show a hostPath's files.
        let mounted = crishim_images::mounts_under(&self.run_dir);
        if !mounted.is_empty() {
            eprintln!(
                "crishim run: {} is kept: still mounted below it: {mounted:?}",
                self.run_dir.display()
            );
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.run_dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("crishim run: removing {}: {e}", self.run_dir.display());
            }
        }
    }

    fn result(
        &self,
        ending: Ending,
        started: i64,
        outputs: BTreeMap<String, OutputResult>,
    ) -> RunResult {
        let containers: Vec<ContainerResult> =
            self.slots.iter().map(|s| s.result.clone()).collect();
        let failed_code = |role: Role| {
            containers
                .iter()
                .filter(|c| c.role == role)
                .find_map(|c| c.exit_code.filter(|code| *code != 0))
        };
        let (phase, reason, message) = match ending {
            Ending::Completed if failed_code(Role::Main).is_none() => {
                (Phase::Succeeded, None, None)
            }
            Ending::Completed => (Phase::Failed, Some("Error".to_string()), None),
            Ending::InitFailed(i) => (
                Phase::Failed,
                Some("InitError".to_string()),
                Some(format!(
                    "init container {} failed with exit code {}",
                    containers[i].name,
                    containers[i].exit_code.unwrap_or(-1)
                )),
            ),
            Ending::Failed { reason, message } => {
                (Phase::Failed, Some(reason.to_string()), Some(message))
            }
        };
        let exit_code = match phase {
            Phase::Succeeded => 0,
            Phase::Failed => failed_code(Role::Main)
                .or_else(|| failed_code(Role::Init))
                .unwrap_or(1),
        };
        RunResult {
            phase,
            reason,
            message,
            exit_code,
            started_at: result::timestamp(started).unwrap_or_default(),
            finished_at: result::timestamp(crishim_state::records::now_nanos()).unwrap_or_default(),
            containers,
            outputs,
        }
    }
}

/// Undo an attempt's subPath binds; a failure is reported, and the run's directory then kept.
fn release_binds(dir: &Path) {
    if let Err(e) = subpath::release(dir) {
        eprintln!("crishim run: {e}");
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
