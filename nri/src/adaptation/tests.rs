//! The adaptation against plugins written with the crate's own stub, over a real socket.

use std::os::unix::fs::PermissionsExt;
use std::time::Instant;

use super::*;
use crate::api::{Event, EventMask};
use crate::conn::{code, Status};
use crate::stub::{Plugin as StubPlugin, Stub};

/// The runtime, as far as NRI sees it: one pod and one container, and the updates it got.
#[derive(Default)]
struct FakeRuntime {
    updates: Mutex<Vec<api::ContainerUpdate>>,
}

impl Runtime for FakeRuntime {
    fn snapshot(&self) -> BoxFuture<(Vec<api::PodSandbox>, Vec<api::Container>)> {
        Box::pin(async { (vec![pod()], vec![container("existing")]) })
    }

    fn update_containers(
        &self,
        updates: Vec<api::ContainerUpdate>,
        _evictions: Vec<api::ContainerEviction>,
    ) -> BoxFuture<Vec<api::ContainerUpdate>> {
        self.updates.lock().unwrap().extend(updates);
        Box::pin(async { Vec::new() })
    }
}

fn pod() -> api::PodSandbox {
    api::PodSandbox {
        id: "pod1".into(),
        name: "web".into(),
        ..Default::default()
    }
}

fn container(id: &str) -> api::Container {
    api::Container {
        id: id.into(),
        pod_sandbox_id: "pod1".into(),
        name: id.into(),
        ..Default::default()
    }
}

/// A plugin that logs what it hears and answers as told.
#[derive(Default)]
struct TestPlugin {
    name: String,
    log: Arc<Mutex<Vec<String>>>,
    events: Vec<Event>,
    adjust: Option<api::ContainerAdjustment>,
    /// Never answers CreateContainer.
    hang: bool,
    /// Built before PostCreateContainer had its own RPC.
    legacy: bool,
    reject: Option<String>,
    sync_update: Option<api::ContainerUpdate>,
}

impl TestPlugin {
    fn note(&self, what: impl Into<String>) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} {}", self.name, what.into()));
    }
}

impl StubPlugin for TestPlugin {
    async fn configure(
        &self,
        req: api::ConfigureRequest,
    ) -> Result<api::ConfigureResponse, Status> {
        self.note(format!(
            "Configure {} {}",
            req.runtime_name, req.request_timeout
        ));
        Ok(api::ConfigureResponse {
            events: EventMask::of(&self.events).0,
        })
    }

    async fn synchronize(
        &self,
        req: api::SynchronizeRequest,
    ) -> Result<api::SynchronizeResponse, Status> {
        self.note(format!(
            "Synchronize {} {}",
            req.pods.len(),
            req.containers.len()
        ));
        Ok(api::SynchronizeResponse {
            update: self.sync_update.clone().into_iter().collect(),
            more: false,
        })
    }

    async fn run_pod_sandbox(
        &self,
        _: api::RunPodSandboxRequest,
    ) -> Result<api::RunPodSandboxResponse, Status> {
        self.note("RunPodSandbox");
        Ok(Default::default())
    }

    async fn create_container(
        &self,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, Status> {
        if self.hang {
            std::future::pending::<()>().await;
        }
        self.note(format!("CreateContainer {}", req.container.unwrap().id));
        Ok(api::CreateContainerResponse {
            adjust: self.adjust.clone(),
            ..Default::default()
        })
    }

    async fn post_create_container(
        &self,
        _: api::PostCreateContainerRequest,
    ) -> Result<api::PostCreateContainerResponse, Status> {
        if self.legacy {
            return Err(Status::new(code::UNIMPLEMENTED, "unknown method"));
        }
        self.note("PostCreateContainer");
        Ok(Default::default())
    }

    async fn update_pod_sandbox(
        &self,
        _: api::UpdatePodSandboxRequest,
    ) -> Result<api::UpdatePodSandboxResponse, Status> {
        if self.legacy {
            return Err(Status::new(code::UNIMPLEMENTED, "unknown method"));
        }
        Ok(Default::default())
    }

    async fn state_change(&self, req: api::StateChangeEvent) -> Result<api::Empty, Status> {
        self.note(format!("StateChange {:?}", req.event()));
        Ok(api::Empty {})
    }

    async fn validate_container_adjustment(
        &self,
        req: api::ValidateContainerAdjustmentRequest,
    ) -> Result<api::ValidateContainerAdjustmentResponse, Status> {
        self.note(format!("Validate {}", req.plugins.len()));
        Ok(api::ValidateContainerAdjustmentResponse {
            reject: self.reject.is_some(),
            reason: self.reject.clone().unwrap_or_default(),
        })
    }
}

struct Setup {
    nri: Nri,
    runtime: Arc<FakeRuntime>,
    socket: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

async fn setup(request_timeout: Duration) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri/nri.sock");
    let config = Config {
        socket_path: socket.clone(),
        plugin_path: dir.path().join("plugins"),
        plugin_config_path: dir.path().join("conf.d"),
        registration_timeout: Duration::from_millis(500),
        request_timeout,
        disable_connections: false,
        runtime_name: "crishim".into(),
        runtime_version: "test".into(),
    };
    let runtime = Arc::new(FakeRuntime::default());
    let nri = Nri::start(config, runtime.clone()).await.unwrap();
    Setup {
        nri,
        runtime,
        socket,
        log: Arc::default(),
        _dir: dir,
    }
}

impl Setup {
    /// Connects `plugin` as `idx-name` and waits until it is registered and synchronized.
    async fn connect(&self, idx: &str, mut plugin: TestPlugin) {
        plugin.name = format!("{idx}-{}", plugin.name);
        plugin.log = self.log.clone();
        let name = plugin.name.clone();
        let base = name.split_once('-').unwrap().1.to_string();
        let stub = Stub::connect(&self.socket, &base, idx).await.unwrap();
        tokio::spawn(stub.run(Arc::new(plugin)));
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.nri.plugins().contains(&name) {
            assert!(Instant::now() < deadline, "{name} did not register");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// What plugins heard, but validation (plugins that subscribe to every event validate).
    fn log(&self) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter(|l| !l.contains(" Validate "))
            .cloned()
            .collect()
    }
}

/// A plugin that sets env `key=value`.
fn adjusting(name: &str, key: &str, value: &str) -> TestPlugin {
    TestPlugin {
        name: name.into(),
        adjust: Some(env(key, value)),
        ..Default::default()
    }
}

fn env(key: &str, value: &str) -> api::ContainerAdjustment {
    api::ContainerAdjustment {
        env: vec![api::KeyValue {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    }
}

const T: Duration = Duration::from_secs(2);

#[tokio::test]
async fn plugins_register_synchronize_and_hear_events_in_index_order() {
    let s = setup(T).await;
    // Connected out of order: called in index order.
    s.connect(
        "20",
        TestPlugin {
            name: "b".into(),
            ..Default::default()
        },
    )
    .await;
    s.connect(
        "10",
        TestPlugin {
            name: "a".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(s.nri.plugins(), ["10-a", "20-b"]);
    let log = s.log();
    assert!(
        log.contains(&"20-b Configure crishim 2000".to_string()),
        "{log:?}"
    );
    assert!(log.contains(&"10-a Synchronize 1 1".to_string()), "{log:?}");

    s.log.lock().unwrap().clear();
    s.nri.run_pod_sandbox(&pod()).await.unwrap();
    s.nri
        .create_container(&pod(), &container("c1"))
        .await
        .unwrap();
    assert_eq!(
        s.log(),
        [
            "10-a RunPodSandbox",
            "20-b RunPodSandbox",
            "10-a CreateContainer c1",
            "20-b CreateContainer c1"
        ]
    );
}

#[tokio::test]
async fn a_plugin_hears_only_the_events_it_subscribed_to() {
    let s = setup(T).await;
    let only_create = TestPlugin {
        name: "picky".into(),
        events: vec![Event::CreateContainer],
        ..Default::default()
    };
    s.connect("10", only_create).await;
    s.log.lock().unwrap().clear();
    s.nri.run_pod_sandbox(&pod()).await.unwrap();
    s.nri
        .create_container(&pod(), &container("c1"))
        .await
        .unwrap();
    s.nri.post_create_container(&pod(), &container("c1")).await;
    assert_eq!(s.log(), ["10-picky CreateContainer c1"]);
}

#[tokio::test]
async fn adjustments_merge_and_two_plugins_setting_one_field_fail_naming_both() {
    let s = setup(T).await;
    s.connect("10", adjusting("a", "A", "1")).await;
    s.connect("20", adjusting("b", "B", "2")).await;
    let merged = s
        .nri
        .create_container(&pod(), &container("c1"))
        .await
        .unwrap();
    let mut keys: Vec<_> = merged.adjust.env.iter().map(|kv| kv.key.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["A", "B"]);

    s.connect("30", adjusting("c", "A", "3")).await;
    let e = s
        .nri
        .create_container(&pod(), &container("c2"))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("10-a") && e.contains("30-c"), "{e}");
}

#[tokio::test]
async fn a_plugin_that_hangs_costs_its_timeout_once_and_is_dropped() {
    let s = setup(Duration::from_millis(300)).await;
    s.connect(
        "10",
        TestPlugin {
            name: "stuck".into(),
            hang: true,
            ..Default::default()
        },
    )
    .await;
    s.connect("20", adjusting("fine", "OK", "1")).await;
    let start = Instant::now();
    let merged = s
        .nri
        .create_container(&pod(), &container("c1"))
        .await
        .unwrap();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(merged.adjust.env.len(), 1, "the others' adjustments stand");
    assert_eq!(s.nri.plugins(), ["20-fine"]);
    let start = Instant::now();
    s.nri
        .create_container(&pod(), &container("c2"))
        .await
        .unwrap();
    assert!(start.elapsed() < Duration::from_millis(250));
}

#[tokio::test]
async fn a_plugin_without_an_events_own_rpc_gets_state_change() {
    let s = setup(T).await;
    s.connect(
        "10",
        TestPlugin {
            name: "old".into(),
            legacy: true,
            ..Default::default()
        },
    )
    .await;
    s.log.lock().unwrap().clear();
    s.nri.post_create_container(&pod(), &container("c1")).await;
    assert_eq!(s.log(), ["10-old StateChange PostCreateContainer"]);
    assert_eq!(s.nri.plugins(), ["10-old"], "not dropped for it");
    // An event it has neither RPC nor StateChange for: nothing to say, and no failure.
    s.nri.update_pod_sandbox(&pod(), None, None).await.unwrap();
    assert_eq!(s.nri.plugins(), ["10-old"]);
}

#[tokio::test]
async fn a_validator_rejects_a_merged_adjustment_by_name() {
    let s = setup(T).await;
    s.connect("10", adjusting("a", "A", "1")).await;
    let validator = TestPlugin {
        name: "policy".into(),
        events: vec![Event::ValidateContainerAdjustment],
        reject: Some("no env changes allowed".into()),
        ..Default::default()
    };
    s.connect("90", validator).await;
    let e = s
        .nri
        .create_container(&pod(), &container("c1"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("90-policy") && e.contains("no env changes allowed"),
        "{e}"
    );
    assert!(s
        .log
        .lock()
        .unwrap()
        .contains(&"90-policy Validate 2".to_string()));
}

#[tokio::test]
async fn synchronization_updates_reach_the_runtime() {
    let s = setup(T).await;
    let update = api::ContainerUpdate {
        container_id: "existing".into(),
        ..Default::default()
    };
    s.connect(
        "10",
        TestPlugin {
            name: "a".into(),
            sync_update: Some(update),
            ..Default::default()
        },
    )
    .await;
    let deadline = Instant::now() + T;
    while s.runtime.updates.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "no update arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        s.runtime.updates.lock().unwrap()[0].container_id,
        "existing"
    );
}

#[tokio::test]
async fn a_connection_that_never_registers_is_closed_and_others_still_register() {
    let s = setup(T).await;
    let mut silent = tokio::net::UnixStream::connect(&s.socket).await.unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 1];
    use tokio::io::AsyncReadExt;
    let n = tokio::time::timeout(Duration::from_secs(3), silent.read(&mut buf))
        .await
        .expect("closed within the registration timeout")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(start.elapsed() >= Duration::from_millis(450));
    s.connect(
        "10",
        TestPlugin {
            name: "a".into(),
            ..Default::default()
        },
    )
    .await;
}

#[tokio::test]
async fn the_socket_is_roots_alone_and_shutdown_drops_every_plugin() {
    let s = setup(T).await;
    let mode = std::fs::metadata(&s.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    s.connect(
        "10",
        TestPlugin {
            name: "a".into(),
            ..Default::default()
        },
    )
    .await;
    s.nri.shutdown();
    assert!(s.nri.plugins().is_empty());
    assert!(!s.nri.has_plugins());
}

#[test]
fn pre_installed_plugins_must_be_roots_and_named_nn_name() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, mode: u32| {
        let p = dir.path().join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    write("20-b", 0o755);
    write("10-a", 0o700);
    write("no-index", 0o755);
    write("30-not-exec", 0o644);
    write("40-writable", 0o777);
    std::os::unix::fs::symlink(dir.path().join("10-a"), dir.path().join("50-link")).unwrap();
    let found: Vec<_> = launch::discover(dir.path())
        .unwrap()
        .into_iter()
        .map(|(i, b, _)| format!("{i}-{b}"))
        .collect();
    assert_eq!(found, ["10-a", "20-b"]);
    assert!(launch::discover(&dir.path().join("absent"))
        .unwrap()
        .is_empty());
}
