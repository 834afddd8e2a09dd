//! GPU requests, from the pod author: a device-list mount counts as a request only with the
//! source the device plugin sends (`/dev/null`). An `emptyDir` or `hostPath` at that path used to
//! hand the container every GPU node, even with `accept_env_requests = false`. (The fake driver
//! of `crishim_tests::gpu` stands in for a GPU.)

use crishim_proto::cri;
use crishim_tests::gpu::{gpu_image_once, FakeNode};
use crishim_tests::pods::{
    assert_no_leaks, container_config, marker, sh, PodEnv, PodTraces, LOOP_UNTIL_TERM,
};
use tonic::Code;

fn with_device_list(image: &str, name: &str, path: &str, source: &str) -> cri::ContainerConfig {
    let mut c = container_config(name, image, &[]);
    c.command = sh(LOOP_UNTIL_TERM, &marker(name));
    c.mounts.push(cri::Mount {
        container_path: path.into(),
        host_path: source.into(),
        readonly: true,
        ..Default::default()
    });
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_list_mount_grants_gpus_only_from_dev_null() {
    let node = FakeNode::new();
    let opts = node
        .daemon_options("preload")
        .extra_toml("accept_env_requests = false\n");
    let env = PodEnv::start_with(opts).await;
    let image = env.push_and_pull("gpu", &gpu_image_once()).await.tag_ref();
    let cfg = env.pod_config("gpu-door");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let volume = tempfile::tempdir().unwrap();
    let source = volume.path().to_str().unwrap();

    for path in [
        "/var/run/nvidia-container-devices/all",
        "//var/run/nvidia-container-devices//all",
        "/var/run/./nvidia-container-devices/all",
        "/var/lib/../run/nvidia-container-devices/0",
    ] {
        let c = with_device_list(&image, "emptydir", path, source);
        let e = env
            .d
            .create_container(&pod, &c, &cfg)
            .await
            .expect_err("an emptyDir at the device-list path must not create a container");
        assert_eq!(e.code(), Code::InvalidArgument, "{path}: {e:?}");
        assert!(
            e.message().contains(path) && e.message().contains("/dev/null"),
            "{path}: the message names the mount and the source wanted: {}",
            e.message()
        );
    }
    let listed = env.d.list_container_ids(None).await.unwrap();
    assert!(listed.is_empty(), "refused creates left {listed:?}");

    // The device plugin's own form still grants the GPU, with env requests off.
    let c = with_device_list(
        &image,
        "plugin",
        "/var/run/nvidia-container-devices/1",
        "/dev/null",
    );
    let id = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&id);
    let out = env.d.exec_ok(&id, &["/bin/sh", "-c", "ls /dev"]).await;
    assert!(out.lines().any(|l| l == "nvidia1"), "{out}");
    assert!(!out.lines().any(|l| l == "nvidia0"), "{out}");

    traces.capture(&env.d).await;
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}
