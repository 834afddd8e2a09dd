//! Hand-built OCI / Docker images: layers, configs, manifests, indexes, and a pusher speaking
//! the registry HTTP API v2.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::OnceLock;

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;
use sha2::{Digest as _, Sha256};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
pub const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";
pub const DOCKER_LAYER_ZSTD: &str = "application/vnd.docker.image.rootfs.diff.tar.zstd";

/// Fixed mtime for every tar entry, so layers are reproducible.
const MTIME: u64 = 1_700_000_000;

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The hex part of a `sha256:<hex>` digest.
pub fn digest_hex(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

/// OCI chain IDs of a list of diff IDs: `chain[0] = diff[0]`,
/// `chain[n] = sha256(chain[n-1] + " " + diff[n])`.
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for d in diff_ids {
        let next = match out.last() {
            None => d.clone(),
            Some(prev) => sha256_digest(format!("{prev} {d}").as_bytes()),
        };
        out.push(next);
    }
    out
}

/// The OCI architecture name of the machine running the tests.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "arm" => "arm",
        "powerpc64" => "ppc64le",
        "riscv64" => "riscv64",
        "s390x" => "s390x",
        other => other,
    }
}

/// An architecture that is not the host's (for multi-platform indexes).
pub fn foreign_arch() -> &'static str {
    if host_arch() == "arm64" {
        "amd64"
    } else {
        "arm64"
    }
}

/// Layer compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// Compress `data`.
pub fn compress(data: &[u8], c: Compression) -> Vec<u8> {
    match c {
        Compression::None => data.to_vec(),
        Compression::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(data).expect("gzip into memory");
            enc.finish().expect("gzip into memory")
        }
        Compression::Zstd => zstd::encode_all(data, 3).expect("zstd into memory"),
    }
}

/// Manifest flavour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    /// OCI image manifest / index.
    #[default]
    Oci,
    /// Docker image manifest v2 schema 2 / manifest list.
    Docker,
}

/// One entry of a layer built from memory.
#[derive(Clone, Debug)]
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
        uid: u64,
        gid: u64,
    },
    File {
        path: String,
        data: Vec<u8>,
        mode: u32,
        uid: u64,
        gid: u64,
    },
    Symlink {
        path: String,
        target: String,
    },
    Hardlink {
        path: String,
        target: String,
    },
    /// A character device node, owned by root.
    CharDevice {
        path: String,
        major: u32,
        minor: u32,
        mode: u32,
    },
}

/// Builds a well-formed layer tar from in-memory entries (appended in order).
#[derive(Clone, Debug, Default)]
pub struct LayerBuilder {
    entries: Vec<Entry>,
}

fn rel(path: &str) -> String {
    path.trim_start_matches('/').to_string()
}

impl LayerBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn entry(mut self, e: Entry) -> Self {
        self.entries.push(e);
        self
    }

    pub fn dir(self, path: &str, mode: u32) -> Self {
        self.dir_owned(path, mode, 0, 0)
    }

    pub fn dir_owned(self, path: &str, mode: u32, uid: u64, gid: u64) -> Self {
        self.entry(Entry::Dir {
            path: rel(path),
            mode,
            uid,
            gid,
        })
    }

    pub fn file(self, path: &str, data: impl Into<Vec<u8>>, mode: u32) -> Self {
        self.file_owned(path, data, mode, 0, 0)
    }

    pub fn file_owned(
        self,
        path: &str,
        data: impl Into<Vec<u8>>,
        mode: u32,
        uid: u64,
        gid: u64,
    ) -> Self {
        self.entry(Entry::File {
            path: rel(path),
            data: data.into(),
            mode,
            uid,
            gid,
        })
    }

    pub fn symlink(self, path: &str, target: &str) -> Self {
        self.entry(Entry::Symlink {
            path: rel(path),
            target: target.to_string(),
        })
    }

    /// A hardlink `path` to `target` (a path inside the layer).
    pub fn hardlink(self, path: &str, target: &str) -> Self {
        self.entry(Entry::Hardlink {
            path: rel(path),
            target: rel(target),
        })
    }

    /// A character device node `major:minor` (e.g. 1:3, `/dev/null`), owned by root.
    pub fn char_device(self, path: &str, major: u32, minor: u32, mode: u32) -> Self {
        self.entry(Entry::CharDevice {
            path: rel(path),
            major,
            minor,
            mode,
        })
    }

    /// An AUFS whiteout deleting `path` of lower layers: an empty file `DIR/.wh.NAME`.
    pub fn whiteout(self, path: &str) -> Self {
        let p = rel(path);
        let (dir, name) = match p.rsplit_once('/') {
            Some((d, n)) => (format!("{d}/"), n.to_string()),
            None => (String::new(), p.clone()),
        };
        self.file(&format!("{dir}.wh.{name}"), Vec::new(), 0o644)
    }

    /// Mark `dir` opaque (hides lower layers' content): an empty file `DIR/.wh..wh..opq`.
    pub fn opaque(self, dir: &str) -> Self {
        let d = rel(dir);
        let d = d.trim_end_matches('/');
        self.file(&format!("{d}/.wh..wh..opq"), Vec::new(), 0o644)
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The uncompressed tar (GNU headers, fixed mtimes, two zero blocks at the end).
    pub fn tar(&self) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in &self.entries {
            let mut h = tar::Header::new_gnu();
            h.set_mtime(MTIME);
            h.set_uid(0);
            h.set_gid(0);
            match e {
                Entry::Dir {
                    path,
                    mode,
                    uid,
                    gid,
                } => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(*mode);
                    h.set_uid(*uid);
                    h.set_gid(*gid);
                    h.set_size(0);
                    let p = format!("{}/", path.trim_end_matches('/'));
                    b.append_data(&mut h, p, std::io::empty()).expect("tar dir");
                }
                Entry::File {
                    path,
                    data,
                    mode,
                    uid,
                    gid,
                } => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    h.set_uid(*uid);
                    h.set_gid(*gid);
                    h.set_size(data.len() as u64);
                    b.append_data(&mut h, path, &data[..]).expect("tar file");
                }
                Entry::Symlink { path, target } => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    h.set_size(0);
                    b.append_link(&mut h, path, target).expect("tar symlink");
                }
                Entry::Hardlink { path, target } => {
                    h.set_entry_type(tar::EntryType::Link);
                    h.set_mode(0o644);
                    h.set_size(0);
                    b.append_link(&mut h, path, target).expect("tar hardlink");
                }
                Entry::CharDevice {
                    path,
                    major,
                    minor,
                    mode,
                } => {
                    h.set_entry_type(tar::EntryType::Char);
                    h.set_mode(*mode);
                    h.set_size(0);
                    h.set_device_major(*major).expect("device major");
                    h.set_device_minor(*minor).expect("device minor");
                    b.append_data(&mut h, path, std::io::empty())
                        .expect("tar device");
                }
            }
        }
        b.into_inner().expect("tar into memory")
    }

    pub fn build(&self, c: Compression) -> Layer {
        Layer::from_tar(&self.tar(), c)
    }
}

/// A tar written header by header with no path checks at all, for hostile layers
/// (`..` components, absolute link targets…). Names and link names must fit in 100 bytes.
#[derive(Clone, Debug, Default)]
pub struct RawTar {
    buf: Vec<u8>,
}

impl RawTar {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes written so far (the offset of the next header).
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Append one entry: a ustar header with `name` and `link` written verbatim, then `data`
    /// padded to 512 bytes.
    pub fn entry(
        &mut self,
        kind: tar::EntryType,
        name: &str,
        link: &str,
        mode: u32,
        data: &[u8],
    ) -> &mut Self {
        let mut h = tar::Header::new_ustar();
        {
            let u = h.as_ustar_mut().expect("ustar header");
            assert!(name.len() <= u.name.len(), "raw tar name too long: {name}");
            assert!(
                link.len() <= u.linkname.len(),
                "raw tar link too long: {link}"
            );
            u.name[..name.len()].copy_from_slice(name.as_bytes());
            u.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(MTIME);
        h.set_size(data.len() as u64);
        h.set_cksum();
        self.buf.extend_from_slice(h.as_bytes());
        self.buf.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.buf.extend(std::iter::repeat_n(0u8, pad));
        self
    }

    pub fn file(&mut self, name: &str, data: &[u8], mode: u32) -> &mut Self {
        self.entry(tar::EntryType::Regular, name, "", mode, data)
    }

    pub fn dir(&mut self, name: &str, mode: u32) -> &mut Self {
        self.entry(tar::EntryType::Directory, name, "", mode, &[])
    }

    pub fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.entry(tar::EntryType::Symlink, name, target, 0o777, &[])
    }

    pub fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.entry(tar::EntryType::Link, name, target, 0o644, &[])
    }

    /// The archive with its two terminating zero blocks.
    pub fn finish(&self) -> Vec<u8> {
        let mut out = self.buf.clone();
        out.extend(std::iter::repeat_n(0u8, 1024));
        out
    }

    /// The bytes written so far, without the end-of-archive blocks.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// A layer blob as pushed.
#[derive(Clone, Debug)]
pub struct Layer {
    /// The bytes pushed to the registry.
    pub blob: Vec<u8>,
    pub compression: Compression,
    /// Digest of `blob`.
    pub digest: String,
    /// Digest of the uncompressed tar.
    pub diff_id: String,
    /// Overrides the media type the manifest format would choose.
    pub media_type: Option<String>,
}

impl Layer {
    /// A layer from raw (possibly hostile or truncated) tar bytes, compressed with `c`.
    pub fn from_tar(tar: &[u8], c: Compression) -> Layer {
        let blob = compress(tar, c);
        Layer {
            digest: sha256_digest(&blob),
            diff_id: sha256_digest(tar),
            blob,
            compression: c,
            media_type: None,
        }
    }

    pub fn with_media_type(mut self, media_type: &str) -> Self {
        self.media_type = Some(media_type.to_string());
        self
    }

    pub fn media_type(&self, format: Format) -> String {
        if let Some(m) = &self.media_type {
            return m.clone();
        }
        match (format, self.compression) {
            (Format::Oci, Compression::None) => OCI_LAYER_TAR,
            (Format::Oci, Compression::Gzip) => OCI_LAYER_GZIP,
            (Format::Oci, Compression::Zstd) => OCI_LAYER_ZSTD,
            (Format::Docker, Compression::None) => DOCKER_LAYER_TAR,
            (Format::Docker, Compression::Gzip) => DOCKER_LAYER_GZIP,
            (Format::Docker, Compression::Zstd) => DOCKER_LAYER_ZSTD,
        }
        .to_string()
    }
}

/// The parts of the image config the tests care about.
#[derive(Clone, Debug)]
pub struct ImageConfig {
    pub architecture: String,
    pub os: String,
    pub variant: Option<String>,
    pub user: Option<String>,
    pub env: Vec<String>,
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
    pub working_dir: Option<String>,
    pub labels: BTreeMap<String, String>,
}

impl Default for ImageConfig {
    fn default() -> Self {
        ImageConfig {
            architecture: host_arch().to_string(),
            os: "linux".to_string(),
            variant: None,
            user: None,
            env: vec![
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            ],
            entrypoint: None,
            cmd: Some(vec!["/bin/sh".to_string()]),
            working_dir: None,
            labels: BTreeMap::new(),
        }
    }
}

/// An image: config + layers, in OCI or Docker format.
#[derive(Clone, Debug)]
pub struct Image {
    pub config: ImageConfig,
    pub layers: Vec<Layer>,
    pub format: Format,
}

impl Image {
    pub fn new(layers: Vec<Layer>) -> Self {
        Image {
            config: ImageConfig::default(),
            layers,
            format: Format::Oci,
        }
    }

    /// Use Docker schema2 media types.
    pub fn docker(mut self) -> Self {
        self.format = Format::Docker;
        self
    }

    pub fn user(mut self, user: &str) -> Self {
        self.config.user = Some(user.to_string());
        self
    }

    pub fn cmd(mut self, cmd: &[&str]) -> Self {
        self.config.cmd = Some(cmd.iter().map(|s| s.to_string()).collect());
        self
    }

    pub fn entrypoint(mut self, ep: &[&str]) -> Self {
        self.config.entrypoint = Some(ep.iter().map(|s| s.to_string()).collect());
        self
    }

    pub fn env(mut self, kv: &str) -> Self {
        self.config.env.push(kv.to_string());
        self
    }

    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.config.labels.insert(k.to_string(), v.to_string());
        self
    }

    pub fn platform(mut self, arch: &str, variant: Option<&str>) -> Self {
        self.config.architecture = arch.to_string();
        self.config.variant = variant.map(str::to_string);
        self
    }

    pub fn diff_ids(&self) -> Vec<String> {
        self.layers.iter().map(|l| l.diff_id.clone()).collect()
    }

    pub fn chain_ids(&self) -> Vec<String> {
        chain_ids(&self.diff_ids())
    }

    pub fn config_json(&self) -> Vec<u8> {
        let c = &self.config;
        let mut inner = serde_json::Map::new();
        if let Some(u) = &c.user {
            inner.insert("User".into(), json!(u));
        }
        inner.insert("Env".into(), json!(c.env));
        if let Some(ep) = &c.entrypoint {
            inner.insert("Entrypoint".into(), json!(ep));
        }
        if let Some(cmd) = &c.cmd {
            inner.insert("Cmd".into(), json!(cmd));
        }
        if let Some(wd) = &c.working_dir {
            inner.insert("WorkingDir".into(), json!(wd));
        }
        if !c.labels.is_empty() {
            inner.insert("Labels".into(), json!(c.labels));
        }
        let mut v = json!({
            "created": "2024-01-01T00:00:00Z",
            "architecture": c.architecture,
            "os": c.os,
            "config": inner,
            "rootfs": { "type": "layers", "diff_ids": self.diff_ids() },
            "history": self.layers.iter().enumerate().map(|(i, _)| json!({
                "created": "2024-01-01T00:00:00Z",
                "created_by": format!("crishim-tests layer {i}"),
            })).collect::<Vec<_>>(),
        });
        if let Some(var) = &c.variant {
            v["variant"] = json!(var);
        }
        serde_json::to_vec(&v).expect("config json")
    }

    pub fn config_digest(&self) -> String {
        sha256_digest(&self.config_json())
    }

    pub fn manifest_media_type(&self) -> &'static str {
        match self.format {
            Format::Oci => OCI_MANIFEST,
            Format::Docker => DOCKER_MANIFEST,
        }
    }

    pub fn manifest_json(&self) -> Vec<u8> {
        let config = self.config_json();
        let config_mt = match self.format {
            Format::Oci => OCI_CONFIG,
            Format::Docker => DOCKER_CONFIG,
        };
        let v = json!({
            "schemaVersion": 2,
            "mediaType": self.manifest_media_type(),
            "config": {
                "mediaType": config_mt,
                "digest": sha256_digest(&config),
                "size": config.len(),
            },
            "layers": self.layers.iter().map(|l| json!({
                "mediaType": l.media_type(self.format),
                "digest": l.digest,
                "size": l.blob.len(),
            })).collect::<Vec<_>>(),
        });
        serde_json::to_vec(&v).expect("manifest json")
    }

    pub fn manifest_digest(&self) -> String {
        sha256_digest(&self.manifest_json())
    }

    fn platform_json(&self) -> serde_json::Value {
        let mut p = json!({ "architecture": self.config.architecture, "os": self.config.os });
        if let Some(v) = &self.config.variant {
            p["variant"] = json!(v);
        }
        p
    }
}

/// An image index (OCI) or manifest list (Docker) of several images.
#[derive(Clone, Debug)]
pub struct Index {
    pub images: Vec<Image>,
    pub format: Format,
}

impl Index {
    pub fn new(images: Vec<Image>) -> Self {
        Index {
            images,
            format: Format::Oci,
        }
    }

    /// A Docker manifest list; the images are switched to Docker schema2 too.
    pub fn docker(mut self) -> Self {
        self.format = Format::Docker;
        for i in &mut self.images {
            i.format = Format::Docker;
        }
        self
    }

    pub fn media_type(&self) -> &'static str {
        match self.format {
            Format::Oci => OCI_INDEX,
            Format::Docker => DOCKER_MANIFEST_LIST,
        }
    }

    pub fn json(&self) -> Vec<u8> {
        let v = json!({
            "schemaVersion": 2,
            "mediaType": self.media_type(),
            "manifests": self.images.iter().map(|i| {
                let m = i.manifest_json();
                json!({
                    "mediaType": i.manifest_media_type(),
                    "digest": sha256_digest(&m),
                    "size": m.len(),
                    "platform": i.platform_json(),
                })
            }).collect::<Vec<_>>(),
        });
        serde_json::to_vec(&v).expect("index json")
    }

    pub fn digest(&self) -> String {
        sha256_digest(&self.json())
    }
}

/// What was pushed for one image.
#[derive(Clone, Debug)]
pub struct PushedImage {
    /// `127.0.0.1:PORT`
    pub host: String,
    pub repo: String,
    /// Empty when pushed by digest only (an index's children).
    pub tag: String,
    pub manifest_digest: String,
    pub config_digest: String,
    pub layer_digests: Vec<String>,
    pub diff_ids: Vec<String>,
    pub chain_ids: Vec<String>,
    pub manifest: Vec<u8>,
    pub config: Vec<u8>,
}

impl PushedImage {
    /// The image ID a CRI runtime reports: the config digest.
    pub fn image_id(&self) -> &str {
        &self.config_digest
    }

    /// `HOST/REPO:TAG`
    pub fn tag_ref(&self) -> String {
        format!("{}/{}:{}", self.host, self.repo, self.tag)
    }

    /// `HOST/REPO@sha256:…` (the manifest digest)
    pub fn digest_ref(&self) -> String {
        format!("{}/{}@{}", self.host, self.repo, self.manifest_digest)
    }
}

/// What was pushed for an index.
#[derive(Clone, Debug)]
pub struct PushedIndex {
    pub host: String,
    pub repo: String,
    pub tag: String,
    pub index_digest: String,
    pub index: Vec<u8>,
    pub images: Vec<PushedImage>,
}

impl PushedIndex {
    pub fn tag_ref(&self) -> String {
        format!("{}/{}:{}", self.host, self.repo, self.tag)
    }

    pub fn digest_ref(&self) -> String {
        format!("{}/{}@{}", self.host, self.repo, self.index_digest)
    }

    /// The child image whose config says `architecture`.
    pub fn for_arch(&self, architecture: &str) -> &PushedImage {
        self.images
            .iter()
            .find(|i| {
                let c: serde_json::Value = serde_json::from_slice(&i.config).expect("config json");
                c["architecture"] == architecture
            })
            .unwrap_or_else(|| panic!("no image for {architecture} in the index"))
    }
}

/// Pushes blobs and manifests over the registry HTTP API v2.
pub struct Pusher {
    client: reqwest::Client,
    base: reqwest::Url,
    auth: Option<(String, String)>,
}

impl Pusher {
    /// `base_url`: `http://127.0.0.1:PORT`.
    pub fn new(client: reqwest::Client, base_url: &str, auth: Option<(String, String)>) -> Self {
        Pusher {
            client,
            base: reqwest::Url::parse(base_url).expect("registry base url"),
            auth,
        }
    }

    fn request(&self, method: reqwest::Method, url: reqwest::Url) -> reqwest::RequestBuilder {
        let r = self.client.request(method, url);
        match &self.auth {
            Some((u, p)) => r.basic_auth(u, Some(p)),
            None => r,
        }
    }

    fn url(&self, path: &str) -> reqwest::Url {
        self.base.join(path).expect("registry url")
    }

    /// Upload a blob (POST an upload session, then PUT the bytes with `?digest=`).
    pub async fn push_blob(&self, repo: &str, data: &[u8]) -> Result<String> {
        let digest = sha256_digest(data);
        let resp = self
            .request(
                reqwest::Method::POST,
                self.url(&format!("/v2/{repo}/blobs/uploads/")),
            )
            .header(reqwest::header::CONTENT_LENGTH, "0")
            .send()
            .await
            .context("starting blob upload")?;
        if resp.status().as_u16() != 202 {
            bail!(
                "POST blob upload for {repo}: {} {}",
                resp.status(),
                resp.text().await.unwrap_or_default()
            );
        }
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .context("upload response without Location")?
            .to_str()?
            .to_string();
        let mut url = self.base.join(&location)?;
        url.query_pairs_mut().append_pair("digest", &digest);
        let resp = self
            .request(reqwest::Method::PUT, url)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(data.to_vec())
            .send()
            .await
            .context("uploading blob")?;
        if resp.status().as_u16() != 201 {
            bail!(
                "PUT blob {digest} to {repo}: {} {}",
                resp.status(),
                resp.text().await.unwrap_or_default()
            );
        }
        Ok(digest)
    }

    /// PUT a manifest (or index) under `reference` (a tag or a digest); returns its digest.
    pub async fn push_manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        body: &[u8],
    ) -> Result<String> {
        let digest = sha256_digest(body);
        let resp = self
            .request(
                reqwest::Method::PUT,
                self.url(&format!("/v2/{repo}/manifests/{reference}")),
            )
            .header(reqwest::header::CONTENT_TYPE, media_type)
            .body(body.to_vec())
            .send()
            .await
            .context("pushing manifest")?;
        if resp.status().as_u16() != 201 {
            bail!(
                "PUT manifest {repo}:{reference}: {} {}",
                resp.status(),
                resp.text().await.unwrap_or_default()
            );
        }
        if let Some(d) = resp.headers().get("Docker-Content-Digest") {
            ensure!(
                d.to_str()? == digest,
                "registry computed manifest digest {:?}, expected {digest}",
                d
            );
        }
        Ok(digest)
    }

    /// Push layers, config and manifest. `tag` may be a tag or the manifest's digest.
    pub async fn push_image(&self, repo: &str, tag: &str, image: &Image) -> Result<PushedImage> {
        for l in &image.layers {
            self.push_blob(repo, &l.blob).await?;
        }
        let config = image.config_json();
        let config_digest = self.push_blob(repo, &config).await?;
        let manifest = image.manifest_json();
        let manifest_digest = self
            .push_manifest(repo, tag, image.manifest_media_type(), &manifest)
            .await?;
        Ok(PushedImage {
            host: self.base.authority().to_string(),
            repo: repo.to_string(),
            tag: if tag.starts_with("sha256:") {
                String::new()
            } else {
                tag.to_string()
            },
            manifest_digest,
            config_digest,
            layer_digests: image.layers.iter().map(|l| l.digest.clone()).collect(),
            diff_ids: image.diff_ids(),
            chain_ids: image.chain_ids(),
            manifest,
            config,
        })
    }

    /// Push each image by digest, then the index under `tag`.
    pub async fn push_index(&self, repo: &str, tag: &str, index: &Index) -> Result<PushedIndex> {
        let mut images = Vec::new();
        for i in &index.images {
            images.push(self.push_image(repo, &i.manifest_digest(), i).await?);
        }
        let body = index.json();
        let index_digest = self
            .push_manifest(repo, tag, index.media_type(), &body)
            .await?;
        Ok(PushedIndex {
            host: self.base.authority().to_string(),
            repo: repo.to_string(),
            tag: tag.to_string(),
            index_digest,
            index: body,
            images,
        })
    }

    /// GET a manifest; returns (Content-Type, body).
    pub async fn get_manifest(&self, repo: &str, reference: &str) -> Result<(String, Vec<u8>)> {
        let accept = [
            OCI_INDEX,
            OCI_MANIFEST,
            DOCKER_MANIFEST_LIST,
            DOCKER_MANIFEST,
        ]
        .join(", ");
        let resp = self
            .request(
                reqwest::Method::GET,
                self.url(&format!("/v2/{repo}/manifests/{reference}")),
            )
            .header(reqwest::header::ACCEPT, accept)
            .send()
            .await?;
        ensure!(
            resp.status().is_success(),
            "GET manifest {repo}:{reference}: {}",
            resp.status()
        );
        let ct = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap_or("").to_string())
            .unwrap_or_default();
        Ok((ct, resp.bytes().await?.to_vec()))
    }

    /// GET a blob's bytes.
    pub async fn get_blob(&self, repo: &str, digest: &str) -> Result<Vec<u8>> {
        let resp = self
            .request(
                reqwest::Method::GET,
                self.url(&format!("/v2/{repo}/blobs/{digest}")),
            )
            .send()
            .await?;
        ensure!(
            resp.status().is_success(),
            "GET blob {repo}@{digest}: {}",
            resp.status()
        );
        Ok(resp.bytes().await?.to_vec())
    }
}

/// The busybox applets linked in `/bin` by [`busybox_layer`].
pub const BUSYBOX_APPLETS: &[&str] = &[
    "sh", "ash", "ls", "cat", "echo", "sleep", "true", "false", "id", "stat", "env", "mkdir", "rm",
    "touch", "ps", "grep", "head", "tail", "hostname", "mount", "ln", "readlink", "wc", "kill",
    "test", "printf", "pwd", "uname", "whoami", "chmod", "chown", "cp", "mv", "df", "du", "date",
    "find", "sed", "tr", "nc", "wget", "top", "dd", "seq", "sort", "uniq", "cut", "yes", "nproc",
];

pub const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n\
app:x:1000:1000:app:/home/app:/bin/sh\n";
pub const GROUP: &str = "root:x:0:\nnogroup:x:65534:\napp:x:1000:\n";

/// Path of the static busybox put in test images: `$BUSYBOX_BIN` or `/bin/busybox`.
pub fn host_busybox() -> std::path::PathBuf {
    std::env::var_os("BUSYBOX_BIN")
        .map(Into::into)
        .unwrap_or_else(|| "/bin/busybox".into())
}

/// The entries of the busybox layer: /bin/busybox (from the host's busybox-static), applet
/// symlinks in /bin, /etc/passwd and /etc/group (root, nobody 65534, app 1000), /tmp (1777).
pub fn busybox_entries() -> LayerBuilder {
    let bb = host_busybox();
    let data = std::fs::read(&bb).unwrap_or_else(|e| {
        panic!(
            "reading {}: {e} (install busybox-static: hack/install-deps.sh)",
            bb.display()
        )
    });
    let mut l = LayerBuilder::new()
        .dir("bin", 0o755)
        .file("bin/busybox", data, 0o755);
    for a in BUSYBOX_APPLETS {
        l = l.symlink(&format!("bin/{a}"), "busybox");
    }
    l.dir("usr", 0o755)
        .dir("usr/bin", 0o755)
        .symlink("usr/bin/env", "../../bin/busybox")
        .dir("etc", 0o755)
        .file("etc/passwd", PASSWD, 0o644)
        .file("etc/group", GROUP, 0o644)
        .file("etc/hostname", "busybox\n", 0o644)
        .dir("tmp", 0o1777)
        .dir("root", 0o700)
        .dir("home", 0o755)
        .dir_owned("home/app", 0o755, 1000, 1000)
        .dir("dev", 0o755)
        .dir("proc", 0o555)
        .dir("sys", 0o555)
        .dir("var", 0o755)
}

/// The busybox layer, gzip-compressed (built once per test binary).
pub fn busybox_layer() -> Layer {
    static L: OnceLock<Layer> = OnceLock::new();
    L.get_or_init(|| busybox_layer_with(Compression::Gzip))
        .clone()
}

/// The busybox layer with another compression.
pub fn busybox_layer_with(c: Compression) -> Layer {
    static TAR: OnceLock<Vec<u8>> = OnceLock::new();
    Layer::from_tar(TAR.get_or_init(|| busybox_entries().tar()), c)
}

/// A one-layer busybox image running `/bin/sh`.
pub fn busybox_image() -> Image {
    Image::new(vec![busybox_layer()])
}
