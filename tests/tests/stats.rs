//! The CRI stats RPCs against the kernel's own counters: every value the daemon reports is checked
//! against the cgroup files (found through `/proc/<pid>/cgroup` of the container's process) and
//! `/proc/<infra pid>/net/dev`, read by the test right before and right after the RPC.
//!
//! The daemon binary is `$CRISHIM_BIN` or `target/<profile>/crishim`
//! (`cargo build -p crishim -p crishim-shim`).

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::pods::{
    assert_no_leaks, labels, marker, namespaces, set_pod_namespaces, sh_container, PodEnv,
    PodTraces, NS_CONTAINER, NS_NODE, NS_POD,
};
use crishim_tests::random_hex;
use serde_json::json;
use tonic::Code;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Burns a core until killed.
const BUSY: &str = "while true; do :; done";

/// Pushes 30 MB through a pipe, writes 20 MiB into its writable layer, says so, then sleeps.
const FILL: &str = "head -c 30000000 /dev/zero | tail -c 1 > /dev/null; \
                    dd if=/dev/zero of=/fill bs=1M count=20 2>/dev/null; \
                    touch /done; exec sleep 3600";

const MEMORY_LIMIT: u64 = 256 << 20;

#[track_caller]
fn assert_code<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected {code:?}, got Ok({v:?})"),
        Err(e) => assert_eq!(e.code(), code, "{what}: unexpected status {e:?}"),
    }
}

/// `v` lies between two direct readings `a` and `b` (either order), within 5%.
#[track_caller]
fn assert_between(v: u64, a: u64, b: u64, what: &str) {
    let (lo, hi) = (a.min(b) as f64 * 0.95, a.max(b) as f64 * 1.05);
    assert!(
        (lo..=hi).contains(&(v as f64)),
        "{what}: reported {v}, read {a} before and {b} after"
    );
}

fn val(v: &Option<cri::UInt64Value>) -> u64 {
    v.as_ref().expect("a value").value
}

// ---------------------------------------------------------------------------------------------
// The kernel's counters, read independently of the daemon

fn v2() -> bool {
    Path::new(CGROUP_ROOT).join("cgroup.controllers").exists()
}

/// The directory of `pid`'s cgroup holding `controller` (v1), or its unified cgroup (v2).
fn cgroup_dir_of(pid: i32, controller: &str) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = text
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            let hit = if v2() {
                ctrls.is_empty()
            } else {
                ctrls.split(',').any(|c| c == controller)
            };
            hit.then(|| path.to_string())
        })
        .unwrap_or_else(|| panic!("no {controller} cgroup for {pid}: {text}"));
    cgroup_dir(&path, controller)
}

/// The directory of cgroup `path` (`/a/b`) for `controller`.
fn cgroup_dir(path: &str, controller: &str) -> PathBuf {
    let rel = path.trim_start_matches('/');
    if v2() {
        Path::new(CGROUP_ROOT).join(rel)
    } else {
        Path::new(CGROUP_ROOT).join(controller).join(rel)
    }
}

fn read_u64(p: &Path) -> u64 {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    s.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{}: {s:?}", p.display()))
}

fn stat_key(p: &Path, key: &str) -> u64 {
    let s = std::fs::read_to_string(p).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{} has no {key}", p.display()))
}

/// Cumulative CPU ns of a cgroup directory (from [`cgroup_dir`] with controller `cpuacct`).
fn cpu_ns(dir: &Path) -> u64 {
    if v2() {
        stat_key(&dir.join("cpu.stat"), "usage_usec") * 1000
    } else {
        read_u64(&dir.join("cpuacct.usage"))
    }
}

/// (usage, usage − inactive file) of a cgroup directory (controller `memory`).
fn memory(dir: &Path) -> (u64, u64) {
    let (usage, inactive) = if v2() {
        (
            read_u64(&dir.join("memory.current")),
            stat_key(&dir.join("memory.stat"), "inactive_file"),
        )
    } else {
        (
            read_u64(&dir.join("memory.usage_in_bytes")),
            stat_key(&dir.join("memory.stat"), "total_inactive_file"),
        )
    };
    (usage, usage.saturating_sub(inactive))
}

fn memory_limit(dir: &Path) -> u64 {
    read_u64(&dir.join(if v2() {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    }))
}

fn pids_current(pid: i32) -> u64 {
    read_u64(&cgroup_dir_of(pid, "pids").join("pids.current"))
}

/// (rx bytes, tx bytes) of `ifname` in `/proc/<pid>/net/dev`.
fn net_dev(pid: i32, ifname: &str) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap();
    text.lines().find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        if name.trim() != ifname {
            return None;
        }
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        Some((f[0], f[8]))
    })
}

// ---------------------------------------------------------------------------------------------
// RPCs

async fn container_stats(env: &PodEnv, id: &str) -> Result<cri::ContainerStats, tonic::Status> {
    let r = env
        .d
        .runtime_client()
        .container_stats(cri::ContainerStatsRequest {
            container_id: id.to_string(),
        })
        .await?;
    Ok(r.into_inner().stats.expect("stats"))
}

async fn list_container_stats(env: &PodEnv, filter: cri::ContainerStatsFilter) -> Vec<String> {
    let r = env
        .d
        .runtime_client()
        .list_container_stats(cri::ListContainerStatsRequest {
            filter: Some(filter),
        })
        .await
        .expect("ListContainerStats");
    let mut ids: Vec<String> = r
        .into_inner()
        .stats
        .into_iter()
        .map(|s| s.attributes.unwrap().id)
        .collect();
    ids.sort();
    ids
}

async fn pod_stats(env: &PodEnv, id: &str) -> Result<cri::PodSandboxStats, tonic::Status> {
    let r = env
        .d
        .runtime_client()
        .pod_sandbox_stats(cri::PodSandboxStatsRequest {
            pod_sandbox_id: id.to_string(),
        })
        .await?;
    Ok(r.into_inner().stats.expect("stats"))
}

async fn list_pod_stats(env: &PodEnv, filter: cri::PodSandboxStatsFilter) -> Vec<String> {
    let r = env
        .d
        .runtime_client()
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest {
            filter: Some(filter),
        })
        .await
        .expect("ListPodSandboxStats");
    let mut ids: Vec<String> = r
        .into_inner()
        .stats
        .into_iter()
        .map(|s| s.attributes.unwrap().id)
        .collect();
    ids.sort();
    ids
}

fn sorted(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn container_stats_agree_with_the_cgroup_files() {
    let env = PodEnv::start().await;
    let cfg = env.pod_config("stats");
    let pod = env.d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let busy_cfg = sh_container(&env, "busy", BUSY, &marker("busy"));
    let busy = env.d.run_container(&pod, &busy_cfg, &cfg).await.unwrap();
    let mut fill_cfg = sh_container(&env, "fill", FILL, &marker("fill"));
    fill_cfg
        .linux
        .get_or_insert_with(Default::default)
        .resources
        .get_or_insert_with(Default::default)
        .memory_limit_in_bytes = MEMORY_LIMIT as i64;
    let fill = env.d.run_container(&pod, &fill_cfg, &cfg).await.unwrap();
    traces.add_container(&busy);
    traces.add_container(&fill);
    traces.capture(&env.d).await;

    // Wait (on the host, without entering the container) for the fill to be written.
    let upper = env
        .d
        .root_dir()
        .join("images/containers")
        .join(&fill)
        .join("upper");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !upper.join("done").exists() {
        assert!(
            Instant::now() < deadline,
            "the fill container never finished"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // CPU: the cumulative time between two direct reads; the first sample has no rate yet.
    let busy_cpu = cgroup_dir_of(env.d.container_pid(&busy).await, "cpuacct");
    let before = cpu_ns(&busy_cpu);
    let s1 = container_stats(&env, &busy).await.unwrap();
    let after = cpu_ns(&busy_cpu);
    let attrs = s1.attributes.as_ref().unwrap();
    assert_eq!(attrs.id, busy);
    assert_eq!(attrs.metadata.as_ref().unwrap().name, "busy");
    assert_eq!(attrs.labels, busy_cfg.labels);
    let cpu1 = s1.cpu.expect("cpu of a running container");
    assert!(cpu1.timestamp > 0);
    let used1 = val(&cpu1.usage_core_nano_seconds);
    assert!(used1 > 100_000_000, "a busy loop used only {used1} ns");
    assert_between(used1, before, after, "usage_core_nano_seconds");
    assert_eq!(
        val(&cpu1.usage_nano_cores),
        0,
        "no rate on the first sample"
    );

    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = cpu_ns(&busy_cpu);
    let s2 = container_stats(&env, &busy).await.unwrap();
    let after = cpu_ns(&busy_cpu);
    let cpu2 = s2.cpu.unwrap();
    let used2 = val(&cpu2.usage_core_nano_seconds);
    assert_between(used2, before, after, "usage_core_nano_seconds");
    let rate = val(&cpu2.usage_nano_cores);
    let expected =
        (used2 - used1) as u128 * 1_000_000_000 / (cpu2.timestamp - cpu1.timestamp) as u128;
    assert!(rate > 0, "a busy loop at 0 nanocores");
    assert!(
        (rate as u128).abs_diff(expected) <= 1,
        "rate {rate}, from the samples {expected}"
    );
    let cores = std::thread::available_parallelism().unwrap().get() as u64;
    assert!(
        rate <= cores * 1_050_000_000,
        "{rate} nanocores on {cores} cores"
    );
    let layer = s2
        .writable_layer
        .expect("the busy container's writable layer");
    assert!(val(&layer.used_bytes) < 1 << 20, "{layer:?}");

    // Memory, and the writable layer holding the 20 MiB file.
    let fill_mem = cgroup_dir_of(env.d.container_pid(&fill).await, "memory");
    let (usage_a, ws_a) = memory(&fill_mem);
    let s = container_stats(&env, &fill).await.unwrap();
    let (usage_b, ws_b) = memory(&fill_mem);
    let m = s.memory.expect("memory of a running container");
    let ws = val(&m.working_set_bytes);
    assert_between(val(&m.usage_bytes), usage_a, usage_b, "usage_bytes");
    assert_between(ws, ws_a, ws_b, "working_set_bytes");
    assert!(ws <= val(&m.usage_bytes));
    assert!(m.rss_bytes.is_some() && val(&m.page_faults) > 0, "{m:?}");
    assert!(m.major_page_faults.is_some());
    assert_eq!(memory_limit(&fill_mem), MEMORY_LIMIT);
    assert_eq!(
        val(&m.available_bytes) + ws,
        MEMORY_LIMIT,
        "available = limit − working set"
    );
    assert!(
        s1.memory.unwrap().available_bytes.is_none(),
        "no limit, nothing reported available"
    );
    let layer = s.writable_layer.expect("writable layer");
    let file_bytes =
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(upper.join("fill")).unwrap())
            * 512;
    let used = val(&layer.used_bytes);
    assert!(used >= 20 << 20, "writable layer {used} bytes");
    assert!(
        used >= file_bytes && used < file_bytes + (1 << 20),
        "{used} vs {file_bytes}"
    );
    assert!(val(&layer.inodes_used) >= 3, "upper, /fill, /done");
    assert_eq!(
        layer.fs_id.unwrap().mountpoint,
        env.d.root_dir().join("images").to_string_lossy()
    );

    // ListContainerStats and its filters.
    let all = sorted(&[&busy, &fill]);
    let f = cri::ContainerStatsFilter::default;
    assert_eq!(list_container_stats(&env, f()).await, all);
    let by_id = cri::ContainerStatsFilter {
        id: busy.clone(),
        ..f()
    };
    assert_eq!(list_container_stats(&env, by_id).await, [busy.as_str()]);
    let by_prefix = cri::ContainerStatsFilter {
        id: fill[..12].to_string(),
        ..f()
    };
    assert_eq!(list_container_stats(&env, by_prefix).await, [fill.as_str()]);
    let by_pod = cri::ContainerStatsFilter {
        pod_sandbox_id: pod.clone(),
        ..f()
    };
    assert_eq!(list_container_stats(&env, by_pod).await, all);
    let other_pod = cri::ContainerStatsFilter {
        pod_sandbox_id: random_hex(32),
        ..f()
    };
    assert!(list_container_stats(&env, other_pod).await.is_empty());
    let by_label = cri::ContainerStatsFilter {
        label_selector: labels(&[("crishim-test-container", "fill")]),
        ..f()
    };
    assert_eq!(list_container_stats(&env, by_label).await, [fill.as_str()]);
    let no_label = cri::ContainerStatsFilter {
        label_selector: labels(&[("crishim-test-container", "none")]),
        ..f()
    };
    assert!(list_container_stats(&env, no_label).await.is_empty());

    // A stopped container is no longer listed; asked for by id it has no cgroup counters.
    env.d.stop_container(&busy, 0).await.unwrap();
    assert_eq!(list_container_stats(&env, f()).await, [fill.as_str()]);
    let stopped = container_stats(&env, &busy).await.unwrap();
    assert_eq!(stopped.attributes.unwrap().id, busy);
    assert!(stopped.cpu.is_none() && stopped.memory.is_none());
    assert!(stopped.writable_layer.is_some());

    assert_code(
        container_stats(&env, &random_hex(32)).await,
        Code::NotFound,
        "unknown container",
    );
    assert_code(
        container_stats(&env, "").await,
        Code::InvalidArgument,
        "empty id",
    );

    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}

/// A bridge network for this test only (10.97.X.0/24, not routed on this host yet).
struct Bridge {
    name: String,
    third: u8,
}

impl Bridge {
    fn install(env: &PodEnv) -> Bridge {
        let third = (0..64)
            .map(|_| u8::from_str_radix(&random_hex(1), 16).unwrap())
            .find(|t| {
                let out = std::process::Command::new("ip")
                    .args(["-4", "route", "show", &format!("10.97.{t}.0/24")])
                    .output()
                    .unwrap();
                out.stdout.is_empty()
            })
            .expect("a free /24 in 10.97.0.0/16");
        let b = Bridge {
            name: format!("crst{}", random_hex(3)),
            third,
        };
        let list = json!({
            "cniVersion": "1.0.0",
            "name": "crishim-stats-test",
            "plugins": [{
                "type": "bridge", "bridge": b.name, "isGateway": true, "ipMasq": false,
                "ipam": {"type": "host-local",
                         "ranges": [[{"subnet": format!("10.97.{third}.0/24")}]],
                         "dataDir": env.d.dir().join("ipam")}
            }]
        });
        let dir = env.d.dir().join("cni");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("10-stats.conflist"),
            serde_json::to_vec_pretty(&list).unwrap(),
        )
        .unwrap();
        b
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.name])
            .output();
    }
}

#[tokio::test]
async fn pod_sandbox_stats_cover_cpu_memory_processes_and_network() {
    let env = PodEnv::start().await;

    // Pod "sum": a cgroup parent made beforehand (as a kubelet does, not named after the pod),
    // so its usage is the sum of its containers'; no CNI yet, so only a loopback.
    let sum_cfg = env.pod_config("stats-sum");
    let sum_pod = env.d.run_pod(&sum_cfg).await.unwrap();
    let mut sum_traces = PodTraces::new(&sum_pod, &sum_cfg);
    let two = env
        .d
        .run_container(
            &sum_pod,
            &sh_container(&env, "two", "sleep 3600 & wait", &marker("two")),
            &sum_cfg,
        )
        .await
        .unwrap();
    let one = env
        .d
        .run_container(
            &sum_pod,
            &env.container_config("one", &["sleep", "3600"]),
            &sum_cfg,
        )
        .await
        .unwrap();
    sum_traces.add_container(&two);
    sum_traces.add_container(&one);

    // Pod "host": host network, no containers.
    let mut host_cfg = env.pod_config("stats-host");
    set_pod_namespaces(&mut host_cfg, namespaces(NS_NODE, NS_CONTAINER, NS_POD));
    let host_pod = env.d.run_pod(&host_cfg).await.unwrap();
    let mut host_traces = PodTraces::new(&host_pod, &host_cfg);

    // Pod "own": with a CNI network, and a cgroup parent the daemon creates for it, read whole.
    let bridge = Bridge::install(&env);
    let own_cfg = env.pod_config_with("stats-own", false);
    let own_pod = env.d.run_pod(&own_cfg).await.unwrap();
    let mut own_traces = PodTraces::new(&own_pod, &own_cfg);
    let busy = env
        .d
        .run_container(
            &own_pod,
            &sh_container(&env, "busy", BUSY, &marker("busy")),
            &own_cfg,
        )
        .await
        .unwrap();
    own_traces.add_container(&busy);
    for t in [&mut sum_traces, &mut host_traces, &mut own_traces] {
        t.capture(&env.d).await;
    }

    // Some traffic into the pod: a connection attempt to a closed port (SYN in, RST out).
    let ip: Ipv4Addr = env
        .d
        .pod_status(&own_pod)
        .await
        .unwrap()
        .network
        .unwrap()
        .ip
        .parse()
        .unwrap();
    assert_eq!(ip.octets()[..3], [10, 97, bridge.third]);
    let _ = tokio::task::spawn_blocking(move || {
        TcpStream::connect_timeout(&SocketAddr::from((ip, 9)), Duration::from_secs(2))
    })
    .await
    .unwrap();

    // The pod with its own cgroup: CPU and memory of the pod cgroup, network of its eth0.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let infra = env.d.infra_pid(&own_pod).await.unwrap();
    let parent = own_cfg.linux.as_ref().unwrap().cgroup_parent.clone();
    let (pod_cpu, pod_mem) = (
        cgroup_dir(&parent, "cpuacct"),
        cgroup_dir(&parent, "memory"),
    );
    let busy_pid = env.d.container_pid(&busy).await;
    let (cpu_a, (mem_a, _), net_a, pids_a) = (
        cpu_ns(&pod_cpu),
        memory(&pod_mem),
        net_dev(infra, "eth0").expect("the pod's eth0"),
        pids_current(busy_pid),
    );
    let s1 = pod_stats(&env, &own_pod).await.unwrap();
    let (cpu_b, (mem_b, _), net_b, pids_b) = (
        cpu_ns(&pod_cpu),
        memory(&pod_mem),
        net_dev(infra, "eth0").unwrap(),
        pids_current(busy_pid),
    );
    assert_eq!(s1.attributes.as_ref().unwrap().id, own_pod);
    assert_eq!(s1.attributes.as_ref().unwrap().labels, own_cfg.labels);
    let linux = s1.linux.clone().expect("linux stats");
    assert_eq!(linux.containers.len(), 1);
    assert_eq!(linux.containers[0].attributes.as_ref().unwrap().id, busy);
    let cpu1 = linux.cpu.expect("pod cpu");
    let used1 = val(&cpu1.usage_core_nano_seconds);
    assert_between(used1, cpu_a, cpu_b, "pod usage_core_nano_seconds");
    assert!(
        used1
            >= val(&linux.containers[0]
                .cpu
                .as_ref()
                .unwrap()
                .usage_core_nano_seconds),
        "the pod's cgroup holds its container's"
    );
    assert_eq!(
        val(&cpu1.usage_nano_cores),
        0,
        "no rate on the first sample"
    );
    let m = linux.memory.expect("pod memory");
    assert_between(val(&m.usage_bytes), mem_a, mem_b, "pod usage_bytes");
    let process = linux.process.expect("process stats");
    assert!(val(&process.process_count) >= 1);
    assert_between(val(&process.process_count), pids_a, pids_b, "process_count");
    let net = linux.network.expect("network of a CNI pod");
    let eth0 = net.default_interface.expect("eth0");
    assert_eq!(eth0.name, "eth0");
    let (rx, tx) = (val(&eth0.rx_bytes), val(&eth0.tx_bytes));
    assert!(rx > 0 && tx > 0, "{eth0:?}");
    assert!(
        (net_a.0..=net_b.0).contains(&rx),
        "rx {rx}, read {net_a:?} {net_b:?}"
    );
    assert!(
        (net_a.1..=net_b.1).contains(&tx),
        "tx {tx}, read {net_a:?} {net_b:?}"
    );
    assert!(eth0.rx_errors.is_some() && eth0.tx_errors.is_some());
    assert_eq!(
        net.interfaces
            .iter()
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>(),
        ["eth0"],
        "interfaces other than the loopback"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let s2 = pod_stats(&env, &own_pod).await.unwrap();
    let cpu2 = s2.linux.unwrap().cpu.unwrap();
    assert!(val(&cpu2.usage_core_nano_seconds) > used1);
    assert!(val(&cpu2.usage_nano_cores) > 0, "a busy pod at 0 nanocores");

    // The summed pod: exactly its containers' sums; process counts from their cgroups.
    let (two_pid, one_pid) = (
        env.d.container_pid(&two).await,
        env.d.container_pid(&one).await,
    );
    let s = pod_stats(&env, &sum_pod).await.unwrap();
    let linux = s.linux.expect("linux stats");
    let mut ids: Vec<String> = linux
        .containers
        .iter()
        .map(|c| c.attributes.as_ref().unwrap().id.clone())
        .collect();
    ids.sort();
    assert_eq!(ids, sorted(&[&two, &one]));
    let sum = |f: &dyn Fn(&cri::ContainerStats) -> u64| linux.containers.iter().map(f).sum::<u64>();
    let cpu = linux.cpu.as_ref().unwrap();
    assert_eq!(
        val(&cpu.usage_core_nano_seconds),
        sum(&|c| val(&c.cpu.as_ref().unwrap().usage_core_nano_seconds))
    );
    assert_eq!(
        val(&cpu.usage_nano_cores),
        sum(&|c| val(&c.cpu.as_ref().unwrap().usage_nano_cores)),
        "the pod's rate is its containers'"
    );
    let m = linux.memory.as_ref().unwrap();
    assert_eq!(
        val(&m.usage_bytes),
        sum(&|c| val(&c.memory.as_ref().unwrap().usage_bytes))
    );
    assert_eq!(
        val(&m.working_set_bytes),
        sum(&|c| val(&c.memory.as_ref().unwrap().working_set_bytes))
    );
    assert!(m.available_bytes.is_none(), "no limit for a sum");
    let count = val(&linux.process.as_ref().unwrap().process_count);
    assert_eq!(count, 3, "sh + sleep, and sleep");
    assert_eq!(count, pids_current(two_pid) + pids_current(one_pid));
    assert!(
        linux.network.is_none(),
        "loopback only: no default interface"
    );

    // Host network: no network stats of its own.
    let s = pod_stats(&env, &host_pod).await.unwrap();
    let linux = s.linux.unwrap();
    assert!(linux.network.is_none() && linux.containers.is_empty());

    // ListPodSandboxStats and its filters.
    let f = cri::PodSandboxStatsFilter::default;
    assert_eq!(
        list_pod_stats(&env, f()).await,
        sorted(&[&sum_pod, &host_pod, &own_pod])
    );
    let by_id = cri::PodSandboxStatsFilter {
        id: own_pod.clone(),
        ..f()
    };
    assert_eq!(list_pod_stats(&env, by_id).await, [own_pod.as_str()]);
    let by_prefix = cri::PodSandboxStatsFilter {
        id: sum_pod[..12].to_string(),
        ..f()
    };
    assert_eq!(list_pod_stats(&env, by_prefix).await, [sum_pod.as_str()]);
    let by_label = cri::PodSandboxStatsFilter {
        label_selector: labels(&[("crishim-test", "stats-host")]),
        ..f()
    };
    assert_eq!(list_pod_stats(&env, by_label).await, [host_pod.as_str()]);
    let no_label = cri::PodSandboxStatsFilter {
        label_selector: labels(&[("crishim-test", "none")]),
        ..f()
    };
    assert!(list_pod_stats(&env, no_label).await.is_empty());

    assert_code(
        pod_stats(&env, &random_hex(32)).await,
        Code::NotFound,
        "unknown pod",
    );
    assert_code(pod_stats(&env, "").await, Code::InvalidArgument, "empty id");
    // KEP-2371: cAdvisor's metric families, with cAdvisor's labels, for every ready pod.
    let mut rt = env.d.runtime_client();
    let descriptors = rt
        .list_metric_descriptors(cri::ListMetricDescriptorsRequest {})
        .await
        .unwrap()
        .into_inner()
        .descriptors;
    let keys_of = |name: &str| -> Vec<String> {
        descriptors
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("no descriptor {name}: {descriptors:#?}"))
            .label_keys
            .clone()
    };
    for name in [
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
        "container_network_receive_bytes_total",
    ] {
        let keys = keys_of(name);
        for k in ["container", "namespace", "pod"] {
            assert!(keys.iter().any(|x| x == k), "{name}: {keys:?}");
        }
    }
    let metrics = rt
        .list_pod_sandbox_metrics(cri::ListPodSandboxMetricsRequest {})
        .await
        .unwrap()
        .into_inner()
        .pod_metrics;
    let mut ids: Vec<&str> = metrics.iter().map(|m| m.pod_sandbox_id.as_str()).collect();
    ids.sort();
    let mut want = [sum_pod.as_str(), host_pod.as_str(), own_pod.as_str()];
    want.sort();
    assert_eq!(ids, want);
    let label = |m: &cri::Metric, key: &str| -> String {
        let i = keys_of(&m.name).iter().position(|k| k == key).unwrap();
        m.label_values[i].clone()
    };
    for pm in &metrics {
        let (cfg, expected_containers) = [
            (&sum_pod, &sum_cfg, 2),
            (&host_pod, &host_cfg, 0),
            (&own_pod, &own_cfg, 1),
        ]
        .into_iter()
        .find(|(id, _, _)| **id == pm.pod_sandbox_id)
        .map(|(_, cfg, n)| (cfg, n))
        .unwrap();
        let meta = cfg.metadata.as_ref().unwrap();
        assert_eq!(pm.container_metrics.len(), expected_containers, "{pm:#?}");
        for cm in &pm.container_metrics {
            let ws = cm
                .metrics
                .iter()
                .find(|m| m.name == "container_memory_working_set_bytes")
                .unwrap_or_else(|| panic!("{cm:#?}"));
            assert!(ws.value.as_ref().unwrap().value > 0, "{ws:#?}");
            for m in &cm.metrics {
                assert_eq!(m.label_values.len(), keys_of(&m.name).len(), "{m:#?}");
                assert_eq!(label(m, "id"), cm.container_id);
                assert_eq!(label(m, "namespace"), meta.namespace);
                assert_eq!(label(m, "pod"), meta.name);
                assert!(m.timestamp > 0);
            }
        }
        if pm.pod_sandbox_id == own_pod {
            let rx = pm
                .metrics
                .iter()
                .find(|m| {
                    m.name == "container_network_receive_bytes_total"
                        && label(m, "interface") == "eth0"
                })
                .unwrap_or_else(|| panic!("no eth0 receive counter: {pm:#?}"));
            assert!(rx.value.as_ref().unwrap().value > 0, "{rx:#?}");
            assert_eq!(label(rx, "container"), "POD");
        }
    }

    // A stopped pod: its attributes, no counters.
    env.d.stop_pod(&sum_pod).await.unwrap();
    let s = pod_stats(&env, &sum_pod).await.unwrap();
    assert_eq!(s.attributes.unwrap().id, sum_pod);
    let linux = s.linux.unwrap();
    assert!(linux.cpu.is_none() && linux.memory.is_none() && linux.containers.is_empty());

    for (pod, t) in [
        (&sum_pod, &sum_traces),
        (&host_pod, &host_traces),
        (&own_pod, &own_traces),
    ] {
        env.d.stop_pod(pod).await.unwrap();
        env.d.remove_pod(pod).await.unwrap();
        assert_no_leaks(&env.d, t).await;
    }
    drop(bridge);
    env.stop();
}
