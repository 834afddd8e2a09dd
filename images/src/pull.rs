//! Pulling: resolve the manifest, then download, verify and unpack every layer concurrently, each as
//! one streaming pass (network -> sha256 + blob file + decompressor -> tar extractor).

use std::io::Read;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest};
use tokio::io::AsyncWriteExt;
use tracing::{debug, info};

use crate::digest::{chain_ids, Digest, Hasher};
use crate::error::{ImageError, IoContext, Result, StreamAborted};
use crate::lazy::{LazyOutcome, LazyRequest};
use crate::limits::Budget;
use crate::platform::host_arch;
use crate::reference::Reference;
use crate::registry::{Credentials, Repository};
use crate::store::meta::ImageRecord;
use crate::store::{remove_any, Layout, CONTENT_DIR_MODE};
use crate::unpack;
use crate::ImageStore;
use crishim_sys::shown::shown;

/// Layers downloaded at once per pull.
const LAYER_CONCURRENCY: usize = 4;
/// Chunks buffered between the download and the unpacker: each is at most hyper's read buffer
/// (about 400 KiB), so a layer holds at most a few MiB in flight.
const PIPE_DEPTH: usize = 16;

const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// Parser errors quote the offending input, so they are cut like any name from an image.
fn bad(what: &str, e: impl std::fmt::Display) -> ImageError {
    ImageError::BadContent(format!("malformed {what}: {}", shown(&e.to_string())))
}

pub(crate) fn digest_of(d: &Descriptor) -> Result<Digest> {
    Digest::parse(d.digest().as_ref()).map_err(|_| {
        bad(
            "descriptor",
            format!("unsupported digest {}", shown(d.digest().as_ref())),
        )
    })
}

pub(crate) fn is_index(media_type: &str, bytes: &[u8]) -> bool {
    if INDEX_TYPES.contains(&media_type) {
        return true;
    }
    // Some registries send a generic type; an index has "manifests", an image manifest has "layers".
    #[derive(serde::Deserialize)]
    struct Probe {
        manifests: Option<serde_json::Value>,
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
    }
    serde_json::from_slice::<Probe>(bytes)
        .map(|p| {
            p.manifests.is_some()
                || p.media_type
                    .is_some_and(|m| INDEX_TYPES.contains(&m.as_str()))
        })
        .unwrap_or(false)
}

pub(crate) fn choose_platform(index: &ImageIndex, index_digest: &Digest) -> Result<Digest> {
    let arch = host_arch();
    let wanted_variant = if arch == "arm64" { Some("v8") } else { None };
    let mut fallback = None;
    for m in index.manifests() {
        let Some(p) = m.platform() else { continue };
        if p.os().to_string() != "linux" || p.architecture().to_string() != arch {
            continue;
        }
        match (p.variant().as_deref(), wanted_variant) {
            (None, _) => fallback = fallback.or(Some(m)),
            (Some(v), Some(w)) if v == w => return digest_of(m),
            _ => {}
        }
        if wanted_variant.is_none() {
            return digest_of(m);
        }
    }
    fallback
        .map(digest_of)
        .transpose()?
        .ok_or_else(|| ImageError::NoMatchingPlatform {
            digest: index_digest.to_string(),
            platform: format!("linux/{arch}"),
        })
}

impl ImageStore {
    pub(crate) async fn pull_image(
        &self,
        reference: &Reference,
        creds: Option<&Credentials>,
    ) -> Result<ImageRecord> {
        // Pulls hold the GC lock shared: GC must not sweep blobs a pull has written but not committed.
        let _gc = self.gc_lock.read().await;
        let started = std::time::Instant::now();
        let (repo, top) = self.client.resolve(reference, creds).await?;
        let mut small_blobs: Vec<(Digest, Bytes)> = vec![(top.digest.clone(), top.bytes.clone())];
        let (index, manifest) = if is_index(&top.media_type, &top.bytes) {
            let index =
                ImageIndex::from_reader(&top.bytes[..]).map_err(|e| bad("image index", e))?;
            let chosen = choose_platform(&index, &top.digest)?;
            let m = repo.manifest(chosen.as_str()).await?;
            small_blobs.push((m.digest.clone(), m.bytes.clone()));
            (Some(top.digest.clone()), m)
        } else {
            (None, top)
        };
        let parsed = ImageManifest::from_reader(&manifest.bytes[..])
            .map_err(|e| bad("image manifest", e))?;
        let config_digest = digest_of(parsed.config())?;
        let config_bytes = match self.layout.read_blob(&config_digest) {
            Ok(b) => Bytes::from(b),
            Err(_) => repo.small_blob(&config_digest).await?,
        };
        let config = ImageConfiguration::from_reader(&config_bytes[..])
            .map_err(|e| bad("image config", e))?;
        small_blobs.push((config_digest.clone(), config_bytes.clone()));

        let diff_ids = config
            .rootfs()
            .diff_ids()
            .iter()
            .map(|d| Digest::parse(d))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| bad("image config rootfs.diff_ids", e))?;
        if diff_ids.len() != parsed.layers().len() {
            return Err(bad(
                "image",
                format!(
                    "manifest has {} layers but the config lists {} diff_ids",
                    parsed.layers().len(),
                    diff_ids.len()
                ),
            ));
        }
        let chains = chain_ids(&diff_ids);
        let layers: Vec<(Descriptor, Digest, Digest)> = parsed
            .layers()
            .iter()
            .cloned()
            .zip(diff_ids.iter().cloned())
            .zip(chains.iter().cloned())
            .map(|((l, d), c)| (l, d, c))
            .collect();
        // Boxed so the future stays Send without higher-ranked closure lifetimes tripping the compiler.
        type LayerFetch<'f> =
            std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + 'f>>;
        // Before downloading: the compressed layers alone must leave enough free space.
        let budget = Arc::new(Budget::new(&self.limits));
        let lazy_on = self.lazy.is_some();
        let need = layers
            .iter()
            .filter(|(_, _, chain)| !self.layout.snapshot(chain).exists())
            // A layer that may be lazy takes its space as its prefetch runs, held to the same
            // free-space floor by its unpacker.
            .filter(|(l, _, _)| {
                !(lazy_on
                    && l.annotations()
                        .as_ref()
                        .is_some_and(crate::lazy::is_lazy_format))
            })
            .map(|(l, _, _)| l.size())
            .fold(config_bytes.len() as u64, u64::saturating_add);
        budget.check_free_space(
            &unpack::open_dir(self.layout.root()).ctx(|| "opening image store".into())?,
            need,
        )?;
        let (repo, budget) = (&repo, &budget);
        // Lazy layers are fetched from the image by its manifest's digest, which names exactly
        // this content wherever the tag moves.
        let by_digest = Reference {
            digest: Some(manifest.digest.clone()),
            ..reference.clone()
        };
        let by_digest = &by_digest;
        let mut fetches: Vec<LayerFetch<'_>> = Vec::with_capacity(layers.len());
        for (desc, diff, chain) in &layers {
            fetches.push(Box::pin(self.fetch_layer(
                repo,
                (desc, diff, chain),
                budget,
                Some((by_digest, creds)),
            )));
        }
        futures::stream::iter(fetches)
            .buffer_unordered(LAYER_CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;

        let layout = self.layout.clone();
        let blobs = small_blobs.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            for (d, b) in &blobs {
                layout.write_blob(d, b)?;
            }
            // One flush for every file of the pull, before the metadata says the image exists.
            unpack::syncfs(&unpack::open_dir(layout.root()).ctx(|| "opening image store".into())?)
                .ctx(|| "syncing image store".into())
        })
        .await
        .map_err(|e| ImageError::io("pull task", std::io::Error::other(e)))??;

        let size = manifest.bytes.len() as u64
            + config_bytes.len() as u64
            + parsed.layers().iter().map(|l| l.size()).sum::<u64>();
        let record = ImageRecord {
            id: config_digest.clone(),
            repo_tags: reference.tagged().into_iter().collect(),
            repo_digests: vec![reference.with_digest(index.as_ref().unwrap_or(&manifest.digest))],
            size,
            manifest: manifest.digest.clone(),
            index,
            config: config_digest,
            layers: layers
                .iter()
                .map(|(d, _, _)| digest_of(d))
                .collect::<Result<_>>()?,
            chain_ids: chains,
            user: config
                .config()
                .as_ref()
                .and_then(|c| c.user().clone())
                .unwrap_or_default(),
        };
        let record = self.meta.commit_image(record)?;
        info!(image = %shown(&reference.to_string()), id = %record.id, elapsed_ms = started.elapsed().as_millis() as u64, "pulled image");
        Ok(record)
    }

    /// Make sure the snapshot for `chain` exists: served lazily where `lazy` names the image
    /// and the layer allows it, else downloaded and unpacked.
    async fn fetch_layer(
        &self,
        repo: &Repository<'_>,
        (desc, diff_id, chain): (&Descriptor, &Digest, &Digest),
        budget: &Arc<Budget>,
        lazy: Option<(&Reference, Option<&Credentials>)>,
    ) -> Result<()> {
        let digest = digest_of(desc)?;
        let _guard = self.inflight.lock(chain.as_str()).await;
        if self.layout.snapshot(chain).exists() {
            debug!(layer = %digest, "snapshot present, skipping");
            return Ok(());
        }
        if let (Some(layers), Some((image, creds))) = (&self.lazy, lazy) {
            if matches!(layers.lower(chain), Ok(Some(_))) {
                debug!(layer = %digest, "lazy layer present, skipping");
                return Ok(());
            }
            let req = LazyRequest {
                image,
                creds,
                layer: desc,
                diff_id,
                chain,
            };
            match layers.mount(req).await {
                LazyOutcome::Mounted => return Ok(()),
                LazyOutcome::Whole(why) => {
                    debug!(layer = %digest, reason = %why, "pulling the layer whole")
                }
            }
        }
        let sink = LayerSink {
            layout: &self.layout,
            progress_timeout: self.limits.pull_progress_timeout,
            tmp_dir: self.layout.snapshots_tmp().join(Layout::tmp_name()),
            pace: None,
            progress: None,
        };
        store_layer(&sink, repo, desc, diff_id, chain, budget).await
    }
}

/// Where and how one layer is stored: what a pull and a lazy layer's prefetch share.
pub struct LayerSink<'a> {
    pub layout: &'a Layout,
    /// A download that receives nothing for this long is cancelled.
    pub progress_timeout: std::time::Duration,
    /// Where the layer is unpacked before it is renamed into place (a fresh path).
    pub tmp_dir: std::path::PathBuf,
    /// Holds the download back: a prefetch's share of the bandwidth limit.
    pub pace: Option<&'a (dyn Pace + Sync)>,
    /// Bytes received so far, for whoever reports progress.
    pub progress: Option<&'a std::sync::atomic::AtomicU64>,
}

/// A bandwidth limit: how long to wait before taking in `bytes` more.
pub trait Pace {
    fn delay(&self, bytes: u64) -> std::time::Duration;
}

/// Download `desc` from `repo`, check it against its digest and `diff_id`, and store it as the
/// snapshot of `chain` (and its blob). A snapshot that appeared meanwhile (another pull, or a
/// lazy layer's prefetch, got there first) is kept, and this one dropped.
pub async fn store_layer(
    sink: &LayerSink<'_>,
    repo: &Repository<'_>,
    desc: &Descriptor,
    diff_id: &Digest,
    chain: &Digest,
    budget: &Arc<Budget>,
) -> Result<()> {
    let digest = digest_of(desc)?;
    let layout = sink.layout;
    let target = layout.snapshot(chain);
    let tmp = sink.tmp_dir.clone();
    // Whatever this pull leaves half done goes with it, also when its caller goes away (a
    // client that hangs up cancels the pull by dropping it) and another waiter takes over.
    let mut leftovers = Leftovers::new(vec![tmp.clone()]);
    // The layer's root: overlay's `/` when it is the top layer, so it stays traversable by a
    // container's non-root user (everything above it is 0700).
    crishim_sys::hostfs::create_dir(&tmp, CONTENT_DIR_MODE)
        .ctx(|| format!("creating {}", tmp.display()))?;
    let result = if layout.blob(&digest).exists() {
        let path = layout.blob(&digest);
        let (dir, layer) = (tmp.clone(), digest.to_string());
        let budget = budget.clone();
        tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&path).ctx(|| format!("opening {}", path.display()))?;
            unpack::unpack_with(file, &dir, &layer, &budget)
        })
        .await
        .map_err(|e| ImageError::io("unpack task", std::io::Error::other(e)))
        .and_then(|r| r)
        .map(|u| (u, None))
    } else {
        download_and_unpack(sink, repo, desc, &digest, &tmp, budget, &mut leftovers).await
    };
    let outcome = result.and_then(|(unpacked, ingest)| {
        if &unpacked.diff_id != diff_id {
            return Err(ImageError::DigestMismatch {
                what: "uncompressed layer (diff_id)",
                expected: diff_id.to_string(),
                actual: unpacked.diff_id.to_string(),
            });
        }
        if let Some(ingest) = &ingest {
            std::fs::rename(ingest, layout.blob(&digest))
                .ctx(|| format!("storing blob {digest}"))?;
        }
        if let Err(e) = std::fs::rename(&tmp, &target) {
            if !target.is_dir() {
                return Err(e).ctx(|| format!("storing snapshot {chain}"));
            }
            remove_any(&tmp)?;
        }
        debug!(layer = %digest, entries = unpacked.entries, "layer unpacked");
        Ok(ingest)
    });
    if outcome.is_err() {
        remove_any(&tmp)?;
    }
    leftovers.disarm();
    outcome.map(|_| ())
}

/// One pass over the network stream: hash it, store it, and feed the unpacker thread.
async fn download_and_unpack(
    sink: &LayerSink<'_>,
    repo: &Repository<'_>,
    desc: &Descriptor,
    digest: &Digest,
    dir: &std::path::Path,
    budget: &Arc<Budget>,
    leftovers: &mut Leftovers,
) -> Result<(unpack::Unpacked, Option<std::path::PathBuf>)> {
    let ingest = sink.layout.ingest().join(Layout::tmp_name());
    leftovers.paths.push(ingest.clone());
    let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(PIPE_DEPTH);
    let (dir, layer, budget) = (dir.to_path_buf(), digest.to_string(), budget.clone());
    let unpacker = leftovers
        .unpacker
        .insert(tokio::task::spawn_blocking(move || {
            unpack::unpack_with(ChannelReader::new(rx), &dir, &layer, &budget)
        }));

    let downloaded = async {
        let mut file = tokio::fs::File::create(&ingest)
            .await
            .ctx(|| format!("creating {}", ingest.display()))?;
        let mut stream = repo.blob_stream(digest).await?;
        let mut hasher = Hasher::default();
        let mut size = 0u64;
        let mut feeding = true;
        let stall = sink.progress_timeout;
        loop {
            let next = tokio::time::timeout(stall, stream.next()).await;
            let chunk = match next {
                Ok(Some(chunk)) => chunk?,
                Ok(None) => break,
                Err(_) => {
                    return Err(ImageError::PullStalled {
                        layer: digest.to_string(),
                        received: size,
                        timeout: stall,
                    })
                }
            };
            size += chunk.len() as u64;
            if size > desc.size() {
                return Err(ImageError::DigestMismatch {
                    what: "blob",
                    expected: digest.to_string(),
                    actual: format!(
                        "more than the {} bytes its descriptor declares",
                        desc.size()
                    ),
                });
            }
            if let Some(p) = sink.progress {
                p.store(size, std::sync::atomic::Ordering::Relaxed);
            }
            if let Some(pace) = sink.pace {
                let wait = pace.delay(chunk.len() as u64);
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
            }
            hasher.update(&chunk);
            // If the unpacker failed it stopped reading; keep hashing so a corrupt blob is
            // reported as a digest mismatch rather than as a broken archive, but write no
            // more of a blob that will not be kept (it may have hit a disk limit).
            if feeding {
                file.write_all(&chunk)
                    .await
                    .ctx(|| format!("writing {}", ingest.display()))?;
                feeding = tx.send(Chunk::Data(chunk)).await.is_ok();
            }
        }
        file.flush()
            .await
            .ctx(|| format!("writing {}", ingest.display()))?;
        let actual = hasher.finish();
        if &actual != digest {
            return Err(ImageError::DigestMismatch {
                what: "blob",
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(())
    }
    .await;
    let _ = match &downloaded {
        Ok(()) => tx.send(Chunk::End).await,
        Err(e) => {
            tx.send(Chunk::Failed(ImageError::BadContent(e.to_string())))
                .await
        }
    };
    drop(tx);
    let joined = unpacker.await;
    // Done: a finished task is not awaited again.
    leftovers.unpacker = None;
    let unpacked = joined.map_err(|e| ImageError::io("unpack task", std::io::Error::other(e)))?;
    let result = match (downloaded, unpacked) {
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(u)) => Ok((u, Some(ingest.clone()))),
    };
    if result.is_err() {
        remove_any(&ingest)?;
    }
    result
}

/// The temporary files of one layer's pull, removed if the pull is dropped before it ends:
/// after the unpacker thread, which may still be writing into them, has stopped (it stops once
/// its channel closes with the dropped download).
struct Leftovers {
    paths: Vec<std::path::PathBuf>,
    unpacker: Option<tokio::task::JoinHandle<Result<unpack::Unpacked>>>,
    armed: bool,
}

impl Leftovers {
    fn new(paths: Vec<std::path::PathBuf>) -> Self {
        Leftovers {
            paths,
            unpacker: None,
            armed: true,
        }
    }

    /// The pull ended (well or not) and dealt with its own files.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let paths = std::mem::take(&mut self.paths);
        let unpacker = self.unpacker.take();
        let clean = move || {
            for p in &paths {
                if let Err(e) = remove_any(p) {
                    tracing::warn!(error = %e, "removing what a cancelled pull left");
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if let Some(u) = unpacker {
                        let _ = u.await;
                    }
                    let _ = tokio::task::spawn_blocking(clean).await;
                });
            }
            Err(_) => clean(),
        }
    }
}

enum Chunk {
    Data(Bytes),
    /// The download finished and its digest matched: only now may the reader report EOF.
    End,
    Failed(ImageError),
}

/// Adapts the download channel to `Read` for the blocking unpacker.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    current: Bytes,
    done: bool,
}

impl ChannelReader {
    fn new(rx: tokio::sync::mpsc::Receiver<Chunk>) -> Self {
        ChannelReader {
            rx,
            current: Bytes::new(),
            done: false,
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            if self.done {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Chunk::Data(b)) => self.current = b,
                Some(Chunk::End) => self.done = true,
                Some(Chunk::Failed(e)) => {
                    return Err(std::io::Error::other(StreamAborted(Mutex::new(Some(e)))));
                }
                None => {
                    return Err(std::io::Error::other(StreamAborted(Mutex::new(None))));
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}
