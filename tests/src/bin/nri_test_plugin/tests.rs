use super::*;

use bytes::Bytes;
use crishim_nri::conn::{CallError, Endpoint, Handler, HandlerFuture, Role};
use prost::Message as _;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(5);

#[test]
fn configs_map_to_nri_messages() {
    let config = Config::parse(
        r#"{ "events": ["CreateContainer", "PostStartContainer"], "match": "web",
             "adjust": { "env": {"K": "V"}, "remove_env": ["X"], "annotations": {"a": "b"},
                         "mounts": [{"destination": "/d", "source": "/s", "type": "bind",
                                     "options": ["rbind", "ro"]}],
                         "hooks": {"prestart": [{"path": "/bin/sh", "args": ["sh", "-c", "true"]}]},
                         "devices": [{"path": "/dev/nri-null", "type": "c", "major": 1, "minor": 3,
                                      "file_mode": 438}],
                         "cdi_devices": ["vendor.com/class=name"],
                         "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1234, "soft": 1234}],
                         "oom_score_adj": 456, "memory_limit": 67108864, "cpu_shares": 512,
                         "cpuset_cpus": "0", "pids_limit": 77, "sysctl": {"net.x": "1"} },
             "update_on_update": { "memory_limit": 123 },
             "unsolicited_update": { "after_event": "PostStartContainer", "delay_ms": 200,
                                     "memory_limit": 100663296, "cpu_shares": 256 } }"#,
    )
    .unwrap();
    assert_eq!(config.event_mask(), (1 << 3) | (1 << 6));
    assert!(config.matches(Some("web")) && !config.matches(Some("db")) && config.matches(None));
    assert_eq!(config.mode, Mode::Normal);
    assert_eq!(config.mode_event, "CreateContainer");

    let adjust = config.adjust.as_ref().unwrap().to_api();
    let env: Vec<_> = adjust.env.iter().map(|kv| (&*kv.key, &*kv.value)).collect();
    assert_eq!(env, [("-X", ""), ("K", "V")]);
    assert_eq!(adjust.annotations["a"], "b");
    assert_eq!(adjust.mounts[0].r#type, "bind");
    assert_eq!(adjust.mounts[0].options, ["rbind", "ro"]);
    assert_eq!(adjust.hooks.unwrap().prestart[0].args, ["sh", "-c", "true"]);
    assert_eq!(adjust.cdi_devices[0].name, "vendor.com/class=name");
    assert_eq!(adjust.rlimits[0].hard, 1234);
    let linux = adjust.linux.unwrap();
    assert_eq!(linux.devices[0].file_mode.as_ref().unwrap().value, 438);
    assert_eq!(linux.oom_score_adj.unwrap().value, 456);
    assert_eq!(linux.sysctl["net.x"], "1");
    let resources = linux.resources.unwrap();
    assert_eq!(resources.memory.unwrap().limit.unwrap().value, 67108864);
    let cpu = resources.cpu.unwrap();
    assert_eq!(cpu.shares.unwrap().value, 512);
    assert_eq!(cpu.cpus, "0");
    assert!(cpu.quota.is_none());
    assert_eq!(resources.pids.unwrap().limit, 77);

    let u = config.unsolicited_update.as_ref().unwrap();
    assert_eq!(
        (u.after_event.as_str(), u.delay_ms),
        ("PostStartContainer", 200)
    );
    let update = u.resources.update("c1");
    let resources = update.linux.unwrap().resources.unwrap();
    assert_eq!(resources.cpu.unwrap().shares.unwrap().value, 256);
    assert!(config
        .update_on_update
        .as_ref()
        .unwrap()
        .to_api()
        .unwrap()
        .cpu
        .is_none());
}

#[test]
fn typos_are_refused() {
    for bad in [
        r#"{"evnts": []}"#,
        r#"{"events": ["CreateContainers"]}"#,
        r#"{"adjust": {"memory_limt": 1}}"#,
        r#"{"adjust": {"mounts": [{"destination": "/d"}]}}"#,
        r#"{"update_on_update": {"env": {}}}"#,
        r#"{"unsolicited_update": {"after_event": "Nope"}}"#,
        r#"{"unsolicited_update": {"delay_ms": 1}}"#,
        r#"{"mode": "explode"}"#,
        r#"{"mode_event": "Whatever"}"#,
    ] {
        assert!(Config::parse(bad).is_err(), "{bad}");
    }
    let config = Config::parse(r#"{"mode": "no-register", "mode_event": "Shutdown"}"#).unwrap();
    assert_eq!(config.mode, Mode::NoRegister);
    assert_eq!(Config::parse("{}").unwrap().event_mask(), 0);
}

/// The runtime, faked: accepts registration and updates, and reports both.
struct FakeRuntime(mpsc::UnboundedSender<(String, Bytes)>);

impl Handler for FakeRuntime {
    fn handle(&self, _service: String, method: String, payload: Bytes) -> HandlerFuture {
        let _ = self.0.send((method, payload));
        Box::pin(async { Ok(api::Empty {}.encode_to_vec().into()) })
    }
}

struct Running {
    runtime: Endpoint,
    seen: mpsc::UnboundedReceiver<(String, Bytes)>,
    served: tokio::task::JoinHandle<ExitCode>,
    log: tempfile::NamedTempFile,
}

/// The plugin serving a fake runtime, its file configuration `config` plus a log.
async fn start(config: &str) -> Running {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut config: serde_json::Value = serde_json::from_str(config).unwrap();
    config["log"] = log.path().to_str().unwrap().into();
    let config = Config::parse(&config.to_string()).unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let runtime = Endpoint::start(a, Role::Runtime, Arc::new(FakeRuntime(tx)));
    let stub = Stub::new(b, "test", "10").unwrap();
    let raw = stub.socket().as_fd().try_clone_to_owned().unwrap().into();
    let plugin_log = Arc::new(Log::default());
    plugin_log.open(&config.log.clone().unwrap()).unwrap();
    let served = tokio::spawn(serve(stub, config, plugin_log, raw));
    assert_eq!(seen.recv().await.unwrap().0, "RegisterPlugin");
    Running {
        runtime,
        seen,
        served,
        log,
    }
}

fn lines(log: &tempfile::NamedTempFile) -> Vec<String> {
    let text = std::fs::read_to_string(log.path()).unwrap();
    text.lines().map(str::to_string).collect()
}

async fn call<R: prost::Message + Default>(
    runtime: &Endpoint,
    method: &str,
    req: &impl prost::Message,
) -> Result<R, CallError> {
    runtime
        .call_message(api::PLUGIN_SERVICE, method, req, Duration::from_secs(1))
        .await
}

fn create(pod: &str, container: &str, id: &str) -> api::CreateContainerRequest {
    api::CreateContainerRequest {
        pod: Some(api::PodSandbox {
            name: pod.into(),
            ..Default::default()
        }),
        container: Some(api::Container {
            id: id.into(),
            name: container.into(),
            ..Default::default()
        }),
    }
}

#[tokio::test]
async fn logs_adjusts_and_updates_as_configured() {
    let mut r = start(r#"{}"#).await;
    // The runtime's configuration replaces the file's; the log stays where the file put it.
    let config = serde_json::json!({
        "log": r.log.path(),
        "events": ["CreateContainer", "PostStartContainer", "UpdateContainer"],
        "match": "web",
        "adjust": { "env": { "K": "V" } },
        "update_on_update": { "memory_limit": 123 },
        "unsolicited_update": { "after_event": "PostStartContainer", "delay_ms": 10,
                                "cpu_shares": 256 },
    });
    let configure = api::ConfigureRequest {
        config: serde_json::to_string_pretty(&config).unwrap(),
        ..Default::default()
    };
    let reply: api::ConfigureResponse = call(&r.runtime, "Configure", &configure).await.unwrap();
    assert_eq!(reply.events, (1 << 3) | (1 << 6) | (1 << 7));
    let sync = api::SynchronizeRequest {
        pods: vec![api::PodSandbox::default()],
        containers: Vec::new(),
        more: false,
    };
    let _: api::SynchronizeResponse = call(&r.runtime, "Synchronize", &sync).await.unwrap();

    let reply: api::CreateContainerResponse =
        call(&r.runtime, "CreateContainer", &create("pod", "web", "c1"))
            .await
            .unwrap();
    assert_eq!(reply.adjust.unwrap().env[0].key, "K");
    let reply: api::CreateContainerResponse =
        call(&r.runtime, "CreateContainer", &create("pod", "db", "c2"))
            .await
            .unwrap();
    assert!(reply.adjust.is_none());

    let update = api::UpdateContainerRequest {
        pod: None,
        container: create("pod", "web", "c1").container,
        linux_resources: None,
    };
    let reply: api::UpdateContainerResponse =
        call(&r.runtime, "UpdateContainer", &update).await.unwrap();
    assert_eq!(reply.update[0].container_id, "c1");

    let started = api::PostStartContainerRequest {
        pod: None,
        container: create("pod", "web", "c1").container,
    };
    let _: api::PostStartContainerResponse = call(&r.runtime, "PostStartContainer", &started)
        .await
        .unwrap();
    let (method, payload) = r.seen.recv().await.unwrap();
    assert_eq!(method, "UpdateContainers");
    let req = api::UpdateContainersRequest::decode(payload).unwrap();
    assert_eq!(req.update[0].container_id, "c1");
    // Its log line follows the update's reply.
    tokio::time::sleep(Duration::from_millis(100)).await;

    r.runtime.close("done");
    let code = tokio::time::timeout(T, r.served).await.unwrap().unwrap();
    assert_eq!(code, ExitCode::SUCCESS);
    let configure_line = format!("CONFIGURE {}", configure.config.replace('\n', " "));
    assert_eq!(
        lines(&r.log),
        [
            "REGISTERED",
            configure_line.as_str(),
            "SYNC 1 0",
            "EVENT CreateContainer pod web",
            "EVENT CreateContainer pod db",
            "EVENT UpdateContainer - web",
            "EVENT PostStartContainer - web",
            "UNSOLICITED web OK",
            "CLOSED",
        ]
    );
}

/// Whether the runtime's end closes within `T` after the plugin meets `mode` at
/// CreateContainer; the call itself must fail.
async fn runtime_drops_plugin_in(mode: &str) {
    let r = start(&format!(r#"{{"mode": "{mode}"}}"#)).await;
    let e =
        call::<api::CreateContainerResponse>(&r.runtime, "CreateContainer", &create("p", "c", "1"))
            .await
            .unwrap_err();
    assert!(e.is_fatal(), "{mode}: {e:?}");
    tokio::time::timeout(T, r.runtime.closed()).await.unwrap();
    let reason = r.runtime.close_reason().unwrap();
    let code = tokio::time::timeout(T, r.served).await.unwrap().unwrap();
    assert_eq!(code, ExitCode::SUCCESS, "{mode}: {reason}");
    let log = lines(&r.log);
    assert_eq!(
        log.last().map(String::as_str),
        Some("CLOSED"),
        "{mode}: {log:?}"
    );
    eprintln!("{mode}: {reason}");
}

#[tokio::test]
async fn nonsense_is_a_protocol_error() {
    runtime_drops_plugin_in("nonsense").await;
}

#[tokio::test]
async fn a_flood_is_refused_on_its_header() {
    runtime_drops_plugin_in("flood").await;
}

#[tokio::test]
async fn disconnect_closes_the_connection() {
    runtime_drops_plugin_in("disconnect").await;
}

#[tokio::test]
async fn hang_never_answers() {
    let r = start(r#"{"mode": "hang", "mode_event": "StopContainer", "match": "c"}"#).await;
    let stop = api::StopContainerRequest {
        pod: None,
        container: create("p", "c", "1").container,
    };
    let e = call::<api::StopContainerResponse>(&r.runtime, "StopContainer", &stop)
        .await
        .unwrap_err();
    assert!(matches!(e, CallError::Timeout(_)), "{e:?}");
    // Only the matching container: another is answered.
    let other = api::StopContainerRequest {
        pod: None,
        container: create("p", "other", "2").container,
    };
    let _: api::StopContainerResponse = call(&r.runtime, "StopContainer", &other).await.unwrap();
}

#[tokio::test]
async fn no_register_holds_the_connection_silently() {
    let (a, b) = UnixStream::pair().unwrap();
    let stub = Stub::new(b, "test", "10").unwrap();
    let raw = stub.socket().as_fd().try_clone_to_owned().unwrap().into();
    let config = Config::parse(r#"{"mode": "no-register"}"#).unwrap();
    let served = tokio::spawn(serve(stub, config, Arc::new(Log::default()), raw));
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_millis(200), async {
        a.readable().await.unwrap();
        a.try_read(&mut buf)
    })
    .await;
    assert!(read.is_err(), "the plugin wrote {read:?}");
    drop(a);
    let code = tokio::time::timeout(T, served).await.unwrap().unwrap();
    assert_eq!(code, ExitCode::SUCCESS);
}

#[test]
fn hostile_bytes_are_what_they_claim() {
    let flood = oversized_reply();
    let mut frames = crishim_nri::mux::Decoder::default();
    frames.extend(&flood);
    let first = frames.next_frame().unwrap().unwrap();
    assert_eq!(first.conn, crishim_nri::mux::PLUGIN_SERVICE_CONN);
    let mut messages = crishim_nri::ttrpc::Decoder::default();
    messages.extend(&first.payload);
    assert!(messages.next_message().is_err());

    let garbage = nonsense();
    let mut frames = crishim_nri::mux::Decoder::default();
    frames.extend(&garbage);
    let frame = frames.next_frame().unwrap().unwrap();
    assert_eq!(frames.pending(), 0);
    let mut messages = crishim_nri::ttrpc::Decoder::default();
    messages.extend(&frame.payload);
    assert!(messages.next_message().is_err());
}
