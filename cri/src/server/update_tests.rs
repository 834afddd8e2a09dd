//! Unit tests of UpdateContainerResources and ReopenContainerLog against the fake shims
//! (`fakes.rs`): what reaches the shim, what is recorded, and what is refused before. The
//! limits a real cgroup then enforces (and ContainerStatus reads back) are for the integration
//! tests in `tests/`.

use crishim_proto::cri::runtime_service_server::RuntimeService as _;
use crishim_proto::cri::{self, LinuxContainerResources};
use crishim_proto::shim::Request as ShimRequest;
use tonic::{Code, Request, Status};

use super::fakes::TestNode;

type Node = TestNode;

impl TestNode {
    async fn update_resources(
        &self,
        id: &str,
        linux: Option<LinuxContainerResources>,
    ) -> Result<(), Status> {
        let req = cri::UpdateContainerResourcesRequest {
            container_id: id.into(),
            linux,
            ..Default::default()
        };
        self.svc
            .update_container_resources(Request::new(req))
            .await
            .map(drop)
    }

    async fn reopen_log(&self, id: &str) -> Result<(), Status> {
        let req = cri::ReopenContainerLogRequest {
            container_id: id.into(),
        };
        self.svc
            .reopen_container_log(Request::new(req))
            .await
            .map(drop)
    }

    /// The `Update` requests the shims got: pod, container and limits.
    fn updates(&self) -> Vec<(String, String, oci_spec::runtime::LinuxResources)> {
        let update = |(pod, r)| match r {
            ShimRequest::Update { id, resources } => Some((pod, id, *resources)),
            _ => None,
        };
        self.shims.sent().into_iter().filter_map(update).collect()
    }

    /// The resources the container's record holds (what a restart or a status goes by).
    fn recorded_resources(&self, id: &str) -> Option<LinuxContainerResources> {
        let c = self.svc.inner.store.container(id).unwrap();
        c.config.linux.and_then(|l| l.resources)
    }

    /// How many requests named `name` the shims got.
    fn sent_count(&self, name: &str) -> usize {
        self.shims.requests().iter().filter(|r| *r == name).count()
    }
}

/// The limits an in-place resize asks for.
fn resized() -> LinuxContainerResources {
    LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 512,
        memory_limit_in_bytes: 128 << 20,
        ..Default::default()
    }
}

/// A running container's new limits reach its shim as OCI resources under its full id (given
/// the 13-character one), and replace the old ones in its record.
#[tokio::test]
async fn update_container_resources_sends_the_new_limits_to_the_shim_and_records_them() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;

    node.update_resources(&c[..13], Some(resized()))
        .await
        .unwrap();
    let updates = node.updates();
    let [(to, id, r)] = updates.as_slice() else {
        panic!("one Update expected: {updates:?}");
    };
    assert_eq!((to, id), (&pod, &c));
    let cpu = r.cpu().clone().expect("CPU limits");
    assert_eq!(
        (cpu.period(), cpu.quota(), cpu.shares()),
        (Some(100_000), Some(50_000), Some(512))
    );
    let memory = r.memory().expect("a memory limit");
    assert_eq!(memory.limit(), Some(128 << 20));
    assert_eq!(node.recorded_resources(&c), Some(resized()));
}

/// An exited container's update is refused by its shim (no cgroup is left to change):
/// `FailedPrecondition` naming it, and the record keeps its old limits.
#[tokio::test]
async fn an_exited_containers_update_is_refused_and_not_recorded() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;
    node.stop(&c, 1).await.unwrap();
    let before = node.recorded_resources(&c);

    let e = node
        .update_resources(&c, Some(resized()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains(&c) && e.message().contains("exited"),
        "{e:?}"
    );
    assert_eq!(node.recorded_resources(&c), before);
}

/// Once its pod is stopped, a container's update is `FailedPrecondition` as for an exited one
/// (as ExecSync, Exec and Attach answer then): its shim is gone for good, so `Unavailable`
/// would have the kubelet retry what cannot succeed.
#[tokio::test]
async fn an_update_in_a_stopped_pod_is_failed_precondition_not_unavailable() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;
    node.stop_pod(&pod).await.unwrap();
    let e = node
        .update_resources(&c, Some(resized()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
}

/// Resources that no cgroup can take (a negative share, a `unified` key that leaves the
/// container's cgroup), or none at all, are `InvalidArgument` saying which; an unknown id is
/// `NotFound`. None reaches a shim or the record.
#[tokio::test]
async fn invalid_resources_and_unknown_ids_are_refused_before_the_shim() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;
    let before = node.recorded_resources(&c);

    let negative = LinuxContainerResources {
        cpu_shares: -5,
        ..Default::default()
    };
    let escaping = LinuxContainerResources {
        unified: [("../memory.max".to_string(), "1".to_string())].into(),
        ..Default::default()
    };
    let cases = [
        (Some(negative), "cpu_shares -5 is negative"),
        (
            Some(escaping),
            "\"../memory.max\" is not a cgroup file name",
        ),
        (None, "linux resources are required"),
    ];
    for (linux, why) in cases {
        let e = node.update_resources(&c, linux).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().starts_with("UpdateContainerResources: ") && e.message().contains(why),
            "{e:?}"
        );
    }
    let e = node
        .update_resources("zz", Some(resized()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("\"zz\""), "{e:?}");

    assert!(node.updates().is_empty(), "{:?}", node.updates());
    assert_eq!(node.recorded_resources(&c), before);
}

/// After the kubelet rotates a running container's log, the reopen goes to its shim under its
/// full id.
#[tokio::test]
async fn reopen_container_log_of_a_running_container_reaches_its_shim() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let c = node.running(&pod, "app").await;
    node.reopen_log(&c[..13]).await.unwrap();
    let reopened: Vec<_> = node
        .shims
        .sent()
        .into_iter()
        .filter(|(_, r)| matches!(r, ShimRequest::ReopenLog { .. }))
        .collect();
    assert_eq!(reopened, [(pod, ShimRequest::ReopenLog { id: c })]);
}

/// A container that is not running (created, exited, or in a stopped pod) has no log being
/// written: `FailedPrecondition` naming it, and its shim is not asked. An unknown id is
/// `NotFound`.
#[tokio::test]
async fn reopen_container_log_of_a_container_that_is_not_running_is_failed_precondition() {
    let node = Node::new();
    let pod = node.run_pod("web").await.unwrap();
    let created = node.create(&pod, "created").await.unwrap();
    let exited = node.running(&pod, "exited").await;
    node.stop(&exited, 1).await.unwrap();
    let other = node.run_pod("other").await.unwrap();
    let stopped = node.running(&other, "app").await;
    node.stop_pod(&other).await.unwrap();

    for id in [&created, &exited, &stopped] {
        let e = node.reopen_log(id).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message().contains(id.as_str()) && e.message().contains("not running"),
            "{e:?}"
        );
    }
    let e = node.reopen_log("zz").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert_eq!(node.sent_count("ReopenLog"), 0);
}
