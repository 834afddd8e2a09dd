//! `Gpus::plan` and `Plan::apply_to` against a fake node (device nodes made with mknod, so root only) and a fake
//! driver root.

use std::path::Path;

use oci_spec::runtime::{Process, Spec};

use super::discover::tests::{fake_node, is_root};
use super::libraries::tests::fake_driver;
use super::request::tests::config;
use super::*;

struct Node {
    _dir: tempfile::TempDir,
    gpus: Gpus,
    state: PathBuf,
    rootfs: PathBuf,
}

impl Drop for Node {
    /// The containers' accounting tmpfs mounts, which the temporary directory cannot remove.
    fn drop(&mut self) {
        let dir = self.state.join("gpu/containers");
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let _ = container::release_accounting(&e.path());
        }
    }
}

fn node(inject: InjectMode) -> Option<Node> {
    if !is_root() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (dev, proc) = fake_node(dir.path(), &[(0, "0000:07:00.0"), (1, "0000:08:00.0")]);
    let driver = dir.path().join("driver");
    fake_driver(&driver);
    let interceptor = dir.path().join("libcrishim_vgpu.so");
    std::fs::write(&interceptor, b"interceptor").unwrap();
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::write(rootfs.join("etc/ld.so.preload"), "/lib/libimage.so\n").unwrap();
    let config = GpuConfig {
        device_root: dev,
        proc_root: proc,
        driver_root: driver,
        vdriver_dir: dir.path().join("vdriver"),
        interceptor: Some(interceptor),
        inject,
        cdi_spec_dirs: vec![dir.path().join("cdi")],
        ..Default::default()
    };
    let state = dir.path().join("state");
    let mut gpus = Gpus::new(&config, &state);
    for g in &mut gpus.inventory.gpus {
        g.memory = Some(1 << 30);
    }
    Some(Node {
        _dir: dir,
        gpus,
        state,
        rootfs,
    })
}

fn container(env: &[(&str, &str)], annotations: &[(&str, &str)]) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "c".into(),
            attempt: 0,
        }),
        ..config(env, annotations)
    }
}

fn base_spec(env: &[&str]) -> Spec {
    let mut s = Spec::default();
    let mut p = Process::default();
    p.set_env(Some(env.iter().map(|s| s.to_string()).collect()));
    s.set_process(Some(p));
    s
}

fn apply(
    n: &Node,
    c: &cri::ContainerConfig,
    image_env: &[String],
    spec: &mut Spec,
) -> Result<Option<Grant>, GpuError> {
    let pod = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "p".into(),
            uid: "uid-1".into(),
            namespace: "ns".into(),
            attempt: 0,
        }),
        ..Default::default()
    };
    let devices = spec_devices(spec);
    plan_and_apply(
        n,
        &Target {
            container_id: "ctr1",
            config: c,
            pod: &pod,
            image_env,
            rootfs: &n.rootfs,
            devices: &devices,
        },
        spec,
    )
}

fn spec_devices(spec: &Spec) -> Vec<oci_spec::runtime::LinuxDevice> {
    spec.linux()
        .as_ref()
        .and_then(|l| l.devices().clone())
        .unwrap_or_default()
}

/// The host step, then the spec's edits: what the container is granted.
fn plan_and_apply(n: &Node, t: &Target<'_>, spec: &mut Spec) -> Result<Option<Grant>, GpuError> {
    let plan = n.gpus.plan(t)?;
    plan.apply_to(spec)?;
    Ok(plan.grant)
}

fn mount<'a>(s: &'a Spec, dest: &str) -> Option<&'a oci_spec::runtime::Mount> {
    s.mounts()
        .as_ref()?
        .iter()
        .find(|m| m.destination() == Path::new(dest))
}

fn device_paths(s: &Spec) -> Vec<String> {
    s.linux()
        .as_ref()
        .and_then(|l| l.devices().clone())
        .unwrap_or_default()
        .iter()
        .map(|d| d.path().display().to_string())
        .collect()
}

#[test]
fn no_request_leaves_the_spec_untouched() {
    let Some(n) = node(InjectMode::Preload) else {
        return;
    };
    let mut spec = base_spec(&["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]);
    let before = serde_json::to_string(&spec).unwrap();
    let image = vec!["NVIDIA_VISIBLE_DEVICES=all".to_string()];
    let c = container(&[("NVIDIA_VISIBLE_DEVICES", "void")], &[]);
    assert!(apply(&n, &c, &image, &mut spec).unwrap().is_none());
    assert_eq!(serde_json::to_string(&spec).unwrap(), before);
    assert!(!n.state.join("gpu/containers/ctr1").exists());
}

#[test]
fn a_gpu_by_index_gets_nodes_driver_and_env() {
    let Some(n) = node(InjectMode::Preload) else {
        return;
    };
    let mut spec = base_spec(&["PATH=/bin", "LD_LIBRARY_PATH=/req"]);
    let image = vec!["LD_LIBRARY_PATH=/opt/image/lib".to_string()];
    let c = container(
        &[("NVIDIA_VISIBLE_DEVICES", "1"), ("LD_LIBRARY_PATH", "/req")],
        &[],
    );
    let g = apply(&n, &c, &image, &mut spec).unwrap().unwrap();
    assert_eq!(g.uuids, ["GPU-c0ffee00-0000-4000-8000-000000000001"]);
    assert_eq!(device_paths(&spec), ["/dev/nvidia1", "/dev/nvidiactl"]);
    let lib = mount(&spec, "/usr/local/nvidia/lib64").unwrap();
    assert!(lib.options().as_ref().unwrap().contains(&"ro".to_string()));
    assert!(lib.source().as_ref().unwrap().join("libcuda.so.1").exists());
    assert!(mount(&spec, "/usr/local/nvidia/bin").is_some());
    let env = |k| inject::env_value(&spec, k).unwrap();
    assert_eq!(
        env("LD_LIBRARY_PATH"),
        "/usr/local/nvidia/lib64:/opt/image/lib:/req"
    );
    assert_eq!(env("PATH"), "/bin:/usr/local/nvidia/bin");
    assert_eq!(
        env("NVIDIA_VISIBLE_DEVICES"),
        "GPU-c0ffee00-0000-4000-8000-000000000001"
    );
    assert_eq!(env("NVIDIA_DRIVER_CAPABILITIES"), "compute,utility");
    // No limit: no interceptor, no preload.
    assert!(mount(&spec, "/etc/ld.so.preload").is_none());
    assert!(inject::env_value(&spec, "CRISHIM_VGPU_MEMORY_LIMIT").is_none());
    assert!(n.state.join("gpu/containers/ctr1/grant.json").is_file());
    n.gpus.release("ctr1");
    assert!(!n.state.join("gpu/containers/ctr1").exists());
}

#[test]
fn none_gives_the_driver_without_devices() {
    let Some(n) = node(InjectMode::Preload) else {
        return;
    };
    let mut spec = base_spec(&[]);
    let g = apply(
        &n,
        &container(&[("NVIDIA_VISIBLE_DEVICES", "none")], &[]),
        &[],
        &mut spec,
    )
    .unwrap()
    .unwrap();
    assert!(g.uuids.is_empty());
    assert!(device_paths(&spec).is_empty());
    assert!(mount(&spec, "/usr/local/nvidia/lib64").is_some());
    assert_eq!(
        inject::env_value(&spec, "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some("none")
    );
}

#[test]
fn limits_in_preload_mode() {
    let Some(n) = node(InjectMode::Preload) else {
        return;
    };
    let mut spec = base_spec(&["PATH=/bin"]);
    let c = container(
        &[(
            "NVIDIA_VISIBLE_DEVICES",
            "GPU-c0ffee00-0000-4000-8000-000000000000",
        )],
        &[
            ("gpu.crishim.io/memory", "256Mi"),
            ("gpu.crishim.io/cores", "50"),
        ],
    );
    let g = apply(&n, &c, &[], &mut spec).unwrap().unwrap();
    assert_eq!(g.memory_limit_bytes, Some(256 << 20));
    assert_eq!(g.core_percent, Some(50));
    let dir = n.state.join("gpu/containers/ctr1");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["memory_limit_bytes"], 256 << 20);
    assert_eq!(config["core_percent"], 50);
    assert_eq!(config["container_id"], "ctr1");
    assert_eq!(config["pod_uid"], "uid-1");
    assert_eq!(config["libcuda"], "/usr/local/nvidia/lib64/libcuda.so.1");
    assert_eq!(config["accounting_file"], "/etc/crishim/vgpu/shared/usage");
    assert_eq!(
        std::fs::read_to_string(dir.join("ld.so.preload")).unwrap(),
        "/etc/crishim/vgpu/libcrishim_vgpu.so\n/lib/libimage.so\n"
    );
    assert!(mount(&spec, "/etc/ld.so.preload").is_some());
    assert!(mount(&spec, "/etc/crishim/vgpu/libcrishim_vgpu.so").is_some());
    assert!(mount(&spec, "/etc/crishim/vgpu/config.json").is_some());
    let shared = mount(&spec, "/etc/crishim/vgpu/shared").unwrap();
    assert!(shared
        .options()
        .as_ref()
        .unwrap()
        .contains(&"rw".to_string()));
    assert_eq!(
        inject::env_value(&spec, "CRISHIM_VGPU_MEMORY_LIMIT").as_deref(),
        Some("268435456")
    );
    assert_eq!(
        inject::env_value(&spec, "CRISHIM_VGPU_CORE_LIMIT").as_deref(),
        Some("50")
    );
    assert_eq!(config["core_policy"], "force");
    assert!(config.get("mps").is_none(), "no MPS on this node");
    assert!(inject::env_value(&spec, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").is_none());
}

/// Where the MPS control daemon runs, a container's limits are also MPS's: the core limit as
/// its active thread percentage, the memory limit per GPU as its pinned device memory limit;
/// and the interceptor is told, so that it measures GPU time without holding launches back.
#[test]
fn under_mps_the_limits_are_passed_to_mps() {
    let Some(n) = node(InjectMode::Preload) else {
        return;
    };
    let pipes = n.gpus.config.driver_root.join("tmp/nvidia-mps");
    std::fs::create_dir_all(&pipes).unwrap();
    std::fs::write(pipes.join("control"), "").unwrap();
    let c = container(
        &[("NVIDIA_VISIBLE_DEVICES", "0")],
        &[
            ("gpu.crishim.io/memory", "768Mi"),
            ("gpu.crishim.io/cores", "30"),
        ],
    );
    let mut spec = base_spec(&[]);
    apply(&n, &c, &[], &mut spec).unwrap().unwrap();
    assert_eq!(
        inject::env_value(&spec, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").as_deref(),
        Some("30")
    );
    assert_eq!(
        inject::env_value(&spec, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").as_deref(),
        Some("0=768MB")
    );
    let dir = n.state.join("gpu/containers/ctr1");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["mps"], true);
    n.gpus.release("ctr1");
}

#[test]
fn limits_in_replace_mode_use_the_shared_tree() {
    let Some(n) = node(InjectMode::Replace) else {
        return;
    };
    let mut spec = base_spec(&[]);
    let c = container(
        &[("NVIDIA_VISIBLE_DEVICES", "all")],
        &[("tencent.com/vcuda-memory", "2")],
    );
    let g = apply(&n, &c, &[], &mut spec).unwrap().unwrap();
    assert_eq!(g.uuids.len(), 2);
    assert_eq!(g.memory_limit_bytes, Some(512 << 20));
    let lib = mount(&spec, "/usr/local/nvidia/lib64")
        .unwrap()
        .source()
        .clone()
        .unwrap();
    let fwd = std::fs::read(lib.join("libcuda.so.1")).unwrap();
    assert!(String::from_utf8_lossy(&fwd).contains("libcrishim_vgpu.so"));
    assert!(mount(&spec, "/usr/local/nvidia/origin/lib64").is_some());
    assert!(mount(&spec, "/etc/ld.so.preload").is_none());
    let config = std::fs::read_to_string(n.state.join("gpu/containers/ctr1/config.json")).unwrap();
    assert!(
        config.contains("/usr/local/nvidia/origin/lib64/libcuda.so.1"),
        "{config}"
    );
}

#[test]
fn bad_requests_name_the_bad_value() {
    let Some(n) = node(InjectMode::Preload) else {
        return;
    };
    for (env, annotations, needle) in [
        ("7", vec![], "unknown GPU index 7"),
        ("GPU-nope", vec![], "unknown GPU UUID \"GPU-nope\""),
        (
            "0",
            vec![("gpu.crishim.io/memory", "2Gi")],
            "\"2Gi\" (2147483648 bytes) is larger than GPU 0",
        ),
        (
            "0",
            vec![("gpu.crishim.io/cores", "150")],
            "\"150\" is larger than one GPU",
        ),
        (
            "void",
            vec![("gpu.crishim.io/memory", "1Gi")],
            "requests no GPU",
        ),
        (
            "none",
            vec![("gpu.crishim.io/memory", "1Gi")],
            "granted none",
        ),
    ] {
        let mut spec = base_spec(&[]);
        let c = container(&[("NVIDIA_VISIBLE_DEVICES", env)], &annotations);
        let e = apply(&n, &c, &[], &mut spec).unwrap_err();
        assert!(matches!(e, GpuError::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains(needle), "{e} lacks {needle}");
    }
    // A pod-wide limit does not touch the pod's other containers, GPU-less or driver-only.
    let pod = cri::PodSandboxConfig {
        annotations: [("gpu.crishim.io/memory".to_string(), "1Gi".to_string())].into(),
        ..Default::default()
    };
    let mut spec = base_spec(&[]);
    let c = container(&[], &[]);
    let t = Target {
        container_id: "sidecar",
        config: &c,
        pod: &pod,
        image_env: &[],
        rootfs: Path::new("/nonexistent"),
        devices: &[],
    };
    assert!(plan_and_apply(&n, &t, &mut spec).unwrap().is_none());
    let c = container(&[("NVIDIA_VISIBLE_DEVICES", "none")], &[]);
    let t = Target { config: &c, ..t };
    let g = plan_and_apply(&n, &t, &mut spec).unwrap().unwrap();
    assert_eq!(g.memory_limit_bytes, None);
    n.gpus.release("sidecar");
}

#[test]
fn cri_gpu_devices_are_requests() {
    let Some(n) = node(InjectMode::Preload) else {
        return;
    };
    let host = n.gpus.inventory.by_minor(0).unwrap().path.clone();
    let mut c = container(&[], &[]);
    c.devices = vec![cri::Device {
        container_path: "/dev/nvidia0".into(),
        host_path: host.display().to_string(),
        permissions: "rw".into(),
    }];
    let mut spec = base_spec(&[]);
    let g = apply(&n, &c, &[], &mut spec).unwrap().unwrap();
    assert_eq!(g.uuids, ["GPU-c0ffee00-0000-4000-8000-000000000000"]);
    assert!(device_paths(&spec).contains(&"/dev/nvidiactl".to_string()));
}

/// The MPS pipe directory sits in `/tmp`: one a host user made first (and could swap for a
/// symlink before the bind) is not handed to GPU containers; root's is, writable.
#[test]
fn a_toolkit_directory_root_does_not_own_is_not_passed_on() {
    let Some(n) = node(InjectMode::Preload) else {
        return;
    };
    let mps = n.gpus.config.driver_root.join("tmp/nvidia-mps");
    std::fs::create_dir_all(&mps).unwrap();
    let c = container(&[("NVIDIA_VISIBLE_DEVICES", "0")], &[]);
    let mut spec = base_spec(&[]);
    apply(&n, &c, &[], &mut spec).unwrap().unwrap();
    let m = mount(&spec, "/tmp/nvidia-mps").expect("root's MPS directory is passed on");
    assert!(m.options().as_ref().unwrap().contains(&"rw".to_string()));
    n.gpus.release("ctr1");

    std::os::unix::fs::lchown(&mps, Some(65534), Some(65534)).unwrap();
    let mut spec = base_spec(&[]);
    apply(&n, &c, &[], &mut spec).unwrap().unwrap();
    assert!(mount(&spec, "/tmp/nvidia-mps").is_none());
    n.gpus.release("ctr1");
}

/// CDI devices grant the GPUs whose nodes the spec has once they are applied: their own, and
/// those already among the spec's devices (`Target::devices`).
#[test]
fn cdi_devices_grant_the_gpus_among_the_specs_devices() {
    let Some(n) = node(InjectMode::Preload) else {
        return;
    };
    let dir = &n.gpus.config.cdi_spec_dirs[0];
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("test.yaml"),
        r#"cdiVersion: "0.6.0"
kind: "crishim.test/dev"
devices:
  - name: "gpu1"
    containerEdits:
      deviceNodes:
        - path: "/dev/nvidia1"
          type: "c"
          major: 195
          minor: 1
  - name: "other"
    containerEdits:
      env:
        - "FROM_CDI=other"
"#,
    )
    .unwrap();
    let with_cdi = |name: &str| cri::ContainerConfig {
        cdi_devices: vec![cri::CdiDevice {
            name: format!("crishim.test/dev={name}"),
        }],
        ..container(&[], &[])
    };
    let mut spec = base_spec(&[]);
    let g = apply(&n, &with_cdi("gpu1"), &[], &mut spec)
        .unwrap()
        .unwrap();
    assert_eq!(g.uuids, ["GPU-c0ffee00-0000-4000-8000-000000000001"]);
    n.gpus.release("ctr1");

    // A device that is no GPU grants none: its edits are made all the same.
    let mut spec = base_spec(&[]);
    assert!(apply(&n, &with_cdi("other"), &[], &mut spec)
        .unwrap()
        .is_none());
    assert_eq!(
        inject::env_value(&spec, "FROM_CDI").as_deref(),
        Some("other")
    );
    // With a GPU's node already in the spec, that GPU is granted.
    let mut spec = base_spec(&[]);
    let gpu0 = n
        .gpus
        .inventory
        .node(n.gpus.inventory.by_minor(0).unwrap())
        .unwrap();
    inject::add_device(&mut spec, &gpu0).unwrap();
    let g = apply(&n, &with_cdi("other"), &[], &mut spec)
        .unwrap()
        .unwrap();
    assert_eq!(g.uuids, ["GPU-c0ffee00-0000-4000-8000-000000000000"]);
    n.gpus.release("ctr1");
}
