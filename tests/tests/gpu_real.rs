//! On a machine with a real NVIDIA GPU and driver only: `hack/gpu-check.sh` runs this with
//! `--ignored --nocapture`. A real daemon serves the node's GPUs (`/dev`, `/proc`, the driver
//! under `/`) and runs `cudatest` (`tests/gpu/cudatest.c`, which uses the driver API the way
//! the CUDA runtime does) in busybox containers with limits. Every step prints what it saw;
//! the assertions are the ones that hold on any GPU (a context's size, say, varies). The core
//! limit's shares are taken against the unlimited rate on the same GPU, so they do not depend on
//! its speed.

use crishim_proto::cri;
use crishim_tests::gpu::gpu_image_once;
use crishim_tests::pods::{container_config, marker, sh, PodEnv, PodTraces, LOOP_UNTIL_TERM};
use crishim_tests::DaemonOptions;

const LIMIT_MIB: u64 = 2048;

async fn step(env: &PodEnv, id: &str, what: &str, script: &str) -> String {
    let r = env
        .d
        .exec_sync(id, &["/bin/sh", "-c", script], 120)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let out = String::from_utf8_lossy(&r.stdout).into_owned();
    println!(
        "== {what}\n$ {script}\n{out}{}(exit {})\n",
        String::from_utf8_lossy(&r.stderr),
        r.exit_code
    );
    out
}

fn gpu_container(image: &str, name: &str, annotations: &[(&str, &str)]) -> cri::ContainerConfig {
    let mut c = container_config(name, image, &[]);
    c.command = sh(LOOP_UNTIL_TERM, &marker(name));
    c.envs.push(cri::KeyValue {
        key: "NVIDIA_VISIBLE_DEVICES".into(),
        value: "0".into(),
    });
    for (k, v) in annotations {
        c.annotations.insert(k.to_string(), v.to_string());
    }
    c
}

#[tokio::test]
#[ignore = "needs a real NVIDIA GPU and driver: run hack/gpu-check.sh"]
async fn a_real_gpu_under_memory_and_core_limits() {
    // `preload` (the default) or `replace`: hack/gpu-check.sh runs both.
    let inject = std::env::var("CRISHIM_GPU_CHECK_INJECT").unwrap_or_else(|_| "preload".into());
    println!("== inject = {inject:?}");
    let vdriver = tempfile::tempdir().unwrap();
    let env = PodEnv::start_with(DaemonOptions::new().extra_toml(&format!(
        "[gpu]\ninject = {inject:?}\nvdriver_dir = {:?}\n",
        vdriver.path().to_string_lossy()
    )))
    .await;
    let image = env.push_and_pull("gpu", &gpu_image_once()).await.tag_ref();
    let cfg = env.pod_config("gpu-check");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let limit = format!("{LIMIT_MIB}Mi");
    let c = gpu_container(
        &image,
        "limited",
        &[
            ("gpu.crishim.io/memory", &limit),
            ("gpu.crishim.io/cores", "30"),
        ],
    );
    let id = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&id);

    step(
        &env,
        &id,
        "nvidia-smi in a container with a 2 GiB limit",
        "nvidia-smi",
    )
    .await;
    let info = step(&env, &id, "what the driver API reports", "cudatest info").await;
    assert!(
        info.contains(&format!(" {}\n", LIMIT_MIB << 20)),
        "the limit is the total: {info}"
    );
    let over = LIMIT_MIB + 1;
    let out = step(
        &env,
        &id,
        "past the limit through cuMemAlloc_v2, then 256 MiB through cuGetProcAddress",
        &format!("cudatest alloc {over} 256"),
    )
    .await;
    assert!(out.contains(&format!("alloc {over} direct 2")), "{out}");
    assert!(out.contains("alloc 256 procaddr 0"), "{out}");
    for (what, cmd) in [
        (
            "a pool: past the limit, then 256 MiB",
            format!("cudatest pool {over} 256"),
        ),
        (
            "arrays: past the limit, then 256 MiB",
            format!("cudatest arrays {over} 256"),
        ),
        (
            "a pool that keeps its memory, and cuMemAllocAsync",
            "cudatest poolkeep 1024".into(),
        ),
        (
            "NVML's process list: this container's only",
            "cudatest procs".into(),
        ),
    ] {
        step(&env, &id, what, &cmd).await;
    }
    let out = step(
        &env,
        &id,
        "two processes share the limit; the one killed gives its share back",
        "rm -f /tmp/hold; cudatest hold 1024 60 > /tmp/hold & H=$!; \
         while ! grep -qs hold /tmp/hold; do sleep 0.1; done; cat /tmp/hold; \
         cudatest alloc 1024; kill -9 $H; wait $H; cudatest alloc 1024",
    )
    .await;
    assert!(out.contains("hold 0"), "{out}");
    assert!(out.ends_with("alloc 1024 direct 0\n"), "{out}");

    // The core limit: alone, then beside a neighbour with no limit that keeps the GPU busy,
    // in 1-second windows over 30 s. Rates are blocks a second of a kernel that spins; a
    // window's share is its rate against the unlimited rate alone.
    let spin = "CUDATEST_PTX=200000";
    let burn = |out: &str| -> f64 {
        out.lines()
            .find_map(|l| l.strip_prefix("burn "))
            .and_then(|r| r.strip_suffix(" blocks/s"))
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("{out}"))
    };
    let windows = |out: &str| -> Vec<f64> {
        out.lines()
            .filter_map(|l| l.strip_prefix("window "))
            .filter_map(|w| w.split_whitespace().nth(1)?.parse().ok())
            .collect()
    };
    // Alone, through each way a launch can reach the GPU.
    let mut alone = Vec::new();
    for (how, via) in [
        ("plain launches", ""),
        ("cooperative launches", "CUDATEST_COOP=1 "),
        ("graphs", "CUDATEST_GRAPH=1 "),
        ("an updated graph", "CUDATEST_GRAPH=update "),
        ("a graph given a new grid", "CUDATEST_GRAPH=setparams "),
        (
            "a graph given a new child graph",
            "CUDATEST_GRAPH=setchild ",
        ),
    ] {
        let what = format!("30% alone, through {how}");
        let secs = if via.is_empty() { 30 } else { 10 };
        let cmd = format!("CUDATEST_WINDOWS=1 {via}{spin} cudatest burn {secs} 512");
        alone.push((how, step(&env, &id, &what, &cmd).await));
    }
    let n = gpu_container(&image, "neighbour", &[]);
    let neighbour = env.d.run_container(&pod, &n, &cfg).await.unwrap();
    traces.add_container(&neighbour);
    let unlimited = burn(
        &step(
            &env,
            &neighbour,
            "the neighbour, unlimited, alone",
            &format!("{spin} cudatest burn 10 512"),
        )
        .await,
    );
    step(
        &env,
        &neighbour,
        "the neighbour, unlimited, starts burning",
        &format!("{spin} cudatest burn 45 512 > /tmp/burn 2>&1 & sleep 3; cudatest util"),
    )
    .await;
    let beside = step(
        &env,
        &id,
        "30% beside the busy neighbour, 30 s",
        &format!("CUDATEST_WINDOWS=1 {spin} cudatest burn 30 512"),
    )
    .await;
    step(
        &env,
        &neighbour,
        "the neighbour's own rate",
        "while ! grep -qs burn /tmp/burn; do sleep 1; done; cat /tmp/burn",
    )
    .await;
    // The graph memory of allocation nodes. Every step runs before any assertion on the core
    // limit or on this, so that one fault hides none of the others' output.
    let graphmem = step(
        &env,
        &id,
        "a graph's memory nodes count from its launch until the graph memory is trimmed",
        "cudatest graphmem 1024 1280",
    )
    .await;
    // Each run's whole seconds after the first: mean, minimum and maximum share.
    let table = |out: &str| -> (f64, f64, f64) {
        let w: Vec<f64> = windows(out)
            .into_iter()
            .skip(1)
            .map(|r| r / unlimited * 100.0)
            .collect();
        let mean = w.iter().sum::<f64>() / w.len().max(1) as f64;
        let (lo, hi) = w
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
        (mean, lo, hi)
    };
    let mode = std::env::var("CRISHIM_GPU_CHECK_INJECT").unwrap_or_default();
    println!("== the core limit, 30%, {mode} mode; unlimited {unlimited:.0} blocks/s; 1 s windows, % of it:");
    println!("   {:<40} {:>6} {:>6} {:>6}", "", "mean", "min", "max");
    let mut rows: Vec<(String, (f64, f64, f64))> = alone
        .iter()
        .map(|(how, out)| (format!("alone, {how}"), table(out)))
        .collect();
    rows.push(("beside a busy neighbour".into(), table(&beside)));
    for (what, (mean, lo, hi)) in &rows {
        println!("   {what:<40} {mean:>6.1} {lo:>6.1} {hi:>6.1}");
    }
    // The targets: every window within 5 points of the limit, the mean within 2.
    for (what, (mean, lo, hi)) in &rows {
        assert!(
            (mean - 30.0).abs() <= 2.0 && *lo >= 25.0 && *hi <= 35.0,
            "{what}: mean {mean:.1}, windows {lo:.1} to {hi:.1}"
        );
    }

    assert_eq!(
        graphmem,
        "graph 1024 launch 0\nplain 1280 2\ngraph 1024 again 0\ntrim 0\nplain 1280 0\n\
         graph 1024 held 2\nupload 1024 held 2\n"
    );
    let o = std::process::Command::new(crishim_tests::daemon::daemon_bin())
        .args(["gpu", "list", "--config"])
        .arg(env.d.config_path())
        .output()
        .unwrap();
    println!(
        "== crishim gpu list\n{}",
        String::from_utf8_lossy(&o.stdout)
    );

    traces.capture(&env.d).await;
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    env.stop();
}
