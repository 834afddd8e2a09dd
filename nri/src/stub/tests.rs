use super::*;

use prost::Message as _;
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(5);

/// The runtime's side, faked: it accepts (or refuses) registration and unsolicited updates,
/// and reports what it was sent.
struct FakeRuntime {
    refuse: bool,
    seen: mpsc::UnboundedSender<(String, Bytes)>,
}

impl Handler for FakeRuntime {
    fn handle(&self, service: String, method: String, payload: Bytes) -> HandlerFuture {
        let (refuse, seen) = (self.refuse, self.seen.clone());
        Box::pin(async move {
            assert_eq!(service, api::RUNTIME_SERVICE);
            let _ = seen.send((method.clone(), payload.clone()));
            match method.as_str() {
                "RegisterPlugin" if refuse => {
                    Err(Status::new(code::FAILED_PRECONDITION, "no plugins today"))
                }
                "RegisterPlugin" => Ok(encode(api::Empty {})),
                "UpdateContainers" => {
                    let req: api::UpdateContainersRequest = conn::decode(&payload)?;
                    Ok(encode(api::UpdateContainersResponse { failed: req.update }))
                }
                _ => Err(Status::new(code::UNIMPLEMENTED, method)),
            }
        })
    }
}

/// Subscribes to CreateContainer, adds an env var to every container, asks at Synchronize to
/// update every container, and reports the events it saw.
struct Recorder {
    events: mpsc::UnboundedSender<String>,
}

impl Plugin for Recorder {
    fn on_registered(&self) {
        let _ = self.events.send("registered".into());
    }

    async fn configure(
        &self,
        req: api::ConfigureRequest,
    ) -> Result<api::ConfigureResponse, Status> {
        let _ = self.events.send(format!("Configure {}", req.config));
        Ok(api::ConfigureResponse {
            events: api::EventMask::of(&[api::Event::CreateContainer]).0,
        })
    }

    async fn synchronize(
        &self,
        req: api::SynchronizeRequest,
    ) -> Result<api::SynchronizeResponse, Status> {
        let _ = self.events.send(format!(
            "Synchronize {} {}",
            req.pods.len(),
            req.containers.len()
        ));
        let update = req
            .containers
            .iter()
            .map(|c| api::ContainerUpdate {
                container_id: c.id.clone(),
                ..Default::default()
            })
            .collect();
        Ok(api::SynchronizeResponse {
            update,
            more: false,
        })
    }

    async fn create_container(
        &self,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, Status> {
        let name = req.container.map(|c| c.name).unwrap_or_default();
        if name == "hang" {
            std::future::pending::<()>().await;
        }
        let _ = self.events.send(format!("CreateContainer {name}"));
        Ok(api::CreateContainerResponse {
            adjust: Some(api::ContainerAdjustment {
                env: vec![api::KeyValue {
                    key: "SEEN_BY".into(),
                    value: "recorder".into(),
                }],
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    async fn start_container(
        &self,
        req: api::StartContainerRequest,
    ) -> Result<api::StartContainerResponse, Status> {
        let name = req.container.map(|c| c.name).unwrap_or_default();
        let _ = self.events.send(format!("StartContainer {name}"));
        Ok(api::StartContainerResponse {})
    }
}

/// Implements nothing: every reply is the default.
struct Nothing;
impl Plugin for Nothing {}

struct Running {
    runtime: Endpoint,
    seen: mpsc::UnboundedReceiver<(String, Bytes)>,
    handle: StubHandle,
    run: tokio::task::JoinHandle<Result<(), StubError>>,
}

/// A stub for `plugin` running against a fake runtime over a socket pair.
fn start<P: Plugin>(plugin: P, refuse: bool) -> Running {
    let (a, b) = UnixStream::pair().unwrap();
    let (tx, seen) = mpsc::unbounded_channel();
    let runtime = Endpoint::start(a, Role::Runtime, Arc::new(FakeRuntime { refuse, seen: tx }));
    let stub = Stub::new(b, "recorder", "07").unwrap();
    let handle = stub.handle();
    let run = tokio::spawn(stub.run(Arc::new(plugin)));
    Running {
        runtime,
        seen,
        handle,
        run,
    }
}

async fn registered(handle: &StubHandle) {
    tokio::time::timeout(T, async {
        while !handle.is_registered() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("registered in time");
}

async fn call<R: prost::Message + Default>(
    runtime: &Endpoint,
    method: &str,
    req: &impl prost::Message,
) -> Result<R, CallError> {
    runtime
        .call_message(api::PLUGIN_SERVICE, method, req, T)
        .await
}

fn container(id: &str, name: &str) -> api::Container {
    api::Container {
        id: id.into(),
        name: name.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn registers_then_serves_configure_synchronize_and_events() {
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut r = start(Recorder { events: events_tx }, false);

    let (method, payload) = r.seen.recv().await.unwrap();
    assert_eq!(method, "RegisterPlugin");
    let reg = api::RegisterPluginRequest::decode(payload).unwrap();
    assert_eq!(
        (reg.plugin_name.as_str(), reg.plugin_idx.as_str()),
        ("recorder", "07")
    );
    assert_eq!(reg.nri_version, NRI_VERSION);

    let configure = api::ConfigureRequest {
        config: "{\"x\":1}".into(),
        request_timeout: 3000,
        ..Default::default()
    };
    assert_eq!(events.recv().await.unwrap(), "registered");
    let reply: api::ConfigureResponse = call(&r.runtime, "Configure", &configure).await.unwrap();
    assert_eq!(reply.events, 1 << 3);
    assert_eq!(events.recv().await.unwrap(), "Configure {\"x\":1}");

    // Synchronize in two parts: the first is acknowledged, the plugin answers the whole.
    let part = api::SynchronizeRequest {
        pods: vec![api::PodSandbox::default(); 2],
        containers: vec![container("c1", "one")],
        more: true,
    };
    let reply: api::SynchronizeResponse = call(&r.runtime, "Synchronize", &part).await.unwrap();
    assert!(reply.more && reply.update.is_empty());
    let last = api::SynchronizeRequest {
        pods: vec![api::PodSandbox::default()],
        containers: vec![container("c2", "two")],
        more: false,
    };
    let reply: api::SynchronizeResponse = call(&r.runtime, "Synchronize", &last).await.unwrap();
    assert!(!reply.more);
    let ids: Vec<_> = reply
        .update
        .iter()
        .map(|u| u.container_id.as_str())
        .collect();
    assert_eq!(ids, ["c1", "c2"]);
    assert_eq!(events.recv().await.unwrap(), "Synchronize 3 2");

    let create = api::CreateContainerRequest {
        pod: Some(api::PodSandbox::default()),
        container: Some(container("c3", "web")),
    };
    let reply: api::CreateContainerResponse =
        call(&r.runtime, "CreateContainer", &create).await.unwrap();
    let env = reply.adjust.unwrap().env;
    assert_eq!(
        (env[0].key.as_str(), env[0].value.as_str()),
        ("SEEN_BY", "recorder")
    );
    assert_eq!(events.recv().await.unwrap(), "CreateContainer web");

    // The legacy StateChange reaches the event's own method.
    let change = api::StateChangeEvent {
        event: api::Event::StartContainer as i32,
        pod: None,
        container: Some(container("c3", "web")),
    };
    let _: api::Empty = call(&r.runtime, "StateChange", &change).await.unwrap();
    assert_eq!(events.recv().await.unwrap(), "StartContainer web");

    // An event the plugin does not implement has the default reply.
    let _: api::RemoveContainerResponse = call(
        &r.runtime,
        "RemoveContainer",
        &api::RemoveContainerRequest::default(),
    )
    .await
    .unwrap();

    // Unsolicited updates reach the runtime, and its answer comes back.
    let update = api::ContainerUpdate {
        container_id: "c3".into(),
        ..Default::default()
    };
    let failed = r
        .handle
        .update_containers(vec![update.clone()], Vec::new())
        .await
        .unwrap();
    assert_eq!(failed, [update]);
    assert_eq!(r.seen.recv().await.unwrap().0, "UpdateContainers");

    // The runtime hanging up ends the run.
    registered(&r.handle).await;
    r.runtime.close("shutting down");
    tokio::time::timeout(T, r.run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!r.handle.is_connected());
}

#[tokio::test]
async fn the_defaults_subscribe_to_all_and_answer_empty() {
    let r = start(Nothing, false);
    let reply: api::ConfigureResponse =
        call(&r.runtime, "Configure", &api::ConfigureRequest::default())
            .await
            .unwrap();
    assert_eq!(reply.events, 0);
    let reply: api::CreateContainerResponse = call(
        &r.runtime,
        "CreateContainer",
        &api::CreateContainerRequest::default(),
    )
    .await
    .unwrap();
    assert_eq!(reply, api::CreateContainerResponse::default());
    let reply: api::ValidateContainerAdjustmentResponse = call(
        &r.runtime,
        "ValidateContainerAdjustment",
        &api::ValidateContainerAdjustmentRequest::default(),
    )
    .await
    .unwrap();
    assert!(!reply.reject);
    let _: api::Empty = call(&r.runtime, "Shutdown", &api::Empty {}).await.unwrap();
}

#[tokio::test]
async fn unknown_methods_and_bad_requests_are_errors_not_hangups() {
    let r = start(Nothing, false);
    let e = call::<api::Empty>(&r.runtime, "Frobnicate", &api::Empty {})
        .await
        .unwrap_err();
    assert!(e.is_unimplemented());
    let e = r
        .runtime
        .call("some.other.Service", "Configure", Vec::new(), T)
        .await
        .unwrap_err();
    assert!(e.is_unimplemented());
    let e = r
        .runtime
        .call(api::PLUGIN_SERVICE, "CreateContainer", vec![0xff; 3], T)
        .await
        .unwrap_err();
    assert!(matches!(e, CallError::Status { code, .. } if code == code::INVALID_ARGUMENT));
    assert!(!r.runtime.is_closed());
}

#[tokio::test]
async fn a_plugin_that_waits_holds_only_its_own_call() {
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let r = start(Recorder { events: events_tx }, false);
    let hang = api::CreateContainerRequest {
        pod: None,
        container: Some(container("h", "hang")),
    };
    let e = r
        .runtime
        .call_message::<api::CreateContainerResponse>(
            api::PLUGIN_SERVICE,
            "CreateContainer",
            &hang,
            Duration::from_millis(100),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, CallError::Timeout(_)));
    let ok = api::CreateContainerRequest {
        pod: None,
        container: Some(container("c", "fine")),
    };
    let _: api::CreateContainerResponse = call(&r.runtime, "CreateContainer", &ok).await.unwrap();
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    seen.retain(|e| e != "registered");
    assert_eq!(seen, ["CreateContainer fine"]);
}

#[tokio::test]
async fn a_refused_registration_ends_the_run_with_its_reason() {
    let mut r = start(Nothing, true);
    let e = tokio::time::timeout(T, r.run)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    match e {
        StubError::Register(CallError::Status { code, message }) => {
            assert_eq!(code, code::FAILED_PRECONDITION);
            assert_eq!(message, "no plugins today");
        }
        e => panic!("unexpected {e:?}"),
    }
    assert_eq!(r.seen.recv().await.unwrap().0, "RegisterPlugin");
    assert!(!r.handle.is_registered());
    tokio::time::timeout(T, r.runtime.closed()).await.unwrap();
}

#[tokio::test]
async fn a_runtime_that_never_answers_registration_costs_the_timeout() {
    let (a, b) = UnixStream::pair().unwrap();
    let stub = Stub::new(b, "p", "00")
        .unwrap()
        .with_registration_timeout(Duration::from_millis(100));
    // The runtime's end stays open but nothing reads it.
    let e = tokio::time::timeout(T, stub.run(Arc::new(Nothing)))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(e, StubError::Register(CallError::Timeout(_))),
        "{e:?}"
    );
    drop(a);
}

#[tokio::test]
async fn a_handle_closes_the_connection_and_ends_the_run() {
    let r = start(Nothing, false);
    // Registration comes first; closing before it would end the run with its error.
    registered(&r.handle).await;
    r.handle.close();
    tokio::time::timeout(T, r.run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    tokio::time::timeout(T, r.runtime.closed()).await.unwrap();
    let e = r
        .handle
        .update_containers(Vec::new(), Vec::new())
        .await
        .unwrap_err();
    assert!(matches!(e, StubError::Call(CallError::Closed)), "{e:?}");
}

#[tokio::test]
async fn handles_before_running_are_not_connected() {
    let (_a, b) = UnixStream::pair().unwrap();
    let stub = Stub::new(b, "p", "00").unwrap();
    let handle = stub.handle();
    assert!(!handle.is_connected());
    let e = handle
        .update_containers(Vec::new(), Vec::new())
        .await
        .unwrap_err();
    assert!(matches!(e, StubError::NotRunning));
    handle.close();
}

#[tokio::test]
async fn names_and_indexes_are_checked() {
    for (name, idx, ok) in [
        ("good-name_1.2+x", "10", true),
        ("", "10", false),
        ("bad name", "10", false),
        ("bad/name", "10", false),
        ("p", "1", false),
        ("p", "100", false),
        ("p", "a1", false),
        ("p", "00", true),
    ] {
        let (_a, b) = UnixStream::pair().unwrap();
        let r = Stub::new(b, name, idx);
        assert_eq!(r.is_ok(), ok, "{name:?} {idx:?}");
    }
}

#[tokio::test]
async fn the_environments_socket_must_be_an_open_socket() {
    for bad in ["", "three", "-1", "1", "999999"] {
        let e = socket_from_env(bad).unwrap_err();
        assert!(matches!(e, StubError::BadSocketEnv { .. }), "{bad:?}: {e}");
    }
    let file = std::fs::File::open("/proc/self/status").unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let e = socket_from_env(&fd.to_string()).unwrap_err();
    assert!(e.to_string().contains("it is /proc/"), "{e}");

    let (mine, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let fd = std::os::fd::IntoRawFd::into_raw_fd(theirs);
    let stream = socket_from_env(&fd.to_string()).unwrap();
    stream.writable().await.unwrap();
    stream.try_write(b"hi").unwrap();
    let mut buf = [0u8; 2];
    std::io::Read::read_exact(&mut &mine, &mut buf).unwrap();
    assert_eq!(&buf, b"hi");
}
