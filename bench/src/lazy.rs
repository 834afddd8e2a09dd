//! The lazy-pull benchmark (`--lazy`): one large image pulled through a registry throttled to a
//! fixed rate, by crishim lazily (eStargz, zstd:chunked), by crishim whole and by containerd
//! whole; how soon its container starts, how soon it reads a small file and a large one, when
//! every byte is local, and the disk it then takes. See docs/benchmarks.md.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use clap::ValueEnum;
use crishim_tests::image::{
    busybox_layer, host_arch, sha256_digest, OCI_CONFIG, OCI_LAYER_GZIP, OCI_MANIFEST,
};
use crishim_tests::{Daemon, Registry, Throttle, ThrottleOptions};
use serde::Serialize;
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::client::{pod_config, Cri};
use crate::measure::WORKLOAD_ARG;
use crate::{host, progress, ContainerdNode, PAUSE_IMAGE};

/// The file read first: small, so that its time is the lazy path's latency.
pub const SMALL_FILE: &str = "/lazy/small-1k.bin";
const SMALL_SIZE: u64 = 1 << 10;
/// The file read on its own: large, so that its time is the lazy path's throughput.
pub const BIG_FILE: &str = "/lazy/big-100m.bin";
const BIG_SIZE: u64 = 100 << 20;
/// The files' sizes lie between these.
const MIN_FILE: u64 = 1 << 10;
const MAX_FILE: u64 = 512 << 20;
/// The smallest image: the two known files and some more.
pub const MIN_IMAGE_MIB: u64 = 128;
/// The repository the images are pushed to, pulled as `docker.io/library/lazy-bench:TAG`.
const REPO: &str = "library/lazy-bench";
/// Room left free beyond the copies counted.
const MARGIN: u64 = 512 << 20;

/// One way of pulling the image: a column of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// crishim, `[images] lazy = true`, the eStargz image.
    Estargz,
    /// crishim, `[images] lazy = true`, the zstd:chunked image.
    #[value(name = "zstd-chunked")]
    ZstdChunked,
    /// crishim, `[images] lazy = false`, the gzip image.
    Full,
    /// containerd, the gzip image.
    Containerd,
}

impl Mode {
    pub const ALL: [Mode; 4] = [
        Mode::Estargz,
        Mode::ZstdChunked,
        Mode::Full,
        Mode::Containerd,
    ];

    fn title(self) -> &'static str {
        match self {
            Mode::Estargz => "crishim lazy, eStargz",
            Mode::ZstdChunked => "crishim lazy, zstd:chunked",
            Mode::Full => "crishim full pull",
            Mode::Containerd => "containerd",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Mode::Estargz => "estargz",
            Mode::ZstdChunked => "zstd-chunked",
            Mode::Full | Mode::Containerd => "gzip",
        }
    }

    fn lazy(self) -> bool {
        matches!(self, Mode::Estargz | Mode::ZstdChunked)
    }
}

/// What shapes a lazy run (from the command line).
#[derive(Clone, Debug, Serialize)]
pub struct Options {
    /// The image's payload, MiB.
    pub image_mib: u64,
    /// The registry's rate, MiB/s.
    pub rate_mib: u64,
    pub modes: Vec<Mode>,
    /// `[images] lazy_prefetch_bandwidth`, bytes/s (0: unlimited).
    pub prefetch_bandwidth: u64,
    /// `[images] lazy_prefetch_concurrency`; the daemon's default when unset.
    pub prefetch_concurrency: Option<u64>,
    /// `crishim image convert --chunk-size`; its default when unset.
    pub chunk_size: Option<u64>,
}

/// What both runtimes share, from the bench's set-up.
pub struct Setup<'a> {
    pub registry: &'a Registry,
    pub cni_dir: &'a Path,
    pub bridge: &'a str,
    pub crishim_bin: &'a Path,
    pub crishim_log: &'a str,
    pub log_dir: Option<&'a Path>,
    pub output: &'a Path,
}

// ---------------------------------------------------------------------------------------------
// The image

/// A fast generator of incompressible bytes (wyrand): 4 GiB from /dev/urandom would take the
/// kernel's time, and the bytes need only defeat gzip.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        Rng(u64::from_str_radix(&crishim_tests::random_hex(8), 16).expect("hex seed"))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            c.copy_from_slice(&self.next_u64().to_le_bytes()[..c.len()]);
        }
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `left` random bytes, hashed as they are read.
struct RandomReader<'a> {
    rng: &'a mut Rng,
    left: u64,
    hash: Sha256,
}

impl Read for RandomReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        self.rng.fill(&mut buf[..n]);
        self.hash.update(&buf[..n]);
        self.left -= n as u64;
        Ok(n)
    }
}

/// Hashes and counts what goes through it.
struct HashWriter<W> {
    inner: W,
    hash: Sha256,
    len: u64,
}

impl<W: Write> HashWriter<W> {
    fn new(inner: W) -> Self {
        HashWriter {
            inner,
            hash: Sha256::new(),
            len: 0,
        }
    }

    fn digest(&self) -> String {
        format!("sha256:{}", hex::encode(self.hash.clone().finalize()))
    }
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The random files' sizes: the largest size once when there is room for it, then sizes drawn
/// log-uniformly from 1 KiB up to what is left, so that small files are many and large ones
/// hold most bytes, as in a real image.
fn random_sizes(total: u64, rng: &mut Rng) -> Vec<u64> {
    let mut left = total;
    let mut sizes = Vec::new();
    if left >= 2 * MAX_FILE {
        sizes.push(MAX_FILE);
        left -= MAX_FILE;
    }
    while left > 0 {
        let hi = left.clamp(MIN_FILE, MAX_FILE) as f64;
        let (lo, hi) = ((MIN_FILE as f64).ln(), hi.ln());
        let mut s =
            ((lo + rng.unit() * (hi - lo)).exp() as u64).clamp(MIN_FILE, left.max(MIN_FILE));
        if left - s.min(left) < MIN_FILE {
            // No remainder under the smallest size: take it all, or leave exactly that much.
            s = if left <= MAX_FILE {
                left
            } else {
                left - MIN_FILE
            };
        }
        sizes.push(s);
        left -= s.min(left);
    }
    // The largest one somewhere in the middle rather than first.
    let n = sizes.len();
    if n > 2 {
        sizes.swap(0, n / 2);
    }
    sizes
}

/// The data layer as written to a temporary file.
struct LayerFile {
    file: tempfile::NamedTempFile,
    /// Of the gzip blob.
    digest: String,
    size: u64,
    diff_id: String,
    files: usize,
    payload: u64,
    small: Vec<u8>,
    big_sha256: String,
}

fn tar_header(size: u64, mode: u32, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    h
}

/// Append a file of `size` random bytes; returns their sha256 (hex).
fn append_random<W: Write>(
    tar: &mut tar::Builder<W>,
    rng: &mut Rng,
    path: &str,
    size: u64,
) -> Result<String> {
    let mut h = tar_header(size, 0o644, tar::EntryType::Regular);
    let mut r = RandomReader {
        rng,
        left: size,
        hash: Sha256::new(),
    };
    tar.append_data(&mut h, path, &mut r)?;
    Ok(hex::encode(r.hash.finalize()))
}

/// Write the data layer of `payload` bytes, streamed: random files under `/lazy/data`, then
/// the small and the big file (last, so that a read of them is not served by a prefetch that
/// starts at the front), as a gzip'd tar in a temporary file in `dir`.
fn write_layer(dir: &Path, payload: u64, small_size: u64, big_size: u64) -> Result<LayerFile> {
    let mut rng = Rng::seeded();
    let sizes = random_sizes(payload - small_size - big_size, &mut rng);
    let file = tempfile::Builder::new()
        .prefix("crishim-bench-lazy-")
        .suffix(".tar.gz")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    let blob = HashWriter::new(std::io::BufWriter::with_capacity(
        1 << 20,
        file.as_file().try_clone()?,
    ));
    let gz = flate2::write::GzEncoder::new(blob, flate2::Compression::fast());
    let mut tar = tar::Builder::new(HashWriter::new(gz));
    for d in ["lazy/", "lazy/data/"] {
        let mut h = tar_header(0, 0o755, tar::EntryType::Directory);
        tar.append_data(&mut h, d, std::io::empty())?;
    }
    for (i, &size) in sizes.iter().enumerate() {
        append_random(
            &mut tar,
            &mut rng,
            &format!("lazy/data/file-{i:04}.bin"),
            size,
        )?;
    }
    // The small file's bytes are kept, to check what a container reads.
    let mut small = vec![0u8; small_size as usize];
    rng.fill(&mut small);
    let mut h = tar_header(small_size, 0o644, tar::EntryType::Regular);
    tar.append_data(&mut h, SMALL_FILE.trim_start_matches('/'), &small[..])?;
    let big_sha256 = append_random(
        &mut tar,
        &mut rng,
        BIG_FILE.trim_start_matches('/'),
        big_size,
    )?;
    let tar = tar.into_inner()?;
    let diff_id = tar.digest();
    let mut blob = tar.inner.finish()?;
    blob.flush()?;
    Ok(LayerFile {
        digest: blob.digest(),
        size: blob.len,
        diff_id,
        files: sizes.len() + 2,
        payload,
        small,
        big_sha256,
        file,
    })
}

/// Upload a blob from a file in pieces (PATCH, then PUT with its digest), never holding it
/// whole: the harness's pusher takes blobs from memory.
async fn push_file_blob(
    client: &reqwest::Client,
    base: &str,
    path: &Path,
    digest: &str,
) -> Result<()> {
    use tokio::io::AsyncReadExt as _;
    const PIECE: usize = 64 << 20;
    let base = reqwest::Url::parse(base)?;
    let resp = client
        .post(base.join(&format!("/v2/{REPO}/blobs/uploads/"))?)
        .header(reqwest::header::CONTENT_LENGTH, "0")
        .send()
        .await?;
    ensure!(
        resp.status().as_u16() == 202,
        "POST upload: {}",
        resp.status()
    );
    let location = |resp: &reqwest::Response| -> Result<reqwest::Url> {
        let l = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .context("upload reply without Location")?
            .to_str()?;
        Ok(base.join(l)?)
    };
    let mut url = location(&resp)?;
    let mut f = tokio::fs::File::open(path).await?;
    loop {
        let mut piece = Vec::with_capacity(PIECE);
        (&mut f).take(PIECE as u64).read_to_end(&mut piece).await?;
        if piece.is_empty() {
            break;
        }
        let resp = client
            .patch(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(piece)
            .send()
            .await?;
        ensure!(
            resp.status().as_u16() == 202,
            "PATCH upload: {}",
            resp.status()
        );
        url = location(&resp)?;
    }
    url.query_pairs_mut().append_pair("digest", digest);
    let resp = client
        .put(url)
        .header(reqwest::header::CONTENT_LENGTH, "0")
        .send()
        .await?;
    ensure!(
        resp.status().as_u16() == 201,
        "PUT {digest}: {} {}",
        resp.status(),
        resp.text().await.unwrap_or_default()
    );
    Ok(())
}

/// The three images, as the runtimes pull them, and what a container must read in them.
#[derive(Clone, Debug, Serialize)]
pub struct Images {
    pub payload_bytes: u64,
    pub files: usize,
    /// The gzip data layer's size.
    pub layer_bytes: u64,
    pub refs: BTreeMap<String, String>,
    #[serde(skip)]
    small: Vec<u8>,
    big_sha256: String,
}

impl Images {
    fn reference(&self, mode: Mode) -> &str {
        &self.refs[mode.tag()]
    }
}

/// Bytes free on the filesystem of `path` (to root, which the bench runs as).
fn free_bytes(path: &Path) -> Result<u64> {
    let s =
        nix::sys::statvfs::statvfs(path).with_context(|| format!("statvfs {}", path.display()))?;
    Ok(s.blocks_available() as u64 * s.fragment_size() as u64)
}

fn device(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .dev())
}

/// Fail unless each filesystem has room for what `needs` puts on it (needs on one filesystem
/// add up).
fn check_room(needs: &[(&Path, u64)], what: &str) -> Result<()> {
    let mut by_dev: BTreeMap<u64, (PathBuf, u64)> = BTreeMap::new();
    for (path, bytes) in needs {
        let e = by_dev
            .entry(device(path)?)
            .or_insert((path.to_path_buf(), 0));
        e.1 += bytes;
    }
    for (path, need) in by_dev.values() {
        let free = free_bytes(path)?;
        ensure!(
            free >= need + MARGIN,
            "{what} needs {} MiB free on the filesystem of {} (and {} MiB to spare); it has {} \
             MiB: free some, or choose a smaller --lazy-image-mib",
            need >> 20,
            path.display(),
            MARGIN >> 20,
            free >> 20
        );
    }
    Ok(())
}

/// `MemAvailable` of /proc/meminfo, bytes.
fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib << 10)
}

/// Build the image, push it as gzip, and convert it with `crishim image convert` to eStargz
/// and zstd:chunked where a mode pulls them, all straight to the registry (not through the
/// throttle).
pub async fn build_images(setup: &Setup<'_>, opts: &Options) -> Result<Images> {
    let say = |m: &str| progress("lazy", m);
    let payload = opts.image_mib << 20;
    let tmp = Path::new("/var/tmp");
    let lazy_modes = opts.modes.iter().filter(|m| m.lazy()).count() as u64;
    // The registry keeps the gzip image and one copy per lazy format; the temporary layer is
    // gone before the conversions write theirs.
    let storage = setup.registry.storage_dir();
    let registry_copies = (1 + lazy_modes) * payload;
    let needs = if device(tmp)? == device(storage)? {
        vec![(storage, registry_copies.max(2 * payload))]
    } else {
        vec![(tmp, payload), (storage, registry_copies)]
    };
    check_room(
        &needs,
        "the lazy image (gzip, and each lazy format measured)",
    )?;
    // `crishim image convert` holds a layer's blob, its tar and the new blob in memory.
    if let Some(avail) = mem_available().filter(|_| lazy_modes > 0) {
        ensure!(
            avail >= 3 * payload + MARGIN,
            "crishim image convert holds about three copies of the {} MiB layer in memory; \
             {} MiB are available: choose a smaller --lazy-image-mib",
            opts.image_mib,
            avail >> 20
        );
    }

    say(&format!(
        "writing a {} MiB layer of random files",
        opts.image_mib
    ));
    let t0 = Instant::now();
    let layer =
        tokio::task::spawn_blocking(move || write_layer(tmp, payload, SMALL_SIZE, BIG_SIZE))
            .await??;
    say(&format!(
        "{} files, {} MiB gzip'd, in {:.1} s; pushing it",
        layer.files,
        layer.size >> 20,
        t0.elapsed().as_secs_f64()
    ));
    let client = setup.registry.http_client()?;
    let t0 = Instant::now();
    push_file_blob(
        &client,
        &setup.registry.url(),
        layer.file.path(),
        &layer.digest,
    )
    .await?;
    let pusher = setup.registry.pusher()?;
    let bb = busybox_layer();
    pusher.push_blob(REPO, &bb.blob).await?;
    let config = serde_json::to_vec(&json!({
        "created": "2024-01-01T00:00:00Z",
        "architecture": host_arch(),
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": ["/bin/sleep", WORKLOAD_ARG],
        },
        "rootfs": {"type": "layers", "diff_ids": [bb.diff_id, layer.diff_id]},
        "history": [
            {"created": "2024-01-01T00:00:00Z", "created_by": "busybox"},
            {"created": "2024-01-01T00:00:00Z", "created_by": "crishim-bench lazy files"},
        ],
    }))?;
    pusher.push_blob(REPO, &config).await?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha256_digest(&config), "size": config.len()},
        "layers": [
            {"mediaType": OCI_LAYER_GZIP, "digest": bb.digest, "size": bb.blob.len()},
            {"mediaType": OCI_LAYER_GZIP, "digest": layer.digest, "size": layer.size},
        ],
    }))?;
    pusher
        .push_manifest(REPO, "gzip", OCI_MANIFEST, &manifest)
        .await?;
    say(&format!("pushed in {:.1} s", t0.elapsed().as_secs_f64()));
    let LayerFile {
        file,
        size: layer_bytes,
        files,
        payload: payload_bytes,
        small,
        big_sha256,
        ..
    } = layer;
    drop(file);

    // An empty config: the registry is loopback, which crishim reaches over plain HTTP.
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("convert.toml");
    std::fs::write(&config, "")?;
    let src = format!("{}/{REPO}:gzip", setup.registry.host());
    let conversions = [
        ("estargz", Mode::Estargz),
        ("zstd-chunked", Mode::ZstdChunked),
    ];
    for (format, mode) in conversions
        .into_iter()
        .filter(|(_, m)| opts.modes.contains(m))
    {
        let dst = format!("{}/{REPO}:{}", setup.registry.host(), mode.tag());
        say(&format!("crishim image convert --format {format}"));
        let t0 = Instant::now();
        let mut cmd = tokio::process::Command::new(setup.crishim_bin);
        cmd.args(["image", "convert", "--format", format, "--config"])
            .arg(&config);
        if let Some(c) = opts.chunk_size {
            cmd.args(["--chunk-size", &c.to_string()]);
        }
        let out = cmd
            .args([&src, &dst])
            .kill_on_drop(true)
            .output()
            .await
            .context("running crishim image convert")?;
        ensure!(
            out.status.success(),
            "crishim image convert --format {format} {src} {dst}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        say(&format!(
            "{} in {:.1} s",
            String::from_utf8_lossy(&out.stdout).trim(),
            t0.elapsed().as_secs_f64()
        ));
    }
    let refs = [Mode::Full, Mode::Estargz, Mode::ZstdChunked]
        .iter()
        .filter(|m| **m == Mode::Full || opts.modes.contains(m))
        .map(|m| (m.tag().to_string(), format!("docker.io/{REPO}:{}", m.tag())))
        .collect();
    Ok(Images {
        payload_bytes,
        files,
        layer_bytes,
        refs,
        small,
        big_sha256,
    })
}

// ---------------------------------------------------------------------------------------------
// The measures

/// One mode's figures; times from the start of PullImage unless named otherwise.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    pub pull_ms: f64,
    /// PullImage, RunPodSandbox, CreateContainer and StartContainer done.
    pub started_ms: f64,
    /// The ExecSync that reads the 1 KiB file done.
    pub first_read_ms: f64,
    /// The ExecSync that reads the 100 MiB file, on its own.
    pub big_read_ms: f64,
    /// Every byte local: for a lazy pull, ImageStatus's `info["lazy"]` state "local"; for a
    /// full pull, the pull.
    pub complete_ms: Option<f64>,
    /// Allocated bytes under the runtime's root directory once complete, not crossing mounts.
    pub disk_bytes: u64,
    /// The 100 MiB file read again once every byte is local, from a cold page cache: a lazy
    /// layer's mount against a plain overlay layer.
    pub local_read_ms: f64,
    /// The daemon's peak RSS from PullImage until every byte is local, over its RSS before
    /// (crishim only).
    pub daemon_rss_growth: Option<u64>,
    /// The image was pulled whole (in a lazy column: the figures are not lazy pull's).
    pub whole: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModeResult {
    pub mode: Mode,
    pub image: String,
    pub sample: Option<Sample>,
    /// What this mode's figures need said beside them.
    pub notes: Vec<String>,
    pub error: Option<String>,
}

/// A runtime under test: its CRI client, where its bytes go, where the pods' logs and cgroups go.
struct Node {
    cri: Cri,
    /// The daemon's pid, for its RSS.
    pid: Option<u32>,
    root: PathBuf,
    run_dir: PathBuf,
    cgroup_top: String,
}

/// `info["lazy"]` of ImageStatus, as crishim reports a lazily pulled image.
#[derive(Debug, serde::Deserialize)]
struct LazyInfo {
    state: String,
    #[serde(default)]
    local_bytes: u64,
    #[serde(default)]
    size_bytes: u64,
}

enum Prefetch {
    /// State "local" seen this long after the start of the pull.
    Done(Duration),
    /// Local at the first look, right after PullImage returned (or no `info["lazy"]` at all):
    /// the image was pulled whole, for this reason.
    Whole(&'static str),
}

/// Poll ImageStatus until the image is all local (or quarantined, or `limit` has passed).
async fn watch_prefetch(cri: Cri, image: String, t0: Instant, limit: Duration) -> Result<Prefetch> {
    let mut last_say = Instant::now();
    let mut first = true;
    loop {
        let info = cri.image_info(&image).await?;
        let Some(raw) = info.get("lazy") else {
            return Ok(Prefetch::Whole("ImageStatus has no info[\"lazy\"]"));
        };
        let lazy: LazyInfo =
            serde_json::from_str(raw).with_context(|| format!("info[\"lazy\"] = {raw}"))?;
        match lazy.state.as_str() {
            "local" if first => {
                return Ok(Prefetch::Whole(
                    "info[\"lazy\"] said \"local\" as soon as PullImage returned",
                ))
            }
            "local" => return Ok(Prefetch::Done(t0.elapsed())),
            "lazy" => {}
            "quarantined" => bail!("the image was quarantined during its prefetch: {raw}"),
            other => bail!("info[\"lazy\"] has state {other:?}: {raw}"),
        }
        if last_say.elapsed() >= Duration::from_secs(10) {
            last_say = Instant::now();
            progress(
                "lazy",
                &format!(
                    "prefetch: {} of {} MiB local",
                    lazy.local_bytes >> 20,
                    lazy.size_bytes >> 20
                ),
            );
        }
        ensure!(
            t0.elapsed() < limit,
            "the prefetch was not complete {limit:?} after the pull started: {raw}"
        );
        first = false;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS:`, `VmHWM:`).
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Bytes allocated to the files under `root`, on `root`'s filesystem only, each inode once.
fn allocated_bytes(root: &Path) -> u64 {
    let Ok(top) = std::fs::symlink_metadata(root) else {
        return 0;
    };
    let dev = top.dev();
    let mut seen = std::collections::HashSet::new();
    let mut total = top.blocks() * 512;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.dev() != dev || (m.nlink() > 1 && !m.is_dir() && !seen.insert(m.ino())) {
                continue;
            }
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

/// Pull `image` and run it: the figures of [`Sample`], and the notes they need.
async fn measure(
    node: &Node,
    images: &Images,
    mode: Mode,
    opts: &Options,
    notes: &mut Vec<String>,
) -> Result<Sample> {
    let say = |m: &str| progress(mode.title(), m);
    let image = images.reference(mode).to_string();
    let cri = &node.cri;
    let h = crishim_tests::random_hex;
    let uid = format!("{}-{}-{}-{}-{}", h(4), h(2), h(2), h(2), h(6));
    let cgroup = format!("/{}/pod{uid}", node.cgroup_top);
    host::create_pod_cgroup(&cgroup)?;
    let logs = node
        .run_dir
        .join("pod-logs")
        .join(format!("crishim-bench_lazy_{uid}"));
    std::fs::create_dir_all(&logs)?;
    let pod = pod_config("lazy", &uid, &logs, &cgroup);
    let container =
        crishim_tests::pods::container_config("work", &image, &["/bin/sleep", WORKLOAD_ARG]);
    let limit = time_limit(images, opts);
    let limit_s = limit.as_secs() as i64;

    say(&format!("PullImage {image}"));
    // Peak RSS from here on: `clear_refs` 5 resets the high-water mark.
    let rss_before = node.pid.and_then(|pid| {
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").ok()?;
        status_kib(pid, "VmRSS:")
    });
    let t0 = Instant::now();
    cri.pull(&image).await?;
    let pull = t0.elapsed();
    let watcher = mode
        .lazy()
        .then(|| tokio::spawn(watch_prefetch(cri.clone(), image.clone(), t0, limit)));
    let pod_id = cri.run_pod(&pod).await?;
    let result = async {
        let id = cri.create_container(&pod_id, &container, &pod).await?;
        cri.start_container(&id).await?;
        let started = t0.elapsed();
        say(&format!(
            "started {:.2} s after PullImage",
            started.as_secs_f64()
        ));

        let small = cri.exec_output(&id, &["cat", SMALL_FILE], limit_s).await?;
        let first_read = t0.elapsed();
        ensure!(
            small == images.small,
            "{SMALL_FILE} read back as {} bytes that differ from those written",
            small.len()
        );

        let cat = format!("cat {BIG_FILE} > /dev/null");
        let t1 = Instant::now();
        cri.exec_output(&id, &["/bin/sh", "-c", &cat], limit_s)
            .await?;
        let big_read = t1.elapsed();
        say(&format!(
            "read {BIG_FILE} in {:.2} s",
            big_read.as_secs_f64()
        ));

        let (complete, whole) = match watcher {
            None => (Some(pull), true),
            Some(w) => match w.await? {
                Ok(Prefetch::Done(at)) => (Some(at), false),
                Ok(Prefetch::Whole(why)) => {
                    notes.push(format!("pulled whole, not lazily: {why}"));
                    (Some(pull), true)
                }
                Err(e) => {
                    notes.push(format!("prefetch: {e:#}"));
                    (None, false)
                }
            },
        };
        // Checked after the timed reads, once the bytes are local.
        let out = cri
            .exec_output(&id, &["/bin/busybox", "sha256sum", BIG_FILE], limit_s)
            .await?;
        let sum = String::from_utf8_lossy(&out);
        ensure!(
            sum.split_whitespace().next() == Some(images.big_sha256.as_str()),
            "{BIG_FILE} reads back with sha256 {sum:?}, not {}",
            images.big_sha256
        );
        let daemon_rss_growth = match (node.pid, rss_before) {
            (Some(pid), Some(before)) => {
                status_kib(pid, "VmHWM:").map(|hwm| hwm.saturating_sub(before) << 10)
            }
            _ => None,
        };
        let disk_bytes = allocated_bytes(&node.root);
        // The same read with every byte local and nothing cached: what a lazy layer's mount
        // costs over a plain layer once prefetched.
        let _ = std::process::Command::new("sync").status();
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
        let t2 = Instant::now();
        cri.exec_output(&id, &["/bin/sh", "-c", &cat], limit_s)
            .await?;
        let local_read = t2.elapsed();
        Ok(Sample {
            local_read_ms: ms(local_read),
            daemon_rss_growth,
            pull_ms: ms(pull),
            started_ms: ms(started),
            first_read_ms: ms(first_read),
            big_read_ms: ms(big_read),
            complete_ms: complete.map(ms),
            disk_bytes,
            whole,
        })
    }
    .await;
    let stopped = async {
        cri.stop_pod(&pod_id).await?;
        cri.remove_pod(&pod_id).await
    }
    .await;
    let sample = result?;
    stopped?;
    Ok(sample)
}

/// How long a CRI call, or the prefetch, may take: four times the time the whole image takes at
/// the registry's rate, and five minutes (a full pull of 4 GiB at 100 MiB/s is 41 s at best).
fn time_limit(images: &Images, opts: &Options) -> Duration {
    Duration::from_secs(4 * images.layer_bytes / (opts.rate_mib << 20).max(1) + 300)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `[images]` keys of a crishim mode (their names are the daemon's config contract).
fn images_keys(mode: Mode, opts: &Options) -> Vec<(&'static str, String)> {
    if !mode.lazy() {
        return vec![("lazy", "false".into())];
    }
    let mut keys = vec![
        ("lazy", "true".into()),
        (
            "lazy_prefetch_bandwidth",
            opts.prefetch_bandwidth.to_string(),
        ),
    ];
    if let Some(c) = opts.prefetch_concurrency {
        keys.push(("lazy_prefetch_concurrency", c.to_string()));
    }
    keys
}

async fn run_crishim(
    setup: &Setup<'_>,
    proxy: &Throttle,
    images: &Images,
    mode: Mode,
    opts: &Options,
    notes: &mut Vec<String>,
) -> Result<Sample> {
    let say = |m: &str| progress(mode.title(), m);
    say("starting crishim serve");
    let options = |keys: &[(&str, String)]| {
        keys.iter().fold(
            crate::crishim_options(&proxy.url(), setup.cni_dir, setup.crishim_log, ""),
            |o, (k, v)| o.images_toml(k, v),
        )
    };
    let keys = images_keys(mode, opts);
    // The FUSE server the daemon starts for lazy layers; without it, it pulls them whole.
    let lazyfs = setup.crishim_bin.with_file_name("crishim-lazyfs");
    if mode.lazy() && !lazyfs.exists() {
        notes.push(format!("{} is missing", lazyfs.display()));
    }
    let daemon = match Daemon::start(options(&keys)).await {
        Ok(d) => d,
        // A crishim from before lazy pull pulls whole anyway: its full-pull column stands.
        Err(e) if !mode.lazy() && format!("{e:#}").contains("unknown field `lazy`") => {
            notes.push("this crishim has no [images] lazy: it pulls every image whole".into());
            Daemon::start(options(&[])).await?
        }
        Err(e) => return Err(e.context("starting crishim serve")),
    };
    let sweeper = crate::crishim_sweeper(&daemon, setup.bridge);
    let result = async {
        let cri = Cri::connect_with_timeout(daemon.socket(), time_limit(images, opts)).await?;
        cri.wait_ready(Duration::from_secs(30)).await?;
        let node = Node {
            cri,
            pid: daemon.pid(),
            root: daemon.root_dir(),
            run_dir: daemon.dir().to_path_buf(),
            cgroup_top: sweeper.cgroup_top.clone(),
        };
        measure(&node, images, mode, opts, notes).await
    }
    .await;
    let log = daemon.log_text();
    if let Some(d) = setup.log_dir {
        let _ = std::fs::write(d.join(format!("crishim-lazy-{}.log", mode.tag())), &log);
    }
    drop(daemon);
    drop(sweeper);
    result.map_err(|e| {
        e.context(format!(
            "crishim's log ends:\n{}",
            crate::text::tail(&log, 4000)
        ))
    })
}

async fn run_containerd(
    setup: &Setup<'_>,
    proxy: &Throttle,
    images: &Images,
    opts: &Options,
    notes: &mut Vec<String>,
) -> Result<Sample> {
    let say = |m: &str| progress("containerd", m);
    say("starting containerd");
    let node = ContainerdNode::start(&proxy.url(), setup.cni_dir, setup.bridge).await?;
    let result = async {
        let cri = Cri::connect_with_timeout(&node.ctd.socket, time_limit(images, opts)).await?;
        cri.wait_ready(Duration::from_secs(30)).await?;
        cri.pull(PAUSE_IMAGE).await?;
        let n = Node {
            cri,
            pid: None,
            root: node.root(),
            run_dir: node.dir.path().to_path_buf(),
            cgroup_top: node.sweeper.cgroup_top.clone(),
        };
        measure(&n, images, Mode::Containerd, opts, notes).await
    }
    .await;
    let log = node.ctd.log_tail();
    node.save_log(setup.log_dir);
    drop(node);
    result.map_err(|e| e.context(format!("containerd's log ends:\n{log}")))
}

// ---------------------------------------------------------------------------------------------
// The run and its table

#[derive(Serialize)]
struct Report<'a> {
    options: &'a Options,
    cores: usize,
    images: &'a Images,
    modes: &'a [ModeResult],
}

/// Build the images, put the throttle in front of the registry, and measure each mode on a
/// fresh runtime.
pub async fn run(setup: &Setup<'_>, opts: &Options) -> Result<()> {
    ensure!(
        opts.image_mib >= MIN_IMAGE_MIB,
        "--lazy-image-mib must be at least {MIN_IMAGE_MIB} (the image holds a 100 MiB file)"
    );
    ensure!(!opts.modes.is_empty(), "no mode to measure");
    let images = build_images(setup, opts).await?;
    let rate = opts.rate_mib << 20;
    let proxy = Throttle::in_front_of(setup.registry, ThrottleOptions::new().rate(rate)).await?;
    let mut results = Vec::new();
    for &mode in &opts.modes {
        eprintln!("== {}", mode.title());
        let mut notes = Vec::new();
        // A full pull keeps the layer unpacked, and containerd its blob too.
        let room = check_room(
            &[(&std::env::temp_dir(), 2 * images.payload_bytes)],
            mode.title(),
        );
        let sample = match room {
            Err(e) => Err(e),
            Ok(()) if mode == Mode::Containerd => {
                run_containerd(setup, &proxy, &images, opts, &mut notes).await
            }
            Ok(()) => run_crishim(setup, &proxy, &images, mode, opts, &mut notes).await,
        };
        let (sample, error) = match sample {
            Ok(s) => (Some(s), None),
            Err(e) => {
                progress(mode.title(), &format!("failed: {e:#}"));
                (None, Some(format!("{e:#}")))
            }
        };
        results.push(ModeResult {
            mode,
            image: images.reference(mode).to_string(),
            sample,
            notes,
            error,
        });
    }
    drop(proxy);

    println!(
        "\n## Lazy pull: a {} MiB image ({} files, {} MiB as gzip), the registry at {} MiB/s\n",
        opts.image_mib,
        images.files,
        images.layer_bytes >> 20,
        opts.rate_mib
    );
    print!("{}", table(&results));
    for r in &results {
        for n in &r.notes {
            println!("- {}: {n}", r.mode.title());
        }
        if let Some(e) = &r.error {
            println!("- {}: failed: {}", r.mode.title(), first_line(e));
        }
    }
    let report = Report {
        options: opts,
        cores: host::cores(),
        images: &images,
        modes: &results,
    };
    if let Some(dir) = setup.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(setup.output, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", setup.output.display()))?;
    println!("raw samples: {}", setup.output.display());
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| {
            r.error.is_some()
                || r.sample
                    .as_ref()
                    .is_some_and(|s| s.complete_ms.is_none() || (r.mode.lazy() && s.whole))
        })
        .map(|r| r.mode.title())
        .collect();
    if !failed.is_empty() {
        return Err(anyhow!("failed: {}", failed.join(", ")));
    }
    Ok(())
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

#[derive(Clone, Copy)]
enum Unit {
    Ms,
    Bytes,
}

/// (measure, unit, how to get it from a sample)
type Row = (&'static str, Unit, fn(&Sample) -> Option<f64>);

const ROWS: [Row; 8] = [
    ("PullImage returned", Unit::Ms, |s| Some(s.pull_ms)),
    ("container started (from PullImage)", Unit::Ms, |s| {
        Some(s.started_ms)
    }),
    ("1 KiB file read (from PullImage)", Unit::Ms, |s| {
        Some(s.first_read_ms)
    }),
    ("100 MiB file read (alone)", Unit::Ms, |s| {
        Some(s.big_read_ms)
    }),
    ("every byte local (from PullImage)", Unit::Ms, |s| {
        s.complete_ms
    }),
    ("disk used then", Unit::Bytes, |s| Some(s.disk_bytes as f64)),
    (
        "100 MiB file read, every byte local, cold cache",
        Unit::Ms,
        |s| Some(s.local_read_ms),
    ),
    ("daemon peak RSS growth", Unit::Bytes, |s| {
        s.daemon_rss_growth.map(|b| b as f64)
    }),
];

fn value(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Ms if v < 1000.0 => format!("{v:.0} ms"),
        Unit::Ms => format!("{:.2} s", v / 1000.0),
        Unit::Bytes => format!("{:.0} MiB", v / f64::from(1 << 20)),
    }
}

/// A row per measure, a column per mode; each crishim cell with its ratio to containerd's.
fn table(results: &[ModeResult]) -> String {
    let mut out = String::from("| measure |");
    for r in results {
        out.push_str(&format!(" {} |", r.mode.title()));
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(results.len()));
    out.push('\n');
    let base = results
        .iter()
        .find(|r| r.mode == Mode::Containerd)
        .and_then(|r| r.sample.as_ref());
    for (name, unit, get) in ROWS {
        out.push_str(&format!("| {name} |"));
        for r in results {
            let v = r.sample.as_ref().and_then(get);
            let cell = match (v, base.and_then(get)) {
                (None, _) => "–".to_string(),
                (Some(v), Some(b)) if r.mode != Mode::Containerd && b > 0.0 => {
                    format!("{} ({:.2})", value(v, unit), v / b)
                }
                (Some(v), _) => value(v, unit),
            };
            out.push_str(&format!(" {cell} |"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_add_up_and_stay_within_bounds() {
        let mut rng = Rng(7);
        for total in [
            1u64 << 10,
            5 << 10,
            199 << 20,
            (512 << 20) + 100,
            3995 << 20,
        ] {
            let sizes = random_sizes(total, &mut rng);
            assert_eq!(sizes.iter().sum::<u64>(), total, "{total}");
            assert!(
                sizes.iter().all(|&s| (MIN_FILE..=MAX_FILE).contains(&s)),
                "{sizes:?}"
            );
        }
        let big = random_sizes(3995 << 20, &mut rng);
        assert!(
            big.contains(&MAX_FILE) && big.iter().any(|&s| s < 1 << 20),
            "{big:?}"
        );
    }

    #[test]
    fn the_layer_is_a_gzip_tar_with_the_known_files_last_and_its_digests_right() {
        let dir = tempfile::tempdir().unwrap();
        let (payload, big) = (3 << 20, 1 << 20);
        let l = write_layer(dir.path(), payload, SMALL_SIZE, big).unwrap();
        let blob = std::fs::read(l.file.path()).unwrap();
        assert_eq!(
            (blob.len() as u64, sha256_digest(&blob)),
            (l.size, l.digest.clone())
        );
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(&blob[..])
            .read_to_end(&mut tar)
            .unwrap();
        assert_eq!(sha256_digest(&tar), l.diff_id);
        let mut a = tar::Archive::new(&tar[..]);
        let mut files = Vec::new();
        let mut total = 0;
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            if e.header().entry_type().is_file() {
                total += e.size();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                files.push((path, data));
            }
        }
        assert_eq!(total, payload);
        assert_eq!(files.len(), l.files);
        let n = files.len();
        assert_eq!(files[n - 2].0, SMALL_FILE.trim_start_matches('/'));
        assert_eq!(files[n - 2].1, l.small);
        assert_eq!(files[n - 1].0, BIG_FILE.trim_start_matches('/'));
        assert_eq!(files[n - 1].1.len() as u64, big);
        assert_eq!(hex::encode(Sha256::digest(&files[n - 1].1)), l.big_sha256);
        // Random bytes: gzip cannot shrink them.
        assert!(l.size > total);
    }

    #[test]
    fn cells_carry_their_ratio_to_containerd() {
        let s = |x: f64| Sample {
            pull_ms: x,
            started_ms: x,
            first_read_ms: x,
            big_read_ms: x,
            complete_ms: Some(x),
            disk_bytes: (x as u64) << 20,
            local_read_ms: x,
            daemon_rss_growth: None,
            whole: false,
        };
        let r = |mode, sample| ModeResult {
            mode,
            image: String::new(),
            sample,
            notes: Vec::new(),
            error: None,
        };
        let t = table(&[
            r(Mode::Estargz, Some(s(500.0))),
            r(Mode::Full, None),
            r(Mode::Containerd, Some(s(2000.0))),
        ]);
        assert!(
            t.contains("| PullImage returned | 500 ms (0.25) | – | 2.00 s |"),
            "{t}"
        );
        assert!(
            t.contains("| disk used then | 500 MiB (0.25) | – | 2000 MiB |"),
            "{t}"
        );
    }
}
