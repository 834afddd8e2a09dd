//! Unit tests of RunPodSandbox, StopPodSandbox and RemovePodSandbox against fake shims, a fake
//! CNI network and fake pod files (`fakes.rs`): the handlers' ordering, rollback and records,
//! each case in milliseconds, with no process, mount or namespace made. The integration tests
//! in `tests/` run the same paths on the host.

use std::path::PathBuf;

use crishim_proto::cri::runtime_service_server::RuntimeService as _;
use crishim_proto::cri::{self, ContainerState as CriState};
use tonic::{Code, Request};

use super::fakes::{self, Calls, TestNode, POD_IPS};

type Node = TestNode;

impl TestNode {
    async fn container_state(&self, id: &str) -> Result<(CriState, i32), tonic::Status> {
        let req = cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let r = self.svc.container_status(Request::new(req)).await?;
        let s = r.into_inner().status.expect("a status");
        Ok((CriState::try_from(s.state).unwrap(), s.exit_code))
    }

    fn netns(&self, pod: &str) -> PathBuf {
        self.svc.inner.netns_path(pod)
    }

    fn shm(&self, pod: &str) -> PathBuf {
        self.svc.inner.pod_state_dir(pod).join("shm")
    }

    /// The pod whose shim the fakes were last asked to start (a failed run returns no id).
    fn last_started(&self) -> String {
        let calls = self.calls.all();
        let start = calls
            .iter()
            .rev()
            .find_map(|c| c.strip_prefix("shim start "));
        start.expect("a shim was started").to_string()
    }

    /// Nothing of pod `id` is left: no record, shim, network, namespace, /dev/shm or directory.
    async fn assert_gone(&self, id: &str) {
        assert!(self.pods().await.iter().all(|p| p.id != id), "record left");
        assert!(!self.svc.inner.store.has_pods(), "record left");
        assert!(!self.shims.running(id), "shim left running");
        assert!(!self.network.attached().contains(id), "addresses held");
        assert!(
            self.network.pinned().is_empty(),
            "network namespace left pinned"
        );
        assert!(!self.netns(id).exists(), "network namespace left");
        assert!(self.files.shm_mounted().is_empty(), "/dev/shm left mounted");
        for dir in self.svc.inner.pod_dirs(id) {
            assert!(!dir.exists(), "{} left", dir.display());
        }
    }
}

fn position(calls: &Calls, call: &str) -> usize {
    calls
        .position(call)
        .unwrap_or_else(|| panic!("no {call:?} in {:?}", calls.all()))
}

/// A pod with a CNI network: its namespace is taken before the ADD, its files and /dev/shm are
/// made, its shim is started with the pinned namespace, it is recorded ready, and its status
/// reports the ADD's IPv4 address as the pod IP and the IPv6 one as an additional IP.
#[tokio::test]
async fn run_pod_sandbox_sets_up_network_files_and_shim_and_records_the_pod_ready() {
    let node = Node::new();
    let id = node.run_pod("web").await.unwrap();

    let status = node.pod_status(&id).await.unwrap();
    assert_eq!(status.state, cri::PodSandboxState::SandboxReady as i32);
    let net = status.network.unwrap();
    assert_eq!(net.ip, POD_IPS[1], "the IPv4 address is the pod IP");
    let additional: Vec<_> = net.additional_ips.iter().map(|i| i.ip.as_str()).collect();
    assert_eq!(additional, [POD_IPS[0]]);
    let record = node.svc.inner.store.pod(&id).unwrap();
    assert_eq!(record.infra_pid, fakes::infra_pid());

    // Network: a namespace pinned at the pod's path, then the ADD in it.
    assert_eq!(
        node.network.pinned(),
        [node.netns(&id)].into_iter().collect()
    );
    assert!(node.network.attached().contains(&id));
    assert!(position(&node.calls, "take netns") < position(&node.calls, &format!("cni ADD {id}")));

    // Shim: started once, its infra joining the pinned namespace, with the pod's names.
    assert_eq!(node.calls.count(&format!("shim start {id}")), 1);
    assert!(node.shims.running(&id));
    let infra = node.shims.infra(&id).unwrap();
    assert_eq!(infra.netns, Some(node.netns(&id)));
    assert_eq!(infra.hostname, "web");
    assert!(
        !infra.net,
        "the infra joins the pinned namespace, makes none"
    );
    assert_eq!(infra.pod_uid.as_deref(), Some("uid-web"));

    // Files: hostname, resolv.conf from the DNS config, hosts; /dev/shm mounted.
    let files = node.svc.inner.pod_files_dir(&id);
    let read = |f: &str| std::fs::read_to_string(files.join(f)).unwrap();
    assert_eq!(read("hostname"), "web\n");
    assert_eq!(
        read("resolv.conf"),
        "search default.svc.cluster.local\nnameserver 10.0.0.10\noptions ndots:5\n"
    );
    assert!(read("hosts").starts_with("127.0.0.1\tlocalhost\n"));
    assert_eq!(
        node.files.shm_mounted(),
        [node.shm(&id)].into_iter().collect()
    );

    // The shim's exits are followed from here on.
    let watched = || node.svc.inner.store.watched_count() == 1;
    for _ in 0..200 {
        if watched() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(watched(), "the pod's shim is watched");
}

/// A pod without a CNI config gets loopback only: no namespace taken, no ADD, no IP.
#[tokio::test]
async fn without_a_cni_config_a_pod_gets_loopback_only() {
    let node = Node::new();
    node.network.remove_config();
    let id = node.run_pod("web").await.unwrap();
    let status = node.pod_status(&id).await.unwrap();
    assert_eq!(status.network.unwrap().ip, "");
    assert!(node.network.pinned().is_empty());
    assert_eq!(node.calls.count(&format!("cni ADD {id}")), 0);
    let infra = node.shims.infra(&id).unwrap();
    assert!(
        infra.net && infra.netns.is_none(),
        "the infra makes its own"
    );
    node.remove_pod(&id).await.unwrap();
    node.assert_gone(&id).await;
}

/// Each failure of RunPodSandbox undoes everything done before it: the shim is shut down and
/// reaped, the network deleted and its namespace released, /dev/shm unmounted, the directories,
/// record and name removed. The kubelet's retry under the same name then succeeds.
#[tokio::test]
async fn a_failed_run_pod_sandbox_is_rolled_back_and_its_retry_succeeds() {
    type Fail = fn(&Node);
    let cases: [(&str, Fail, Code); 4] = [
        (
            "CNI ADD",
            |n| n.network.fail_next_add("no IP left"),
            Code::Unknown,
        ),
        (
            "shim start",
            |n| n.shims.fail_next_start("exec format error"),
            Code::Internal,
        ),
        (
            "pod files",
            |n| n.files.fail_next_write("ENOSPC"),
            Code::Internal,
        ),
        (
            "/dev/shm",
            |n| n.files.fail_next_shm("EPERM"),
            Code::Internal,
        ),
    ];
    for (step, fail, code) in cases {
        let node = Node::new();
        fail(&node);
        let e = node.run_pod("web").await.unwrap_err();
        assert_eq!(e.code(), code, "{step}: {e:?}");
        let id = node.last_started();

        node.assert_gone(&id).await;
        // What was done was undone (the ADD, shim and files run together, so each was tried).
        let calls = node.calls.all();
        let done = |c: &str| calls.iter().any(|x| x == c);
        if step != "shim start" {
            assert!(done(&format!("shim Shutdown {id}")), "{step}: {calls:?}");
        }
        assert!(
            done(&format!("reap shim and infra {id}")),
            "{step}: {calls:?}"
        );
        assert!(done(&format!("cni DEL {id}")), "{step}: {calls:?}");
        assert!(done("remove netns"), "{step}: {calls:?}");
        // /dev/shm is mounted after the files are written, so only when they were.
        if step == "CNI ADD" || step == "shim start" {
            assert!(done("unmount shm"), "{step}: {calls:?}");
        }

        // The kubelet retries under the same name.
        let retry = node
            .run_pod("web")
            .await
            .unwrap_or_else(|e| panic!("{step}: {e:?}"));
        assert_ne!(retry, id);
        let status = node.pod_status(&retry).await.unwrap();
        assert_eq!(status.state, cri::PodSandboxState::SandboxReady as i32);
    }
}

/// A second pod with the name of a live one is refused, and the refusal touches nothing.
#[tokio::test]
async fn a_taken_pod_name_is_refused_before_anything_is_made() {
    let node = Node::new();
    let id = node.run_pod("web").await.unwrap();
    node.calls.clear();
    let e = node.run_pod("web").await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert!(node.calls.all().is_empty(), "{:?}", node.calls.all());
    assert!(node.shims.running(&id));
}

/// StopPodSandbox: the shim is shut down (it kills the containers, whose final states are
/// recorded), then reaped; the network is deleted and its namespace released; /dev/shm is
/// unmounted; the pod is not ready and keeps its containers and files. A second stop succeeds
/// and does nothing more.
#[tokio::test]
async fn stop_pod_sandbox_stops_containers_shim_and_network_and_is_idempotent() {
    let node = Node::new();
    let id = node.run_pod("web").await.unwrap();
    let c = node.running(&id, "app").await;
    assert_eq!(
        node.container_state(&c).await.unwrap().0,
        CriState::ContainerRunning
    );
    node.calls.clear();

    node.stop_pod(&id).await.unwrap();
    let shutdown = position(&node.calls, &format!("shim Shutdown {id}"));
    let reaped = position(&node.calls, &format!("reap shim and infra {id}"));
    assert!(shutdown < reaped, "{:?}", node.calls.all());
    assert_eq!(node.calls.count(&format!("cni DEL {id}")), 1);
    assert_eq!(node.calls.count("remove netns"), 1);
    assert_eq!(node.calls.count("unmount shm"), 1);
    assert!(!node.shims.running(&id));
    assert!(node.network.pinned().is_empty() && node.network.attached().is_empty());
    assert!(node.files.shm_mounted().is_empty());

    let status = node.pod_status(&id).await.unwrap();
    assert_eq!(status.state, cri::PodSandboxState::SandboxNotready as i32);
    // The container's exit, as the shim left it when it killed it.
    assert_eq!(
        node.container_state(&c).await.unwrap(),
        (CriState::ContainerExited, 137)
    );
    assert!(node.svc.inner.pod_files_dir(&id).join("hostname").exists());

    node.calls.clear();
    node.stop_pod(&id).await.unwrap();
    let calls = node.calls.all();
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("cni DEL") || c == "remove netns"),
        "a second stop has no network to tear down: {calls:?}"
    );
    assert_eq!(
        node.pod_status(&id).await.unwrap().state,
        cri::PodSandboxState::SandboxNotready as i32
    );
    let e = node.stop_pod("no-such-pod").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

/// A CNI DEL that fails fails the stop, with the plugin's error, and keeps the namespace and
/// the addresses for the retry; the processes are stopped anyway. The next stop deletes it.
#[tokio::test]
async fn a_failed_cni_del_is_reported_and_the_next_stop_finishes_it() {
    let node = Node::new();
    let id = node.run_pod("web").await.unwrap();
    node.network.fail_dels(1);

    let e = node.stop_pod(&id).await.unwrap_err();
    assert_eq!(e.code(), Code::Unknown, "{e:?}");
    assert!(e.message().contains("the IPAM store is locked"), "{e:?}");
    assert!(!node.shims.running(&id), "the shim is stopped anyway");
    assert_eq!(
        node.pod_status(&id).await.unwrap().state,
        cri::PodSandboxState::SandboxNotready as i32
    );
    assert!(node.network.attached().contains(&id), "kept for the retry");
    assert!(node.network.pinned().contains(&node.netns(&id)));

    node.stop_pod(&id).await.unwrap();
    assert_eq!(node.calls.count(&format!("cni DEL {id}")), 2);
    assert!(node.network.attached().is_empty());
    assert!(node.network.pinned().is_empty());
}

/// RemovePodSandbox on a running pod stops it first (shim, network), then removes its
/// containers (their root filesystems released), directories, record and name; removing it
/// again, or a pod never known, succeeds.
#[tokio::test]
async fn remove_pod_sandbox_stops_a_running_pod_then_removes_everything_and_is_idempotent() {
    let node = Node::new();
    let id = node.run_pod("web").await.unwrap();
    let c = node.running(&id, "app").await;
    assert!(node.host.mounted().contains(&c));
    node.calls.clear();

    node.remove_pod(&id).await.unwrap();
    let shutdown = position(&node.calls, &format!("shim Shutdown {id}"));
    let del = position(&node.calls, &format!("cni DEL {id}"));
    let state_dir = node.svc.inner.pod_state_dir(&id);
    let removed = position(&node.calls, &format!("remove {}", state_dir.display()));
    assert!(
        shutdown < removed && del < removed,
        "{:?}",
        node.calls.all()
    );
    node.assert_gone(&id).await;
    assert!(
        node.host.mounted().is_empty(),
        "the container's rootfs is released"
    );
    assert_eq!(
        node.container_state(&c).await.unwrap_err().code(),
        Code::NotFound
    );
    assert!(!node.svc.inner.bundle_dir(&c).exists());
    assert_eq!(
        node.pod_status(&id).await.unwrap_err().code(),
        Code::NotFound
    );

    node.remove_pod(&id).await.unwrap();
    node.remove_pod("no-such-pod").await.unwrap();

    // The name is free again.
    let again = node.run_pod("web").await.unwrap();
    assert_ne!(again, id);
}

/// RemovePodSandbox of a stopped pod tears down nothing twice: the network went at the stop.
#[tokio::test]
async fn remove_after_stop_does_not_delete_the_network_again() {
    let node = Node::new();
    let id = node.run_pod("web").await.unwrap();
    node.stop_pod(&id).await.unwrap();
    node.calls.clear();
    node.remove_pod(&id).await.unwrap();
    assert_eq!(
        node.calls.count(&format!("cni DEL {id}")),
        0,
        "{:?}",
        node.calls.all()
    );
    assert_eq!(node.calls.count(&format!("shim start {id}")), 0);
    node.assert_gone(&id).await;
}
