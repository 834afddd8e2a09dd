//! Unit tests of StopPodSandbox and RemovePodSandbox given an id prefix, as `crictl pods`
//! prints ids (13 characters) and users paste them, against the fakes (`fakes.rs`).

use crishim_proto::cri;
use crishim_proto::shim::Request as ShimRequest;
use tonic::Code;

use super::fakes::{pod_record, TestNode};

type Node = TestNode;

impl TestNode {
    /// A second ready pod whose id shares `id`'s first 13 characters (and no more), whose shim
    /// runs.
    fn sibling_of(&self, id: &str) -> String {
        let next = if id.as_bytes()[13] == b'0' { "1" } else { "0" };
        let sibling = format!("{}{next}{}", &id[..13], &id[14..]);
        let mut record = pod_record(&sibling);
        record.config.metadata = Some(cri::PodSandboxMetadata {
            name: "sibling".into(),
            uid: "uid-sibling".into(),
            namespace: "default".into(),
            attempt: 0,
        });
        self.svc.inner.store.save_pod(&record).unwrap();
        self.shims.add_pod(&sibling);
        sibling
    }

    /// Whether the pod's shim got a `Shutdown`.
    fn shut_down(&self, pod: &str) -> bool {
        self.shims
            .sent()
            .iter()
            .any(|(to, r)| to == pod && *r == ShimRequest::Shutdown)
    }

    async fn ready(&self, pod: &str) -> bool {
        self.pod_status(pod).await.unwrap().state == cri::PodSandboxState::SandboxReady as i32
    }
}

/// The 13-character id stops the pod it names (its shim, under the full id) and then removes
/// it.
#[tokio::test]
async fn stop_and_remove_pod_sandbox_take_the_13_character_ids_crictl_prints() {
    let node = Node::new();
    let id = node.run_pod("web").await.unwrap();
    let short = &id[..13];

    node.stop_pod(short).await.unwrap();
    assert!(node.shut_down(&id), "{:?}", node.shims.sent());
    assert!(!node.ready(&id).await);
    assert!(!node.shims.running(&id));

    node.remove_pod(short).await.unwrap();
    assert!(node.pods().await.is_empty());
    assert!(!node.svc.inner.store.has_pods(), "record left");
}

/// A prefix two pods share is `InvalidArgument` naming both, for the stop and for the remove
/// (which must not take it for an unknown pod, whose removal succeeds): neither pod is touched.
/// One more character picks one.
#[tokio::test]
async fn an_ambiguous_pod_id_prefix_is_invalid_argument_and_touches_no_pod() {
    let node = Node::new();
    let id = node.run_pod("web").await.unwrap();
    let sibling = node.sibling_of(&id);
    let short = &id[..13];

    let stop = node.stop_pod(short).await.unwrap_err();
    let remove = node.remove_pod(short).await.unwrap_err();
    for e in [stop, remove] {
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        let m = e.message();
        assert!(
            m.contains(&format!("{short:?} is ambiguous"))
                && m.contains(&id)
                && m.contains(&sibling),
            "{e:?}"
        );
    }
    for pod in [&id, &sibling] {
        assert!(!node.shut_down(pod), "{:?}", node.shims.sent());
        assert!(node.shims.running(pod));
        assert!(node.ready(pod).await);
    }

    node.stop_pod(&id[..14]).await.unwrap();
    assert!(node.shut_down(&id) && !node.shut_down(&sibling));
    assert!(node.ready(&sibling).await);
}
