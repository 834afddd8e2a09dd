//! The CRI RuntimeService of the `crishim` daemon: pods and containers, run for real (busybox
//! from a real `docker-registry`, pulled through the daemon), observed from the host.
//!
//! Every test starts its own registry and daemon (tests run in parallel) and uses unique pod
//! names. Every test that runs a pod ends with [`assert_no_leaks`] for it: no process, mount,
//! cgroup, network namespace or state file of the pod is left. The daemon binary is
//! `$CRISHIM_BIN` or `target/<profile>/crishim` (`cargo build -p crishim -p crishim-shim`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::cri::spec;
use crishim_tests::daemon::{check_prometheus_text, metrics_address, metrics_toml, sample, scrape};
use crishim_tests::fsutil::walk;
use crishim_tests::pods::{
    assert_no_leaks, container_filter, container_security, container_state_filter, find_leaks,
    host_processes, is_id, labels, mounts, mounts_under, namespaces, parse_cri_log,
    pod_state_filter, processes_with_command, reassemble, set_container_privileged,
    set_pod_namespaces, set_pod_privileged, wait_for_log_line, wait_no_process_with_command,
    with_descendants, HostProcess, PodEnv, PodTraces, IGNORE_TERM, LOOP_UNTIL_TERM, NS_CONTAINER,
    NS_NODE, NS_POD,
};
use crishim_tests::pods::{marker, sh_container};
use crishim_tests::{busybox_image, random_hex, Daemon, DaemonOptions};
use tonic::Code;

use cri::ContainerState::{ContainerCreated, ContainerExited, ContainerRunning};
use cri::PodSandboxState::{SandboxNotready, SandboxReady};

const WAIT: Duration = Duration::from_secs(30);

#[track_caller]
fn assert_code<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected {code:?}, got Ok({v:?})"),
        Err(e) => assert_eq!(e.code(), code, "{what}: unexpected status {e:?}"),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ids(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

/// The live `crishim-shim start` processes of this daemon (command line holds its state dir).
fn shims(d: &Daemon) -> Vec<HostProcess> {
    let state = d.state_dir().to_string_lossy().into_owned();
    host_processes()
        .into_iter()
        .filter(|p| {
            !p.is_zombie()
                && p.cmdline
                    .first()
                    .is_some_and(|a| a.ends_with("crishim-shim"))
                && p.cmdline.get(1).is_some_and(|a| a == "start")
                && p.command().contains(&state)
        })
        .collect()
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

// ---------------------------------------------------------------------------------------------
// Lifecycle

#[tokio::test]
async fn pod_and_container_full_lifecycle() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut cfg = env.pod_config("lifecycle");
    cfg.hostname = "lifecycle-host".to_string();
    cfg.dns_config = Some(cri::DnsConfig {
        servers: vec!["10.96.0.10".to_string(), "10.96.0.11".to_string()],
        searches: vec![
            "crishim-test.svc.cluster.local".to_string(),
            "cluster.local".to_string(),
        ],
        options: vec!["ndots:5".to_string()],
    });
    cfg.labels
        .insert("app".to_string(), "lifecycle".to_string());
    cfg.annotations
        .insert("crishim.test/pod".to_string(), "pod-note".to_string());
    let parent = cfg.linux.as_ref().unwrap().cgroup_parent.clone();

    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    assert!(is_id(&pod), "pod ID {pod:?} is not 64 hex characters");
    let mut traces = PodTraces::new(&pod, &cfg);

    // PodSandboxStatus and ListPodSandbox with each filter.
    let st = d.pod_status(&pod).await.expect("PodSandboxStatus");
    assert_eq!(st.id, pod);
    assert_eq!(st.state, SandboxReady as i32, "{st:#?}");
    assert_eq!(st.metadata, cfg.metadata);
    assert!(st.created_at > 0, "{st:#?}");
    assert_eq!(st.labels.get("app").map(String::as_str), Some("lifecycle"));
    assert_eq!(
        st.annotations.get("crishim.test/pod").map(String::as_str),
        Some("pod-note")
    );
    assert_eq!(d.list_pod_ids(None).await.unwrap(), ids(&[&pod]));
    let by_id = cri::PodSandboxFilter {
        id: pod.clone(),
        ..Default::default()
    };
    assert_eq!(d.list_pod_ids(Some(by_id)).await.unwrap(), ids(&[&pod]));
    let other_id = cri::PodSandboxFilter {
        id: random_hex(32),
        ..Default::default()
    };
    assert!(d.list_pod_ids(Some(other_id)).await.unwrap().is_empty());
    assert_eq!(
        d.list_pod_ids(Some(pod_state_filter(SandboxReady)))
            .await
            .unwrap(),
        ids(&[&pod])
    );
    assert!(d
        .list_pod_ids(Some(pod_state_filter(SandboxNotready)))
        .await
        .unwrap()
        .is_empty());
    let by_label = |v: &str| cri::PodSandboxFilter {
        label_selector: labels(&[("app", v)]),
        ..Default::default()
    };
    assert_eq!(
        d.list_pod_ids(Some(by_label("lifecycle"))).await.unwrap(),
        ids(&[&pod])
    );
    assert!(d
        .list_pod_ids(Some(by_label("other")))
        .await
        .unwrap()
        .is_empty());
    let listed = d.list_pods(None).await.unwrap();
    assert_eq!(listed[0].metadata, cfg.metadata);
    assert_eq!(listed[0].state, SandboxReady as i32);

    // One shim for the pod and one infra process under it.
    let shim = shims(d);
    assert_eq!(
        shim.len(),
        1,
        "expected one crishim-shim start process: {shim:#?}"
    );
    let tree = with_descendants(&host_processes(), &[shim[0].pid]);
    let infra: Vec<_> = tree
        .iter()
        .filter(|p| p.cmdline == ["crishim-pause"])
        .collect();
    assert_eq!(
        infra.len(),
        1,
        "expected one `crishim-pause` under the shim: {tree:#?}"
    );

    // A container that prints, then runs until SIGTERM.
    let main_marker = marker("main");
    let mut c = sh_container(
        &env,
        "main",
        &format!("echo hello; {LOOP_UNTIL_TERM}"),
        &main_marker,
    );
    c.labels.insert("tier".to_string(), "main".to_string());
    c.annotations
        .insert("crishim.test/container".to_string(), "ctr-note".to_string());
    let id = d
        .create_container(&pod, &c, &cfg)
        .await
        .expect("CreateContainer");
    assert!(is_id(&id), "container ID {id:?} is not 64 hex characters");
    traces.add_container(&id);
    let st = d.container_status(&id).await.expect("ContainerStatus");
    assert_eq!(st.state, ContainerCreated as i32, "{st:#?}");
    assert!(st.created_at > 0 && st.started_at == 0, "{st:#?}");
    assert_eq!(
        d.list_container_ids(Some(container_state_filter(ContainerCreated)))
            .await
            .unwrap(),
        ids(&[&id])
    );

    d.start_container(&id).await.expect("StartContainer");
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.id, id);
    assert_eq!(st.state, ContainerRunning as i32, "{st:#?}");
    assert!(st.started_at >= st.created_at, "{st:#?}");
    assert_eq!(st.finished_at, 0, "{st:#?}");
    assert_eq!(st.metadata, c.metadata);
    assert_eq!(st.labels.get("tier").map(String::as_str), Some("main"));
    assert_eq!(
        st.annotations
            .get("crishim.test/container")
            .map(String::as_str),
        Some("ctr-note")
    );
    let log_path = Path::new(&cfg.log_directory).join("main.log");
    assert_eq!(Path::new(&st.log_path), log_path, "{st:#?}");
    let image = st
        .image
        .as_ref()
        .map(|i| i.image.clone())
        .unwrap_or_default();
    assert!(
        image == env.busybox.tag_ref() || image == env.busybox.image_id(),
        "status image {image:?} is neither {} nor {}",
        env.busybox.tag_ref(),
        env.busybox.image_id()
    );
    assert!(
        st.image_ref == env.busybox.image_id() || st.image_ref == env.busybox.digest_ref(),
        "image_ref {:?} is neither {} nor {}",
        st.image_ref,
        env.busybox.image_id(),
        env.busybox.digest_ref()
    );
    wait_for_log_line(&log_path, "stdout", "hello", WAIT).await;

    // ListContainers and its filters.
    assert_eq!(d.list_container_ids(None).await.unwrap(), ids(&[&id]));
    let listed = d.list_containers(None).await.unwrap();
    assert_eq!(listed[0].pod_sandbox_id, pod);
    assert_eq!(listed[0].state, ContainerRunning as i32);
    assert_eq!(listed[0].metadata, c.metadata);
    assert!(!listed[0].image_ref.is_empty(), "{listed:#?}");
    let f = |f: cri::ContainerFilter| async { d.list_container_ids(Some(f)).await.unwrap() };
    assert_eq!(
        f(cri::ContainerFilter {
            id: id.clone(),
            ..container_filter()
        })
        .await,
        ids(&[&id])
    );
    assert!(f(cri::ContainerFilter {
        id: random_hex(32),
        ..container_filter()
    })
    .await
    .is_empty());
    assert_eq!(
        f(cri::ContainerFilter {
            pod_sandbox_id: pod.clone(),
            ..container_filter()
        })
        .await,
        ids(&[&id])
    );
    assert!(f(cri::ContainerFilter {
        pod_sandbox_id: random_hex(32),
        ..container_filter()
    })
    .await
    .is_empty());
    assert_eq!(
        f(container_state_filter(ContainerRunning)).await,
        ids(&[&id])
    );
    assert!(f(container_state_filter(ContainerExited)).await.is_empty());
    assert_eq!(
        f(cri::ContainerFilter {
            label_selector: labels(&[("tier", "main")]),
            pod_sandbox_id: pod.clone(),
            ..container_filter()
        })
        .await,
        ids(&[&id])
    );
    assert!(f(cri::ContainerFilter {
        label_selector: labels(&[("tier", "other")]),
        ..container_filter()
    })
    .await
    .is_empty());

    // On the host: the container's shell runs under the shim, in cgroups below the parent.
    let procs = processes_with_command(&main_marker);
    assert!(!procs.is_empty(), "no host process runs {main_marker}");
    let shim_tree = with_descendants(&host_processes(), &[shim[0].pid]);
    for p in &procs {
        assert!(
            shim_tree.iter().any(|q| q.pid == p.pid),
            "container process {} ({}) is not under the shim {}",
            p.pid,
            p.command(),
            shim[0].pid
        );
        for ctrl in ["memory", "pids", "cpu"] {
            let cg = p.cgroup_of(ctrl).unwrap_or_default();
            assert!(
                cg.starts_with(&format!("{parent}/")),
                "container process {} is in {ctrl} cgroup {cg:?}, not below the pod's cgroup parent {parent}",
                p.pid
            );
        }
    }

    // ExecSync, hostname and DNS.
    let r = d
        .exec_sync(&id, &["echo", "hi"], 10)
        .await
        .expect("ExecSync");
    assert_eq!(
        (r.exit_code, text(&r.stdout), text(&r.stderr)),
        (0, "hi\n".to_string(), String::new())
    );
    assert_eq!(d.exec_ok(&id, &["hostname"]).await, "lifecycle-host\n");
    let resolv = d.exec_ok(&id, &["cat", "/etc/resolv.conf"]).await;
    let lines: Vec<&str> = resolv.lines().map(str::trim).collect();
    for want in [
        "nameserver 10.96.0.10",
        "nameserver 10.96.0.11",
        "search crishim-test.svc.cluster.local cluster.local",
        "options ndots:5",
    ] {
        assert!(
            lines.contains(&want),
            "/etc/resolv.conf has no line {want:?}:\n{resolv}"
        );
    }

    // A second container that exits by itself with 3.
    let short = sh_container(&env, "short", "echo bye; exit 3", &marker("short"));
    let sid = d
        .run_container(&pod, &short, &cfg)
        .await
        .expect("run the short container");
    traces.add_container(&sid);
    let st = d.wait_container_state(&sid, ContainerExited, WAIT).await;
    assert_eq!(st.exit_code, 3, "{st:#?}");
    assert_eq!(st.reason, "Error", "{st:#?}");
    assert!(
        st.started_at > 0 && st.finished_at >= st.started_at,
        "{st:#?}"
    );
    assert_eq!(
        f(container_state_filter(ContainerRunning)).await,
        ids(&[&id])
    );
    assert_eq!(
        f(container_state_filter(ContainerExited)).await,
        ids(&[&sid])
    );

    traces.capture(d).await;
    assert!(
        traces.processes.iter().any(|p| p.pid == shim[0].pid)
            && traces.processes.iter().any(|p| p.pid == infra[0].pid)
            && traces
                .processes
                .iter()
                .any(|p| p.command().contains(&main_marker)),
        "capture missed the shim, the infra or the container: {:#?}",
        traces.processes
    );

    // StopContainer: the shell handles SIGTERM, so it is quick, and exit 0 is "Completed".
    let t0 = Instant::now();
    d.stop_container(&id, 30).await.expect("StopContainer");
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "StopContainer of a container that exits on SIGTERM took {took:?}"
    );
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.state, ContainerExited as i32, "{st:#?}");
    assert_eq!(st.exit_code, 0, "{st:#?}");
    assert_eq!(st.reason, "Completed", "{st:#?}");
    assert!(st.finished_at >= st.started_at, "{st:#?}");
    let left = wait_no_process_with_command(&main_marker, Duration::from_secs(5)).await;
    assert!(left.is_empty(), "stopped container still runs: {left:#?}");
    assert_eq!(
        f(container_state_filter(ContainerExited)).await,
        ids(&[&id, &sid])
    );

    // RemoveContainer.
    for c in [&id, &sid] {
        d.remove_container(c).await.expect("RemoveContainer");
        assert_code(
            d.container_status(c).await,
            Code::NotFound,
            "ContainerStatus after RemoveContainer",
        );
    }
    assert!(d.list_container_ids(None).await.unwrap().is_empty());

    // StopPodSandbox: NOTREADY, infra and shim gone.
    d.stop_pod(&pod).await.expect("StopPodSandbox");
    let st = d.pod_status(&pod).await.unwrap();
    assert_eq!(st.state, SandboxNotready as i32, "{st:#?}");
    assert_eq!(
        d.list_pod_ids(Some(pod_state_filter(SandboxNotready)))
            .await
            .unwrap(),
        ids(&[&pod])
    );
    assert!(d
        .list_pod_ids(Some(pod_state_filter(SandboxReady)))
        .await
        .unwrap()
        .is_empty());
    let alive = wait_gone(&[shim[0].clone(), infra[0].clone()], Duration::from_secs(5)).await;
    assert!(
        alive.is_empty(),
        "shim or infra alive after StopPodSandbox: {alive:#?}"
    );

    // RemovePodSandbox.
    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_code(
        d.pod_status(&pod).await,
        Code::NotFound,
        "PodSandboxStatus after RemovePodSandbox",
    );
    assert!(d.list_pod_ids(None).await.unwrap().is_empty());
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// Unlike a kubelet, this test does not create the cgroup parent: whatever the daemon creates for
/// the pod (the parent included) must be gone with it.
#[tokio::test]
async fn cgroup_parent_made_by_the_daemon_is_removed_with_the_pod() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config_with("cg-parent", false);
    let parent = cfg.linux.as_ref().unwrap().cgroup_parent.clone();
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    assert!(!traces.cgroup_parent_preexisting);
    let m = marker("cg");
    let id = d
        .run_container(&pod, &sh_container(&env, "cg", LOOP_UNTIL_TERM, &m), &cfg)
        .await
        .expect("run container");
    traces.add_container(&id);
    traces.capture(d).await;
    let procs = processes_with_command(&m);
    assert!(!procs.is_empty(), "no host process runs {m}");
    let cg = procs[0].cgroup_of("memory").unwrap_or_default();
    assert!(
        cg.starts_with(&format!("{parent}/")),
        "memory cgroup {cg:?} is not below the cgroup parent {parent}"
    );

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// Positive control for [`assert_no_leaks`]: while a pod runs, the checker sees it everywhere it
/// looks (the daemon's lists, processes, mounts, cgroups, state files).
#[tokio::test]
async fn leak_checker_sees_a_running_pod() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("leak-control");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let id = d
        .run_container(
            &pod,
            &sh_container(&env, "c", LOOP_UNTIL_TERM, &marker("leak")),
            &cfg,
        )
        .await
        .expect("run container");
    traces.add_container(&id);
    traces.capture(d).await;
    assert!(
        traces.processes.len() >= 3,
        "capture found fewer than shim + infra + container: {:#?}",
        traces.processes
    );
    assert!(!traces.pod_dirs.is_empty(), "capture found no shim --dir");

    let found = find_leaks(d, &traces).await;
    for (what, prefix) in [
        ("the pod in ListPodSandbox", "ListPodSandbox still lists"),
        (
            "the container in ListContainers",
            "ListContainers still lists",
        ),
        ("processes", "process "),
        ("mounts", "mount "),
        ("cgroups", "cgroup "),
    ] {
        assert!(
            found.iter().any(|l| l.starts_with(prefix)),
            "the leak checker does not see {what} of a running pod; it found:\n  {}",
            found.join("\n  ")
        );
    }
    assert!(
        found.iter().any(|l| l.contains("named after")),
        "the leak checker does not see the pod's state files; it found:\n  {}",
        found.join("\n  ")
    );

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

#[tokio::test]
async fn run_pod_sandbox_twice_with_the_same_metadata_is_already_exists() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("twice");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    traces.capture(d).await;

    assert_code(
        d.run_pod(&cfg).await,
        Code::AlreadyExists,
        "RunPodSandbox with the metadata of a running pod",
    );
    assert_eq!(d.list_pod_ids(None).await.unwrap(), ids(&[&pod]));
    let s = shims(d);
    assert_eq!(s.len(), 1, "the refused pod left a shim: {s:#?}");

    // Once the first is gone, the same metadata is fine again.
    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    let again = d
        .run_pod(&cfg)
        .await
        .expect("RunPodSandbox after removing the first");
    let mut traces2 = PodTraces::new(&again, &cfg);
    traces2.capture(d).await;
    assert_eq!(
        d.pod_status(&again).await.unwrap().state,
        SandboxReady as i32
    );
    d.remove_pod(&again).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces2).await;
    env.stop();
}

// ---------------------------------------------------------------------------------------------
// Logs

#[tokio::test]
async fn container_logs_are_cri_lines_long_lines_split_at_16k_and_reopenable() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("logs");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);

    // The kubelet's layout: <pod log dir>/<container name>/<attempt>.log, directory made by it.
    let log_dir = PathBuf::from(&cfg.log_directory);
    std::fs::create_dir_all(log_dir.join("logger")).unwrap();
    let script = format!(
        "echo out-marker; echo err-marker >&2; \
         head -c 40000 /dev/zero | tr '\\0' x; echo; echo after-long; \
         while ! test -e /tmp/go; do sleep 0.1; done; \
         echo second-file; echo second-err >&2; {LOOP_UNTIL_TERM}"
    );
    let mut c = sh_container(&env, "logger", &script, &marker("logger"));
    c.log_path = "logger/0.log".to_string();
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run the logging container");
    traces.add_container(&id);
    let path = log_dir.join("logger/0.log");
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(Path::new(&st.log_path), path, "{st:#?}");

    wait_for_log_line(&path, "stdout", "after-long", WAIT).await;
    wait_for_log_line(&path, "stderr", "err-marker", WAIT).await;
    let bytes = std::fs::read(&path).unwrap();
    let records = parse_cri_log(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));

    let long = "x".repeat(40000);
    assert_eq!(
        reassemble(&records, "stdout"),
        vec![
            b"out-marker".to_vec(),
            long.as_bytes().to_vec(),
            b"after-long".to_vec()
        ],
        "stdout lines"
    );
    assert_eq!(
        reassemble(&records, "stderr"),
        vec![b"err-marker".to_vec()],
        "stderr lines"
    );
    let shape: Vec<(bool, usize)> = records
        .iter()
        .filter(|r| r.stream == "stdout")
        .map(|r| (r.partial, r.text.len()))
        .collect();
    assert_eq!(
        shape,
        vec![
            (false, 10),
            (true, 16384),
            (true, 16384),
            (false, 40000 - 2 * 16384),
            (false, 10)
        ],
        "stdout records as (partial, length)"
    );

    // Rotation: the kubelet renames the file, then asks for a new one at the same path.
    let rotated = PathBuf::from(format!("{}.1", path.display()));
    std::fs::rename(&path, &rotated).unwrap();
    d.reopen_container_log(&id)
        .await
        .expect("ReopenContainerLog");
    assert!(
        path.exists(),
        "ReopenContainerLog returned but {} does not exist (the kubelet would undo the rotation)",
        path.display()
    );
    d.exec_ok(&id, &["touch", "/tmp/go"]).await;
    let new = wait_for_log_line(&path, "stdout", "second-file", WAIT).await;
    wait_for_log_line(&path, "stderr", "second-err", WAIT).await;
    assert!(
        !reassemble(&new, "stdout").contains(&b"out-marker".to_vec()),
        "the new file holds old output"
    );
    let old = parse_cri_log(&std::fs::read(&rotated).unwrap()).unwrap();
    assert!(reassemble(&old, "stdout").contains(&b"after-long".to_vec()));
    for (stream, line) in [("stdout", "second-file"), ("stderr", "second-err")] {
        assert!(
            !reassemble(&old, stream).contains(&line.as_bytes().to_vec()),
            "{line} went to the rotated file"
        );
    }

    traces.capture(d).await;
    d.stop_container(&id, 10).await.expect("StopContainer");
    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

// ---------------------------------------------------------------------------------------------
// ExecSync

#[tokio::test]
async fn exec_sync_reports_exit_codes_and_output_and_kills_on_timeout() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("exec");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let c = sh_container(&env, "exec", LOOP_UNTIL_TERM, &marker("exec"));
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run container");
    traces.add_container(&id);
    traces.capture(d).await;

    let r = d
        .exec_sync(
            &id,
            &["sh", "-c", "echo to-out; echo to-err >&2; exit 7"],
            10,
        )
        .await
        .expect("ExecSync exit 7");
    assert_eq!(r.exit_code, 7, "{r:?}");
    assert_eq!(text(&r.stdout), "to-out\n");
    assert_eq!(text(&r.stderr), "to-err\n");

    // 20 MB on each stream: the reply is truncated to fit one 16 MiB gRPC message (it used to
    // exceed it), each stream keeping half.
    // A client with the kubelet's 16 MiB message limit.
    let r = d
        .runtime_client()
        .max_decoding_message_size(16 << 20)
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: [
                "sh",
                "-c",
                "head -c 20000000 /dev/zero; head -c 20000000 /dev/zero >&2",
            ]
            .map(String::from)
            .to_vec(),
            timeout: 60,
        })
        .await
        .expect("ExecSync of 40 MB of output")
        .into_inner();
    let max = crishim_proto::shim::MAX_EXEC_OUTPUT;
    assert_eq!(
        (r.stdout.len(), r.stderr.len()),
        (max - max / 2, max / 2),
        "exit {}",
        r.exit_code
    );
    assert_eq!(r.exit_code, 0);
    for (cmd, code) in [
        (vec!["true"], 0),
        (vec!["false"], 1),
        (vec!["sh", "-c", "kill -9 $$"], 137),
    ] {
        let r = d.exec_sync(&id, &cmd, 10).await.expect("ExecSync");
        assert_eq!(r.exit_code, code, "{cmd:?}: {r:?}");
    }

    // Timeout: DeadlineExceeded soon after, and the process (and its children) killed. The
    // second case also looks for the process on the host while it runs (a positive control for
    // the "gone" check).
    let n1 = 30000 + u32::from_str_radix(&random_hex(2), 16).unwrap();
    let n2 = 40000 + u32::from_str_radix(&random_hex(2), 16).unwrap();
    let cases = [
        (
            vec!["sleep".to_string(), n1.to_string()],
            format!("sleep {n1}"),
            1,
        ),
        (
            vec![
                "sh".to_string(),
                "-c".to_string(),
                format!("sleep {n2}; echo never"),
            ],
            format!("sleep {n2}"),
            3,
        ),
    ];
    for (cmd, needle, timeout) in cases {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let t0 = Instant::now();
        let probe = async {
            if timeout < 2 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Some(processes_with_command(&needle))
        };
        let (r, seen) = tokio::join!(d.exec_sync(&id, &args, timeout), probe);
        let took = t0.elapsed();
        assert_code(
            r,
            Code::DeadlineExceeded,
            &format!("ExecSync {cmd:?} timeout {timeout}"),
        );
        let limit = Duration::from_secs(timeout as u64);
        assert!(
            took >= limit - Duration::from_millis(100) && took < limit + Duration::from_secs(8),
            "ExecSync {cmd:?} with timeout {timeout} s returned after {took:?}"
        );
        if let Some(seen) = seen {
            assert!(
                seen.len() >= 2,
                "while the exec ran, the host did not show both `sh -c` and `sleep` of {needle:?}: {seen:#?}"
            );
        }
        let left = wait_no_process_with_command(&needle, Duration::from_secs(3)).await;
        assert!(
            left.is_empty(),
            "the timed-out exec {cmd:?} still runs: {left:#?}"
        );
    }

    // The container is unharmed.
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.state, ContainerRunning as i32, "{st:#?}");
    assert_eq!(
        d.exec_ok(&id, &["echo", "still-here"]).await,
        "still-here\n"
    );

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

// ---------------------------------------------------------------------------------------------
// Mount propagation

/// A temporary host directory made a shared mount (`mount --bind D D; mount --make-shared D`);
/// everything mounted at or below it is lazily unmounted on drop.
struct SharedDir {
    dir: tempfile::TempDir,
}

impl SharedDir {
    fn new() -> Self {
        use nix::mount::{mount, MsFlags};
        let dir = tempfile::Builder::new()
            .prefix("crishim-shared-")
            .tempdir()
            .unwrap();
        let p = dir.path();
        mount(Some(p), p, None::<&str>, MsFlags::MS_BIND, None::<&str>).expect("mount --bind");
        mount(
            None::<&str>,
            p,
            None::<&str>,
            MsFlags::MS_SHARED,
            None::<&str>,
        )
        .expect("mount --make-shared");
        SharedDir { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn unmount_all(&self) {
        for _ in 0..10 {
            let mut left = mounts_under(self.path());
            if left.is_empty() {
                return;
            }
            left.sort_by_key(|m| std::cmp::Reverse(m.mount_point.len()));
            for m in left {
                let _ =
                    nix::mount::umount2(m.mount_point.as_str(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

impl Drop for SharedDir {
    fn drop(&mut self) {
        self.unmount_all();
    }
}

/// A new directory `dir` with a 1 MiB tmpfs named `source` mounted on it (on the host).
/// A host directory mounted into a container with `propagation`.
fn volume(container_path: &str, host: &Path, propagation: cri::MountPropagation) -> cri::Mount {
    cri::Mount {
        container_path: container_path.to_string(),
        host_path: host.to_string_lossy().into_owned(),
        propagation: propagation as i32,
        ..Default::default()
    }
}

/// Run a pod of `cfg` with one `sleep` container that mounts `host` at `container_path`;
/// returns the pod's id and the container's.
async fn pod_with_a_volume(
    env: &PodEnv,
    cfg: &cri::PodSandboxConfig,
    container_path: &str,
    host: &Path,
    propagation: cri::MountPropagation,
) -> (String, String) {
    let d = &env.d;
    let pod = d.run_pod(cfg).await.expect("RunPodSandbox");
    let mut c = env.container_config("main", &["sleep", "1000"]);
    c.mounts = vec![volume(container_path, host, propagation)];
    let id = d.run_container(&pod, &c, cfg).await.expect("run container");
    (pod, id)
}

fn mount_tmpfs(dir: &Path, source: &str) {
    std::fs::create_dir(dir).unwrap();
    nix::mount::mount(
        Some(source),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .expect("mounting a tmpfs on the host");
}

/// `Status` announces recursive read-only mounts (this kernel has `mount_setattr`), and such a
/// mount makes a submount read-only too, where a plain read-only bind leaves it writable.
#[tokio::test]
async fn recursive_read_only_mounts_are_announced_and_reach_submounts() {
    let shared = SharedDir::new();
    let host_dir = shared.path().to_path_buf();
    let sub = host_dir.join("sub");
    mount_tmpfs(&sub, "crishim-rro");
    let env = PodEnv::start().await;
    let d = &env.d;
    let status = d.runtime_status().await.expect("Status");
    let features = status.runtime_handlers[0].features.unwrap();
    assert!(features.recursive_read_only_mounts, "{status:#?}");
    assert!(
        features.user_namespaces,
        "idmapped mounts work on this kernel and filesystem: {status:#?}"
    );
    assert!(status.features.unwrap().supplemental_groups_policy);

    let cfg = env.pod_config("rro");
    let mut c = sh_container(&env, "rro", LOOP_UNTIL_TERM, &marker("rro"));
    let bind = |path: &str, recursive: bool| cri::Mount {
        container_path: path.to_string(),
        host_path: host_dir.to_string_lossy().into_owned(),
        readonly: true,
        recursive_read_only: recursive,
        ..Default::default()
    };
    c.mounts = vec![bind("/mnt/rro", true), bind("/mnt/ro", false)];
    let (pod, id, traces) = env.run_traced(&cfg, &c).await;
    let ro = d
        .exec_sync(&id, &["touch", "/mnt/ro/sub/f"], 10)
        .await
        .unwrap();
    assert_eq!(ro.exit_code, 0, "ro leaves submounts writable: {ro:?}");
    let r = d
        .exec_sync(&id, &["touch", "/mnt/rro/sub/g"], 10)
        .await
        .unwrap();
    assert_ne!(r.exit_code, 0, "rro must reach the submount");
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("Read-only"),
        "{r:?}"
    );
    assert!(!sub.join("g").exists());

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    shared.unmount_all();
    assert_no_leaks(d, &traces).await;
    env.stop();
}

#[tokio::test]
async fn bidirectional_mount_propagates_mounts_both_ways() {
    let shared = SharedDir::new();
    let host_dir = shared.path().to_path_buf();
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut cfg = env.pod_config("bidi");
    set_pod_privileged(&mut cfg);
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox (privileged)");
    let mut traces = PodTraces::new(&pod, &cfg);

    let mut c = sh_container(&env, "bidi", LOOP_UNTIL_TERM, &marker("bidi"));
    set_container_privileged(&mut c);
    c.mounts = vec![volume(
        "/mnt/shared",
        &host_dir,
        cri::MountPropagation::PropagationBidirectional,
    )];
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run the privileged container");
    traces.add_container(&id);
    traces.capture(d).await;
    let st = d.container_status(&id).await.unwrap();
    assert!(
        st.mounts.iter().any(|m| m.container_path == "/mnt/shared"
            && Path::new(&m.host_path) == host_dir
            && m.propagation == cri::MountPropagation::PropagationBidirectional as i32),
        "ContainerStatus.mounts lacks the bidirectional mount: {:#?}",
        st.mounts
    );

    // Container → host.
    d.exec_ok(
        &id,
        &[
            "sh",
            "-c",
            "mkdir -p /mnt/shared/sub && mount -t tmpfs -o size=1m crishim-bidi /mnt/shared/sub \
             && echo from-container > /mnt/shared/sub/f",
        ],
    )
    .await;
    let sub = host_dir.join("sub");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !mounts()
        .iter()
        .any(|m| Path::new(&m.mount_point) == sub && m.fstype == "tmpfs")
    {
        assert!(
            Instant::now() < deadline,
            "the container's tmpfs at /mnt/shared/sub did not appear at {} on the host; host mounts there: {:#?}",
            sub.display(),
            mounts_under(&host_dir)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        std::fs::read_to_string(sub.join("f")).unwrap(),
        "from-container\n"
    );

    // Host → container.
    let from_host = host_dir.join("fromhost");
    mount_tmpfs(&from_host, "crishim-bidi-host");
    std::fs::write(from_host.join("g"), "from-host\n").unwrap();
    assert_eq!(
        d.exec_ok(&id, &["cat", "/mnt/shared/fromhost/g"]).await,
        "from-host\n"
    );

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    // What propagated to the host stays there (that is what bidirectional means); ours to clean.
    shared.unmount_all();
    assert_no_leaks(d, &traces).await;
    env.stop();
}

// ---------------------------------------------------------------------------------------------
// PID namespaces

/// `/proc/1/cmdline` in the container, NULs as spaces.
async fn pid1_command(d: &Daemon, id: &str) -> String {
    d.exec_ok(id, &["cat", "/proc/1/cmdline"])
        .await
        .split('\0')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn pid_namespace_pod_is_shared_under_infra_and_container_is_private() {
    let env = PodEnv::start().await;
    let d = &env.d;

    // pid: POD — the infra process is PID 1 and every container sees the others.
    let mut shared_cfg = env.pod_config("pid-shared");
    set_pod_namespaces(&mut shared_cfg, namespaces(NS_POD, NS_POD, NS_POD));
    let shared = d.run_pod(&shared_cfg).await.expect("RunPodSandbox pid POD");
    let mut shared_traces = PodTraces::new(&shared, &shared_cfg);
    let (m1, m2) = (marker("a1"), marker("a2"));
    let a1 = d
        .run_container(
            &shared,
            &sh_container(&env, "a1", LOOP_UNTIL_TERM, &m1),
            &shared_cfg,
        )
        .await
        .expect("run a1");
    let a2 = d
        .run_container(
            &shared,
            &sh_container(&env, "a2", LOOP_UNTIL_TERM, &m2),
            &shared_cfg,
        )
        .await
        .expect("run a2");
    shared_traces.add_container(&a1);
    shared_traces.add_container(&a2);
    shared_traces.capture(d).await;
    assert_eq!(pid1_command(d, &a2).await, "crishim-pause");
    let ps = d.exec_ok(&a2, &["ps"]).await;
    for want in ["crishim-pause", m1.as_str(), m2.as_str()] {
        assert!(ps.contains(want), "ps in a2 does not show {want:?}:\n{ps}");
    }
    let ps = d.exec_ok(&a1, &["ps"]).await;
    assert!(ps.contains(&m2), "ps in a1 does not show a2:\n{ps}");

    // pid: CONTAINER — the container's own process is PID 1 and it sees nothing else.
    let private_cfg = env.pod_config("pid-private");
    assert_eq!(
        private_cfg
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .map(|n| n.pid),
        Some(NS_CONTAINER)
    );
    let private = d
        .run_pod(&private_cfg)
        .await
        .expect("RunPodSandbox pid CONTAINER");
    let mut private_traces = PodTraces::new(&private, &private_cfg);
    let mb = marker("b1");
    let b1 = d
        .run_container(
            &private,
            &sh_container(&env, "b1", LOOP_UNTIL_TERM, &mb),
            &private_cfg,
        )
        .await
        .expect("run b1");
    private_traces.add_container(&b1);
    private_traces.capture(d).await;
    let pid1 = pid1_command(d, &b1).await;
    assert!(
        pid1.starts_with("/bin/sh -c") && pid1.ends_with(&mb),
        "PID 1 of a pid-CONTAINER container is {pid1:?}, not its own command"
    );
    let ps = d.exec_ok(&b1, &["ps"]).await;
    for unwanted in ["crishim-shim", m1.as_str(), m2.as_str()] {
        assert!(
            !ps.contains(unwanted),
            "ps in a private pid namespace shows {unwanted:?}:\n{ps}"
        );
    }

    d.remove_pod(&shared).await.expect("RemovePodSandbox");
    d.remove_pod(&private).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &shared_traces).await;
    assert_no_leaks(d, &private_traces).await;
    env.stop();
}

#[tokio::test]
async fn pid_namespace_node_shows_host_processes() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut cfg = env.pod_config("pid-node");
    set_pod_namespaces(&mut cfg, namespaces(NS_POD, NS_NODE, NS_POD));
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox pid NODE");
    let mut traces = PodTraces::new(&pod, &cfg);
    let c = sh_container(&env, "node", LOOP_UNTIL_TERM, &marker("node"));
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run container");
    traces.add_container(&id);
    traces.capture(d).await;

    let host_pid1 = std::fs::read("/proc/1/cmdline").unwrap();
    let host_pid1: Vec<String> = host_pid1
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(text)
        .collect();
    assert_eq!(pid1_command(d, &id).await, host_pid1.join(" "));
    let me = std::process::id().to_string();
    let r = d
        .exec_sync(&id, &["test", "-d", &format!("/proc/{me}")], 10)
        .await
        .unwrap();
    assert_eq!(
        r.exit_code, 0,
        "the test process {me} is not visible in a host-pid container"
    );

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

// ---------------------------------------------------------------------------------------------
// Stopping and removing

/// A pod with one container that ignores SIGTERM, running (it has logged "ready"): the pod id, the
/// container id, the pod config, its traces and the container's command-line marker.
async fn stubborn_container(
    env: &PodEnv,
    name: &str,
) -> (String, String, cri::PodSandboxConfig, PodTraces, String) {
    let d = &env.d;
    let cfg = env.pod_config(name);
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let m = marker(name);
    let c = sh_container(
        env,
        name,
        &format!("trap '' TERM; echo ready; {IGNORE_TERM}"),
        &m,
    );
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run container");
    traces.add_container(&id);
    traces.capture(d).await;
    let log = Path::new(&cfg.log_directory).join(format!("{name}.log"));
    wait_for_log_line(&log, "stdout", "ready", WAIT).await;
    (pod, id, cfg, traces, m)
}

#[tokio::test]
async fn stop_container_ignoring_sigterm_is_killed_after_the_timeout() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let (pod, id, _cfg, traces, m) = stubborn_container(&env, "stubborn").await;

    let t0 = Instant::now();
    d.stop_container(&id, 2).await.expect("StopContainer");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(8),
        "StopContainer(timeout 2) of a process ignoring SIGTERM returned after {took:?}"
    );
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.state, ContainerExited as i32, "{st:#?}");
    assert_eq!(st.exit_code, 137, "{st:#?}");
    assert_eq!(st.reason, "Error", "{st:#?}");
    let left = wait_no_process_with_command(&m, Duration::from_secs(3)).await;
    assert!(left.is_empty(), "killed container still runs: {left:#?}");

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// `ContainerConfig.stop_signal` (Kubernetes 1.33+) comes before the image's STOPSIGNAL: a
/// container that ignores SIGTERM and exits 42 on SIGUSR1 stops on the first signal, before the
/// grace period, and its status reports the signal.
#[tokio::test]
async fn stop_signal_from_the_container_config_reaches_the_container() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("usr1");
    let m = marker("usr1");
    let mut c = sh_container(
        &env,
        "usr1",
        &format!("trap '' TERM; trap 'echo got-usr1; exit 42' USR1; echo ready; {IGNORE_TERM}"),
        &m,
    );
    c.stop_signal = cri::Signal::Sigusr1 as i32;
    let (pod, id, traces) = env.run_traced(&cfg, &c).await;
    let log = Path::new(&cfg.log_directory).join("usr1.log");
    wait_for_log_line(&log, "stdout", "ready", WAIT).await;
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.stop_signal, cri::Signal::Sigusr1 as i32, "{st:#?}");

    let t0 = Instant::now();
    d.stop_container(&id, 30).await.expect("StopContainer");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    wait_for_log_line(&log, "stdout", "got-usr1", WAIT).await;
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.exit_code, 42, "the trap's exit, not SIGKILL: {st:#?}");

    let mut bad = sh_container(&env, "badsig", "true", &marker("badsig"));
    bad.stop_signal = 4242;
    let e = d.create_container(&pod, &bad, &cfg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// `StopContainer` with `timeout = i64::MAX` overflowed `Instant + Duration` and panicked in the
/// handler after SIGTERM. It must wait (the client gives up at its deadline), panic nothing, and
/// leave the container stoppable: a later stop with timeout 1 kills it.
#[tokio::test]
async fn stop_container_with_an_i64_max_timeout_panics_nothing_and_a_later_stop_kills() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let (pod, id, _cfg, traces, m) = stubborn_container(&env, "forever").await;

    let mut req = tonic::Request::new(cri::StopContainerRequest {
        container_id: id.clone(),
        timeout: i64::MAX,
    });
    req.set_timeout(Duration::from_secs(2));
    let r = d.runtime_client().stop_container(req).await;
    assert!(
        matches!(&r, Err(e) if matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled)),
        "a stop with i64::MAX seconds waits on a process ignoring SIGTERM: {r:?}"
    );
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.state, ContainerRunning as i32, "{st:#?}");

    let t0 = Instant::now();
    d.stop_container(&id, 1).await.expect("StopContainer(1)");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.state, ContainerExited as i32, "{st:#?}");
    assert_eq!(st.exit_code, 137, "{st:#?}");
    let left = wait_no_process_with_command(&m, Duration::from_secs(3)).await;
    assert!(left.is_empty(), "killed container still runs: {left:#?}");
    let log = d.log_text();
    assert!(!log.contains("panicked"), "the daemon panicked:\n{log}");

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

#[tokio::test]
async fn remove_pod_sandbox_with_running_containers_removes_everything() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("rm-running");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let mut markers = Vec::new();
    let mut ctrs = Vec::new();
    for name in ["one", "two"] {
        let m = marker(name);
        let script = if name == "one" {
            LOOP_UNTIL_TERM
        } else {
            IGNORE_TERM
        };
        let id = d
            .run_container(&pod, &sh_container(&env, name, script, &m), &cfg)
            .await
            .expect("run container");
        traces.add_container(&id);
        markers.push(m);
        ctrs.push(id);
    }
    traces.capture(d).await;
    for m in &markers {
        assert!(!processes_with_command(m).is_empty(), "{m} is not running");
    }

    d.remove_pod(&pod)
        .await
        .expect("RemovePodSandbox of a running pod");
    assert_code(d.pod_status(&pod).await, Code::NotFound, "PodSandboxStatus");
    for id in &ctrs {
        assert_code(
            d.container_status(id).await,
            Code::NotFound,
            "ContainerStatus",
        );
    }
    assert!(d.list_container_ids(None).await.unwrap().is_empty());
    assert!(d.list_pod_ids(None).await.unwrap().is_empty());
    for m in &markers {
        let left = wait_no_process_with_command(m, Duration::from_secs(5)).await;
        assert!(
            left.is_empty(),
            "container of a removed pod runs: {left:#?}"
        );
    }
    assert_no_leaks(d, &traces).await;
    env.stop();
}

#[tokio::test]
async fn stopping_and_removing_twice_is_fine_for_containers_and_pods() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("twice-stop");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let running = d
        .run_container(
            &pod,
            &sh_container(&env, "running", LOOP_UNTIL_TERM, &marker("r")),
            &cfg,
        )
        .await
        .expect("run container");
    let created = d
        .create_container(
            &pod,
            &sh_container(&env, "created", LOOP_UNTIL_TERM, &marker("c")),
            &cfg,
        )
        .await
        .expect("create container");
    traces.add_container(&running);
    traces.add_container(&created);
    traces.capture(d).await;

    d.stop_container(&running, 10).await.expect("StopContainer");
    d.stop_container(&running, 10)
        .await
        .expect("StopContainer of an exited container");
    assert_eq!(
        d.container_status(&running).await.unwrap().state,
        ContainerExited as i32
    );
    d.remove_container(&running).await.expect("RemoveContainer");
    d.remove_container(&running)
        .await
        .expect("RemoveContainer of a removed container");
    assert_code(
        d.container_status(&running).await,
        Code::NotFound,
        "ContainerStatus",
    );

    assert_eq!(
        d.container_status(&created).await.unwrap().state,
        ContainerCreated as i32
    );
    d.remove_container(&created)
        .await
        .expect("RemoveContainer of a created container");
    d.remove_container(&created)
        .await
        .expect("RemoveContainer of a removed container");
    assert_code(
        d.container_status(&created).await,
        Code::NotFound,
        "ContainerStatus",
    );

    d.stop_pod(&pod).await.expect("StopPodSandbox");
    d.stop_pod(&pod)
        .await
        .expect("StopPodSandbox of a stopped pod");
    assert_eq!(
        d.pod_status(&pod).await.unwrap().state,
        SandboxNotready as i32
    );
    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    d.remove_pod(&pod)
        .await
        .expect("RemovePodSandbox of a removed pod");
    assert_code(d.pod_status(&pod).await, Code::NotFound, "PodSandboxStatus");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// StopPodSandbox unmounts its containers' rootfs (while the CNI DEL runs); what they wrote
/// stays in the writable layer, and the container's status with it, until RemovePodSandbox.
#[tokio::test]
async fn a_stopped_pods_containers_keep_their_writable_layer_but_not_their_rootfs_mount() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("stop-unmounts");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let id = d
        .run_container(
            &pod,
            &sh_container(&env, "writer", LOOP_UNTIL_TERM, &marker("w")),
            &cfg,
        )
        .await
        .expect("run container");
    traces.add_container(&id);
    traces.capture(d).await;
    d.exec_ok(&id, &["sh", "-c", "echo kept > /written"]).await;
    let rootfs = d.state_dir().join("containers").join(&id).join("rootfs");
    let is_mounted = || mounts().iter().any(|m| Path::new(&m.mount_point) == rootfs);
    assert!(
        is_mounted(),
        "{} is not mounted while the container runs",
        rootfs.display()
    );

    d.stop_pod(&pod).await.expect("StopPodSandbox");
    assert!(
        !is_mounted(),
        "{} is still mounted after StopPodSandbox",
        rootfs.display()
    );
    let written = d
        .root_dir()
        .join("images/containers")
        .join(&id)
        .join("upper/written");
    assert_eq!(
        std::fs::read_to_string(&written).ok().as_deref(),
        Some("kept\n"),
        "the writable layer lost what the container wrote"
    );
    assert_eq!(
        d.container_status(&id).await.unwrap().state,
        ContainerExited as i32
    );

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert!(
        !written.exists(),
        "the writable layer outlived RemovePodSandbox"
    );
    assert_no_leaks(d, &traces).await;
    env.stop();
}

// ---------------------------------------------------------------------------------------------
// Errors

#[tokio::test]
async fn unknown_ids_are_not_found_and_removals_of_unknown_ids_succeed() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let unknown = random_hex(32);
    assert_code(
        d.container_status(&unknown).await,
        Code::NotFound,
        "ContainerStatus",
    );
    assert_code(
        d.start_container(&unknown).await,
        Code::NotFound,
        "StartContainer",
    );
    assert_code(
        d.stop_container(&unknown, 1).await,
        Code::NotFound,
        "StopContainer",
    );
    assert_code(
        d.exec_sync(&unknown, &["true"], 5).await,
        Code::NotFound,
        "ExecSync",
    );
    assert_code(
        d.pod_status(&unknown).await,
        Code::NotFound,
        "PodSandboxStatus",
    );
    assert_code(d.stop_pod(&unknown).await, Code::NotFound, "StopPodSandbox");
    d.remove_container(&unknown)
        .await
        .expect("RemoveContainer of an unknown ID is OK");
    d.remove_pod(&unknown)
        .await
        .expect("RemovePodSandbox of an unknown ID is OK");

    let cfg = env.pod_config("unknown");
    let c = env.container_config("c", &["/bin/sh", "-c", LOOP_UNTIL_TERM]);
    assert_code(
        d.create_container(&unknown, &c, &cfg).await,
        Code::NotFound,
        "CreateContainer in an unknown pod",
    );

    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    traces.capture(d).await;
    let mut never = c.clone();
    never.image = Some(spec(&format!("{}/never-pulled:latest", env.reg.host())));
    assert_code(
        d.create_container(&pod, &never, &cfg).await,
        Code::NotFound,
        "CreateContainer from an image that was never pulled",
    );
    assert!(d.list_container_ids(None).await.unwrap().is_empty());

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// Paths under the daemon's state and root dirs with a 64-hex-character component.
fn id_named_paths(d: &Daemon) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for root in [d.state_dir(), d.root_dir()] {
        for p in walk(&root) {
            let rel = p.strip_prefix(&root).unwrap_or(&p);
            if rel
                .components()
                .any(|c| is_id(&c.as_os_str().to_string_lossy()))
            {
                out.insert(p);
            }
        }
    }
    out
}

/// The daemon's id-named files and the mounts under its directory, to compare before and after
/// something that must leave nothing.
struct Footprint {
    paths: BTreeSet<PathBuf>,
    mounts: BTreeSet<String>,
}

impl Footprint {
    fn of(d: &Daemon) -> Footprint {
        Footprint {
            paths: id_named_paths(d),
            mounts: mounts_under(d.dir()).into_iter().map(|m| m.line).collect(),
        }
    }

    /// Asserts `d` has no file or mount that was not there before; `what` names the cause.
    fn assert_nothing_new(&self, d: &Daemon, what: &str) {
        let now = Footprint::of(d);
        let paths: Vec<_> = now.paths.difference(&self.paths).collect();
        assert!(paths.is_empty(), "{what} left files: {paths:#?}");
        let mounts: Vec<_> = now.mounts.difference(&self.mounts).collect();
        assert!(mounts.is_empty(), "{what} left mounts: {mounts:#?}");
    }
}

#[tokio::test]
async fn garbage_container_configs_are_invalid_argument_and_leave_nothing() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut no_cmd = busybox_image();
    no_cmd.config.cmd = None;
    no_cmd.config.entrypoint = None;
    let no_cmd = env.push_and_pull("nocmd", &no_cmd).await;

    let cfg = env.pod_config("garbage");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    traces.capture(d).await;
    let before = Footprint::of(d);

    let good = env.container_config("g", &["/bin/sh", "-c", LOOP_UNTIL_TERM]);
    let token = random_hex(6);
    let log_dir = PathBuf::from(&cfg.log_directory);
    let escapes = [
        PathBuf::from(format!("/tmp/crishim-escape-{token}.log")),
        log_dir
            .parent()
            .unwrap()
            .join(format!("escape-{token}.log")),
    ];
    let mut cases: Vec<(&str, cri::ContainerConfig)> = Vec::new();
    let mut c = good.clone();
    c.image = Some(spec(""));
    cases.push(("empty image", c));
    let mut c = good.clone();
    c.log_path = escapes[0].to_string_lossy().into_owned();
    cases.push(("absolute log path", c));
    let mut c = good.clone();
    c.log_path = format!("../escape-{token}.log");
    cases.push(("../ log path", c));
    let mut c = good.clone();
    c.log_path = format!("sub/../../escape-{token}.log");
    cases.push(("sub/../../ log path", c));
    let mut c = good.clone();
    container_security(&mut c).run_as_username = format!("no-such-user-{token}");
    cases.push(("unknown run_as_username", c));
    let mut c = good.clone();
    c.image = Some(spec(&no_cmd.tag_ref()));
    c.command.clear();
    c.args.clear();
    cases.push(("no command (none in the image either)", c));

    for (what, c) in &cases {
        let r = d.create_container(&pod, c, &cfg).await;
        assert_code(
            r,
            Code::InvalidArgument,
            &format!("CreateContainer with {what}"),
        );
    }
    assert!(
        d.list_container_ids(None).await.unwrap().is_empty(),
        "refused containers are listed"
    );
    for e in &escapes {
        assert!(!e.exists(), "a refused log path created {}", e.display());
    }
    before.assert_nothing_new(d, "refused containers");

    // The pod is unharmed: a good container still runs.
    let id = d
        .run_container(&pod, &good, &cfg)
        .await
        .expect("run a good container");
    traces.add_container(&id);
    assert_eq!(d.exec_ok(&id, &["echo", "ok"]).await, "ok\n");

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

// ---------------------------------------------------------------------------------------------
// Runtime basics

#[tokio::test]
async fn version_status_and_runtime_config() {
    let d = Daemon::start(DaemonOptions::new())
        .await
        .expect("starting crishim serve");
    let v = d.version().await.expect("Version");
    assert_eq!(v.runtime_name, "crishim", "{v:?}");
    assert_eq!(v.runtime_api_version, "v1", "{v:?}");
    assert!(!v.runtime_version.is_empty(), "{v:?}");
    assert!(!v.version.is_empty(), "{v:?}");

    let s = d.runtime_status().await.expect("Status");
    let conds = s.status.map(|s| s.conditions).unwrap_or_default();
    assert!(
        conds.iter().any(|c| c.r#type == "RuntimeReady" && c.status),
        "RuntimeReady is not true: {conds:#?}"
    );

    let rc = d.runtime_config().await.expect("RuntimeConfig");
    assert_eq!(
        rc.linux.map(|l| l.cgroup_driver),
        Some(cri::CgroupDriver::Cgroupfs as i32)
    );
    d.update_runtime_config("10.88.0.0/16")
        .await
        .expect("UpdateRuntimeConfig");
    d.stop();
}

/// The SigIgn mask of `/proc/self/status` as `cat` (exec'd by `sh`) sees it.
fn sigign(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no SigIgn line in {status:?}"))
}

#[tokio::test]
async fn container_processes_start_with_sigpipe_at_its_default() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("sigpipe");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let c = env.container_config("main", &["sh", "-c", "cat /proc/self/status; sleep 1000"]);
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run container");
    let log = Path::new(&cfg.log_directory).join("main.log");
    let t0 = std::time::Instant::now();
    let status = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("SigIgn:") {
            break text;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no status in the log"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let pipe = 1u64 << (libc::SIGPIPE - 1);
    let line = status.lines().find(|l| l.contains("SigIgn:")).unwrap();
    let mask = sigign(line.split(" F ").nth(1).unwrap_or(line));
    assert_eq!(
        mask & pipe,
        0,
        "the container's process ignores SIGPIPE: {line}"
    );
    let out = d.exec_ok(&id, &["cat", "/proc/self/status"]).await;
    assert_eq!(
        sigign(&out) & pipe,
        0,
        "an ExecSync process ignores SIGPIPE"
    );
    // What that is for: a pipeline whose reader left ends by SIGPIPE, silently.
    let r = d
        .exec_sync(&id, &["sh", "-c", "yes | head -n 1"], 10)
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.stderr.as_slice()), (0, &b""[..]), "{r:?}");
    d.stop_pod(&pod).await.unwrap();
    d.remove_pod(&pod).await.unwrap();
    env.stop();
}

/// Exec, kill and delete run in the shim's lean mount namespace: the system's mounts without the
/// pods' (their overlays, `/dev/shm`, network namespaces), which libcgroups' lookups would
/// otherwise read on every call. The exec still works, and the node's namespace is unchanged.
#[tokio::test]
async fn exec_runs_in_a_mount_namespace_without_the_pods_mounts() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let state = d.state_dir();
    let mut pods = Vec::new();
    for name in ["lean-a", "lean-b"] {
        pods.push(env.run_sleeping(name).await);
    }
    // Strictly below: the state directory itself is a (private) mount of the daemon's.
    let under_state = |info: &str| {
        info.lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|mp| Path::new(mp).starts_with(&state) && Path::new(mp) != state)
            .count()
    };
    let host_info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        under_state(&host_info) >= 4,
        "two pods' overlays and shm should be mounted on the node"
    );
    assert_eq!(d.exec_ok(&pods[0].1, &["echo", "lean"]).await, "lean\n");

    // The shim of the first pod now holds the lean namespace open (the other one holds the
    // view its create ran in, until it builds its own lean namespace from it), besides the
    // daemon's empty one, which its infra process is in.
    let own = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    let empty = own(d.infra_pid(&pods[0].0).await.unwrap());
    let held: Vec<(i32, std::path::PathBuf)> = shims(d)
        .iter()
        .filter(|s| s.command().contains(&pods[0].0))
        .flat_map(|s| {
            let mine = own(s.pid);
            std::fs::read_dir(format!("/proc/{}/fd", s.pid))
                .unwrap()
                .flatten()
                .filter({
                    let empty = empty.clone();
                    move |fd| {
                        std::fs::read_link(fd.path()).is_ok_and(|l| {
                            l.to_string_lossy().starts_with("mnt:[") && l != mine && l != empty
                        })
                    }
                })
                .map(move |fd| (s.pid, fd.path()))
        })
        .collect();
    assert_eq!(
        held.len(),
        1,
        "the exec's shim holds a second mount namespace: {held:?}"
    );
    let out = std::process::Command::new("nsenter")
        .arg(format!("--mount={}", held[0].1.display()))
        .args(["cat", "/proc/self/mountinfo"])
        .output()
        .expect("nsenter");
    assert!(out.status.success(), "{out:?}");
    let lean_info = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        under_state(&lean_info),
        0,
        "pods' mounts in the lean namespace:\n{lean_info}"
    );
    assert!(
        lean_info.lines().any(|l| l.contains(" - cgroup")),
        "the cgroup hierarchies are kept:\n{lean_info}"
    );
    assert!(
        lean_info.lines().any(|l| l.contains(" /proc ")),
        "{lean_info}"
    );
    let after = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !after
            .lines()
            .any(|l| l.split(' ').nth(4).is_some_and(|mp| mp.ends_with("/lean"))),
        "building it mounted nothing on the node:\n{after}"
    );
    for (pod, _) in &pods {
        d.stop_pod(pod).await.unwrap();
        d.remove_pod(pod).await.unwrap();
    }
    env.stop();
}

/// Each pod's infra process runs in the daemon's one empty mount namespace (a read-only tmpfs
/// root, nothing else), not in a copy of the node's mounts it would have to detach one by one:
/// two pods' infra processes share it, it is not the node's, and holds a single mount.
#[tokio::test]
async fn infra_processes_join_one_empty_mount_namespace() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut pods = Vec::new();
    for name in ["empty-a", "empty-b"] {
        pods.push(env.run_sleeping(name).await);
    }
    let mut spaces = Vec::new();
    for (pod, _) in &pods {
        let infra = d.infra_pid(pod).await.unwrap();
        let ns = std::fs::read_link(format!("/proc/{infra}/ns/mnt")).unwrap();
        let mounts = std::fs::read_to_string(format!("/proc/{infra}/mountinfo")).unwrap();
        spaces.push((ns, mounts.lines().count()));
    }
    let node = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    assert_eq!(spaces[0].0, spaces[1].0, "{spaces:?}");
    assert_ne!(spaces[0].0, node);
    assert_eq!(spaces[0].1, 1, "{spaces:?}");
    for (pod, _) in &pods {
        d.stop_pod(pod).await.unwrap();
        d.remove_pod(pod).await.unwrap();
    }
    env.stop();
}

/// A shim hands its main stack's pages back after each request: libcontainer's create and exec
/// run deep, and what they touched would otherwise stay resident for the pod's lifetime.
#[tokio::test]
async fn a_shims_stack_stays_small_after_create_and_exec() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let (pod, id) = env.run_sleeping("stack").await;
    assert_eq!(d.exec_ok(&id, &["echo", "x"]).await, "x\n");
    let shim = shims(d);
    assert_eq!(shim.len(), 1, "{shim:#?}");
    let stack_rss_kib = || -> u64 {
        let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", shim[0].pid)).unwrap();
        smaps
            .split_inclusive('\n')
            .skip_while(|l| !l.trim_end().ends_with("[stack]"))
            .find_map(|l| l.strip_prefix("Rss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("the shim's [stack] in smaps")
    };
    // Tests run a debug build, whose live frames alone take some 40 KiB; before the release the
    // stack held over 200 KiB there (and about 80 KiB in a release build). The shim releases it
    // just after its reply, so allow it a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut kib = stack_rss_kib();
    while kib > 96 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        kib = stack_rss_kib();
    }
    assert!(kib <= 96, "the shim keeps {kib} KiB of stack resident");
    d.stop_pod(&pod).await.unwrap();
    d.remove_pod(&pod).await.unwrap();
    env.stop();
}

/// With many pods on the node a container is created in a view of the mounts without the other
/// pods' (lean_ns::with_create_view). Its own rootfs, /dev/shm and volumes are all there, and a
/// HostToContainer volume still receives what the node mounts under it afterwards. The state
/// directory here is on the root file system, whose mount is private on this machine: the view is
/// built at the create.
#[tokio::test]
async fn with_many_pods_a_create_still_gets_its_mounts_and_the_nodes_propagation() {
    many_pods_then_a_viewed_create(DaemonOptions::new()).await;
}

/// The same with the state directory on a shared tmpfs, as `/run` is under systemd: the pod's
/// first create runs in the view its shim built while the CNI ADD ran, which the rootfs, the
/// pod's /dev/shm and the volume reached after it was built.
#[tokio::test]
async fn a_create_in_the_view_built_ahead_gets_its_mounts_and_the_nodes_propagation() {
    many_pods_then_a_viewed_create(DaemonOptions::new().state_on_tmpfs()).await;
}

/// Whether the pod's shim says it created the container in a view of the node's mounts.
fn created_in_a_view(d: &Daemon, pod: &str, id: &str) -> bool {
    let log = d.state_dir().join("pods").join(pod).join("shim.log");
    std::fs::read_to_string(log)
        .is_ok_and(|l| l.contains(&format!("created {id} in a view of the node's mounts")))
}

async fn many_pods_then_a_viewed_create(opts: DaemonOptions) {
    let shared = SharedDir::new();
    let host_dir = shared.path().to_path_buf();
    std::fs::write(host_dir.join("before"), "before\n").unwrap();
    let env = PodEnv::start_with(opts).await;
    let d = &env.d;
    // Seventeen pods, two mounts each or more (overlay, /dev/shm): past the view's
    // threshold of 32 other mounts.
    let mut pods = Vec::new();
    for n in 0..17 {
        pods.push(env.run_sleeping(&format!("many-{n}")).await.0);
    }
    let (pod, id) = pod_with_a_volume(
        &env,
        &env.pod_config("viewed"),
        "/mnt/vol",
        &host_dir,
        cri::MountPropagation::PropagationHostToContainer,
    )
    .await;
    let state = d.state_dir();
    let under_state = mounts()
        .iter()
        .filter(|m| Path::new(&m.mount_point).starts_with(&state))
        .count();
    assert!(
        created_in_a_view(d, &pod, &id),
        "the create did not use a pruned view ({under_state} mounts under {})",
        state.display()
    );
    assert_eq!(
        d.exec_ok(&id, &["cat", "/mnt/vol/before"]).await,
        "before\n"
    );
    let shm = d
        .exec_ok(&id, &["sh", "-c", "grep ' /dev/shm ' /proc/self/mountinfo"])
        .await;
    assert!(shm.contains(" - tmpfs "), "no tmpfs at /dev/shm: {shm}");
    // The node mounts under the volume after the container started: it reaches the container.
    let later = host_dir.join("later");
    mount_tmpfs(&later, "crishim-view-later");
    std::fs::write(later.join("f"), "later\n").unwrap();
    assert_eq!(
        d.exec_ok(&id, &["cat", "/mnt/vol/later/f"]).await,
        "later\n"
    );
    for p in pods.iter().chain([&pod]) {
        d.stop_pod(p).await.unwrap();
        d.remove_pod(p).await.unwrap();
    }
    shared.unmount_all();
    env.stop();
}

/// Volumes the kubelet would have mounted for pods, under `/var/lib/kubelet/pods/<uid>/volumes`;
/// unmounted and removed on drop (with `/var/lib/kubelet` itself where the test made it).
struct KubeletVolumes {
    made_root: bool,
    uids: Vec<String>,
}

const KUBELET_PODS: &str = "/var/lib/kubelet/pods";

impl KubeletVolumes {
    fn new() -> Self {
        let made_root = !Path::new("/var/lib/kubelet").exists();
        KubeletVolumes {
            made_root,
            uids: Vec::new(),
        }
    }

    /// Mount a tmpfs holding `token` as pod `uid`'s volume; returns its path.
    fn add(&mut self, uid: &str, token: &str) -> PathBuf {
        let dir = Path::new(KUBELET_PODS).join(uid).join("volumes/token");
        std::fs::create_dir_all(&dir).unwrap();
        self.uids.push(uid.to_string());
        nix::mount::mount(
            Some("crishim-test-volume"),
            &dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=64k"),
        )
        .expect("mounting a volume tmpfs");
        std::fs::write(dir.join("token"), token).unwrap();
        dir
    }
}

impl Drop for KubeletVolumes {
    fn drop(&mut self) {
        for uid in &self.uids {
            let dir = Path::new(KUBELET_PODS).join(uid);
            let _ =
                nix::mount::umount2(&dir.join("volumes/token"), nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_dir_all(&dir);
        }
        if self.made_root {
            let _ = std::fs::remove_dir_all("/var/lib/kubelet");
        }
    }
}

/// A pod's first create runs in a view without the other pods' kubelet volumes (here 34 of them,
/// enough for a view), with its own volume there; a node agent's first create, binding the
/// kubelet's pods directory, is not given that view and sees every pod's volume mounted.
#[tokio::test]
async fn a_create_view_leaves_out_other_pods_volumes_but_not_its_own_or_an_agents() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut volumes = KubeletVolumes::new();
    let tag = random_hex(6);
    for i in 0..34 {
        volumes.add(&format!("crishim-test-{tag}-other{i}"), "other");
    }
    let cfg = env.pod_config("kubelet-view");
    let uid = cfg.metadata.as_ref().unwrap().uid.clone();
    let own = volumes.add(&uid, "mine");
    let (pod, id) = pod_with_a_volume(
        &env,
        &cfg,
        "/var/run/secrets/token",
        &own,
        cri::MountPropagation::PropagationPrivate,
    )
    .await;
    assert!(
        created_in_a_view(d, &pod, &id),
        "the create did not use a view without the other pods' volumes"
    );
    assert_eq!(
        d.exec_ok(&id, &["cat", "/var/run/secrets/token/token"])
            .await,
        "mine"
    );

    let (agent_pod, agent) = pod_with_a_volume(
        &env,
        &env.pod_config("kubelet-agent"),
        "/host/pods",
        Path::new(KUBELET_PODS),
        cri::MountPropagation::PropagationHostToContainer,
    )
    .await;
    let seen = d
        .exec_ok(
            &agent,
            &[
                "sh",
                "-c",
                &format!("grep -c '{tag}-other' /proc/self/mountinfo"),
            ],
        )
        .await;
    assert_eq!(seen.trim(), "34", "the agent's view of the pods' volumes");
    assert_eq!(
        d.exec_ok(
            &agent,
            &[
                "cat",
                &format!("/host/pods/crishim-test-{tag}-other7/volumes/token/token")
            ]
        )
        .await,
        "other"
    );

    // A view keeps only the node's mounts near what the create reads. A file on a mount of its
    // own, and one reached through a link into another mount (as `/etc/resolv.conf` leads into
    // `/run`), are both read as on the node.
    let shared = SharedDir::new();
    let below = shared.path().join("below");
    mount_tmpfs(&below, "crishim-view-below");
    std::fs::write(below.join("data"), "below").unwrap();
    let linked = shared.path().join("linked");
    mount_tmpfs(&linked, "crishim-view-linked");
    std::fs::write(linked.join("data"), "linked").unwrap();
    let link = shared.path().join("link");
    std::os::unix::fs::symlink(linked.join("data"), &link).unwrap();
    let far_cfg = env.pod_config("kubelet-far");
    let far_pod = d.run_pod(&far_cfg).await.expect("RunPodSandbox");
    let mut c = env.container_config("main", &["sleep", "1000"]);
    let private = cri::MountPropagation::PropagationPrivate;
    c.mounts = vec![
        volume("/below", &below.join("data"), private),
        volume("/linked", &link, private),
    ];
    let far = d
        .run_container(&far_pod, &c, &far_cfg)
        .await
        .expect("run container");
    assert_eq!(
        d.exec_ok(&far, &["cat", "/below", "/linked"]).await,
        "belowlinked"
    );
    for p in [&pod, &agent_pod, &far_pod] {
        d.stop_pod(p).await.unwrap();
        d.remove_pod(p).await.unwrap();
    }
    drop(volumes);
    env.stop();
}

/// A pod on the node's network shares its UTS namespace, so a hostname of its own is refused (as
/// containerd refuses it), and pods and containers are found by the 13-character ids `crictl ps`
/// prints, over every RPC that takes an id.
#[tokio::test]
async fn host_network_hostnames_are_refused_and_short_ids_work() {
    let env = PodEnv::start().await;
    let mut host = env.pod_config("hostnet");
    set_pod_namespaces(&mut host, namespaces(NS_NODE, NS_POD, NS_POD));
    host.hostname = "mine".into();
    let e = env.d.run_pod(&host).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("hostname"), "{e:?}");

    let (pod, id) = env.run_sleeping("short-ids").await;
    let (short_pod, short) = (&pod[..13], &id[..13]);
    let rc = env.d.runtime_client();
    let st = env
        .d
        .container_status(short)
        .await
        .expect("ContainerStatus by a short id");
    assert_eq!(st.id, id);
    let ps = rc
        .clone()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: short_pod.into(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus by a short id")
        .into_inner();
    assert_eq!(ps.status.map(|s| s.id), Some(pod.clone()));
    let r = env
        .d
        .exec_sync(short, &["echo", "hi"], 10)
        .await
        .expect("ExecSync");
    assert_eq!(r.stdout, b"hi\n");
    rc.clone()
        .container_stats(cri::ContainerStatsRequest {
            container_id: short.into(),
        })
        .await
        .expect("ContainerStats by a short id");
    rc.clone()
        .exec(cri::ExecRequest {
            container_id: short.into(),
            cmd: vec!["true".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .expect("Exec by a short id");
    // A prefix of both the pod's and the container's id is not one of either kind.
    let e = env.d.container_status("zz").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    rc.clone()
        .stop_container(cri::StopContainerRequest {
            container_id: short.into(),
            timeout: 0,
        })
        .await
        .expect("StopContainer by a short id");
    rc.clone()
        .remove_container(cri::RemoveContainerRequest {
            container_id: short.into(),
        })
        .await
        .expect("RemoveContainer by a short id");
    assert_eq!(
        env.d.container_status(&id).await.unwrap_err().code(),
        tonic::Code::NotFound,
        "removed through its short id"
    );
    rc.clone()
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: short_pod.into(),
        })
        .await
        .expect("StopPodSandbox by a short id");
    rc.clone()
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: short_pod.into(),
        })
        .await
        .expect("RemovePodSandbox by a short id");
    env.stop();
}

/// A command that is not in the image fails at `StartContainer`, not at create, and leaves the
/// container exited with 128 and `StartError`, which `kubectl describe` shows (containerd's way).
#[tokio::test]
async fn a_missing_executable_is_a_start_error() {
    let env = PodEnv::start().await;
    let cfg = env.pod_config("start-error");
    let pod = env.d.run_pod(&cfg).await.expect("RunPodSandbox");
    let c = env.container_config("main", &["no-such-command-here"]);
    let id = env
        .d
        .create_container(&pod, &c, &cfg)
        .await
        .expect("CreateContainer accepts a command it cannot find yet");
    let created = env.d.container_status(&id).await.expect("ContainerStatus");
    assert_eq!(created.state, cri::ContainerState::ContainerCreated as i32);

    let e = env.d.start_container(&id).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("no-such-command-here"), "{e:?}");
    let st = env.d.container_status(&id).await.expect("ContainerStatus");
    assert_eq!(st.state, cri::ContainerState::ContainerExited as i32);
    assert_eq!((st.exit_code, st.reason.as_str()), (128, "StartError"));
    assert!(st.message.contains("not found"), "{st:?}");
    assert!(st.finished_at > 0 && st.started_at == 0, "{st:?}");
    // It is listed as exited, and goes away like any exited container.
    let exited = env
        .d
        .list_container_ids(Some(container_state_filter(
            cri::ContainerState::ContainerExited,
        )))
        .await
        .expect("ListContainers");
    assert_eq!(exited, vec![id.clone()]);
    env.d.remove_container(&id).await.expect("RemoveContainer");

    // A request-sized command is not echoed whole, in the error or in the recorded status.
    let long = "x".repeat(64 << 10);
    let huge = env.container_config("huge", &[long.as_str()]);
    let id = env
        .d
        .create_container(&pod, &huge, &cfg)
        .await
        .expect("CreateContainer");
    let e = env.d.start_container(&id).await.unwrap_err();
    assert!(e.message().len() < 1024, "{} bytes", e.message().len());
    let st = env.d.container_status(&id).await.expect("ContainerStatus");
    assert_eq!(st.reason, "StartError");
    assert!(st.message.len() < 1024, "{} bytes", st.message.len());
    env.d.remove_container(&id).await.expect("RemoveContainer");

    // Stopped before it was started, it is exited at once (nothing would ever exit).
    let id = env
        .d
        .create_container(&pod, &c, &cfg)
        .await
        .expect("CreateContainer");
    let t = Instant::now();
    env.d.stop_container(&id, 30).await.expect("StopContainer");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    let st = env.d.container_status(&id).await.expect("ContainerStatus");
    assert_eq!(st.state, cri::ContainerState::ContainerExited as i32);
    env.d.remove_container(&id).await.expect("RemoveContainer");
    env.d.stop_pod(&pod).await.expect("StopPodSandbox");
    env.d.remove_pod(&pod).await.expect("RemovePodSandbox");
    env.stop();
}

/// A daemon that runs `shim` (a link to `crishim-shim`, or a stand-in) as the pods' shim.
async fn env_with_shim_binary(shim: &Path) -> PodEnv {
    PodEnv::start_with(DaemonOptions::new().shim_binary(shim)).await
}

/// A shim that cannot start the pod's infra process (here: no `crishim-pause` beside it) fails
/// RunPodSandbox with its reason, and leaves no shim, pod, mount or file behind.
#[tokio::test]
async fn a_shim_that_cannot_start_the_infra_fails_the_pod_with_why_and_leaves_nothing() {
    let bin = tempfile::tempdir().expect("tempdir");
    let shim = bin.path().join("crishim-shim");
    let real = crishim_tests::daemon::daemon_bin().with_file_name("crishim-shim");
    if std::fs::hard_link(&real, &shim).is_err() {
        std::fs::copy(&real, &shim).expect("copying crishim-shim");
    }
    let env = env_with_shim_binary(&shim).await;
    let d = &env.d;
    let before = Footprint::of(d);

    let cfg = env.pod_config("no-infra");
    let e = d.run_pod(&cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    assert!(
        e.message().contains("starting the pod's shim failed")
            && e.message()
                .contains(&bin.path().join("crishim-pause").display().to_string()),
        "{e:?}"
    );
    assert!(d.list_pod_ids(None).await.unwrap().is_empty());
    let left = wait_gone(&shims(d), Duration::from_secs(5)).await;
    assert!(left.is_empty(), "shims left: {left:#?}");
    before.assert_nothing_new(d, "the failed pod");
    env.stop();
}

/// A shim start that prints a flood instead of its ready report, or with its error (here a
/// script standing in for `crishim-shim`), fails RunPodSandbox promptly, with a message that fits
/// a gRPC status, and leaves nothing.
#[tokio::test]
async fn a_shim_start_printing_a_flood_fails_the_pod_with_a_short_message() {
    use std::os::unix::fs::PermissionsExt as _;
    let flood = "head -c 8388608 /dev/zero | tr '\\0' x";
    for (script, said, max) in [
        (format!("{flood}\nexit 0"), "unexpected ready report", 1024),
        (format!("{flood} >&2\nexit 1"), "xxxx", 5 * 1024),
    ] {
        let bin = tempfile::tempdir().expect("tempdir");
        let shim = bin.path().join("crishim-shim");
        std::fs::write(&shim, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
        let env = env_with_shim_binary(&shim).await;
        let d = &env.d;
        let before = Footprint::of(d);
        let t = Instant::now();
        let e = d.run_pod(&env.pod_config("flood")).await.unwrap_err();
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "took {:?}",
            t.elapsed()
        );
        assert_eq!(e.code(), Code::Internal, "{script}: {e:?}");
        let m = e.message();
        assert!(
            m.contains("starting the pod's shim failed") && m.contains(said) && m.len() < max,
            "{script}: {} bytes: {}",
            m.len(),
            &m[..m.len().min(300)]
        );
        assert!(d.list_pod_ids(None).await.unwrap().is_empty());
        before.assert_nothing_new(d, "the failed pod");
        env.stop();
    }
}

/// A RuntimeClass handler the node lacks (a sandboxed one, say) is refused by name, not run
/// without the isolation it asked for; `Status` lists the handlers there are.
#[tokio::test]
async fn an_unknown_runtime_handler_is_refused() {
    let env = PodEnv::start().await;
    let cfg = env.pod_config("handler");
    let e = env
        .d
        .runtime_client()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cfg.clone()),
            runtime_handler: "kata".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("\"kata\""), "{e:?}");
    assert!(env.d.list_pod_ids(None).await.unwrap().is_empty());
    let status = env.d.runtime_status().await.expect("Status");
    let names: Vec<&str> = status
        .runtime_handlers
        .iter()
        .map(|h| h.name.as_str())
        .collect();
    assert_eq!(names, [""]);
    // PullImage names a handler too (one image store serves them all).
    let e = env
        .d
        .image_client()
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: env.image(),
                runtime_handler: "kata".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    // Labels and annotations are capped (every relist repeats them).
    let mut fat = cfg.clone();
    fat.annotations = (0..300)
        .map(|i| (format!("a{i}"), "x".repeat(1024)))
        .collect();
    let e = env.d.run_pod(&fat).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("annotations"), "{e:?}");
    assert!(env.d.list_pod_ids(None).await.unwrap().is_empty());
    // The same pod with the default handler runs.
    let pod = env.d.run_pod(&cfg).await.expect("RunPodSandbox");
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    env.stop();
}

/// `[metrics] address`: the Prometheus endpoint counts CRI calls by method and code, times pod
/// start-up and pulls, and reports pods and containers by state.
#[tokio::test]
async fn metrics_count_calls_pod_starts_pulls_and_states() {
    let addr = metrics_address();
    let opts = DaemonOptions::new().extra_toml(&metrics_toml(&addr));
    let env = PodEnv::start_with(opts).await;
    let cfg = env.pod_config("metrics");
    let c = sh_container(&env, "metrics", LOOP_UNTIL_TERM, &marker("metrics"));
    let (pod, _id, traces) = env.run_traced(&cfg, &c).await;
    let _ = env.d.container_status("no-such-container").await;

    let text = scrape(&addr).await;
    let ok = |m: &str| {
        sample(
            &text,
            &format!("crishim_cri_requests_total{{method=\"{m}\",code=\"OK\"}}"),
        )
    };
    assert_eq!(ok("RunPodSandbox"), 1.0, "{text}");
    assert_eq!(ok("StartContainer"), 1.0, "{text}");
    assert_eq!(
        sample(
            &text,
            "crishim_cri_requests_total{method=\"ContainerStatus\",code=\"NotFound\"}"
        ),
        1.0,
        "{text}"
    );
    assert!(
        sample(
            &text,
            "crishim_cri_request_duration_seconds_count{method=\"CreateContainer\"}"
        ) >= 1.0
    );
    assert_eq!(
        sample(&text, "crishim_pod_start_duration_seconds_count"),
        1.0,
        "{text}"
    );
    assert!(
        sample(&text, "crishim_image_pulls_total{result=\"success\"}") >= 1.0,
        "{text}"
    );
    assert!(
        sample(&text, "crishim_image_pull_bytes_total") > 0.0,
        "{text}"
    );
    for series in [
        "crishim_pods{state=\"ready\"}",
        "crishim_containers{state=\"running\"}",
        "crishim_shims",
    ] {
        assert_eq!(sample(&text, series), 1.0, "{series} in {text}");
    }

    check_prometheus_text(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    env.d.stop_pod(&pod).await.unwrap();
    let text = scrape(&addr).await;
    check_prometheus_text(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for series in [
        "crishim_pods{state=\"notready\"}",
        "crishim_containers{state=\"exited\"}",
    ] {
        assert_eq!(sample(&text, series), 1.0, "{series} in {text}");
    }
    // Idle connections that never send a request hold the scrape slots only for their 5 s read
    // timeout: a real scrape behind them still gets its answer.
    let idle: Vec<_> = futures_util::future::join_all(
        (0..24).map(|_| tokio::net::TcpStream::connect(addr.clone())),
    )
    .await;
    let t0 = Instant::now();
    let text = tokio::time::timeout(Duration::from_secs(15), scrape(&addr))
        .await
        .expect("a scrape behind 24 idle connections");
    assert!(text.contains("crishim_shims"), "{text}");
    assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
    drop(idle);
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}

/// A container joining its pod's pid namespace on a cgroup v1 node, whose pid in the pod is one
/// no host process has: libcontainer would look that pid up in the host's /proc to mount the
/// cgroup hierarchies ("failed to prepare rootfs"). crishim binds the container's own cgroups
/// instead, and the container sees its own limits there. (On a cgroup v2 node there is nothing
/// to check: the container mounts cgroup2 in its own cgroup namespace.)
#[tokio::test]
async fn a_container_joining_a_busy_pod_pid_namespace_gets_its_own_cgroups() {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        eprintln!("cgroup v2 node: the v1 emulation is not used");
        return;
    }
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut cfg = env.pod_config("pid-busy");
    set_pod_namespaces(&mut cfg, namespaces(NS_POD, NS_POD, NS_POD));
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox pid POD");
    let mut traces = PodTraces::new(&pod, &cfg);
    // The next pid in the pod's namespace: one above every host pid, so no host process has it.
    let highest = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .max()
        .unwrap();
    let next = highest + 1000;
    let infra = d.infra_pid(&pod).await.unwrap();
    let o = std::process::Command::new("nsenter")
        .args(["-t", &infra.to_string(), "-p", "--", "sh", "-c"])
        .arg(format!("echo {} > /proc/sys/kernel/ns_last_pid", next - 1))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!Path::new(&format!("/proc/{next}")).exists());
    let mut c = sh_container(&env, "busy", LOOP_UNTIL_TERM, &marker("busy"));
    c.linux
        .get_or_insert_with(Default::default)
        .resources
        .get_or_insert_with(Default::default)
        .memory_limit_in_bytes = 64 << 20;
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("a container whose pod pid has no host process");
    traces.add_container(&id);
    let pid_in_pod = d
        .exec_ok(
            &id,
            &["sh", "-c", "cat /proc/1/status | grep -c shim; echo $$"],
        )
        .await;
    assert!(
        pid_in_pod.starts_with("1\n"),
        "the pod's infra is pid 1: {pid_in_pod}"
    );
    assert_eq!(
        d.exec_ok(&id, &["cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"])
            .await
            .trim(),
        (64u64 << 20).to_string(),
        "the container's own memory cgroup"
    );
    let listing = d.exec_ok(&id, &["ls", "/sys/fs/cgroup"]).await;
    for want in ["cpu", "cpuacct", "memory", "pids"] {
        assert!(
            listing.split_whitespace().any(|n| n == want),
            "{want} in {listing}"
        );
    }
    let r = d
        .exec_sync(
            &id,
            &[
                "sh",
                "-c",
                "echo 1 > /sys/fs/cgroup/memory/memory.limit_in_bytes",
            ],
            30,
        )
        .await
        .unwrap();
    assert_ne!(r.exit_code, 0, "the cgroups are read-only");
    env.finish_pod(&pod, traces).await;
}
