//! The CRI request fuzzer: random and garbage values for the fields of every
//! RuntimeService and ImageService RPC, sent to a live daemon: empty, 1 MiB, negative and
//! extreme numbers, control characters and odd Unicode, unknown ids, wrong ids (a pod's where a
//! container's is expected), big maps. The bar for every call: a status within its deadline;
//! then no `panicked` in the daemon's log, and after removing everything it made, no process,
//! mount, network namespace or cgroup of any pod left.
//!
//! `CRISHIM_CRI_FUZZ_SEED` replays a run (the seed is printed); `CRISHIM_CRI_FUZZ_CALLS` sets
//! the number of calls (default 1500).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::pods::{find_leaks, PodEnv, PodTraces};
use tonic::{Code, Request, Status};

/// Each call's gRPC deadline; it must answer (with any status) within it, plus slack.
const DEADLINE: Duration = Duration::from_secs(10);
const SLACK: Duration = Duration::from_secs(2);
const MIB: usize = 1 << 20;

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Garbage, with the ids of what the run created so far to aim at.
struct Gen {
    rng: Rng,
    image: String,
    pods: Vec<String>,
    containers: Vec<String>,
    /// The pods created, with their configs, for the leak check.
    created: Vec<(String, cri::PodSandboxConfig)>,
}

impl Gen {
    fn string(&mut self) -> String {
        match self.rng.below(12) {
            0 => String::new(),
            1 => "a".repeat(MIB),
            2 => "\u{0}\u{1}\u{7f}\n\r\t\u{202e}\u{fffd}\u{10ffff}".into(),
            3 => "../../../../etc/passwd".into(),
            4 => "/".into(),
            5 => "é".repeat(300),
            6 => format!("sha256:{}", "f".repeat(64)),
            7 => "-1".into(),
            8 => "x".repeat(256),
            9 => "%s%n{}$(reboot)`id`".into(),
            _ => (0..self.rng.below(40))
                .map(|_| char::from(32 + self.rng.below(95) as u8))
                .collect(),
        }
    }

    /// An id where a pod's is expected: mostly a real pod's, else a container's, unknown, junk.
    fn pod_id(&mut self) -> String {
        match self.rng.below(6) {
            0..=2 if !self.pods.is_empty() => self.pods[self.rng.below(self.pods.len())].clone(),
            3 if !self.containers.is_empty() => {
                self.containers[self.rng.below(self.containers.len())].clone()
            }
            4 => "0".repeat(64),
            _ => self.string(),
        }
    }

    fn container_id(&mut self) -> String {
        match self.rng.below(6) {
            0..=2 if !self.containers.is_empty() => {
                self.containers[self.rng.below(self.containers.len())].clone()
            }
            3 if !self.pods.is_empty() => self.pods[self.rng.below(self.pods.len())].clone(),
            4 => self
                .containers
                .first()
                .map_or(String::new(), |c| c[..4].to_string()),
            _ => self.string(),
        }
    }

    fn int(&mut self) -> i64 {
        match self.rng.below(8) {
            0 => 0,
            1 => -1,
            2 => i64::MAX,
            3 => i64::MIN,
            4 => i64::from(i32::MAX) + 1,
            5 => 1,
            _ => self.rng.next() as i64,
        }
    }

    fn int32(&mut self) -> i32 {
        self.int() as i32
    }

    fn strings(&mut self) -> Vec<String> {
        match self.rng.below(4) {
            0 => Vec::new(),
            1 => vec!["sleep".into(), "1000".into()],
            2 => (0..2000).map(|i| format!("arg{i}")).collect(),
            _ => (0..self.rng.below(4)).map(|_| self.string()).collect(),
        }
    }

    fn map(&mut self) -> HashMap<String, String> {
        match self.rng.below(4) {
            0 => HashMap::new(),
            1 => (0..5000)
                .map(|i| (format!("k{i}"), format!("v{i}")))
                .collect(),
            _ => (0..self.rng.below(4))
                .map(|_| (self.string(), self.string()))
                .collect(),
        }
    }

    /// User namespace options: as the kubelet sends them, or hostile (host root, overflowing,
    /// overlapping, empty, too many ranges).
    fn userns(&mut self) -> cri::UserNamespace {
        let ranges = |f: &mut Self| -> Vec<cri::IdMapping> {
            let n = match f.rng.below(8) {
                0 => 400,
                n => n % 3,
            };
            (0..n)
                .map(|i| {
                    if f.rng.chance(2) {
                        cri::IdMapping {
                            container_id: 65536 * i as u32,
                            host_id: 65536 * (3 + f.rng.below(500) as u32),
                            length: 65536,
                        }
                    } else {
                        cri::IdMapping {
                            container_id: f.int32() as u32,
                            host_id: f.int32() as u32,
                            length: f.int32() as u32,
                        }
                    }
                })
                .collect()
        };
        cri::UserNamespace {
            mode: self.namespace(),
            uids: ranges(self),
            gids: ranges(self),
        }
    }

    fn namespace(&mut self) -> i32 {
        match self.rng.below(3) {
            0 => self.int32(),
            _ => self.rng.below(4) as i32,
        }
    }

    /// Half the time a valid config with one garbage field, so that requests get past the
    /// first check; otherwise garbage throughout.
    fn pod_config(&mut self) -> cri::PodSandboxConfig {
        let junk = self.junk_pod_config();
        if self.rng.chance(2) {
            return junk;
        }
        let n = self.rng.next() % 1_000_000;
        let mut sane = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("fuzz-{n}"),
                uid: format!("fuzz-uid-{n}-{}", self.rng.next()),
                namespace: "fuzz".into(),
                attempt: 0,
            }),
            ..Default::default()
        };
        match self.rng.below(7) {
            0 => sane.hostname = junk.hostname,
            1 => sane.dns_config = junk.dns_config,
            2 => sane.port_mappings = junk.port_mappings,
            3 => sane.labels = junk.labels,
            4 => sane.annotations = junk.annotations,
            5 => sane.log_directory = junk.log_directory,
            _ => sane.linux = junk.linux,
        }
        sane
    }

    fn junk_pod_config(&mut self) -> cri::PodSandboxConfig {
        let name = if self.rng.chance(3) {
            self.string()
        } else {
            format!("fuzz-{}", self.rng.next() % 100_000)
        };
        cri::PodSandboxConfig {
            metadata: (!self.rng.chance(8)).then(|| cri::PodSandboxMetadata {
                name,
                uid: self.string(),
                namespace: self.string(),
                attempt: self.int() as u32,
            }),
            hostname: self.string(),
            log_directory: if self.rng.chance(2) {
                String::new()
            } else {
                self.string()
            },
            dns_config: self.rng.chance(2).then(|| cri::DnsConfig {
                servers: self.strings(),
                searches: self.strings(),
                options: self.strings(),
            }),
            port_mappings: (0..self.rng.below(3))
                .map(|_| cri::PortMapping {
                    protocol: self.int32(),
                    container_port: self.int32(),
                    host_port: self.int32(),
                    host_ip: self.string(),
                })
                .collect(),
            labels: self.map(),
            annotations: self.map(),
            linux: self.rng.chance(2).then(|| cri::LinuxPodSandboxConfig {
                cgroup_parent: if self.rng.chance(2) {
                    String::new()
                } else {
                    self.string()
                },
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: self.namespace(),
                        pid: self.namespace(),
                        ipc: self.namespace(),
                        target_id: self.string(),
                        userns_options: self.rng.chance(3).then(|| self.userns()),
                    }),
                    run_as_user: self
                        .rng
                        .chance(3)
                        .then(|| cri::Int64Value { value: self.int() }),
                    ..Default::default()
                }),
                sysctls: self.map(),
                resources: self.rng.chance(3).then(|| self.resources()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn resources(&mut self) -> cri::LinuxContainerResources {
        cri::LinuxContainerResources {
            cpu_period: self.int(),
            cpu_quota: self.int(),
            cpu_shares: self.int(),
            memory_limit_in_bytes: self.int(),
            oom_score_adj: self.int(),
            cpuset_cpus: self.string(),
            cpuset_mems: self.string(),
            hugepage_limits: (0..self.rng.below(3))
                .map(|_| cri::HugepageLimit {
                    page_size: self.string(),
                    limit: self.int() as u64,
                })
                .collect(),
            unified: self.map(),
            memory_swap_limit_in_bytes: self.int(),
        }
    }

    /// Half the time `sleep 1000` in the run's image with one garbage field; else garbage.
    fn container_config(&mut self) -> cri::ContainerConfig {
        let junk = self.junk_container_config();
        if self.rng.chance(2) {
            return junk;
        }
        let mut sane = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: format!("c{}", self.rng.next() % 1_000_000),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: self.image.clone(),
                ..Default::default()
            }),
            command: vec!["sleep".into(), "1000".into()],
            ..Default::default()
        };
        match self.rng.below(9) {
            0 => sane.args = junk.args,
            1 => sane.envs = junk.envs,
            2 => sane.labels = junk.labels,
            3 => sane.annotations = junk.annotations,
            4 => sane.linux = junk.linux,
            5 => sane.working_dir = junk.working_dir,
            6 => sane.mounts = junk.mounts,
            7 => (sane.stdin, sane.tty) = (junk.stdin, junk.tty),
            _ => {}
        }
        sane
    }

    fn junk_container_config(&mut self) -> cri::ContainerConfig {
        let image = if self.rng.chance(3) {
            self.string()
        } else {
            self.image.clone()
        };
        cri::ContainerConfig {
            metadata: (!self.rng.chance(8)).then(|| cri::ContainerMetadata {
                name: if self.rng.chance(3) {
                    self.string()
                } else {
                    format!("c{}", self.rng.next() % 100_000)
                },
                attempt: self.int() as u32,
            }),
            image: Some(cri::ImageSpec {
                image,
                annotations: self.map(),
                ..Default::default()
            }),
            command: self.strings(),
            args: self.strings(),
            working_dir: self.string(),
            envs: (0..self.rng.below(3))
                .map(|_| cri::KeyValue {
                    key: self.string(),
                    value: self.string().into(),
                })
                .collect(),
            mounts: (0..self.rng.below(2))
                .map(|_| cri::Mount {
                    container_path: self.string(),
                    host_path: self.string(),
                    readonly: true,
                    mount_options: self.strings(),
                    ..Default::default()
                })
                .collect(),
            devices: (0..self.rng.below(2))
                .map(|_| cri::Device {
                    container_path: self.string(),
                    host_path: self.string(),
                    permissions: self.string(),
                })
                .collect(),
            labels: self.map(),
            annotations: self.map(),
            log_path: self.string(),
            stdin: self.rng.chance(2),
            stdin_once: self.rng.chance(2),
            tty: self.rng.chance(2),
            linux: self.rng.chance(2).then(|| cri::LinuxContainerConfig {
                resources: Some(self.resources()),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    run_as_user: self
                        .rng
                        .chance(2)
                        .then(|| cri::Int64Value { value: self.int() }),
                    run_as_username: self.string(),
                    supplemental_groups: vec![self.int(), self.int()],
                    ..Default::default()
                }),
            }),
            cdi_devices: (0..self.rng.below(2))
                .map(|_| cri::CdiDevice {
                    name: self.string(),
                })
                .collect(),
            ..Default::default()
        }
    }
}

fn req<T>(m: T) -> Request<T> {
    req_within(m, DEADLINE)
}

/// Calls that rightly wait as long as their request says (StopContainer of a container that
/// ignores SIGTERM, ExecSync of `sleep`) get a short deadline instead: the daemon must still
/// answer by then, and the run stays within its time.
const WAITING_DEADLINE: Duration = Duration::from_secs(2);

fn req_within<T>(m: T, deadline: Duration) -> Request<T> {
    let mut r = Request::new(m);
    r.set_timeout(deadline);
    r
}

/// One random RPC; its name and outcome (Ok, or the status).
async fn call(env: &PodEnv, g: &mut Gen) -> (&'static str, Result<(), Status>) {
    let mut rt = env.d.runtime_client();
    let mut img = env.d.image_client();
    macro_rules! rpc {
        ($client:ident . $method:ident ($msg:expr)) => {
            (
                stringify!($method),
                $client.$method(req($msg)).await.map(|_| ()),
            )
        };
        (waits $client:ident . $method:ident ($msg:expr)) => {
            (
                stringify!($method),
                $client
                    .$method(req_within($msg, WAITING_DEADLINE))
                    .await
                    .map(|_| ()),
            )
        };
    }
    match g.rng.below(34) {
        0 => rpc!(rt.version(cri::VersionRequest {
            version: g.string()
        })),
        1..=3 => {
            let config = g.pod_config();
            let r = rt
                .run_pod_sandbox(req(cri::RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: if g.rng.chance(4) {
                        g.string()
                    } else {
                        String::new()
                    },
                }))
                .await;
            let r = r.map(|ok| {
                let id = ok.into_inner().pod_sandbox_id;
                g.pods.push(id.clone());
                g.created.push((id, config));
            });
            ("run_pod_sandbox", r)
        }
        4 => rpc!(rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: g.pod_id()
        })),
        5 => rpc!(rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: g.pod_id()
        })),
        6 => rpc!(rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: g.pod_id(),
            verbose: g.rng.chance(2),
        })),
        7 => rpc!(rt.list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: g.rng.chance(2).then(|| cri::PodSandboxFilter {
                id: g.pod_id(),
                state: g
                    .rng
                    .chance(2)
                    .then(|| cri::PodSandboxStateValue { state: g.int32() }),
                label_selector: g.map(),
            }),
        })),
        8..=10 => {
            let pod = g.pod_id();
            let r = rt
                .create_container(req(cri::CreateContainerRequest {
                    pod_sandbox_id: pod,
                    config: Some(g.container_config()),
                    sandbox_config: g.rng.chance(2).then(|| g.pod_config()),
                }))
                .await;
            let r = r.map(|ok| g.containers.push(ok.into_inner().container_id));
            ("create_container", r)
        }
        11 | 12 => rpc!(rt.start_container(cri::StartContainerRequest {
            container_id: g.container_id()
        })),
        13 => rpc!(waits rt.stop_container(cri::StopContainerRequest {
            container_id: g.container_id(),
            timeout: g.int(),
        })),
        14 => rpc!(rt.remove_container(cri::RemoveContainerRequest {
            container_id: g.container_id()
        })),
        15 => rpc!(rt.list_containers(cri::ListContainersRequest {
            filter: g.rng.chance(2).then(|| cri::ContainerFilter {
                id: g.container_id(),
                state: g
                    .rng
                    .chance(2)
                    .then(|| cri::ContainerStateValue { state: g.int32() }),
                pod_sandbox_id: g.pod_id(),
                label_selector: g.map(),
            }),
        })),
        16 => rpc!(rt.container_status(cri::ContainerStatusRequest {
            container_id: g.container_id(),
            verbose: g.rng.chance(2),
        })),
        17 => rpc!(
            rt.update_container_resources(cri::UpdateContainerResourcesRequest {
                container_id: g.container_id(),
                linux: g
                    .rng
                    .chance(4)
                    .then(|| g.resources())
                    .or(Some(Default::default())),
                annotations: g.map(),
                ..Default::default()
            })
        ),
        18 => rpc!(rt.reopen_container_log(cri::ReopenContainerLogRequest {
            container_id: g.container_id()
        })),
        19 | 20 => rpc!(waits rt.exec_sync(cri::ExecSyncRequest {
            container_id: g.container_id(),
            cmd: g.strings(),
            timeout: g.int(),
        })),
        21 => rpc!(rt.exec(cri::ExecRequest {
            container_id: g.container_id(),
            cmd: g.strings(),
            tty: g.rng.chance(2),
            stdin: g.rng.chance(2),
            stdout: g.rng.chance(2),
            stderr: g.rng.chance(2),
        })),
        22 => rpc!(rt.attach(cri::AttachRequest {
            container_id: g.container_id(),
            stdin: g.rng.chance(2),
            tty: g.rng.chance(2),
            stdout: g.rng.chance(2),
            stderr: g.rng.chance(2),
        })),
        23 => rpc!(rt.port_forward(cri::PortForwardRequest {
            pod_sandbox_id: g.pod_id(),
            port: vec![g.int32(), 80, -1, 65536],
        })),
        24 => rpc!(rt.container_stats(cri::ContainerStatsRequest {
            container_id: g.container_id()
        })),
        25 => rpc!(rt.list_container_stats(cri::ListContainerStatsRequest {
            filter: g.rng.chance(2).then(|| cri::ContainerStatsFilter {
                id: g.container_id(),
                pod_sandbox_id: g.pod_id(),
                label_selector: g.map(),
            }),
        })),
        26 => rpc!(rt.pod_sandbox_stats(cri::PodSandboxStatsRequest {
            pod_sandbox_id: g.pod_id()
        })),
        27 => rpc!(rt.list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest {
            filter: g.rng.chance(2).then(|| cri::PodSandboxStatsFilter {
                id: g.pod_id(),
                label_selector: g.map(),
            }),
        })),
        28 => rpc!(rt.update_runtime_config(cri::UpdateRuntimeConfigRequest {
            runtime_config: Some(cri::RuntimeConfig {
                network_config: Some(cri::NetworkConfig {
                    pod_cidr: g.string()
                }),
            }),
        })),
        29 => match g.rng.below(7) {
            0 => rpc!(rt.status(cri::StatusRequest {
                verbose: g.rng.chance(2)
            })),
            1 => rpc!(rt.runtime_config(cri::RuntimeConfigRequest {})),
            2 => rpc!(rt.checkpoint_container(cri::CheckpointContainerRequest {
                container_id: g.container_id(),
                location: g.string(),
                timeout: g.int(),
            })),
            3 => rpc!(rt.list_metric_descriptors(cri::ListMetricDescriptorsRequest {})),
            4 => rpc!(rt.checkpoint_pod(cri::CheckpointPodRequest {
                pod_sandbox_id: g.pod_id(),
                output_path: g.string(),
                container_ids: vec![g.container_id()],
                options: g.map(),
            })),
            5 => rpc!(rt.restore_pod(cri::RestorePodRequest {
                checkpoint_path: g.string(),
                config: Some(g.pod_config()),
                runtime_handler: g.string(),
                options: g.map(),
                container_configs: vec![g.container_config()],
            })),
            _ => rpc!(rt.list_pod_sandbox_metrics(cri::ListPodSandboxMetricsRequest {})),
        },
        30 => rpc!(rt.get_container_events(cri::GetEventsRequest {})),
        31 => rpc!(img.pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                // Garbage, or names on a closed local port: nothing reaches the internet.
                image: if g.rng.chance(2) {
                    g.string()
                } else {
                    format!("127.0.0.1:1/{}", g.string())
                },
                annotations: g.map(),
                ..Default::default()
            }),
            auth: g.rng.chance(2).then(|| cri::AuthConfig {
                username: g.string(),
                password: g.string(),
                auth: g.string(),
                identity_token: g.string(),
                ..Default::default()
            }),
            sandbox_config: g.rng.chance(4).then(|| g.pod_config()),
        })),
        32 => match g.rng.below(3) {
            0 => rpc!(img.image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: g.string(),
                    ..Default::default()
                }),
                verbose: g.rng.chance(2),
            })),
            1 => rpc!(img.list_images(cri::ListImagesRequest {
                filter: Some(cri::ImageFilter {
                    image: Some(cri::ImageSpec {
                        image: g.string(),
                        ..Default::default()
                    }),
                }),
            })),
            _ => rpc!(img.image_fs_info(cri::ImageFsInfoRequest {})),
        },
        _ => {
            // Never the image the run's containers use (as a garbage string it may be).
            let image = g.string();
            rpc!(img.remove_image(cri::RemoveImageRequest {
                image: Some(cri::ImageSpec {
                    image,
                    ..Default::default()
                }),
            }))
        }
    }
}

async fn stop_running_container_with_max_timeout(env: &PodEnv, g: &mut Gen) -> Result<(), String> {
    let pod_cfg = env.pod_config("fuzz-stop");
    let pod = env
        .d
        .run_pod(&pod_cfg)
        .await
        .map_err(|e| format!("{e:?}"))?;
    g.pods.push(pod.clone());
    g.created.push((pod.clone(), pod_cfg.clone()));
    let cfg = env.container_config("stop", &["sleep", "1000"]);
    let ctr = env
        .d
        .run_container(&pod, &cfg, &pod_cfg)
        .await
        .map_err(|e| format!("{e:?}"))?;
    g.containers.push(ctr.clone());
    let mut rt = env.d.runtime_client();
    let stop = rt.stop_container(req_within(
        cri::StopContainerRequest {
            container_id: ctr,
            timeout: i64::MAX,
        },
        WAITING_DEADLINE,
    ));
    match tokio::time::timeout(DEADLINE + SLACK, stop).await {
        Err(_) => Err("StopContainer with timeout i64::MAX: no answer within its deadline".into()),
        Ok(Err(s)) if is_transport_failure(&s) => {
            Err(format!("StopContainer with timeout i64::MAX: {s:?}"))
        }
        Ok(_) => Ok(()),
    }
}

/// A daemon's transport gave up rather than the daemon answering.
fn is_transport_failure(s: &Status) -> bool {
    matches!(s.code(), Code::Unavailable | Code::Unknown)
        && (s.message().contains("transport") || s.message().contains("h2 protocol"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_every_field_of_every_rpc_gets_a_status_and_leaves_nothing_behind() {
    let seed: u64 = std::env::var("CRISHIM_CRI_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    fuzz(seed).await;
}

/// A seed that hung a pod's shim: its Shutdown waited for the killed infra process alone, which
/// as its pid namespace's init could not finish exiting while a container's zombie in that
/// namespace, the shim's child, was not reaped. The pod's StopPodSandbox took 60 s, and the infra
/// process and the zombie outlived the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_that_once_hung_a_shim_leaves_nothing_behind() {
    fuzz(1795715926126912737).await;
}

async fn fuzz(seed: u64) {
    let calls: usize = std::env::var("CRISHIM_CRI_FUZZ_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500);
    eprintln!("CRI fuzzer: seed {seed} (CRISHIM_CRI_FUZZ_SEED={seed} replays it), {calls} calls");

    let env = PodEnv::start().await;
    let mut g = Gen {
        rng: Rng(seed),
        image: env.image(),
        pods: Vec::new(),
        containers: Vec::new(),
        created: Vec::new(),
    };
    let started = Instant::now();
    let mut failures = Vec::new();
    // Always one known extreme: StopContainer of a running container with i64::MAX seconds
    // (the deadline arithmetic overflowed and the handler panicked).
    if let Err(e) = stop_running_container_with_max_timeout(&env, &mut g).await {
        failures.push(e);
    }
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    // What Internal and Unknown answers said: a bad request should get a precise code.
    let mut internal: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..calls {
        let t = Instant::now();
        let answered = tokio::time::timeout(DEADLINE + SLACK, call(&env, &mut g)).await;
        match answered {
            Err(_) => failures.push(format!("call {i}: no answer within {:?}", DEADLINE + SLACK)),
            Ok((name, r)) => {
                let code = r.as_ref().err().map_or(Code::Ok, Status::code);
                *outcomes.entry(format!("{name} {code:?}")).or_default() += 1;
                if let Err(s) = &r {
                    if matches!(s.code(), Code::Internal | Code::Unknown) {
                        let msg: String = s.message().chars().take(160).collect();
                        *internal.entry(format!("{name}: {msg}")).or_default() += 1;
                    }
                    if is_transport_failure(s) || t.elapsed() > DEADLINE + SLACK {
                        failures.push(format!("call {i} {name}: {s:?} after {:?}", t.elapsed()));
                    }
                }
            }
        }
    }
    let took = started.elapsed();
    eprintln!("CRI fuzzer: {calls} calls in {took:?}; outcomes:");
    for (k, n) in &outcomes {
        eprintln!("  {n:5} {k}");
    }
    eprintln!("CRI fuzzer: Internal and Unknown answers:");
    for (k, n) in &internal {
        eprintln!("  {n:5} {k}");
    }

    // Everything the run made, then its removal.
    let mut traces = Vec::new();
    for (id, config) in &g.created {
        let mut t = PodTraces::new(id, config);
        // Garbage uids and parents ("/", "a") would match everything on the host: what is left
        // of the pod is then found by its id (the default parent and cgroups carry it).
        if !t.pod_uid.starts_with("fuzz-uid-") {
            t.pod_uid.clear();
        }
        if t.cgroup_parent
            .trim_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or("")
            .len()
            < 12
        {
            t.cgroup_parent.clear();
        }
        t.capture(&env.d).await;
        traces.push(t);
    }
    for c in env
        .d
        .list_container_ids(None)
        .await
        .expect("ListContainers")
    {
        let _ = env.d.stop_container(&c, 0).await;
        if let Err(e) = env.d.remove_container(&c).await {
            failures.push(format!("RemoveContainer {c}: {e:?}"));
        }
    }
    for t in &traces {
        let _ = env.d.stop_pod(&t.pod_id).await;
        if let Err(e) = env.d.remove_pod(&t.pod_id).await {
            failures.push(format!("RemovePodSandbox {}: {e:?}", t.pod_id));
        }
    }
    for t in &traces {
        failures.extend(find_leaks(&env.d, t).await);
    }
    let log = env.d.log_text();
    for line in log.lines().filter(|l| l.contains("panicked")) {
        failures.push(format!("daemon log: {line}"));
    }
    eprintln!(
        "CRI fuzzer: {} pods and {} containers created, {} failures",
        g.pods.len(),
        g.containers.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "seed {seed}:\n{}", failures.join("\n"));
}
