//! Fakes for the handlers' unit tests, as containerd's CRI server tests use: a shim that keeps
//! container states in memory, a host whose "mounts" are plain directories, a CNI network that
//! hands out fixed addresses and "pins" namespaces as symlinks. Nothing here starts a process
//! or mounts anything. The pod fakes log their steps to one shared [`Calls`], so a test sees
//! their order across them, and each can be told to fail at a step.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::errors::Error;
use crishim_images::{Digest, ImageError, ImageRecord};
use crishim_proto::shim::{
    ContainerState, ErrorKind, InfraSpec, OciRuntimeSpec, Request, Response, Status as ShimStatus,
};
use crishim_state::records::{now_nanos, PodRecord, PodState};
use oci_spec::image::ImageConfiguration;
use tokio::net::UnixStream;

use super::pod_host::{PodFiles, PodNetwork, PodShims};
use super::{Parts, RuntimeService};
use crate::config::Config;
use crate::container_images::ContainerImages;
use crate::shim_client::{ShimError, Shims, Watch};
use crishim_cni::{CniError, NetworkResult};
use crishim_proto::cri::{self, runtime_service_server::RuntimeService as _};
use crishim_state::store::Store;
use tonic::{Request as GrpcRequest, Status};

/// A ready host-network pod's record with default config, for handler tests.
pub fn pod_record(id: &str) -> PodRecord {
    PodRecord {
        id: id.to_string(),
        config: crishim_proto::cri::PodSandboxConfig::default(),
        runtime_handler: String::new(),
        state: PodState::Ready,
        created_at: 0,
        infra_pid: 1,
        host_network: true,
        host_pid: false,
        host_ipc: true,
        shared_pid: false,
        shm: None,
        cgroup_parent: format!("/crishim/{id}"),
        cgroup_driver: Default::default(),
        owned_cgroups: Vec::new(),
        ips: Vec::new(),
    }
}

/// One pod's fake shim.
#[derive(Default)]
struct FakePod {
    containers: HashMap<String, ContainerState>,
    /// Open `Watch` streams, each told every exit.
    watchers: Vec<tokio::sync::mpsc::UnboundedSender<Response>>,
}

/// The steps the pod fakes took, in order, shared between them (`shim start <pod>`,
/// `cni ADD <pod>`, `mount shm`, …).
#[derive(Clone, Default)]
pub struct Calls(Arc<Mutex<Vec<String>>>);

impl Calls {
    fn push(&self, call: String) {
        self.0.lock().unwrap().push(call);
    }

    /// Every step so far.
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// How many steps so far were `call`.
    pub fn count(&self, call: &str) -> usize {
        self.0.lock().unwrap().iter().filter(|c| *c == call).count()
    }

    /// Where step `call` first came, if it did.
    pub fn position(&self, call: &str) -> Option<usize> {
        self.0.lock().unwrap().iter().position(|c| c == call)
    }

    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

#[derive(Default)]
struct FakeState {
    pods: HashMap<String, FakePod>,
    /// The state directory of each pod whose shim [`PodShims::start`] started: at `Shutdown`
    /// the shim kills its containers and leaves their exits there, as the real one does.
    dirs: HashMap<String, PathBuf>,
    /// The infra process each started shim was asked for.
    infra: HashMap<String, InfraSpec>,
    /// The error of the next [`PodShims::start`] instead of success.
    fail_start: Option<String>,
    /// Pods whose shim is gone: every request fails as unreachable.
    dead: HashSet<String>,
    /// Signals the fake containers ignore (a process that traps SIGTERM).
    ignored: HashSet<i32>,
    /// Every request, in order, with the pod it went to.
    requests: Vec<(String, Request)>,
    /// The answer to the next `Create` instead of success.
    refuse_create: Option<Response>,
    /// The answer to the next `Exec` instead of its command line echoed.
    exec_answer: Option<Response>,
}

/// Shims whose containers live in memory: `Create` makes a created container, `Start` runs it,
/// a signal not in the ignored set ends it with 128 + signal, and each exit goes to the pod's
/// watchers. `Exec` in a running container answers its command line on stdout with exit code 0
/// (or what [`answer_next_exec`](Self::answer_next_exec) set); `Exec` in any other, and
/// `Update` of an exited one, are refused as the real shim refuses them.
#[derive(Clone, Default)]
pub struct FakeShims {
    state: Arc<Mutex<FakeState>>,
    calls: Calls,
}

impl FakeShims {
    /// The log of pod steps these shims write to.
    pub fn calls(&self) -> Calls {
        self.calls.clone()
    }

    /// The next pod shim start fails with `why`.
    pub fn fail_next_start(&self, why: &str) {
        self.state.lock().unwrap().fail_start = Some(why.to_string());
    }

    /// Whether the pod's shim runs (started and neither shut down nor killed).
    pub fn running(&self, pod_id: &str) -> bool {
        let s = self.state.lock().unwrap();
        s.pods.contains_key(pod_id) && !s.dead.contains(pod_id)
    }

    /// The infra process the pod's shim was started with.
    pub fn infra(&self, pod_id: &str) -> Option<InfraSpec> {
        self.state.lock().unwrap().infra.get(pod_id).cloned()
    }

    /// A pod whose shim runs (with no containers yet).
    pub fn add_pod(&self, pod_id: &str) {
        self.state
            .lock()
            .unwrap()
            .pods
            .entry(pod_id.to_string())
            .or_default();
    }

    /// The pod's shim dies: its connections drop and nothing answers any more.
    pub fn kill_shim(&self, pod_id: &str) {
        let mut s = self.state.lock().unwrap();
        s.dead.insert(pod_id.to_string());
        if let Some(p) = s.pods.get_mut(pod_id) {
            p.watchers.clear();
        }
    }

    pub fn ignore_signal(&self, signal: i32) {
        self.state.lock().unwrap().ignored.insert(signal);
    }

    pub fn refuse_next_create(&self, answer: Response) {
        self.state.lock().unwrap().refuse_create = Some(answer);
    }

    /// The next `Exec` is answered with `answer` (an exit code, output, a timeout).
    pub fn answer_next_exec(&self, answer: Response) {
        self.state.lock().unwrap().exec_answer = Some(answer);
    }

    /// The requests sent so far, whole, each with the pod it went to.
    pub fn sent(&self) -> Vec<(String, Request)> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The requests sent so far, as short names (`Create`, `Kill 15`, …).
    pub fn requests(&self) -> Vec<String> {
        let s = self.state.lock().unwrap();
        s.requests
            .iter()
            .map(|(_, r)| match r {
                Request::Kill { signal, all, .. } => {
                    format!("Kill {signal}{}", if *all { " all" } else { "" })
                }
                other => format!("{other:?}")
                    .split([' ', '{', '('])
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            })
            .collect()
    }

    fn answer(&self, pod_id: &str, req: &Request) -> Result<Response, ShimError> {
        let mut s = self.state.lock().unwrap();
        s.requests.push((pod_id.to_string(), req.clone()));
        if matches!(req, Request::Shutdown) {
            self.calls.push(format!("shim Shutdown {pod_id}"));
        }
        if s.dead.contains(pod_id) || !s.pods.contains_key(pod_id) {
            return Err(ShimError::Unreachable(
                PathBuf::from(pod_id),
                std::io::ErrorKind::ConnectionRefused.into(),
            ));
        }
        // Only a create uses up a refusal set for the next create.
        let refuse_create = matches!(req, Request::Create { .. })
            .then(|| s.refuse_create.take())
            .flatten();
        let exec_answer = matches!(req, Request::Exec { .. })
            .then(|| s.exec_answer.take())
            .flatten();
        let ignored = s.ignored.clone();
        let pod = s.pods.get_mut(pod_id).expect("checked above");
        let not_found = |id: &str| Response::error(ErrorKind::NotFound, format!("{id} not found"));
        let refused = |why: String| Response::error(ErrorKind::FailedPrecondition, why);
        Ok(match req {
            Request::Ping => Response::Pong {
                infra_pid: 1,
                shim_pid: 1,
            },
            Request::Create { id, .. } => match refuse_create {
                Some(answer) => answer,
                None => {
                    let state =
                        ContainerState::new(id.clone(), ShimStatus::Created, 0, now_nanos());
                    pod.containers.insert(id.clone(), state.clone());
                    Response::State(state)
                }
            },
            Request::Start { id } => match pod.containers.get_mut(id) {
                Some(c) => {
                    c.status = ShimStatus::Running;
                    c.pid = 4242;
                    c.started_at = now_nanos();
                    Response::State(c.clone())
                }
                None => not_found(id),
            },
            Request::Kill { id, signal, .. } => {
                let Some(c) = pod.containers.get_mut(id) else {
                    return Ok(not_found(id));
                };
                if c.status != ShimStatus::Exited && !ignored.contains(signal) {
                    c.status = ShimStatus::Exited;
                    c.exit_code = 128 + signal;
                    c.finished_at = now_nanos();
                    let exit = Response::State(c.clone());
                    pod.watchers.retain(|w| w.send(exit.clone()).is_ok());
                }
                Response::Ok
            }
            Request::State { id } => match pod.containers.get(id) {
                Some(c) => Response::State(c.clone()),
                None => not_found(id),
            },
            Request::Delete { id } => {
                pod.containers.remove(id);
                Response::Ok
            }
            Request::Exec { id, args, .. } => match pod.containers.get(id) {
                None => not_found(id),
                Some(c) if c.status != ShimStatus::Running => {
                    refused(format!("container {id} is not running"))
                }
                Some(_) => exec_answer.unwrap_or_else(|| Response::Exec {
                    exit_code: 0,
                    stdout: format!("{}\n", args.join(" ")).into_bytes(),
                    stderr: Vec::new(),
                    timed_out: false,
                }),
            },
            Request::Update { id, .. } => match pod.containers.get(id) {
                None => not_found(id),
                Some(c) if c.status == ShimStatus::Exited => {
                    refused(format!("container {id} has exited"))
                }
                Some(_) => Response::Ok,
            },
            Request::ReopenLog { id } => match pod.containers.get(id) {
                None => not_found(id),
                Some(_) => Response::Ok,
            },
            Request::Shutdown => {
                // The shim kills its containers, leaves their exits in its directory, and ends
                // (its watchers' streams with it).
                if let Some(dir) = s.dirs.get(pod_id).cloned() {
                    let pod = s.pods.get_mut(pod_id).expect("checked above");
                    for c in pod.containers.values_mut() {
                        if c.status != ShimStatus::Exited {
                            c.status = ShimStatus::Exited;
                            c.exit_code = 137;
                            c.finished_at = now_nanos();
                        }
                        let file = dir.join(crishim_proto::shim::paths::state_file(&c.id));
                        std::fs::write(file, serde_json::to_vec(c).unwrap()).unwrap();
                    }
                }
                s.pods.remove(pod_id);
                Response::Ok
            }
            _ => Response::Ok,
        })
    }
}

#[tonic::async_trait]
impl Shims for FakeShims {
    async fn call(
        &self,
        pod_id: &str,
        req: &Request,
        _timeout: Duration,
    ) -> Result<Response, ShimError> {
        self.answer(pod_id, req)
    }

    async fn watch(&self, pod_id: &str) -> Result<Watch, ShimError> {
        self.answer(pod_id, &Request::Watch)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut s = self.state.lock().unwrap();
        let pod = s.pods.get_mut(pod_id).expect("answered above");
        // As the real shim: the exits it had, then `Ok`.
        for c in pod.containers.values() {
            if c.status == ShimStatus::Exited {
                let _ = tx.send(Response::State(c.clone()));
            }
        }
        let _ = tx.send(Response::Ok);
        pod.watchers.push(tx);
        Ok(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        ))
    }

    async fn open_stream(
        &self,
        pod_id: &str,
        req: &Request,
    ) -> Result<Result<UnixStream, Response>, ShimError> {
        Ok(Err(self.answer(pod_id, req)?))
    }
}

#[tonic::async_trait]
impl PodShims for FakeShims {
    async fn start(
        &self,
        pod_id: &str,
        dir: &Path,
        infra: &InfraSpec,
        _oci: Option<&OciRuntimeSpec>,
    ) -> Result<i32, Error> {
        self.calls.push(format!("shim start {pod_id}"));
        let mut s = self.state.lock().unwrap();
        if let Some(why) = s.fail_start.take() {
            return Err(Error::internal(format!(
                "starting the pod's shim failed: {why}"
            )));
        }
        s.pods.entry(pod_id.to_string()).or_default();
        s.dead.remove(pod_id);
        s.dirs.insert(pod_id.to_string(), dir.to_path_buf());
        s.infra.insert(pod_id.to_string(), infra.clone());
        Ok(infra_pid())
    }

    async fn cleanup_dead(&self, dir: &Path) {
        self.calls.push(format!("shim cleanup {}", dir.display()));
    }

    async fn kill_orphan(&self, pid: i32) {
        self.calls.push(format!("kill orphan {pid}"));
    }

    async fn kill_shim_then_infra(&self, pod_id: &str, _dir: &Path) {
        self.calls.push(format!("reap shim and infra {pod_id}"));
        let mut s = self.state.lock().unwrap();
        s.pods.remove(pod_id);
    }

    fn remove_cgroups(&self, _owned: &[String]) {}
}

/// The infra pid of every pod the fake shims start: the test process itself, so the handlers'
/// pidfd checks of the infra process find a live one (nothing signals it: killing goes through
/// the fake [`PodShims`]).
pub fn infra_pid() -> i32 {
    std::process::id() as i32
}

/// A fake pinned network namespace at `path`: a symlink to the (test) infra process's, so the
/// handlers' check that the infra process is in the pinned namespace holds.
fn pin_fake_netns(path: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(path.parent().unwrap())?;
    std::os::unix::fs::symlink(format!("/proc/{}/ns/net", infra_pid()), path)
}

/// The addresses the fake CNI network gives every pod, IPv6 first (the daemon reports the IPv4
/// one as the pod IP).
pub const POD_IPS: [&str; 2] = ["fd00::5", "10.88.0.5"];

#[derive(Default)]
struct NetState {
    /// Pods with an ADD result that no DEL has removed.
    results: HashSet<String>,
    /// Paths with a "namespace" pinned (a plain file here).
    pinned: HashSet<PathBuf>,
    /// The error of the next ADD.
    fail_add: Option<String>,
    /// How many DELs fail from now on.
    fail_dels: usize,
    no_config: bool,
}

/// A CNI network whose namespaces are symlinks to the test process's and whose ADD gives
/// [`POD_IPS`].
#[derive(Clone, Default)]
pub struct FakeNetwork {
    state: Arc<Mutex<NetState>>,
    calls: Calls,
}

impl FakeNetwork {
    pub fn new(calls: Calls) -> Self {
        FakeNetwork {
            state: Default::default(),
            calls,
        }
    }

    /// The next ADD fails with `why`.
    pub fn fail_next_add(&self, why: &str) {
        self.state.lock().unwrap().fail_add = Some(why.to_string());
    }

    /// The next `n` DELs fail.
    pub fn fail_dels(&self, n: usize) {
        self.state.lock().unwrap().fail_dels = n;
    }

    /// No CNI config: pods get loopback only.
    pub fn remove_config(&self) {
        self.state.lock().unwrap().no_config = true;
    }

    /// The network namespaces pinned now.
    pub fn pinned(&self) -> HashSet<PathBuf> {
        self.state.lock().unwrap().pinned.clone()
    }

    /// The pods with a live ADD result (addresses held).
    pub fn attached(&self) -> HashSet<String> {
        self.state.lock().unwrap().results.clone()
    }

    fn plugin_error(command: &str, msg: &str) -> CniError {
        CniError::Plugin {
            plugin: "fake".into(),
            command: command.into(),
            code: Some(11),
            msg: msg.into(),
            details: String::new(),
        }
    }
}

#[tonic::async_trait]
impl PodNetwork for FakeNetwork {
    fn config(&self) -> Result<(), CniError> {
        match self.state.lock().unwrap().no_config {
            true => Err(CniError::NoConfig("no network config found".into())),
            false => Ok(()),
        }
    }

    fn ready(&self) -> Result<(), String> {
        self.config().map_err(|e| e.to_string())
    }

    fn take_netns(&self, path: &Path) -> std::io::Result<()> {
        self.calls.push("take netns".into());
        pin_fake_netns(path)?;
        self.state.lock().unwrap().pinned.insert(path.to_path_buf());
        Ok(())
    }

    fn pin_netns(&self, pid: u32, path: &Path) -> std::io::Result<()> {
        self.calls.push(format!("pin netns of {pid}"));
        pin_fake_netns(path)?;
        self.state.lock().unwrap().pinned.insert(path.to_path_buf());
        Ok(())
    }

    fn remove_netns(&self, path: &Path) -> std::io::Result<()> {
        if self.state.lock().unwrap().pinned.remove(path) {
            self.calls.push("remove netns".into());
        }
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    async fn add(&self, req: &crishim_cni::PodNetwork) -> Result<NetworkResult, CniError> {
        self.calls.push(format!("cni ADD {}", req.id));
        let mut s = self.state.lock().unwrap();
        if let Some(why) = s.fail_add.take() {
            return Err(Self::plugin_error("ADD", &why));
        }
        if !s.pinned.contains(&req.netns) {
            return Err(Self::plugin_error("ADD", "no network namespace there"));
        }
        s.results.insert(req.id.clone());
        let raw = serde_json::json!({
            "cniVersion": "1.0.0",
            "ips": [
                {"address": format!("{}/64", POD_IPS[0])},
                {"address": format!("{}/16", POD_IPS[1])},
            ],
        });
        Ok(NetworkResult::parse(raw, &req.ifname).expect("a valid result"))
    }

    async fn del(&self, req: &crishim_cni::PodNetwork) -> Result<(), CniError> {
        self.calls.push(format!("cni DEL {}", req.id));
        let mut s = self.state.lock().unwrap();
        if s.fail_dels > 0 {
            s.fail_dels -= 1;
            return Err(Self::plugin_error("DEL", "the IPAM store is locked"));
        }
        s.results.remove(&req.id);
        Ok(())
    }

    fn has_result(&self, pod_id: &str) -> bool {
        self.state.lock().unwrap().results.contains(pod_id)
    }

    fn drain_spares(&self) {}

    fn close(&self) {}
}

#[derive(Default)]
struct FilesState {
    /// Where a "/dev/shm" is mounted.
    shm: HashSet<PathBuf>,
    fail_write: Option<String>,
    fail_shm: Option<String>,
}

/// Pod files as plain files in plain directories; /dev/shm "mounts" are remembered.
#[derive(Clone, Default)]
pub struct FakeFiles {
    state: Arc<Mutex<FilesState>>,
    calls: Calls,
}

impl FakeFiles {
    pub fn new(calls: Calls) -> Self {
        FakeFiles {
            state: Default::default(),
            calls,
        }
    }

    /// The next write of pod files fails with `why`.
    pub fn fail_next_write(&self, why: &str) {
        self.state.lock().unwrap().fail_write = Some(why.to_string());
    }

    /// The next /dev/shm mount fails with `why`.
    pub fn fail_next_shm(&self, why: &str) {
        self.state.lock().unwrap().fail_shm = Some(why.to_string());
    }

    /// Where a /dev/shm is mounted now.
    pub fn shm_mounted(&self) -> HashSet<PathBuf> {
        self.state.lock().unwrap().shm.clone()
    }
}

impl PodFiles for FakeFiles {
    fn mount_shm(&self, dir: &Path) -> Result<(), Error> {
        self.calls.push("mount shm".into());
        let mut s = self.state.lock().unwrap();
        if let Some(why) = s.fail_shm.take() {
            return Err(Error::internal(format!(
                "mounting the pod's /dev/shm: {why}"
            )));
        }
        std::fs::create_dir_all(dir).unwrap();
        s.shm.insert(dir.to_path_buf());
        Ok(())
    }

    fn unmount_shm(&self, dir: &Path) -> std::io::Result<()> {
        if self.state.lock().unwrap().shm.remove(dir) {
            self.calls.push("unmount shm".into());
        }
        Ok(())
    }

    fn write(&self, dir: &Path, files: &[(&str, String); 3]) -> Result<(), Error> {
        self.calls.push("write pod files".into());
        if let Some(why) = self.state.lock().unwrap().fail_write.take() {
            return Err(Error::internal(format!(
                "mounting the pod files' tmpfs: {why}"
            )));
        }
        for (name, data) in files {
            std::fs::write(dir.join(name), data).unwrap();
        }
        Ok(())
    }

    fn remove_dir(&self, dir: &Path) -> std::io::Result<()> {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {
                self.calls.push(format!("remove {}", dir.display()));
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The one image the fake host has.
pub const IMAGE: &str = "docker.io/library/busybox:latest";

/// A host with one image, whose root filesystems are plain directories holding an
/// `/etc/passwd`. It remembers which containers hold one.
#[derive(Default)]
pub struct FakeHost {
    root: PathBuf,
    mounted: Mutex<HashSet<String>>,
}

impl FakeHost {
    pub fn new(root: &Path) -> Self {
        FakeHost {
            root: root.to_path_buf(),
            mounted: Mutex::default(),
        }
    }

    pub fn mounted(&self) -> HashSet<String> {
        self.mounted.lock().unwrap().clone()
    }

    fn image() -> ImageRecord {
        let d = Digest::of(b"fake image config");
        ImageRecord {
            id: d.clone(),
            repo_tags: vec![IMAGE.into()],
            repo_digests: vec![format!("docker.io/library/busybox@{}", d.as_str())],
            size: 1,
            manifest: d.clone(),
            index: None,
            config: d.clone(),
            layers: vec![d.clone()],
            chain_ids: vec![d],
            user: String::new(),
        }
    }
}

#[tonic::async_trait]
impl ContainerImages for FakeHost {
    fn resolve(&self, name: &str) -> Result<Option<ImageRecord>, ImageError> {
        Ok((name == IMAGE || name == "busybox").then(Self::image))
    }

    fn config(&self, _image: &ImageRecord) -> Result<ImageConfiguration, ImageError> {
        let json = r#"{"architecture":"amd64","os":"linux",
            "config":{"Cmd":["sh"],"Env":["PATH=/bin"],"StopSignal":"SIGQUIT"},
            "rootfs":{"type":"layers","diff_ids":[]}}"#;
        Ok(serde_json::from_str(json).expect("a valid image config"))
    }

    async fn mount_rootfs(
        &self,
        _image: &ImageRecord,
        container_id: &str,
        rootfs: &Path,
        _idmap: Option<&crishim_images::rootfs::Idmap>,
        _context: Option<&str>,
    ) -> Result<(), ImageError> {
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        self.mounted
            .lock()
            .unwrap()
            .insert(container_id.to_string());
        Ok(())
    }

    async fn mount_volume(
        &self,
        image: &ImageRecord,
        volume_id: &str,
        target: &Path,
    ) -> Result<(), ImageError> {
        self.mount_rootfs(image, volume_id, target, None, None)
            .await
    }

    async fn release_rootfs(&self, container_id: &str, _rootfs: &Path) -> Result<(), ImageError> {
        self.mounted.lock().unwrap().remove(container_id);
        Ok(())
    }

    fn writable_dir(&self, container_id: &str) -> PathBuf {
        self.root.join(container_id)
    }

    fn root(&self) -> &Path {
        &self.root
    }
}

/// The runtime service over fakes in a temporary directory, as containerd's
/// `newTestCRIService`, with the CRI calls the handler tests make. The test files add their
/// own helpers in `impl TestNode` blocks.
pub struct TestNode {
    pub svc: RuntimeService,
    pub shims: FakeShims,
    pub network: FakeNetwork,
    pub files: FakeFiles,
    pub host: Arc<FakeHost>,
    /// The pod fakes' steps, in order.
    pub calls: Calls,
    pub dir: tempfile::TempDir,
}

impl TestNode {
    pub fn new() -> TestNode {
        Self::open(tempfile::tempdir().unwrap(), FakeShims::default())
    }

    /// A daemon over `dir`'s records with `shims`, as after a restart.
    pub fn open(dir: tempfile::TempDir, shims: FakeShims) -> TestNode {
        let config = Config {
            root_dir: dir.path().join("root"),
            state_dir: dir.path().join("state"),
            ..Config::default()
        };
        let store = Store::open(&config.root_dir.join("records")).unwrap();
        let calls = shims.calls();
        let network = FakeNetwork::new(calls.clone());
        let files = FakeFiles::new(calls.clone());
        let host = Arc::new(FakeHost::new(&dir.path().join("images")));
        let parts = Parts {
            shims: Arc::new(shims.clone()),
            images: host.clone(),
            pod_shims: Arc::new(shims.clone()),
            network: Arc::new(network.clone()),
            pod_files: Arc::new(files.clone()),
        };
        TestNode {
            svc: RuntimeService::with_parts(config, store, parts),
            shims,
            network,
            files,
            host,
            calls,
            dir,
        }
    }

    /// RunPodSandbox of pod `name`, with a DNS config.
    pub async fn run_pod(&self, name: &str) -> Result<String, Status> {
        let req = cri::RunPodSandboxRequest {
            config: Some(cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: name.into(),
                    uid: format!("uid-{name}"),
                    namespace: "default".into(),
                    attempt: 0,
                }),
                hostname: name.into(),
                dns_config: Some(cri::DnsConfig {
                    servers: vec!["10.0.0.10".into()],
                    searches: vec!["default.svc.cluster.local".into()],
                    options: vec!["ndots:5".into()],
                }),
                ..Default::default()
            }),
            runtime_handler: String::new(),
        };
        let r = self.svc.run_pod_sandbox(GrpcRequest::new(req)).await?;
        Ok(r.into_inner().pod_sandbox_id)
    }

    pub async fn stop_pod(&self, id: &str) -> Result<(), Status> {
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.svc
            .stop_pod_sandbox(GrpcRequest::new(req))
            .await
            .map(drop)
    }

    pub async fn remove_pod(&self, id: &str) -> Result<(), Status> {
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.svc
            .remove_pod_sandbox(GrpcRequest::new(req))
            .await
            .map(drop)
    }

    pub async fn pod_status(&self, id: &str) -> Result<cri::PodSandboxStatus, Status> {
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        };
        let r = self.svc.pod_sandbox_status(GrpcRequest::new(req)).await?;
        Ok(r.into_inner().status.expect("a status"))
    }

    pub async fn pods(&self) -> Vec<cri::PodSandbox> {
        let req = cri::ListPodSandboxRequest { filter: None };
        let r = self
            .svc
            .list_pod_sandbox(GrpcRequest::new(req))
            .await
            .unwrap();
        r.into_inner().items
    }

    /// CreateContainer of `name` in pod `pod`, from [`IMAGE`], with a secret in its
    /// environment.
    pub async fn create(&self, pod: &str, name: &str) -> Result<String, Status> {
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: name.into(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: IMAGE.into(),
                    ..Default::default()
                }),
                envs: vec![cri::KeyValue {
                    key: "SECRET".into(),
                    value: "s3cr3t".into(),
                }],
                ..Default::default()
            }),
            sandbox_config: None,
        };
        let r = self.svc.create_container(GrpcRequest::new(req)).await?;
        Ok(r.into_inner().container_id)
    }

    pub async fn start(&self, id: &str) -> Result<(), Status> {
        let req = cri::StartContainerRequest {
            container_id: id.into(),
        };
        self.svc
            .start_container(GrpcRequest::new(req))
            .await
            .map(drop)
    }

    /// A running container `name` in pod `pod`.
    pub async fn running(&self, pod: &str, name: &str) -> String {
        let id = self.create(pod, name).await.unwrap();
        self.start(&id).await.unwrap();
        id
    }

    pub async fn stop(&self, id: &str, timeout: i64) -> Result<(), Status> {
        let req = cri::StopContainerRequest {
            container_id: id.into(),
            timeout,
        };
        self.svc
            .stop_container(GrpcRequest::new(req))
            .await
            .map(drop)
    }

    pub async fn remove(&self, id: &str) -> Result<(), Status> {
        let req = cri::RemoveContainerRequest {
            container_id: id.into(),
        };
        self.svc
            .remove_container(GrpcRequest::new(req))
            .await
            .map(drop)
    }

    pub async fn status(&self, id: &str) -> Result<cri::ContainerStatus, Status> {
        let req = cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let r = self.svc.container_status(GrpcRequest::new(req)).await?;
        Ok(r.into_inner().status.expect("a status"))
    }

    pub async fn containers(&self) -> Vec<cri::Container> {
        let req = cri::ListContainersRequest { filter: None };
        let r = self
            .svc
            .list_containers(GrpcRequest::new(req))
            .await
            .unwrap();
        r.into_inner().containers
    }
}
