//! Fakes for the handlers' unit tests, as containerd's CRI server tests use: a shim that keeps
//! container states in memory and a host whose "mounts" are plain directories. Nothing here
//! starts a process or mounts anything.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crishim_images::{Digest, ImageError, ImageRecord};
use crishim_proto::shim::{ContainerState, ErrorKind, Request, Response, Status as ShimStatus};
use oci_spec::image::ImageConfiguration;
use tokio::net::UnixStream;

use crate::container_images::ContainerImages;
use crate::records::now_nanos;
use crate::shim_client::{ShimError, Shims, Watch};

/// One pod's fake shim.
#[derive(Default)]
struct FakePod {
    containers: HashMap<String, ContainerState>,
    /// Open `Watch` streams, each told every exit.
    watchers: Vec<tokio::sync::mpsc::UnboundedSender<Response>>,
}

#[derive(Default)]
struct FakeState {
    pods: HashMap<String, FakePod>,
    /// Pods whose shim is gone: every request fails as unreachable.
    dead: HashSet<String>,
    /// Signals the fake containers ignore (a process that traps SIGTERM).
    ignored: HashSet<i32>,
    /// Every request, in order, with the pod it went to.
    requests: Vec<(String, Request)>,
    /// The answer to the next `Create` instead of success.
    refuse_create: Option<Response>,
}

/// Shims whose containers live in memory: `Create` makes a created container, `Start` runs it,
/// a signal not in the ignored set ends it with 128 + signal, and each exit goes to the pod's
/// watchers.
#[derive(Clone, Default)]
pub struct FakeShims {
    state: Arc<Mutex<FakeState>>,
}

impl FakeShims {
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
        if s.dead.contains(pod_id) || !s.pods.contains_key(pod_id) {
            return Err(ShimError::Unreachable(
                PathBuf::from(pod_id),
                std::io::ErrorKind::ConnectionRefused.into(),
            ));
        }
        let refuse_create = s.refuse_create.take();
        let ignored = s.ignored.clone();
        let pod = s.pods.get_mut(pod_id).expect("checked above");
        let not_found = |id: &str| Response::error(ErrorKind::NotFound, format!("{id} not found"));
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
            Request::Shutdown => {
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
