//! The daemon's side of lazy layers: it starts a layer's FUSE server (`crishim-lazyfs`) at
//! PullImage, names its mount as a container's lower layer, finds the servers again after a
//! restart, and lets a layer go once nothing uses it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crishim_images::lazy::{LazyFuture, LazyOutcome, LazyRequest};
use crishim_images::registry::RegistryConfig;
use crishim_images::{Digest, ImagesConfig, LazyLayers, LazyState, LazyStatus};
use tracing::{info, warn};

use crate::spec::{self, Spec};

/// `[images]` settings of lazy layers.
#[derive(Debug, Clone)]
pub struct Settings {
    pub read_timeout: Duration,
    pub prefetch_bandwidth: u64,
    pub prefetch_concurrency: u32,
}

pub struct Snapshotter {
    store_root: PathBuf,
    /// `crishim-lazyfs`.
    server: PathBuf,
    registry: RegistryConfig,
    limits: ImagesConfig,
    settings: Settings,
    /// A registry that ignores `Range` is logged once, not at every layer.
    range_warned: AtomicBool,
}

impl Snapshotter {
    /// Lazy layers of the store at `store_root`, served by `server`. Finds the layers a
    /// previous daemon left: a server still running keeps serving; one that is gone (a reboot)
    /// is started again.
    pub fn new(
        store_root: &Path,
        server: PathBuf,
        registry: RegistryConfig,
        limits: ImagesConfig,
        settings: Settings,
    ) -> std::io::Result<Snapshotter> {
        let s = Snapshotter {
            store_root: store_root.to_path_buf(),
            server,
            registry,
            limits,
            settings,
            range_warned: AtomicBool::new(false),
        };
        crishim_sys::hostfs::create_private_dir(&s.root())?;
        s.recover();
        Ok(s)
    }

    fn root(&self) -> PathBuf {
        self.store_root.join("lazy")
    }

    fn dir(&self, chain: &Digest) -> PathBuf {
        spec::layer_dir(&self.store_root, chain.hex())
    }

    fn layer_dirs(&self) -> Vec<(String, PathBuf)> {
        let Ok(rd) = std::fs::read_dir(self.root()) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                (name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()))
                    .then(|| (name, e.path()))
            })
            .collect()
    }

    fn recover(&self) {
        for (hex, dir) in self.layer_dirs() {
            let snapshot = self.store_root.join("snapshots").join(&hex);
            let quarantined =
                spec::read_status(&dir).is_some_and(|s| s.state == LazyState::Quarantined);
            if spec::alive(&dir) || quarantined || snapshot.is_dir() {
                continue;
            }
            // Its server is gone (a reboot, or it was killed): its mount, if any, is dead.
            forget(&dir);
            if !dir.join(spec::SPEC).is_file() {
                let _ = std::fs::remove_dir_all(&dir);
                continue;
            }
            match start(&self.server, &dir, self.settings.read_timeout * 4) {
                Ok(Started::Mounted) => info!(layer = %hex, "lazy layer served again"),
                Ok(Started::Whole(why)) | Err(why) => {
                    warn!(layer = %hex, reason = %why, "lazy layer could not be served again");
                    let _ = std::fs::remove_dir_all(&dir);
                }
            }
        }
    }

    fn spec(&self, req: &LazyRequest<'_>) -> Spec {
        Spec {
            store_root: self.store_root.clone(),
            chain: req.chain.to_string(),
            diff_id: req.diff_id.to_string(),
            image: req.image.to_string(),
            layer: req.layer.clone(),
            registry: self.registry.clone(),
            creds: req.creds.cloned(),
            read_timeout_ms: self.settings.read_timeout.as_millis() as u64,
            progress_timeout_ms: self.limits.pull_progress_timeout.as_millis() as u64,
            prefetch_bandwidth: self.settings.prefetch_bandwidth,
            prefetch_concurrency: self.settings.prefetch_concurrency,
            max_unpacked_bytes: self.limits.max_unpacked_bytes,
            max_layer_entries: self.limits.max_layer_entries,
            min_free_percent: self.limits.min_free_percent,
        }
    }

    async fn mount_layer(&self, req: LazyRequest<'_>) -> LazyOutcome {
        let annotations = req.layer.annotations().clone().unwrap_or_default();
        if !crishim_images::lazy::is_lazy_format(&annotations) {
            return LazyOutcome::Whole("not in a lazy format".into());
        }
        if !Path::new("/dev/fuse").exists() {
            return LazyOutcome::Whole("this node has no /dev/fuse".into());
        }
        let dir = self.dir(req.chain);
        if dir.exists() {
            if spec::alive(&dir) {
                return LazyOutcome::Mounted;
            }
            forget(&dir);
        }
        let made = crishim_sys::hostfs::create_private_dir(&dir).and_then(|()| {
            let json = serde_json::to_vec(&self.spec(&req))?;
            crishim_sys::hostfs::write_private(&dir.join(spec::SPEC), &json)
        });
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&dir);
            return LazyOutcome::Whole(format!("preparing {}: {e}", dir.display()));
        }
        let (server, d) = (self.server.clone(), dir.clone());
        let wait = self.limits.pull_progress_timeout;
        let started = tokio::task::spawn_blocking(move || start(&server, &d, wait))
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
        match started {
            Ok(Started::Mounted) => {
                info!(layer = %req.layer.digest(), "lazy layer mounted");
                LazyOutcome::Mounted
            }
            Ok(Started::Whole(why)) => {
                let _ = std::fs::remove_dir_all(&dir);
                if why.starts_with("range-ignored") {
                    if !self.range_warned.swap(true, Ordering::Relaxed) {
                        warn!(image = %req.image, "the registry does not honour Range: lazy layers are pulled whole");
                    }
                } else {
                    info!(layer = %req.layer.digest(), reason = %why, "pulling a lazy layer whole");
                }
                LazyOutcome::Whole(why)
            }
            Err(why) => {
                forget(&dir);
                let _ = std::fs::remove_dir_all(&dir);
                warn!(layer = %req.layer.digest(), reason = %why, "lazy layer server failed: pulling the layer whole");
                LazyOutcome::Whole(why)
            }
        }
    }
}

enum Started {
    Mounted,
    Whole(String),
}

/// Run the server for the layer at `dir` and wait (at most `wait`) for its report.
fn start(server: &Path, dir: &Path, wait: Duration) -> Result<Started, String> {
    use std::io::Read;
    let mut child = std::process::Command::new(server)
        .arg("--dir")
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", server.display()))?;
    let deadline = std::time::Instant::now() + wait;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no report from the server within {wait:?}"));
            }
        }
    }
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.by_ref().take(64 << 10).read_to_string(&mut out);
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.by_ref().take(64 << 10).read_to_string(&mut err);
    }
    let out = out.trim();
    if out == "ok" {
        Ok(Started::Mounted)
    } else if let Some(why) = out.strip_prefix("whole ") {
        Ok(Started::Whole(why.to_string()))
    } else {
        Err(format!("{} {}", out, err.trim()).trim().to_string())
    }
}

/// Detach the layer's mount: the kernel ends its server once no overlay holds the mount.
fn forget(dir: &Path) {
    let mnt = dir.join(spec::MNT);
    if crishim_sys::mountinfo::is_mountpoint(&mnt) {
        if let Err(e) = nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH) {
            warn!(mount = %mnt.display(), error = %e, "detaching a lazy layer's mount");
        }
    }
}

impl LazyLayers for Snapshotter {
    fn mount<'a>(&'a self, req: LazyRequest<'a>) -> LazyFuture<'a> {
        Box::pin(self.mount_layer(req))
    }

    fn lower(&self, chain: &Digest) -> Result<Option<PathBuf>, String> {
        let dir = self.dir(chain);
        if !dir.is_dir() {
            return Ok(None);
        }
        if let Some(LazyStatus {
            state: LazyState::Quarantined,
            reason,
            ..
        }) = spec::read_status(&dir)
        {
            return Err(format!(
                "quarantined: {}",
                reason.unwrap_or_else(|| "its blob failed its digest".into())
            ));
        }
        if !spec::alive(&dir) {
            return Err(
                "its lazy layer's server is gone; remove the image and pull it again".into(),
            );
        }
        Ok(Some(dir.join(spec::MNT)))
    }

    fn collect(&self, live: &HashSet<&str>, held: &HashSet<&str>) {
        for (hex, dir) in self.layer_dirs() {
            let local = self.store_root.join("snapshots").join(&hex).is_dir();
            // Kept while an image or container names it, unless it is local and no container
            // reads through its mount.
            let needed = !local || held.contains(hex.as_str());
            if live.contains(hex.as_str()) && needed {
                continue;
            }
            forget(&dir);
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                warn!(dir = %dir.display(), error = %e, "removing a lazy layer");
            } else {
                info!(layer = %hex, "lazy layer let go");
            }
        }
    }

    fn all(&self) -> Vec<(String, LazyStatus)> {
        self.layer_dirs()
            .into_iter()
            .filter_map(|(hex, dir)| spec::read_status(&dir).map(|s| (hex, s)))
            .collect()
    }

    fn status(&self, chain: &Digest) -> Option<LazyStatus> {
        let dir = self.dir(chain);
        if !dir.is_dir() {
            return None;
        }
        spec::read_status(&dir)
    }
}
