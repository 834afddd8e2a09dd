//! Lazy layers against a real registry (`docker-registry` on loopback): a layer written as eStargz
//! and as zstd:chunked is pushed; its TOC is fetched with range requests and checked against its
//! annotations, and every file is read back chunk by chunk. A chunk whose bytes were changed in
//! the registry's storage is refused, never returned.

use std::collections::HashMap;

use crishim_images::registry::{RegistryClient, RegistryConfig};
use crishim_images::{Digest, Reference};
use crishim_lazy::fetch::{open, LazyLayer, Opened};
use crishim_lazy::write::write_layer;
use crishim_lazy::{Format, Kind, Limits};
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
        let big = lazy
            .toc
            .entries
            .iter()
            .find(|e| e.path == "usr/lib/big.so")
            .unwrap();
        let Kind::File { chunks, .. } = &big.kind else {
            panic!()
        };
        let victim = &chunks[2];
        let hex = digest.as_str().trim_start_matches("sha256:");
        let stored = reg
            .storage_dir()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data");
        let mut bytes = std::fs::read(&stored).unwrap();
        let at = ((victim.compressed.start + victim.compressed.end) / 2) as usize;
        bytes[at] ^= 0x55;
        std::fs::write(&stored, &bytes).unwrap();
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
    let d = Daemon::start(DaemonOptions::new()).await.unwrap();
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
