//! `crishim run POD.yaml`: workflow lifecycles (init → main → wait) against a real daemon, a real
//! registry and real containers, and once with the CRI server in the `crishim run` process itself.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use crishim_tests::daemon::{daemon_bin, workspace_root, DaemonOptions};
use crishim_tests::pods::{host_processes, mounts_of, PodEnv};
use serde_json::Value;

/// Run `crishim run [args] MANIFEST` with `manifest` written to a file; returns the process output.
async fn crishim_run(config: &Path, manifest: &str, args: &[&str]) -> (Output, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.yaml");
    std::fs::write(&file, manifest).unwrap();
    let mut cmd = std::process::Command::new(daemon_bin());
    cmd.arg("run")
        .arg("--config")
        .arg(config)
        .args(args)
        .arg(&file);
    let t0 = Instant::now();
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .expect("running crishim run");
    (out, t0.elapsed())
}

fn result_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the result on stdout is not JSON ({e}):\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn container<'a>(result: &'a Value, name: &str) -> &'a Value {
    result["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name} in {result:#}"))
}

fn time_of(c: &Value, field: &str) -> std::time::SystemTime {
    humantime::parse_rfc3339(
        c[field]
            .as_str()
            .unwrap_or_else(|| panic!("{field} in {c:#}")),
    )
    .unwrap()
}

/// The run left no pod, no run directory, no mount and no process behind.
async fn assert_run_left_nothing(env: &PodEnv) {
    assert!(
        env.d.list_pod_ids(None).await.unwrap().is_empty(),
        "the run's pod is still listed"
    );
    let runs = env.d.state_dir().join("runs");
    let mounted: Vec<String> = mounts_of(None)
        .into_iter()
        .filter(|m| Path::new(&m.mount_point).starts_with(&runs))
        .map(|m| m.line)
        .collect();
    assert!(mounted.is_empty(), "mounts of the run left: {mounted:#?}");
    let left: Vec<PathBuf> = std::fs::read_dir(&runs)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "run directories left: {left:?}");
    let state = env.d.state_dir().to_string_lossy().into_owned();
    let procs: Vec<String> = host_processes()
        .into_iter()
        .filter(|p| !p.is_zombie() && p.command().contains(&state))
        .map(|p| p.command())
        .collect();
    assert!(procs.is_empty(), "processes of the run left: {procs:?}");
}

/// An example manifest from `examples/workflow/`, its images pulled from the test registry.
fn example(name: &str, image: &str) -> String {
    let path = workspace_root().join("examples/workflow").join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .replace("docker.io/library/busybox:latest", image)
}

#[tokio::test]
async fn workflow_runs_init_then_main_stops_the_sidecar_and_collects_outputs() {
    let env = PodEnv::start().await;
    let (out, took) = crishim_run(
        env.d.config_path(),
        &example("workflow.yaml", &env.image()),
        &["--attach"],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let r = result_of(&out);
    assert_eq!(
        out.status.code(),
        Some(3),
        "exit code of main; {r:#}\n{stderr}"
    );
    assert_eq!(r["phase"], "Failed", "{r:#}");
    assert_eq!(r["exitCode"], 3);

    let prepare = container(&r, "prepare");
    assert_eq!(prepare["exitCode"], 0, "{r:#}");
    assert_eq!(prepare["role"], "init");
    let main = container(&r, "main");
    assert_eq!(main["exitCode"], 3, "{r:#}");
    assert_eq!(main["stdout"], "main says 21\n");
    assert!(
        time_of(main, "startedAt") >= time_of(prepare, "finishedAt"),
        "main started before its init container finished: {r:#}"
    );
    let logger = container(&r, "logger");
    assert_eq!(logger["role"], "sidecar");
    assert_eq!(logger["exitCode"], 137, "the sidecar is SIGKILLed: {r:#}");
    let stopped_after = time_of(logger, "finishedAt")
        .duration_since(time_of(main, "finishedAt"))
        .unwrap_or_default();
    assert!(
        stopped_after < Duration::from_secs(2) + Duration::from_millis(1500),
        "the sidecar outlived its 2 s grace period by far: {stopped_after:?}"
    );

    assert_eq!(r["outputs"]["result"]["value"], "doubled 42\n", "{r:#}");
    assert_eq!(r["outputs"]["scratch"]["value"], "scratch\n", "{r:#}");
    assert!(
        r["outputs"]["missing"]["error"].is_string(),
        "a missing output is an error: {r:#}"
    );
    assert!(
        stderr.contains("[main] main says 21"),
        "--attach prints the logs prefixed by container name:\n{stderr}"
    );
    assert!(took < Duration::from_secs(30), "the run took {took:?}");
    assert_run_left_nothing(&env).await;
    env.stop();
}

#[tokio::test]
async fn a_failing_init_container_means_main_never_starts() {
    let env = PodEnv::start().await;
    let manifest = example("init-failure.yaml", &env.image());
    let (out, _) = crishim_run(env.d.config_path(), &manifest, &[]).await;
    let r = result_of(&out);
    assert_eq!(out.status.code(), Some(5), "{r:#}");
    assert_eq!(r["phase"], "Failed");
    assert_eq!(r["reason"], "InitError");
    assert_eq!(container(&r, "setup")["exitCode"], 5);
    let main = container(&r, "main");
    assert_eq!(main["reason"], "NotStarted", "{r:#}");
    assert!(main["exitCode"].is_null() && main["startedAt"].is_null());
    assert_run_left_nothing(&env).await;
    env.stop();
}

#[tokio::test]
async fn on_failure_retries_a_failed_init_container() {
    let env = PodEnv::start().await;
    let manifest = example("retry.yaml", &env.image());
    let (out, _) = crishim_run(env.d.config_path(), &manifest, &[]).await;
    let r = result_of(&out);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    assert_eq!(r["phase"], "Succeeded");
    assert_eq!(container(&r, "flaky")["restartCount"], 1, "{r:#}");
    assert_eq!(container(&r, "flaky")["exitCode"], 0);
    assert_eq!(container(&r, "main")["exitCode"], 0);
    assert_run_left_nothing(&env).await;
    env.stop();
}

#[tokio::test]
async fn active_deadline_kills_a_hanging_run() {
    let env = PodEnv::start().await;
    let manifest = example("deadline.yaml", &env.image());
    let (out, took) = crishim_run(env.d.config_path(), &manifest, &[]).await;
    let r = result_of(&out);
    assert_eq!(r["phase"], "Failed", "{r:#}");
    assert_eq!(r["reason"], "DeadlineExceeded", "{r:#}");
    let code = out.status.code().unwrap();
    assert!(
        code == 137 || code == 143,
        "the killed main's code: {code}; {r:#}"
    );
    assert!(
        took < Duration::from_secs(12),
        "a 2 s deadline with a 1 s grace period took {took:?}"
    );
    assert_run_left_nothing(&env).await;
    env.stop();
}

#[tokio::test]
async fn a_native_sidecar_is_stopped_after_the_main_container_exits() {
    let env = PodEnv::start().await;
    let manifest = example("native-sidecar.yaml", &env.image());
    let (out, took) = crishim_run(env.d.config_path(), &manifest, &[]).await;
    let r = result_of(&out);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    assert_eq!(r["phase"], "Succeeded");
    let proxy = container(&r, "proxy");
    assert_eq!(proxy["role"], "nativeSidecar");
    assert_eq!(
        proxy["exitCode"], 0,
        "the sidecar got SIGTERM and exited: {r:#}"
    );
    let main = container(&r, "main");
    assert_eq!(main["stdout"], "done\n");
    assert!(time_of(proxy, "finishedAt") >= time_of(main, "finishedAt"));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert_run_left_nothing(&env).await;
    env.stop();
}

#[tokio::test]
async fn bad_manifests_get_a_clear_error_and_start_nothing() {
    let env = PodEnv::start().await;
    let image = env.image();
    for (manifest, want) in [
        ("kind: Pod\nmetadata: {name: x\n".to_string(), "not a YAML or JSON document"),
        (
            example("unsupported.yaml", &image),
            "spec.containers[0].livenessProbe is not supported",
        ),
        (
            format!("kind: Pod\nmetadata: {{name: x}}\nspec:\n  nodeSelector: {{a: b}}\n  containers: [{{name: a, image: {image}}}]\n"),
            "spec.nodeSelector is not supported",
        ),
    ] {
        let (out, _) = crishim_run(env.d.config_path(), &manifest, &[]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{manifest}");
        assert!(stderr.contains(want), "{manifest:?}: stderr is\n{stderr}");
        assert!(out.stdout.is_empty(), "no result for a run that never started");
    }
    assert_run_left_nothing(&env).await;
    env.stop();
}

#[tokio::test]
async fn without_a_daemon_the_run_serves_cri_in_process() {
    // The registry and image come from a PodEnv; the run gets a root of its own and no daemon.
    let env = PodEnv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, DaemonOptions::new().config_toml(dir.path())).unwrap();
    let manifest = format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "solo"}},
            "spec": {{"hostNetwork": true, "shareProcessNamespace": true,
                      "containers": [{{"name": "main", "image": "{image}",
                                       "command": ["sh", "-c", "echo pid $$; echo hello"]}}]}}}}"#,
        image = env.image()
    );
    let (out, _) = crishim_run(&config, &manifest, &[]).await;
    let r = result_of(&out);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    let main = container(&r, "main");
    let stdout = main["stdout"].as_str().unwrap();
    assert!(stdout.ends_with("hello\n"), "{r:#}");
    assert_ne!(
        stdout.lines().next(),
        Some("pid 1"),
        "with a shared pid namespace the infra process is PID 1: {r:#}"
    );
    assert!(!dir.path().join("crishim.sock").exists());
    let state = dir.path().join("state");
    let left: Vec<String> = host_processes()
        .into_iter()
        .filter(|p| !p.is_zombie() && p.command().contains(&*state.to_string_lossy()))
        .map(|p| p.command())
        .collect();
    assert!(left.is_empty(), "processes of the run left: {left:?}");
    assert!(
        std::fs::read_dir(state.join("runs")).map_or(true, |mut d| d.next().is_none()),
        "the run directory is gone"
    );
    env.stop();
}

#[tokio::test]
async fn ctrl_c_stops_the_run_cleanly() {
    let env = PodEnv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.yaml");
    std::fs::write(&file, example("deadline.yaml", &env.image())).unwrap();
    let child = std::process::Command::new(daemon_bin())
        .arg("run")
        .arg("--config")
        .arg(env.d.config_path())
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt once the main container runs (the 2 s deadline has not passed yet).
    let t0 = Instant::now();
    loop {
        let running = env
            .d
            .list_containers(None)
            .await
            .unwrap()
            .iter()
            .any(|c| c.state == crishim_proto::cri::ContainerState::ContainerRunning as i32);
        if running {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "main never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let r = result_of(&out);
    assert_eq!(r["reason"], "Interrupted", "{r:#}");
    assert_eq!(r["phase"], "Failed");
    assert_ne!(out.status.code(), Some(0));
    assert_run_left_nothing(&env).await;
    env.stop();
}

#[tokio::test]
async fn an_image_that_cannot_be_pulled_fails_the_run_and_leaves_nothing() {
    let env = PodEnv::start().await;
    let missing = env
        .image()
        .replace("busybox:latest", "no-such-image:latest");
    let manifest = example("init-failure.yaml", &missing);
    let (out, _) = crishim_run(env.d.config_path(), &manifest, &[]).await;
    let r = result_of(&out);
    assert_eq!(r["phase"], "Failed", "{r:#}");
    assert_eq!(r["reason"], "ErrImagePull", "{r:#}");
    assert!(
        r["message"]
            .as_str()
            .unwrap_or_default()
            .contains("no-such-image"),
        "the message names the image: {r:#}"
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(r["containers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["reason"] == "NotStarted"));
    assert_run_left_nothing(&env).await;
    env.stop();
}

/// Issue 13's subPath attack: an init container plants `ln -s / /data/esc` in an emptyDir, and the
/// main container mounts `subPath: esc`; a hostPath volume holds a `link -> /` the same way. Each
/// subPath is resolved inside its volume, so the main container sees the volumes, never the
/// host's `/` (a marker file put there for the test).
#[tokio::test]
async fn subpath_symlinks_resolve_inside_their_volume() {
    let env = PodEnv::start().await;
    let host_marker = Path::new("/").join(format!("crishim-subpath-{}", std::process::id()));
    std::fs::write(&host_marker, "host\n").unwrap();
    let hostdir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/", hostdir.path().join("link")).unwrap();
    std::fs::write(hostdir.path().join("in-hostpath"), "").unwrap();
    let manifest = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: subpath-attack}}
spec:
  initContainers:
  - name: plant
    image: {image}
    command: ["sh", "-c", "ln -s / /data/esc && touch /data/in-emptydir"]
    volumeMounts: [{{name: data, mountPath: /data}}]
  containers:
  - name: main
    image: {image}
    command: ["sh", "-c", "ls -A /esc; echo --; ls -A /hp; echo --; ls -A /hp-etc"]
    volumeMounts:
    - {{name: data, mountPath: /esc, subPath: esc}}
    - {{name: host, mountPath: /hp, subPath: link}}
    - {{name: host, mountPath: /hp-etc, subPath: link/etc}}
  volumes:
  - {{name: data, emptyDir: {{}}}}
  - {{name: host, hostPath: {{path: {host}, type: Directory}}}}
"#,
        image = env.image(),
        host = hostdir.path().display(),
    );
    let (out, _) = crishim_run(env.d.config_path(), &manifest, &[]).await;
    let _ = std::fs::remove_file(&host_marker);
    let r = result_of(&out);
    let stdout = container(&r, "main")["stdout"].as_str().unwrap_or_default();
    let name = host_marker.file_name().unwrap().to_string_lossy();
    assert!(
        !stdout.contains(&*name),
        "a subPath showed the host's /: {r:#}"
    );
    let parts: Vec<Vec<&str>> = stdout.split("--\n").map(|p| p.lines().collect()).collect();
    assert_eq!(parts.len(), 3, "{r:#}");
    assert!(
        parts[0].contains(&"in-emptydir"),
        "/esc is not the emptyDir: {r:#}"
    );
    assert!(
        parts[1].contains(&"in-hostpath"),
        "/hp is not the hostPath: {r:#}"
    );
    assert!(
        parts[2].is_empty(),
        "/hp-etc is not a new directory of the volume: {r:#}"
    );
    assert!(
        hostdir.path().join("etc").is_dir(),
        "link/etc was not made in the volume"
    );
    assert_eq!(r["phase"], "Succeeded", "{r:#}");
    assert_run_left_nothing(&env).await;

    // A subPath that cannot be resolved inside its volume (a dangling symlink out of it) fails the
    // run before the container is created, and undoes the binds already made.
    std::os::unix::fs::symlink("/nonexistent-crishim", hostdir.path().join("dangling")).unwrap();
    let failing = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: subpath-dangling}}
spec:
  containers:
  - name: main
    image: {image}
    command: ["true"]
    volumeMounts:
    - {{name: host, mountPath: /hp, subPath: link}}
    - {{name: host, mountPath: /bad, subPath: dangling}}
  volumes:
  - {{name: host, hostPath: {{path: {host}, type: Directory}}}}
"#,
        image = env.image(),
        host = hostdir.path().display(),
    );
    let (out, _) = crishim_run(env.d.config_path(), &failing, &[]).await;
    let r = result_of(&out);
    assert_eq!(r["phase"], "Failed", "{r:#}");
    let message = r["message"].as_str().unwrap_or_default();
    assert!(message.contains("subPath \"dangling\""), "{r:#}");
    assert!(!Path::new("/nonexistent-crishim").exists());
    assert_run_left_nothing(&env).await;
    env.stop();
}
