//! The SELinux process label, against the pod author's volumes: the shim writes it to
//! `/proc/thread-self/attr/exec` inside the container's mounts, so a volume at `/proc` holding
//! `thread-self/attr/exec` as a regular file would take the write and the workload would run in
//! the shim's domain (runc's CVE-2019-16884). CreateContainer now refuses a CRI mount at `/proc`
//! or `/sys` (or beneath) whose source is not that kernel filesystem, in every spelling of the
//! path; the shim writes labels only through a verified procfs handle besides (its unit tests,
//! `shim/src/lsm_attr.rs`, play the volume against it: this kernel has no SELinux, so no label is
//! asked for here).

use crishim_proto::cri;
use crishim_tests::pods::{assert_no_leaks, sh, PodEnv, PodTraces, LOOP_UNTIL_TERM};
use tonic::Code;

fn with_mount(env: &PodEnv, name: &str, path: &str, source: &str) -> cri::ContainerConfig {
    let mut c = env.container_config(name, &[]);
    c.command = sh(LOOP_UNTIL_TERM, name);
    c.mounts.push(cri::Mount {
        container_path: path.into(),
        host_path: source.into(),
        ..Default::default()
    });
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_cannot_stand_in_for_proc_or_sys() {
    let env = PodEnv::start().await;
    let cfg = env.pod_config("selinux-door");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    // What an init container could leave in an emptyDir: a regular file where the label goes.
    let volume = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(volume.path().join("thread-self/attr")).unwrap();
    std::fs::write(volume.path().join("thread-self/attr/exec"), "").unwrap();
    let source = volume.path().to_str().unwrap();

    for path in [
        "/proc",
        "/proc/",
        "//proc",
        "/proc/../proc",
        "/./proc",
        "/proc/self/attr",
        "/proc/thread-self",
        "/sys/fs/selinux",
        "//sys/fs/selinux/",
        "/sys/fs/../fs/selinux",
        "/sys",
    ] {
        let c = with_mount(&env, "volume", path, source);
        let e = env
            .d
            .create_container(&pod, &c, &cfg)
            .await
            .expect_err("a host directory over /proc or /sys must not create a container");
        assert_eq!(e.code(), Code::InvalidArgument, "{path}: {e:?}");
        assert!(
            e.message().contains(path) && e.message().contains(source),
            "{path}: the message names the mount: {}",
            e.message()
        );
    }
    let filter = cri::ContainerFilter {
        pod_sandbox_id: pod.clone(),
        ..Default::default()
    };
    assert!(
        env.d
            .list_container_ids(Some(filter))
            .await
            .unwrap()
            .is_empty(),
        "a refused container was left behind"
    );
    // The same volume elsewhere is an ordinary volume; and the label attribute the container
    // sees is its own procfs's.
    let c = with_mount(&env, "elsewhere", "/data/proc", source);
    let id = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&id);
    let fs = env
        .d
        .exec_ok(
            &id,
            &["stat", "-f", "-c", "%T", "/proc/thread-self/attr/exec"],
        )
        .await;
    assert_eq!(fs.trim(), "proc", "/proc/thread-self/attr/exec is on {fs}");
    env.d
        .exec_ok(&id, &["test", "-f", "/data/proc/thread-self/attr/exec"])
        .await;

    traces.capture(&env.d).await;
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}
