//! The CRI ImageService of the `crishim` daemon, against a real `docker-registry`.
//!
//! Every test starts its own registry and daemon (tests run in parallel). The daemon binary is
//! `$CRISHIM_BIN` or `target/<profile>/crishim` (build it with `cargo build -p crishim`).

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::Path;
use std::time::Duration;

use crishim_proto::cri;
use crishim_tests::cri::{basic_auth, encoded_auth};
use crishim_tests::daemon::serve_expecting_exit;
use crishim_tests::fixtures;
use crishim_tests::fsutil::{dir_entries, lgetxattr, paths_named_like, snapshot_dirs, walk};
use crishim_tests::image::{digest_hex, foreign_arch, host_arch, Compression, Index};
use crishim_tests::{
    busybox_image, random_hex, Daemon, DaemonOptions, Image, PushedImage, Registry, RegistryOptions,
};
use tonic::Code;

async fn registry() -> Registry {
    Registry::start(RegistryOptions::default())
        .await
        .expect("starting docker-registry")
}

async fn daemon(opts: DaemonOptions) -> Daemon {
    Daemon::start(opts).await.expect("starting crishim serve")
}

async fn push(reg: &Registry, repo: &str, tag: &str, image: &Image) -> PushedImage {
    reg.push(repo, tag, image)
        .await
        .expect("pushing test image")
}

/// The only image record `list` holds for `id`.
fn find<'a>(list: &'a [cri::Image], id: &str) -> &'a cri::Image {
    let found: Vec<_> = list.iter().filter(|i| i.id == id).collect();
    assert_eq!(found.len(), 1, "expected one image {id} in {list:#?}");
    found[0]
}

fn assert_code(err: &tonic::Status, code: Code) {
    assert_eq!(err.code(), code, "unexpected status: {err:?}");
}

fn assert_message_mentions(err: &tonic::Status, any_of: &[&str]) {
    let m = err.message().to_lowercase();
    assert!(
        any_of.iter().any(|w| m.contains(&w.to_lowercase())),
        "error message {:?} mentions none of {any_of:?}",
        err.message()
    );
}

/// After a failed pull of `reference` whose bad blob is `bad_digest`: no image record, no file
/// or directory named after the blob anywhere under the root dir, empty staging directories.
async fn assert_nothing_stored(d: &Daemon, reference: &str, bad_digest: &str) {
    let images = d.list_images(None).await.expect("ListImages");
    assert!(
        images.is_empty(),
        "a failed pull of {reference} left image records: {images:#?}"
    );
    assert!(d
        .image_status(reference)
        .await
        .expect("ImageStatus")
        .is_none());
    let root = d.root_dir();
    let hex = digest_hex(bad_digest);
    let leftovers = paths_named_like(&root, hex);
    assert!(
        leftovers.is_empty(),
        "the bad blob {bad_digest} left {leftovers:?}"
    );
    for staging in ["images/ingest", "images/snapshots/tmp"] {
        let entries = dir_entries(&root.join(staging));
        assert!(
            entries.is_empty(),
            "{staging} is not empty after a failed pull: {entries:?}"
        );
    }
}

/// Recursively look for a `"Cmd"` key whose value is `cmd`.
fn json_has_cmd(v: &serde_json::Value, cmd: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Object(m) => m.iter().any(|(k, val)| {
            (k.eq_ignore_ascii_case("cmd") && val == cmd) || json_has_cmd(val, cmd)
        }),
        serde_json::Value::Array(a) => a.iter().any(|x| json_has_cmd(x, cmd)),
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Pull, list, status, remove

#[tokio::test]
async fn pull_by_tag_list_status_remove_and_repull_by_digest_then_remove_by_id() {
    let reg = registry().await;
    let p = push(&reg, "busybox", "latest", &busybox_image().user("1000")).await;
    let d = daemon(DaemonOptions::new()).await;

    let image_ref = d.pull(&p.tag_ref()).await.expect("pull by tag");
    assert_eq!(
        image_ref,
        p.image_id(),
        "PullImage must return the config digest"
    );

    let list = d.list_images(None).await.unwrap();
    assert_eq!(list.len(), 1, "{list:#?}");
    let rec = find(&list, p.image_id());
    assert_eq!(rec.repo_tags, vec![p.tag_ref()]);
    assert_eq!(rec.repo_digests, vec![p.digest_ref()]);
    assert!(rec.size > 0, "size is 0");
    assert_eq!(rec.uid.as_ref().map(|u| u.value), Some(1000));

    for r in [p.tag_ref(), p.image_id().to_string(), p.digest_ref()] {
        let st = d.image_status(&r).await.unwrap();
        assert_eq!(
            st.map(|i| i.id).as_deref(),
            Some(p.image_id()),
            "ImageStatus({r})"
        );
    }

    d.remove_image(&p.tag_ref()).await.expect("remove by tag");
    assert!(d.list_images(None).await.unwrap().is_empty());
    assert!(d.image_status(p.image_id()).await.unwrap().is_none());
    assert!(d.image_status(&p.tag_ref()).await.unwrap().is_none());

    let image_ref = d.pull(&p.digest_ref()).await.expect("re-pull by digest");
    assert_eq!(image_ref, p.image_id());
    let st = d
        .image_status(&p.digest_ref())
        .await
        .unwrap()
        .expect("status by digest");
    assert!(st.repo_digests.contains(&p.digest_ref()), "{st:#?}");
    d.remove_image(&p.digest_ref())
        .await
        .expect("remove by digest reference");
    assert!(d.list_images(None).await.unwrap().is_empty());

    assert_eq!(d.pull(&p.tag_ref()).await.unwrap(), p.image_id());
    d.remove_image(p.image_id()).await.expect("remove by ID");
    assert!(d.list_images(None).await.unwrap().is_empty());
    assert!(d.image_status(&p.tag_ref()).await.unwrap().is_none());
    d.stop();
}

#[tokio::test]
async fn verbose_image_status_info_holds_the_config_cmd() {
    let reg = registry().await;
    let cmd = ["/bin/sh", "-c", "echo crishim-verbose-marker"];
    let p = push(&reg, "busybox", "latest", &busybox_image().cmd(&cmd)).await;
    let d = daemon(DaemonOptions::new()).await;
    d.pull(&p.tag_ref()).await.unwrap();

    let resp = d.image_status_full(p.image_id(), true).await.unwrap();
    assert_eq!(
        resp.image.as_ref().map(|i| i.id.as_str()),
        Some(p.image_id())
    );
    let info = resp
        .info
        .get("info")
        .expect("verbose status has info[\"info\"]");
    let v: serde_json::Value = serde_json::from_str(info).expect("info[\"info\"] is JSON");
    assert!(
        json_has_cmd(&v, &serde_json::json!(cmd)),
        "info does not hold Cmd {cmd:?}: {info}"
    );

    let quiet = d.image_status_full(p.image_id(), false).await.unwrap();
    assert!(
        quiet.info.is_empty(),
        "non-verbose status has info: {:?}",
        quiet.info
    );
}

#[tokio::test]
async fn image_status_of_unknown_image_is_none_not_an_error() {
    let reg = registry().await;
    let d = daemon(DaemonOptions::new()).await;
    for r in [
        format!("{}/never-pulled:latest", reg.host()),
        format!("sha256:{}", "ab".repeat(32)),
        "busybox".to_string(),
    ] {
        let st = d
            .image_status(&r)
            .await
            .unwrap_or_else(|e| panic!("ImageStatus({r}): {e:?}"));
        assert!(st.is_none(), "{r}: {st:?}");
    }
}

#[tokio::test]
async fn image_record_has_uid_for_numeric_user_and_username_for_named_user() {
    let reg = registry().await;
    let numeric = push(
        &reg,
        "numeric",
        "v1",
        &fixtures::small_image("n", Compression::Gzip).user("65534"),
    )
    .await;
    let named = push(
        &reg,
        "named",
        "v1",
        &fixtures::small_image("u", Compression::Gzip).user("app"),
    )
    .await;
    let d = daemon(DaemonOptions::new()).await;
    d.pull(&numeric.tag_ref()).await.unwrap();
    d.pull(&named.tag_ref()).await.unwrap();

    let n = d.image_status(&numeric.tag_ref()).await.unwrap().unwrap();
    assert_eq!(n.uid.map(|u| u.value), Some(65534));
    assert_eq!(n.username, "");
    let u = d.image_status(&named.tag_ref()).await.unwrap().unwrap();
    assert!(u.uid.is_none(), "uid set for a named user: {u:?}");
    assert_eq!(u.username, "app");
}

#[tokio::test]
async fn pulled_image_is_stored_as_blobs_and_a_runnable_snapshot_per_chain_id() {
    let reg = registry().await;
    let p = push(&reg, "busybox", "latest", &busybox_image()).await;
    let d = daemon(DaemonOptions::new()).await;
    d.pull(&p.tag_ref()).await.unwrap();

    let images = d.root_dir().join("images");
    for digest in [&p.manifest_digest, &p.config_digest, &p.layer_digests[0]] {
        let blob = images.join("blobs/sha256").join(digest_hex(digest));
        assert!(blob.is_file(), "{} missing", blob.display());
    }
    assert_eq!(
        std::fs::read(
            images
                .join("blobs/sha256")
                .join(digest_hex(&p.config_digest))
        )
        .unwrap(),
        p.config
    );
    assert!(images.join("meta.redb").is_file());
    // Positive control for `assert_nothing_stored`: a stored blob is found by its hex name.
    assert!(!paths_named_like(&d.root_dir(), digest_hex(&p.layer_digests[0])).is_empty());

    let snap = images.join("snapshots").join(digest_hex(&p.chain_ids[0]));
    assert!(
        snap.is_dir(),
        "no snapshot named after the chain ID: {:?}",
        snapshot_dirs(&d.root_dir())
    );
    let out = std::process::Command::new(snap.join("bin/sh"))
        .args(["-c", "echo $((6*7))"])
        .output()
        .expect("running the unpacked busybox");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");
    assert_eq!(
        std::fs::read_link(snap.join("bin/sh")).unwrap(),
        Path::new("busybox")
    );
    let tmp = std::fs::symlink_metadata(snap.join("tmp")).unwrap();
    assert_eq!(tmp.mode() & 0o7777, 0o1777);
    let home = std::fs::symlink_metadata(snap.join("home/app")).unwrap();
    assert_eq!((home.uid(), home.gid()), (1000, 1000));
    assert_eq!(
        std::fs::read_to_string(snap.join("etc/passwd")).unwrap(),
        crishim_tests::image::PASSWD
    );
}

// ---------------------------------------------------------------------------------------------
// Layers, formats, platforms

#[tokio::test]
async fn multi_layer_pull_turns_whiteouts_into_char_devices_and_opaque_dirs_into_xattrs() {
    let reg = registry().await;
    let img = fixtures::multi_layer_image();
    let p = push(&reg, "multi", "latest", &img).await;
    let d = daemon(DaemonOptions::new()).await;
    assert_eq!(d.pull(&p.tag_ref()).await.expect("pull"), p.image_id());

    let rec = d.image_status(p.image_id()).await.unwrap().unwrap();
    assert_eq!(rec.username, "app");

    let snaps = snapshot_dirs(&d.root_dir());
    let second = snaps
        .iter()
        .find(|s| s.join("data/dir/x").exists())
        .unwrap_or_else(|| panic!("no snapshot holds data/dir/x: {snaps:?}"));
    let third = snaps
        .iter()
        .find(|s| s.join("data/dir/y").exists())
        .unwrap_or_else(|| panic!("no snapshot holds data/dir/y: {snaps:?}"));
    assert_eq!(
        second.file_name().unwrap().to_str().unwrap(),
        digest_hex(&p.chain_ids[1])
    );
    assert_eq!(
        third.file_name().unwrap().to_str().unwrap(),
        digest_hex(&p.chain_ids[2])
    );

    // Layer 2 as shipped.
    assert_eq!(
        std::fs::read_to_string(second.join("data/b")).unwrap(),
        "b\n"
    );
    let owned = std::fs::symlink_metadata(second.join("data/owned")).unwrap();
    assert_eq!(
        (owned.uid(), owned.gid(), owned.mode() & 0o7777),
        (1000, 1000, 0o640)
    );
    let x = std::fs::symlink_metadata(second.join("data/dir/x")).unwrap();
    assert_eq!(x.mode() & 0o7777, 0o600);

    // Layer 3: overlayfs whiteout and opaque marker, no AUFS marker files.
    let b = std::fs::symlink_metadata(third.join("data/b")).expect("whiteout data/b");
    assert!(
        b.file_type().is_char_device(),
        "data/b is not a char device: {b:?}"
    );
    assert_eq!(b.rdev(), 0, "whiteout must be device 0/0");
    assert_eq!(
        lgetxattr(&third.join("data/dir"), "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..]),
        "data/dir is not marked opaque"
    );
    assert!(!third.join("data/.wh.b").exists());
    assert!(!third.join("data/dir/.wh..wh..opq").exists());
    assert!(!third.join("data/dir/x").exists());
    assert!(
        !third.join("data/a").exists(),
        "layer 3 snapshot holds lower-layer files"
    );
    assert_eq!(
        std::fs::read_to_string(third.join("data/dir/y")).unwrap(),
        "y\n"
    );
}

#[tokio::test]
async fn oci_index_pull_resolves_to_the_host_platform_config() {
    let reg = registry().await;
    let index = Index::new(vec![
        fixtures::small_image("foreign", Compression::Gzip).platform(foreign_arch(), None),
        fixtures::small_image("host", Compression::Gzip).platform(host_arch(), None),
    ]);
    let p = reg.push_index("multiarch", "latest", &index).await.unwrap();
    let host = p.for_arch(host_arch());
    assert_ne!(host.config_digest, p.for_arch(foreign_arch()).config_digest);
    let d = daemon(DaemonOptions::new()).await;

    assert_eq!(
        d.pull(&p.tag_ref()).await.expect("pull index"),
        host.config_digest
    );
    let rec = d.image_status(&p.tag_ref()).await.unwrap().expect("status");
    assert_eq!(rec.id, host.config_digest);
    let list = d.list_images(None).await.unwrap();
    assert_eq!(list.len(), 1, "{list:#?}");
    let snap = d
        .root_dir()
        .join("images/snapshots")
        .join(digest_hex(&host.chain_ids[0]));
    assert_eq!(
        std::fs::read_to_string(snap.join("marker")).unwrap(),
        "host\n"
    );
}

#[tokio::test]
async fn docker_manifest_list_pull_resolves_to_the_host_platform_config() {
    let reg = registry().await;
    let index = Index::new(vec![
        fixtures::small_image("host", Compression::Gzip).platform(host_arch(), None),
        fixtures::small_image("foreign", Compression::Gzip).platform(foreign_arch(), Some("v8")),
    ])
    .docker();
    let p = reg.push_index("multiarch", "docker", &index).await.unwrap();
    let d = daemon(DaemonOptions::new()).await;
    assert_eq!(
        d.pull(&p.tag_ref()).await.expect("pull manifest list"),
        p.for_arch(host_arch()).config_digest
    );
}

#[tokio::test]
async fn docker_schema2_image_pulls_with_its_config_digest_as_id() {
    let reg = registry().await;
    let p = push(&reg, "busybox", "docker", &busybox_image().docker()).await;
    let d = daemon(DaemonOptions::new()).await;
    assert_eq!(
        d.pull(&p.tag_ref()).await.expect("pull schema2"),
        p.image_id()
    );
    let rec = d.image_status(&p.tag_ref()).await.unwrap().unwrap();
    assert_eq!(rec.repo_digests, vec![p.digest_ref()]);
}

// ---------------------------------------------------------------------------------------------
// List filter, remove, fs info

#[tokio::test]
async fn list_images_filter_returns_only_the_matching_image() {
    let reg = registry().await;
    let a = push(
        &reg,
        "alpha",
        "v1",
        &fixtures::small_image("alpha", Compression::Gzip),
    )
    .await;
    let b = push(
        &reg,
        "beta",
        "v1",
        &fixtures::small_image("beta", Compression::Zstd),
    )
    .await;
    assert_ne!(a.image_id(), b.image_id());
    let d = daemon(DaemonOptions::new()).await;
    d.pull(&a.tag_ref()).await.unwrap();
    d.pull(&b.tag_ref()).await.unwrap();

    assert_eq!(d.list_images(None).await.unwrap().len(), 2);
    for (want, other) in [(&a, &b), (&b, &a)] {
        let got = d.list_images(Some(&want.tag_ref())).await.unwrap();
        let ids: Vec<_> = got.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, vec![want.image_id()], "filter {}", want.tag_ref());
        assert!(!ids.contains(&other.image_id()));
    }
    let none = d
        .list_images(Some(&format!("{}/gamma:v1", reg.host())))
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:#?}");
}

#[tokio::test]
async fn remove_image_is_idempotent() {
    let reg = registry().await;
    let p = push(
        &reg,
        "small",
        "v1",
        &fixtures::small_image("rm", Compression::Gzip),
    )
    .await;
    let d = daemon(DaemonOptions::new()).await;
    d.pull(&p.tag_ref()).await.unwrap();
    d.remove_image(p.image_id()).await.expect("first remove");
    d.remove_image(p.image_id())
        .await
        .expect("second remove of the same ID");
    d.remove_image(&p.tag_ref())
        .await
        .expect("remove of a tag no longer present");
    d.remove_image(&format!("{}/never:pulled", reg.host()))
        .await
        .expect("remove of an unknown image");
    assert!(d.list_images(None).await.unwrap().is_empty());
}

#[tokio::test]
async fn image_fs_info_reports_the_store_and_nonzero_usage_after_a_pull() {
    let reg = registry().await;
    let p = push(&reg, "busybox", "latest", &busybox_image()).await;
    let d = daemon(DaemonOptions::new()).await;
    d.pull(&p.tag_ref()).await.unwrap();

    let info = d.image_fs_info().await.unwrap();
    let fs = info
        .image_filesystems
        .first()
        .expect("image_filesystems[0]");
    let mp = &fs.fs_id.as_ref().expect("fs_id").mountpoint;
    assert!(
        Path::new(mp).starts_with(d.root_dir()) && Path::new(mp).is_dir(),
        "mountpoint {mp} is not the image store under {}",
        d.root_dir().display()
    );
    let used = fs.used_bytes.as_ref().expect("used_bytes").value;
    let inodes = fs.inodes_used.as_ref().expect("inodes_used").value;
    // At least the busybox binary itself.
    assert!(used >= 1_000_000, "used_bytes = {used}");
    assert!(inodes > 0, "inodes_used = {inodes}");
    // Writable layers are in the same store: the same filesystem, so no split image fs.
    assert_eq!(
        info.container_filesystems
            .first()
            .and_then(|c| c.fs_id.as_ref())
            .map(|f| &f.mountpoint),
        Some(mp)
    );
}

// ---------------------------------------------------------------------------------------------
// Names and mirrors

#[tokio::test]
async fn short_name_busybox_is_pulled_through_a_docker_io_mirror_as_docker_io_library_busybox() {
    let reg = registry().await;
    let p = push(&reg, "library/busybox", "latest", &busybox_image()).await;
    let d = daemon(DaemonOptions::new().mirror("docker.io", &[&reg.url()])).await;

    assert_eq!(d.pull("busybox").await.expect("pull busybox"), p.image_id());
    let rec = d
        .image_status("busybox")
        .await
        .unwrap()
        .expect("status of busybox");
    assert_eq!(
        rec.repo_tags,
        vec!["docker.io/library/busybox:latest".to_string()]
    );
    assert_eq!(
        rec.repo_digests,
        vec![format!("docker.io/library/busybox@{}", p.manifest_digest)]
    );
    for alias in [
        "busybox:latest",
        "library/busybox",
        "docker.io/library/busybox:latest",
    ] {
        let st = d.image_status(alias).await.unwrap();
        assert_eq!(st.map(|i| i.id).as_deref(), Some(p.image_id()), "{alias}");
    }
}

#[tokio::test]
async fn registry_k8s_io_pause_is_pulled_from_its_mirror() {
    let reg = registry().await;
    let p = push(
        &reg,
        "pause",
        "3.9",
        &fixtures::small_image("pause", Compression::Gzip),
    )
    .await;
    let d = daemon(DaemonOptions::new().mirror("registry.k8s.io", &[&reg.url()])).await;
    assert_eq!(
        d.pull("registry.k8s.io/pause:3.9")
            .await
            .expect("pull pause"),
        p.image_id()
    );
    let rec = d
        .image_status("registry.k8s.io/pause:3.9")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.repo_tags, vec!["registry.k8s.io/pause:3.9".to_string()]);
}

#[tokio::test]
async fn dead_first_mirror_endpoint_falls_back_to_the_next() {
    let reg = registry().await;
    let p = push(
        &reg,
        "pause",
        "3.9",
        &fixtures::small_image("pause", Compression::Gzip),
    )
    .await;
    let d =
        daemon(DaemonOptions::new().mirror("registry.k8s.io", &["http://127.0.0.1:1", &reg.url()]))
            .await;
    assert_eq!(
        d.pull("registry.k8s.io/pause:3.9")
            .await
            .expect("pull pause"),
        p.image_id()
    );
}

#[tokio::test]
async fn tls_registry_with_insecure_skip_verify_is_pulled_over_https() {
    let reg = Registry::start(RegistryOptions::default().with_tls())
        .await
        .unwrap();
    let p = push(
        &reg,
        "small",
        "v1",
        &fixtures::small_image("tls", Compression::Gzip),
    )
    .await;
    let d = daemon(DaemonOptions::new().insecure_skip_verify(&reg.host())).await;
    assert_eq!(
        d.pull(&p.tag_ref()).await.expect("pull over https"),
        p.image_id()
    );
}

// ---------------------------------------------------------------------------------------------
// Authentication

async fn auth_registry() -> (Registry, PushedImage) {
    let reg = Registry::start(RegistryOptions::default().with_basic_auth("user", "pass"))
        .await
        .unwrap();
    let p = push(
        &reg,
        "private",
        "v1",
        &fixtures::small_image("private", Compression::Gzip),
    )
    .await;
    (reg, p)
}

#[tokio::test]
async fn pull_with_username_and_password_passes_htpasswd_auth() {
    let (_reg, p) = auth_registry().await;
    let d = daemon(DaemonOptions::new()).await;
    let r = d
        .pull_with_auth(&p.tag_ref(), Some(basic_auth("user", "pass")))
        .await;
    assert_eq!(r.expect("pull with credentials"), p.image_id());
}

#[tokio::test]
async fn pull_with_base64_auth_field_passes_htpasswd_auth() {
    let (_reg, p) = auth_registry().await;
    let d = daemon(DaemonOptions::new()).await;
    let r = d
        .pull_with_auth(&p.tag_ref(), Some(encoded_auth("user", "pass")))
        .await;
    assert_eq!(r.expect("pull with auth"), p.image_id());
}

#[tokio::test]
async fn pull_with_credentials_from_registry_config_passes_htpasswd_auth() {
    let (reg, p) = auth_registry().await;
    let d = daemon(DaemonOptions::new().auth(&reg.host(), "user", "pass")).await;
    assert_eq!(d.pull(&p.tag_ref()).await.expect("pull"), p.image_id());
}

#[tokio::test]
async fn pull_with_wrong_password_is_unauthenticated() {
    let (_reg, p) = auth_registry().await;
    let d = daemon(DaemonOptions::new()).await;
    let err = d
        .pull_with_auth(&p.tag_ref(), Some(basic_auth("user", "wrong")))
        .await
        .expect_err("pull with a wrong password");
    assert_code(&err, Code::Unauthenticated);
    assert_message_mentions(&err, &["unauthorized", "authentication"]);
    assert!(d.list_images(None).await.unwrap().is_empty());
}

#[tokio::test]
async fn pull_without_credentials_is_unauthenticated() {
    let (_reg, p) = auth_registry().await;
    let d = daemon(DaemonOptions::new()).await;
    let err = d.pull(&p.tag_ref()).await.expect_err("anonymous pull");
    assert_code(&err, Code::Unauthenticated);
    assert_message_mentions(&err, &["unauthorized", "authentication"]);
    assert!(d.list_images(None).await.unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Pull errors

#[tokio::test]
async fn malformed_references_are_invalid_argument() {
    let d = daemon(DaemonOptions::new()).await;
    for r in [
        "",
        "Busybox:latest",
        "busybox:bad tag",
        "busybox::latest",
        "127.0.0.1:5000/busybox@sha256:1234",
        "busybox@md5:0123456789abcdef",
    ] {
        let err = d.pull(r).await.expect_err(r);
        assert_eq!(err.code(), Code::InvalidArgument, "{r:?}: {err:?}");
    }
}

#[tokio::test]
async fn missing_tag_or_repository_is_not_found() {
    let reg = registry().await;
    push(
        &reg,
        "busybox",
        "latest",
        &fixtures::small_image("nf", Compression::Gzip),
    )
    .await;
    let d = daemon(DaemonOptions::new()).await;
    for r in [
        format!("{}/busybox:missing", reg.host()),
        format!("{}/no-such-repo:latest", reg.host()),
        format!("{}/busybox@sha256:{}", reg.host(), "0".repeat(64)),
    ] {
        let err = d.pull(&r).await.expect_err(&r);
        assert_eq!(err.code(), Code::NotFound, "{r}: {err:?}");
    }
    assert!(d.list_images(None).await.unwrap().is_empty());
}

#[tokio::test]
async fn unreachable_registry_is_unavailable() {
    let d = daemon(DaemonOptions::new()).await;
    let err = d
        .pull("127.0.0.1:1/busybox:latest")
        .await
        .expect_err("pull from a closed port");
    assert_code(&err, Code::Unavailable);
}

// ---------------------------------------------------------------------------------------------
// Corrupted blobs

#[tokio::test]
async fn corrupted_gzip_layer_blob_fails_with_data_loss_and_stores_nothing() {
    let reg = registry().await;
    let p = push(&reg, "busybox", "latest", &busybox_image()).await;
    let layer = p.layer_digests[0].clone();
    reg.corrupt_blob(&layer).unwrap();
    let d = daemon(DaemonOptions::new()).await;
    let err = d
        .pull(&p.tag_ref())
        .await
        .expect_err("pull of a corrupted blob");
    assert_code(&err, Code::DataLoss);
    assert!(
        err.message().contains(&layer),
        "message does not name {layer}: {}",
        err.message()
    );
    assert_nothing_stored(&d, &p.tag_ref(), &layer).await;
}

#[tokio::test]
async fn corrupted_uncompressed_layer_that_is_still_a_valid_tar_fails_with_data_loss() {
    // Same length, still a well-formed tar: only the digest check can tell.
    let reg = registry().await;
    let good = crishim_tests::LayerBuilder::new()
        .file("payload", "AAAAAAAA", 0o644)
        .build(Compression::None);
    let evil = crishim_tests::LayerBuilder::new()
        .file("payload", "BBBBBBBB", 0o644)
        .tar();
    let p = push(&reg, "small", "v1", &Image::new(vec![good.clone()])).await;
    reg.replace_blob(&good.digest, &evil).unwrap();
    let d = daemon(DaemonOptions::new()).await;
    let err = d
        .pull(&p.tag_ref())
        .await
        .expect_err("pull of a substituted blob");
    assert_code(&err, Code::DataLoss);
    assert!(err.message().contains(&good.digest), "{}", err.message());
    assert_nothing_stored(&d, &p.tag_ref(), &good.digest).await;
}

#[tokio::test]
async fn corrupted_config_blob_fails_with_data_loss() {
    let reg = registry().await;
    let p = push(
        &reg,
        "small",
        "v1",
        &fixtures::small_image("cfg", Compression::Gzip),
    )
    .await;
    reg.corrupt_blob(&p.config_digest).unwrap();
    let d = daemon(DaemonOptions::new()).await;
    let err = d
        .pull(&p.tag_ref())
        .await
        .expect_err("pull with a corrupted config");
    assert_code(&err, Code::DataLoss);
    assert!(
        err.message().contains(&p.config_digest),
        "{}",
        err.message()
    );
    assert_nothing_stored(&d, &p.tag_ref(), &p.config_digest).await;
}

// ---------------------------------------------------------------------------------------------
// Hostile and truncated layers

const HOSTILE_WORDS: &[&str] = &["escapes", "hardlink", "truncated", "unexpected end", ".."];

/// Push a one-layer image made of `layer`, pull it, expect InvalidArgument naming the
/// problem and nothing stored.
async fn pull_hostile(reg: &Registry, d: &Daemon, repo: &str, layer: crishim_tests::Layer) {
    let bad = layer.digest.clone();
    let p = push(reg, repo, "v1", &Image::new(vec![layer])).await;
    let err = d
        .pull(&p.tag_ref())
        .await
        .expect_err("pull of a hostile layer");
    assert_code(&err, Code::InvalidArgument);
    assert_message_mentions(&err, HOSTILE_WORDS);
    assert_nothing_stored(d, &p.tag_ref(), &bad).await;
}

/// No file named `name` under the daemon's directory nor in any ancestor of its store.
fn assert_no_file_named(d: &Daemon, name: &str) {
    let found = paths_named_like(d.dir(), name);
    assert!(found.is_empty(), "hostile layer wrote {found:?}");
    let deepest = d.root_dir().join("images/snapshots/tmp/x/y/z");
    for a in deepest.ancestors() {
        assert!(
            !a.join(name).exists(),
            "hostile layer wrote {}",
            a.join(name).display()
        );
    }
}

#[tokio::test]
async fn layer_entry_with_dotdot_path_is_rejected_without_writing_outside() {
    let reg = registry().await;
    let d = daemon(DaemonOptions::new()).await;
    let tok = random_hex(6);
    pull_hostile(&reg, &d, "dotdot", fixtures::dotdot_layer(&tok)).await;
    assert_no_file_named(&d, &format!("escape-{tok}"));
}

#[tokio::test]
async fn layer_entry_climbing_to_host_tmp_is_rejected_without_writing_there() {
    let reg = registry().await;
    let d = daemon(DaemonOptions::new()).await;
    let tok = random_hex(6);
    pull_hostile(&reg, &d, "deepdotdot", fixtures::deep_dotdot_layer(&tok)).await;
    assert_no_file_named(&d, &format!("escape-{tok}"));
    assert!(!Path::new("/tmp").join(format!("escape-{tok}")).exists());
}

#[tokio::test]
async fn file_written_through_an_absolute_symlink_is_rejected_without_touching_the_target() {
    let reg = registry().await;
    let d = daemon(DaemonOptions::new()).await;
    let target = tempfile::Builder::new()
        .prefix("crishim-symlink-target-")
        .tempdir()
        .unwrap();
    let layer = fixtures::symlink_escape_layer(target.path().to_str().unwrap());
    pull_hostile(&reg, &d, "symlink", layer).await;
    let inside = walk(target.path());
    assert!(
        inside.is_empty(),
        "the layer wrote through the symlink: {inside:?}"
    );
}

async fn hardlink_to_etc_passwd_is_rejected(target: &str) {
    let reg = registry().await;
    let d = daemon(DaemonOptions::new()).await;
    let before_md = std::fs::metadata("/etc/passwd").unwrap();
    let before = std::fs::read("/etc/passwd").unwrap();
    let name = format!("lnk-{}", random_hex(6));
    pull_hostile(
        &reg,
        &d,
        "hardlink",
        fixtures::hardlink_escape_layer(&name, target),
    )
    .await;
    let after_md = std::fs::metadata("/etc/passwd").unwrap();
    assert_eq!(
        after_md.nlink(),
        before_md.nlink(),
        "/etc/passwd gained a link"
    );
    assert_eq!(after_md.ino(), before_md.ino());
    assert_eq!(
        std::fs::read("/etc/passwd").unwrap(),
        before,
        "/etc/passwd changed"
    );
    assert_no_file_named(&d, &name);
}

#[tokio::test]
async fn hardlink_to_absolute_etc_passwd_is_rejected_and_passwd_is_untouched() {
    hardlink_to_etc_passwd_is_rejected("/etc/passwd").await;
}

#[tokio::test]
async fn hardlink_to_dotdot_etc_passwd_is_rejected_and_passwd_is_untouched() {
    hardlink_to_etc_passwd_is_rejected("../../../../../../../../etc/passwd").await;
}

#[tokio::test]
async fn layer_truncated_inside_file_data_is_rejected_and_stores_nothing() {
    let reg = registry().await;
    let d = daemon(DaemonOptions::new()).await;
    pull_hostile(
        &reg,
        &d,
        "truncated",
        fixtures::truncated_layer(Compression::Gzip),
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Layers that would blow up memory, disk or logs

/// What one pull may add to the daemon's peak RSS, whatever its layer holds.
const RSS_BUDGET: u64 = 64 << 20;

/// The daemon's peak resident set (`VmHWM`), in bytes.
fn peak_rss(d: &Daemon) -> u64 {
    let pid = d.pid().expect("daemon pid");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kib << 10
}

/// Push a one-layer image of `layer` and pull it: it must fail with `code`, a short message,
/// nothing stored, and a daemon that still answers and never logged a huge line.
async fn pull_refused(
    reg: &Registry,
    d: &Daemon,
    repo: &str,
    layer: crishim_tests::Layer,
    code: Code,
) -> tonic::Status {
    let bad = layer.digest.clone();
    let p = push(reg, repo, "v1", &Image::new(vec![layer])).await;
    let err = d
        .pull(&p.tag_ref())
        .await
        .expect_err("pull must be refused");
    assert_code(&err, code);
    assert!(
        err.message().len() <= 1024,
        "a message of {} bytes",
        err.message().len()
    );
    assert_nothing_stored(d, &p.tag_ref(), &bad).await;
    let longest = d.log_text().lines().map(str::len).max().unwrap_or(0);
    assert!(
        longest <= 8192,
        "the daemon logged a line of {longest} bytes"
    );
    err
}

#[tokio::test]
async fn a_64_mib_gnu_long_name_is_refused_naming_the_layer_within_the_memory_budget() {
    let reg = registry().await;
    let d = daemon(DaemonOptions::new()).await;
    let layer = fixtures::long_name_layer(64 << 20);
    let digest = layer.digest.clone();
    let before = peak_rss(&d);
    let err = pull_refused(&reg, &d, "longname", layer, Code::InvalidArgument).await;
    let after = peak_rss(&d);
    eprintln!(
        "daemon VmHWM: {} KiB before the pull, {} KiB after",
        before >> 10,
        after >> 10
    );
    assert!(err.message().contains(&digest), "{}", err.message());
    assert_message_mentions(&err, &["GNU long name header of 67108864 bytes"]);
    assert!(
        after - before <= RSS_BUDGET,
        "peak RSS grew by {} KiB",
        (after - before) >> 10
    );
    d.list_images(None).await.expect("the daemon still answers");
}

#[tokio::test]
async fn pax_header_bombs_are_refused_within_the_memory_budget() {
    let reg = registry().await;
    let d = daemon(DaemonOptions::new()).await;
    let before = peak_rss(&d);
    let huge_record = fixtures::pax_record("path", &"p".repeat(16 << 20));
    let mut many_records = Vec::new();
    while many_records.len() < 4 << 20 {
        many_records.extend(fixtures::pax_record("SCHILY.xattr.user.k", "v"));
    }
    let global = fixtures::pax_record("comment", &"g".repeat(8 << 20));
    for (repo, kind, records) in [
        ("pax-huge", tar::EntryType::XHeader, huge_record),
        ("pax-many", tar::EntryType::XHeader, many_records),
        ("pax-global", tar::EntryType::XGlobalHeader, global),
    ] {
        let layer = fixtures::pax_layer(kind, &records);
        let digest = layer.digest.clone();
        let err = pull_refused(&reg, &d, repo, layer, Code::InvalidArgument).await;
        assert!(err.message().contains(&digest), "{repo}: {}", err.message());
        assert_message_mentions(&err, &["PAX"]);
    }
    let grew = peak_rss(&d) - before;
    assert!(grew <= RSS_BUDGET, "peak RSS grew by {} KiB", grew >> 10);
    d.list_images(None).await.expect("the daemon still answers");
}

#[tokio::test]
async fn a_layer_of_zeros_past_max_unpacked_bytes_is_resource_exhausted_and_leaves_nothing() {
    let reg = registry().await;
    let d = daemon(DaemonOptions::new().images("max_unpacked_bytes", 1 << 20)).await;
    let err = pull_refused(
        &reg,
        &d,
        "zeros",
        fixtures::zeros_layer(16 << 20),
        Code::ResourceExhausted,
    )
    .await;
    assert_message_mentions(&err, &["max_unpacked_bytes = 1048576"]);
}

#[tokio::test]
async fn two_hundred_thousand_empty_files_past_max_layer_entries_are_resource_exhausted() {
    let reg = registry().await;
    let d = daemon(DaemonOptions::new().images("max_layer_entries", 1000)).await;
    let err = pull_refused(
        &reg,
        &d,
        "many",
        fixtures::empty_files_layer(200_000),
        Code::ResourceExhausted,
    )
    .await;
    assert_message_mentions(&err, &["max_layer_entries = 1000"]);
}

#[tokio::test]
async fn a_pull_that_would_leave_too_little_free_space_is_resource_exhausted() {
    let reg = registry().await;
    let d = daemon(DaemonOptions::new().images("min_free_percent", 100)).await;
    let err = pull_refused(
        &reg,
        &d,
        "nospace",
        fixtures::zeros_layer(1 << 20),
        Code::ResourceExhausted,
    )
    .await;
    assert_message_mentions(&err, &["min_free_percent = 100"]);
}

#[tokio::test]
async fn a_huge_image_reference_is_shown_cut_in_the_error() {
    let d = daemon(DaemonOptions::new()).await;
    for r in [
        format!("127.0.0.1:1/{}:v1", "a".repeat(100_000)),
        format!("busybox:{}", "t".repeat(3000)),
    ] {
        let err = d.pull(&r).await.expect_err("pull of a huge reference");
        assert_code(&err, Code::InvalidArgument);
        assert!(err.message().len() <= 512, "{} bytes", err.message().len());
    }
    let longest = d.log_text().lines().map(str::len).max().unwrap_or(0);
    assert!(
        longest <= 2048,
        "the daemon logged a line of {longest} bytes"
    );
}

#[tokio::test]
async fn a_pull_without_credentials_never_reuses_what_a_pull_with_them_earned() {
    let (_reg, p) = auth_registry().await;
    let d = daemon(DaemonOptions::new()).await;
    let r = d
        .pull_with_auth(&p.tag_ref(), Some(basic_auth("user", "pass")))
        .await;
    assert_eq!(r.expect("pull with credentials"), p.image_id());
    let err = d
        .pull(&p.tag_ref())
        .await
        .expect_err("an anonymous pull after an authenticated one");
    assert_code(&err, Code::Unauthenticated);
    let err = d
        .pull_with_auth(&p.tag_ref(), Some(basic_auth("user", "wrong")))
        .await
        .expect_err("a pull with a wrong password after an authenticated one");
    assert_code(&err, Code::Unauthenticated);
}

// ---------------------------------------------------------------------------------------------
// Daemon configuration and lifecycle

const BAD_CONFIG_TIMEOUT: Duration = Duration::from_secs(20);

/// `crishim serve` with `toml` added to its config exits non-zero, naming `key` on stderr.
async fn assert_config_refused(toml: &str, key: &str) {
    let opts = DaemonOptions::new().extra_toml(toml);
    let out = serve_expecting_exit(&opts, BAD_CONFIG_TIMEOUT)
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "exited {} with {toml:?} in its config",
        out.status
    );
    assert!(
        stderr.contains(key),
        "stderr does not name the key {key}: {stderr}"
    );
}

#[tokio::test]
async fn serve_rejects_an_unknown_top_level_config_key_and_names_it() {
    assert_config_refused("frobnicate_level = 3", "frobnicate_level").await;
}

#[tokio::test]
async fn serve_rejects_an_unknown_registry_mirror_key_and_names_it() {
    assert_config_refused(
        "[registry.mirrors.\"docker.io\"]\nendpoints = [\"http://127.0.0.1:1\"]",
        "endpoints",
    )
    .await;
}

#[tokio::test]
async fn serve_rejects_a_value_of_the_wrong_type_and_names_the_key() {
    assert_config_refused(
        "[registry.configs.\"127.0.0.1:5000\".tls]\ninsecure_skip_verify = \"yes\"",
        "insecure_skip_verify",
    )
    .await;
}

#[tokio::test]
async fn serve_exits_zero_on_sigterm_after_serving_requests() {
    let d = daemon(DaemonOptions::new()).await;
    assert!(d.list_images(None).await.unwrap().is_empty());
    d.stop();
}

/// What a [`stalling_proxy`] saw: connections it stalled, and stalled ones the client closed.
#[derive(Default)]
struct ProxySeen {
    stalls: std::sync::atomic::AtomicUsize,
    hangups: std::sync::atomic::AtomicUsize,
}

/// A loopback proxy to `upstream` that forwards everything, except that once a request for a path
/// containing `stall_on` goes through, it passes only `budget` more bytes of the reply and then
/// sends nothing for `hold` (a registry that stalls mid-layer), then the rest.
async fn stalling_proxy(
    upstream: String,
    stall_on: String,
    budget: usize,
    hold: Duration,
) -> (String, std::sync::Arc<ProxySeen>) {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = std::sync::Arc::new(ProxySeen::default());
    let counts = seen.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                continue;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let stalled = std::sync::Arc::new(AtomicBool::new(false));
            let flag = stalled.clone();
            let needle = stall_on.clone();
            let seen = counts.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 << 10];
                loop {
                    let n = cr.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        if flag.load(SeqCst) {
                            seen.hangups.fetch_add(1, SeqCst);
                        }
                        return;
                    }
                    if sw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    if String::from_utf8_lossy(&buf[..n]).contains(&needle) {
                        flag.store(true, SeqCst);
                    }
                }
            });
            let seen = counts.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 << 10];
                let mut left = budget;
                let mut held = false;
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    let mut out = &buf[..n];
                    if stalled.load(SeqCst) && !held {
                        let now = n.min(left);
                        left -= now;
                        if now > 0 && cw.write_all(&out[..now]).await.is_err() {
                            return;
                        }
                        out = &out[now..];
                        if left == 0 {
                            // The client waits for bytes that do not come.
                            seen.stalls.fetch_add(1, SeqCst);
                            held = true;
                            tokio::time::sleep(hold).await;
                        }
                    }
                    if !out.is_empty() && cw.write_all(out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// An image with one layer of 2 MiB of noise (gzip cannot shrink it below what a
/// [`stalling_proxy`] lets through), pushed as `<repo>:v1`; returns it and the layer's digest.
async fn push_noise_image(reg: &Registry, repo: &str) -> (PushedImage, String) {
    let mut tar = crishim_tests::image::RawTar::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let noise: Vec<u8> = (0..(2u32 << 20))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    tar.file("noise.bin", &noise, 0o644);
    let layer = crishim_tests::Layer::from_tar(&tar.finish(), Compression::Gzip);
    let layer_digest = layer.digest.clone();
    assert!(
        layer.blob.len() > 1 << 20,
        "the layer must outgrow the proxy's budget"
    );
    (
        push(reg, repo, "v1", &Image::new(vec![layer])).await,
        layer_digest,
    )
}

/// Wait until `count` reaches `n`.
async fn wait_count(count: &std::sync::atomic::AtomicUsize, n: usize, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while count.load(std::sync::atomic::Ordering::SeqCst) < n {
        assert!(std::time::Instant::now() < deadline, "waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A `PullImage` whose client goes away cancels the pull (the daemon hangs up on the registry
/// and removes what it had), unless another client waits on the same image: that one's pull
/// takes over and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_whose_client_goes_away_is_cancelled_unless_another_waits() {
    let reg = registry().await;
    let (p, layer_digest) = push_noise_image(&reg, "gone").await;
    let (proxy, seen) = stalling_proxy(
        reg.host(),
        digest_hex(&layer_digest).to_string(),
        256 << 10,
        Duration::from_secs(4),
    )
    .await;
    let d = std::sync::Arc::new(
        daemon(DaemonOptions::new().mirror(&reg.host(), &[&format!("http://{proxy}")])).await,
    );
    let pull = |d: &std::sync::Arc<Daemon>| {
        let (d, r) = (d.clone(), p.tag_ref());
        tokio::spawn(async move { d.pull(&r).await })
    };

    // Alone: the client hangs up mid-layer; the daemon hangs up on the registry too, well before
    // the registry would have sent the rest, and keeps nothing.
    let a = pull(&d);
    wait_count(&seen.stalls, 1, "the layer to stall").await;
    a.abort();
    wait_count(&seen.hangups, 1, "the daemon to hang up on the registry").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_nothing_stored(&d, &p.tag_ref(), &layer_digest).await;

    // With a second client waiting on the same layer, the first one's going away hands the pull
    // to it, which completes.
    let a = pull(&d);
    wait_count(&seen.stalls, 2, "the layer to stall again").await;
    let b = pull(&d);
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.abort();
    let id = tokio::time::timeout(Duration::from_secs(60), b)
        .await
        .expect("the waiting pull finishes")
        .unwrap()
        .expect("the waiting pull succeeds");
    assert_eq!(id, p.image_id());
    for staging in ["images/ingest", "images/snapshots/tmp"] {
        let entries = dir_entries(&d.root_dir().join(staging));
        assert!(entries.is_empty(), "{staging}: {entries:?}");
    }
}

/// `[images] pull_progress_timeout`: a layer that stops arriving midway is cancelled with
/// `DeadlineExceeded` naming the layer and the bytes received, after about the timeout, and
/// nothing of it is kept; the same image pulls through once the registry answers again.
#[tokio::test]
async fn a_pull_that_stalls_is_cancelled_after_the_progress_timeout() {
    let reg = registry().await;
    let (p, layer_digest) = push_noise_image(&reg, "stall").await;
    let (proxy, _) = stalling_proxy(
        reg.host(),
        digest_hex(&layer_digest).to_string(),
        256 << 10,
        Duration::from_secs(600),
    )
    .await;
    let mut opts = DaemonOptions::new().mirror(&reg.host(), &[&format!("http://{proxy}")]);
    opts.images.push("pull_progress_timeout = \"2s\"".into());
    let d = daemon(opts).await;

    let t0 = std::time::Instant::now();
    let e = d.pull(&p.tag_ref()).await.expect_err("a stalled pull");
    let took = t0.elapsed();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(e.message().contains(digest_hex(&layer_digest)), "{e:?}");
    assert!(e.message().contains("pull_progress_timeout"), "{e:?}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(20),
        "cancelled after {took:?}"
    );
    assert_nothing_stored(&d, &p.tag_ref(), &layer_digest).await;

    // An out-of-range timeout is refused at start-up, naming the key.
    let mut bad = DaemonOptions::new();
    bad.images.push("pull_progress_timeout = \"0s\"".into());
    let out = serve_expecting_exit(&bad, BAD_CONFIG_TIMEOUT)
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("pull_progress_timeout"), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// `[registry] config_path`: containerd's hosts.toml directories

/// `<dir>/<name>/hosts.toml` holding `text`.
fn hosts_toml(dir: &Path, name: &str, text: &str) {
    std::fs::create_dir_all(dir.join(name)).unwrap();
    std::fs::write(dir.join(name).join("hosts.toml"), text).unwrap();
}

fn config_path_toml(dir: &Path) -> String {
    format!(
        "[registry]\nconfig_path = {:?}\n",
        dir.display().to_string()
    )
}

#[tokio::test]
async fn a_certs_d_docker_io_hosts_toml_serves_docker_io_and_wins_over_mirrors() {
    // What docker.io/library/busybox is, as the certs.d host serves it.
    let reg = registry().await;
    let busybox = push(&reg, "library/busybox", "latest", &busybox_image()).await;
    // An inline mirror for the same host, holding another image under that name: the hosts.toml
    // wins, as in containerd.
    let decoy = registry().await;
    let other = push(
        &decoy,
        "library/busybox",
        "latest",
        &fixtures::small_image("decoy", Compression::Gzip),
    )
    .await;
    assert_ne!(busybox.image_id(), other.image_id());
    let certs = tempfile::tempdir().unwrap();
    hosts_toml(
        certs.path(),
        "docker.io",
        &format!(
            "server = \"https://registry-1.docker.io\"\n\
             [host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n\
             [host.\"http://{}\".header]\n  x-crishim-test = \"yes\"\n",
            reg.host(),
            reg.host()
        ),
    );
    let d = daemon(
        DaemonOptions::new()
            .extra_toml(&config_path_toml(certs.path()))
            .mirror("docker.io", &[&decoy.url()]),
    )
    .await;
    let id = d.pull("docker.io/library/busybox:latest").await.unwrap();
    assert_eq!(id, busybox.image_id());
    let id = d.pull("busybox").await.unwrap();
    assert_eq!(id, busybox.image_id(), "the short name resolves there too");
    assert!(
        !decoy
            .log_text()
            .contains("GET /v2/library/busybox/manifests"),
        "the inline mirror was not asked"
    );
}

#[tokio::test]
async fn a_mutual_tls_registry_is_pulled_from_through_ca_and_client() {
    let reg = Registry::start(RegistryOptions::default().with_client_certs())
        .await
        .expect("starting docker-registry with TLS client certificates");
    let p = push(
        &reg,
        "mtls",
        "v1",
        &fixtures::small_image("mtls", Compression::Gzip),
    )
    .await;
    let pki = reg.pki().unwrap().clone();
    let dir_name = format!("127.0.0.1_{}_", reg.port());

    // The CA alone: the registry refuses a client without a certificate.
    let certs = tempfile::tempdir().unwrap();
    hosts_toml(
        certs.path(),
        &dir_name,
        &format!("ca = {:?}\n", pki.ca.display().to_string()),
    );
    let d = daemon(DaemonOptions::new().extra_toml(&config_path_toml(certs.path()))).await;
    let e = d
        .pull(&p.tag_ref())
        .await
        .expect_err("no client certificate");
    assert_ne!(e.code(), Code::Ok);
    drop(d);

    // The CA and the client certificate, the key in a file of its own, paths relative to the
    // hosts.toml's directory.
    let certs = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(certs.path().join(&dir_name)).unwrap();
    for (from, to) in [
        (&pki.ca, "ca.pem"),
        (&pki.client_cert, "client.cert"),
        (&pki.client_key, "client.key"),
    ] {
        std::fs::copy(from, certs.path().join(&dir_name).join(to)).unwrap();
    }
    hosts_toml(
        certs.path(),
        &dir_name,
        "ca = \"ca.pem\"\nclient = [[\"client.cert\", \"client.key\"]]\n",
    );
    let d = daemon(DaemonOptions::new().extra_toml(&config_path_toml(certs.path()))).await;
    assert_eq!(d.pull(&p.tag_ref()).await.unwrap(), p.image_id());
}

#[tokio::test]
async fn a_malformed_hosts_toml_stops_the_start_naming_the_file_and_key() {
    let certs = tempfile::tempdir().unwrap();
    hosts_toml(
        certs.path(),
        "docker.io",
        "[host.\"https://m.example.com\"]\ncapabilities = [\"fetch\"]\n",
    );
    let file = certs.path().join("docker.io/hosts.toml");
    assert_config_refused(
        &config_path_toml(certs.path()),
        &format!(
            "{}: host.\"https://m.example.com\".capabilities",
            file.display()
        ),
    )
    .await;
    hosts_toml(certs.path(), "docker.io", "ca = \"missing.pem\"\n");
    assert_config_refused(&config_path_toml(certs.path()), "ca:").await;
    assert_config_refused(
        "[registry]\nconfig_path = \"relative/certs.d\"\n",
        "registry.config_path",
    )
    .await;
}
