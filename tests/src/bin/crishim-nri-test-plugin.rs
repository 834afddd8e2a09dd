//! An NRI plugin for crishim's integration tests: it logs the events it sees, adjusts and
//! updates containers as its configuration says, and can misbehave on purpose.
//!
//! ```text
//! crishim-nri-test-plugin --socket PATH --name NAME --idx NN [--config FILE.json]
//! crishim-nri-test-plugin [--config FILE.json]     # launched by the runtime
//! ```
//!
//! Launched by the runtime (`NRI_PLUGIN_SOCKET`, `NRI_PLUGIN_NAME`, `NRI_PLUGIN_IDX` set, no
//! `--socket`), the configuration arrives in Configure instead, where a non-empty one replaces
//! the file's. A wrapper script in the plugin directory can pass `--config` to a launched
//! plugin, for the modes that act before Configure (`no-register`, `slow-register`).
//!
//! The log (`log`) gets one line each, flushed: `REGISTERED`, `CONFIGURE <config, newlines as
//! spaces>`, `SYNC <pods> <containers>`, `EVENT <Rpc> <pod name|-> <container name|->`,
//! `UNSOLICITED <container name> OK|FAILED|ERROR <why>`, `REGISTER_FAILED <why>`, `CLOSED`.
//! Lines before the log is known (a launched plugin's `REGISTERED`) are written once it is.
//!
//! Exit status: 0 once the connection closes after registering; 1 when registration fails or
//! in the `crash` mode; 2 for bad arguments, configuration or connection.

#[path = "nri_test_plugin/config.rs"]
mod config;
#[cfg(test)]
#[path = "nri_test_plugin/tests.rs"]
mod tests;

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write as _};
use std::os::fd::AsFd as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use bytes::{BufMut as _, BytesMut};
use crishim_nri::api;
use crishim_nri::conn::{code, Status};
use crishim_nri::stub::{Plugin, Stub, StubHandle, PLUGIN_SOCKET_ENV};
use tokio::io::AsyncWriteExt as _;

use config::{Config, Mode};

const USAGE: &str = "usage: crishim-nri-test-plugin --socket PATH --name NAME --idx NN \
                     [--config FILE.json], or with no --socket when launched by the runtime";

/// How long `slow-register` waits before registering.
const SLOW_REGISTER: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
struct Args {
    socket: Option<PathBuf>,
    name: Option<String>,
    idx: Option<String>,
    config: Option<PathBuf>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args> {
    let mut parsed = Args::default();
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--socket" => parsed.socket = Some(value()?.into()),
            "--name" => parsed.name = Some(value()?),
            "--idx" => parsed.idx = Some(value()?),
            "--config" => parsed.config = Some(value()?.into()),
            _ => bail!("unknown argument {flag:?}"),
        }
    }
    Ok(parsed)
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("crishim-nri-test-plugin: {e:#}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("crishim-nri-test-plugin: starting tokio: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async {
        match start(args).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("crishim-nri-test-plugin: {e:#}");
                ExitCode::from(2)
            }
        }
    })
}

/// Connects and sets up; the errors are the caller's, the rest is [`serve`]'s.
async fn start(args: Args) -> Result<ExitCode> {
    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Config::parse(&text).with_context(|| format!("in {}", path.display()))?
        }
        None => Config::parse("{}")?,
    };
    let log = Arc::new(Log::default());
    if let Some(path) = &config.log {
        log.open(path)?;
    }
    let stub = match &args.socket {
        Some(socket) => {
            let (Some(name), Some(idx)) = (&args.name, &args.idx) else {
                bail!("--socket needs --name and --idx");
            };
            Stub::connect(socket, name, idx).await?
        }
        None if std::env::var_os(PLUGIN_SOCKET_ENV).is_some() => Stub::from_env()?,
        None => bail!("no --socket, and not launched by the runtime ({PLUGIN_SOCKET_ENV} unset)"),
    };
    // A second descriptor of the connection, to write what the stub never would.
    let raw = stub
        .socket()
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating the socket")?;
    let raw = std::os::unix::net::UnixStream::from(raw);
    Ok(serve(stub, config, log, raw).await)
}

async fn serve(
    stub: Stub,
    config: Config,
    log: Arc<Log>,
    raw: std::os::unix::net::UnixStream,
) -> ExitCode {
    match config.mode {
        Mode::NoRegister => {
            // Hold the connection without a word until the runtime gives up on it.
            drop(stub);
            let mut raw = match tokio::net::UnixStream::from_std(raw) {
                Ok(raw) => raw,
                Err(e) => return log.fail(&format!("watching the socket: {e}")),
            };
            let mut sink = tokio::io::sink();
            let _ = tokio::io::copy(&mut raw, &mut sink).await;
            log.line("CLOSED");
            return ExitCode::SUCCESS;
        }
        Mode::SlowRegister => tokio::time::sleep(SLOW_REGISTER).await,
        _ => {}
    }
    let plugin = Arc::new(TestPlugin {
        config: Mutex::new(Arc::new(config)),
        log,
        handle: stub.handle(),
        raw: Mutex::new(Some(raw)),
        registered: AtomicBool::new(false),
    });
    let result = stub.run(plugin.clone()).await;
    if let Err(e) = &result {
        eprintln!("crishim-nri-test-plugin: {e}");
        plugin.log.line(&format!("REGISTER_FAILED {e}"));
    }
    plugin.log.line("CLOSED");
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

/// The event log: appended and flushed line by line; lines wait in memory until its path is
/// known.
#[derive(Default)]
struct Log {
    inner: Mutex<LogInner>,
}

#[derive(Default)]
struct LogInner {
    file: Option<BufWriter<File>>,
    pending: Vec<String>,
}

impl Log {
    fn open(&self, path: &std::path::Path) -> Result<()> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening the log {}", path.display()))?;
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut file = BufWriter::new(file);
        for line in inner.pending.drain(..) {
            writeln!(file, "{line}")?;
        }
        file.flush()?;
        inner.file = Some(file);
        Ok(())
    }

    fn line(&self, line: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match &mut inner.file {
            // A log that cannot be written is the test's to notice; the plugin carries on.
            Some(file) => {
                let _ = writeln!(file, "{line}").and_then(|()| file.flush());
            }
            None => inner.pending.push(line.to_string()),
        }
    }

    fn fail(&self, why: &str) -> ExitCode {
        eprintln!("crishim-nri-test-plugin: {why}");
        self.line(&format!("ERROR {why}"));
        ExitCode::FAILURE
    }
}

struct TestPlugin {
    /// The configuration in force: the file's, then Configure's.
    config: Mutex<Arc<Config>>,
    log: Arc<Log>,
    handle: StubHandle,
    /// The connection under the stub, for the modes that break the protocol.
    raw: Mutex<Option<std::os::unix::net::UnixStream>>,
    /// Whether `REGISTERED` is logged: at registration or at Configure, whichever runs first.
    registered: AtomicBool,
}

fn name_of<'a>(
    pod: Option<&'a api::PodSandbox>,
    container: Option<&'a api::Container>,
) -> (&'a str, &'a str) {
    let or_dash = |s: Option<&'a str>| s.filter(|s| !s.is_empty()).unwrap_or("-");
    (
        or_dash(pod.map(|p| p.name.as_str())),
        or_dash(container.map(|c| c.name.as_str())),
    )
}

impl TestPlugin {
    fn config(&self) -> Arc<Config> {
        self.config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn log_registered(&self) {
        if !self.registered.swap(true, Ordering::Relaxed) {
            self.log.line("REGISTERED");
        }
    }

    /// What every RPC does first: logs it (`line`, or an EVENT line), strikes if it is the
    /// hostile mode's, and schedules an unsolicited update after it. Whether the container is
    /// the plugin's to adjust.
    async fn on_rpc(
        &self,
        rpc: &str,
        line: Option<String>,
        pod: Option<&api::PodSandbox>,
        container: Option<&api::Container>,
    ) -> bool {
        let (pod_name, container_name) = name_of(pod, container);
        let line = line.unwrap_or_else(|| format!("EVENT {rpc} {pod_name} {container_name}"));
        self.log.line(&line);
        let config = self.config();
        let matched = config.matches(container.map(|c| c.name.as_str()));
        if !matched {
            return false;
        }
        if let (Some(u), Some(c)) = (&config.unsolicited_update, container) {
            if u.after_event == rpc {
                self.schedule_update(u, c);
            }
        }
        if config.mode_event == rpc {
            self.strike(config.mode).await;
        }
        true
    }

    fn schedule_update(&self, u: &config::Unsolicited, container: &api::Container) {
        let (handle, log) = (self.handle.clone(), self.log.clone());
        let (updates, evictions) = if u.evict {
            let evict = api::ContainerEviction {
                container_id: container.id.clone(),
                reason: "evicted by the test plugin".into(),
            };
            (Vec::new(), vec![evict])
        } else {
            (vec![u.resources.update(&container.id)], Vec::new())
        };
        let delay = Duration::from_millis(u.delay_ms);
        let name = container.name.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let result = match handle.update_containers(updates, evictions).await {
                Ok(failed) if failed.is_empty() => "OK".to_string(),
                Ok(_) => "FAILED".to_string(),
                Err(e) => format!("ERROR {e}"),
            };
            log.line(&format!("UNSOLICITED {name} {result}"));
        });
    }

    /// The hostile modes that act on a request.
    async fn strike(&self, mode: Mode) {
        match mode {
            Mode::Normal | Mode::NoRegister | Mode::SlowRegister => return,
            Mode::Crash => std::process::exit(1),
            Mode::Hang => {}
            Mode::Disconnect => {
                if let Some(raw) = self.take_raw() {
                    let _ = raw.shutdown(std::net::Shutdown::Both);
                }
            }
            Mode::Flood => self.write_raw(&oversized_reply()).await,
            Mode::Nonsense => self.write_raw(&nonsense()).await,
        }
        // None of these answers: the runtime times out, or has already dropped the plugin.
        std::future::pending::<()>().await;
    }

    fn take_raw(&self) -> Option<std::os::unix::net::UnixStream> {
        self.raw.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    async fn write_raw(&self, bytes: &[u8]) {
        let Some(raw) = self.take_raw() else { return };
        // The descriptor shares the stub's non-blocking mode, so write through tokio.
        let Ok(mut raw) = tokio::net::UnixStream::from_std(raw) else {
            return;
        };
        // The runtime may hang up part-way: that is what it should do. Dropping this
        // descriptor afterwards leaves the connection to the stub's.
        let _ = raw.write_all(bytes).await;
    }
}

/// A reply over ttrpc's 4 MiB limit, framed as the mux frames it should be cut into, so that
/// only the ttrpc header's length gives it away. The stream id is a guess; the runtime must
/// refuse it on the header alone.
fn oversized_reply() -> Vec<u8> {
    let len = crishim_nri::ttrpc::MAX_MESSAGE + (64 << 10);
    let mut message = BytesMut::with_capacity(crishim_nri::ttrpc::HEADER_LEN + len);
    message.put_u32(len as u32);
    message.put_u32(1); // stream id
    message.put_u8(2); // response
    message.put_u8(0); // flags
    message.put_bytes(b'x', len);
    let mut framed = BytesMut::new();
    crishim_nri::mux::encode(crishim_nri::mux::PLUGIN_SERVICE_CONN, &message, &mut framed);
    framed.to_vec()
}

/// A well-formed mux frame holding no valid ttrpc message (an unknown message type and
/// garbage), so that the runtime's ttrpc decoding, not only its framing, meets it.
fn nonsense() -> Vec<u8> {
    let garbage = b"\xde\xad\xbe\xef this is not ttrpc \xff\x00\xff";
    let mut message = BytesMut::new();
    message.put_u32(garbage.len() as u32);
    message.put_u32(1); // stream id
    message.put_u8(0x7f); // no such type
    message.put_u8(0xff); // flags
    message.put_slice(garbage);
    let mut framed = BytesMut::new();
    crishim_nri::mux::encode(crishim_nri::mux::PLUGIN_SERVICE_CONN, &message, &mut framed);
    framed.to_vec()
}

/// The container's updates as the configuration asks (`None`: not for this container).
fn update_for(
    resources: Option<&config::Resources>,
    container: Option<&api::Container>,
) -> Vec<api::ContainerUpdate> {
    match (resources, container) {
        (Some(r), Some(c)) => vec![r.update(&c.id)],
        _ => Vec::new(),
    }
}

impl Plugin for TestPlugin {
    fn on_registered(&self) {
        self.log_registered();
    }

    async fn configure(
        &self,
        req: api::ConfigureRequest,
    ) -> Result<api::ConfigureResponse, Status> {
        self.log_registered();
        let line = format!("CONFIGURE {}", req.config.replace(['\n', '\r'], " "));
        if !req.config.trim().is_empty() {
            let invalid = |e: anyhow::Error| {
                let why = format!("{e:#}");
                self.log.line(&format!("ERROR configuration: {why}"));
                Status::new(code::INVALID_ARGUMENT, why)
            };
            let config = Config::parse(&req.config).map_err(invalid)?;
            if let Some(path) = &config.log {
                self.log.open(path).map_err(invalid)?;
            }
            *self.config.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        }
        self.on_rpc("Configure", Some(line), None, None).await;
        Ok(api::ConfigureResponse {
            events: self.config().event_mask(),
        })
    }

    async fn synchronize(
        &self,
        req: api::SynchronizeRequest,
    ) -> Result<api::SynchronizeResponse, Status> {
        let line = format!("SYNC {} {}", req.pods.len(), req.containers.len());
        self.on_rpc("Synchronize", Some(line), None, None).await;
        Ok(api::SynchronizeResponse::default())
    }

    async fn shutdown(&self, _req: api::Empty) -> Result<api::Empty, Status> {
        self.on_rpc("Shutdown", None, None, None).await;
        Ok(api::Empty {})
    }

    async fn run_pod_sandbox(
        &self,
        req: api::RunPodSandboxRequest,
    ) -> Result<api::RunPodSandboxResponse, Status> {
        self.on_rpc("RunPodSandbox", None, req.pod.as_ref(), None)
            .await;
        Ok(Default::default())
    }

    async fn update_pod_sandbox(
        &self,
        req: api::UpdatePodSandboxRequest,
    ) -> Result<api::UpdatePodSandboxResponse, Status> {
        self.on_rpc("UpdatePodSandbox", None, req.pod.as_ref(), None)
            .await;
        Ok(Default::default())
    }

    async fn post_update_pod_sandbox(
        &self,
        req: api::PostUpdatePodSandboxRequest,
    ) -> Result<api::PostUpdatePodSandboxResponse, Status> {
        self.on_rpc("PostUpdatePodSandbox", None, req.pod.as_ref(), None)
            .await;
        Ok(Default::default())
    }

    async fn stop_pod_sandbox(
        &self,
        req: api::StopPodSandboxRequest,
    ) -> Result<api::StopPodSandboxResponse, Status> {
        self.on_rpc("StopPodSandbox", None, req.pod.as_ref(), None)
            .await;
        Ok(Default::default())
    }

    async fn remove_pod_sandbox(
        &self,
        req: api::RemovePodSandboxRequest,
    ) -> Result<api::RemovePodSandboxResponse, Status> {
        self.on_rpc("RemovePodSandbox", None, req.pod.as_ref(), None)
            .await;
        Ok(Default::default())
    }

    async fn create_container(
        &self,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, Status> {
        let (pod, container) = (req.pod.as_ref(), req.container.as_ref());
        let mine = self.on_rpc("CreateContainer", None, pod, container).await;
        let adjust = self
            .config()
            .adjust
            .as_ref()
            .filter(|_| mine)
            .map(|a| a.to_api());
        Ok(api::CreateContainerResponse {
            adjust,
            ..Default::default()
        })
    }

    async fn post_create_container(
        &self,
        req: api::PostCreateContainerRequest,
    ) -> Result<api::PostCreateContainerResponse, Status> {
        let (pod, container) = (req.pod.as_ref(), req.container.as_ref());
        self.on_rpc("PostCreateContainer", None, pod, container)
            .await;
        Ok(Default::default())
    }

    async fn start_container(
        &self,
        req: api::StartContainerRequest,
    ) -> Result<api::StartContainerResponse, Status> {
        let (pod, container) = (req.pod.as_ref(), req.container.as_ref());
        self.on_rpc("StartContainer", None, pod, container).await;
        Ok(Default::default())
    }

    async fn post_start_container(
        &self,
        req: api::PostStartContainerRequest,
    ) -> Result<api::PostStartContainerResponse, Status> {
        let (pod, container) = (req.pod.as_ref(), req.container.as_ref());
        self.on_rpc("PostStartContainer", None, pod, container)
            .await;
        Ok(Default::default())
    }

    async fn update_container(
        &self,
        req: api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, Status> {
        let (pod, container) = (req.pod.as_ref(), req.container.as_ref());
        let mine = self.on_rpc("UpdateContainer", None, pod, container).await;
        let config = self.config();
        let resources = config.update_on_update.as_ref().filter(|_| mine);
        Ok(api::UpdateContainerResponse {
            update: update_for(resources, container),
            evict: Vec::new(),
        })
    }

    async fn post_update_container(
        &self,
        req: api::PostUpdateContainerRequest,
    ) -> Result<api::PostUpdateContainerResponse, Status> {
        let (pod, container) = (req.pod.as_ref(), req.container.as_ref());
        self.on_rpc("PostUpdateContainer", None, pod, container)
            .await;
        Ok(Default::default())
    }

    async fn stop_container(
        &self,
        req: api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse, Status> {
        let (pod, container) = (req.pod.as_ref(), req.container.as_ref());
        self.on_rpc("StopContainer", None, pod, container).await;
        Ok(Default::default())
    }

    async fn remove_container(
        &self,
        req: api::RemoveContainerRequest,
    ) -> Result<api::RemoveContainerResponse, Status> {
        let (pod, container) = (req.pod.as_ref(), req.container.as_ref());
        self.on_rpc("RemoveContainer", None, pod, container).await;
        Ok(Default::default())
    }

    async fn validate_container_adjustment(
        &self,
        req: api::ValidateContainerAdjustmentRequest,
    ) -> Result<api::ValidateContainerAdjustmentResponse, Status> {
        let (pod, container) = (req.pod.as_ref(), req.container.as_ref());
        self.on_rpc("ValidateContainerAdjustment", None, pod, container)
            .await;
        Ok(Default::default())
    }
}
