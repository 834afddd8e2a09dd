//! `crishim-bench`: crishim and containerd side by side, through the same CRI client, with the
//! same CNI config and the same images from a local registry. `hack/bench.sh` builds and runs it.

mod client;
mod containerd;
mod host;
mod lazy;
mod measure;
mod nri;
mod report;
mod text;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use clap::{Parser, ValueEnum};
use crishim_tests::{busybox_image, Compression, Daemon, DaemonOptions, Image, Registry};
use serde::Serialize;

use client::Cri;
use host::Sweeper;
use measure::{Plan, Results, Target, BUSYBOX, PAUSE_ARG};

/// containerd's sandbox image: busybox-static running `sleep`, standing in for pause.
const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.6";
const CNI_BIN: &str = "/usr/lib/cni";
const POD_SUBNET: &str = "10.95.0.0/16";

#[derive(Parser, Debug)]
#[command(
    about = "crishim and containerd side by side: pod start, burst, ExecSync, stop, \
memory per pod, cold pull; or lazy pull (--lazy). Needs root; hack/bench.sh builds everything and runs this."
)]
struct Args {
    /// Pods started one at a time (and again in the burst), and kept running for the memory,
    /// ExecSync and relist figures. A list (`20,110`) runs a mode for each count.
    #[arg(long, value_delimiter = ',', default_values_t = [50])]
    pods: Vec<usize>,
    /// Pods in flight at once in the burst.
    #[arg(long, default_value_t = 10)]
    concurrency: usize,
    /// Bursts per mode, one after the other (each torn down before the next); the burst figures
    /// are their medians. One burst is a single sample, the noisiest figure of a run.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=20))]
    bursts: u64,
    /// ExecSync calls (`echo`), over the running pods in turn.
    #[arg(long, default_value_t = 100)]
    execs: usize,
    /// Cold pulls, each of a freshly generated image.
    #[arg(long, default_value_t = 5)]
    pull_rounds: usize,
    #[arg(long, default_value_t = 5)]
    pull_layers: usize,
    /// Random (incompressible) bytes per layer, in MiB.
    #[arg(long, default_value_t = 10)]
    pull_layer_mib: usize,
    /// Every container under the RuntimeDefault seccomp profile (the kubelet's
    /// `--seccomp-default`, the `restricted` Pod Security Standard): `on`, `off`, or `both`
    /// (a mode for each). `--seccomp` alone means `on`.
    #[arg(long, value_enum, default_value_t = Seccomp::Off, num_args = 0..=1, default_missing_value = "on")]
    seccomp: Seccomp,
    /// Relists (ListPodSandbox + ListContainers) and ListContainerStats calls with the pods
    /// running.
    #[arg(long, default_value_t = 100)]
    relists: usize,
    /// MiB sent through `cat` in an Exec stream and back (0: skip).
    #[arg(long, default_value_t = 100)]
    stream_mib: usize,
    /// Where the raw samples go, as JSON.
    #[arg(long, default_value = "target/bench/results.json")]
    output: PathBuf,
    /// Measure one runtime only.
    #[arg(long, value_enum)]
    only: Option<Runtime>,
    /// The crishim daemon (default: `crishim` next to this binary).
    #[arg(long)]
    crishim_bin: Option<PathBuf>,
    /// RUST_LOG for the crishim daemon (containerd logs at its default, info).
    #[arg(long, default_value = "info")]
    crishim_log: String,
    /// Keep each runtime's log here (they are removed with their temporary directories).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Measure only what NRI plugins add to CreateContainer, with this many plugins registered
    /// (crishim alone, `[nri]` off against on; see docs/benchmarks.md).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=16))]
    nri_plugins: u64,
    /// CreateContainer calls per daemon in the NRI mode.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=2000))]
    nri_creates: u64,
    /// Measure only lazy pull: one large image through a throttled registry, pulled lazily by
    /// crishim (eStargz, zstd:chunked), whole by crishim and whole by containerd (see
    /// docs/benchmarks.md).
    #[arg(long)]
    lazy: bool,
    /// The lazy image's random files, MiB in all (with a 1 KiB and a 100 MiB file).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(lazy::MIN_IMAGE_MIB..=65536))]
    lazy_image_mib: u64,
    /// The rate the registry sends at, MiB/s, for all connections together.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    lazy_rate_mib: u64,
    /// The lazy mode's columns, in order (`--only` filters them too).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = lazy::Mode::ALL)]
    lazy_modes: Vec<lazy::Mode>,
    /// crishim's `[images] lazy_prefetch_bandwidth` in the lazy columns, bytes/s (0: unlimited,
    /// the registry's rate is the limit).
    #[arg(long, default_value_t = 0)]
    lazy_prefetch_bandwidth: u64,
    /// crishim's `[images] lazy_prefetch_concurrency` in the lazy columns (default: the daemon's).
    #[arg(long)]
    lazy_prefetch_concurrency: Option<u64>,
    /// `crishim image convert --chunk-size` for the lazy images (default: its own).
    #[arg(long)]
    lazy_chunk_size: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Seccomp {
    Off,
    On,
    Both,
}

impl Seccomp {
    fn modes(self) -> &'static [bool] {
        match self {
            Seccomp::Off => &[false],
            Seccomp::On => &[true],
            Seccomp::Both => &[false, true],
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Runtime {
    Crishim,
    Containerd,
}

fn main() -> ExitCode {
    match real_main(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crishim-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(args: Args) -> Result<()> {
    let crishim_bin = match &args.crishim_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("crishim"),
    };
    ensure!(
        crishim_bin.is_file(),
        "{} not found: build it with `cargo build --release -p crishim -p crishim-shim` \
         or pass --crishim-bin",
        crishim_bin.display()
    );
    // crishim_tests::Daemon finds the daemon through CRISHIM_BIN; set before any thread exists.
    std::env::set_var("CRISHIM_BIN", &crishim_bin);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        // On a signal the bench future is dropped here, and its guards clean up.
        tokio::select! {
            r = bench(&args) => r,
            s = interrupted() => Err(anyhow!("interrupted by {}; cleaned up", s?)),
        }
    })
}

async fn interrupted() -> Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    Ok(tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
    })
}

/// What both runtime runs share.
struct Env {
    registry: Registry,
    cni_dir: PathBuf,
    bridge: String,
    plan: Plan,
    crishim_log: String,
    log_dir: Option<PathBuf>,
}

#[derive(Serialize)]
struct Machine {
    cores: usize,
    kernel: String,
    loadavg_before: [f64; 3],
    loadavg_after: [f64; 3],
}

/// One mode's figures: both runtimes under one plan.
#[derive(Serialize)]
struct ModeReport {
    plan: Plan,
    summary: Vec<report::Row>,
    crishim: Option<Results>,
    containerd: Option<Results>,
}

#[derive(Serialize)]
struct Report {
    machine: Machine,
    modes: Vec<ModeReport>,
}

async fn bench(args: &Args) -> Result<()> {
    ensure!(
        nix::unistd::geteuid().is_root(),
        "crishim-bench needs root (namespaces, mounts, cgroups, CNI)"
    );
    ensure!(
        !args.pods.is_empty() && args.pods.iter().all(|p| *p > 0) && args.concurrency > 0,
        "--pods and --concurrency must be at least 1"
    );
    // One mode per pod count and seccomp setting; the cold pulls only in the first (they do not
    // depend on either).
    let mut plans: Vec<Plan> = Vec::new();
    for &pods in &args.pods {
        for &seccomp in args.seccomp.modes() {
            plans.push(Plan {
                pods,
                concurrency: args.concurrency,
                bursts: args.bursts as usize,
                execs: args.execs,
                pull_rounds: if plans.is_empty() {
                    args.pull_rounds
                } else {
                    0
                },
                pull_layers: args.pull_layers,
                pull_layer_mib: args.pull_layer_mib,
                stream_mib: args.stream_mib,
                relists: args.relists,
                seccomp,
            });
        }
    }
    let loadavg_before = host::loadavg();
    let cores = host::cores();
    println!(
        "machine: {cores} cores, load average {} (before)",
        fmt_load(loadavg_before)
    );

    let shared = tempfile::Builder::new()
        .prefix("crishim-bench-")
        .tempdir()?;
    let registry = Registry::start(Default::default())
        .await
        .context("starting docker-registry")?;
    registry
        .push("library/busybox", "latest", &busybox_image())
        .await?;
    registry.push("pause", "3.6", &pause_image()).await?;
    let cni_dir = shared.path().join("cni");
    let bridge = format!("cbench{}", crishim_tests::random_hex(3));
    host::write_cni_conf(&cni_dir, &bridge, POD_SUBNET, &shared.path().join("ipam"))?;
    if let Some(d) = &args.log_dir {
        std::fs::create_dir_all(d)?;
    }
    if args.nri_plugins > 0 {
        let r = nri::run(
            &registry.url(),
            &cni_dir,
            &bridge,
            args.nri_plugins as usize,
            args.nri_creates as usize,
        )
        .await?;
        println!(
            "\n## CreateContainer with {} NRI plugins, {} creates each\n",
            r.plugins, r.creates
        );
        println!("| | [nri] off | {} plugins | added |", r.plugins);
        println!("|---|---|---|---|");
        println!(
            "| p50 | {:.2} ms | {:.2} ms | {:.2} ms |",
            r.off.p50_ms, r.on.p50_ms, r.added_p50_ms
        );
        println!(
            "| p99 | {:.2} ms | {:.2} ms | {:.2} ms |",
            r.off.p99_ms, r.on.p99_ms, r.added_p99_ms
        );
        println!(
            "\nthe NRI path alone ({} creates): p50 {:.3} ms, p99 {:.3} ms",
            r.nri_path.samples_ms.len(),
            r.nri_path.p50_ms,
            r.nri_path.p99_ms
        );
        if let Some(dir) = args.output.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&args.output, serde_json::to_vec_pretty(&r)?)?;
        println!("raw samples: {}", args.output.display());
        return Ok(());
    }
    if args.lazy {
        let modes = args
            .lazy_modes
            .iter()
            .copied()
            .filter(|m| match args.only {
                Some(Runtime::Crishim) => *m != lazy::Mode::Containerd,
                Some(Runtime::Containerd) => *m == lazy::Mode::Containerd,
                None => true,
            })
            .collect();
        let setup = lazy::Setup {
            registry: &registry,
            cni_dir: &cni_dir,
            bridge: &bridge,
            crishim_bin: &crishim_bin_path()?,
            crishim_log: &args.crishim_log,
            log_dir: args.log_dir.as_deref(),
            output: &args.output,
        };
        let opts = lazy::Options {
            image_mib: args.lazy_image_mib,
            rate_mib: args.lazy_rate_mib,
            modes,
            prefetch_bandwidth: args.lazy_prefetch_bandwidth,
            prefetch_concurrency: args.lazy_prefetch_concurrency,
            chunk_size: args.lazy_chunk_size,
        };
        return lazy::run(&setup, &opts).await;
    }
    let mut env = Env {
        registry,
        cni_dir,
        bridge,
        plan: plans[0].clone(),
        crishim_log: args.crishim_log.clone(),
        log_dir: args.log_dir.clone(),
    };

    let mut modes = Vec::new();
    for plan in plans {
        env.plan = plan.clone();
        eprintln!("== {}", mode_name(&plan));
        // The runtimes take turns within a mode, so that both see the machine as it is then.
        let crishim = match args.only {
            Some(Runtime::Containerd) => None,
            _ => Some(run_crishim(&env).await.context("crishim")?),
        };
        let containerd = match args.only {
            Some(Runtime::Crishim) => None,
            _ => Some(run_containerd(&env).await.context("containerd")?),
        };
        let summary = report::rows(crishim.as_ref(), containerd.as_ref());
        modes.push(ModeReport {
            plan,
            summary,
            crishim,
            containerd,
        });
    }

    let loadavg_after = host::loadavg();
    if let Some(m) = modes.first() {
        for (name, r) in [("crishim", &m.crishim), ("containerd", &m.containerd)] {
            if let Some(r) = r {
                println!("{name}: {}", r.version);
            }
        }
    }
    for m in &modes {
        let plan = &m.plan;
        println!(
            "\n## {}\n\n{} pods serial, {} bursts {} at a time, {} ExecSync, {} relists, {} cold pulls of {} x {} MiB\n",
            mode_name(plan),
            plan.pods,
            plan.bursts,
            plan.concurrency,
            plan.execs,
            plan.relists,
            plan.pull_rounds,
            plan.pull_layers,
            plan.pull_layer_mib,
        );
        print!("{}", report::table(&m.summary));
    }
    println!(
        "\nmachine: {cores} cores, load average {} (after)",
        fmt_load(loadavg_after)
    );

    let report = Report {
        machine: Machine {
            cores,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            loadavg_before,
            loadavg_after,
        },
        modes,
    };
    if let Some(dir) = args.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.output, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", args.output.display()))?;
    println!("raw samples: {}", args.output.display());
    Ok(())
}

/// `20 pods, RuntimeDefault seccomp on every container` or `20 pods, no seccomp profile`.
fn mode_name(plan: &Plan) -> String {
    format!(
        "{} pods, {}",
        plan.pods,
        if plan.seccomp {
            "RuntimeDefault seccomp on every container"
        } else {
            "no seccomp profile"
        }
    )
}

fn fmt_load(l: [f64; 3]) -> String {
    format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2])
}

pub(crate) fn progress(runtime: &str, msg: &str) {
    eprintln!("[{runtime}] {msg}");
}

/// busybox-static running `sleep PAUSE_ARG`. Its layer differs from the workload's (one more
/// file), so its pages are its own, as a real pause binary's would be.
fn pause_image() -> Image {
    let layer = crishim_tests::image::busybox_entries()
        .file("pause-stand-in", "crishim-bench\n", 0o644)
        .build(Compression::Gzip);
    Image::new(vec![layer]).cmd(&["/bin/sleep", PAUSE_ARG])
}

/// The daemon binary, as `real_main` found it.
fn crishim_bin_path() -> Result<PathBuf> {
    std::env::var_os("CRISHIM_BIN")
        .map(PathBuf::from)
        .context("CRISHIM_BIN is not set")
}

pub(crate) fn toml_str(p: &Path) -> String {
    serde_json::to_string(&p.to_string_lossy()).expect("string to json")
}

fn save_log(env: &Env, name: &str, text: &str) {
    if let Some(d) = &env.log_dir {
        let path = d.join(format!("{name}.log"));
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("writing {}: {e}", path.display());
        }
    }
}

async fn run_crishim(env: &Env) -> Result<Results> {
    let say = |m: &str| progress("crishim", m);
    say("starting crishim serve");
    let mirror = env.registry.url();
    let (daemon, sweeper) =
        start_crishim(&mirror, &env.cni_dir, &env.bridge, &env.crishim_log, "").await?;
    let result = async {
        let cri = Cri::connect(daemon.socket()).await?;
        cri.wait_ready(Duration::from_secs(30)).await?;
        say("pulling busybox");
        cri.pull(BUSYBOX).await?;
        let target = Target {
            cri,
            daemon_pid: daemon.pid().context("daemon pid")? as i32,
            dirs: sweeper.dirs.clone(),
            cgroup_top: sweeper.cgroup_top.clone(),
            run_dir: daemon.dir().to_path_buf(),
            registry: &env.registry,
        };
        measure::run(&target, &env.plan, &say).await
    }
    .await;
    let log = daemon.log_text();
    save_log(env, "crishim", &log);
    // The daemon first (SIGTERM), then whatever it left.
    drop(daemon);
    drop(sweeper);
    result.map_err(|e| e.context(format!("crishim's log ends:\n{}", text::tail(&log, 4000))))
}

/// `crishim serve` on a tmpfs state directory, pulling through `registry` and networking with
/// the bench's CNI config, with `extra` in its config; and what cleans up after it.
pub(crate) async fn start_crishim(
    registry: &str,
    cni_dir: &Path,
    bridge: &str,
    log: &str,
    extra: &str,
) -> Result<(Daemon, Sweeper)> {
    let opts = crishim_options(registry, cni_dir, log, extra);
    let daemon = Daemon::start(opts)
        .await
        .context("starting crishim serve")?;
    let sweeper = crishim_sweeper(&daemon, bridge);
    Ok((daemon, sweeper))
}

/// The options [`start_crishim`] starts the daemon with.
pub(crate) fn crishim_options(
    registry: &str,
    cni_dir: &Path,
    log: &str,
    extra: &str,
) -> DaemonOptions {
    DaemonOptions::new()
        .state_on_tmpfs()
        .mirror("docker.io", &[registry])
        .mirror("registry.k8s.io", &[registry])
        .extra_toml(&format!(
            "[cni]\nconf_dir = {}\nbin_dirs = [{}]\n{extra}",
            toml_str(cni_dir),
            toml_str(Path::new(CNI_BIN))
        ))
        .env("RUST_LOG", log)
}

/// What removes whatever `daemon` and its pods leave, on drop.
pub(crate) fn crishim_sweeper(daemon: &Daemon, bridge: &str) -> Sweeper {
    Sweeper {
        dirs: vec![daemon.dir().to_path_buf()],
        cgroup_top: format!("crishim-bench-{}", crishim_tests::random_hex(4)),
        bridge: bridge.to_string(),
        containerd_address: None,
        empty_dirs: Vec::new(),
    }
}

/// containerd on fresh directories, its state on a tmpfs, and what cleans up after it. Dropped
/// in field order: containerd, its state tmpfs, the sweep, the directory.
pub(crate) struct ContainerdNode {
    pub ctd: containerd::Containerd,
    _state_tmpfs: host::Tmpfs,
    pub sweeper: Sweeper,
    pub dir: tempfile::TempDir,
}

impl ContainerdNode {
    pub async fn start(mirror: &str, cni_dir: &Path, bridge: &str) -> Result<ContainerdNode> {
        let dir = tempfile::Builder::new()
            .prefix("crishim-bench-containerd-")
            .tempdir()?;
        let cfg = containerd::Config {
            dir: dir.path(),
            mirror,
            cni_conf_dir: cni_dir,
            cni_bin_dir: Path::new(CNI_BIN),
            sandbox_image: PAUSE_IMAGE,
        };
        // containerd's shims put their sockets in /run/containerd/s whatever the config says.
        let run_dir = Path::new("/run/containerd");
        let empty_dirs = if run_dir.exists() {
            Vec::new()
        } else {
            vec![run_dir.join("s"), run_dir.to_path_buf()]
        };
        let sweeper = Sweeper {
            dirs: vec![dir.path().to_path_buf()],
            cgroup_top: format!("crishim-bench-{}", crishim_tests::random_hex(4)),
            bridge: bridge.to_string(),
            containerd_address: Some(cfg.socket().to_string_lossy().into_owned()),
            empty_dirs,
        };
        // On a node containerd's state is /run/containerd, a tmpfs; crishim's gets one too.
        let state_tmpfs = host::Tmpfs::mount(&dir.path().join("state"))?;
        let ctd = containerd::Containerd::start(&cfg).await?;
        Ok(ContainerdNode {
            ctd,
            _state_tmpfs: state_tmpfs,
            sweeper,
            dir,
        })
    }

    /// containerd's `root`: its content store and snapshots.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// Copy containerd's log into `log_dir`, if there is one.
    pub fn save_log(&self, log_dir: Option<&Path>) {
        if let Some(d) = log_dir {
            let _ = std::fs::copy(
                self.dir.path().join("containerd.log"),
                d.join("containerd.log"),
            );
        }
    }
}

async fn run_containerd(env: &Env) -> Result<Results> {
    let say = |m: &str| progress("containerd", m);
    say("starting containerd");
    let node = ContainerdNode::start(&env.registry.url(), &env.cni_dir, &env.bridge).await?;
    let result = async {
        let cri = Cri::connect(&node.ctd.socket).await?;
        cri.wait_ready(Duration::from_secs(30)).await?;
        say("pulling busybox and the pause stand-in");
        cri.pull(PAUSE_IMAGE).await?;
        cri.pull(BUSYBOX).await?;
        let target = Target {
            cri,
            daemon_pid: node.ctd.pid(),
            dirs: node.sweeper.dirs.clone(),
            cgroup_top: node.sweeper.cgroup_top.clone(),
            run_dir: node.dir.path().to_path_buf(),
            registry: &env.registry,
        };
        measure::run(&target, &env.plan, &say).await
    }
    .await;
    let log = node.ctd.log_tail();
    node.save_log(env.log_dir.as_deref());
    drop(node);
    result.map_err(|e| e.context(format!("containerd's log ends:\n{log}")))
}
