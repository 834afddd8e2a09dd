//! `crishim image convert`: an image pulled from SRC, each layer written again as eStargz or
//! zstd:chunked ([`crate::write`]), and pushed to DST with its new config (the layers' new diff
//! IDs) and a manifest whose layers carry the annotations that make them lazy. Both ends go
//! through the registry client with the node's registry configuration.

use std::io::Read as _;

use bytes::Bytes;
use futures::TryStreamExt as _;
use serde_json::{json, Value};

use crishim_images::registry::{Credentials, RegistryClient, Repository};
use crishim_images::{host_arch, Digest, ImageError, Reference};

use crate::toc::Format;
use crate::write::{write_layer, WriteError, Written};

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Registry(#[from] ImageError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error("{0}")]
    Image(String),
    #[error("no endpoint of {0} answers to push to")]
    NoPushTarget(String),
}

fn bad(what: impl std::fmt::Display) -> ConvertError {
    ConvertError::Image(what.to_string())
}

/// What a conversion made.
#[derive(Debug, Clone)]
pub struct Converted {
    pub manifest_digest: Digest,
    /// Each layer: its digest in SRC, and what it became.
    pub layers: Vec<(String, Written)>,
}

/// Bounds on what is converted: a layer is held whole while it is written again.
#[derive(Debug, Clone, Copy)]
pub struct ConvertLimits {
    pub layer_bytes: u64,
    pub chunk_size: u64,
}

impl Default for ConvertLimits {
    fn default() -> Self {
        ConvertLimits {
            layer_bytes: 16 << 30,
            chunk_size: 4 << 20,
        }
    }
}

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// Convert the image `src` (for this node's platform, where it is an index) to `format`, and
/// push it as `dst`.
pub async fn convert(
    client: &RegistryClient,
    src: &Reference,
    dst: &Reference,
    creds: (Option<&Credentials>, Option<&Credentials>),
    format: Format,
    limits: ConvertLimits,
) -> Result<Converted, ConvertError> {
    let (repo, top) = client.resolve(src, creds.0).await?;
    let top_json: Value = serde_json::from_slice(&top.bytes)
        .map_err(|e| bad(format!("the manifest of {src}: {e}")))?;
    let manifest = if top_json.get("manifests").is_some() {
        let chosen = top_json["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| {
                m["platform"]["os"] == "linux" && m["platform"]["architecture"] == host_arch()
            })
            .and_then(|m| m["digest"].as_str())
            .ok_or_else(|| bad(format!("{src} has no image for linux/{}", host_arch())))?;
        let m = repo.manifest(chosen).await?;
        serde_json::from_slice::<Value>(&m.bytes)
            .map_err(|e| bad(format!("manifest {chosen}: {e}")))?
    } else {
        top_json
    };
    let config_digest = descriptor_digest(&manifest["config"])?;
    let config = repo.small_blob(&config_digest).await?;
    let mut config: Value =
        serde_json::from_slice(&config).map_err(|e| bad(format!("the config of {src}: {e}")))?;
    let layers = manifest["layers"]
        .as_array()
        .ok_or_else(|| bad(format!("the manifest of {src} has no layers")))?
        .clone();
    if config["rootfs"]["diff_ids"].as_array().map(Vec::len) != Some(layers.len()) {
        return Err(bad(format!(
            "the config of {src} lists another number of diff_ids than the manifest has layers"
        )));
    }
    let target = push_target(client, dst, creds.1).await?;
    let mut converted = Vec::new();
    let mut descriptors = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let digest = descriptor_digest(layer)?;
        let media_type = layer["mediaType"].as_str().unwrap_or_default();
        let tar = layer_tar(&repo, &digest, media_type, limits.layer_bytes).await?;
        let mut blob = Vec::new();
        let written = write_layer(&tar, format, limits.chunk_size, &mut blob)?;
        drop(tar);
        target.push_blob(Bytes::from(blob)).await?;
        config["rootfs"]["diff_ids"][i] = json!(written.diff_id);
        let annotations: serde_json::Map<String, Value> = written
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        descriptors.push(json!({
            "mediaType": match format {
                Format::Estargz => "application/vnd.oci.image.layer.v1.tar+gzip",
                Format::ZstdChunked => "application/vnd.oci.image.layer.v1.tar+zstd",
            },
            "digest": written.digest,
            "size": written.size,
            "annotations": annotations,
        }));
        converted.push((digest.to_string(), written));
    }
    let config = Bytes::from(serde_json::to_vec(&config).map_err(bad)?);
    let config_size = config.len();
    let config_digest = target.push_blob(config).await?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest.to_string(), "size": config_size},
        "layers": descriptors,
    });
    let bytes = Bytes::from(serde_json::to_vec(&manifest).map_err(bad)?);
    let manifest_digest = target
        .push_manifest(&dst.manifest_ref(), OCI_MANIFEST, bytes)
        .await?;
    Ok(Converted {
        manifest_digest,
        layers: converted,
    })
}

fn descriptor_digest(d: &Value) -> Result<Digest, ConvertError> {
    let s = d["digest"]
        .as_str()
        .ok_or_else(|| bad("a descriptor without a digest"))?;
    Ok(Digest::parse(s)?)
}

/// The first of `dst`'s own endpoints that answers.
async fn push_target<'c>(
    client: &'c RegistryClient,
    dst: &Reference,
    creds: Option<&Credentials>,
) -> Result<Repository<'c>, ConvertError> {
    for repo in client.push_targets(dst, creds) {
        if repo.reachable().await {
            return Ok(repo);
        }
    }
    Err(ConvertError::NoPushTarget(dst.registry.clone()))
}

/// A layer's tar: its blob fetched whole and checked, then decompressed, at most `cap` bytes
/// each.
async fn layer_tar(
    repo: &Repository<'_>,
    digest: &Digest,
    media_type: &str,
    cap: u64,
) -> Result<Vec<u8>, ConvertError> {
    let mut blob = Vec::new();
    let mut stream = std::pin::pin!(repo.blob_stream(digest).await?);
    while let Some(chunk) = stream.try_next().await? {
        if (blob.len() + chunk.len()) as u64 > cap {
            return Err(bad(format!("layer {digest} is over {cap} bytes")));
        }
        blob.extend_from_slice(&chunk);
    }
    if &Digest::of(&blob) != digest {
        return Err(bad(format!("layer {digest} does not match its digest")));
    }
    let reader: Box<dyn std::io::Read> = if media_type.ends_with("gzip") {
        Box::new(flate2::read::MultiGzDecoder::new(&blob[..]))
    } else if media_type.ends_with("zstd") {
        Box::new(crishim_images::unpack::zstd_decoder(&blob[..]).map_err(bad)?)
    } else if media_type.ends_with("tar") {
        Box::new(&blob[..])
    } else {
        return Err(bad(format!(
            "layer {digest} is of media type {media_type:?}"
        )));
    };
    let mut tar = Vec::new();
    reader
        .take(cap + 1)
        .read_to_end(&mut tar)
        .map_err(|e| bad(format!("layer {digest}: {e}")))?;
    if tar.len() as u64 > cap {
        return Err(bad(format!(
            "layer {digest} decompresses to over {cap} bytes"
        )));
    }
    Ok(tar)
}
