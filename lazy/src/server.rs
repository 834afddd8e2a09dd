//! `crishim-lazyfs --dir <layer dir>`: the FUSE server of one lazy layer, outside the daemon
//! (as a pod's shim is), so that a daemon restart or upgrade leaves every mount serving.
//!
//! It reads its [`Spec`], forks into a session of its own and reports to the daemon through
//! its stdout: `ok` once the TOC is in and checked and the layer is mounted, `whole <why>`
//! where the layer must be pulled whole instead (not a lazy format, no `Range`, a TOC refused).
//! Then it serves reads and runs the prefetch: the whole blob, fetched in order (eStargz puts
//! the files before its prefetch landmark first), checked against its digest and diff ID as a
//! full pull checks it, and unpacked by the same unpacker into an ordinary snapshot. From then
//! on reads come from that snapshot. The server exits once the kernel drops its mount (the
//! daemon detached it and no overlay holds it).

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crishim_images::pull::{store_layer, LayerSink, Pace};
use crishim_images::registry::{RegistryClient, Repository};
use crishim_images::store::Layout;
use crishim_images::{Digest, ImageError, ImagesConfig, LazyState, LazyStatus, Reference};

use crate::cache::{Cache, FetchFailed, Fetcher};
use crate::fetch::{FetchError, LazyLayer, Opened};
use crate::fs::LazyFs;
use crate::spec::{self, Spec};
use crate::toc::{Chunk, Format, Limits};
use crate::tree::Tree;

/// FUSE request threads: reads that wait on the network do not hold up lookups.
const FUSE_THREADS: usize = 16;
/// How often the status file is rewritten while something changes.
const STATUS_EVERY: Duration = Duration::from_secs(1);
/// A failed prefetch (registry away, disk full) is tried again after this, doubling to the cap.
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_CAP: Duration = Duration::from_secs(300);

pub fn main(args: &[String]) -> ! {
    let dir = match args {
        [flag, dir] if flag == "--dir" => PathBuf::from(dir),
        _ => fail("usage: crishim-lazyfs --dir <lazy layer directory>"),
    };
    let spec: Spec = match crishim_sys::hostfs::read_capped(&dir.join(spec::SPEC), spec::SPEC_MAX)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => fail(&format!("reading {}: {e}", dir.join(spec::SPEC).display())),
    };
    // The report: `ok`, or `whole <why>` (the daemon pulls the layer whole), or `error <why>`.
    crishim_sys::daemon::fork_with_report(
        "crishim-lazyfs",
        |msg| msg.starts_with("ok") || msg.starts_with("whole"),
        |w| {
            redirect_stdio(&dir);
            let mut ready = Some(w);
            match serve(&dir, spec, &mut ready) {
                Ok(()) => 0,
                Err(e) => {
                    tracing::error!(error = %e, "lazy layer server failed");
                    report(&mut ready, &format!("error {e}"));
                    1
                }
            }
        },
    )
}

fn fail(msg: &str) -> ! {
    eprintln!("crishim-lazyfs: {msg}");
    std::process::exit(1)
}

fn redirect_stdio(dir: &Path) {
    use std::os::unix::fs::OpenOptionsExt as _;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    if let Ok(null) = null {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
        let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(crishim_sys::hostfs::FILE_MODE)
        .open(dir.join(spec::LOG));
    if let Ok(log) = log {
        let _ = nix::unistd::dup2(log.as_raw_fd(), 2);
    }
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
    let _ = crishim_sys::hostfs::write_private(
        &dir.join(spec::PID),
        std::process::id().to_string().as_bytes(),
    );
}

fn report(ready: &mut Option<std::fs::File>, msg: &str) {
    if let Some(mut r) = ready.take() {
        let _ = r.write_all(msg.as_bytes());
    }
}

fn serve(dir: &Path, spec: Spec, ready: &mut Option<std::fs::File>) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let read_timeout = Duration::from_millis(spec.read_timeout_ms);
    // Lives as long as the process, as the repository that borrows it.
    let client: &'static RegistryClient = Box::leak(Box::new(
        RegistryClient::with_read_timeout(spec.registry.clone(), read_timeout)
            .map_err(|e| e.to_string())?,
    ));
    let reference = Reference::parse(&spec.image).map_err(|e| e.to_string())?;
    let digest = Digest::parse(spec.layer.digest().as_ref()).map_err(|e| e.to_string())?;
    let annotations = spec.layer.annotations().clone().unwrap_or_default();
    let opened = rt.block_on(async {
        let (repo, _) = client.resolve(&reference, spec.creds.as_ref()).await?;
        let opened = crate::fetch::open(
            &repo,
            &digest,
            spec.layer.size(),
            &annotations,
            &Limits::default(),
        )
        .await?;
        Ok::<_, FetchError>((repo, opened))
    });
    let (repo, layer) = match opened {
        Ok((repo, Opened::Lazy(layer))) => (repo, layer),
        Ok((_, Opened::NotLazy)) => {
            report(ready, "whole not in a lazy format");
            return Ok(());
        }
        Ok((_, Opened::RangeIgnored)) => {
            report(
                ready,
                "whole range-ignored: the registry does not honour Range",
            );
            return Ok(());
        }
        Err(e) => {
            report(ready, &format!("whole {e}"));
            return Ok(());
        }
    };
    let layer = Arc::new(layer);
    let inline = (layer.format == Format::Estargz)
        .then(|| (crate::estargz::TOC_NAME, layer.toc_json.clone()));
    let tree = Arc::new(Tree::build(&layer.toc, inline));
    let (mnt, cache_dir) = (dir.join(spec::MNT), dir.join(spec::CACHE));
    for d in [&mnt, &cache_dir] {
        crishim_sys::hostfs::create_private_dir(d)
            .map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    let repo = Arc::new(repo);
    let fetcher = RegistryFetcher {
        rt: rt.handle().clone(),
        repo: repo.clone(),
        layer: layer.clone(),
        // No progress for the read timeout fails the read; this caps a trickle.
        cap: read_timeout.saturating_mul(4),
    };
    let cache = Arc::new(Cache::new(
        cache_dir.clone(),
        tree.clone(),
        Box::new(fetcher),
    ));
    let fs = Arc::new(LazyFs::new(tree.clone(), cache.clone()));
    let passthrough = fs.passthrough_on.clone();
    let fd = mount(&mnt).map_err(|e| format!("mounting {}: {e}", mnt.display()))?;
    let mut config = fuser::Config::default();
    config.n_threads = Some(FUSE_THREADS);
    config.clone_fd = true;
    config.acl = fuser::SessionACL::All;
    let session = fuser::Session::from_fd(fs.shared(), fd, fuser::SessionACL::All, config)
        .map_err(|e| {
            let _ = nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH);
            format!("starting the FUSE session: {e}")
        })?;
    let session = std::thread::Builder::new()
        .name("fuse".into())
        .spawn(move || session.run())
        .map_err(|e| format!("FUSE thread: {e}"))?;
    tracing::info!(
        layer = %digest,
        entries = layer.toc.entries.len(),
        chunks = tree.chunks.len(),
        passthrough = passthrough.load(Ordering::Relaxed),
        "lazy layer mounted"
    );
    report(ready, "ok");

    let progress = Arc::new(AtomicU64::new(0));
    let state = Arc::new(Mutex::new((LazyState::Lazy, None::<String>)));
    let status = {
        let (dir, cache, progress, state) = (
            dir.to_path_buf(),
            cache.clone(),
            progress.clone(),
            state.clone(),
        );
        let size = spec.layer.size();
        move || {
            let (s, reason) = state.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let stats = &cache.stats;
            let local = match s {
                LazyState::Local => size,
                _ => stats
                    .local_bytes
                    .load(Ordering::Relaxed)
                    .max(progress.load(Ordering::Relaxed))
                    .min(size),
            };
            let st = LazyStatus {
                state: s,
                local_bytes: local,
                size_bytes: size,
                fetched_bytes: stats.fetched_bytes.load(Ordering::Relaxed)
                    + progress.load(Ordering::Relaxed),
                chunk_errors: stats.chunk_errors.load(Ordering::Relaxed),
                reason,
            };
            let _ = spec::write_status(&dir, &st);
        }
    };
    status();
    {
        let status = status.clone();
        std::thread::Builder::new()
            .name("status".into())
            .spawn(move || loop {
                std::thread::sleep(STATUS_EVERY);
                status();
            })
            .map_err(|e| format!("status thread: {e}"))?;
    }
    {
        let (spec, dir, fs, cache_dir) = (spec, dir.to_path_buf(), fs.clone(), cache_dir);
        let (progress, state, repo) = (progress, state, repo);
        rt.spawn(async move {
            let outcome = prefetch(&spec, &dir, &repo, &progress).await;
            let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
            match outcome {
                Ok(snapshot) => {
                    fs.promote(snapshot);
                    // The snapshot holds every byte now: the chunks go.
                    let _ = std::fs::remove_dir_all(&cache_dir);
                    *st = (LazyState::Local, None);
                    tracing::info!("prefetch done: the layer is an ordinary snapshot");
                }
                Err(reason) => {
                    tracing::error!(%reason, "the layer is quarantined");
                    *st = (LazyState::Quarantined, Some(reason));
                }
            }
            drop(st);
            status();
        });
    }
    // Ends when the kernel drops the mount: detached, and no overlay left holding it.
    let ended = session.join();
    tracing::info!(?ended, "FUSE session over, exiting");
    rt.shutdown_background();
    Ok(())
}

/// Mount `/dev/fuse` at `mnt`: read-only, no devices, every user (containers run as any uid),
/// permissions checked by the kernel from the TOC's modes.
fn mount(mnt: &Path) -> std::io::Result<OwnedFd> {
    use nix::mount::MsFlags;
    let fd: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?
        .into();
    let opts = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions",
        fd.as_raw_fd()
    );
    nix::mount::mount(
        Some("crishim-lazy"),
        mnt,
        Some(spec::FS_TYPE),
        MsFlags::MS_RDONLY | MsFlags::MS_NODEV | MsFlags::MS_NOATIME,
        Some(opts.as_str()),
    )?;
    Ok(fd)
}

/// Chunks fetched with range requests through the registry client (mirrors, `hosts.toml`,
/// auth and token refresh as any pull), from the FUSE threads.
struct RegistryFetcher {
    rt: tokio::runtime::Handle,
    repo: Arc<Repository<'static>>,
    layer: Arc<LazyLayer>,
    cap: Duration,
}

impl Fetcher for RegistryFetcher {
    fn fetch(&self, chunk: &Chunk) -> Result<Vec<u8>, FetchFailed> {
        let offset = chunk.compressed.start;
        // The timer is made inside the runtime: FUSE threads are not its workers.
        let fetched = self.rt.block_on(async {
            tokio::time::timeout(self.cap, self.layer.fetch(&self.repo, chunk)).await
        });
        match fetched {
            Ok(Ok(Some(data))) => Ok(data),
            Ok(Ok(None)) => Err(FetchFailed::Unavailable {
                offset,
                why: "the registry stopped honouring Range".into(),
            }),
            Ok(Err(FetchError::Chunk(e))) => Err(FetchFailed::Corrupt {
                offset,
                why: e.to_string(),
            }),
            Ok(Err(e)) => Err(FetchFailed::Unavailable {
                offset,
                why: e.to_string(),
            }),
            Err(_) => Err(FetchFailed::Unavailable {
                offset,
                why: format!("no answer within {:?}", self.cap),
            }),
        }
    }
}

/// The prefetch's share of the bandwidth limit: a virtual clock advanced by each chunk's time
/// at the rate.
struct Bucket {
    rate: u64,
    next: Mutex<Instant>,
}

impl Pace for Bucket {
    fn delay(&self, bytes: u64) -> Duration {
        if self.rate == 0 {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let cost = Duration::from_secs_f64(bytes as f64 / self.rate as f64);
        *next = (*next).max(now) + cost;
        next.saturating_duration_since(now)
    }
}

/// Download the whole layer as a pull does, into the store's snapshot of its chain, and return
/// that snapshot opened; `Err` with the reason where the blob is not what the manifest says.
/// Anything else (the registry away, the disk full) is tried again later.
async fn prefetch(
    spec: &Spec,
    dir: &Path,
    repo: &Repository<'_>,
    progress: &AtomicU64,
) -> Result<OwnedFd, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let chain = Digest::parse(&spec.chain).map_err(|e| e.to_string())?;
    let diff_id = Digest::parse(&spec.diff_id).map_err(|e| e.to_string())?;
    let layout = Layout::new(&spec.store_root);
    let concurrency = spec.prefetch_concurrency.max(1);
    let bucket = Bucket {
        // A limit, however low, stays a limit.
        rate: match spec.prefetch_bandwidth {
            0 => 0,
            b => (b / concurrency as u64).max(1),
        },
        next: Mutex::new(Instant::now()),
    };
    let limits = ImagesConfig {
        max_unpacked_bytes: spec.max_unpacked_bytes,
        max_layer_entries: spec.max_layer_entries,
        min_free_percent: spec.min_free_percent,
        pull_progress_timeout: Duration::from_millis(spec.progress_timeout_ms),
        ..ImagesConfig::default()
    };
    let mut wait = RETRY_FIRST;
    loop {
        let _slot = slot(&spec.store_root.join("lazy"), concurrency).await;
        let sink = LayerSink {
            layout: &layout,
            progress_timeout: limits.pull_progress_timeout,
            tmp_dir: dir.join(spec::UNPACK),
            pace: Some(&bucket),
            progress: Some(progress),
        };
        let _ = std::fs::remove_dir_all(&sink.tmp_dir);
        let budget = Arc::new(crishim_images::limits::Budget::new(&limits));
        let started = Instant::now();
        match store_layer(&sink, repo, &spec.layer, &diff_id, &chain, &budget).await {
            Ok(()) => {
                tracing::info!(
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "prefetched the whole layer"
                );
                let snap = layout.snapshot(&chain);
                return std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
                    .open(&snap)
                    .map(OwnedFd::from)
                    .map_err(|e| format!("opening {}: {e}", snap.display()));
            }
            Err(e @ (ImageError::DigestMismatch { .. } | ImageError::HostileLayer { .. })) => {
                return Err(e.to_string());
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?wait, "prefetch failed");
                progress.store(0, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RETRY_CAP);
    }
}

/// One of `n` prefetch slots shared by every server (a lock file each): the concurrency limit.
async fn slot(dir: &Path, n: u32) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt as _;
    let slots = dir.join("prefetch-slots");
    let _ = crishim_sys::hostfs::create_private_dir(&slots);
    loop {
        for i in 0..n {
            // Opened, never replaced: another server may hold the lock on this very file.
            let Ok(f) = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(crishim_sys::hostfs::FILE_MODE)
                .open(slots.join(i.to_string()))
            else {
                continue;
            };
            // SAFETY: flock on an owned, open descriptor.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return f;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
