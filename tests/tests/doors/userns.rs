//! User namespaces, from the pod author: what crishim injects of the node's into a
//! `hostUsers: false` pod (the GPU driver mirror, whose files are hardlinks to the node's driver
//! files; the interceptor; `crishim-init`) used to be idmapped like the pod's volumes, with its
//! read-only flag applied inside the pod's user namespace. Root in a GPU container with
//! `CAP_SYS_ADMIN` (namespaced, meant to be harmless) remounted the driver directory writable
//! and appended to the node's `libcuda`. Only the CRI volumes are the pod's to own.
//!
//! There is no GPU here: the fake driver of `crishim_tests::gpu` stands in for one (its
//! `libcuda.so` in a fake driver root is the node's driver file), and crishim is not faked.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use crishim_proto::cri;
use crishim_tests::gpu::{gpu_image_once, FakeNode, DRIVER_VERSION};
use crishim_tests::pods::{
    container_config, container_security, marker, set_pod_userns, sh, PodEnv, PodTraces,
    LOOP_UNTIL_TERM,
};

use super::sh_in;

/// What must not change of the node's driver file: inode, size, mtime and a digest of its bytes.
#[derive(Debug, PartialEq, Eq)]
struct FileState {
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    digest: u64,
}

fn state_of(path: &Path) -> FileState {
    let md = std::fs::metadata(path).unwrap();
    FileState {
        ino: md.ino(),
        size: md.size(),
        mtime: (md.mtime(), md.mtime_nsec()),
        digest: {
            use std::hash::{Hash as _, Hasher as _};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            std::fs::read(path).unwrap().hash(&mut h);
            h.finish()
        },
    }
}

/// The node's real `libcuda.so.<version>` under the fake driver root.
fn node_libcuda(node: &FakeNode) -> PathBuf {
    let name = format!("libcuda.so.{DRIVER_VERSION}");
    crishim_tests::fsutil::walk(&node.driver_root())
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == name.as_str()) && p.is_file())
        .unwrap_or_else(|| panic!("no {name} under the fake driver root"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_namespace_pod_cannot_remount_or_write_the_nodes_gpu_driver() {
    let node = FakeNode::new();
    let libcuda = node_libcuda(&node);
    let before = state_of(&libcuda);
    let env = PodEnv::start_with(node.daemon_options("preload")).await;
    let image = env.push_and_pull("gpu", &gpu_image_once()).await.tag_ref();
    let base = 65536 * 307;
    let mut cfg = env.pod_config("userns-gpu-door");
    set_pod_userns(&mut cfg, cri::NamespaceMode::Pod, base);
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);

    // An emptyDir as the kubelet makes it (root's, 0777): the pod's to own.
    let volume = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        volume.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mut c = container_config("gpu", &image, &[]);
    c.command = sh(LOOP_UNTIL_TERM, &marker("userns-gpu-door"));
    c.envs.push(cri::KeyValue {
        key: "NVIDIA_VISIBLE_DEVICES".into(),
        value: "0".into(),
    });
    // A limit, so the interceptor is injected too.
    c.annotations
        .insert("gpu.crishim.io/memory".into(), "256Mi".into());
    // crishim-init is injected only where a static one was built (hack/test.sh sets it).
    let with_init = std::env::var_os("CRISHIM_INIT_BIN").is_some();
    if with_init {
        c.annotations
            .insert("crishim.io/init".into(), "true".into());
    } else {
        eprintln!("CRISHIM_INIT_BIN is not set: /.crishim/init is not tried");
    }
    c.mounts.push(cri::Mount {
        container_path: "/data".into(),
        host_path: volume.path().to_string_lossy().into_owned(),
        ..Default::default()
    });
    container_security(&mut c).capabilities = Some(cri::Capability {
        add_capabilities: vec!["CAP_SYS_ADMIN".into()],
        ..Default::default()
    });
    let id = env
        .d
        .run_container(&pod, &c, &cfg)
        .await
        .unwrap_or_else(|e| panic!("a GPU container in a hostUsers: false pod: {e:?}"));
    traces.add_container(&id);

    // Root of the pod's user namespace, with CAP_SYS_ADMIN there.
    let (code, out) = sh_in(
        &env,
        &id,
        "head -1 /proc/self/uid_map; id -u; grep CapEff /proc/self/status",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(&words[..4], ["0", &base.to_string(), "65536", "0"], "{out}");
    let cap_eff = u64::from_str_radix(words[5], 16).unwrap();
    assert_ne!(cap_eff & (1 << 21), 0, "CAP_SYS_ADMIN in the pod: {out}");

    // The control: that root may remount its own volume (read-only and back), so a refusal
    // below is the lock on the node's mounts, not a missing capability or a filter.
    let (code, out) = sh_in(
        &env,
        &id,
        "mount -o remount,bind,ro /data && mount -o remount,bind,rw /data && echo v > /data/file",
    )
    .await;
    assert_eq!(code, 0, "remounting the pod's own volume: {out}");

    let mut injected = vec![
        "/usr/local/nvidia/lib64",
        "/usr/local/nvidia/bin",
        "/etc/crishim/vgpu/libcrishim_vgpu.so",
        "/etc/crishim/vgpu/config.json",
    ];
    if with_init {
        injected.push("/.crishim/init");
    }
    for path in &injected {
        let (code, out) = sh_in(&env, &id, &format!("mount -o remount,bind,rw {path}")).await;
        assert_ne!(code, 0, "remounted {path} writable: {out}");
        assert!(
            out.to_lowercase().contains("permission denied"),
            "remounting {path} writable must fail with EPERM: {out}"
        );
        // A bind of it keeps the lock.
        let (code, out) = sh_in(
            &env,
            &id,
            &format!(
                "if [ -d {path} ]; then t=/tmp/again.d; mkdir -p $t; else t=/tmp/again.f; \
                 touch $t; fi; mount --bind {path} $t || exit 100; \
                 mount -o remount,bind,rw $t; r=$?; umount $t; exit $r"
            ),
        )
        .await;
        assert!(
            code != 0 && code != 100,
            "a bind of {path} (exit {code}, 100: not bound): {out}"
        );
    }
    // Writing the driver through the mirror: refused, whatever the mount flags say.
    for target in [
        "/usr/local/nvidia/lib64/libcuda.so.1".to_string(),
        format!("/usr/local/nvidia/lib64/libcuda.so.{DRIVER_VERSION}"),
    ] {
        let (code, out) = sh_in(&env, &id, &format!("echo pwned >> {target}")).await;
        assert_ne!(code, 0, "appended to {target}: {out}");
        let (code, out) = sh_in(
            &env,
            &id,
            &format!("mount -o remount,bind,rw /usr/local/nvidia/lib64; echo pwned >> {target}"),
        )
        .await;
        assert_ne!(code, 0, "remounted and appended to {target}: {out}");
    }
    assert_eq!(
        state_of(&libcuda),
        before,
        "the node's driver file {} changed",
        libcuda.display()
    );

    // The injected files are host root's, so nobody (the overflow id) inside, not the pod
    // root's; the pod's volume is idmapped: root's on the host is the pod root's.
    let overflow = std::fs::read_to_string("/proc/sys/kernel/overflowuid").unwrap();
    let overflow = overflow.trim();
    for path in injected
        .iter()
        .copied()
        .chain(["/usr/local/nvidia/lib64/libcuda.so.1"])
    {
        let (code, out) = sh_in(&env, &id, &format!("stat -L -c '%u %g' {path}")).await;
        assert_eq!(code, 0, "{path}: {out}");
        assert_eq!(
            out.trim(),
            format!("{overflow} {overflow}"),
            "{path} must not be the pod root's"
        );
    }
    let (code, out) = sh_in(&env, &id, "stat -c '%u %g' /data /data/file").await;
    assert_eq!((code, out.as_str()), (0, "0 0\n0 0\n"), "{out}");
    assert_eq!(
        std::fs::metadata(volume.path().join("file")).unwrap().uid(),
        0,
        "written through the idmapped volume as the pod's root"
    );

    // The driver still works from there, limit and all.
    let (code, out) = sh_in(&env, &id, "cudatest alloc 200 100").await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        crishim_tests::gpu::lines(&out, "alloc"),
        ["alloc 200 direct 0", "alloc 100 procaddr 2"],
        "{out}"
    );
    assert_eq!(state_of(&libcuda), before);
    env.finish_pod(&pod, traces).await;
}
