//! GPUs on a fake node (see `crishim_tests::gpu`): every request form, what the container sees
//! of it, the interceptor enforcing memory limits across processes in both injection modes,
//! bad requests, and `crishim gpu list`. Everything is checked from inside busybox containers
//! or through the daemon's socket; every test ends with a leak check.

use std::collections::BTreeMap;

use crishim_proto::cri;
use crishim_tests::daemon::{metrics_address, metrics_toml, sample, scrape};
use crishim_tests::gpu::{
    self, gpu_image_once, lines, mig_uuid, uuid, FakeNode, IMAGE_LD_LIBRARY_PATH,
};
use crishim_tests::pods::{
    assert_no_leaks, container_config, marker, namespaces, set_pod_namespaces, set_pod_userns, sh,
    PodEnv, PodTraces, LOOP_UNTIL_TERM, NS_NODE, NS_POD,
};

/// ExecSync: (exit code, stdout, stderr).
async fn exec(env: &PodEnv, id: &str, cmd: &[&str]) -> (i32, String, String) {
    let r = env
        .d
        .exec_sync(id, cmd, 60)
        .await
        .unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e:?}"));
    (
        r.exit_code,
        String::from_utf8_lossy(&r.stdout).into_owned(),
        String::from_utf8_lossy(&r.stderr).into_owned(),
    )
}

async fn sh_ok(env: &PodEnv, id: &str, script: &str) -> String {
    let (code, out, err) = exec(env, id, &["/bin/sh", "-c", script]).await;
    assert_eq!(
        code, 0,
        "{script}: exit {code}, stdout {out:?}, stderr {err:?}"
    );
    out
}

/// A long-running `sh` container named `name` of `image`, after `f` adjusted it.
fn config(
    image: &str,
    name: &str,
    f: impl FnOnce(&mut cri::ContainerConfig),
) -> cri::ContainerConfig {
    let mut c = container_config(name, image, &[]);
    c.command = sh(LOOP_UNTIL_TERM, &marker(name));
    f(&mut c);
    c
}

fn set_env(c: &mut cri::ContainerConfig, key: &str, value: &str) {
    c.envs.push(cri::KeyValue {
        key: key.into(),
        value: value.into(),
    });
}

fn annotate(c: &mut cri::ContainerConfig, key: &str, value: &str) {
    c.annotations.insert(key.into(), value.into());
}

/// The container's NVIDIA device nodes: name → (major, minor).
async fn nodes(env: &PodEnv, id: &str) -> BTreeMap<String, (u32, u32)> {
    let out = sh_ok(
        env,
        id,
        "for f in /dev/nvidia*; do [ -e \"$f\" ] && stat -c '%n %t %T' \"$f\"; done; true",
    )
    .await;
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let hex = |s: &str| u32::from_str_radix(s, 16).unwrap();
            (f[0].to_string(), (hex(f[1]), hex(f[2])))
        })
        .collect()
}

fn expect_nodes(gpus: &[u32]) -> BTreeMap<String, (u32, u32)> {
    let mut m: BTreeMap<String, (u32, u32)> = gpus
        .iter()
        .map(|g| (format!("/dev/nvidia{g}"), (195, *g)))
        .collect();
    if !gpus.is_empty() {
        m.insert("/dev/nvidiactl".into(), (195, 255));
        m.insert("/dev/nvidia-uvm".into(), (gpu::UVM_MAJOR as u32, 0));
        m.insert("/dev/nvidia-uvm-tools".into(), (gpu::UVM_MAJOR as u32, 1));
    }
    m
}

async fn env_of(env: &PodEnv, id: &str, key: &str) -> Option<String> {
    let out = sh_ok(env, id, "env").await;
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
}

async fn finish(env: PodEnv, pod: &str, mut traces: PodTraces) {
    traces.capture(&env.d).await;
    env.d.stop_pod(pod).await.unwrap();
    env.d.remove_pod(pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    let gpu_dirs = env.d.state_dir().join("gpu/containers");
    let left = crishim_tests::fsutil::dir_entries(&gpu_dirs);
    assert!(
        left.is_empty(),
        "GPU directories left in {}: {left:?}",
        gpu_dirs.display()
    );
    env.stop();
}

const CDI_SPEC: &str = r#"cdiVersion: "0.6.0"
kind: "crishim.test/gpu"
devices:
  - name: "first"
    containerEdits:
      env: ["FROM_CDI=first"]
      deviceNodes:
        - path: "/dev/nvidia0"
          hostPath: "DEV/nvidia0"
  - name: "second"
    containerEdits:
      env: ["FROM_CDI=second"]
      deviceNodes:
        - path: "/dev/nvidia1"
          hostPath: "DEV/nvidia1"
"#;

#[tokio::test]
async fn every_request_form_gets_its_gpus_the_driver_and_the_env() {
    let node = FakeNode::new();
    node.write_cdi(
        "gpu.yaml",
        &CDI_SPEC.replace("DEV", &node.device_root().to_string_lossy()),
    );
    let env = PodEnv::start_with(node.daemon_options("preload")).await;
    let gpu_image = env.push_and_pull("gpu", &gpu_image_once()).await.tag_ref();
    let busybox = env.image();
    let cfg = env.pod_config("gpus");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);

    // (name, image, adjust, GPUs it must get)
    type Adjust = Box<dyn FnOnce(&mut cri::ContainerConfig)>;
    let g0 = node.gpu_node(0).to_string_lossy().into_owned();
    let cases: Vec<(&str, &str, Adjust, Vec<u32>)> = vec![
        ("plain", &busybox, Box::new(|_| {}), vec![]),
        (
            "by-index",
            &gpu_image,
            Box::new(|c| {
                set_env(c, "NVIDIA_VISIBLE_DEVICES", "1");
                set_env(c, "LD_LIBRARY_PATH", "/opt/req");
            }),
            vec![1],
        ),
        (
            "by-uuid",
            &busybox,
            Box::new(|c| set_env(c, "NVIDIA_VISIBLE_DEVICES", &uuid(0))),
            vec![0],
        ),
        (
            "all",
            &busybox,
            Box::new(|c| set_env(c, "NVIDIA_VISIBLE_DEVICES", "all")),
            vec![0, 1],
        ),
        (
            "cri-device",
            &busybox,
            Box::new(move |c| {
                c.devices.push(cri::Device {
                    container_path: "/dev/nvidia0".into(),
                    host_path: g0,
                    permissions: "rw".into(),
                })
            }),
            vec![0],
        ),
        (
            "driver-only",
            &busybox,
            Box::new(|c| set_env(c, "NVIDIA_VISIBLE_DEVICES", "none")),
            vec![],
        ),
        (
            "cdi-field",
            &busybox,
            Box::new(|c| {
                c.cdi_devices.push(cri::CdiDevice {
                    name: "crishim.test/gpu=second".into(),
                })
            }),
            vec![1],
        ),
        (
            "cdi-annotation",
            &busybox,
            Box::new(|c| annotate(c, "cdi.k8s.io/crishim-test_first", "crishim.test/gpu=first")),
            vec![0],
        ),
    ];
    for (name, image, adjust, gpus) in cases {
        let c = config(image, name, adjust);
        let id = env
            .d
            .run_container(&pod, &c, &cfg)
            .await
            .unwrap_or_else(|e| panic!("running {name}: {e:?}"));
        traces.add_container(&id);
        assert_eq!(
            nodes(&env, &id).await,
            expect_nodes(&gpus),
            "{name}: device nodes"
        );
        let visible = env_of(&env, &id, "NVIDIA_VISIBLE_DEVICES").await;
        let mounts = sh_ok(&env, &id, "cat /proc/self/mountinfo").await;
        if name == "plain" {
            assert_eq!(visible, None, "{name}");
            assert!(!mounts.contains("/usr/local/nvidia"), "{name}: {mounts}");
            assert_eq!(env_of(&env, &id, "LD_LIBRARY_PATH").await, None);
            let (code, _, _) = exec(&env, &id, &["ls", "/usr/local/nvidia"]).await;
            assert_ne!(code, 0, "{name}: /usr/local/nvidia exists");
            continue;
        }
        let want: Vec<String> = gpus.iter().map(|g| uuid(*g)).collect();
        let want = if want.is_empty() {
            "none".to_string()
        } else {
            want.join(",")
        };
        assert_eq!(
            visible.as_deref(),
            Some(want.as_str()),
            "{name}: NVIDIA_VISIBLE_DEVICES"
        );
        // The driver, read-only, and the PATH to its tools.
        let lib_mount = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(4) == Some("/usr/local/nvidia/lib64"))
            .unwrap_or_else(|| panic!("{name}: no /usr/local/nvidia/lib64 mount in {mounts}"));
        assert!(
            lib_mount
                .split_whitespace()
                .nth(5)
                .unwrap()
                .split(',')
                .any(|o| o == "ro"),
            "{name}: {lib_mount}"
        );
        let libs = sh_ok(&env, &id, "ls /usr/local/nvidia/lib64").await;
        for f in [
            "libcuda.so.1",
            "libcuda.so",
            "libnvidia-ml.so.1",
            "libcuda.so.550.54.14",
        ] {
            assert!(libs.lines().any(|l| l == f), "{name}: {f} not in {libs}");
        }
        assert_eq!(
            sh_ok(&env, &id, "nvidia-smi").await,
            "fake nvidia-smi\n",
            "{name}"
        );
        let path = env_of(&env, &id, "PATH").await.unwrap();
        assert!(
            path.ends_with(":/usr/local/nvidia/bin"),
            "{name}: PATH={path}"
        );
        let ld = env_of(&env, &id, "LD_LIBRARY_PATH").await.unwrap();
        if name == "by-index" {
            // The image's and the request's own values stay, after the driver's.
            assert_eq!(
                ld,
                format!("/usr/local/nvidia/lib64:{IMAGE_LD_LIBRARY_PATH}:/opt/req")
            );
        } else {
            assert_eq!(ld, "/usr/local/nvidia/lib64", "{name}");
        }
        if name.starts_with("cdi-") {
            let from = env_of(&env, &id, "FROM_CDI").await;
            let want = if name == "cdi-field" {
                "second"
            } else {
                "first"
            };
            assert_eq!(from.as_deref(), Some(want), "{name}");
        }
        // No limit, no interceptor.
        let (code, _, _) = exec(&env, &id, &["cat", "/etc/ld.so.preload"]).await;
        assert_ne!(code, 0, "{name}: /etc/ld.so.preload without a limit");
    }
    finish(env, &pod, traces).await;
}

/// A GPU container of the test image with a 256 MiB limit on GPU 0 (and `extra` annotations).
async fn limited(
    env: &PodEnv,
    pod: &str,
    cfg: &cri::PodSandboxConfig,
    image: &str,
    name: &str,
) -> String {
    let c = config(image, name, |c| {
        set_env(c, "NVIDIA_VISIBLE_DEVICES", "0");
        annotate(c, "gpu.crishim.io/memory", "256Mi");
        annotate(c, "gpu.crishim.io/cores", "50");
    });
    env.d
        .run_container(pod, &c, cfg)
        .await
        .unwrap_or_else(|e| panic!("running {name}: {e:?}"))
}

/// A script: `cudatest hold MIB 60` in the background (pid in `$H`, output in /tmp/hold), once
/// it holds, `then`. An earlier run's /tmp/hold goes first: the background shell truncates it
/// only when it gets to run, and the wait must not be satisfied by the stale "hold".
fn holding(mib: u32, then: &str) -> String {
    format!(
        "rm -f /tmp/hold; cudatest hold {mib} 60 > /tmp/hold & H=$!; \
         while ! grep -qs hold /tmp/hold; do sleep 0.1; done; {then}"
    )
}

/// What both injection modes must deliver: the limit on every path into the driver, shared by
/// the container's processes, with a killed process's share given back.
async fn check_enforcement(env: &PodEnv, id: &str) {
    let info = sh_ok(env, id, "cudatest info").await;
    let limit = (256u64 << 20).to_string();
    assert_eq!(lines(&info, "devices"), ["devices 1"], "{info}");
    assert_eq!(
        lines(&info, "device 0"),
        [format!("device 0 {}", uuid(0))],
        "{info}"
    );
    assert_eq!(
        lines(&info, "meminfo"),
        [format!("meminfo 0 {limit} {limit}")],
        "{info}"
    );
    assert_eq!(
        lines(&info, "procaddr-meminfo"),
        [format!("procaddr-meminfo 0 {limit} {limit}")],
        "{info}"
    );
    assert_eq!(
        lines(&info, "totalmem"),
        [format!("totalmem 0 {limit}")],
        "{info}"
    );
    // Through dlsym'd cuMemAlloc_v2 and cuGetProcAddress("cuMemAlloc") alike.
    let out = sh_ok(env, id, "cudatest alloc 100 100 100").await;
    assert_eq!(
        lines(&out, "alloc"),
        [
            "alloc 100 direct 0",
            "alloc 100 procaddr 0",
            "alloc 100 direct 2"
        ],
        "{out}"
    );
    let out = sh_ok(env, id, "cudatest alloc 200 100").await;
    assert_eq!(
        lines(&out, "alloc"),
        ["alloc 200 direct 0", "alloc 100 procaddr 2"],
        "{out}"
    );
    // Frees give the share back; cuMemCreate counts too.
    assert_eq!(
        sh_ok(env, id, "cudatest cycle 200 20").await,
        "cycle failures 0\n"
    );
    assert_eq!(sh_ok(env, id, "cudatest create 300").await, "create 2\n");
    assert_eq!(
        sh_ok(env, id, "cudatest create 200").await,
        "create 0\nrelease 0\n"
    );
    // Two processes share the limit; a killed one's share is reclaimed.
    let out = sh_ok(
        env,
        id,
        &holding(
            200,
            "cat /tmp/hold; cudatest alloc 100; kill -9 $H; wait $H; cudatest alloc 200",
        ),
    )
    .await;
    assert_eq!(
        lines(&out, "hold")
            .into_iter()
            .chain(lines(&out, "alloc"))
            .collect::<Vec<_>>(),
        ["hold 0", "alloc 100 direct 2", "alloc 200 direct 0"],
        "{out}"
    );
    // Arrays count too (2D through dlsym, 3D through cuGetProcAddress), and give back; a
    // mipmapped array counts every level.
    assert_eq!(
        sh_ok(env, id, "cudatest arrays 200 100").await,
        "array2d 200 0\narray3d 100 2\ndestroy 0\narray3d 100 0\n\
         mipmapped 220 levels 2 2\nmipmapped 220 levels 1 0\n"
    );
    // So do allocations from a memory pool (cudaMallocAsync's path).
    assert_eq!(
        sh_ok(env, id, "cudatest pool 200 100").await,
        "pool 200 0\npool 100 2\nfree 0\npool 100 0\n"
    );
    // A pool that keeps freed memory (release threshold: all) is charged what it keeps, until
    // trimmed; cuMemAllocAsync allocates from the device's pool and counts the same way.
    assert_eq!(
        sh_ok(env, id, "cudatest poolkeep 200").await,
        "keep alloc 0\nkeep free 0\nplain 100 2\nkeep again 0\ntrim 0\nplain 100 0\n\
         async 100 0\nasync 100 2\n"
    );
    // A graph's memory allocation nodes are mapped when it is launched or uploaded, and the
    // device's graph memory keeps them until trimmed: charged as a pool is. The graph keeps its
    // mapping across launches (as a real driver does), so a second launch needs nothing more.
    assert_eq!(
        sh_ok(env, id, "cudatest graphmem 200 100").await,
        "graph 200 launch 0\nplain 100 2\ngraph 200 again 0\ntrim 0\nplain 100 0\n\
         graph 200 held 2\nupload 200 held 2\n"
    );
    // An asynchronous allocation on a stream being captured only adds a node to the graph: it is
    // not refused (the graph's launches are charged), where the same allocation is otherwise.
    assert_eq!(
        sh_ok(
            env,
            id,
            "cudatest asyncalloc 300; FAKE_CUDA_CAPTURING=1 cudatest asyncalloc 300"
        )
        .await,
        "async 300 2\nasync 300 0\n"
    );
    // A context's memory is charged, as the driver reports it for the process: the fake's
    // contexts take $FAKE_CUDA_CONTEXT_MIB.
    let info = sh_ok(env, id, "FAKE_CUDA_CONTEXT_MIB=100 cudatest info").await;
    assert_eq!(
        lines(&info, "meminfo"),
        [format!("meminfo 0 {} {limit}", 156u64 << 20)],
        "{info}"
    );
    assert_eq!(
        sh_ok(env, id, "FAKE_CUDA_CONTEXT_MIB=100 cudatest alloc 200").await,
        "alloc 200 direct 2\n"
    );
    // NVML's process lists show the container's own processes only: a process of another
    // container on the GPU (pid 1 here, put in the fake driver's list by hand) is not shown.
    let out = sh_ok(
        env,
        id,
        &format!(
            "mkdir -p /tmp/fake-nvidia; echo '1000 0 0' > /tmp/fake-nvidia/1-0; {}",
            holding(
                10,
                "cudatest procs; kill $H; wait $H; ls /tmp/fake-nvidia/1-0 && rm /tmp/fake-nvidia/1-0"
            )
        ),
    )
    .await;
    assert_eq!(
        out, "procs v3 0 2 self 1\nprocs v1 0 2 self 1\n/tmp/fake-nvidia/1-0\n",
        "the container's two processes, not the neighbour"
    );
    // fork while another thread allocates: the child finds no lock of the interceptor held
    // by a thread it does not have (the atfork handlers).
    assert_eq!(
        sh_ok(env, id, "cudatest forks 60").await,
        "forks 60 hung 0\n"
    );
    // What the interceptor does not hook reaches the driver untouched (a function through
    // dlsym and cuGetProcAddress, and a data symbol).
    assert_eq!(
        sh_ok(env, id, "cudatest passthrough").await,
        "identify 5ca1ab1e 5ca1ab1e data 5ca1ab1e\n"
    );
    let nvml = sh_ok(env, id, "cudatest nvml").await;
    assert!(
        nvml.starts_with(&format!("nvml 0 total {limit} ")),
        "{nvml}"
    );
}

/// A daemon on `node` in preload mode serving metrics, and the GPU test image pulled: (env,
/// metrics address, image).
async fn with_metrics(node: &FakeNode) -> (PodEnv, String, String) {
    let metrics = metrics_address();
    let env = PodEnv::start_with(
        node.daemon_options("preload")
            .extra_toml(&metrics_toml(&metrics)),
    )
    .await;
    let image = env.push_and_pull("gpu", &gpu_image_once()).await.tag_ref();
    (env, metrics, image)
}

async fn vgpu_config(env: &PodEnv, id: &str) -> serde_json::Value {
    let text = sh_ok(env, id, "cat /etc/crishim/vgpu/config.json").await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test]
async fn preload_mode_enforces_the_memory_limit_across_processes() {
    let node = FakeNode::new();
    let (env, metrics, image) = with_metrics(&node).await;
    let cfg = env.pod_config("vgpu");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let id = limited(&env, &pod, &cfg, &image, "limited").await;
    traces.add_container(&id);

    assert_eq!(
        sh_ok(&env, &id, "cat /etc/ld.so.preload").await,
        "/etc/crishim/vgpu/libcrishim_vgpu.so\n"
    );
    assert_eq!(
        sh_ok(&env, &id, "cmp /etc/crishim/vgpu/libcrishim_vgpu.so /usr/local/nvidia/lib64/libcuda.so.1 >/dev/null; echo $?").await,
        "1\n",
        "the interceptor is there, and libcuda.so.1 is the real one"
    );
    let c = vgpu_config(&env, &id).await;
    assert_eq!(c["memory_limit_bytes"], 256u64 << 20);
    assert_eq!(c["core_percent"], 50);
    assert_eq!(c["device_uuids"], serde_json::json!([uuid(0)]));
    assert_eq!(c["container_id"], id.as_str());
    assert_eq!(c["pod_uid"], cfg.metadata.as_ref().unwrap().uid.as_str());
    assert_eq!(
        env_of(&env, &id, "CRISHIM_VGPU_MEMORY_LIMIT")
            .await
            .as_deref(),
        Some("268435456")
    );
    assert_eq!(
        env_of(&env, &id, "CRISHIM_VGPU_CORE_LIMIT")
            .await
            .as_deref(),
        Some("50")
    );
    // The config cannot be changed from inside.
    let (code, _, _) = exec(
        &env,
        &id,
        &["sh", "-c", "echo {} > /etc/crishim/vgpu/config.json"],
    )
    .await;
    assert_ne!(code, 0, "config.json is writable from the container");
    check_enforcement(&env, &id).await;

    // The GPU memory gauges, from the accounting file the interceptor keeps (the fake driver
    // stands in for a GPU): the limit, and what a process holding 200 MiB holds.
    sh_ok(
        &env,
        &id,
        "cudatest hold 200 60 > /tmp/gauge 2>&1 & echo $! > /tmp/gauge.pid; \
         while ! grep -qs hold /tmp/gauge; do sleep 0.1; done",
    )
    .await;
    let text = scrape(&metrics).await;
    let series = |name: &str| format!("{name}{{container=\"{id}\"}}");
    assert_eq!(
        sample(&text, &series("crishim_gpu_memory_limit_bytes")),
        (256u64 << 20) as f64,
        "{text}"
    );
    assert_eq!(
        sample(&text, &series("crishim_gpu_memory_used_bytes")),
        (200u64 << 20) as f64,
        "{text}"
    );
    // `crishim gpu list` shows the same figures.
    let (k, v) = node.env();
    let o = std::process::Command::new(crishim_tests::daemon::daemon_bin())
        .args(["gpu", "list", "--json", "--config"])
        .arg(env.d.config_path())
        .env(k, v)
        .output()
        .unwrap();
    let listing: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let holder = &listing["gpus"][0]["containers"][0];
    assert_eq!(holder["memory_used_bytes"], 200u64 << 20, "{listing}");
    assert_eq!(holder["memory_limit_bytes"], 256u64 << 20, "{listing}");
    // Killed, and reaped by the container's init.
    sh_ok(
        &env,
        &id,
        "P=$(cat /tmp/gauge.pid); kill -9 $P; while [ -e /proc/$P ]; do sleep 0.1; done",
    )
    .await;

    // `crishim gpu list` shows who holds what.
    let list = |json: bool| {
        let (k, v) = node.env();
        let mut cmd = std::process::Command::new(crishim_tests::daemon::daemon_bin());
        cmd.args(["gpu", "list", "--config"])
            .arg(env.d.config_path())
            .env(k, v);
        if json {
            cmd.arg("--json");
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let listing: serde_json::Value = serde_json::from_str(&list(true)).unwrap();
    let gpus = listing["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2, "{listing}");
    for (i, g) in gpus.iter().enumerate() {
        assert_eq!(g["index"], i);
        assert_eq!(g["minor"], i);
        assert_eq!(g["uuid"], uuid(i as u32));
        assert_eq!(g["bus_id"], gpu::bus_id(i as u32));
        assert_eq!(g["memory"], gpu::FAKE_MEMORY);
    }
    let holders = gpus[0]["containers"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{listing}");
    assert_eq!(holders[0]["container_id"], id.as_str());
    assert_eq!(holders[0]["memory_limit_bytes"], 256u64 << 20);
    // The holding process was killed: its record, left in the accounting file, no longer counts.
    assert_eq!(holders[0]["memory_used_bytes"], 0, "{listing}");
    assert!(gpus[1]["containers"].as_array().unwrap().is_empty());
    let text = list(false);
    let row0 = text.lines().find(|l| l.contains(&uuid(0))).unwrap();
    assert!(
        row0.contains(&id[..12])
            && row0.contains("memory 0 MiB of 256 MiB")
            && row0.contains("cores 50%"),
        "{text}"
    );
    assert!(text.lines().next().unwrap().starts_with("INDEX"), "{text}");

    // Removing the container removes its GPU directory (and with it the accounting file).
    let dir = env.d.state_dir().join("gpu/containers").join(&id);
    assert!(dir.join("shared/usage").is_file());
    env.d.stop_container(&id, 0).await.unwrap();
    env.d.remove_container(&id).await.unwrap();
    assert!(
        !dir.exists(),
        "{} left after RemoveContainer",
        dir.display()
    );
    let listing: serde_json::Value = serde_json::from_str(&list(true)).unwrap();
    assert!(listing["gpus"][0]["containers"]
        .as_array()
        .unwrap()
        .is_empty());
    finish(env, &pod, traces).await;
}

#[tokio::test]
async fn replace_mode_enforces_the_memory_limit_through_the_shared_mirror() {
    let node = FakeNode::new();
    let env = PodEnv::start_with(node.daemon_options("replace")).await;
    let image = env.push_and_pull("gpu", &gpu_image_once()).await.tag_ref();
    let cfg = env.pod_config("vgpu-replace");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let id = limited(&env, &pod, &cfg, &image, "limited").await;
    traces.add_container(&id);

    let (code, _, _) = exec(&env, &id, &["cat", "/etc/ld.so.preload"]).await;
    assert_ne!(code, 0, "no /etc/ld.so.preload in replace mode");
    let c = vgpu_config(&env, &id).await;
    assert_eq!(c["libcuda"], "/usr/local/nvidia/origin/lib64/libcuda.so.1");
    let libs = sh_ok(
        &env,
        &id,
        "ls /usr/local/nvidia/lib64 /usr/local/nvidia/origin/lib64",
    )
    .await;
    assert!(libs.contains("libcrishim_vgpu.so"), "{libs}");
    check_enforcement(&env, &id).await;
    finish(env, &pod, traces).await;
}

#[tokio::test]
async fn bad_requests_are_refused_by_name_and_leave_nothing_behind() {
    let node = FakeNode::new();
    let env = PodEnv::start_with(node.daemon_options("preload")).await;
    let cfg = env.pod_config("bad");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let image = env.image();
    type Adjust = Box<dyn Fn(&mut cri::ContainerConfig)>;
    let cases: Vec<(Adjust, &str)> = vec![
        (
            Box::new(|c| set_env(c, "NVIDIA_VISIBLE_DEVICES", "5")),
            "unknown GPU index 5",
        ),
        (
            Box::new(|c| {
                set_env(
                    c,
                    "NVIDIA_VISIBLE_DEVICES",
                    "0,GPU-deadbeef-0000-0000-0000-000000000000",
                )
            }),
            "unknown GPU UUID \"GPU-deadbeef-0000-0000-0000-000000000000\"",
        ),
        (
            Box::new(|c| {
                c.cdi_devices.push(cri::CdiDevice {
                    name: "crishim.test/gpu=nope".into(),
                })
            }),
            "unknown CDI device \"crishim.test/gpu=nope\"",
        ),
        (
            Box::new(|c| annotate(c, "cdi.k8s.io/x", "crishim.test/gpu=gone")),
            "unknown CDI device \"crishim.test/gpu=gone\"",
        ),
        (
            Box::new(|c| {
                set_env(c, "NVIDIA_VISIBLE_DEVICES", "1");
                annotate(c, "gpu.crishim.io/memory", "2Gi");
            }),
            "gpu.crishim.io/memory \"2Gi\" (2147483648 bytes) is larger than GPU 1",
        ),
        (
            Box::new(|c| {
                set_env(c, "NVIDIA_VISIBLE_DEVICES", "0");
                annotate(c, "tencent.com/vcuda-memory", "5");
            }),
            "tencent.com/vcuda-memory \"5\" (1342177280 bytes) is larger than GPU 0",
        ),
        (
            Box::new(|c| {
                set_env(c, "NVIDIA_VISIBLE_DEVICES", "0");
                annotate(c, "gpu.crishim.io/cores", "150");
            }),
            "gpu.crishim.io/cores \"150\" is larger than one GPU",
        ),
        (
            Box::new(|c| {
                set_env(c, "NVIDIA_VISIBLE_DEVICES", "0");
                annotate(c, "gpu.crishim.io/memory", "12MB");
            }),
            "gpu.crishim.io/memory \"12MB\"",
        ),
        (
            Box::new(|c| annotate(c, "gpu.crishim.io/memory", "1Gi")),
            "gpu.crishim.io/memory is set but the container requests no GPU",
        ),
        (
            Box::new(|c| {
                set_env(c, "NVIDIA_VISIBLE_DEVICES", "0");
                set_env(c, "NVIDIA_DRIVER_CAPABILITIES", "compute,teleport");
            }),
            "unknown capability \"teleport\"",
        ),
    ];
    for (i, (adjust, needle)) in cases.iter().enumerate() {
        let c = config(&image, &format!("bad{i}"), adjust);
        let e = env.d.create_container(&pod, &c, &cfg).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "case {i}: {e:?}");
        assert!(
            e.message().contains(needle),
            "case {i}: {:?} lacks {needle:?}",
            e.message()
        );
    }
    assert!(env.d.list_container_ids(None).await.unwrap().is_empty());
    let left = crishim_tests::fsutil::dir_entries(&env.d.state_dir().join("gpu/containers"));
    assert!(left.is_empty(), "GPU directories left: {left:?}");
    let left = crishim_tests::fsutil::dir_entries(&env.d.state_dir().join("containers"));
    assert!(left.is_empty(), "bundles left: {left:?}");
    // An image whose glibc could not load the interceptor is refused, not silently unlimited.
    let old = crishim_tests::Image::new(vec![
        crishim_tests::busybox_layer(),
        crishim_tests::LayerBuilder::new()
            .dir("lib64", 0o755)
            .file("lib64/libc.so.6", "\0GLIBC_2.2.5\0GLIBC_2.31\0", 0o755)
            .build(crishim_tests::Compression::Gzip),
    ]);
    let old = env.push_and_pull("oldglibc", &old).await.tag_ref();
    let c = config(&old, "old-glibc", |c| {
        set_env(c, "NVIDIA_VISIBLE_DEVICES", "0");
        annotate(c, "gpu.crishim.io/memory", "256Mi");
    });
    let e = env.d.create_container(&pod, &c, &cfg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("the image has glibc 2.31"),
        "{}",
        e.message()
    );
    // Without a limit there is no interceptor to load: the same image is fine.
    let c = config(&old, "old-glibc", |c| {
        set_env(c, "NVIDIA_VISIBLE_DEVICES", "0")
    });
    let id = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&id);

    // The names are free again: a good request under the first name works.
    let c = config(&image, "bad0", |c| {
        set_env(c, "NVIDIA_VISIBLE_DEVICES", "0")
    });
    let id = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&id);
    assert_eq!(nodes(&env, &id).await, expect_nodes(&[0]));
    finish(env, &pod, traces).await;
}

#[tokio::test]
async fn the_interceptor_passes_through_without_a_config_and_fails_closed_on_a_broken_one() {
    let node = FakeNode::new();
    let env = PodEnv::start_with(node.daemon_options("preload")).await;
    // The interceptor shipped in the image and preloaded by hand: crishim injects nothing here
    // (no limit), so what the library does on its own shows.
    let mut image = gpu_image_once();
    image.layers.push(
        crishim_tests::LayerBuilder::new()
            .dir("opt/vgpu", 0o755)
            .file(
                "opt/vgpu/libcrishim_vgpu.so",
                std::fs::read(gpu::interceptor()).unwrap(),
                0o755,
            )
            .build(crishim_tests::Compression::Gzip),
    );
    let image = env
        .push_and_pull("gpu-own-interceptor", &image)
        .await
        .tag_ref();
    let cfg = env.pod_config("passthrough");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let c = config(&image, "own", |c| set_env(c, "NVIDIA_VISIBLE_DEVICES", "0"));
    let id = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&id);
    let preload = "LD_PRELOAD=/opt/vgpu/libcrishim_vgpu.so";

    // No config: everything reaches the fake driver, whose own 1 GiB is the only bound.
    let out = sh_ok(&env, &id, &format!("{preload} cudatest alloc 600 300 200")).await;
    assert_eq!(
        lines(&out, "alloc"),
        [
            "alloc 600 direct 0",
            "alloc 300 procaddr 0",
            "alloc 200 direct 2"
        ],
        "{out}"
    );
    let out = sh_ok(&env, &id, &format!("{preload} cudatest passthrough")).await;
    assert_eq!(out, "identify 5ca1ab1e 5ca1ab1e data 5ca1ab1e\n");

    // A config it cannot read: every CUDA call is refused, and stderr says why.
    for broken in ["{", r#"{"version": 7}"#] {
        let script = format!(
            "mkdir -p /etc/crishim/vgpu && echo '{broken}' > /etc/crishim/vgpu/config.json && \
             {preload} cudatest info"
        );
        let (code, out, err) = exec(&env, &id, &["/bin/sh", "-c", &script]).await;
        assert_eq!((code, out.as_str()), (11, "init 800\n"), "{broken}: {err}");
        assert!(
            err.contains("crishim-vgpu: /etc/crishim/vgpu/config.json")
                && err.contains("refusing CUDA calls"),
            "{broken}: {err}"
        );
    }
    finish(env, &pod, traces).await;
}

/// `[gpu] accept_env_requests = false` and `limit_annotations = false`: whoever writes the pod
/// can no longer ask for GPUs through `NVIDIA_VISIBLE_DEVICES` or raise limits through
/// annotations; the NVIDIA device plugin's volume-mounts strategy and its env still work. (The
/// fake driver stands in for a GPU.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_device_plugin_may_ask_when_env_requests_and_limit_annotations_are_off() {
    let node = FakeNode::new();
    let opts = node
        .daemon_options("preload")
        .extra_toml("accept_env_requests = false\nlimit_annotations = false\n");
    let env = PodEnv::start_with(opts).await;
    let image = env.push_and_pull("gpu", &gpu_image_once()).await.tag_ref();
    let cfg = env.pod_config("gpu-policy");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let device_list = |c: &mut cri::ContainerConfig, gpu: &str| {
        c.mounts.push(cri::Mount {
            container_path: format!("/var/run/nvidia-container-devices/{gpu}"),
            host_path: "/dev/null".into(),
            readonly: true,
            ..Default::default()
        })
    };

    // The pod's own env asks for every GPU: nothing is granted.
    let c = config(&image, "env-all", |c| {
        set_env(c, "NVIDIA_VISIBLE_DEVICES", "all")
    });
    let asked = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&asked);
    assert_eq!(nodes(&env, &asked).await, expect_nodes(&[]));

    // The device plugin's device-list mount: GPU 1 only, and the mount itself is not there.
    let c = config(&image, "listed", |c| device_list(c, "1"));
    let listed = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&listed);
    assert_eq!(nodes(&env, &listed).await, expect_nodes(&[1]));
    let (code, _, _) = exec(
        &env,
        &listed,
        &["test", "-e", "/var/run/nvidia-container-devices/1"],
    )
    .await;
    assert_ne!(
        code, 0,
        "the device-list mount point exists in the container"
    );

    // Limits: the device plugin's env counts, the pod author's annotation does not.
    let c = config(&image, "limited", |c| {
        device_list(c, "0");
        annotate(c, "gpu.crishim.io/memory", "64Gi");
        set_env(c, "CRISHIM_VGPU_MEMORY_LIMIT", "134217728");
    });
    let limited = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&limited);
    assert_eq!(nodes(&env, &limited).await, expect_nodes(&[0]));
    assert_eq!(
        vgpu_config(&env, &limited).await["memory_limit_bytes"],
        128u64 << 20
    );
    finish(env, &pod, traces).await;
}

/// The driver's daemons, where the host runs them (here: under the fake driver root), reach GPU
/// containers as the NVIDIA toolkit injects them: the persistence daemon's socket read-only,
/// the MPS pipe directory writable; what the host lacks (the fabric manager) is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_daemons_sockets_and_mps_directory_reach_gpu_containers() {
    let node = FakeNode::new();
    let root = node.driver_root();
    let persistenced = root.join("run/nvidia-persistenced");
    std::fs::create_dir_all(&persistenced).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(persistenced.join("socket")).unwrap();
    let mps = root.join("tmp/nvidia-mps");
    std::fs::create_dir_all(&mps).unwrap();
    std::fs::write(mps.join("control"), "pipe").unwrap();
    let env = PodEnv::start_with(node.daemon_options("preload")).await;
    let image = env.push_and_pull("gpu", &gpu_image_once()).await.tag_ref();
    let cfg = env.pod_config("gpu-daemons");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);

    let c = config(&image, "with-gpu", |c| {
        set_env(c, "NVIDIA_VISIBLE_DEVICES", "0")
    });
    let id = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&id);
    sh_ok(
        &env,
        &id,
        "test -S /run/nvidia-persistenced/socket && test \"$(cat /tmp/nvidia-mps/control)\" = pipe \
         && touch /tmp/nvidia-mps/client && ! test -e /run/nvidia-fabricmanager",
    )
    .await;
    assert!(
        mps.join("client").exists(),
        "the MPS directory is the host's, writable"
    );

    let c = config(&image, "no-gpu", |_| {});
    let plain = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&plain);
    let (code, _, _) = exec(
        &env,
        &plain,
        &["test", "-e", "/run/nvidia-persistenced/socket"],
    )
    .await;
    assert_ne!(code, 0, "a container without GPUs gets no driver socket");
    finish(env, &pod, traces).await;
}

/// What `cudatest burn` printed: its share of the GPU's time in its second half, percent, and
/// each whole second's share (with `CUDATEST_WINDOWS`).
fn burned(out: &str) -> (f64, Vec<f64>) {
    let mut share = None;
    let mut windows = Vec::new();
    for line in out.lines() {
        if let Some(w) = line.strip_prefix("window ") {
            let pct = w.split_whitespace().nth(1).and_then(|p| p.parse().ok());
            windows.push(pct.unwrap_or_else(|| panic!("{out}")));
        } else if let Some(p) = line.strip_prefix("burn ") {
            share = p.trim().parse().ok();
        }
    }
    (
        share.unwrap_or_else(|| panic!("no share in {out:?}")),
        windows,
    )
}

/// Every whole second after the first `warm` within `window` points of `limit`, and their mean
/// within `mean` points; what was seen, for the log.
fn within(what: &str, out: &str, warm: usize, limit: f64, window: f64, mean: f64) -> String {
    let (_, windows) = burned(out);
    let w = &windows[warm.min(windows.len())..];
    let avg = w.iter().sum::<f64>() / w.len() as f64;
    let (lo, hi) = w
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
    assert!(
        w.len() >= 3 && (avg - limit).abs() <= mean && lo >= limit - window && hi <= limit + window,
        "{what}: mean {avg:.1}%, 1 s windows {lo:.1} to {hi:.1}% against {limit}%: {windows:?}"
    );
    format!("{what}: mean {avg:.1}, min {lo:.1}, max {hi:.1}")
}

/// A pod in the host's pid namespace whose containers (name, core limit) share the fake GPU 0:
/// they share the fake driver's state directory (returned, to be kept), so their processes see
/// each other's contexts, and the pids it reports are host pids, as a real driver's are.
async fn sharing_one_gpu(
    env: &PodEnv,
    cfg: &mut cri::PodSandboxConfig,
    image: &str,
    containers: &[(&'static str, Option<&str>)],
) -> (
    String,
    PodTraces,
    tempfile::TempDir,
    BTreeMap<&'static str, String>,
) {
    set_pod_namespaces(cfg, namespaces(NS_POD, NS_NODE, NS_POD));
    let pod = env.d.run_pod(cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, cfg);
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        shared.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mut ids = BTreeMap::new();
    for &(name, cores) in containers {
        let c = config(image, name, |c| {
            c.mounts.push(cri::Mount {
                container_path: "/tmp/fake-nvidia".into(),
                host_path: shared.path().to_string_lossy().into_owned(),
                ..Default::default()
            });
            set_env(c, "NVIDIA_VISIBLE_DEVICES", "0");
            if let Some(p) = cores {
                annotate(c, "gpu.crishim.io/cores", p);
            }
        });
        let id = env.d.run_container(&pod, &c, cfg).await.unwrap();
        traces.add_container(&id);
        ids.insert(name, id);
    }
    (pod, traces, shared, ids)
}

/// The core limit charges a container the GPU time its kernels take, measured with events on
/// its own streams, and holds each 1-second window at the limit: alone, beside a neighbour
/// that keeps the GPU busy, split 10/90 and 20/30/50, with tiny and huge kernels, on GPUs of
/// 16, 132 and 188 SMs, through every kind of launch. The measured share shows beside the limit
/// in `crishim gpu list` and the metrics.
///
/// No GPU here: the fake driver simulates one that time-slices, shared by the processes of
/// every container through a state directory the containers share; its kernels take simulated
/// time, its events stamp when their context runs, and NVML gives each sample to the process
/// running then. The pod uses the host's pid namespace, so that the pids the fake driver
/// reports are host pids, as a real driver's are.
#[tokio::test]
async fn the_core_limit_holds_every_second_alone_and_beside_any_neighbour() {
    let node = FakeNode::new();
    let (env, metrics, image) = with_metrics(&node).await;
    let mut cfg = env.pod_config("vgpu-cores");
    let (pod, traces, _shared, ids) = sharing_one_gpu(
        &env,
        &mut cfg,
        &image,
        &[
            ("limited", Some("30")),
            ("ten", Some("10")),
            ("ninety", Some("90")),
            ("twenty", Some("20")),
            ("fifty", Some("50")),
            ("neighbour", None),
        ],
    )
    .await;
    let run = |name: &'static str, cmd: String| {
        let (env, id) = (&env, ids[name].clone());
        async move { sh_ok(env, &id, &cmd).await }
    };
    let burn = |secs: u32, blocks: u32| format!("CUDATEST_WINDOWS=1 cudatest burn {secs} {blocks}");
    let mut seen = Vec::new();

    // Alone, on GPUs of each size: a 1,000-block kernel is 8 waves of 132 SMs, 63 of 16.
    for sms in [132, 16, 188] {
        let out = run("limited", format!("FAKE_CUDA_SMS={sms} {}", burn(6, 1000))).await;
        seen.push(within(
            &format!("30% alone, {sms} SMs"),
            &out,
            1,
            30.0,
            5.0,
            2.0,
        ));
    }
    // Few huge kernels (15 ms, more than a time slice each), and many tiny ones (20 µs: a
    // launch of the fake driver costs CPU time a real one does not, and two shared cores must
    // keep up with the launches of both sides).
    let out = run("limited", burn(8, 200_000)).await;
    seen.push(within("30% alone, huge kernels", &out, 1, 30.0, 5.0, 2.0));
    let out = run("limited", format!("FAKE_CUDA_WAVE_US=20 {}", burn(6, 1))).await;
    seen.push(within("30% alone, tiny kernels", &out, 1, 30.0, 5.0, 2.0));
    // Through each other way a launch reaches the GPU.
    for (how, mode) in [
        ("cooperative launches", "CUDATEST_COOP=1"),
        ("graph launches", "CUDATEST_GRAPH=1"),
        ("an updated graph", "CUDATEST_GRAPH=update"),
        ("a graph given a new grid", "CUDATEST_GRAPH=setparams"),
        ("a graph given a new child graph", "CUDATEST_GRAPH=setchild"),
    ] {
        let out = run("limited", format!("{mode} {}", burn(5, 1000))).await;
        seen.push(within(
            &format!("30% alone, {how}"),
            &out,
            1,
            30.0,
            5.0,
            3.0,
        ));
    }

    // Shares of one GPU: 10/90, then 20/30/50.
    let (ten, ninety) = tokio::join!(run("ten", burn(8, 1000)), run("ninety", burn(8, 1000)));
    seen.push(within("10% beside 90%", &ten, 2, 10.0, 3.0, 2.0));
    seen.push(within("90% beside 10%", &ninety, 2, 90.0, 3.0, 2.0));
    let (twenty, thirty, fifty) = tokio::join!(
        run("twenty", burn(8, 1000)),
        run("limited", burn(8, 1000)),
        run("fifty", burn(8, 1000))
    );
    seen.push(within("20% of 20/30/50", &twenty, 2, 20.0, 5.0, 2.0));
    seen.push(within("30% of 20/30/50", &thirty, 2, 30.0, 5.0, 2.0));
    seen.push(within("50% of 20/30/50", &fifty, 2, 50.0, 5.0, 2.0));

    // Beside a neighbour with no limit that keeps the GPU busy.
    run(
        "neighbour",
        "cudatest burn 90 1000 > /tmp/burn 2>&1 &".into(),
    )
    .await;
    run(
        "limited",
        "i=0; until cudatest util | grep -qx 'util 0 100'; do \
         i=$((i+1)); [ $i -lt 100 ] || exit 1; sleep 0.1; done"
            .into(),
    )
    .await;
    let out = run("limited", burn(12, 1000)).await;
    seen.push(within(
        "30% beside a busy neighbour",
        &out,
        4,
        30.0,
        5.0,
        2.0,
    ));
    let out = run("limited", format!("FAKE_CUDA_WAVE_US=20 {}", burn(10, 1))).await;
    seen.push(within(
        "30% beside a busy neighbour, tiny kernels",
        &out,
        4,
        30.0,
        5.0,
        2.0,
    ));
    // Launches into a stream being captured only record a graph: they are not held back.
    let out = run(
        "limited",
        "FAKE_CUDA_CAPTURING=1 cudatest burn 3 1000".into(),
    )
    .await;
    let (captured, _) = burned(&out);
    assert!(
        captured > 1000.0,
        "launches while capturing: {captured}% of the GPU's launch rate, held back as if they ran"
    );

    // While it runs, the measured share shows beside the limit, and the time held back.
    run("limited", "cudatest burn 8 1000 > /tmp/burn 2>&1 &".into()).await;
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let text = scrape(&metrics).await;
    let limited = ids["limited"].clone();
    let series = |name: &str| format!("{name}{{container=\"{limited}\"}}");
    let share = sample(&text, &series("crishim_gpu_core_share_percent"));
    assert_eq!(
        sample(&text, &series("crishim_gpu_core_limit_percent")),
        30.0
    );
    assert!((25.0..=35.0).contains(&share), "measured {share}%");
    assert!(sample(&text, &series("crishim_gpu_time_seconds_total")) > 5.0);
    assert!(sample(&text, &series("crishim_gpu_throttled_seconds_total")) > 1.0);
    let (k, v) = node.env();
    let o = std::process::Command::new(crishim_tests::daemon::daemon_bin())
        .args(["gpu", "list", "--json", "--config"])
        .arg(env.d.config_path())
        .env(k, v)
        .output()
        .unwrap();
    let listing: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let holder = listing["gpus"][0]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["container_id"] == limited.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{listing}"));
    let listed = holder["core_share_percent"].as_f64().unwrap_or(0.0);
    assert!((25.0..=35.0).contains(&listed), "{listing}");
    assert!(
        holder["throttled_seconds"].as_f64().unwrap_or(0.0) > 1.0,
        "{listing}"
    );
    println!("core limits, 1 s windows:\n  {}", seen.join("\n  "));
    finish(env, &pod, traces).await;
}

/// `[gpu] core_policy = "shared"`: a container alone on its GPU may use what would sit idle, and
/// is held to its limit again within a few seconds of a neighbour starting. No GPU here: the
/// fake driver's time-sliced GPU, as above.
#[tokio::test]
async fn under_the_shared_policy_a_lone_container_may_use_the_idle_gpu() {
    let node = FakeNode::new();
    let env = PodEnv::start_with(
        node.daemon_options("preload")
            .extra_toml("core_policy = \"shared\"\n"),
    )
    .await;
    let image = env.push_and_pull("gpu", &gpu_image_once()).await.tag_ref();
    let mut cfg = env.pod_config("vgpu-shared");
    let (pod, traces, _shared, ids) = sharing_one_gpu(
        &env,
        &mut cfg,
        &image,
        &[("limited", Some("30")), ("neighbour", None)],
    )
    .await;
    assert_eq!(
        vgpu_config(&env, &ids["limited"]).await["core_policy"],
        "shared"
    );
    let alone = sh_ok(&env, &ids["limited"], "cudatest burn 4 1000").await;
    let (alone, _) = burned(&alone);
    assert!(
        alone > 80.0,
        "alone under the shared policy: {alone}% of the GPU"
    );
    sh_ok(
        &env,
        &ids["neighbour"],
        "cudatest burn 30 1000 > /tmp/burn 2>&1 &",
    )
    .await;
    let beside = sh_ok(
        &env,
        &ids["limited"],
        "CUDATEST_WINDOWS=1 cudatest burn 8 1000",
    )
    .await;
    let seen = within(
        "30% beside a busy neighbour, shared policy",
        &beside,
        3,
        30.0,
        5.0,
        2.0,
    );
    println!("shared policy: alone {alone}%; {seen}");
    finish(env, &pod, traces).await;
}

/// A MIG device is asked for by its UUID, as the device plugin's MIG strategies do: the
/// container gets its GPU's node and the two `nvidia-caps` nodes that grant the MIG device, and
/// its limits are checked against the MIG device's memory. A MIG device whose capability nodes
/// are missing is not offered. No GPU here: the fake NVML reports MIG devices.
#[tokio::test]
async fn mig_devices_are_granted_by_uuid_with_their_capability_nodes() {
    let node = FakeNode::new();
    node.add_mig(1, 1, 0, (21, 22), true);
    node.add_mig(1, 2, 0, (30, 31), false);
    let env = PodEnv::start_with(node.daemon_options("preload")).await;
    let image = env.push_and_pull("gpu", &gpu_image_once()).await.tag_ref();
    let cfg = env.pod_config("mig");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let mig = mig_uuid(1, 1, 0);

    let c = config(&image, "mig", |c| {
        set_env(c, "NVIDIA_VISIBLE_DEVICES", &mig);
        annotate(c, "gpu.crishim.io/memory", "256Mi");
    });
    let id = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&id);
    let mut seen = nodes(&env, &id).await;
    assert_eq!(seen.remove("/dev/nvidia-caps"), Some((0, 0)), "a directory");
    assert_eq!(seen, expect_nodes(&[1]));
    assert_eq!(
        sh_ok(&env, &id, "stat -c '%n %t %T' /dev/nvidia-caps/*").await,
        format!(
            "/dev/nvidia-caps/nvidia-cap21 {CAPS:x} 15\n/dev/nvidia-caps/nvidia-cap22 {CAPS:x} 16\n",
            CAPS = gpu::CAPS_MAJOR
        )
    );
    assert_eq!(
        env_of(&env, &id, "NVIDIA_VISIBLE_DEVICES").await.as_deref(),
        Some(mig.as_str())
    );
    assert_eq!(
        vgpu_config(&env, &id).await["device_uuids"],
        serde_json::json!([mig])
    );

    // Past the MIG device's memory (half the fake GPU's), and a MIG device without its nodes.
    for (name, asked, memory, needle) in [
        ("too-big", mig.clone(), "600Mi", "is larger than"),
        ("no-nodes", mig_uuid(1, 2, 0), "", "unknown MIG device"),
        ("no-such", mig_uuid(0, 1, 0), "", "unknown MIG device"),
    ] {
        let c = config(&image, name, |c| {
            set_env(c, "NVIDIA_VISIBLE_DEVICES", &asked);
            if !memory.is_empty() {
                annotate(c, "gpu.crishim.io/memory", memory);
            }
        });
        let e = env.d.create_container(&pod, &c, &cfg).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{name}: {e:?}");
        assert!(e.message().contains(needle), "{name}: {}", e.message());
    }

    // `crishim gpu list` shows the MIG device after its GPU, with the container holding it.
    let (k, v) = node.env();
    let o = std::process::Command::new(crishim_tests::daemon::daemon_bin())
        .args(["gpu", "list", "--json", "--config"])
        .arg(env.d.config_path())
        .env(k, v)
        .output()
        .unwrap();
    let listing: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let gpus = listing["gpus"].as_array().unwrap();
    let uuids: Vec<&str> = gpus.iter().map(|g| g["uuid"].as_str().unwrap()).collect();
    assert_eq!(uuids, [uuid(0), uuid(1), mig.clone()], "{listing}");
    assert_eq!(gpus[2]["mig"]["parent"], uuid(1));
    assert_eq!(gpus[2]["mig"]["gpu_instance"], 1);
    assert_eq!(gpus[2]["memory"], gpu::FAKE_MEMORY / 2);
    assert_eq!(gpus[2]["containers"][0]["container_id"], id.as_str());
    finish(env, &pod, traces).await;
}

/// A GPU container in a pod with its own user namespace. No device node can be made there, so
/// crishim makes its nodes (the fake GPUs live in a temporary device root, not at /dev) on a
/// tmpfs of their own and binds them in; the driver's mounts stay host root's, read-only and
/// locked (`doors/userns.rs` tries to lift that), and the interceptor enforces the limit there too.
#[tokio::test]
async fn a_gpu_container_in_a_pod_with_its_own_user_namespace_is_limited() {
    let node = FakeNode::new();
    let env = PodEnv::start_with(node.daemon_options("preload")).await;
    let image = env.push_and_pull("gpu", &gpu_image_once()).await.tag_ref();
    let mut cfg = env.pod_config("vgpu-userns");
    let base = 65536 * 301;
    set_pod_userns(&mut cfg, cri::NamespaceMode::Pod, base);
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let id = limited(&env, &pod, &cfg, &image, "limited").await;
    traces.add_container(&id);
    assert_eq!(
        sh_ok(&env, &id, "head -1 /proc/self/uid_map")
            .await
            .split_whitespace()
            .nth(1),
        Some(base.to_string().as_str())
    );
    assert_eq!(nodes(&env, &id).await, expect_nodes(&[0]));
    let out = sh_ok(&env, &id, "cudatest alloc 200 100").await;
    assert_eq!(
        lines(&out, "alloc"),
        ["alloc 200 direct 0", "alloc 100 procaddr 2"],
        "{out}"
    );
    finish(env, &pod, traces).await;
}
