//! The measurements, the same for both runtimes: serial pod start, ExecSync, memory with the
//! pods running, stop + remove, a concurrent burst, and cold pulls.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crishim_proto::cri;
use crishim_tests::pods::HostProcess;
use crishim_tests::{Compression, Image, LayerBuilder, Registry};
use serde::Serialize;

use crate::client::{pod_config, Cri};
use crate::host;

/// The workload's distinctive argument, so its processes are left out of the memory figure.
pub const WORKLOAD_ARG: &str = "1000000007";
/// The pause stand-in's distinctive argument (containerd's sandbox image).
pub const PAUSE_ARG: &str = "1000000009";
/// The workload image, mirrored to the local registry for both runtimes.
pub const BUSYBOX: &str = "docker.io/library/busybox:latest";

/// How much to measure.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub pods: usize,
    pub concurrency: usize,
    /// Bursts, one after the other; their figures are reported as medians.
    pub bursts: usize,
    pub execs: usize,
    pub pull_rounds: usize,
    pub pull_layers: usize,
    pub pull_layer_mib: usize,
    /// MiB sent through `cat` over an `Exec` stream (SPDY), and back.
    pub stream_mib: usize,
    /// Relists (ListPodSandbox + ListContainers) and ListContainerStats calls, with the pods
    /// running.
    pub relists: usize,
    /// Every container under the RuntimeDefault seccomp profile.
    pub seccomp: bool,
}

/// One runtime under test.
pub struct Target<'a> {
    pub cri: Cri,
    pub daemon_pid: i32,
    /// Directories the runtime's processes name on their command lines.
    pub dirs: Vec<PathBuf>,
    /// Pod cgroups go under `/<cgroup_top>/`.
    pub cgroup_top: String,
    /// Pod log directories go here.
    pub run_dir: PathBuf,
    pub registry: &'a Registry,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Results {
    pub version: String,
    /// Serial: one pod after the other.
    pub pod_start: Vec<PodStart>,
    /// Each burst, in order.
    pub bursts: Vec<Burst>,
    pub exec_ms: Vec<f64>,
    /// ListPodSandbox + ListContainers, with the serial pods running.
    pub relist_ms: Vec<f64>,
    pub list_stats_ms: Vec<f64>,
    /// Each round trip of `stream_mib` MiB through `cat` in an `Exec` stream.
    pub stream_ms: Vec<f64>,
    pub stop_remove: Vec<StopRemove>,
    pub memory: Memory,
    pub pull: Vec<Pull>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PodStart {
    pub run_pod_ms: f64,
    pub create_ms: f64,
    pub start_ms: f64,
    pub total_ms: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Burst {
    pub concurrency: usize,
    pub wall_ms: f64,
    /// The node's busy CPU time over the burst, all processes (the client's too), per pod: the
    /// burst keeps every core busy, so this is what its wall time is made of.
    pub node_cpu_ms_per_pod: f64,
    pub pods: Vec<PodStart>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct StopRemove {
    pub stop_ms: f64,
    pub remove_ms: f64,
    pub total_ms: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Memory {
    pub pods: usize,
    pub daemon_before_kib: u64,
    pub daemon_after_kib: u64,
    pub processes: Vec<ProcessMemory>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessMemory {
    pub pid: i32,
    pub role: Role,
    pub command: String,
    pub pss_kib: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Daemon,
    Shim,
    /// crishim's infra process or containerd's pause container.
    Infra,
    Workload,
    Other,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Pull {
    pub image: String,
    pub bytes: u64,
    pub ms: f64,
    /// `skopeo copy` of the same image from the same registry to a local directory, right after:
    /// download and digest checks only, no unpacking.
    pub skopeo_ms: f64,
}

impl Memory {
    /// PSS of the processes of `role`, in KiB.
    pub fn sum(&self, role: Role) -> u64 {
        self.processes
            .iter()
            .filter(|p| p.role == role)
            .map(|p| p.pss_kib)
            .sum()
    }

    pub fn daemon_growth_kib(&self) -> i64 {
        self.daemon_after_kib as i64 - self.daemon_before_kib as i64
    }

    /// Everything the runtime added, per pod, in KiB: shims, infra/pause, anything else of
    /// its own, and the daemon's growth; never the workload.
    pub fn per_pod_kib(&self) -> f64 {
        let added = self.sum(Role::Shim) + self.sum(Role::Infra) + self.sum(Role::Other);
        (added as i64 + self.daemon_growth_kib()) as f64 / self.pods.max(1) as f64
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A pod and its one container, as started.
#[derive(Clone, Debug)]
struct Pod {
    id: String,
    container: String,
}

/// Configs made before the clock starts: the kubelet creates the pod cgroup and log directory
/// before it calls RunPodSandbox.
struct PodSpec {
    pod: cri::PodSandboxConfig,
    container: cri::ContainerConfig,
}

impl Target<'_> {
    fn pod_spec(&self, name: &str) -> Result<PodSpec> {
        let h = crishim_tests::random_hex;
        let uid = format!("{}-{}-{}-{}-{}", h(4), h(2), h(2), h(2), h(6));
        let cgroup = format!("/{}/pod{uid}", self.cgroup_top);
        host::create_pod_cgroup(&cgroup)?;
        let logs = self
            .run_dir
            .join("pod-logs")
            .join(format!("crishim-bench_{name}_{uid}"));
        std::fs::create_dir_all(&logs)?;
        Ok(PodSpec {
            pod: pod_config(name, &uid, &logs, &cgroup),
            container: crishim_tests::pods::container_config(
                "work",
                BUSYBOX,
                &["/bin/sleep", WORKLOAD_ARG],
            ),
        })
    }

    /// `n` pods; with `seccomp`, every container under the RuntimeDefault profile, as the
    /// kubelet's `--seccomp-default` and the `restricted` Pod Security Standard set.
    fn specs(&self, tag: &str, n: usize, seccomp: bool) -> Result<Vec<PodSpec>> {
        (0..n)
            .map(|i| {
                let mut spec = self.pod_spec(&format!("{tag}-{i}"))?;
                if seccomp {
                    let linux = spec.container.linux.get_or_insert_with(Default::default);
                    linux
                        .security_context
                        .get_or_insert_with(Default::default)
                        .seccomp = Some(cri::SecurityProfile {
                        profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
                        localhost_ref: String::new(),
                    });
                }
                Ok(spec)
            })
            .collect()
    }
}

/// RunPodSandbox + CreateContainer + StartContainer, each timed.
async fn start_pod(cri: &Cri, spec: &PodSpec) -> Result<(Pod, PodStart)> {
    let t0 = Instant::now();
    let id = cri.run_pod(&spec.pod).await?;
    let t1 = Instant::now();
    let container = cri
        .create_container(&id, &spec.container, &spec.pod)
        .await?;
    let t2 = Instant::now();
    cri.start_container(&container).await?;
    let t3 = Instant::now();
    Ok((
        Pod { id, container },
        PodStart {
            run_pod_ms: ms(t1 - t0),
            create_ms: ms(t2 - t1),
            start_ms: ms(t3 - t2),
            total_ms: ms(t3 - t0),
        },
    ))
}

async fn stop_remove(cri: &Cri, pod: &str) -> Result<StopRemove> {
    let t0 = Instant::now();
    cri.stop_pod(pod).await?;
    let t1 = Instant::now();
    cri.remove_pod(pod).await?;
    let t2 = Instant::now();
    Ok(StopRemove {
        stop_ms: ms(t1 - t0),
        remove_ms: ms(t2 - t1),
        total_ms: ms(t2 - t0),
    })
}

/// Everything, in order. The runtime must have pulled [`BUSYBOX`] (and its sandbox image).
pub async fn run(t: &Target<'_>, plan: &Plan, progress: &dyn Fn(&str)) -> Result<Results> {
    let mut r = Results {
        version: t.cri.version().await?,
        ..Default::default()
    };
    let cri = &t.cri;

    // One pod first, unmeasured: it creates the CNI bridge and pages in the code paths.
    let warm = t.specs("warmup", 1, plan.seccomp)?;
    let (pod, _) = start_pod(cri, &warm[0]).await.context("warm-up pod")?;
    stop_remove(cri, &pod.id).await.context("warm-up pod")?;
    let daemon_before = settled_pss(t.daemon_pid).await;

    progress(&format!("{} pods, one at a time", plan.pods));
    let specs = t.specs("serial", plan.pods, plan.seccomp)?;
    let mut pods = Vec::new();
    for s in &specs {
        let (pod, timing) = start_pod(cri, s).await?;
        pods.push(pod);
        r.pod_start.push(timing);
    }

    progress(&format!("memory with {} pods running", pods.len()));
    r.memory = measure_memory(t, pods.len(), daemon_before).await?;

    progress(&format!("{} ExecSync calls", plan.execs));
    for i in 0..plan.execs {
        let pod = &pods[i % pods.len()];
        let t0 = Instant::now();
        cri.exec_ok(&pod.container, &["echo", "crishim-bench"])
            .await?;
        r.exec_ms.push(ms(t0.elapsed()));
    }

    progress(&format!(
        "{} relists and ListContainerStats calls with {} pods running",
        plan.relists,
        pods.len()
    ));
    for _ in 0..plan.relists {
        let t0 = Instant::now();
        let (listed_pods, containers) = cri.relist().await?;
        r.relist_ms.push(ms(t0.elapsed()));
        if listed_pods < pods.len() || containers < pods.len() {
            bail!(
                "the relist saw {listed_pods} pods and {containers} containers of {}",
                pods.len()
            );
        }
        let t0 = Instant::now();
        cri.list_container_stats().await?;
        r.list_stats_ms.push(ms(t0.elapsed()));
    }

    if plan.stream_mib > 0 {
        progress(&format!(
            "Exec stream: {} MiB through cat and back, twice",
            plan.stream_mib
        ));
        let data: Vec<u8> = (0..plan.stream_mib << 20)
            .map(|i: usize| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for _ in 0..2 {
            let url = cri.exec_url(&pods[0].container, &["cat"]).await?;
            let t0 = Instant::now();
            let out = crishim_streaming::client::spdy_remotecommand(
                &url,
                crishim_streaming::client::Input {
                    stdin: Some(data.clone()),
                    stderr: true,
                    ..Default::default()
                },
            )
            .await
            .context("Exec stream")?;
            let took = t0.elapsed();
            if out.stdout != data {
                bail!(
                    "the Exec stream returned {} bytes that differ from the {} sent",
                    out.stdout.len(),
                    data.len()
                );
            }
            r.stream_ms.push(ms(took));
        }
    }

    progress("stop + remove, one pod at a time");
    for pod in &pods {
        r.stop_remove.push(stop_remove(cri, &pod.id).await?);
    }

    let rounds = plan.bursts.max(1);
    let ours = format!("/{}/", t.cgroup_top);
    for round in 1..=rounds {
        progress(&format!(
            "{} pods, {} at a time (burst {round} of {rounds})",
            plan.pods, plan.concurrency
        ));
        let specs: Vec<Arc<PodSpec>> = t
            .specs("burst", plan.pods, plan.seccomp)?
            .into_iter()
            .map(Arc::new)
            .collect();
        let busy_before = host::busy_ticks();
        let (burst_pods, timings, wall) = burst(cri, &specs, plan.concurrency).await?;
        let busy = busy_before
            .zip(host::busy_ticks())
            .map(|(a, b)| b.saturating_sub(a));
        r.bursts.push(Burst {
            concurrency: plan.concurrency,
            wall_ms: ms(wall),
            node_cpu_ms_per_pod: busy.map_or(f64::NAN, |t| {
                t as f64 * host::ms_per_tick() / specs.len().max(1) as f64
            }),
            pods: timings,
        });
        remove_all(cri, &burst_pods, plan.concurrency).await?;
        // As the kubelet removes a deleted pod's cgroup: each burst meets the cgroups the first
        // one met, not those of the bursts before it.
        for spec in &specs {
            let parent = spec.pod.linux.as_ref().map(|l| l.cgroup_parent.as_str());
            if let Some(p) = parent.filter(|p| p.starts_with(&ours)) {
                // What is left (a runtime that left a container's cgroup) the final sweep reports.
                let _ = host::remove_cgroup_tree(p.trim_start_matches('/'));
            }
        }
    }

    for round in 0..plan.pull_rounds {
        progress(&format!(
            "cold pull {}/{}: {} layers of {} MiB",
            round + 1,
            plan.pull_rounds,
            plan.pull_layers,
            plan.pull_layer_mib
        ));
        r.pull.push(cold_pull(t, plan).await?);
    }
    let left = cri.pod_ids().await?;
    if !left.is_empty() {
        bail!("pods left after the run: {left:?}");
    }
    Ok(r)
}

/// Start every pod with at most `concurrency` in flight; returns the pods, their timings and the
/// wall time from the first call to the last answer.
async fn burst(
    cri: &Cri,
    specs: &[Arc<PodSpec>],
    concurrency: usize,
) -> Result<(Vec<Pod>, Vec<PodStart>, Duration)> {
    let sem = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut set = tokio::task::JoinSet::new();
    let t0 = Instant::now();
    for spec in specs {
        let permit = sem.clone().acquire_owned().await?;
        let (cri, spec) = (cri.clone(), spec.clone());
        set.spawn(async move {
            let r = start_pod(&cri, &spec).await;
            drop(permit);
            r
        });
    }
    let mut pods = Vec::new();
    let mut timings = Vec::new();
    let mut first_err = None;
    while let Some(res) = set.join_next().await {
        match res? {
            Ok((pod, t)) => {
                pods.push(pod);
                timings.push(t);
            }
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    let wall = t0.elapsed();
    if let Some(e) = first_err {
        // Leave nothing running behind the error.
        let _ = remove_all(cri, &pods, concurrency).await;
        return Err(e.context("burst"));
    }
    Ok((pods, timings, wall))
}

async fn remove_all(cri: &Cri, pods: &[Pod], concurrency: usize) -> Result<()> {
    let sem = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for pod in pods {
        let permit = sem.clone().acquire_owned().await?;
        let (cri, id) = (cri.clone(), pod.id.clone());
        set.spawn(async move {
            let r = stop_remove(&cri, &id).await;
            drop(permit);
            r
        });
    }
    while let Some(res) = set.join_next().await {
        res??;
    }
    Ok(())
}

/// The daemon's PSS once it has been idle for a moment (a Go daemon frees lazily).
async fn settled_pss(pid: i32) -> u64 {
    tokio::time::sleep(Duration::from_secs(2)).await;
    host::pss_kib(pid).unwrap_or(0)
}

fn role(p: &HostProcess, daemon_pid: i32) -> Role {
    let cmd = p.command();
    let prog = p.cmdline.first().map(String::as_str).unwrap_or("");
    if p.pid == daemon_pid {
        Role::Daemon
    } else if cmd.contains(WORKLOAD_ARG) {
        Role::Workload
    } else if cmd.contains(PAUSE_ARG) || prog == "crishim-pause" {
        Role::Infra
    } else if prog.ends_with("crishim-shim") || prog.ends_with("containerd-shim-runc-v2") {
        Role::Shim
    } else {
        Role::Other
    }
}

async fn measure_memory(t: &Target<'_>, pods: usize, daemon_before: u64) -> Result<Memory> {
    let daemon_after = settled_pss(t.daemon_pid).await;
    let mut processes = Vec::new();
    for p in host::owned_processes(&t.dirs, &t.cgroup_top) {
        let role = role(&p, t.daemon_pid);
        if role == Role::Daemon {
            continue;
        }
        if let Some(pss) = host::pss_kib(p.pid) {
            processes.push(ProcessMemory {
                pid: p.pid,
                role,
                command: p.command(),
                pss_kib: pss,
            });
        }
    }
    let m = Memory {
        pods,
        daemon_before_kib: daemon_before,
        daemon_after_kib: daemon_after,
        processes,
    };
    let workloads = m.processes.iter().filter(|p| p.role == Role::Workload);
    if workloads.count() != pods {
        bail!(
            "expected {pods} workload processes, found: {:#?}",
            m.processes
        );
    }
    Ok(m)
}

/// Push a freshly generated image (random, incompressible layers, gzip) and time its pull: no
/// store has seen any of its blobs.
async fn cold_pull(t: &Target<'_>, plan: &Plan) -> Result<Pull> {
    let (layers, mib) = (plan.pull_layers, plan.pull_layer_mib);
    let image = tokio::task::spawn_blocking(move || random_image(layers, mib)).await??;
    let bytes = image.layers.iter().map(|l| l.blob.len() as u64).sum();
    let repo = format!("library/bench-pull-{}", crishim_tests::random_hex(4));
    t.registry
        .push(&repo, "latest", &image)
        .await
        .context("pushing the pull image")?;
    let reference = format!("docker.io/{repo}:latest");
    let t0 = Instant::now();
    t.cri.pull(&reference).await?;
    let pulled = ms(t0.elapsed());
    let dir = tempfile::tempdir()?;
    let source = format!("docker://{}/{repo}:latest", t.registry.host());
    let target = format!("dir:{}", dir.path().display());
    let t0 = Instant::now();
    let out = tokio::process::Command::new("skopeo")
        .args(["copy", "--src-tls-verify=false", &source, &target])
        .output()
        .await
        .context("running skopeo")?;
    let copied = ms(t0.elapsed());
    if !out.status.success() {
        bail!(
            "skopeo copy {source}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(Pull {
        image: reference,
        bytes,
        ms: pulled,
        skopeo_ms: copied,
    })
}

fn random_image(layers: usize, mib: usize) -> Result<Image> {
    use std::io::Read as _;
    let mut urandom = std::fs::File::open("/dev/urandom")?;
    let mut out = Vec::new();
    for i in 0..layers {
        let mut data = vec![0u8; mib << 20];
        urandom.read_exact(&mut data)?;
        out.push(
            LayerBuilder::new()
                .dir("data", 0o755)
                .file(&format!("data/random-{i}"), data, 0o644)
                .build(Compression::Gzip),
        );
    }
    Ok(Image::new(out))
}
