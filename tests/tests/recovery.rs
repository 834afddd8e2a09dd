//! Crash recovery and what keeps pods honest when parts of the runtime die: the daemon SIGKILLed
//! and restarted on the same directories (pods, containers, exits and interrupted calls
//! recovered), a pod's shim SIGKILLed (its containers reported exited, the pod cleaned up), the
//! infra process reaping orphans of a shared PID namespace, and `GetContainerEvents`.
//!
//! Every test starts its own registry and daemon (tests run in parallel) and ends with
//! [`assert_no_leaks`] for its pods. The daemon binary is `$CRISHIM_BIN` or
//! `target/<profile>/crishim` (`cargo build -p crishim -p crishim-shim`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_state::records::{ContainerRecord, PodRecord, PodState, RecordDir};
use crishim_tests::pods::{
    assert_no_leaks, host_processes, namespaces, parse_cri_log, processes_with_command, reassemble,
    set_pod_namespaces, wait_for_log_line, with_descendants, HostProcess, PodEnv, PodTraces,
    NS_POD,
};
use crishim_tests::pods::{marker, sh_container};
use crishim_tests::{random_hex, Daemon};
use tonic::codec::Streaming;

use cri::ContainerEventType::{
    ContainerCreatedEvent, ContainerDeletedEvent, ContainerStartedEvent, ContainerStoppedEvent,
};
use cri::ContainerState::{ContainerCreated, ContainerExited, ContainerRunning};
use cri::PodSandboxState::{SandboxNotready, SandboxReady};

const WAIT: Duration = Duration::from_secs(30);

/// `sh` script: print a counter to stdout every 100 ms; exit 0 on SIGTERM.
const COUNTER: &str =
    "trap 'exit 0' TERM; i=0; while true; do echo $i; i=$((i+1)); sleep 0.1; done";

/// Unix time in nanoseconds, as CRI timestamps are.
fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as i64
}

/// The pod's state directory, the shim's `--dir`.
fn pod_state_dir(d: &Daemon, pod: &str) -> PathBuf {
    d.state_dir().join("pods").join(pod)
}

/// A pid file of the pod's state directory (`shim.pid`, `infra.pid`) as a live process.
fn pid_file_process(d: &Daemon, pod: &str, file: &str) -> HostProcess {
    let path = pod_state_dir(d, pod).join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let recorded = crishim_proto::shim::pid_file::parse(&text)
        .unwrap_or_else(|| panic!("{} holds {text:?}", path.display()));
    assert!(
        recorded.start.is_some() && recorded.is_running(),
        "{} records a process that is not the one under its pid: {text:?}",
        path.display()
    );
    let pid = recorded.pid;
    let p = crishim_tests::pods::read_process(pid)
        .unwrap_or_else(|| panic!("{} names pid {pid}, which is gone", path.display()));
    assert!(!p.is_zombie(), "{} names a zombie: {p:?}", path.display());
    p
}

/// The pod's shim (`shim.pid`), checked to be a `crishim-shim start --dir <pod dir>` process.
fn shim_process(d: &Daemon, pod: &str) -> HostProcess {
    let p = pid_file_process(d, pod, "shim.pid");
    let dir = pod_state_dir(d, pod).to_string_lossy().into_owned();
    assert!(
        p.cmdline
            .first()
            .is_some_and(|a| a.ends_with("crishim-shim"))
            && p.cmdline.get(1).is_some_and(|a| a == "start")
            && p.command().contains(&dir),
        "shim.pid of {pod} names {p:?}, not `crishim-shim start --dir {dir}`"
    );
    p
}

/// The last `max` bytes of `s` (at a character boundary).
fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// The daemon's log lines that mention `needle` (colours stripped), for failure messages.
fn log_lines_about(d: &Daemon, needle: &str) -> String {
    let text = d.log_text();
    let mut out = Vec::new();
    for line in text.lines().filter(|l| l.contains(needle)) {
        let mut clean = String::with_capacity(line.len());
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                // ESC [ ... m
                for c in chars.by_ref() {
                    if c == 'm' {
                        break;
                    }
                }
            } else {
                clean.push(c);
            }
        }
        out.push(clean);
    }
    tail(&out.join("\n"), 6000).to_string()
}

/// The shim's log, for failure messages.
fn shim_log(d: &Daemon, pod: &str) -> String {
    let text = std::fs::read_to_string(pod_state_dir(d, pod).join("shim.log")).unwrap_or_default();
    tail(&text, 3000).to_string()
}

/// Poll until none of `procs` is alive; returns those still alive after `timeout`.
async fn wait_gone(procs: &[HostProcess], timeout: Duration) -> Vec<HostProcess> {
    let deadline = Instant::now() + timeout;
    loop {
        let alive: Vec<_> = procs.iter().filter(|p| p.is_alive()).cloned().collect();
        if alive.is_empty() || Instant::now() > deadline {
            return alive;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Zombie children of the daemon, each described with what it was (from `known`, processes seen
/// earlier) when known.
fn daemon_zombies(d: &Daemon, known: &[HostProcess]) -> Vec<String> {
    let Some(daemon) = d.pid().map(|p| p as i32) else {
        return Vec::new();
    };
    host_processes()
        .into_iter()
        .filter(|p| p.is_zombie() && p.ppid == daemon)
        .map(|z| {
            let was = known
                .iter()
                .find(|k| k.pid == z.pid && k.starttime == z.starttime)
                .map_or_else(|| "unknown".to_string(), |k| format!("{:?}", k.command()));
            format!("pid {} (was {was})", z.pid)
        })
        .collect()
}

/// The last complete stdout line of a CRI log file parsed as a number (the counter), and the
/// file's size.
fn last_count(path: &Path) -> (u64, Option<u64>) {
    let bytes = std::fs::read(path).unwrap_or_default();
    let size = bytes.len() as u64;
    // Only whole records: the writer may be in the middle of one.
    let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let records = parse_cri_log(&bytes[..end])
        .unwrap_or_else(|e| panic!("{} is not a CRI log: {e}", path.display()));
    let last = reassemble(&records, "stdout")
        .iter()
        .rev()
        .find_map(|l| String::from_utf8_lossy(l).trim().parse::<u64>().ok());
    (size, last)
}

/// Poll ContainerStatus until `f` holds; panics after `timeout` with the last status.
async fn wait_container(
    d: &Daemon,
    id: &str,
    timeout: Duration,
    what: &str,
    f: impl Fn(&cri::ContainerStatus) -> bool,
) -> cri::ContainerStatus {
    let deadline = Instant::now() + timeout;
    loop {
        let st = d
            .container_status(id)
            .await
            .unwrap_or_else(|e| panic!("ContainerStatus({id}): {e:?}"));
        if f(&st) {
            return st;
        }
        if Instant::now() > deadline {
            panic!("container {id} not {what} after {timeout:?}: {st:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Poll PodSandboxStatus until the pod is in `state`; panics after `timeout`.
async fn wait_pod_state(
    d: &Daemon,
    id: &str,
    state: cri::PodSandboxState,
    timeout: Duration,
) -> cri::PodSandboxStatus {
    let deadline = Instant::now() + timeout;
    loop {
        let st = d
            .pod_status(id)
            .await
            .unwrap_or_else(|e| panic!("PodSandboxStatus({id}): {e:?}"));
        if st.state == state as i32 {
            return st;
        }
        if Instant::now() > deadline {
            panic!("pod {id} not {state:?} after {timeout:?}: {st:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn state_name(s: i32) -> String {
    cri::ContainerState::try_from(s).map_or_else(|_| format!("state {s}"), |s| format!("{s:?}"))
}

// ---------------------------------------------------------------------------------------------
// GetContainerEvents

/// A `GetContainerEvents` subscription; keeps every event it read in `seen`.
struct Events {
    stream: Streaming<cri::ContainerEventResponse>,
    seen: Vec<cri::ContainerEventResponse>,
}

fn event_type(e: &cri::ContainerEventResponse) -> String {
    cri::ContainerEventType::try_from(e.container_event_type).map_or_else(
        |_| format!("type {}", e.container_event_type),
        |t| format!("{t:?}"),
    )
}

impl Events {
    /// Subscribe (the daemon has registered the subscriber when this returns).
    async fn subscribe(d: &Daemon) -> Events {
        let stream = d
            .runtime_client()
            .get_container_events(cri::GetEventsRequest {})
            .await
            .expect("GetContainerEvents")
            .into_inner();
        Events {
            stream,
            seen: Vec::new(),
        }
    }

    /// Read events until one satisfies `f`, for at most `timeout`; `None` on timeout.
    async fn next_where(
        &mut self,
        timeout: Duration,
        f: impl Fn(&cri::ContainerEventResponse) -> bool,
    ) -> Option<cri::ContainerEventResponse> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.stream.message()).await {
                Err(_) => return None,
                Ok(Ok(Some(e))) => {
                    self.seen.push(e.clone());
                    if f(&e) {
                        return Some(e);
                    }
                }
                Ok(Ok(None)) => panic!("the event stream ended; seen: {}", self.summary()),
                Ok(Err(s)) => panic!("the event stream failed: {s:?}; seen: {}", self.summary()),
            }
        }
    }

    /// Wait for the event `kind` about `id`; panics after `timeout`.
    async fn expect(
        &mut self,
        id: &str,
        kind: cri::ContainerEventType,
        timeout: Duration,
    ) -> cri::ContainerEventResponse {
        match self
            .next_where(timeout, |e| {
                e.container_id == id && e.container_event_type == kind as i32
            })
            .await
        {
            Some(e) => e,
            None => panic!(
                "no {kind:?} event for {id} within {timeout:?}; seen: {}",
                self.summary()
            ),
        }
    }

    /// Read whatever else arrives within `d`.
    async fn drain(&mut self, d: Duration) {
        let _ = self.next_where(d, |_| false).await;
    }

    /// The event types seen for `id`, in order.
    fn kinds_for(&self, id: &str) -> Vec<i32> {
        self.seen
            .iter()
            .filter(|e| e.container_id == id)
            .map(|e| e.container_event_type)
            .collect()
    }

    fn summary(&self) -> String {
        let lines: Vec<String> = self
            .seen
            .iter()
            .map(|e| {
                format!(
                    "{} {} (pod {:?}, statuses {:?})",
                    &e.container_id[..e.container_id.len().min(12)],
                    event_type(e),
                    e.pod_sandbox_status
                        .as_ref()
                        .map(|p| &p.id[..p.id.len().min(12)]),
                    e.containers_statuses
                        .iter()
                        .map(|s| format!("{}={}", &s.id[..s.id.len().min(12)], state_name(s.state)))
                        .collect::<Vec<_>>()
                )
            })
            .collect();
        format!("[\n  {}\n]", lines.join("\n  "))
    }
}

// ---------------------------------------------------------------------------------------------
// The daemon SIGKILLed

/// One pod of [`daemon_sigkill_with_ten_pods_running_then_restart`].
struct Survivor {
    cfg: cri::PodSandboxConfig,
    id: String,
    traces: PodTraces,
    counter: String,
    counter_log: PathBuf,
    /// A container that exits with this code while the daemon is down.
    exiter: Option<(String, i32)>,
}

#[tokio::test]
async fn daemon_sigkill_with_ten_pods_running_then_restart() {
    let mut env = PodEnv::start().await;
    let codes = [3, 42, 77];
    let mut pods: Vec<Survivor> = Vec::new();
    for i in 0..10 {
        let d = &env.d;
        let cfg = env.pod_config(&format!("survivor-{i}"));
        let id = d.run_pod(&cfg).await.expect("RunPodSandbox");
        let mut traces = PodTraces::new(&id, &cfg);
        let c = sh_container(&env, "counter", COUNTER, &marker(&format!("counter{i}")));
        let counter = d
            .run_container(&id, &c, &cfg)
            .await
            .expect("run the counter container");
        traces.add_container(&counter);
        // Created now, started just before the kill, so they exit while the daemon is down.
        let exiter = match codes.get(i) {
            Some(&code) => {
                let c = sh_container(
                    &env,
                    "exiter",
                    &format!("sleep 1.5; exit {code}"),
                    &marker(&format!("exiter{i}")),
                );
                let eid = d
                    .create_container(&id, &c, &cfg)
                    .await
                    .expect("create the exiting container");
                traces.add_container(&eid);
                Some((eid, code))
            }
            None => None,
        };
        pods.push(Survivor {
            counter_log: Path::new(&cfg.log_directory).join("counter.log"),
            cfg,
            id,
            traces,
            counter,
            exiter,
        });
    }
    let d = &env.d;
    let mut before: BTreeMap<String, cri::ContainerStatus> = BTreeMap::new();
    for p in &mut pods {
        wait_for_log_line(&p.counter_log, "stdout", "1", WAIT).await;
        p.traces.capture(d).await;
        let st = d.container_status(&p.counter).await.unwrap();
        assert_eq!(st.state, ContainerRunning as i32, "{st:#?}");
        before.insert(p.counter.clone(), st);
    }
    let started_exiters = now_nanos();
    for p in &pods {
        if let Some((eid, _)) = &p.exiter {
            d.start_container(eid)
                .await
                .expect("start the exiting container");
        }
    }
    for p in &mut pods {
        p.traces.capture(d).await;
    }

    // Crash. The shims and containers keep running, and so does their logging.
    let kill_ns = now_nanos();
    env.d.kill();
    assert!(
        kill_ns - started_exiters < 1_000_000_000,
        "starting the exiting containers took too long to kill the daemon before they exit"
    );
    let at_kill: Vec<(u64, Option<u64>)> =
        pods.iter().map(|p| last_count(&p.counter_log)).collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (p, (size0, n0)) in pods.iter().zip(&at_kill) {
        let (size1, n1) = last_count(&p.counter_log);
        let (n0, n1) = (n0.unwrap_or(0), n1.unwrap_or(0));
        assert!(
            size1 > *size0 && n1 >= n0 + 5,
            "{} did not keep growing while the daemon was down: {size0} bytes (count {n0}) at \
             the kill, {size1} bytes (count {n1}) 2 s later",
            p.counter_log.display()
        );
    }
    let shims_alive: Vec<HostProcess> = pods.iter().map(|p| shim_process(&env.d, &p.id)).collect();
    assert_eq!(shims_alive.len(), 10);

    env.d.restart().await.expect("restarting the daemon");
    let restart_ns = now_nanos();
    let d = &env.d;

    // Everything is as it was, and the exits that happened meanwhile are known.
    let listed = d.list_pods(None).await.expect("ListPodSandbox");
    assert_eq!(listed.len(), 10, "{listed:#?}");
    for p in &pods {
        let st = d.pod_status(&p.id).await.expect("PodSandboxStatus");
        assert_eq!(st.state, SandboxReady as i32, "pod {}: {st:#?}", p.id);
        assert_eq!(st.metadata, p.cfg.metadata);
        let c = d
            .container_status(&p.counter)
            .await
            .expect("ContainerStatus");
        let was = &before[&p.counter];
        assert_eq!(c.state, ContainerRunning as i32, "{c:#?}");
        assert_eq!(
            (c.created_at, c.started_at, c.finished_at),
            (was.created_at, was.started_at, 0),
            "counter of {} after the restart: {c:#?}, before: {was:#?}",
            p.id
        );
        assert_eq!(c.log_path, was.log_path);
        if let Some((eid, code)) = &p.exiter {
            let st = d.container_status(eid).await.expect("ContainerStatus");
            assert_eq!(
                (st.state, st.exit_code),
                (ContainerExited as i32, *code),
                "exiter of {}: {st:#?}\nshim log:\n{}",
                p.id,
                shim_log(d, &p.id)
            );
            assert!(
                st.started_at >= started_exiters
                    && st.finished_at > kill_ns
                    && st.finished_at < restart_ns
                    && st.finished_at - st.started_at >= 1_000_000_000,
                "exiter of {} should have started after {started_exiters}, exited 1.5 s later \
                 while the daemon was down ({kill_ns}..{restart_ns}): {st:#?}",
                p.id
            );
            assert_eq!(st.reason, "Error", "{st:#?}");
        }
    }
    let all = d.list_containers(None).await.expect("ListContainers");
    assert_eq!(all.len(), 13, "{all:#?}");
    let running = all
        .iter()
        .filter(|c| c.state == ContainerRunning as i32)
        .count();
    assert_eq!(running, 10, "{all:#?}");

    // Recovered containers still work: exec, logs, stop, remove.
    let p0 = &pods[0];
    let r = d
        .exec_sync(&p0.counter, &["sh", "-c", "echo recovered; exit 4"], 10)
        .await
        .expect("ExecSync in a recovered container");
    assert_eq!(
        (r.exit_code, String::from_utf8_lossy(&r.stdout).into_owned()),
        (4, "recovered\n".to_string())
    );
    let (_, n) = last_count(&p0.counter_log);
    let want = (n.unwrap_or(0) + 3).to_string();
    wait_for_log_line(&p0.counter_log, "stdout", &want, WAIT).await;

    let p1 = &pods[1];
    d.stop_container(&p1.counter, 10)
        .await
        .expect("StopContainer on a recovered container");
    let st = d.container_status(&p1.counter).await.unwrap();
    assert_eq!(
        (st.state, st.exit_code),
        (ContainerExited as i32, 0),
        "{st:#?}"
    );
    assert!(st.finished_at > restart_ns, "{st:#?}");
    d.remove_container(&p1.counter)
        .await
        .expect("RemoveContainer on a recovered, stopped container");
    let (eid, _) = p0.exiter.as_ref().unwrap();
    d.remove_container(eid)
        .await
        .expect("RemoveContainer on a container that exited while the daemon was down");
    let left = d.list_container_ids(None).await.unwrap();
    assert_eq!(left.len(), 11, "{left:?}");
    assert!(
        !left.contains(&p1.counter) && !left.contains(eid),
        "{left:?}"
    );

    for p in &pods {
        d.stop_pod(&p.id).await.expect("StopPodSandbox");
        d.remove_pod(&p.id).await.expect("RemovePodSandbox");
    }
    let alive = wait_gone(&shims_alive, Duration::from_secs(5)).await;
    assert!(alive.is_empty(), "shims alive after removal: {alive:#?}");
    for p in &pods {
        assert_no_leaks(d, &p.traces).await;
    }
    env.stop();
}

/// What a task of [`daemon_sigkill_during_concurrent_run_and_create_then_restart`] got done.
#[derive(Debug)]
enum Step {
    Pod(usize, String),
    Created(usize, String),
    Started(usize),
}

#[tokio::test]
async fn daemon_sigkill_during_concurrent_run_and_create_then_restart() {
    const N: usize = 20;
    let mut env = PodEnv::start().await;
    let cfgs: Vec<cri::PodSandboxConfig> = (0..N)
        .map(|i| env.pod_config(&format!("storm-{i}")))
        .collect();
    let markers: Vec<String> = (0..N).map(|i| marker(&format!("storm{i}"))).collect();
    let uid = |cfg: &cri::PodSandboxConfig| cfg.metadata.as_ref().unwrap().uid.clone();

    let client = env.d.runtime_client();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Step>();
    let mut tasks = Vec::new();
    for i in 0..N {
        let mut client = client.clone();
        let cfg = cfgs[i].clone();
        let c = sh_container(&env, "main", COUNTER, &markers[i]);
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let Ok(r) = client
                .run_pod_sandbox(cri::RunPodSandboxRequest {
                    config: Some(cfg.clone()),
                    runtime_handler: String::new(),
                })
                .await
            else {
                return;
            };
            let pod = r.into_inner().pod_sandbox_id;
            let _ = tx.send(Step::Pod(i, pod.clone()));
            let Ok(r) = client
                .create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: pod,
                    config: Some(c),
                    sandbox_config: Some(cfg),
                })
                .await
            else {
                return;
            };
            let id = r.into_inner().container_id;
            let _ = tx.send(Step::Created(i, id.clone()));
            if client
                .start_container(cri::StartContainerRequest { container_id: id })
                .await
                .is_ok()
            {
                let _ = tx.send(Step::Started(i));
            }
        }));
    }
    drop(tx);
    drop(client);

    // Kill while calls are in flight: at least 300 ms in and 150 ms after the first pod is ready,
    // so some RunPodSandbox calls are done and others not, and CreateContainer calls have begun
    // (on a slow machine that takes longer).
    let t0 = Instant::now();
    let mut steps: Vec<Step> = Vec::new();
    let mut first_pod: Option<Instant> = None;
    loop {
        let kill_at = first_pod
            .map(|t| (t + Duration::from_millis(150)).max(t0 + Duration::from_millis(300)));
        if kill_at.is_some_and(|k| Instant::now() >= k) || t0.elapsed() > WAIT {
            break;
        }
        let until = kill_at.unwrap_or(t0 + WAIT);
        match tokio::time::timeout_at(until.into(), rx.recv()).await {
            Ok(Some(s)) => {
                if first_pod.is_none() && matches!(s, Step::Pod(..)) {
                    first_pod = Some(Instant::now());
                }
                steps.push(s);
            }
            Ok(None) => break,
            Err(_) => {}
        }
    }
    let killed_after = t0.elapsed();
    env.d.kill();
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    while let Ok(s) = rx.try_recv() {
        steps.push(s);
    }
    eprintln!("killed the daemon after {killed_after:?}; the callers got: {steps:?}");

    // What the daemon had on disk when it died.
    let root = env.d.root_dir();
    let pod_records: Vec<PodRecord> = RecordDir::new(root.join("records/pods"))
        .unwrap()
        .load_all()
        .records;
    let container_records: Vec<ContainerRecord> = RecordDir::new(root.join("records/containers"))
        .unwrap()
        .load_all()
        .records;
    let record_of = |cfg: &cri::PodSandboxConfig| {
        pod_records
            .iter()
            .find(|r| r.config.metadata.as_ref().map(|m| &m.uid) == Some(&uid(cfg)))
    };
    let creating: BTreeSet<String> = pod_records
        .iter()
        .filter(|r| r.state == PodState::Creating)
        .map(|r| r.id.clone())
        .collect();
    let half_created: BTreeSet<String> = container_records
        .iter()
        .filter(|c| c.last.is_none())
        .map(|c| c.id.clone())
        .collect();
    eprintln!(
        "at the kill: {} pod records ({} creating), {} container records ({} half created)",
        pod_records.len(),
        creating.len(),
        container_records.len(),
        half_created.len()
    );

    // Traces of every pod, those without an ID under a made-up one (their uid, cgroup parent and
    // processes are still checked).
    let procs = host_processes();
    let mut traces: Vec<PodTraces> = cfgs
        .iter()
        .map(|cfg| {
            let id = record_of(cfg).map_or_else(|| random_hex(32), |r| r.id.clone());
            let mut t = PodTraces::new(&id, cfg);
            for c in container_records.iter().filter(|c| c.pod_id == id) {
                t.add_container(&c.id);
            }
            let roots: Vec<i32> = procs
                .iter()
                .filter(|p| !p.is_zombie() && p.command().contains(&id))
                .map(|p| p.pid)
                .collect();
            t.processes = with_descendants(&procs, &roots)
                .into_iter()
                .filter(|p| !p.is_zombie())
                .collect();
            t.pod_dirs.insert(pod_state_dir(&env.d, &id));
            t
        })
        .collect();

    env.d.restart().await.expect("restarting the daemon");
    let d = &env.d;

    // Each pod is whole or gone: the ready ones are back, the half-made ones rolled back.
    let listed = d.list_pods(None).await.expect("ListPodSandbox");
    let listed_ids: BTreeSet<String> = listed.iter().map(|p| p.id.clone()).collect();
    let ready_at_kill: BTreeSet<String> = pod_records
        .iter()
        .filter(|r| r.state == PodState::Ready)
        .map(|r| r.id.clone())
        .collect();
    assert_eq!(
        listed_ids,
        ready_at_kill,
        "after the restart ListPodSandbox should hold exactly the pods that were ready at the \
         kill ({} creating ones rolled back): {listed:#?}",
        creating.len()
    );
    for p in &listed {
        assert_eq!(
            p.state,
            SandboxReady as i32,
            "pod {} ({:?}) was ready at the kill but is not after the restart; the daemon's log \
             about it:\n{}\nand about its containers {:?}:\n{}",
            p.id,
            p.metadata.as_ref().map(|m| &m.name),
            log_lines_about(d, &p.id),
            container_records
                .iter()
                .filter(|c| c.pod_id == p.id)
                .map(|c| (&c.id, c.last.as_ref().map(|l| &l.status)))
                .collect::<Vec<_>>(),
            container_records
                .iter()
                .filter(|c| c.pod_id == p.id)
                .map(|c| log_lines_about(d, &c.id))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let containers = d.list_containers(None).await.expect("ListContainers");
    // What a caller was told is done stays done.
    for s in &steps {
        match s {
            Step::Pod(i, id) => assert!(
                listed_ids.contains(id),
                "pod storm-{i} ({id}) was reported ready to its caller but is gone"
            ),
            Step::Created(i, id) => assert!(
                containers.iter().any(|c| &c.id == id),
                "container {id} of storm-{i} was reported created to its caller but is gone"
            ),
            Step::Started(i) => {
                let id = steps.iter().find_map(|s| match s {
                    Step::Created(j, id) if j == i => Some(id),
                    _ => None,
                });
                let c = containers.iter().find(|c| Some(&c.id) == id);
                assert!(
                    c.is_some_and(|c| c.state == ContainerRunning as i32),
                    "the container of storm-{i} was reported started to its caller but is \
                     {c:#?}"
                );
            }
        }
    }
    for id in &creating {
        assert!(
            !pod_state_dir(d, id).exists(),
            "the rolled back pod {id} still has its state dir"
        );
    }
    for c in &containers {
        assert!(
            listed_ids.contains(&c.pod_sandbox_id),
            "container of an unlisted pod: {c:#?}"
        );
        assert!(
            !half_created.contains(&c.id),
            "a CreateContainer interrupted by the kill was not rolled back: {c:#?}"
        );
        assert!(
            c.state == ContainerCreated as i32 || c.state == ContainerRunning as i32,
            "{c:#?}"
        );
    }

    // The recovered pods are usable: containers start (or run) and exec, new ones can be added.
    for p in &listed {
        let i = cfgs
            .iter()
            .position(|c| c.metadata == p.metadata)
            .expect("a pod of ours");
        let mut ids: Vec<String> = containers
            .iter()
            .filter(|c| c.pod_sandbox_id == p.id)
            .map(|c| c.id.clone())
            .collect();
        if ids.is_empty() {
            let c = sh_container(&env, "main", COUNTER, &markers[i]);
            let id = d
                .run_container(&p.id, &c, &cfgs[i])
                .await
                .unwrap_or_else(|e| panic!("running a container in recovered pod {}: {e:?}", p.id));
            ids.push(id);
        }
        for id in &ids {
            traces[i].add_container(id);
            let st = d.container_status(id).await.unwrap();
            if st.state == ContainerCreated as i32 {
                d.start_container(id)
                    .await
                    .unwrap_or_else(|e| panic!("starting recovered container {id}: {e:?}"));
            }
            d.wait_container_state(id, ContainerRunning, WAIT).await;
            assert_eq!(d.exec_ok(id, &["echo", "ok"]).await, "ok\n");
        }
        traces[i].capture(d).await;
    }

    // Names of rolled-back pods are free again.
    let mut reused = 0;
    for (i, cfg) in cfgs.iter().enumerate() {
        if record_of(cfg).is_some_and(|r| creating.contains(&r.id)) {
            let id = d.run_pod(cfg).await.unwrap_or_else(|e| {
                panic!("RunPodSandbox with the metadata of rolled back pod storm-{i}: {e:?}")
            });
            traces[i].pod_dirs.insert(pod_state_dir(d, &id));
            d.remove_pod(&id).await.expect("RemovePodSandbox");
            traces[i].pod_id = id;
            reused += 1;
        }
    }
    // And so are those the daemon never recorded (one is enough).
    if let Some(i) = cfgs.iter().position(|c| record_of(c).is_none()) {
        let id = d
            .run_pod(&cfgs[i])
            .await
            .expect("RunPodSandbox of a pod whose call the kill cut short");
        d.remove_pod(&id).await.expect("RemovePodSandbox");
        traces[i].pod_id = id;
    }
    eprintln!(
        "{} pods recovered, {} rolled back and run again",
        listed.len(),
        reused
    );

    for p in &listed {
        d.stop_pod(&p.id).await.expect("StopPodSandbox");
        d.remove_pod(&p.id).await.expect("RemovePodSandbox");
    }
    assert!(d.list_pod_ids(None).await.unwrap().is_empty());
    for t in &traces {
        assert_no_leaks(d, t).await;
    }
    let left = processes_with_command(&d.state_dir().to_string_lossy());
    assert!(left.is_empty(), "processes naming the state dir: {left:#?}");
    env.stop();
}

// ---------------------------------------------------------------------------------------------
// A shim SIGKILLed

#[tokio::test]
async fn shim_sigkill_reports_containers_exited_and_pod_cleans_up() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("shim-dies");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let m = marker("orphaned");
    let c = sh_container(&env, "main", COUNTER, &m);
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run container");
    traces.add_container(&id);
    wait_for_log_line(
        &Path::new(&cfg.log_directory).join("main.log"),
        "stdout",
        "1",
        WAIT,
    )
    .await;
    traces.capture(d).await;
    let shim = shim_process(d, &pod);
    let infra = pid_file_process(d, &pod, "infra.pid");
    let container_procs = processes_with_command(&m);
    assert!(!container_procs.is_empty(), "no process runs {m}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shim.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL the shim");
    let killed_ns = now_nanos();

    let st = wait_container(d, &id, Duration::from_secs(5), "exited", |s| {
        s.state == ContainerExited as i32
    })
    .await;
    assert!(
        st.message.to_lowercase().contains("shim"),
        "the status of a container whose shim died should say so: {st:#?}"
    );
    assert!(
        st.exit_code == 137 || st.exit_code == 255,
        "exit code of a container whose shim died: {st:#?}"
    );
    assert!(
        st.finished_at >= killed_ns - 1_000_000_000 && st.started_at > 0,
        "{st:#?}"
    );
    let ps = wait_pod_state(d, &pod, SandboxNotready, Duration::from_secs(5)).await;
    assert_eq!(ps.id, pod);

    // Nothing of the pod keeps running on the host.
    let alive = wait_gone(&container_procs, Duration::from_secs(5)).await;
    assert!(
        alive.is_empty(),
        "container processes outlived their shim: {alive:#?}\ndaemon log:\n{}",
        tail(&d.log_text(), 4000)
    );
    let alive = wait_gone(&[infra], Duration::from_secs(5)).await;
    assert!(
        alive.is_empty(),
        "the infra process outlived its shim: {alive:#?}"
    );

    // The container stays exited with the same story, and the pod goes away cleanly.
    let again = d.container_status(&id).await.unwrap();
    assert_eq!(
        (
            again.state,
            again.exit_code,
            &again.message,
            again.finished_at
        ),
        (st.state, st.exit_code, &st.message, st.finished_at)
    );
    let listed = d
        .list_container_ids(Some(crishim_tests::pods::container_state_filter(
            ContainerExited,
        )))
        .await
        .unwrap();
    assert_eq!(listed, vec![id.clone()]);
    d.stop_pod(&pod)
        .await
        .expect("StopPodSandbox after the shim died");
    d.remove_pod(&pod)
        .await
        .expect("RemovePodSandbox after the shim died");
    // The daemon is the shims' subreaper, so what the dead shim left becomes its children.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let zombies = daemon_zombies(d, &traces.processes);
    assert!(
        zombies.is_empty(),
        "the daemon left zombie children after the shim died and the pod was removed: {zombies:?}"
    );
    assert_no_leaks(d, &traces).await;
    env.stop();
}

// ---------------------------------------------------------------------------------------------
// The infra process as PID 1

#[tokio::test]
async fn zombie_storm_in_shared_pid_pod_leaves_no_zombies() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut cfg = env.pod_config("zombies");
    set_pod_namespaces(&mut cfg, namespaces(NS_POD, NS_POD, NS_POD));
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let m = marker("storm");
    let c = sh_container(
        &env,
        "storm",
        "for i in $(seq 500); do (sleep 0.01 &) ; done; echo spawned; sleep 3600",
        &m,
    );
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run container");
    traces.add_container(&id);
    let pid1 = d.exec_ok(&id, &["cat", "/proc/1/cmdline"]).await;
    assert_eq!(
        pid1.trim_end_matches('\0'),
        "crishim-pause",
        "PID 1 of the shared pid namespace"
    );
    wait_for_log_line(
        &Path::new(&cfg.log_directory).join("storm.log"),
        "stdout",
        "spawned",
        WAIT,
    )
    .await;
    let shim = shim_process(d, &pod);
    traces.capture(d).await;

    // The last orphan sleeps 10 ms; give the infra process a moment to reap them all.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let tree = loop {
        let tree = with_descendants(&host_processes(), &[shim.pid]);
        let zombies = tree.iter().filter(|p| p.is_zombie()).count();
        if (zombies == 0 && tree.len() <= 6) || Instant::now() > deadline {
            break tree;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let zombies: Vec<&HostProcess> = tree.iter().filter(|p| p.is_zombie()).collect();
    assert!(
        zombies.is_empty(),
        "{} zombie(s) in the pod 2 s after the storm: {zombies:#?}\nshim log:\n{}",
        zombies.len(),
        shim_log(d, &pod)
    );
    // The shim, infra, the container's shell and its `sleep 3600` (and no leftover orphans).
    assert!(
        tree.len() <= 6,
        "the pod has {} processes after the storm (orphans not reaped?): {tree:#?}",
        tree.len()
    );
    // (The shell execs its last command.)
    assert!(
        tree.iter().any(|p| p.cmdline == ["sleep", "3600"]),
        "the container's `sleep 3600` is not under the shim: {tree:#?}"
    );
    let ps = d.exec_ok(&id, &["ps", "-o", "pid,stat,comm"]).await;
    assert!(
        !ps.lines().skip(1).any(|l| l
            .split_whitespace()
            .nth(1)
            .is_some_and(|s| s.starts_with('Z'))),
        "zombies seen from inside the pod:\n{ps}"
    );

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

// ---------------------------------------------------------------------------------------------
// GetContainerEvents

#[tokio::test]
async fn container_events_follow_a_container_lifecycle() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut ev = Events::subscribe(d).await;

    let cfg = env.pod_config("events");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let e = ev.expect(&pod, ContainerCreatedEvent, WAIT).await;
    assert_eq!(
        e.pod_sandbox_status.as_ref().map(|s| s.id.as_str()),
        Some(pod.as_str()),
        "{e:#?}"
    );
    let e = ev.expect(&pod, ContainerStartedEvent, WAIT).await;
    let ps = e.pod_sandbox_status.as_ref().expect("pod_sandbox_status");
    assert_eq!(
        (ps.id.as_str(), ps.state),
        (pod.as_str(), SandboxReady as i32),
        "{e:#?}"
    );

    let c = sh_container(&env, "short", "sleep 1; exit 7", &marker("short"));
    let id = d
        .create_container(&pod, &c, &cfg)
        .await
        .expect("CreateContainer");
    traces.add_container(&id);
    let e = ev.expect(&id, ContainerCreatedEvent, WAIT).await;
    let st = e
        .containers_statuses
        .iter()
        .find(|s| s.id == id)
        .unwrap_or_else(|| panic!("CREATED event without the container's status: {e:#?}"));
    assert_eq!(st.state, ContainerCreated as i32, "{e:#?}");
    d.start_container(&id).await.expect("StartContainer");
    let e = ev.expect(&id, ContainerStartedEvent, WAIT).await;
    let st = e
        .containers_statuses
        .iter()
        .find(|s| s.id == id)
        .unwrap_or_else(|| panic!("STARTED event without the container's status: {e:#?}"));
    assert_eq!(st.state, ContainerRunning as i32, "{e:#?}");
    traces.capture(d).await;

    // It exits by itself; the event comes promptly, without anyone asking for its status.
    let e = ev.expect(&id, ContainerStoppedEvent, WAIT).await;
    let got_ns = now_nanos();
    let st = e
        .containers_statuses
        .iter()
        .find(|s| s.id == id)
        .unwrap_or_else(|| panic!("STOPPED event without the container's status: {e:#?}"));
    assert_eq!(
        (st.state, st.exit_code),
        (ContainerExited as i32, 7),
        "{e:#?}"
    );
    assert!(st.finished_at > 0, "{e:#?}");
    let lag = Duration::from_nanos((got_ns - st.finished_at).max(0) as u64);
    assert!(
        lag < Duration::from_secs(2),
        "the STOPPED event came {lag:?} after the exit"
    );
    assert_eq!(
        e.pod_sandbox_status.as_ref().map(|s| s.id.as_str()),
        Some(pod.as_str()),
        "{e:#?}"
    );

    d.remove_container(&id).await.expect("RemoveContainer");
    let e = ev.expect(&id, ContainerDeletedEvent, WAIT).await;
    assert!(
        e.containers_statuses.iter().all(|s| s.id != id),
        "the DELETED event still lists the removed container: {e:#?}"
    );

    d.stop_pod(&pod).await.expect("StopPodSandbox");
    let e = ev.expect(&pod, ContainerStoppedEvent, WAIT).await;
    let ps = e.pod_sandbox_status.as_ref().expect("pod_sandbox_status");
    assert_eq!(
        (ps.id.as_str(), ps.state),
        (pod.as_str(), SandboxNotready as i32),
        "{e:#?}"
    );
    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    ev.expect(&pod, ContainerDeletedEvent, WAIT).await;
    ev.drain(Duration::from_millis(500)).await;

    // Each lifecycle exactly once, in order, and every event names its pod.
    let lifecycle = vec![
        ContainerCreatedEvent as i32,
        ContainerStartedEvent as i32,
        ContainerStoppedEvent as i32,
        ContainerDeletedEvent as i32,
    ];
    assert_eq!(ev.kinds_for(&id), lifecycle, "{}", ev.summary());
    assert_eq!(ev.kinds_for(&pod), lifecycle, "{}", ev.summary());
    for e in &ev.seen {
        assert_eq!(
            e.pod_sandbox_status.as_ref().map(|s| s.id.as_str()),
            Some(pod.as_str()),
            "event without its pod's status: {e:#?}"
        );
        assert!(e.created_at > 0, "{e:#?}");
    }
    drop(ev);
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// A kubelet keeps its `GetContainerEvents` stream open for ever; SIGTERM must still stop the
/// daemon promptly (ending the stream), not wait for the subscriber to go away.
#[tokio::test]
async fn sigterm_with_an_events_subscriber_connected_exits_promptly() {
    let env = PodEnv::start().await;
    let mut ev = Events::subscribe(&env.d).await;
    let cfg = env.pod_config("subscribed");
    let pod = env.d.run_pod(&cfg).await.expect("RunPodSandbox");
    let traces = PodTraces::new(&pod, &cfg);
    ev.expect(&pod, ContainerStartedEvent, WAIT).await;
    env.d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(&env.d, &traces).await;
    // `stop` asserts exit status 0 within 10 s of SIGTERM, while `ev` is still subscribed.
    let t0 = Instant::now();
    env.stop();
    eprintln!("the daemon stopped {:?} after SIGTERM", t0.elapsed());
    drop(ev);
}

// ---------------------------------------------------------------------------------------------
// Exits while the daemon is down

#[tokio::test]
async fn exits_while_the_daemon_is_down_are_recovered() {
    let mut env = PodEnv::start().await;
    let cfg = env.pod_config("exit-while-down");
    let (pod, id, traces) = {
        let d = &env.d;
        let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
        let mut traces = PodTraces::new(&pod, &cfg);
        let c = sh_container(
            &env,
            "main",
            "echo up; sleep 1; echo down; exit 5",
            &marker("ewd"),
        );
        let id = d
            .run_container(&pod, &c, &cfg)
            .await
            .expect("run container");
        traces.add_container(&id);
        traces.capture(d).await;
        (pod, id, traces)
    };
    let kill_ns = now_nanos();
    env.d.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The shim saw the exit and kept the log.
    wait_for_log_line(
        &Path::new(&cfg.log_directory).join("main.log"),
        "stdout",
        "down",
        WAIT,
    )
    .await;
    env.d.restart().await.expect("restarting the daemon");
    let restart_ns = now_nanos();
    let d = &env.d;
    let mut ev = Events::subscribe(d).await;

    let st = d.container_status(&id).await.expect("ContainerStatus");
    assert_eq!(
        (st.state, st.exit_code),
        (ContainerExited as i32, 5),
        "{st:#?}\nshim log:\n{}",
        shim_log(d, &pod)
    );
    assert!(
        st.finished_at > kill_ns
            && st.finished_at < restart_ns
            && st.finished_at - st.started_at >= 1_000_000_000,
        "finished_at should be 1 s after started_at, while the daemon was down \
         ({kill_ns}..{restart_ns}): {st:#?}"
    );
    assert_eq!(st.reason, "Error", "{st:#?}");
    let ps = d.pod_status(&pod).await.unwrap();
    assert_eq!(ps.state, SandboxReady as i32, "{ps:#?}");

    // The daemon re-announces exits it learns of at start-up, but that happens before it listens,
    // so a subscriber (like a kubelet reconnecting) may or may not see it: not asserted. What a
    // subscriber must never see is a second STOPPED for the same exit later.
    let reannounced = ev
        .next_where(Duration::from_secs(2), |e| {
            e.container_id == id && e.container_event_type == ContainerStoppedEvent as i32
        })
        .await;
    eprintln!(
        "STOPPED re-announced to a subscriber after the restart: {}",
        reannounced.is_some()
    );
    if let Some(e) = &reannounced {
        let st = e.containers_statuses.iter().find(|s| s.id == id);
        assert!(
            st.is_some_and(|s| s.state == ContainerExited as i32 && s.exit_code == 5),
            "{e:#?}"
        );
    }

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    ev.drain(Duration::from_millis(300)).await;
    let stopped = ev
        .kinds_for(&id)
        .iter()
        .filter(|k| **k == ContainerStoppedEvent as i32)
        .count();
    assert!(
        stopped <= 1,
        "the exit was announced {stopped} times: {}",
        ev.summary()
    );
    drop(ev);
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// The relist and the status calls read the daemon's own state, which the operations and each
/// shim's `Watch` stream keep current: with the pod's shim frozen (SIGSTOP) they still answer at
/// once. (They used to ask the shim of every running container in turn, and wait up to 30 s.)
#[tokio::test]
async fn list_and_status_do_not_ask_a_frozen_shim() {
    use nix::sys::signal::{kill, Signal};
    let env = PodEnv::start().await;
    let d = &env.d;
    let (pod, id) = env.run_sleeping("frozen").await;
    // The Watch stream is followed once the shim has said it caught up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let shim = nix::unistd::Pid::from_raw(shim_process(d, &pod).pid);
    kill(shim, Signal::SIGSTOP).unwrap();
    let t0 = Instant::now();
    let listed = tokio::time::timeout(WAIT, d.list_containers(None)).await;
    let status = tokio::time::timeout(WAIT, d.container_status(&id)).await;
    let took = t0.elapsed();
    kill(shim, Signal::SIGCONT).unwrap();
    let listed = listed.expect("ListContainers in time").unwrap();
    let status = status.expect("ContainerStatus in time").unwrap();
    assert!(
        listed
            .iter()
            .any(|c| c.id == id && c.state == ContainerRunning as i32),
        "{listed:#?}"
    );
    assert_eq!(status.state, ContainerRunning as i32, "{status:#?}");
    assert!(
        took < Duration::from_secs(2),
        "ListContainers + ContainerStatus took {took:?} with the shim frozen"
    );
    env.stop();
}
