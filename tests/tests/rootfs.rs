//! Image layers as container root filesystems, and the image store's bookkeeping around them:
//! overlayfs over real pulled layers (whiteouts, many layers, read-only), blobs fetched once for
//! concurrent pulls, a pull killed halfway, and garbage collection that never takes a layer a
//! container still uses.

use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::fixtures::multi_layer_image;
use crishim_tests::image::digest_hex;
use crishim_tests::image::{busybox_layer, Compression, Image, LayerBuilder};
use crishim_tests::pods::{assert_no_leaks, container_security, PodEnv, PodTraces};
use crishim_tests::{Daemon, DaemonOptions, Registry};

const SLEEP: &[&str] = &["sh", "-c", "sleep 3600"];

/// Run one container of `image` in a fresh pod; returns (pod, container, traces).
async fn run(env: &PodEnv, name: &str, image: &str, readonly: bool) -> (String, String, PodTraces) {
    let mut cfg = crishim_tests::pods::container_config(name, image, SLEEP);
    let sc = container_security(&mut cfg);
    sc.readonly_rootfs = readonly;
    // As root, so writes are limited by the filesystem, not by file permissions.
    sc.run_as_user = Some(cri::Int64Value { value: 0 });
    env.run_traced(&env.pod_config(name), &cfg).await
}

async fn teardown(env: &PodEnv, pod: &str, traces: &PodTraces) {
    env.d.stop_pod(pod).await.expect("StopPodSandbox");
    env.d.remove_pod(pod).await.expect("RemovePodSandbox");
    assert_no_leaks(&env.d, traces).await;
}

/// Every entry directly under one of the store's directories.
fn names_in(dir: std::path::PathBuf) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test]
async fn overlay_rootfs_of_a_three_layer_image_shows_its_files_and_hides_whiteouts() {
    let env = PodEnv::start().await;
    let img = env.push_and_pull("multi", &multi_layer_image()).await;
    let (pod, ctr, traces) = run(&env, "overlay", &img.tag_ref(), false).await;

    // Layer 2 wrote a, b, dir/x; layer 3 whited out b, made dir opaque and added dir/y.
    assert_eq!(
        env.d
            .exec_ok(&ctr, &["ls", "/data"])
            .await
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["a", "dir", "owned"]
    );
    assert_eq!(
        env.d.exec_ok(&ctr, &["ls", "-A", "/data/dir"]).await.trim(),
        "y"
    );
    assert_eq!(env.d.exec_ok(&ctr, &["cat", "/data/a"]).await, "a\n");
    assert_eq!(
        env.d
            .exec_ok(&ctr, &["stat", "-c", "%u:%g %a", "/data/owned"])
            .await
            .trim(),
        "1000:1000 640"
    );
    let r = env
        .d
        .exec_sync(&ctr, &["cat", "/data/b"], 10)
        .await
        .expect("ExecSync");
    assert_ne!(r.exit_code, 0, "a whited-out file must not be visible");

    // Writes go to the container's own upper dir, never into the shared layers.
    env.d
        .exec_ok(&ctr, &["sh", "-c", "echo new > /data/new && rm /data/a"])
        .await;
    let upper = env
        .d
        .root_dir()
        .join("images/containers")
        .join(&ctr)
        .join("upper");
    assert_eq!(
        std::fs::read_to_string(upper.join("data/new")).unwrap(),
        "new\n"
    );
    let layer2 = env
        .d
        .root_dir()
        .join("images/snapshots")
        .join(digest_hex(&img.chain_ids[1]));
    assert!(
        layer2.join("data/a").is_file(),
        "the lower layer keeps its file"
    );
    assert!(!layer2.join("data/new").exists());

    teardown(&env, &pod, &traces).await;
    assert!(
        !upper.exists(),
        "the writable layer goes with the container"
    );
    env.stop();
}

#[tokio::test]
async fn images_with_more_layers_than_one_page_of_mount_options_run() {
    const LAYERS: usize = 120;
    let env = PodEnv::start().await;
    let mut layers = vec![busybox_layer()];
    for i in 0..LAYERS {
        layers.push(
            LayerBuilder::new()
                .dir("layers", 0o755)
                .file(&format!("layers/{i}"), format!("{i}\n"), 0o644)
                .build(Compression::Gzip),
        );
    }
    // The last layer replaces what the first one wrote: the stack order must be right.
    layers.push(
        LayerBuilder::new()
            .dir("layers", 0o755)
            .file("layers/0", "top\n", 0o644)
            .build(Compression::None),
    );
    let img = env.push_and_pull("many", &Image::new(layers)).await;
    // 122 snapshot paths of 80+ bytes each do not fit in a 4 KiB option string.
    let snap = env
        .d
        .root_dir()
        .join("images/snapshots")
        .join(digest_hex(&img.chain_ids[0]));
    assert!(snap.to_string_lossy().len() * (LAYERS + 2) > 4096);

    let (pod, ctr, traces) = run(&env, "many", &img.tag_ref(), false).await;
    assert_eq!(
        env.d
            .exec_ok(&ctr, &["sh", "-c", "ls /layers | wc -l"])
            .await
            .trim(),
        LAYERS.to_string()
    );
    assert_eq!(env.d.exec_ok(&ctr, &["cat", "/layers/0"]).await, "top\n");
    assert_eq!(
        env.d
            .exec_ok(&ctr, &["cat", &format!("/layers/{}", LAYERS - 1)])
            .await,
        format!("{}\n", LAYERS - 1)
    );
    teardown(&env, &pod, &traces).await;
    env.stop();
}

#[tokio::test]
async fn read_only_root_filesystems_refuse_writes() {
    let env = PodEnv::start().await;
    let (pod, ctr, traces) = run(&env, "ro", &env.image(), true).await;
    let r = env
        .d
        .exec_sync(&ctr, &["touch", "/written"], 10)
        .await
        .expect("ExecSync");
    assert_ne!(r.exit_code, 0, "touch on a read-only rootfs must fail");
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("Read-only"),
        "stderr: {:?}",
        String::from_utf8_lossy(&r.stderr)
    );
    teardown(&env, &pod, &traces).await;
    env.stop();
}

#[tokio::test]
async fn concurrent_pulls_of_one_image_fetch_each_blob_once() {
    let reg = Registry::start(Default::default()).await.unwrap();
    let big = LayerBuilder::new()
        .file("big", random_bytes(8 << 20), 0o644)
        .build(Compression::Gzip);
    let img = reg
        .push("dedup", "latest", &Image::new(vec![busybox_layer(), big]))
        .await
        .unwrap();
    let d = Daemon::start(DaemonOptions::new()).await.unwrap();
    let r = img.tag_ref();
    let (a, b) = tokio::join!(d.pull(&r), d.pull(&r));
    assert_eq!(a.unwrap(), img.image_id());
    assert_eq!(b.unwrap(), img.image_id());
    let log = reg.log_text();
    for layer in &img.layer_digests {
        let gets = log
            .matches(&format!("GET /v2/dedup/blobs/{layer} "))
            .count();
        assert_eq!(gets, 1, "layer {layer} was fetched {gets} times");
    }
    d.stop();
}

#[tokio::test]
async fn a_pull_killed_halfway_leaves_no_image_and_start_up_collects_its_files() {
    let reg = Registry::start(Default::default()).await.unwrap();
    let mut layers = vec![busybox_layer()];
    for _ in 0..4 {
        layers.push(
            LayerBuilder::new()
                .file("blob", random_bytes(12 << 20), 0o644)
                .build(Compression::None),
        );
    }
    let img = reg
        .push("killed", "latest", &Image::new(layers))
        .await
        .unwrap();
    let mut d = Daemon::start(DaemonOptions::new()).await.unwrap();
    let store = d.root_dir().join("images");

    let mut client = d.image_client();
    let pull = tokio::spawn({
        let r = img.tag_ref();
        async move {
            client
                .pull_image(cri::PullImageRequest {
                    image: Some(crishim_tests::cri::spec(&r)),
                    ..Default::default()
                })
                .await
        }
    });
    // Kill it once some layer is on disk but before the pull is done.
    let deadline = Instant::now() + Duration::from_secs(30);
    while names_in(store.join("blobs/sha256")).is_empty()
        && names_in(store.join("ingest")).is_empty()
    {
        assert!(Instant::now() < deadline, "the pull never started writing");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    d.kill();
    let _ = pull.await;
    let half_done =
        names_in(store.join("blobs/sha256")).len() + names_in(store.join("ingest")).len();
    assert!(half_done > 0, "the kill should have caught files on disk");

    d.restart().await.unwrap();
    assert!(
        d.list_images(None).await.unwrap().is_empty(),
        "no half-registered image"
    );
    assert!(names_in(store.join("ingest")).is_empty());
    assert!(
        names_in(store.join("blobs/sha256")).is_empty(),
        "unreferenced blobs are collected at start-up"
    );
    assert_eq!(names_in(store.join("snapshots")), ["tmp"]);
    assert!(names_in(store.join("snapshots/tmp")).is_empty());

    // And the same image pulls cleanly afterwards.
    assert_eq!(d.pull(&img.tag_ref()).await.unwrap(), img.image_id());
    d.stop();
}

#[tokio::test]
async fn removing_an_image_collects_its_layers_except_those_a_container_uses() {
    let env = PodEnv::start().await;
    let img = env.push_and_pull("gc", &multi_layer_image()).await;
    let snaps = env.d.root_dir().join("images/snapshots");
    let blobs = env.d.root_dir().join("images/blobs/sha256");
    let own = digest_hex(&img.chain_ids[2]).to_string();
    let shared = digest_hex(&img.chain_ids[0]).to_string(); // busybox, also used by the busybox image
    let (pod, ctr, traces) = run(&env, "gc", &img.tag_ref(), false).await;

    env.d
        .remove_image(img.image_id())
        .await
        .expect("RemoveImage");
    assert!(
        !blobs.join(digest_hex(&img.config_digest)).exists(),
        "the config blob is collected"
    );
    assert!(
        snaps.join(&own).is_dir(),
        "a layer in use by a container is kept"
    );
    assert_eq!(env.d.exec_ok(&ctr, &["cat", "/data/dir/y"]).await, "y\n");

    env.d.remove_container(&ctr).await.expect("RemoveContainer");
    assert!(
        !snaps.join(&own).exists(),
        "released with its last container"
    );
    assert!(
        snaps.join(&shared).is_dir(),
        "a layer another image uses stays"
    );
    teardown(&env, &pod, &traces).await;
    env.stop();
}

fn random_bytes(n: usize) -> Vec<u8> {
    // Incompressible, so sizes on the wire are what the test says.
    let mut out = vec![0u8; n];
    let mut f = std::fs::File::open("/dev/urandom").unwrap();
    std::io::Read::read_exact(&mut f, &mut out).unwrap();
    out
}

/// Image volumes (KEP-4639): a `Mount` naming an image mounts that image read-only and `noexec`;
/// `image_sub_path` picks a directory inside it, and cannot climb out through a symlink; the
/// image cannot be removed while the volume is mounted; a volume image that was not pulled is
/// `NotFound`; nothing is left mounted after the pod goes.
#[tokio::test]
async fn image_volumes_are_read_only_noexec_and_hold_their_image() {
    let env = PodEnv::start().await;
    let model = Image::new(vec![LayerBuilder::new()
        .dir("models", 0o755)
        .file("models/weights.bin", b"w8s".to_vec(), 0o644)
        .file("models/run.sh", b"#!/bin/sh\necho ran\n".to_vec(), 0o755)
        .symlink("escape", "../../../../../../etc")
        .build(Compression::Gzip)]);
    let pushed = env.push_and_pull("model", &model).await;
    let volume = |path: &str, sub: &str| cri::Mount {
        container_path: path.to_string(),
        image: Some(cri::ImageSpec {
            image: pushed.tag_ref(),
            ..Default::default()
        }),
        image_sub_path: sub.to_string(),
        ..Default::default()
    };
    let mut cfg = crishim_tests::pods::container_config("vol", &env.image(), SLEEP);
    container_security(&mut cfg).run_as_user = Some(cri::Int64Value { value: 0 });
    cfg.mounts = vec![volume("/model", ""), volume("/weights", "models")];
    let pod_cfg = env.pod_config("vol");
    let (pod, id, traces) = env.run_traced(&pod_cfg, &cfg).await;

    let d = &env.d;
    assert_eq!(
        d.exec_ok(&id, &["cat", "/model/models/weights.bin"]).await,
        "w8s"
    );
    assert_eq!(
        d.exec_ok(&id, &["cat", "/weights/weights.bin"]).await,
        "w8s"
    );
    let write = d
        .exec_sync(&id, &["touch", "/weights/new"], 10)
        .await
        .unwrap();
    assert_ne!(write.exit_code, 0, "an image volume is read-only");
    // Refused by the kernel: the exec fails (as runc's does) rather than running the script.
    match d.exec_sync(&id, &["/weights/run.sh"], 10).await {
        Ok(r) => assert_ne!(r.exit_code, 0, "an image volume is noexec: {r:?}"),
        Err(e) => {
            assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
            assert!(!e.message().contains('\0'), "{e:?}");
        }
    }
    let mounts = d.exec_ok(&id, &["cat", "/proc/self/mounts"]).await;
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == Some("/weights"))
        .unwrap_or_else(|| panic!("/weights not mounted: {mounts}"));
    for opt in ["ro", "nosuid", "nodev", "noexec"] {
        assert!(
            line.split(' ').nth(3).unwrap().split(',').any(|o| o == opt),
            "{line}"
        );
    }

    let e = d.remove_image(&pushed.tag_ref()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("image volume"), "{e:?}");

    // A sub-path whose symlink climbs stays inside the image: the host's /etc is not reached.
    let mut escape = crishim_tests::pods::container_config("escape", &env.image(), SLEEP);
    escape.mounts = vec![volume("/esc", "escape")];
    match d.create_container(&pod, &escape, &pod_cfg).await {
        Ok(c) => {
            d.start_container(&c).await.unwrap();
            let ls = d.exec_ok(&c, &["ls", "/esc"]).await;
            assert!(
                !ls.contains("passwd"),
                "the host's /etc leaked into the volume: {ls}"
            );
            d.stop_container(&c, 0).await.unwrap();
            d.remove_container(&c).await.unwrap();
        }
        Err(e) => assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}"),
    }
    let mut missing = crishim_tests::pods::container_config("missing", &env.image(), SLEEP);
    missing.mounts = vec![cri::Mount {
        container_path: "/m".into(),
        image: Some(cri::ImageSpec {
            image: "nosuch/image:1".into(),
            ..Default::default()
        }),
        ..Default::default()
    }];
    let e = d
        .create_container(&pod, &missing, &pod_cfg)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    teardown(&env, &pod, &traces).await;
    // With the volume gone, the image can go.
    d.remove_image(&pushed.tag_ref())
        .await
        .expect("RemoveImage after the pod");
    env.stop();
}
