//! Running, listing, inspecting and removing pods and containers, end to end.

use std::path::Path;
use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::pods::{
    assert_no_leaks, container_filter, container_state_filter, find_leaks, host_processes, is_id,
    labels, marker, pod_state_filter, processes_with_command, sh_container, wait_for_log_line,
    wait_no_process_with_command, with_descendants, PodEnv, PodTraces, LOOP_UNTIL_TERM,
};
use crishim_tests::random_hex;
use tonic::Code;

use cri::ContainerState::{ContainerCreated, ContainerExited, ContainerRunning};
use cri::PodSandboxState::{SandboxNotready, SandboxReady};

use super::{assert_code, shims, text, wait_gone, WAIT};

fn ids(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

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
