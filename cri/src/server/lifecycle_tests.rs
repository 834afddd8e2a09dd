//! Unit tests of the lifecycle handlers (create, start, stop, remove, list, status, recover)
//! against a fake shim and a fake host: the handlers' own logic, each case in milliseconds. The
//! integration tests in `tests/` run the same paths with real shims, mounts and processes.

use crishim_proto::cri::runtime_service_server::RuntimeService as _;
use crishim_proto::cri::{self, ContainerState as CriState};
use crishim_proto::shim::{ErrorKind, Response, Status as ShimStatus};
use crishim_state::records::{now_nanos, ContainerRecord, PodRecord, PodState};
use tonic::{Code, Request};

use super::fakes::{pod_record, TestNode, IMAGE};

type Node = TestNode;

impl TestNode {
    /// A ready pod (host network, so no CNI) whose shim runs.
    fn pod(&self, name: &str) -> String {
        let id = crishim_state::records::new_id().unwrap();
        let record = PodRecord {
            config: cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: name.into(),
                    uid: format!("uid-{name}"),
                    namespace: "default".into(),
                    attempt: 0,
                }),
                ..Default::default()
            },
            created_at: now_nanos(),
            ..pod_record(&id)
        };
        // What RunPodSandbox writes for its containers.
        let files = self.svc.inner.pod_files_dir(&id);
        std::fs::create_dir_all(&files).unwrap();
        for f in ["hostname", "resolv.conf", "hosts"] {
            std::fs::write(files.join(f), "").unwrap();
        }
        self.svc.inner.store.save_pod(&record).unwrap();
        self.shims.add_pod(&id);
        id
    }

    /// Whether the container's record is on disk, as a restarted daemon would find it.
    fn recorded(&self, id: &str) -> bool {
        crishim_state::records::RecordDir::new(self.dir.path().join("root/records/containers"))
            .unwrap()
            .load_all::<crishim_state::records::ContainerRecord>()
            .records
            .iter()
            .any(|r| r.id == id)
    }
}

fn state_of(s: &cri::ContainerStatus) -> CriState {
    CriState::try_from(s.state).unwrap()
}

#[tokio::test]
async fn a_container_is_created_started_stopped_and_removed_through_its_shim() {
    use std::os::unix::fs::PermissionsExt;
    let node = Node::new();
    let pod = node.pod("web");
    let id = node.create(&pod, "app").await.unwrap();

    // Created: a record, a rootfs, a root-only config.json holding the environment.
    assert_eq!(node.shims.requests(), ["Create"]);
    assert!(node.host.mounted().contains(&id));
    let config = node
        .dir
        .path()
        .join(format!("state/containers/{id}/config.json"));
    let mode = std::fs::metadata(&config).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "config.json carries the environment's secrets");
    assert!(std::fs::read_to_string(&config)
        .unwrap()
        .contains("SECRET=s3cr3t"));
    assert!(node.recorded(&id));
    assert_eq!(
        state_of(&node.status(&id).await.unwrap()),
        CriState::ContainerCreated
    );

    node.start(&id).await.unwrap();
    assert_eq!(
        state_of(&node.status(&id[..13]).await.unwrap()),
        CriState::ContainerRunning
    );

    // The image's stop signal (SIGQUIT) first; the fake exits on it.
    node.stop(&id[..13], 5).await.unwrap();
    assert!(
        node.shims
            .requests()
            .contains(&format!("Kill {}", libc::SIGQUIT)),
        "{:?}",
        node.shims.requests()
    );
    let st = node.status(&id).await.unwrap();
    assert_eq!(state_of(&st), CriState::ContainerExited);
    assert_eq!(st.exit_code, 128 + libc::SIGQUIT);
    node.stop(&id, 5)
        .await
        .expect("stopping an exited container succeeds");

    node.remove(&id).await.unwrap();
    assert!(
        node.shims.requests().ends_with(&["Delete".to_string()]),
        "{:?}",
        node.shims.requests()
    );
    assert!(!node.host.mounted().contains(&id), "the rootfs is released");
    assert!(!node.recorded(&id), "the record is gone");
    assert!(node.containers().await.is_empty());
    assert_eq!(node.status(&id).await.unwrap_err().code(), Code::NotFound);
    node.remove(&id).await.expect("removing twice succeeds");
    // Its name is free again.
    node.create(&pod, "app").await.unwrap();
}

#[tokio::test]
async fn create_refuses_a_taken_name_a_missing_image_and_a_pod_that_is_not_ready() {
    let node = Node::new();
    let pod = node.pod("web");
    node.create(&pod, "app").await.unwrap();
    let taken = node.create(&pod, "app").await.unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists, "{taken:?}");
    assert!(
        taken.message().contains("reserved by container"),
        "{taken:?}"
    );

    let mut req = cri::CreateContainerRequest {
        pod_sandbox_id: pod.clone(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "other".into(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: "nosuch:1".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        sandbox_config: None,
    };
    let missing = node
        .svc
        .create_container(Request::new(req.clone()))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert!(missing.message().contains("pull it first"), "{missing:?}");

    req.pod_sandbox_id = "f".repeat(64);
    let no_pod = node
        .svc
        .create_container(Request::new(req))
        .await
        .unwrap_err();
    assert_eq!(no_pod.code(), Code::NotFound);

    let mut record = node.svc.inner.store.pod(&pod).unwrap();
    record.state = PodState::NotReady;
    node.svc.inner.store.save_pod(&record).unwrap();
    let stopped = node.create(&pod, "late").await.unwrap_err();
    assert_eq!(stopped.code(), Code::FailedPrecondition);
    assert_eq!(node.containers().await.len(), 1);
}

#[tokio::test]
async fn a_create_the_shim_refuses_is_undone_everywhere() {
    let node = Node::new();
    let pod = node.pod("web");
    node.shims.refuse_next_create(Response::error(
        ErrorKind::FailedPrecondition,
        "no such file",
    ));
    let e = node.create(&pod, "app").await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(node.host.mounted().is_empty(), "the rootfs is released");
    assert!(node.containers().await.is_empty(), "no record is left");
    let bundles = node.dir.path().join("state/containers");
    assert_eq!(std::fs::read_dir(&bundles).map_or(0, |d| d.count()), 0);
    node.create(&pod, "app")
        .await
        .expect("the name was released");
}

#[tokio::test]
async fn stop_sends_sigkill_to_every_process_when_the_stop_signal_is_ignored() {
    let node = Node::new();
    let pod = node.pod("web");
    let id = node.create(&pod, "app").await.unwrap();
    node.start(&id).await.unwrap();
    node.shims.ignore_signal(libc::SIGQUIT);
    node.stop(&id, 1).await.unwrap();
    let kills: Vec<_> = node
        .shims
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("Kill"))
        .collect();
    assert_eq!(
        kills,
        [
            format!("Kill {}", libc::SIGQUIT),
            format!("Kill {} all", libc::SIGKILL)
        ]
    );
    assert_eq!(
        node.status(&id).await.unwrap().exit_code,
        128 + libc::SIGKILL
    );
}

#[tokio::test]
async fn ids_resolve_by_prefix_and_unknown_ids_are_refused_with_clear_codes() {
    let node = Node::new();
    let pod = node.pod("web");
    let id = node.create(&pod, "app").await.unwrap();
    assert_eq!(node.status(&id[..5]).await.unwrap().id, id);
    let asked = node.shims.requests();
    assert_eq!(
        node.start("").await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(node.start("zz").await.unwrap_err().code(), Code::NotFound);
    assert_eq!(node.stop("zz", 1).await.unwrap_err().code(), Code::NotFound);
    node.remove("zz")
        .await
        .expect("removing an unknown container succeeds");
    // No request reached a shim for any of them.
    assert_eq!(node.shims.requests(), asked);
}

#[tokio::test]
async fn list_and_status_read_the_store_once_the_pods_shim_is_watched() {
    let node = Node::new();
    let pod = node.pod("web");
    let id = node.create(&pod, "app").await.unwrap();
    node.start(&id).await.unwrap();
    node.svc.inner.watch_pod(&pod);
    wait_for(|| {
        node.svc
            .inner
            .store
            .watched_state(&container(&node, &id))
            .is_some()
    })
    .await;

    let before = node.shims.requests().len();
    for _ in 0..10 {
        assert_eq!(node.containers().await.len(), 1);
        assert_eq!(
            state_of(&node.status(&id).await.unwrap()),
            CriState::ContainerRunning
        );
    }
    assert_eq!(node.shims.requests().len(), before, "no shim was asked");

    // An exit arrives on the watch stream, and the store has it with no question asked.
    let _ = node
        .svc
        .inner
        .shim_call(
            &pod,
            &crishim_proto::shim::Request::Kill {
                id: id.clone(),
                signal: libc::SIGTERM,
                all: false,
            },
            std::time::Duration::from_secs(1),
        )
        .await;
    wait_for(|| {
        container(&node, &id)
            .last
            .is_some_and(|s| s.status == ShimStatus::Exited)
    })
    .await;
    let st = node.status(&id).await.unwrap();
    assert_eq!(
        (state_of(&st), st.exit_code),
        (CriState::ContainerExited, 128 + libc::SIGTERM)
    );
}

#[tokio::test]
async fn recovery_rolls_back_half_creates_follows_live_pods_and_marks_dead_shims() {
    let node = Node::new();
    let live = node.pod("live");
    let dead = node.pod("dead");
    let running = node.create(&live, "app").await.unwrap();
    node.start(&running).await.unwrap();
    let orphan = node.create(&dead, "app").await.unwrap();
    node.start(&orphan).await.unwrap();
    // A create a crash cut short: a record without any shim state.
    let mut half = container(&node, &running);
    half.id = "e".repeat(64);
    half.config.metadata.as_mut().unwrap().name = "half".into();
    half.last = None;
    node.svc.inner.store.save_container(&half).unwrap();

    // The daemon restarts over the same records; the dead pod's shim died meanwhile.
    let Node { dir, shims, .. } = node;
    shims.kill_shim(&dead);
    let node = Node::open(dir, shims);
    node.svc.recover().await;

    assert!(!node.recorded(&half.id), "the half create is rolled back");
    assert_eq!(
        node.status(&half.id).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        state_of(&node.status(&running).await.unwrap()),
        CriState::ContainerRunning
    );
    wait_for(|| {
        node.svc
            .inner
            .store
            .watched_state(&container(&node, &running))
            .is_some()
    })
    .await;

    let st = node.status(&orphan).await.unwrap();
    assert_eq!(
        (state_of(&st), st.exit_code),
        (CriState::ContainerExited, 255)
    );
    assert!(st.message.contains("shim is gone"), "{st:?}");
    assert_eq!(
        node.svc.inner.store.pod(&dead).unwrap().state,
        PodState::NotReady
    );
    assert_eq!(
        node.svc.inner.store.pod(&live).unwrap().state,
        PodState::Ready
    );
}

#[tokio::test]
async fn more_than_32_image_volumes_are_refused_and_nothing_stays_mounted() {
    let node = Node::new();
    let pod = node.pod("web");
    let volume = |n: usize| cri::Mount {
        container_path: format!("/v{n}"),
        image: Some(cri::ImageSpec {
            image: IMAGE.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut req = cri::CreateContainerRequest {
        pod_sandbox_id: pod.clone(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "vols".into(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: IMAGE.into(),
                ..Default::default()
            }),
            mounts: (0..33).map(volume).collect(),
            ..Default::default()
        }),
        sandbox_config: None,
    };
    let e = node
        .svc
        .create_container(Request::new(req.clone()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("33 image volumes"), "{e:?}");
    assert!(node.host.mounted().is_empty(), "nothing left mounted");
    // 32 are fine, and all go with the container.
    req.config.as_mut().unwrap().mounts.truncate(32);
    let id = node
        .svc
        .create_container(Request::new(req))
        .await
        .unwrap()
        .into_inner()
        .container_id;
    assert_eq!(node.host.mounted().len(), 33, "the rootfs and 32 volumes");
    node.remove(&id).await.unwrap();
    assert!(node.host.mounted().is_empty(), "{:?}", node.host.mounted());
}

#[tokio::test]
async fn update_pod_sandbox_resources_refuses_what_it_cannot_apply_and_records_the_rest() {
    let node = Node::new();
    let pod = node.pod("web");
    let update = |pod_sandbox_id: String, resources| cri::UpdatePodSandboxResourcesRequest {
        pod_sandbox_id,
        overhead: None,
        resources,
    };
    let call = |r| node.svc.update_pod_sandbox_resources(Request::new(r));
    let none = call(update("f".repeat(64), Some(Default::default())))
        .await
        .unwrap_err();
    assert_eq!(none.code(), Code::NotFound);
    let missing = call(update(pod.clone(), None)).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);
    let negative = cri::LinuxContainerResources {
        cpu_shares: -5,
        ..Default::default()
    };
    let bad = call(update(pod.clone(), Some(negative))).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    // A pod under a parent the daemon did not make: checked, and left to the kubelet.
    let fine = cri::LinuxContainerResources {
        cpu_shares: 512,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    call(update(pod.clone(), Some(fine.clone()))).await.unwrap();
    // Recorded with the pod, as a restarted daemon finds it, whoever enforces the limits.
    let recorded = node.svc.inner.store.pod(&pod).unwrap();
    let linux = recorded.config.linux.unwrap();
    assert_eq!(linux.resources, Some(fine));
    // A refused update records nothing.
    let before = node.svc.inner.store.pod(&pod).unwrap().config;
    let negative = cri::LinuxContainerResources {
        cpu_shares: -5,
        ..Default::default()
    };
    call(update(pod.clone(), Some(negative.clone())))
        .await
        .unwrap_err();
    assert_eq!(node.svc.inner.store.pod(&pod).unwrap().config, before);
    // So does a bad overhead, which is only recorded.
    let mut with_overhead = update(pod.clone(), Some(Default::default()));
    with_overhead.overhead = Some(negative);
    let e = call(with_overhead).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(node.svc.inner.store.pod(&pod).unwrap().config, before);
}

fn container(node: &Node, id: &str) -> ContainerRecord {
    node.svc.inner.store.container(id).unwrap()
}

/// Poll `cond` for up to 5 s (background tasks feed the store).
async fn wait_for(cond: impl Fn() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("condition not met within 5 s");
}

#[tokio::test]
async fn pod_files_are_on_the_state_tmpfs_unless_an_older_daemon_put_them_under_root_dir() {
    let node = Node::new();
    let inner = &node.svc.inner;
    let state = node.dir.path().join("state");
    assert_eq!(
        inner.pod_files_dir("new"),
        state.join(crate::host_files::POD_FILES).join("new")
    );
    assert_eq!(inner.pod_files_dir("new"), inner.state_pod_files_dir("new"));
    let legacy = node.dir.path().join("root/pods/old");
    std::fs::create_dir_all(&legacy).unwrap();
    assert_eq!(inner.pod_files_dir("old"), legacy);
    assert_eq!(inner.legacy_pod_files_dir("old"), legacy);
}

/// The pod `id` as a stop leaves it: not ready, its shim gone, its pinned namespace unpinned.
fn stopped(node: &Node, id: &str) {
    let mut record = node.svc.inner.store.pod(id).unwrap();
    record.state = PodState::NotReady;
    node.svc.inner.store.save_pod(&record).unwrap();
    node.shims.kill_shim(id);
}

/// A process in the host's namespaces (ours), killed when dropped.
struct HostProcess(std::process::Child);

impl HostProcess {
    fn start() -> HostProcess {
        HostProcess(
            std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .unwrap(),
        )
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pid that no process holds any more: a child's, reaped.
fn free_pid() -> i32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    pid
}

/// A port-forward enters the pinned network namespace or none: never `/proc/<infra pid>/ns/net`,
/// which after a stop names whatever process took the pid (here one in the host's namespace,
/// where a listener waits to be reached).
#[tokio::test]
async fn a_port_forward_never_enters_a_namespace_by_the_infra_pid() {
    use crishim_streaming::Backend as _;
    let node = Node::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let backend = super::streaming::StreamingBackend::for_test(&node.svc.inner);

    // Ready, on a network of its own, but no pinned namespace (a stop is removing it).
    let pod = node.pod("web");
    let taker = HostProcess::start();
    let mut record = node.svc.inner.store.pod(&pod).unwrap();
    record.host_network = false;
    record.infra_pid = taker.pid();
    node.svc.inner.store.save_pod(&record).unwrap();
    let e = backend.port_forward(pod.clone(), port).await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("no network namespace"), "{e}");

    // Stopped: refused whatever its network, the host's included.
    stopped(&node, &pod);
    let e = backend.port_forward(pod.clone(), port).await.unwrap_err();
    assert!(e.to_string().contains("not ready"), "{e}");
    let host = node.pod("host");
    stopped(&node, &host);
    let e = backend.port_forward(host, port).await.unwrap_err();
    assert!(e.to_string().contains("not ready"), "{e}");

    let reached = listener.accept();
    assert!(
        matches!(&reached, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the host's listener was reached: {reached:?}"
    );
}

/// Exec, ExecSync, Attach, a streaming session and a create on a stopped pod get
/// `FailedPrecondition` naming the pod, not whatever its gone shim would say.
#[tokio::test]
async fn a_stopped_pods_containers_take_no_exec_attach_or_create() {
    use crishim_streaming::Backend as _;
    let node = Node::new();
    let pod = node.pod("web");
    let id = node.create(&pod, "app").await.unwrap();
    node.start(&id).await.unwrap();
    stopped(&node, &pod);

    let e = node
        .svc
        .exec_sync(Request::new(cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["true".into()],
            timeout: 0,
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains(&pod) && e.message().contains("not ready"),
        "{e:?}"
    );
    let e = node
        .svc
        .exec(Request::new(cri::ExecRequest {
            container_id: id.clone(),
            cmd: vec!["sh".into()],
            stdout: true,
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = node
        .svc
        .attach(Request::new(cri::AttachRequest {
            container_id: id.clone(),
            stdout: true,
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // A URL handed out before the stop: its session is refused when it connects.
    let backend = super::streaming::StreamingBackend::for_test(&node.svc.inner);
    let (_client, gone) = tokio::sync::watch::channel(false);
    let stdio = crishim_streaming::Stdio {
        stdin: None,
        stdout: None,
        stderr: None,
        resize: None,
        tty: false,
        gone,
    };
    let req = cri::ExecRequest {
        container_id: id.clone(),
        cmd: vec!["sh".into()],
        stdout: true,
        ..Default::default()
    };
    let e = backend.exec(req, stdio).await.unwrap_err();
    assert!(e.contains("not ready"), "{e}");

    let e = node.create(&pod, "late").await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
}

/// A ready pod whose infra process is gone (its pid free, or another process's) takes no
/// container: its namespaces would be whatever the pid names. Refused before the shim is asked.
#[tokio::test]
async fn a_create_is_refused_once_the_infra_pid_is_not_the_pods() {
    let node = Node::new();
    let pod = node.pod("web");
    let mut record = node.svc.inner.store.pod(&pod).unwrap();
    record.infra_pid = free_pid();
    node.svc.inner.store.save_pod(&record).unwrap();
    let e = node.create(&pod, "app").await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("has exited"), "{e:?}");

    // The pid is held, by a process whose network namespace is not the pod's pinned one.
    let taker = HostProcess::start();
    record.infra_pid = taker.pid();
    record.host_network = false;
    node.svc.inner.store.save_pod(&record).unwrap();
    let pinned = node.svc.inner.netns_path(&pod);
    std::fs::create_dir_all(pinned.parent().unwrap()).unwrap();
    std::fs::write(&pinned, "").unwrap();
    let e = node.create(&pod, "app").await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("no longer the infra process"), "{e:?}");
    std::fs::remove_file(&pinned).unwrap();
    assert!(
        !node.shims.requests().iter().any(|r| r == "Create"),
        "{:?}",
        node.shims.requests()
    );
}

#[tokio::test]
async fn checkpoints_and_restores_are_unimplemented_and_say_why() {
    let node = Node::new();
    let pod = node.pod("web");
    let e = node
        .svc
        .checkpoint_pod(Request::new(cri::CheckpointPodRequest {
            pod_sandbox_id: pod,
            output_path: "/tmp/checkpoint".into(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    assert!(
        e.message().starts_with("CheckpointPod") && e.message().contains("CRIU"),
        "{e:?}"
    );
    let e = node
        .svc
        .restore_pod(Request::new(cri::RestorePodRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    assert!(e.message().starts_with("RestorePod"), "{e:?}");
}
