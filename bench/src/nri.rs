//! What NRI plugins add to `CreateContainer`, two ways:
//!
//! - end to end: two crishim daemons side by side, one with `[nri]` off and one with plugins
//!   registered (`crishim-nri-test-plugin`, each adding an env variable and subscribed to every
//!   event but validation), take turns creating containers in a pod of their own. Taking turns
//!   puts the machine's noise on both; the difference of the medians is what the plugins cost.
//! - the NRI path alone: the daemon's own adaptation (`crishim_nri`), in this process, with the
//!   same plugin processes over a real socket, timed for what `CreateContainer` asks of it (the
//!   `CreateContainer` round and `PostCreateContainer`). Its tail is the added latency's tail,
//!   which the end-to-end difference is too noisy to show.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use crishim_tests::daemon::Daemon;
use serde::Serialize;

use crishim_nri::api;

use crate::client::{pod_config, Cri};
use crate::host::{self, Sweeper};
use crate::report::{median, percentile};
use crate::{progress, toml_str, BUSYBOX};

/// What the plugins subscribe to: every event but validation, as a resource-placement plugin
/// built with NRI's stub does (the stub subscribes to the events a plugin implements).
const EVENTS: [&str; 13] = [
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "UpdatePodSandbox",
    "PostUpdatePodSandbox",
    "CreateContainer",
    "PostCreateContainer",
    "StartContainer",
    "PostStartContainer",
    "UpdateContainer",
    "PostUpdateContainer",
    "StopContainer",
    "RemoveContainer",
];

/// Creates before the clock: caches, the first shim calls.
const WARM_UP: usize = 5;

#[derive(Debug, Serialize)]
pub struct NriReport {
    pub plugins: usize,
    pub creates: usize,
    pub off: Latency,
    pub on: Latency,
    /// `on - off`, at each quantile.
    pub added_p50_ms: f64,
    pub added_p99_ms: f64,
    /// The NRI path alone, per create.
    pub nri_path: Latency,
}

#[derive(Debug, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub samples_ms: Vec<f64>,
}

impl Latency {
    fn of(samples_ms: Vec<f64>) -> Latency {
        Latency {
            p50_ms: median(&samples_ms),
            p99_ms: percentile(&samples_ms, 99.0),
            samples_ms,
        }
    }
}

/// The test plugin, next to `crishim-bench`.
/// The runtime as the in-process adaptation sees it: nothing to synchronize, nothing to update.
struct NoRuntime;

impl crishim_nri::adaptation::Runtime for NoRuntime {
    fn snapshot(
        &self,
    ) -> crishim_nri::adaptation::BoxFuture<(Vec<api::PodSandbox>, Vec<api::Container>)> {
        Box::pin(async { (Vec::new(), Vec::new()) })
    }

    fn update_containers(
        &self,
        updates: Vec<api::ContainerUpdate>,
        _: Vec<api::ContainerEviction>,
    ) -> crishim_nri::adaptation::BoxFuture<Vec<api::ContainerUpdate>> {
        Box::pin(async { updates })
    }
}

/// Starts `n` test plugins against `socket`, each adding one env variable; waits until each is
/// synchronized.
async fn start_plugins(
    bin: &Path,
    dir: &Path,
    socket: &Path,
    tag: &str,
    n: usize,
) -> Result<Plugins> {
    let mut children = Plugins(Vec::new());
    for i in 0..n {
        let log = dir.join(format!("{tag}-p{i}.log"));
        let config = dir.join(format!("{tag}-p{i}.json"));
        std::fs::write(
            &config,
            serde_json::json!({
                "log": log,
                "events": EVENTS,
                "adjust": {"env": {format!("NRI_BENCH_{i}"): "1"}}
            })
            .to_string(),
        )?;
        children.0.push(
            Command::new(bin)
                .arg("--socket")
                .arg(socket)
                .args([
                    "--name",
                    &format!("bench{i}"),
                    "--idx",
                    &format!("{:02}", 10 + i),
                ])
                .arg("--config")
                .arg(&config)
                .stdout(Stdio::null())
                .spawn()
                .context("starting crishim-nri-test-plugin")?,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("SYNC")
        {
            ensure!(Instant::now() < deadline, "plugin {i} did not synchronize");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(children)
}

/// The NRI path of `calls` creates, in this process, with `plugins` plugin processes.
async fn nri_path(bin: &Path, dir: &Path, plugins: usize, calls: usize) -> Result<Latency> {
    let socket = dir.join("direct.sock");
    let config = crishim_nri::adaptation::Config {
        socket_path: socket.clone(),
        plugin_path: dir.join("none"),
        plugin_config_path: dir.join("none"),
        registration_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(2),
        disable_connections: false,
        runtime_name: "crishim-bench".into(),
        runtime_version: env!("CARGO_PKG_VERSION").into(),
    };
    let nri = crishim_nri::adaptation::Nri::start(config, std::sync::Arc::new(NoRuntime)).await?;
    let children = start_plugins(bin, dir, &socket, "direct", plugins).await?;
    let pod = api::PodSandbox {
        id: "bench-pod".into(),
        name: "bench".into(),
        namespace: "crishim-bench".into(),
        ..Default::default()
    };
    let mut samples = Vec::with_capacity(calls);
    for n in 0..WARM_UP + calls {
        let container = api::Container {
            id: format!("bench-{n}"),
            pod_sandbox_id: pod.id.clone(),
            name: format!("c{n}"),
            args: vec!["/bin/sleep".into(), "600".into()],
            env: vec!["PATH=/usr/bin:/bin".into()],
            ..Default::default()
        };
        let start = Instant::now();
        let merged = nri.create_container(&pod, &container).await?;
        nri.post_create_container(&pod, &container).await;
        let took = start.elapsed().as_secs_f64() * 1000.0;
        ensure!(merged.adjust.env.len() == plugins, "every plugin adjusted");
        if n >= WARM_UP {
            samples.push(took);
        }
    }
    nri.shutdown();
    drop(children);
    Ok(Latency::of(samples))
}

fn plugin_bin() -> PathBuf {
    std::env::current_exe()
        .map(|p| p.with_file_name("crishim-nri-test-plugin"))
        .unwrap_or_default()
}

struct Plugins(Vec<Child>);

impl Drop for Plugins {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One daemon and its pod.
struct Side {
    daemon: Daemon,
    cri: Cri,
    pod: String,
    pod_config: crishim_proto::cri::PodSandboxConfig,
    _sweeper: Sweeper,
}

async fn side(
    name: &str,
    registry: &str,
    cni_dir: &Path,
    bridge: &str,
    extra: &str,
) -> Result<Side> {
    let (daemon, sweeper) = crate::start_crishim(registry, cni_dir, bridge, "warn", extra).await?;
    let cri = Cri::connect(daemon.socket()).await?;
    cri.wait_ready(Duration::from_secs(30)).await?;
    cri.pull(BUSYBOX).await?;
    let h = crishim_tests::random_hex;
    let uid = format!("{}-{}-{}-{}-{}", h(4), h(2), h(2), h(2), h(6));
    let cgroup = format!("/{}/pod{uid}", sweeper.cgroup_top);
    host::create_pod_cgroup(&cgroup)?;
    let logs = daemon.dir().join("pod-logs").join(name);
    std::fs::create_dir_all(&logs)?;
    let pod_config = pod_config(name, &uid, &logs, &cgroup);
    let pod = cri.run_pod(&pod_config).await?;
    Ok(Side {
        daemon,
        cri,
        pod,
        pod_config,
        _sweeper: sweeper,
    })
}

impl Side {
    async fn timed_create(&self, n: usize) -> Result<f64> {
        let config = crishim_tests::pods::container_config(
            &format!("c{n}"),
            BUSYBOX,
            &["/bin/sleep", "600"],
        );
        let start = Instant::now();
        self.cri
            .create_container(&self.pod, &config, &self.pod_config)
            .await?;
        Ok(start.elapsed().as_secs_f64() * 1000.0)
    }

    async fn finish(self) {
        let _ = self.cri.stop_pod(&self.pod).await;
        let _ = self.cri.remove_pod(&self.pod).await;
        drop(self.daemon);
    }
}

pub async fn run(
    registry: &str,
    cni_dir: &Path,
    bridge: &str,
    plugins: usize,
    creates: usize,
) -> Result<NriReport> {
    let say = |m: &str| progress("nri", m);
    let bin = plugin_bin();
    ensure!(
        bin.is_file(),
        "{} not found: build it with `cargo build --release -p crishim-tests --bin crishim-nri-test-plugin`",
        bin.display()
    );
    let dir = tempfile::Builder::new()
        .prefix("crishim-bench-nri-")
        .tempdir()?;
    let socket = dir.path().join("nri.sock");
    let nri_toml = format!(
        "[nri]\nenable = true\nsocket_path = {}\nplugin_path = {}\n",
        toml_str(&socket),
        toml_str(&dir.path().join("plugins"))
    );
    say("starting crishim with [nri] off and with it on");
    let off = side("nri-off", registry, cni_dir, bridge, "").await?;
    let on = side("nri-on", registry, cni_dir, bridge, &nri_toml).await?;
    let children = start_plugins(&bin, dir.path(), &socket, "daemon", plugins).await?;
    say(&format!(
        "{plugins} plugins registered; {creates} creates each, taking turns"
    ));
    for n in 0..WARM_UP {
        off.timed_create(n).await?;
        on.timed_create(n).await?;
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for n in WARM_UP..WARM_UP + creates {
        // Who goes first alternates too.
        if n % 2 == 0 {
            a.push(off.timed_create(n).await?);
            b.push(on.timed_create(n).await?);
        } else {
            b.push(on.timed_create(n).await?);
            a.push(off.timed_create(n).await?);
        }
    }
    off.finish().await;
    on.finish().await;
    drop(children);
    say("the NRI path alone, in this process");
    let nri_path = nri_path(&bin, dir.path(), plugins, creates.max(1000)).await?;
    let (off, on) = (Latency::of(a), Latency::of(b));
    Ok(NriReport {
        nri_path,
        plugins,
        creates,
        added_p50_ms: on.p50_ms - off.p50_ms,
        added_p99_ms: on.p99_ms - off.p99_ms,
        off,
        on,
    })
}
