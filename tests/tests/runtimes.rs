//! `[runtimes.<name>]` RuntimeClass handlers with an external OCI runtime: Debian's real runc
//! (`/usr/sbin/runc`, installed by `hack/install-deps.sh`), driven by the pod's shim.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crishim_proto::cri;
use crishim_tests::pods::{
    assert_no_leaks, container_security, marker, sh_container, wait_for_log_line, PodEnv, PodTraces,
};
use crishim_tests::DaemonOptions;
use tonic::Code;

use cri::ContainerState::{ContainerExited, ContainerRunning};

const RUNC: &str = "/usr/sbin/runc";
const WAIT: Duration = Duration::from_secs(20);

fn runc_env_options() -> DaemonOptions {
    assert!(
        Path::new(RUNC).is_file(),
        "{RUNC} is missing: hack/install-deps.sh installs Debian's runc"
    );
    DaemonOptions::new().extra_toml(&format!(
        "[runtimes.runc]\nruntime = \"{RUNC}\"\npod_annotations = [\"example.com/*\"]\n"
    ))
}

/// `runc --root ROOT <args>`, which must succeed; its stdout.
fn runc(root: &Path, args: &[&str]) -> String {
    let out = Command::new(RUNC)
        .arg("--root")
        .arg(root)
        .args(args)
        .output()
        .expect("running runc");
    assert!(
        out.status.success(),
        "runc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The container ids `runc list` names under `root`.
fn runc_ids(root: &Path) -> Vec<String> {
    runc(root, &["list", "--quiet"])
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runc_pod_runs_logs_execs_survives_a_daemon_kill_and_stops() {
    let mut env = PodEnv::start_with(runc_env_options()).await;
    let root: PathBuf = env.d.state_dir().join("runtimes/runc");

    // Status names both handlers; runc's rro support is not claimed.
    let status = env.d.runtime_status().await.unwrap();
    let names: Vec<_> = status
        .runtime_handlers
        .iter()
        .map(|h| h.name.as_str())
        .collect();
    assert_eq!(names, ["", "runc"]);
    assert!(
        !status.runtime_handlers[1]
            .features
            .as_ref()
            .unwrap()
            .recursive_read_only_mounts
    );

    // An unknown handler is refused, naming the ones there are.
    let cfg = env.pod_config("runc-unknown");
    let e = env.d.run_pod_with_handler(&cfg, "kata").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("runc"), "{}", e.message());

    let mut cfg = env.pod_config("runc-pod");
    cfg.annotations
        .insert("example.com/flavour".into(), "plain".into());
    cfg.annotations
        .insert("other.org/secret".into(), "kept-out".into());
    let pod = env.d.run_pod_with_handler(&cfg, "runc").await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let mut c = sh_container(
        &env,
        "main",
        "trap 'exit 7' TERM; echo hello-from-runc; while true; do sleep 0.1; done",
        &marker("runc-main"),
    );
    container_security(&mut c).seccomp = Some(cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
        localhost_ref: String::new(),
    });
    let id = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&id);
    let mut tty = sh_container(
        &env,
        "tty",
        "echo tty-from-runc; exec sleep 1000",
        &marker("runc-tty"),
    );
    tty.tty = true;
    let tty_id = env.d.run_container(&pod, &tty, &cfg).await.unwrap();
    traces.add_container(&tty_id);

    // A recursive read-only mount, which Status does not claim for runc, is refused before
    // anything is made (the leak check at the end would see it).
    let mut rro = sh_container(&env, "rro", "sleep 1", &marker("runc-rro"));
    let host = env.d.dir().join("rro-source");
    std::fs::create_dir_all(&host).unwrap();
    rro.mounts.push(cri::Mount {
        container_path: "/data".into(),
        host_path: host.to_string_lossy().into_owned(),
        readonly: true,
        recursive_read_only: true,
        ..Default::default()
    });
    let e = env.d.create_container(&pod, &rro, &cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("recursive read-only"),
        "{}",
        e.message()
    );

    // It runs through runc: runc's own state names it, with the handler's pod annotation.
    let ids = runc_ids(&root);
    assert!(ids.contains(&id) && ids.contains(&tty_id), "{ids:?}");
    let state: serde_json::Value = serde_json::from_str(&runc(&root, &["state", &id])).unwrap();
    assert_eq!(state["status"], "running", "{state}");
    let annotations = &state["annotations"];
    assert_eq!(annotations["example.com/flavour"], "plain", "{state}");
    assert!(annotations.get("other.org/secret").is_none(), "{state}");

    let log = Path::new(&cfg.log_directory);
    wait_for_log_line(&log.join("main.log"), "stdout", "hello-from-runc", WAIT).await;
    let tty_log = std::fs::read_to_string(log.join("tty.log")).unwrap_or_default();
    if !tty_log.contains("tty-from-runc") {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let tty_log = std::fs::read_to_string(log.join("tty.log")).unwrap_or_default();
        assert!(tty_log.contains("tty-from-runc"), "{tty_log}");
    }

    // exec: output, exit code, and the container's seccomp and namespaces.
    assert_eq!(
        env.d.exec_ok(&id, &["echo", "exec-ok"]).await.trim(),
        "exec-ok"
    );
    let r = env
        .d
        .exec_sync(&id, &["sh", "-c", "echo err >&2; exit 3"], 10)
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.stderr.as_slice()), (3, b"err\n".as_slice()));
    let seccomp = env
        .d
        .exec_ok(&id, &["grep", "^Seccomp:", "/proc/self/status"])
        .await;
    assert!(
        seccomp.contains('2'),
        "exec'd process is filtered: {seccomp}"
    );
    traces.capture(&env.d).await;

    // The daemon dies; the containers and their shim do not. A new daemon finds them.
    env.d.kill();
    env.d.restart().await.unwrap();
    let st = env.d.container_status(&id).await.unwrap();
    assert_eq!(st.state, ContainerRunning as i32, "{st:#?}");
    assert_eq!(env.d.exec_ok(&id, &["echo", "again"]).await.trim(), "again");

    // Stop: runc delivers the signal; the shim records the exit.
    env.d.stop_container(&id, 2).await.unwrap();
    let st = env.d.container_status(&id).await.unwrap();
    assert_eq!(st.state, ContainerExited as i32, "{st:#?}");
    assert_eq!(st.exit_code, 7, "its TERM trap ran: {st:#?}");
    env.d.remove_container(&id).await.unwrap();
    assert!(!runc_ids(&root).contains(&id), "removed from runc's state");

    traces.capture(&env.d).await;
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert!(runc_ids(&root).is_empty(), "{:?}", runc_ids(&root));
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runc_pod_whose_shim_dies_is_cleaned_out_of_runc() {
    let env = PodEnv::start_with(runc_env_options()).await;
    let root: PathBuf = env.d.state_dir().join("runtimes/runc");
    let cfg = env.pod_config("runc-shim-dies");
    let pod = env.d.run_pod_with_handler(&cfg, "runc").await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let c = sh_container(&env, "main", "exec sleep 1000", &marker("runc-shim"));
    let id = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&id);
    traces.capture(&env.d).await;
    let shim_pid = crishim_proto::shim::pid_file::read(
        &env.d.state_dir().join("pods").join(&pod).join("shim.pid"),
    )
    .unwrap()
    .pid;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shim_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The daemon notices, kills the container through runc, records it exited and the pod not
    // ready.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let pod_state = env.d.pod_status(&pod).await.unwrap().state;
        if pod_state == cri::PodSandboxState::SandboxNotready as i32 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "pod still ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let st = env.d.container_status(&id).await.unwrap();
    assert_eq!(st.state, ContainerExited as i32, "{st:#?}");
    assert!(!runc_ids(&root).contains(&id), "{:?}", runc_ids(&root));
    env.finish_pod(&pod, traces).await;
}
