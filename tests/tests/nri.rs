//! NRI plugins against the daemon: real plugin processes (`crishim-nri-test-plugin`, written
//! with crishim's plugin stub) over the NRI socket or launched from `plugin_path`, real pods and
//! containers, and what the plugins asked for checked inside the running container and in its
//! cgroup.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::daemon::{daemon_bin, DaemonOptions};
use crishim_tests::pods::{PodEnv, PodTraces};
use serde_json::json;

const MIB: i64 = 1 << 20;

fn plugin_bin() -> PathBuf {
    daemon_bin().with_file_name("crishim-nri-test-plugin")
}

/// The `[nri]` (and `[gpu] cdi_spec_dirs`) of a daemon whose NRI files live in `dir`.
fn nri_toml(dir: &Path, request_timeout: &str) -> String {
    format!(
        "[nri]\nenable = true\nsocket_path = {:?}\nplugin_path = {:?}\nplugin_config_path = {:?}\n\
         plugin_registration_timeout = \"2s\"\nplugin_request_timeout = {request_timeout:?}\n\
         [gpu]\ncdi_spec_dirs = [{:?}]\n",
        dir.join("nri.sock"),
        dir.join("plugins"),
        dir.join("conf.d"),
        dir.join("cdi"),
    )
}

/// A test plugin process connected over the socket.
struct PluginProc {
    child: Child,
    log: PathBuf,
}

impl PluginProc {
    /// Starts `idx-name` with `config` (its `log` is set here) and waits until it is
    /// synchronized, unless `wait` is false.
    fn start(dir: &Path, name: &str, idx: &str, mut config: serde_json::Value, wait: bool) -> Self {
        let log = dir.join(format!("{idx}-{name}.log"));
        config["log"] = json!(log);
        let cfg = dir.join(format!("{idx}-{name}.json"));
        std::fs::write(&cfg, config.to_string()).unwrap();
        let child = Command::new(plugin_bin())
            .args(["--socket", dir.join("nri.sock").to_str().unwrap()])
            .args(["--name", name, "--idx", idx, "--config"])
            .arg(&cfg)
            .stdout(Stdio::null())
            .spawn()
            .expect("starting crishim-nri-test-plugin (cargo build --workspace --bins)");
        let p = PluginProc { child, log };
        if wait {
            p.wait_for("SYNC", Duration::from_secs(10));
        }
        p
    }

    fn lines(&self) -> Vec<String> {
        read_lines(&self.log)
    }

    /// Waits until a line starts with `prefix`; returns it.
    fn wait_for(&self, prefix: &str, timeout: Duration) -> String {
        wait_line(&self.log, prefix, timeout)
    }

    /// The `EVENT` names it logged, in order.
    fn events(&self) -> Vec<String> {
        self.lines()
            .iter()
            .filter_map(|l| l.strip_prefix("EVENT "))
            .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
            .collect()
    }
}

impl Drop for PluginProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn wait_line(path: &Path, prefix: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(l) = read_lines(path).into_iter().find(|l| l.starts_with(prefix)) {
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "no {prefix:?} line in {}: {:?}",
            path.display(),
            read_lines(path)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `expected` appear in `seen` in this order (others may come between).
fn assert_in_order(seen: &[String], expected: &[&str]) {
    let mut it = seen.iter();
    for e in expected {
        assert!(
            it.any(|s| s == e),
            "{e} missing or out of order in {seen:?}"
        );
    }
}

fn cgroup_file(pid: i32, controller: &str, file: &str) -> String {
    let p = crishim_tests::pods::read_process(pid).expect("container process");
    let rel = p.cgroup_of(controller).expect("cgroup of the container");
    let path = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(rel.trim_start_matches('/'))
        .join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

async fn wait_cgroup(pid: i32, controller: &str, file: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while cgroup_file(pid, controller, file) != want {
        assert!(
            Instant::now() < deadline,
            "{controller}/{file} is {}, not {want}",
            cgroup_file(pid, controller, file)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const CDI_SPEC: &str = r#"cdiVersion: "0.6.0"
kind: "crishim.test/nri"
devices:
  - name: "dev0"
    containerEdits:
      env: ["FROM_NRI_CDI=dev0"]
"#;

/// Runs `sleep` as container `name` in `pod`, started and traced.
async fn run_sleep(
    env: &PodEnv,
    pod: &str,
    pod_cfg: &cri::PodSandboxConfig,
    name: &str,
    traces: &mut PodTraces,
) -> String {
    let id = env
        .d
        .run_container(pod, &env.container_config(name, &["sleep", "600"]), pod_cfg)
        .await
        .unwrap();
    traces.add_container(&id);
    id
}

fn nri_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for d in ["plugins", "conf.d", "cdi"] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    std::fs::write(dir.path().join("cdi/nri.yaml"), CDI_SPEC).unwrap();
    dir
}

#[tokio::test]
async fn every_adjustment_and_update_reaches_the_running_container() {
    if !Path::new("/sys/fs/cgroup/memory").exists() {
        eprintln!("skipped: this test reads cgroup v1 files");
        return;
    }
    let dir = nri_dir();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("hello"), "from the host\n").unwrap();
    let hook_out = dir.path().join("hook.out");
    let env =
        PodEnv::start_with(DaemonOptions::new().extra_toml(&nri_toml(dir.path(), "2s"))).await;
    let plugin = PluginProc::start(
        dir.path(),
        "adjuster",
        "10",
        json!({
            "match": "adjusted",
            "adjust": {
                "env": {"NRI_ENV": "set-by-plugin"},
                "annotations": {"nri.crishim.test/seen": "yes"},
                "mounts": [{"destination": "/nri-mount", "source": shared, "type": "bind",
                            "options": ["rbind", "ro"]}],
                "hooks": {"create_runtime": [{"path": "/bin/sh",
                          "args": ["sh", "-c", format!("echo hooked > {}", hook_out.display())]}]},
                "devices": [{"path": "/dev/nri-null", "type": "c", "major": 1, "minor": 3,
                             "file_mode": 438}],
                "cdi_devices": ["crishim.test/nri=dev0"],
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1234, "soft": 1234}],
                "oom_score_adj": 456,
                "memory_limit": 64 * MIB,
                "cpu_shares": 512,
                "cpu_quota": 50000,
                "cpu_period": 100000,
                "cpuset_cpus": "0",
                "pids_limit": 77,
                "args": ["sleep", "3600"]
            },
            "update_on_update": {"memory_limit": 128 * MIB},
            "unsolicited_update": {"after_event": "PostStartContainer", "delay_ms": 300,
                                   "memory_limit": 96 * MIB}
        }),
        true,
    );

    // `crictl info` shows the registered plugins.
    let status = env
        .d
        .runtime_client()
        .status(cri::StatusRequest { verbose: true })
        .await
        .unwrap();
    let nri: serde_json::Value = serde_json::from_str(&status.into_inner().info["nri"]).unwrap();
    assert_eq!(nri["plugins"], json!(["10-adjuster"]), "{nri}");

    let pod_cfg = env.pod_config("nri");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);
    // The plugin's args replace `false`: the container runs only if they were applied.
    let cfg = env.container_config("adjusted", &["false"]);
    let id = env.d.create_container(&pod, &cfg, &pod_cfg).await.unwrap();
    traces.add_container(&id);
    assert_eq!(
        std::fs::read_to_string(&hook_out).unwrap().trim(),
        "hooked",
        "the createRuntime hook ran"
    );
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            env.d
                .state_dir()
                .join("containers")
                .join(&id)
                .join("config.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(spec["annotations"]["nri.crishim.test/seen"], "yes");
    env.d.start_container(&id).await.unwrap();
    let pid = env.d.container_pid(&id).await;

    assert_eq!(
        env.d
            .exec_ok(&id, &["sh", "-c", "echo $NRI_ENV"])
            .await
            .trim(),
        "set-by-plugin"
    );
    assert_eq!(
        env.d
            .exec_ok(&id, &["sh", "-c", "echo $FROM_NRI_CDI"])
            .await
            .trim(),
        "dev0"
    );
    assert_eq!(
        env.d
            .exec_ok(&id, &["cat", "/nri-mount/hello"])
            .await
            .trim(),
        "from the host"
    );
    let ro = env
        .d
        .exec_sync(
            &id,
            &["sh", "-c", "touch /nri-mount/x 2>&1 || echo refused"],
            10,
        )
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ro.stdout).contains("refused"),
        "the mount is read-only"
    );
    assert_eq!(
        env.d
            .exec_ok(&id, &["sh", "-c", "echo x > /dev/nri-null && echo written"])
            .await
            .trim(),
        "written",
        "the device node exists and the device cgroup allows it"
    );
    assert_eq!(
        env.d.exec_ok(&id, &["sh", "-c", "ulimit -n"]).await.trim(),
        "1234"
    );
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
            .unwrap()
            .trim(),
        "456"
    );
    assert_eq!(cgroup_file(pid, "cpu", "cpu.shares"), "512");
    assert_eq!(cgroup_file(pid, "cpu", "cpu.cfs_quota_us"), "50000");
    assert_eq!(cgroup_file(pid, "cpu", "cpu.cfs_period_us"), "100000");
    assert_eq!(cgroup_file(pid, "cpuset", "cpuset.cpus"), "0");
    assert_eq!(cgroup_file(pid, "pids", "pids.max"), "77");
    // 64 MiB at creation, then the plugin's unsolicited update once the container started.
    wait_cgroup(
        pid,
        "memory",
        "memory.limit_in_bytes",
        &(96 * MIB).to_string(),
    )
    .await;

    // The kubelet asks for 200 MiB; the plugin's answer to UpdateContainer wins.
    env.d
        .runtime_client()
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: id.clone(),
            linux: Some(cri::LinuxContainerResources {
                memory_limit_in_bytes: 200 * MIB,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("UpdateContainerResources");
    assert_eq!(
        cgroup_file(pid, "memory", "memory.limit_in_bytes"),
        (128 * MIB).to_string()
    );
    env.d
        .runtime_client()
        .update_pod_sandbox_resources(cri::UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: pod.clone(),
            resources: Some(cri::LinuxContainerResources {
                cpu_shares: 1024,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("UpdatePodSandboxResources");

    // Another container in the pod, not matched: untouched.
    let plain = run_sleep(&env, &pod, &pod_cfg, "plain", &mut traces).await;
    assert_eq!(
        env.d
            .exec_ok(&plain, &["sh", "-c", "echo x$NRI_ENV"])
            .await
            .trim(),
        "x"
    );

    traces.capture(&env.d).await;
    env.d.stop_container(&id, 0).await.unwrap();
    env.d.remove_container(&id).await.unwrap();
    env.finish_pod(&pod, traces).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !plugin.events().contains(&"RemovePodSandbox".to_string()) {
        assert!(Instant::now() < deadline, "{:?}", plugin.events());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_in_order(
        &plugin.events(),
        &[
            "RunPodSandbox",
            "CreateContainer",
            "PostCreateContainer",
            "StartContainer",
            "PostStartContainer",
            "UpdateContainer",
            "PostUpdateContainer",
            "UpdatePodSandbox",
            "PostUpdatePodSandbox",
            "StopContainer",
            "RemoveContainer",
            "StopPodSandbox",
            "RemovePodSandbox",
        ],
    );
}

#[tokio::test]
async fn two_plugins_setting_one_field_fail_the_create_naming_both_and_leave_nothing() {
    let dir = nri_dir();
    let env =
        PodEnv::start_with(DaemonOptions::new().extra_toml(&nri_toml(dir.path(), "2s"))).await;
    let _one = PluginProc::start(
        dir.path(),
        "one",
        "10",
        json!({"adjust": {"env": {"X": "1"}}}),
        true,
    );
    let _two = PluginProc::start(
        dir.path(),
        "two",
        "20",
        json!({"adjust": {"env": {"X": "2"}}}),
        true,
    );
    let pod_cfg = env.pod_config("conflict");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let traces = PodTraces::new(&pod, &pod_cfg);
    let e = env
        .d
        .create_container(&pod, &env.container_config("c", &["sleep", "60"]), &pod_cfg)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("10-one") && e.message().contains("20-two"),
        "{}",
        e.message()
    );
    assert!(env.d.list_container_ids(None).await.unwrap().is_empty());
    let containers = std::fs::read_dir(env.d.state_dir().join("containers"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(containers, 0, "no bundle left behind");
    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn a_plugins_eviction_stops_the_container() {
    let dir = nri_dir();
    let env =
        PodEnv::start_with(DaemonOptions::new().extra_toml(&nri_toml(dir.path(), "2s"))).await;
    let _plugin = PluginProc::start(
        dir.path(),
        "evictor",
        "10",
        json!({"unsolicited_update": {"after_event": "PostStartContainer", "delay_ms": 100, "evict": true}}),
        true,
    );
    let pod_cfg = env.pod_config("evict");
    let (pod, id, traces) = env
        .run_traced(&pod_cfg, &env.container_config("c", &["sleep", "600"]))
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = env.d.container_status(&id).await.unwrap();
        if st.state == cri::ContainerState::ContainerExited as i32 {
            assert_eq!(st.exit_code, 128 + 9, "killed with no grace period");
            break;
        }
        assert!(Instant::now() < deadline, "not evicted: {st:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn hostile_plugins_cost_at_most_their_timeout_and_are_dropped() {
    let dir = nri_dir();
    let env =
        PodEnv::start_with(DaemonOptions::new().extra_toml(&nri_toml(dir.path(), "500ms"))).await;
    let mut hostile = Vec::new();
    for (idx, mode) in [
        ("11", "hang"),
        ("12", "crash"),
        ("13", "flood"),
        ("14", "nonsense"),
        ("15", "disconnect"),
    ] {
        hostile.push(PluginProc::start(
            dir.path(),
            mode,
            idx,
            json!({"mode": mode}),
            true,
        ));
    }
    let silent = PluginProc::start(
        dir.path(),
        "silent",
        "16",
        json!({"mode": "no-register"}),
        false,
    );
    let good = PluginProc::start(
        dir.path(),
        "good",
        "50",
        json!({"adjust": {"env": {"GOOD": "1"}}}),
        true,
    );

    let pod_cfg = env.pod_config("hostile");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);
    let start = Instant::now();
    let id = env
        .d
        .run_container(
            &pod,
            &env.container_config("c", &["sleep", "600"]),
            &pod_cfg,
        )
        .await
        .expect("the create goes on without the plugins that failed");
    let took = start.elapsed();
    traces.add_container(&id);
    // Five request timeouts at the most, one per hostile plugin.
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(
        env.d.exec_ok(&id, &["sh", "-c", "echo $GOOD"]).await.trim(),
        "1"
    );
    // They are gone: the next create does not wait for them.
    let start = Instant::now();
    run_sleep(&env, &pod, &pod_cfg, "d", &mut traces).await;
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    // The silent one was dropped at its registration timeout and never synchronized.
    assert!(
        !silent.lines().iter().any(|l| l.starts_with("SYNC")),
        "{:?}",
        silent.lines()
    );
    assert!(good.events().contains(&"CreateContainer".to_string()));
    env.d.version().await.expect("the daemon still answers");
    traces.capture(&env.d).await;
    drop(hostile);
    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn a_pre_installed_plugin_is_launched_configured_and_relaunched_after_a_restart() {
    let dir = nri_dir();
    let bin = dir.path().join("plugins/10-pre");
    std::fs::copy(plugin_bin(), &bin).unwrap();
    let log = dir.path().join("pre.log");
    std::fs::write(
        dir.path().join("conf.d/10-pre.conf"),
        json!({"log": log, "adjust": {"env": {"PRE": "launched"}, "oom_score_adj": -999}})
            .to_string(),
    )
    .unwrap();
    let mut env =
        PodEnv::start_with(DaemonOptions::new().extra_toml(&nri_toml(dir.path(), "2s"))).await;
    assert!(wait_line(&log, "CONFIGURE", Duration::from_secs(10)).contains("launched"));
    assert_eq!(wait_line(&log, "SYNC", Duration::from_secs(10)), "SYNC 0 0");

    let pod_cfg = env.pod_config("pre");
    let (pod, id, mut traces) = env
        .run_traced(&pod_cfg, &env.container_config("c", &["sleep", "600"]))
        .await;
    assert_eq!(
        env.d.exec_ok(&id, &["sh", "-c", "echo $PRE"]).await.trim(),
        "launched"
    );
    // The plugin's OOM score is restricted as the kubelet's would be: not below the daemon's.
    let own =
        std::fs::read_to_string(format!("/proc/{}/oom_score_adj", env.d.pid().unwrap())).unwrap();
    let pid = env.d.container_pid(&id).await;
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap(),
        own
    );

    // A new daemon launches it again, and it learns of the pod and container that outlived the
    // old one.
    std::fs::remove_file(&log).unwrap();
    env.d.restart().await.unwrap();
    assert_eq!(wait_line(&log, "SYNC", Duration::from_secs(10)), "SYNC 1 1");
    traces.capture(&env.d).await;
    env.d.stop_container(&id, 0).await.unwrap();
    wait_line(&log, "EVENT StopContainer", Duration::from_secs(5));
    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn only_root_may_connect_to_the_nri_socket() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = nri_dir();
    let env =
        PodEnv::start_with(DaemonOptions::new().extra_toml(&nri_toml(dir.path(), "2s"))).await;
    let socket = dir.path().join("nri.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // The temp dir is root's 0700: open the way to the socket, so only its own mode stands.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(plugin_bin())
        .args([
            "--socket",
            socket.to_str().unwrap(),
            "--name",
            "nobody",
            "--idx",
            "10",
        ])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ermission denied"), "{err}");
    env.stop();
}

/// Plugins built with NRI's own Go stub, one directory per NRI version holding `adjuster` (a
/// plugin that adds env `NRI_ADJUSTER=<version>`, annotation `nri.adjuster/seen=true` and
/// `RLIMIT_NOFILE` 4096, and logs its events) built against that version's stub. The binaries
/// are not part of crishim; `NRI_GO_PLUGINS` names their directory (docs/testing.md).
#[tokio::test]
async fn plugins_built_with_nris_go_stub_work_unchanged() {
    let Some(root) = std::env::var_os("NRI_GO_PLUGINS").map(PathBuf::from) else {
        eprintln!("skipped: NRI_GO_PLUGINS is not set (docs/testing.md)");
        return;
    };
    let mut versions: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("adjuster").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    versions.sort();
    assert!(
        !versions.is_empty(),
        "no <version>/adjuster under {}",
        root.display()
    );
    let dir = nri_dir();
    // The newest is also pre-installed, through a wrapper that names its log.
    let newest = versions.last().unwrap().clone();
    let pre_log = dir.path().join("pre-go.log");
    let wrapper = dir.path().join("plugins/05-goadj");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} -log {}\n",
            root.join(&newest).join("adjuster").display(),
            pre_log.display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let env =
        PodEnv::start_with(DaemonOptions::new().extra_toml(&nri_toml(dir.path(), "2s"))).await;
    assert_eq!(
        wait_line(&pre_log, "SYNC", Duration::from_secs(10)),
        "SYNC 0 0"
    );
    let pod_cfg = env.pod_config("go-pre");
    let (pod, id, mut traces) = env
        .run_traced(&pod_cfg, &env.container_config("c", &["sleep", "600"]))
        .await;
    let got = env
        .d
        .exec_ok(&id, &["sh", "-c", "echo $NRI_ADJUSTER"])
        .await;
    assert_eq!(
        got.trim(),
        newest,
        "the pre-installed Go plugin adjusted the container"
    );
    traces.capture(&env.d).await;
    env.finish_pod(&pod, traces).await;
    std::fs::remove_file(&wrapper).unwrap();

    // Each version in turn, connecting over the socket.
    let env =
        PodEnv::start_with(DaemonOptions::new().extra_toml(&nri_toml(dir.path(), "2s"))).await;
    for version in &versions {
        let log = dir.path().join(format!("{version}.log"));
        let mut child = Command::new(root.join(version).join("adjuster"))
            .args(["-name", "goadj", "-idx", "20", "-socket"])
            .arg(dir.path().join("nri.sock"))
            .arg("-log")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_line(&log, "SYNC", Duration::from_secs(10));
        let pod_cfg = env.pod_config(&format!("go-{}", version.replace('.', "-")));
        let pod = env.d.run_pod(&pod_cfg).await.unwrap();
        let mut traces = PodTraces::new(&pod, &pod_cfg);
        let id = env
            .d
            .run_container(
                &pod,
                &env.container_config("c", &["sleep", "600"]),
                &pod_cfg,
            )
            .await
            .unwrap_or_else(|e| panic!("{version}: {e:?}"));
        traces.add_container(&id);
        let got = env
            .d
            .exec_ok(&id, &["sh", "-c", "echo $NRI_ADJUSTER; ulimit -n"])
            .await;
        assert_eq!(
            got.split_whitespace().collect::<Vec<_>>(),
            [version.as_str(), "4096"],
            "{version}"
        );
        traces.capture(&env.d).await;
        env.d.stop_container(&id, 0).await.unwrap();
        env.d.remove_container(&id).await.unwrap();
        env.d.stop_pod(&pod).await.unwrap();
        env.d.remove_pod(&pod).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let events = || -> Vec<String> {
            read_lines(&log)
                .iter()
                .filter_map(|l| l.strip_prefix("EVENT "))
                .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
                .collect()
        };
        while !events().contains(&"RemovePodSandbox".to_string()) {
            assert!(Instant::now() < deadline, "{version}: {:?}", events());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_in_order(
            &events(),
            &[
                "RunPodSandbox",
                "CreateContainer",
                "PostCreateContainer",
                "StartContainer",
                "PostStartContainer",
                "StopContainer",
                "RemoveContainer",
                "StopPodSandbox",
                "RemovePodSandbox",
            ],
        );
        let _ = child.kill();
        let _ = child.wait();
        eprintln!("NRI {version}: adjustments and events as expected");
    }
    env.stop();
}
