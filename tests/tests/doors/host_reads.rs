//! Host-side reads of image- and container-controlled files, from the image's author and from a
//! container's root: the daemon reads the image's glibc before it injects the GPU interceptor,
//! and reads each GPU container's accounting file (a host directory the container writes) for
//! `/metrics`. Every such read goes through one bounded reader (`crishim_sys::confined`): a
//! regular file, resolved inside its root, capped before and while it is read. (The fake driver
//! of `crishim_tests::gpu` stands in for a GPU: no GPU is needed.)

use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::daemon::{metrics_address, metrics_toml, sample};
use crishim_tests::gpu::FakeNode;
use crishim_tests::pods::{
    assert_no_leaks, container_config, marker, sh, PodEnv, PodTraces, LOOP_UNTIL_TERM,
};
use crishim_tests::{busybox_layer, Compression, Image, LayerBuilder};
use tonic::Code;

use super::sh_in;

#[cfg(target_arch = "aarch64")]
const LIB_DIR: &str = "lib/aarch64-linux-gnu";
#[cfg(not(target_arch = "aarch64"))]
const LIB_DIR: &str = "lib/x86_64-linux-gnu";

const SHARED: &str = "/etc/crishim/vgpu/shared";
const USAGE: &str = "/etc/crishim/vgpu/shared/usage";

/// A long-running busybox container asking for GPU 0 with a 256 MiB limit, so it gets the
/// interceptor, its config and the accounting directory.
fn limited(image: &str, name: &str) -> cri::ContainerConfig {
    let mut c = container_config(name, image, &[]);
    c.command = sh(LOOP_UNTIL_TERM, &marker(name));
    c.envs.push(cri::KeyValue {
        key: "NVIDIA_VISIBLE_DEVICES".into(),
        value: "0".into(),
    });
    c.annotations
        .insert("gpu.crishim.io/memory".into(), "256Mi".into());
    c
}

/// The daemon's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

/// `GET /metrics`, whatever it answers, within 10 s: (status line, body).
async fn scrape_any(addr: String) -> Option<(String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::time::timeout(Duration::from_secs(10), async move {
        let mut sock = tokio::net::TcpStream::connect(&addr).await.ok()?;
        sock.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .ok()?;
        let mut reply = String::new();
        sock.read_to_string(&mut reply).await.ok()?;
        let (head, body) = reply.split_once("\r\n\r\n")?;
        Some((head.lines().next()?.to_string(), body.to_string()))
    })
    .await
    .ok()
    .flatten()
}

/// The image's `libc.so.6` and `libgcc_s.so.1` are `/dev/zero` (1:5). The daemon reads them to
/// check that the interceptor can load; read whole, they never end. The create must answer at
/// once, refusing the image by name, and the daemon's peak RSS must not grow for it. (On the
/// old code the read ran until the daemon's RSS had grown by gigabytes; CreateContainer never
/// answered, so the 20 s deadline below fails it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_whose_glibc_is_dev_zero_is_refused_at_once_and_costs_no_memory() {
    let node = FakeNode::new();
    let env = PodEnv::start_with(node.daemon_options("preload")).await;
    let layer = LayerBuilder::new()
        .dir("lib", 0o755)
        .dir(LIB_DIR, 0o755)
        .char_device(&format!("{LIB_DIR}/libc.so.6"), 1, 5, 0o755)
        .char_device(&format!("{LIB_DIR}/libgcc_s.so.1"), 1, 5, 0o755)
        .build(Compression::Gzip);
    let image = Image::new(vec![busybox_layer(), layer]);
    let image = env.push_and_pull("zero-libc", &image).await.tag_ref();
    let cfg = env.pod_config("zero-libc");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let traces = PodTraces::new(&pod, &cfg);
    let pid = env.d.pid().expect("the daemon's pid");
    let before = peak_rss_kib(pid);

    let started = Instant::now();
    let created = tokio::time::timeout(
        Duration::from_secs(20),
        env.d
            .create_container(&pod, &limited(&image, "zero-libc"), &cfg),
    )
    .await
    .expect("CreateContainer must answer, not read /dev/zero for ever");
    let took = started.elapsed();
    let after = peak_rss_kib(pid);
    eprintln!(
        "CreateContainer answered in {took:?}; daemon VmHWM {before} KiB before, {after} KiB after (+{} KiB)",
        after.saturating_sub(before)
    );
    let e = created.expect_err("an image whose glibc is a device must not get GPU limits");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("libc.so.6") && e.message().contains("character device"),
        "the error names the file and what it is: {}",
        e.message()
    );
    assert!(took < Duration::from_secs(10), "answered in {took:?}");
    assert!(
        after.saturating_sub(before) <= 64 << 10,
        "the daemon's peak RSS rose from {before} KiB to {after} KiB"
    );
    let listed = env.d.list_container_ids(None).await.unwrap();
    assert!(listed.is_empty(), "the refused create left {listed:?}");

    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}

/// Ledger records claiming `mib` MiB held by the calling process (as its own pid namespace and
/// `stat` name it, which is how the daemon tells live processes).
fn ledger_of_this_process(mib: u64) -> Vec<u8> {
    use crishim_proto::vgpu::ledger::Entry;
    let start = crishim_proto::shim::pid_file::start_time(std::process::id() as i32).unwrap();
    Entry {
        pid: std::process::id(),
        start,
        uuid: [7; 16],
        used: mib << 20,
        host_pid: 0,
        window: 0,
        throttled_us: 0,
    }
    .encode()
    .to_vec()
}

/// A container's root replaces its accounting file (on the host, read by `/metrics`) with a
/// FIFO, a symlink to a host file, and a file as large as it can make. Each time `/metrics` is
/// scraped 30 times at once, and `Version` and `ListContainers` must answer within 1 s
/// throughout. (On the old code, each scrape blocked a CRI worker in `open()` of the FIFO, as
/// host root; after 18 the CRI server answered nothing. The symlink was followed to the host's
/// file, whose records then showed in the gauges.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_cannot_stall_the_cri_server_or_point_metrics_at_host_files() {
    let node = FakeNode::new();
    let addr = metrics_address();
    let env = PodEnv::start_with(
        node.daemon_options("preload")
            .extra_toml(&metrics_toml(&addr)),
    )
    .await;
    let image = env.busybox.tag_ref();
    let cfg = env.pod_config("ledger");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let id = env
        .d
        .run_container(&pod, &limited(&image, "ledger"), &cfg)
        .await
        .unwrap();
    traces.add_container(&id);
    let used = format!("crishim_gpu_memory_used_bytes{{container=\"{id}\"}}");

    // A host file of records the daemon would count (this test process is alive), reached
    // through a symlink the container makes: its path on the host is the container's to name.
    let host = tempfile::tempdir().unwrap();
    let host_ledger = host.path().join("ledger");
    std::fs::write(&host_ledger, ledger_of_this_process(999)).unwrap();

    let cases = [
        ("a FIFO", format!("rm -f {USAGE} && mkfifo -m 666 {USAGE}")),
        (
            "a symlink to a host file",
            format!("rm -f {USAGE} && ln -s {} {USAGE}", host_ledger.display()),
        ),
        (
            "a huge file",
            format!("rm -f {USAGE}; dd if=/dev/zero of={USAGE} bs=1M count=512 2>/dev/null; ls -l {USAGE}"),
        ),
    ];
    for (what, script) in cases {
        let (code, out) = sh_in(&env, &id, &script).await;
        eprintln!("{what}: exit {code}: {out}");
        let scrapes: Vec<_> = (0..30)
            .map(|_| tokio::spawn(scrape_any(addr.clone())))
            .collect();
        // The CRI server answers throughout, while the scrapes run.
        let mut slowest = Duration::ZERO;
        let until = Instant::now() + Duration::from_secs(4);
        while Instant::now() < until {
            let t = Instant::now();
            tokio::time::timeout(Duration::from_secs(1), env.d.version())
                .await
                .unwrap_or_else(|_| panic!("{what}: Version did not answer within 1 s"))
                .unwrap();
            tokio::time::timeout(Duration::from_secs(1), env.d.list_containers(None))
                .await
                .unwrap_or_else(|_| panic!("{what}: ListContainers did not answer within 1 s"))
                .unwrap();
            slowest = slowest.max(t.elapsed());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut answered = 0;
        for s in scrapes {
            if let Some((status, body)) = s.await.unwrap() {
                answered += 1;
                if status.contains("200") {
                    assert_eq!(
                        sample(&body, &used),
                        0.0,
                        "{what}: a file the container pointed at counted: {used}"
                    );
                }
            }
        }
        eprintln!("{what}: Version and ListContainers at most {slowest:?}; {answered}/30 scrapes answered");
        assert_eq!(answered, 30, "{what}: every scrape is answered");
    }

    traces.capture(&env.d).await;
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}

/// A container's root tries to fill its accounting directory, which lives on the host (the
/// state directory, the node's `/run`): the directory is a tmpfs of its own, and the container
/// stops at its 1 MiB and 16 inodes. (On the old code it was a plain host directory: the
/// 64 MiB below landed on the node's `/run`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_cannot_fill_the_host_through_its_accounting_directory() {
    let node = FakeNode::new();
    let env = PodEnv::start_with(node.daemon_options("preload")).await;
    let image = env.busybox.tag_ref();
    let cfg = env.pod_config("fill");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let id = env
        .d
        .run_container(&pod, &limited(&image, "fill"), &cfg)
        .await
        .unwrap();
    traces.add_container(&id);

    let (code, out) = sh_in(
        &env,
        &id,
        &format!(
            "dd if=/dev/zero of={SHARED}/fill bs=1M count=64; echo dd=$?; \
             wc -c < {SHARED}/fill; rm -f {SHARED}/fill; \
             n=0; while [ $n -lt 100 ] && touch {SHARED}/f$n 2>/dev/null; do n=$((n+1)); done; echo files=$n"
        ),
    )
    .await;
    eprintln!("exit {code}: {out}");
    assert!(
        out.contains("No space left on device"),
        "the write is stopped: {out}"
    );
    let written: u64 = out
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no size in {out}"));
    assert!(written <= 1 << 20, "{written} bytes written: {out}");
    let files: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("files="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {out}"));
    assert!(files < 16, "{files} files made: {out}");
    // The interceptor's file is still there, and still the container's to write.
    let (code, out) = sh_in(&env, &id, &format!("echo x > {USAGE} && echo ok")).await;
    assert_eq!((code, out.trim()), (0, "ok"));

    traces.capture(&env.d).await;
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    let gpu_dirs = env.d.state_dir().join("gpu/containers");
    let left = crishim_tests::fsutil::dir_entries(&gpu_dirs);
    assert!(left.is_empty(), "GPU directories left: {left:?}");
    env.stop();
}
