//! The plugin's side of NRI, so that NRI plugins can be written in Rust.
//!
//! A plugin implements [`Plugin`]: one method per RPC of NRI's Plugin service, each with a
//! default that answers an empty response (and, for `Configure`, subscribes to every event). A
//! [`Stub`] owns the connection to the runtime: [`Stub::connect`] dials the runtime's socket (an
//! external plugin), [`Stub::from_env`] takes the socket the runtime connected before launching
//! the plugin. [`Stub::run`] registers the plugin, serves the runtime's calls until the
//! connection closes, and returns. A [`StubHandle`] calls the runtime meanwhile: unsolicited
//! container updates, or closing the connection.
//!
//! ```no_run
//! use std::sync::Arc;
//! use crishim_nri::{api, conn::Status, stub::{Plugin, Stub}};
//!
//! struct AddEnv;
//!
//! impl Plugin for AddEnv {
//!     async fn create_container(
//!         &self,
//!         _req: api::CreateContainerRequest,
//!     ) -> Result<api::CreateContainerResponse, Status> {
//!         let env = vec![api::KeyValue { key: "HELLO".into(), value: "NRI".into() }];
//!         let adjust = api::ContainerAdjustment { env, ..Default::default() };
//!         Ok(api::CreateContainerResponse { adjust: Some(adjust), ..Default::default() })
//!     }
//! }
//!
//! # async fn main_() -> Result<(), crishim_nri::stub::StubError> {
//! Stub::connect(crishim_nri::stub::DEFAULT_SOCKET_PATH, "add-env", "10").await?
//!     .run(Arc::new(AddEnv))
//!     .await
//! # }
//! ```

use std::future::Future;
use std::os::fd::{FromRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::UnixStream;

use crate::api;
use crate::conn::{self, code, CallError, Endpoint, Handler, HandlerFuture, Role, Status};

/// Where external plugins find the runtime.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/nri/nri.sock";
pub use crate::api::{NRI_VERSION, PLUGIN_IDX_ENV, PLUGIN_NAME_ENV, PLUGIN_SOCKET_ENV};
/// How long registration may take, as NRI's default.
pub const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a call to the runtime may take until `Configure` says otherwise, as NRI's default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum StubError {
    #[error("connecting to the NRI socket {path}: {error}")]
    Connect {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{var} is not set: the plugin was not launched by the runtime")]
    MissingEnv { var: &'static str },
    #[error("{PLUGIN_SOCKET_ENV}={value} is not a connected socket: {reason}")]
    BadSocketEnv { value: String, reason: String },
    #[error("{0}")]
    InvalidName(String),
    #[error("{0}")]
    InvalidIndex(String),
    #[error("registering with the runtime: {0}")]
    Register(CallError),
    #[error("calling the runtime: {0}")]
    Call(CallError),
    #[error("not connected to the runtime (the stub is not running)")]
    NotRunning,
}

/// What a [`Plugin`] method returns: a `Send` future of its reply. Implement the methods with
/// `async fn`.
pub trait Reply<T>: Future<Output = Result<T, Status>> + Send {}
impl<T, F: Future<Output = Result<T, Status>> + Send> Reply<T> for F {}

/// An NRI plugin: one method per RPC of NRI's Plugin service. Each defaults to an empty
/// response; a method that returns an error status answers the runtime with it.
///
/// Calls arrive concurrently (up to [`conn::MAX_CONCURRENT_SERVED`]), each on its own task; a
/// method that waits holds only its own call. The runtime gives up on a call after its request
/// timeout and may then drop the plugin.
pub trait Plugin: Send + Sync + 'static {
    /// The runtime accepted the registration. It may call `Configure` before this runs.
    fn on_registered(&self) {}

    /// The runtime's configuration for the plugin. The reply's `events` subscribes to events
    /// (bit `event - 1` each, see [`api::EventMask`]); 0, the default, subscribes to all.
    fn configure(&self, _req: api::ConfigureRequest) -> impl Reply<api::ConfigureResponse> {
        async { Ok(api::ConfigureResponse::default()) }
    }

    /// The pods and containers that exist, once, after `Configure`. The stub collects the
    /// runtime's partial messages (`more`), so this sees them all at once.
    fn synchronize(&self, _req: api::SynchronizeRequest) -> impl Reply<api::SynchronizeResponse> {
        async { Ok(api::SynchronizeResponse::default()) }
    }

    /// The runtime is shutting down; the connection closes next.
    fn shutdown(&self, _req: api::Empty) -> impl Reply<api::Empty> {
        async { Ok(api::Empty::default()) }
    }

    fn run_pod_sandbox(
        &self,
        _req: api::RunPodSandboxRequest,
    ) -> impl Reply<api::RunPodSandboxResponse> {
        async { Ok(Default::default()) }
    }

    fn update_pod_sandbox(
        &self,
        _req: api::UpdatePodSandboxRequest,
    ) -> impl Reply<api::UpdatePodSandboxResponse> {
        async { Ok(Default::default()) }
    }

    fn post_update_pod_sandbox(
        &self,
        _req: api::PostUpdatePodSandboxRequest,
    ) -> impl Reply<api::PostUpdatePodSandboxResponse> {
        async { Ok(Default::default()) }
    }

    fn stop_pod_sandbox(
        &self,
        _req: api::StopPodSandboxRequest,
    ) -> impl Reply<api::StopPodSandboxResponse> {
        async { Ok(Default::default()) }
    }

    fn remove_pod_sandbox(
        &self,
        _req: api::RemovePodSandboxRequest,
    ) -> impl Reply<api::RemovePodSandboxResponse> {
        async { Ok(Default::default()) }
    }

    /// The one event whose reply adjusts the container being created.
    fn create_container(
        &self,
        _req: api::CreateContainerRequest,
    ) -> impl Reply<api::CreateContainerResponse> {
        async { Ok(Default::default()) }
    }

    fn post_create_container(
        &self,
        _req: api::PostCreateContainerRequest,
    ) -> impl Reply<api::PostCreateContainerResponse> {
        async { Ok(Default::default()) }
    }

    fn start_container(
        &self,
        _req: api::StartContainerRequest,
    ) -> impl Reply<api::StartContainerResponse> {
        async { Ok(Default::default()) }
    }

    fn post_start_container(
        &self,
        _req: api::PostStartContainerRequest,
    ) -> impl Reply<api::PostStartContainerResponse> {
        async { Ok(Default::default()) }
    }

    fn update_container(
        &self,
        _req: api::UpdateContainerRequest,
    ) -> impl Reply<api::UpdateContainerResponse> {
        async { Ok(Default::default()) }
    }

    fn post_update_container(
        &self,
        _req: api::PostUpdateContainerRequest,
    ) -> impl Reply<api::PostUpdateContainerResponse> {
        async { Ok(Default::default()) }
    }

    fn stop_container(
        &self,
        _req: api::StopContainerRequest,
    ) -> impl Reply<api::StopContainerResponse> {
        async { Ok(Default::default()) }
    }

    fn remove_container(
        &self,
        _req: api::RemoveContainerRequest,
    ) -> impl Reply<api::RemoveContainerResponse> {
        async { Ok(Default::default()) }
    }

    /// The legacy event RPC, which a runtime sends only plugins that lack an event's own RPC.
    /// By default it goes to the event's own method, as NRI's Go stub does for the events whose
    /// replies carry nothing.
    fn state_change(&self, req: api::StateChangeEvent) -> impl Reply<api::Empty> {
        async move {
            use api::Event as E;
            let event = req.event();
            let (pod, container) = (req.pod, req.container);
            match event {
                E::RunPodSandbox => {
                    self.run_pod_sandbox(api::RunPodSandboxRequest { pod })
                        .await?;
                }
                E::PostUpdatePodSandbox => {
                    let req = api::PostUpdatePodSandboxRequest { pod };
                    self.post_update_pod_sandbox(req).await?;
                }
                E::StopPodSandbox => {
                    self.stop_pod_sandbox(api::StopPodSandboxRequest { pod })
                        .await?;
                }
                E::RemovePodSandbox => {
                    self.remove_pod_sandbox(api::RemovePodSandboxRequest { pod })
                        .await?;
                }
                E::PostCreateContainer => {
                    let req = api::PostCreateContainerRequest { pod, container };
                    self.post_create_container(req).await?;
                }
                E::StartContainer => {
                    let req = api::StartContainerRequest { pod, container };
                    self.start_container(req).await?;
                }
                E::PostStartContainer => {
                    let req = api::PostStartContainerRequest { pod, container };
                    self.post_start_container(req).await?;
                }
                E::PostUpdateContainer => {
                    let req = api::PostUpdateContainerRequest { pod, container };
                    self.post_update_container(req).await?;
                }
                E::RemoveContainer => {
                    let req = api::RemoveContainerRequest { pod, container };
                    self.remove_container(req).await?;
                }
                // The others' replies carry adjustments or updates, which StateChange cannot.
                _ => {}
            }
            Ok(api::Empty::default())
        }
    }

    /// A validator's verdict on the adjustments plugins made to a container being created.
    fn validate_container_adjustment(
        &self,
        _req: api::ValidateContainerAdjustmentRequest,
    ) -> impl Reply<api::ValidateContainerAdjustmentResponse> {
        async { Ok(Default::default()) }
    }
}

/// A connection to the runtime, not yet registered.
pub struct Stub {
    stream: UnixStream,
    name: String,
    idx: String,
    registration_timeout: Duration,
    shared: Arc<Shared>,
}

/// What the stub and its handles share.
struct Shared {
    /// Set once [`Stub::run`] has started the connection.
    endpoint: OnceLock<Endpoint>,
    /// Whether the runtime accepted the registration.
    registered: AtomicBool,
    /// The runtime's request timeout, in milliseconds, from `Configure`.
    request_timeout_ms: AtomicU64,
    /// Pods and containers of a `Synchronize` the runtime sends in parts, until the last.
    sync: Mutex<Option<api::SynchronizeRequest>>,
}

impl Stub {
    /// Connects to the runtime's socket, as an external plugin.
    pub async fn connect(
        socket: impl AsRef<Path>,
        name: &str,
        idx: &str,
    ) -> Result<Stub, StubError> {
        let path = socket.as_ref();
        let stream = UnixStream::connect(path)
            .await
            .map_err(|error| StubError::Connect {
                path: path.to_owned(),
                error,
            })?;
        Stub::new(stream, name, idx)
    }

    /// The connection a runtime made before launching the plugin: the socket's descriptor in
    /// `NRI_PLUGIN_SOCKET`, the name and index in `NRI_PLUGIN_NAME` and `NRI_PLUGIN_IDX`.
    ///
    /// The stub takes ownership of that descriptor, so call this once per process. It needs a
    /// Tokio runtime.
    pub fn from_env() -> Result<Stub, StubError> {
        let var = |var| std::env::var(var).map_err(|_| StubError::MissingEnv { var });
        let (name, idx, value) = (
            var(PLUGIN_NAME_ENV)?,
            var(PLUGIN_IDX_ENV)?,
            var(PLUGIN_SOCKET_ENV)?,
        );
        Stub::new(socket_from_env(&value)?, &name, &idx)
    }

    /// A connection made some other way (a socket pair in tests, say).
    pub fn new(stream: UnixStream, name: &str, idx: &str) -> Result<Stub, StubError> {
        api::check_plugin_name(name).map_err(StubError::InvalidName)?;
        api::check_plugin_index(idx).map_err(StubError::InvalidIndex)?;
        Ok(Stub {
            stream,
            name: name.to_string(),
            idx: idx.to_string(),
            registration_timeout: DEFAULT_REGISTRATION_TIMEOUT,
            shared: Arc::new(Shared {
                endpoint: OnceLock::new(),
                registered: AtomicBool::new(false),
                request_timeout_ms: AtomicU64::new(DEFAULT_REQUEST_TIMEOUT.as_millis() as u64),
                sync: Mutex::new(None),
            }),
        })
    }

    /// How long [`run`](Self::run) waits for the runtime to accept the registration.
    pub fn with_registration_timeout(mut self, timeout: Duration) -> Stub {
        self.registration_timeout = timeout;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn idx(&self) -> &str {
        &self.idx
    }

    /// The socket itself, for a plugin that must reach under the protocol: a test of the
    /// runtime's defences that writes what no honest plugin would.
    pub fn socket(&self) -> &UnixStream {
        &self.stream
    }

    /// A handle that calls the runtime once [`run`](Self::run) has started.
    pub fn handle(&self) -> StubHandle {
        StubHandle {
            shared: self.shared.clone(),
        }
    }

    /// Registers the plugin, then serves the runtime's calls until the connection closes.
    /// `Ok` once the connection has closed after registering (the runtime shut down or dropped
    /// the plugin, or a handle closed it).
    pub async fn run<P: Plugin>(self, plugin: Arc<P>) -> Result<(), StubError> {
        let handler = Arc::new(Dispatch {
            plugin: plugin.clone(),
            shared: self.shared.clone(),
        });
        let endpoint = Endpoint::start(self.stream, Role::Plugin, handler);
        // `run` consumes the stub, so this is the only time the slot is set.
        let _ = self.shared.endpoint.set(endpoint.clone());
        let register = api::RegisterPluginRequest {
            plugin_name: self.name,
            plugin_idx: self.idx,
            nri_version: NRI_VERSION.to_string(),
        };
        let registered = endpoint
            .call_message::<api::Empty>(
                api::RUNTIME_SERVICE,
                "RegisterPlugin",
                &register,
                self.registration_timeout,
            )
            .await;
        if let Err(e) = registered {
            endpoint.close("registration failed");
            return Err(StubError::Register(e));
        }
        self.shared.registered.store(true, Ordering::Release);
        plugin.on_registered();
        endpoint.closed().await;
        Ok(())
    }
}

/// The socket whose descriptor number `value` is, taking ownership of it.
fn socket_from_env(value: &str) -> Result<UnixStream, StubError> {
    let bad = |reason: String| StubError::BadSocketEnv {
        value: value.to_string(),
        reason,
    };
    let fd: RawFd = value
        .parse()
        .map_err(|e| bad(format!("not a descriptor number: {e}")))?;
    // The number is the environment's claim only: check that it is open and a socket before
    // anything owns it, so that a wrong number cannot take over some other file.
    if fd < 3 {
        return Err(bad("a standard descriptor".into()));
    }
    let target = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .map_err(|e| bad(format!("not open: {e}")))?;
    if !target.to_string_lossy().starts_with("socket:") {
        return Err(bad(format!("it is {}", target.display())));
    }
    // SAFETY: the descriptor is open, a socket, and by NRI's contract this process's to own;
    // nothing else in the process takes it (see `Stub::from_env`: once per process).
    let stream = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
    stream
        .set_nonblocking(true)
        .map_err(|e| bad(e.to_string()))?;
    UnixStream::from_std(stream).map_err(|e| bad(e.to_string()))
}

/// Calls the runtime on behalf of a running [`Stub`]. Cloning shares it.
#[derive(Clone)]
pub struct StubHandle {
    shared: Arc<Shared>,
}

impl StubHandle {
    /// Asks the runtime, unsolicited, to update containers' resources and to evict containers.
    /// Returns the updates that failed.
    pub async fn update_containers(
        &self,
        update: Vec<api::ContainerUpdate>,
        evict: Vec<api::ContainerEviction>,
    ) -> Result<Vec<api::ContainerUpdate>, StubError> {
        let endpoint = self.shared.endpoint.get().ok_or(StubError::NotRunning)?;
        let timeout = Duration::from_millis(self.shared.request_timeout_ms.load(Ordering::Relaxed));
        let reply: api::UpdateContainersResponse = endpoint
            .call_message(
                api::RUNTIME_SERVICE,
                "UpdateContainers",
                &api::UpdateContainersRequest { update, evict },
                timeout,
            )
            .await
            .map_err(StubError::Call)?;
        Ok(reply.failed)
    }

    /// Closes the connection; [`Stub::run`] then returns.
    pub fn close(&self) {
        if let Some(endpoint) = self.shared.endpoint.get() {
            endpoint.close("closed by the plugin");
        }
    }

    /// Whether the connection is up: started and not yet closed.
    pub fn is_connected(&self) -> bool {
        self.shared.endpoint.get().is_some_and(|e| !e.is_closed())
    }

    /// Whether the runtime has accepted the plugin; it refuses updates from plugins before.
    pub fn is_registered(&self) -> bool {
        self.shared.registered.load(Ordering::Acquire)
    }
}

/// Serves the Plugin service by decoding each request for its [`Plugin`] method.
struct Dispatch<P> {
    plugin: Arc<P>,
    shared: Arc<Shared>,
}

impl<P> Clone for Dispatch<P> {
    fn clone(&self) -> Self {
        Dispatch {
            plugin: self.plugin.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<P: Plugin> Dispatch<P> {
    /// Collects a partial `Synchronize`; the whole of it once the last part has arrived.
    fn collect_sync(&self, req: api::SynchronizeRequest) -> Option<api::SynchronizeRequest> {
        let mut held = self.shared.sync.lock().unwrap_or_else(|e| e.into_inner());
        let whole = match held.take() {
            None => req,
            Some(mut whole) => {
                whole.pods.extend(req.pods);
                whole.containers.extend(req.containers);
                whole.more = req.more;
                whole
            }
        };
        if whole.more {
            *held = Some(whole);
            None
        } else {
            Some(whole)
        }
    }

    async fn serve(self, method: &str, payload: &[u8]) -> Result<Bytes, Status> {
        let p = &*self.plugin;
        Ok(match method {
            "Configure" => {
                let req: api::ConfigureRequest = conn::decode(payload)?;
                if let Ok(ms) = u64::try_from(req.request_timeout) {
                    if ms > 0 {
                        self.shared.request_timeout_ms.store(ms, Ordering::Relaxed);
                    }
                }
                encode(p.configure(req).await?)
            }
            "Synchronize" => match self.collect_sync(conn::decode(payload)?) {
                // Acknowledge a part; the plugin answers the whole.
                None => encode(api::SynchronizeResponse {
                    update: Vec::new(),
                    more: true,
                }),
                Some(whole) => encode(api::SynchronizeResponse {
                    more: false,
                    ..p.synchronize(whole).await?
                }),
            },
            "Shutdown" => encode(p.shutdown(conn::decode(payload)?).await?),
            "RunPodSandbox" => encode(p.run_pod_sandbox(conn::decode(payload)?).await?),
            "UpdatePodSandbox" => encode(p.update_pod_sandbox(conn::decode(payload)?).await?),
            "PostUpdatePodSandbox" => {
                encode(p.post_update_pod_sandbox(conn::decode(payload)?).await?)
            }
            "StopPodSandbox" => encode(p.stop_pod_sandbox(conn::decode(payload)?).await?),
            "RemovePodSandbox" => encode(p.remove_pod_sandbox(conn::decode(payload)?).await?),
            "CreateContainer" => encode(p.create_container(conn::decode(payload)?).await?),
            "PostCreateContainer" => encode(p.post_create_container(conn::decode(payload)?).await?),
            "StartContainer" => encode(p.start_container(conn::decode(payload)?).await?),
            "PostStartContainer" => encode(p.post_start_container(conn::decode(payload)?).await?),
            "UpdateContainer" => encode(p.update_container(conn::decode(payload)?).await?),
            "PostUpdateContainer" => encode(p.post_update_container(conn::decode(payload)?).await?),
            "StopContainer" => encode(p.stop_container(conn::decode(payload)?).await?),
            "RemoveContainer" => encode(p.remove_container(conn::decode(payload)?).await?),
            "StateChange" => encode(p.state_change(conn::decode(payload)?).await?),
            "ValidateContainerAdjustment" => encode(
                p.validate_container_adjustment(conn::decode(payload)?)
                    .await?,
            ),
            _ => {
                return Err(Status::new(
                    code::UNIMPLEMENTED,
                    format!("{}/{method} is not implemented", api::PLUGIN_SERVICE),
                ))
            }
        })
    }
}

fn encode(reply: impl prost::Message) -> Bytes {
    reply.encode_to_vec().into()
}

impl<P: Plugin> Handler for Dispatch<P> {
    fn handle(&self, service: String, method: String, payload: Bytes) -> HandlerFuture {
        if service != api::PLUGIN_SERVICE {
            return Box::pin(async move {
                Err(Status::new(
                    code::UNIMPLEMENTED,
                    format!("no service {service} here"),
                ))
            });
        }
        let this = self.clone();
        Box::pin(async move { this.serve(&method, &payload).await })
    }
}

#[cfg(test)]
mod tests;
