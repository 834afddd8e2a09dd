//! Lazy layers against a real registry (`docker-registry` on loopback): a layer written as eStargz
//! and as zstd:chunked is pushed; its TOC is fetched with range requests and checked against its
//! annotations, and every file is read back chunk by chunk. A chunk whose bytes were changed in
//! the registry's storage is refused, never returned.

use std::collections::HashMap;

use crishim_images::registry::{RegistryClient, RegistryConfig};
use crishim_images::{Digest, Reference};
use crishim_lazy::fetch::{open, LazyLayer, Opened};
use crishim_lazy::write::write_layer;
use crishim_lazy::{Chunk, Format, Kind, Limits};
use crishim_tests::image::{Compression, Image, Layer, LayerBuilder};
use crishim_tests::registry::{Registry, RegistryOptions};

/// A layer of small and chunked files: (its tar, each file's path and bytes).
fn layer() -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let files = vec![
        ("etc/hostname".to_string(), b"lazy\n".to_vec()),
        ("usr/lib/big.so".to_string(), big),
        ("usr/share/doc/readme".to_string(), vec![b'r'; 5000]),
    ];
    let mut b = LayerBuilder::new()
        .dir("etc", 0o755)
        .dir("usr/lib", 0o755)
        .dir("usr/share/doc", 0o755);
    for (path, data) in &files {
        b = b.file(path, data.clone(), 0o644);
    }
    (b.tar(), files)
}

async fn files_of(
    repo: &crishim_images::registry::Repository<'_>,
    l: &LazyLayer,
) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for e in &l.toc.entries {
        if let Kind::File { chunks, size, .. } = &e.kind {
            if *size == 0 {
                continue;
            }
            let mut data = Vec::new();
            for c in chunks {
                data.extend(l.fetch(repo, c).await.unwrap().expect("ranges honoured"));
            }
            out.push((e.path.clone(), data));
        }
    }
    out
}

#[tokio::test]
async fn lazy_layers_are_read_chunk_by_chunk_from_a_real_registry_and_tampering_is_refused() {
    let reg = Registry::start(RegistryOptions::default()).await.unwrap();
    let (tar, files) = layer();
    let client = RegistryClient::new(RegistryConfig::default()).unwrap();
    for (format, tag, compression) in [
        (Format::Estargz, "estargz", Compression::Gzip),
        (Format::ZstdChunked, "zstd-chunked", Compression::Zstd),
    ] {
        let mut blob = Vec::new();
        let written = write_layer(&tar, format, 64 << 10, &mut blob).unwrap();
        let layer = Layer {
            digest: written.digest.clone(),
            diff_id: written.diff_id.clone(),
            blob: blob.clone(),
            compression,
            media_type: None,
        };
        reg.push("lazy", tag, &Image::new(vec![layer]))
            .await
            .unwrap();
        let reference = Reference::parse(&format!("{}/lazy:{tag}", reg.host())).unwrap();
        let (repo, _manifest) = client.resolve(&reference, None).await.unwrap();
        let digest = Digest::parse(&written.digest).unwrap();
        let annotations: HashMap<String, String> = written.annotations.iter().cloned().collect();
        let Opened::Lazy(lazy) = open(
            &repo,
            &digest,
            blob.len() as u64,
            &annotations,
            &Limits::default(),
        )
        .await
        .unwrap() else {
            panic!("{tag}: not opened lazily")
        };
        assert_eq!(files_of(&repo, &lazy).await, files, "{tag}");
        // A wrong TOC digest in the annotations: the TOC is refused.
        let mut wrong = annotations.clone();
        for key in [
            crishim_lazy::estargz::TOC_DIGEST,
            crishim_lazy::zstd_chunked::MANIFEST_CHECKSUM,
        ] {
            if wrong.contains_key(key) {
                wrong.insert(key.into(), crishim_lazy::sha256(b"another TOC"));
            }
        }
        let e = open(
            &repo,
            &digest,
            blob.len() as u64,
            &wrong,
            &Limits::default(),
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("{tag}: a TOC that is not the annotated one was taken"));
        assert!(e.to_string().contains("digest"), "{tag}: {e}");

        // A byte of a chunk changed in the registry's storage: that chunk is refused.
        let (victim, chunks) = tamper_chunk(&reg, &lazy, "usr/lib/big.so", 2);
        let victim = &victim;
        let e = lazy
            .fetch(&repo, victim)
            .await
            .err()
            .unwrap_or_else(|| panic!("{tag}: a tampered chunk was served"));
        assert!(
            e.to_string().contains("digest") || e.to_string().contains("decompress"),
            "{tag}: {e}"
        );
        // Its neighbours still read.
        assert!(lazy.fetch(&repo, &chunks[1]).await.unwrap().is_some());
    }
}

/// `crishim image convert` pulls an ordinary image, writes each layer in a lazy format and
/// pushes the result: a runtime that knows nothing of the format pulls it whole (the daemon's
/// ordinary pull, its diff IDs checked), and a lazy one reads every file chunk by chunk.
#[tokio::test]
async fn crishim_image_convert_makes_images_that_pull_whole_and_lazily() {
    use crishim_tests::{Daemon, DaemonOptions};
    let reg = Registry::start(RegistryOptions::default()).await.unwrap();
    let (tar, files) = layer();
    let second = LayerBuilder::new().file("opt/app/run", b"#!/bin/sh\n".to_vec(), 0o755);
    let image = Image::new(vec![
        Layer::from_tar(&tar, Compression::Gzip),
        second.build(Compression::Zstd),
    ]);
    reg.push("plain", "v1", &image).await.unwrap();
    let config = tempfile::NamedTempFile::new().unwrap();
    // A runtime that does not pull lazily.
    let mut whole = DaemonOptions::new();
    whole.images.push("lazy = false".into());
    let d = Daemon::start(whole).await.unwrap();
    let client = RegistryClient::new(RegistryConfig::default()).unwrap();
    for format in ["estargz", "zstd-chunked"] {
        let dst = format!("{}/lazy:{format}", reg.host());
        let o = std::process::Command::new(crishim_tests::daemon::daemon_bin())
            .args([
                "image",
                "convert",
                "--format",
                format,
                "--chunk-size",
                "65536",
                "--config",
            ])
            .arg(config.path())
            .arg(format!("{}/plain:v1", reg.host()))
            .arg(&dst)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{format}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(String::from_utf8_lossy(&o.stdout).contains("(2 layers)"));
        // Pulled whole, as any runtime would.
        d.pull(&dst)
            .await
            .unwrap_or_else(|e| panic!("{format}: {e}"));
        // Opened lazily, from the manifest's annotations.
        let reference = Reference::parse(&dst).unwrap();
        let (repo, manifest) = client.resolve(&reference, None).await.unwrap();
        let m: serde_json::Value = serde_json::from_slice(&manifest.bytes).unwrap();
        let first = &m["layers"][0];
        let annotations: HashMap<String, String> =
            serde_json::from_value(first["annotations"].clone()).unwrap();
        let digest = Digest::parse(first["digest"].as_str().unwrap()).unwrap();
        let size = first["size"].as_u64().unwrap();
        let Opened::Lazy(lazy) = open(&repo, &digest, size, &annotations, &Limits::default())
            .await
            .unwrap()
        else {
            panic!("{format}: not lazy")
        };
        assert_eq!(files_of(&repo, &lazy).await, files, "{format}");
    }
    d.stop();
}

// ---------------------------------------------------------------------------------------------
// Lazy pull through the daemon: real registry, real FUSE, real overlayfs, real containers.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crishim_tests::pods::{container_config, PodEnv};
use crishim_tests::{busybox_layer, DaemonOptions};

/// A data layer with what a lazy tree must get right: owners, setuid, a file of many chunks, a
/// symlink, a hard link; and a layer over it with a whiteout and an opaque directory.
fn data_image() -> Image {
    let big: Vec<u8> = (0..700_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let data = LayerBuilder::new()
        .dir("data", 0o755)
        .dir_owned("data/owned", 0o750, 1000, 1001)
        .file_owned("data/owned/secret", b"s3cret\n".to_vec(), 0o640, 1000, 1001)
        .file("data/small.txt", vec![b'k'; 1024], 0o644)
        .file("data/big.bin", big, 0o644)
        .file("data/suid", b"#!/bin/sh\n".to_vec(), 0o4755)
        .symlink("data/link", "small.txt")
        .hardlink("data/hard", "data/small.txt")
        .file("data/gone", b"x".to_vec(), 0o644)
        .dir("data/opq", 0o755)
        .file("data/opq/old", b"old".to_vec(), 0o644);
    let over = LayerBuilder::new()
        .whiteout("data/gone")
        .opaque("data/opq")
        .file("data/opq/new", b"new".to_vec(), 0o644);
    Image::new(vec![
        busybox_layer(),
        data.build(Compression::Gzip),
        over.build(Compression::Gzip),
    ])
}

fn convert(reg: &Registry, src: &str, format: &str) -> String {
    convert_with(reg, src, format, "")
}

/// `crishim image convert` with `config` (TOML) as its config file.
fn convert_with(reg: &Registry, src: &str, format: &str, config_toml: &str) -> String {
    let dst = format!("{}/lazy:{format}", reg.host());
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), config_toml).unwrap();
    let o = std::process::Command::new(crishim_tests::daemon::daemon_bin())
        .args([
            "image",
            "convert",
            "--format",
            format,
            "--chunk-size",
            "65536",
        ])
        .arg("--config")
        .arg(config.path())
        .arg(src)
        .arg(&dst)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    dst
}

/// Every entry below `root`: kind, mode, owner, size, content digest, link target, device,
/// link count, xattrs. Read from the host, as root.
fn facts(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let what = if m.is_file() {
                let data = std::fs::read(&p).unwrap_or_else(|e| {
                    // A lazy layer's server says why.
                    let log = root
                        .parent()
                        .map(|d| d.join("server.log"))
                        .unwrap_or_default();
                    let log = std::fs::read_to_string(log).unwrap_or_default();
                    panic!("reading {}: {e}\n{log}", p.display())
                });
                crishim_lazy::sha256(&data)
            } else if m.file_type().is_symlink() {
                std::fs::read_link(&p)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            } else {
                String::new()
            };
            let fact = format!(
                "{:o} {}:{} size={} nlink={} rdev={} {what} xattrs={:?}",
                m.mode(),
                m.uid(),
                m.gid(),
                if m.is_dir() { 0 } else { m.size() },
                if m.is_dir() { 0 } else { m.nlink() },
                m.rdev(),
                xattrs(&p)
            );
            out.insert(rel, fact);
            if m.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn xattrs(p: &Path) -> Vec<(String, Vec<u8>)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 4096];
    // SAFETY: the buffers outlive the calls and their sizes are passed.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for name in names[..n as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
    {
        let cname = std::ffi::CString::new(name).unwrap();
        let mut v = vec![0u8; 4096];
        let m =
            unsafe { libc::lgetxattr(c.as_ptr(), cname.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        v.truncate(m.max(0) as usize);
        out.push((String::from_utf8_lossy(name).into_owned(), v));
    }
    out.sort();
    out
}

fn lazy_dirs(root: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(root.join("images/lazy"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.join("mnt").is_dir())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

async fn lazy_info(d: &crishim_tests::Daemon, image: &str) -> serde_json::Value {
    let r = d.image_status_full(image, true).await.unwrap();
    serde_json::from_str(r.info.get("lazy").expect("info[\"lazy\"]")).unwrap()
}

/// Wait (a minute at most) for every byte of `image` to be local, and return its lazy status.
async fn wait_local(d: &crishim_tests::Daemon, image: &str) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let info = lazy_info(d, image).await;
        if info["state"] == "local" {
            return info;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the prefetch did not complete: {info}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A converted image is pulled lazily: PullImage returns once the TOCs are in, every layer is a
/// FUSE mount, and a container runs from it and reads its files before the prefetch is done
/// (it is held to a trickle). What the mounts show is, entry for entry, what a full pull of the
/// same image unpacks (modes, owners, links, whiteouts, opaque directories, bytes).
#[tokio::test]
async fn a_lazy_image_runs_before_it_is_local_and_shows_what_a_full_pull_shows() {
    let mut opts = DaemonOptions::new();
    opts.images.push("lazy_prefetch_bandwidth = 1".into());
    let env = PodEnv::start_with(opts).await;
    let plain = env.reg.push("plain", "v1", &data_image()).await.unwrap();
    let mut whole = DaemonOptions::new();
    whole.images.push("lazy = false".into());
    let full = crishim_tests::Daemon::start(whole).await.unwrap();
    for format in ["estargz", "zstd-chunked"] {
        let image = convert(&env.reg, &plain.tag_ref(), format);
        env.d.pull(&image).await.unwrap();
        full.pull(&image).await.unwrap();
        let mounts = lazy_dirs(&env.d.root_dir());
        let info = lazy_info(&env.d, &image).await;
        assert_eq!(info["state"], "lazy", "{format}: {info}");
        let o = std::process::Command::new(crishim_tests::daemon::daemon_bin())
            .args(["images", "--socket"])
            .arg(env.d.socket())
            .output()
            .unwrap();
        let listed = String::from_utf8_lossy(&o.stdout);
        assert!(
            listed
                .lines()
                .any(|l| l.contains(&format!("lazy:{format}")) && l.contains("% (lazy)")),
            "crishim images: {listed}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        // The data layers are lazy (zstd:chunked keeps busybox's tar as it was, so that layer is
        // the one the environment pulled already).
        let want = if format == "estargz" { 3 } else { 2 };
        assert_eq!(
            info["layers"].as_array().map(Vec::len),
            Some(want),
            "{format}: every layer not already local is lazy: {info}"
        );
        assert!(
            info["local_bytes"].as_u64() < info["size_bytes"].as_u64(),
            "{info}"
        );

        for dir in &mounts {
            let hex = dir.file_name().unwrap();
            let snapshot = full.root_dir().join("images/snapshots").join(hex);
            assert_eq!(
                facts(&dir.join("mnt")),
                facts(&snapshot),
                "{format}: the lazy layer differs from the full pull's"
            );
        }

        let (pod, ctr) = sleeping(&env, &format!("lazy-{format}"), &image).await;
        assert_eq!(
            env.d.exec_ok(&ctr, &["cat", "/data/small.txt"]).await,
            "k".repeat(1024)
        );
        assert_eq!(env.d.exec_ok(&ctr, &["cat", "/data/opq/new"]).await, "new");
        let listing = env
            .d
            .exec_ok(&ctr, &["ls", "-A", "/data", "/data/opq"])
            .await;
        assert!(
            !listing.contains("gone") && !listing.contains("old"),
            "{listing}"
        );
        let stat = env
            .d
            .exec_ok(
                &ctr,
                &[
                    "stat",
                    "-c",
                    "%a %u %g %h",
                    "/data/suid",
                    "/data/owned/secret",
                    "/data/hard",
                ],
            )
            .await;
        assert_eq!(stat, "4755 0 0 1\n640 1000 1001 1\n644 0 0 2\n", "{format}");
        let big = env
            .d
            .exec_sync(&ctr, &["cat", "/data/big.bin"], 30)
            .await
            .unwrap();
        let sum = crishim_lazy::sha256(&big.stdout);
        let want: Vec<_> = mounts
            .iter()
            .flat_map(|m| {
                facts(
                    &full
                        .root_dir()
                        .join("images/snapshots")
                        .join(m.file_name().unwrap()),
                )
            })
            .filter(|(path, _)| path == "data/big.bin")
            .collect();
        assert!(
            !want.is_empty() && want.iter().all(|(_, f)| f.contains(&sum)),
            "{format}: big.bin read in the container is not the full pull's: {sum} {want:?}"
        );
        assert_eq!(
            lazy_info(&env.d, &image).await["state"],
            "lazy",
            "the prefetch is held back"
        );
        gone(&env, &pod).await;
    }
    full.stop();
    env.stop();
}

/// A pod named `name` with one container sleeping in `image`: (pod, container).
async fn sleeping(env: &PodEnv, name: &str, image: &str) -> (String, String) {
    let pod_cfg = env.pod_config(name);
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let cfg = container_config("app", image, &["sleep", "3600"]);
    let ctr = env
        .d
        .run_container(&pod, &cfg, &pod_cfg)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", server_logs(&env.d.root_dir())));
    (pod, ctr)
}

/// Stop and remove `pod`.
async fn gone(env: &PodEnv, pod: &str) {
    env.d.stop_pod(pod).await.unwrap();
    env.d.remove_pod(pod).await.unwrap();
}

/// Every lazy layer server's log, for a failure to show.
fn server_logs(root: &Path) -> String {
    lazy_dirs(root)
        .iter()
        .map(|d| std::fs::read_to_string(d.join("server.log")).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n----\n")
}

fn servers_of(root: &Path) -> usize {
    let needle = root.join("images/lazy");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| {
            let c = String::from_utf8_lossy(c);
            c.contains("crishim-lazyfs") && c.contains(needle.to_str().unwrap())
        })
        .count()
}

/// The prefetch makes every lazy layer an ordinary snapshot, equal to a full pull's. A
/// container started before keeps reading; one started after runs from the snapshots (it keeps
/// running once the first container, and with it every lazy mount, is gone). RemoveImage while
/// a container runs behaves as for a full pull, and once nothing uses the layers their
/// snapshots, chunks, mounts and servers are all gone.
#[tokio::test]
async fn the_prefetch_makes_ordinary_snapshots_and_everything_goes_once_unused() {
    // Slow enough that the first container starts on the lazy mounts.
    let mut opts = DaemonOptions::new();
    opts.images.push("lazy_prefetch_bandwidth = 400000".into());
    let env = PodEnv::start_with(opts).await;
    let plain = env.reg.push("plain", "v1", &data_image()).await.unwrap();
    let mut whole = DaemonOptions::new();
    whole.images.push("lazy = false".into());
    let full = crishim_tests::Daemon::start(whole).await.unwrap();
    let image = convert(&env.reg, &plain.tag_ref(), "estargz");
    env.d.pull(&image).await.unwrap();
    full.pull(&image).await.unwrap();
    let lazy = lazy_dirs(&env.d.root_dir());
    assert_eq!(lazy.len(), 3);

    let (pod, before) = sleeping(&env, "before", &image).await;
    assert_eq!(
        env.d.exec_ok(&before, &["cat", "/data/opq/new"]).await,
        "new"
    );

    let info = wait_local(&env.d, &image).await;
    assert_eq!(info["local_bytes"], info["size_bytes"], "{info}");
    for dir in &lazy {
        let hex = dir.file_name().unwrap();
        assert_eq!(
            facts(&env.d.root_dir().join("images/snapshots").join(hex)),
            facts(&full.root_dir().join("images/snapshots").join(hex)),
            "the prefetched snapshot differs from the full pull's"
        );
        assert!(
            !dir.join("cache").exists(),
            "the chunk cache outlived the prefetch"
        );
    }
    let big_before = env
        .d
        .exec_sync(&before, &["cat", "/data/big.bin"], 30)
        .await
        .unwrap();
    assert_eq!(big_before.stdout.len(), 700_000);

    let (pod2, after) = sleeping(&env, "after", &image).await;
    // The first container goes: nothing holds the lazy mounts, and they go with their servers.
    gone(&env, &pod).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while (!lazy_dirs(&env.d.root_dir()).is_empty() || servers_of(&env.d.root_dir()) > 0)
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        lazy_dirs(&env.d.root_dir()).is_empty(),
        "lazy layers left: {}",
        env.d
            .log_text()
            .lines()
            .filter(|l| l.contains("lazy") || l.contains("garbage"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(servers_of(&env.d.root_dir()), 0, "lazy layer servers left");
    let big_after = env
        .d
        .exec_sync(&after, &["cat", "/data/big.bin"], 30)
        .await
        .unwrap();
    assert_eq!(big_after.stdout, big_before.stdout);

    // RemoveImage with a container running from it: as for a full pull.
    env.d.remove_image(&image).await.unwrap();
    assert_eq!(
        env.d
            .exec_ok(&after, &["cat", "/data/small.txt"])
            .await
            .len(),
        1024
    );
    gone(&env, &pod2).await;
    for dir in &lazy {
        let hex = dir.file_name().unwrap();
        assert!(
            !env.d.root_dir().join("images/snapshots").join(hex).exists(),
            "a removed image's snapshot outlived its last container"
        );
    }
    full.stop();
    env.stop();
}

/// Flip a byte in the middle of chunk `n` of `path` in the registry's copy of `layer`'s blob;
/// that chunk and all of the file's chunks.
fn tamper_chunk(reg: &Registry, layer: &LazyLayer, path: &str, n: usize) -> (Chunk, Vec<Chunk>) {
    let file = layer.toc.entries.iter().find(|e| e.path == path).unwrap();
    let Kind::File { chunks, .. } = &file.kind else {
        panic!("{path} is not a regular file")
    };
    let victim = chunks[n].clone();
    let stored = reg.blob_path(layer.digest.as_str());
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes[((victim.compressed.start + victim.compressed.end) / 2) as usize] ^= 0x55;
    std::fs::write(&stored, &bytes).unwrap();
    (victim, chunks.clone())
}

/// A chunk changed in the registry's storage after the image was made: reading it fails with
/// `EIO` (never other bytes) and is counted, while the layer's other files read; the prefetch
/// finds the whole blob wrong and quarantines the layer, which ImageStatus reports and which
/// no new container may use.
#[tokio::test]
async fn a_tampered_chunk_is_never_served_and_quarantines_its_layer() {
    let env = PodEnv::start().await;
    let plain = env.reg.push("plain", "v1", &data_image()).await.unwrap();
    let image = convert(&env.reg, &plain.tag_ref(), "estargz");
    // The data layer's blob and the chunks of big.bin in it.
    let client = RegistryClient::new(RegistryConfig::default()).unwrap();
    let (repo, manifest) = client
        .resolve(&Reference::parse(&image).unwrap(), None)
        .await
        .unwrap();
    let m: serde_json::Value = serde_json::from_slice(&manifest.bytes).unwrap();
    let layer = &m["layers"][1];
    let digest = Digest::parse(layer["digest"].as_str().unwrap()).unwrap();
    let annotations: HashMap<String, String> =
        serde_json::from_value(layer["annotations"].clone()).unwrap();
    let size = layer["size"].as_u64().unwrap();
    let Opened::Lazy(l) = open(&repo, &digest, size, &annotations, &Limits::default())
        .await
        .unwrap()
    else {
        panic!("not lazy")
    };
    let (victim, _) = tamper_chunk(&env.reg, &l, "data/big.bin", 3);

    env.d.pull(&image).await.unwrap();
    let dir = lazy_dirs(&env.d.root_dir())
        .into_iter()
        .find(|d| {
            std::fs::read_to_string(d.join("spec.json"))
                .unwrap_or_default()
                .contains(digest.as_str())
        })
        .expect("the data layer is lazy");
    let mnt = dir.join("mnt");
    let f = std::fs::File::open(mnt.join("data/big.bin")).unwrap();
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; victim.size as usize];
    let e = f.read_exact_at(&mut buf, victim.file_offset).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let mut first = vec![0u8; 1000];
    f.read_exact_at(&mut first, 0).unwrap();
    assert_eq!(
        std::fs::read(mnt.join("data/small.txt")).unwrap(),
        vec![b'k'; 1024]
    );

    // The server rewrites its status every second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let counted = |info: &serde_json::Value| {
        info["layers"]
            .as_array()
            .is_some_and(|ls| ls.iter().any(|l| l["chunk_errors"].as_u64() >= Some(1)))
    };
    let info = loop {
        let info = lazy_info(&env.d, &image).await;
        let done = info["state"] == "quarantined" && counted(&info);
        if done || std::time::Instant::now() > deadline {
            break info;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(info["state"], "quarantined", "{info}");
    let layer_info = info["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["digest"] == digest.as_str())
        .unwrap();
    assert!(layer_info["chunk_errors"].as_u64() >= Some(1), "{info}");
    assert!(
        layer_info["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("digest"),
        "{info}"
    );
    let pod_cfg = env.pod_config("quarantine");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let e = env
        .d
        .create_container(&pod, &container_config("q", &image, &["true"]), &pod_cfg)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("quarantined"), "{}", e.message());
    gone(&env, &pod).await;
    env.stop();
}

/// The daemon killed mid-prefetch: the lazy layers' servers run on, a running container reads
/// every file; the restarted daemon finds the layers, starts new containers on them, and the
/// prefetch completes.
#[tokio::test]
async fn a_daemon_killed_mid_prefetch_leaves_lazy_layers_serving() {
    let mut opts = DaemonOptions::new();
    opts.images.push("lazy_prefetch_bandwidth = 100000".into());
    let mut env = PodEnv::start_with(opts).await;
    let plain = env.reg.push("plain", "v1", &data_image()).await.unwrap();
    let image = convert(&env.reg, &plain.tag_ref(), "zstd-chunked");
    env.d.pull(&image).await.unwrap();
    let (pod, ctr) = sleeping(&env, "survivor", &image).await;
    assert_eq!(lazy_info(&env.d, &image).await["state"], "lazy");
    let servers = servers_of(&env.d.root_dir());
    assert!(servers >= 1, "{servers} servers");

    env.d.kill();
    assert_eq!(
        servers_of(&env.d.root_dir()),
        servers,
        "a server died with the daemon"
    );
    for dir in lazy_dirs(&env.d.root_dir()) {
        let big = dir.join("mnt/data/big.bin");
        if big.exists() {
            assert_eq!(std::fs::read(&big).unwrap().len(), 700_000);
        }
    }
    let pid = {
        let status = std::fs::read_dir("/proc").unwrap().flatten().find(|e| {
            std::fs::read_to_string(e.path().join("cmdline"))
                .is_ok_and(|c| c.starts_with("sleep\0") && c.contains("3600"))
        });
        status.map(|e| e.file_name().to_string_lossy().into_owned())
    };
    let pid = pid.expect("the container's process");
    let via_container = std::fs::read(format!("/proc/{pid}/root/data/small.txt")).unwrap();
    assert_eq!(via_container, vec![b'k'; 1024]);

    env.d.restart().await.unwrap();
    assert_eq!(env.d.exec_ok(&ctr, &["cat", "/data/opq/new"]).await, "new");
    let (pod2, ctr2) = sleeping(&env, "newcomer", &image).await;
    assert_eq!(
        env.d.exec_ok(&ctr2, &["cat", "/data/owned/secret"]).await,
        "s3cret\n"
    );
    wait_local(&env.d, &image).await;
    for p in [&pod, &pod2] {
        gone(&env, p).await;
    }
    env.stop();
}

/// A registry that ignores `Range` (answers 200 with the whole blob): the lazy layers are
/// pulled whole instead, with one warning for the pull, and the image runs.
#[tokio::test]
async fn a_registry_without_range_gets_a_full_pull_logged_once() {
    use crishim_tests::{Throttle, ThrottleOptions};
    let env = PodEnv::start().await;
    let plain = env.reg.push("plain", "v1", &data_image()).await.unwrap();
    convert(&env.reg, &plain.tag_ref(), "estargz");
    let proxy = Throttle::in_front_of(&env.reg, ThrottleOptions::new().ignore_range())
        .await
        .unwrap();
    let image = format!("{}/lazy:estargz", proxy.host());
    env.d.pull(&image).await.unwrap();
    assert!(proxy.ranged_requests() >= 1, "no range request was tried");
    assert!(
        lazy_dirs(&env.d.root_dir()).is_empty(),
        "a lazy layer was mounted"
    );
    assert_eq!(lazy_info(&env.d, &image).await["state"], "local");
    let warned = env
        .d
        .log_text()
        .matches("lazy layers are pulled whole")
        .count();
    assert_eq!(warned, 1, "the fallback is logged once");
    let (pod, ctr) = sleeping(&env, "norange", &image).await;
    assert_eq!(env.d.exec_ok(&ctr, &["cat", "/data/opq/new"]).await, "new");
    gone(&env, &pod).await;
    env.stop();
}

/// A registry that stalls in the middle of a chunk: the read fails with `EIO` once
/// `lazy_read_timeout` passes without progress, rather than hang the reader; what is local
/// still reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_stalling_mid_chunk_fails_the_read_within_the_timeout() {
    use crishim_tests::{Throttle, ThrottleOptions};
    let mut opts = DaemonOptions::new();
    opts.images.push("lazy_read_timeout = \"2s\"".into());
    // The prefetch is held back, so every read goes to the registry.
    opts.images.push("lazy_prefetch_bandwidth = 1".into());
    let env = PodEnv::start_with(opts).await;
    let plain = env.reg.push("plain", "v1", &data_image()).await.unwrap();
    convert(&env.reg, &plain.tag_ref(), "estargz");
    let proxy = Throttle::in_front_of(&env.reg, ThrottleOptions::new())
        .await
        .unwrap();
    let image = format!("{}/lazy:estargz", proxy.host());
    env.d.pull(&image).await.unwrap();
    let dir = lazy_dirs(&env.d.root_dir())
        .into_iter()
        .find(|d| d.join("mnt/data/big.bin").exists())
        .expect("the data layer is lazy");
    // Reads block: off the runtime, which runs the proxy.
    let read = |p: std::path::PathBuf| tokio::task::spawn_blocking(move || std::fs::read(p));
    let small = read(dir.join("mnt/data/small.txt"))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}\n{}", server_logs(&env.d.root_dir())));
    assert_eq!(small, vec![b'k'; 1024]);
    proxy.set_stall_ranged_after(Some(100));
    let started = std::time::Instant::now();
    let e = read(dir.join("mnt/data/big.bin"))
        .await
        .unwrap()
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(
        took >= std::time::Duration::from_millis(1500) && took < std::time::Duration::from_secs(10),
        "the stalled read failed after {took:?}"
    );
    assert!(proxy.stalled_replies() >= 1);
    // Local chunks are still served.
    let small = read(dir.join("mnt/data/small.txt")).await.unwrap().unwrap();
    assert_eq!(small, vec![b'k'; 1024]);
    drop(proxy);
    env.stop();
}

/// An eStargz layer whose TOC is rewritten (`edit`) and pushed with a matching TOC digest, so
/// that only the TOC's own content is wrong: the image's blob, its diff ID and its annotations.
fn estargz_with_toc(
    tar: &[u8],
    edit: impl Fn(&mut serde_json::Value) -> Vec<u8>,
) -> (Layer, String) {
    use std::io::{Read, Write};
    let mut blob = Vec::new();
    write_layer(tar, Format::Estargz, 65536, &mut blob).unwrap();
    let footer_at = blob.len() - crishim_lazy::estargz::FOOTER_SIZE;
    let toc_at =
        crishim_lazy::estargz::parse_footer(&blob[footer_at..], blob.len() as u64).unwrap();
    let json = crishim_lazy::estargz::toc_json(&blob[toc_at as usize..footer_at], 1 << 30).unwrap();
    let mut toc: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let json = edit(&mut toc);
    let member = crishim_lazy::estargz::toc_member(&json);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&member).unwrap();
    let mut out = blob[..toc_at as usize].to_vec();
    out.extend(gz.finish().unwrap());
    out.extend(crishim_lazy::estargz::footer(toc_at));
    let mut plain = Vec::new();
    flate2::read::MultiGzDecoder::new(&out[..])
        .read_to_end(&mut plain)
        .unwrap();
    let layer = Layer {
        digest: crishim_lazy::sha256(&out),
        diff_id: crishim_lazy::sha256(&plain),
        blob: out,
        compression: Compression::Gzip,
        media_type: None,
    };
    (layer, crishim_lazy::sha256(&json))
}

/// Hostile TOCs, each carrying the right digest: one over the size cap, one whose chunk points
/// past the blob's data, one with a path out of the layer. None is mounted: each layer is pulled
/// whole (its blob and diff ID checked as any layer's), and the container sees the layer's files.
#[tokio::test]
async fn hostile_tocs_are_refused_and_the_layer_is_pulled_whole() {
    let env = PodEnv::start().await;
    let (tar, _) = layer();
    type Edit = Box<dyn Fn(&mut serde_json::Value) -> Vec<u8>>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "over-the-cap",
            Box::new(|toc| {
                // 65 MiB of JSON whitespace: small compressed, over the 64 MiB cap.
                let mut j = serde_json::to_vec(toc).unwrap();
                j.extend(std::iter::repeat_n(b' ', 65 << 20));
                j
            }),
        ),
        (
            "outside-the-blob",
            Box::new(|toc| {
                for e in toc["entries"].as_array_mut().unwrap() {
                    if e["offset"].as_i64().unwrap_or(0) > 0 {
                        e["offset"] = serde_json::json!(1i64 << 40);
                        break;
                    }
                }
                serde_json::to_vec(toc).unwrap()
            }),
        ),
        (
            "escaping-path",
            Box::new(|toc| {
                toc["entries"][0]["name"] = serde_json::json!("../../etc/evil");
                serde_json::to_vec(toc).unwrap()
            }),
        ),
    ];
    let pusher = env.reg.pusher().unwrap();
    for (name, edit) in cases {
        let (hostile, toc_digest) = estargz_with_toc(&tar, edit);
        let image = Image::new(vec![busybox_layer(), hostile]);
        let pushed = env.reg.push("hostile", name, &image).await.unwrap();
        // The same manifest, with the layer's annotations.
        let mut m: serde_json::Value = serde_json::from_slice(&image.manifest_json()).unwrap();
        m["layers"][1]["annotations"] =
            serde_json::json!({ crishim_lazy::estargz::TOC_DIGEST: toc_digest });
        let media = m["mediaType"].as_str().unwrap().to_string();
        pusher
            .push_manifest("hostile", name, &media, &serde_json::to_vec(&m).unwrap())
            .await
            .unwrap();
        let reference = pushed.tag_ref();
        env.d
            .pull(&reference)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            lazy_dirs(&env.d.root_dir()).is_empty(),
            "{name}: a hostile TOC was mounted"
        );
        assert_eq!(
            lazy_info(&env.d, &reference).await["state"],
            "local",
            "{name}"
        );
        let (pod, ctr) = sleeping(&env, name, &reference).await;
        let readme = env.d.exec_ok(&ctr, &["cat", "/usr/share/doc/readme"]).await;
        assert_eq!(readme, "r".repeat(5000), "{name}");
        gone(&env, &pod).await;
    }
    let log = env.d.log_text();
    for why in ["is over", "outside the blob", "escapes the layer"] {
        assert!(
            log.lines()
                .any(|l| l.contains("pulling a lazy layer whole") && l.contains(why)),
            "no fallback logged for {why:?}: {}",
            log.lines()
                .filter(|l| l.contains("whole"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    env.stop();
}

/// A registry that wants credentials, given only with the pull (as the kubelet gives an image
/// pull secret): the lazy layers' servers fetch chunks and prefetch with them, the image runs
/// and becomes local. Nothing is served to a pull without them.
#[tokio::test]
async fn lazy_layers_fetch_with_the_pulls_credentials() {
    let env = PodEnv::start().await;
    let reg = Registry::start(RegistryOptions::default().with_basic_auth("lazy", "s3cret"))
        .await
        .unwrap();
    let plain = reg.push("plain", "v1", &data_image()).await.unwrap();
    let auth = format!(
        "[registry.configs.\"{}\".auth]\nusername = \"lazy\"\npassword = \"s3cret\"\n",
        reg.host()
    );
    let image = convert_with(&reg, &plain.tag_ref(), "estargz", &auth);
    assert!(
        env.d.pull(&image).await.is_err(),
        "pulled without credentials"
    );
    let creds = crishim_tests::cri::basic_auth("lazy", "s3cret");
    env.d.pull_with_auth(&image, Some(creds)).await.unwrap();
    assert_eq!(lazy_info(&env.d, &image).await["state"], "lazy");
    let (pod, ctr) = sleeping(&env, "authed", &image).await;
    let big = env
        .d
        .exec_sync(&ctr, &["cat", "/data/big.bin"], 30)
        .await
        .unwrap();
    assert_eq!(big.stdout.len(), 700_000);
    wait_local(&env.d, &image).await;
    gone(&env, &pod).await;
    env.stop();
}
