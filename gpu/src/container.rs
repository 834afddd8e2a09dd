//! A GPU container's host directory, `<state_dir>/gpu/containers/<id>/`, removed with the
//! container:
//!
//! ```text
//! grant.json       what it holds (read by `crishim gpu list`)
//! config.json      the interceptor's config       → /etc/crishim/vgpu/config.json (ro)
//! shared/usage     the accounting file            → /etc/crishim/vgpu/shared (rw)
//! ld.so.preload    preload mode only              → /etc/ld.so.preload (ro)
//! ```
//!
//! `shared/` is the container's to write, and lives on the host (the state directory, the
//! node's `/run`): it is a tmpfs of its own, of [`ACCOUNTING_TMPFS`], so a container filling it
//! fills that, not the node's `/run`. Whatever the container leaves there is read back (by
//! `/metrics` and `crishim gpu list`) only through the bounded reader, beneath the container's
//! directory and through no symlink, and off the async workers, under a deadline.

use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::GpuError;
use super::libraries::Capability;

/// Where the files appear in the container.
pub const VGPU_DIR: &str = "/etc/crishim/vgpu";
pub const SHARED_DIR: &str = "/etc/crishim/vgpu/shared";
pub const ACCOUNTING_FILE: &str = "/etc/crishim/vgpu/shared/usage";
pub const PRELOAD_PATH: &str = "/etc/ld.so.preload";

/// What a container holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub container_id: String,
    pub container_name: String,
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    /// The granted GPUs' UUIDs (none for `NVIDIA_VISIBLE_DEVICES=none`).
    pub uuids: Vec<String>,
    pub memory_limit_bytes: Option<u64>,
    pub core_percent: Option<u32>,
    pub capabilities: Vec<Capability>,
    /// The driver mirror view it mounts (kept while any container uses it).
    #[serde(default)]
    pub driver_view: Option<PathBuf>,
}

/// The interceptor's config, as it reads it.
pub use crishim_proto::vgpu::{Config as VgpuConfig, CONFIG_PATH, VERSION as VGPU_CONFIG_VERSION};

/// A container's directory.
pub struct ContainerDir {
    pub path: PathBuf,
}

impl ContainerDir {
    /// Root's alone (0700, parents too): what a container needs of it is bind-mounted.
    pub fn create(path: PathBuf) -> Result<ContainerDir, GpuError> {
        crishim_sys::hostfs::create_private_dir(&path)
            .map_err(|e| GpuError::io(format!("creating {}", path.display()), e))?;
        Ok(ContainerDir { path })
    }

    pub fn write_grant(&self, g: &Grant) -> Result<(), GpuError> {
        self.write_json("grant.json", g)
    }

    pub fn write_config(&self, c: &VgpuConfig) -> Result<PathBuf, GpuError> {
        self.write_json("config.json", c)?;
        Ok(self.path.join("config.json"))
    }

    /// The accounting directory, a bounded tmpfs of its own ([`ACCOUNTING_TMPFS`]), with an
    /// empty `usage` every container user may write: the container's processes may run as any
    /// uid.
    pub fn create_accounting(&self) -> Result<PathBuf, GpuError> {
        let dir = self.path.join("shared");
        let file = dir.join("usage");
        let step = |what: &str, r: io::Result<()>| {
            r.map_err(|e| GpuError::io(format!("{what} {}", file.display()), e))
        };
        step("creating", std::fs::create_dir_all(&dir))?;
        if !crishim_sys::mountinfo::is_mountpoint(&dir) {
            use nix::mount::MsFlags;
            nix::mount::mount(
                Some("crishim-vgpu"),
                &dir,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some(ACCOUNTING_TMPFS),
            )
            .map_err(|e| {
                GpuError::io(
                    format!("mounting the accounting tmpfs at {}", dir.display()),
                    e.into(),
                )
            })?;
        }
        step(
            "creating",
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&file)
                .map(drop),
        )?;
        step(
            "chmod",
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)),
        )?;
        Ok(dir)
    }

    /// `/etc/ld.so.preload` naming `interceptor` first, then what the image's own file names.
    pub fn write_preload(
        &self,
        interceptor: &str,
        image_preload: Option<&str>,
    ) -> Result<PathBuf, GpuError> {
        let mut text = format!("{interceptor}\n");
        if let Some(own) = image_preload {
            for line in own.lines().map(str::trim).filter(|l| !l.is_empty()) {
                if line != interceptor {
                    text.push_str(line);
                    text.push('\n');
                }
            }
        }
        let path = self.path.join("ld.so.preload");
        std::fs::write(&path, text)
            .map_err(|e| GpuError::io(format!("writing {}", path.display()), e))?;
        Ok(path)
    }

    fn write_json(&self, name: &str, value: &impl Serialize) -> Result<(), GpuError> {
        let path = self.path.join(name);
        let json =
            serde_json::to_vec_pretty(value).map_err(|e| GpuError::Internal(e.to_string()))?;
        crishim_sys::record::write_atomic(&path, &json)
            .map_err(|e| GpuError::io(format!("writing {}", path.display()), e))?;
        // Readable by the container's users whatever their uid.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| GpuError::io(format!("chmod {}", path.display()), e))
    }
}

/// The accounting tmpfs: room for [`MAX_LEDGER_RECORDS`] records (1 MiB) and a few files.
pub const ACCOUNTING_TMPFS: &str = "mode=0755,size=1m,nr_inodes=16";

/// Detach a container directory's accounting tmpfs, if it has one (before the directory is
/// removed). A directory that is gone, or not a mount, is not an error.
pub fn release_accounting(container_dir: &Path) -> io::Result<()> {
    let shared = container_dir.join("shared");
    if crishim_sys::mountinfo::is_mountpoint(&shared) {
        nix::mount::umount2(&shared, nix::mount::MntFlags::MNT_DETACH).map_err(io::Error::from)?;
    }
    Ok(())
}

/// Every grant under `containers_dir` (skipping unreadable ones).
pub fn grants(containers_dir: &Path) -> Vec<Grant> {
    let Ok(entries) = std::fs::read_dir(containers_dir) else {
        return Vec::new();
    };
    let mut out: Vec<Grant> = entries
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("grant.json")).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect();
    out.sort_by(|a, b| a.container_id.cmp(&b.container_id));
    out
}

/// Records read from a container's accounting file, which its processes may write: far more
/// than (processes × GPUs) of any real container.
const MAX_LEDGER_RECORDS: u64 = 16384;

/// One GPU container with a memory or core limit: its memory limit over all its GPUs, what its
/// processes hold, and how long the core limiter has held their launches back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuUsage {
    pub container_id: String,
    pub limit_bytes: Option<u64>,
    pub used_bytes: u64,
    pub throttled_us: u64,
    /// The core limit, percent of one GPU.
    pub core_percent: Option<u32>,
    /// GPU time the container's kernels took, ns.
    pub gpu_ns: u64,
    /// The share of one GPU its kernels took in the last whole second, permille; `None` when no
    /// process wrote one in the last few seconds.
    pub share_permille: Option<u32>,
}

/// What one accounting file says.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct LedgerSums {
    used_bytes: u64,
    throttled_us: u64,
    gpu_ns: u64,
    share_permille: Option<u32>,
}

/// A process's last-second share counts this many seconds after that second.
const FRESH_SECONDS: u64 = 3;

/// The usage of every container with a GPU memory or core limit, from its grant and its
/// accounting file (`shared/usage`). The file is the container's to write, so one over
/// [`MAX_LEDGER_RECORDS`] records, or not a regular file, counts for nothing, and so does a
/// record failing its checksum. Memory
/// counts only in records of live processes: a killed process's record stays until the
/// interceptor in another of the container's processes reclaims it. Throttled time counts in
/// every process record, live or not: the interceptor moves a dead process's time to the
/// container's totals record in the same write that frees the process's record.
///
/// This reads files a container writes, so callers on an async runtime, or that must answer
/// in time, use [`usage_within`].
pub fn usage(containers_dir: &Path) -> Vec<GpuUsage> {
    let limited: Vec<Grant> = grants(containers_dir)
        .into_iter()
        .filter(|g| g.memory_limit_bytes.is_some() || g.core_percent.is_some())
        .collect();
    if limited.is_empty() {
        return Vec::new();
    }
    let live = live_processes(Path::new("/proc"));
    limited
        .into_iter()
        .map(|g| {
            let gpus = g.uuids.len().max(1) as u64;
            let dir = containers_dir.join(&g.container_id);
            let sums = match read_ledger(&dir, &live, now_second()) {
                Ok(u) => u,
                Err(e) => {
                    if !e.is_missing() {
                        tracing::debug!(container = %g.container_id, error = %e, "the GPU accounting file is not read");
                    }
                    LedgerSums::default()
                }
            };
            GpuUsage {
                used_bytes: sums.used_bytes,
                throttled_us: sums.throttled_us,
                gpu_ns: sums.gpu_ns,
                share_permille: sums.share_permille,
                core_percent: g.core_percent,
                limit_bytes: g.memory_limit_bytes.map(|l| l.saturating_mul(gpus)),
                container_id: g.container_id,
            }
        })
        .collect()
}

/// Every process as the accounting file names them: (pid in its own pid namespace, the last of
/// `NSpid`; start time, field 22 of `stat`, which no namespace changes).
fn live_processes(proc_root: &Path) -> std::collections::HashSet<(u32, u64)> {
    let mut live = std::collections::HashSet::new();
    for entry in std::fs::read_dir(proc_root).into_iter().flatten().flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let dir = entry.path();
        let (Ok(stat), Ok(status)) = (
            std::fs::read_to_string(dir.join("stat")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue;
        };
        // Fields after the command, which may hold spaces: state is field 3, start time 22.
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        let start = fields.get(19).and_then(|s| s.parse::<u64>().ok());
        let pid = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|p| p.parse::<u32>().ok());
        if let (Some(pid), Some(start)) = (pid, start) {
            live.insert((pid, start));
        }
    }
    live
}

/// What `/metrics` and `crishim gpu list` give [`usage_within`].
pub const USAGE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// [`usage`] on a thread of its own, given at most `deadline`: `None` if it took longer, or if
/// the read an earlier call started has not finished yet (so a file that hangs its reader holds
/// one thread, never one per call). The files are refused unless regular and small, which a
/// FIFO or a device is not; the deadline is there should a read block all the same.
pub fn usage_within(containers_dir: &Path, deadline: std::time::Duration) -> Option<Vec<GpuUsage>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static IN_FLIGHT: AtomicBool = AtomicBool::new(false);
    if IN_FLIGHT.swap(true, Ordering::AcqRel) {
        return None;
    }
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            IN_FLIGHT.store(false, Ordering::Release);
        }
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let dir = containers_dir.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("gpu-usage".into())
        .spawn(move || {
            let _done = Done;
            let _ = tx.send(usage(&dir));
        });
    if spawned.is_err() {
        IN_FLIGHT.store(false, Ordering::Release);
        return None;
    }
    rx.recv_timeout(deadline).ok()
}

fn now_second() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// From a container directory's accounting file (`shared/usage`, read beneath the directory
/// through no symlink, a regular file of at most [`MAX_LEDGER_RECORDS`] records): the bytes the
/// memory records of live processes hold; the throttled and GPU time of every process record;
/// and the last-second shares of live processes written within [`FRESH_SECONDS`] of `now`
/// (seconds since the epoch), at most one GPU's worth per process. Each sum saturates: the
/// records are the container's to write.
fn read_ledger(
    container_dir: &Path,
    live: &std::collections::HashSet<(u32, u64)>,
    now: u64,
) -> Result<LedgerSums, crishim_sys::confined::ReadError> {
    use crishim_proto::vgpu::ledger::{fresh_share, Entry, PROCESS, RECORD};
    use crishim_sys::confined::{self, Limits};
    let raw = confined::read(
        container_dir,
        "shared/usage",
        Limits::beneath_no_symlinks(MAX_LEDGER_RECORDS * RECORD as u64),
    )?;
    Ok(raw
        .chunks(RECORD)
        .filter_map(Entry::decode)
        .fold(LedgerSums::default(), |mut s, e| {
            let alive = live.contains(&(e.pid, e.start));
            if e.uuid != PROCESS {
                if alive {
                    s.used_bytes = s.used_bytes.saturating_add(e.used);
                }
                return s;
            }
            s.throttled_us = s.throttled_us.saturating_add(e.throttled_us);
            s.gpu_ns = s.gpu_ns.saturating_add(e.used);
            if let Some(p) = fresh_share(e.window, now, FRESH_SECONDS).filter(|_| alive) {
                s.share_permille = Some(s.share_permille.unwrap_or(0).saturating_add(p.min(1000)));
            }
            s
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    // No GPU here: the accounting file is written as the interceptor writes it.
    #[test]
    fn usage_sums_valid_records_within_the_cap() {
        use crishim_proto::vgpu::ledger::{Entry, PROCESS};
        // The accounting directory is a tmpfs of its own: mounting it takes root.
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        struct Unmount(Vec<PathBuf>);
        impl Drop for Unmount {
            fn drop(&mut self) {
                for d in &self.0 {
                    release_accounting(d).unwrap();
                }
            }
        }
        let _unmount = Unmount(
            ["limited", "unlimited", "cores"]
                .iter()
                .map(|id| dir.path().join(id))
                .collect(),
        );
        let grant = |id: &str, limit: Option<u64>, gpus: usize, cores: Option<u32>| {
            let d = ContainerDir::create(dir.path().join(id)).unwrap();
            d.write_grant(&Grant {
                container_id: id.into(),
                container_name: "c".into(),
                pod_name: "p".into(),
                pod_namespace: "n".into(),
                pod_uid: "u".into(),
                uuids: (0..gpus).map(|i| format!("GPU-{i}")).collect(),
                memory_limit_bytes: limit,
                core_percent: cores,
                capabilities: vec![],
                driver_view: None,
            })
            .unwrap();
            d.create_accounting().unwrap()
        };
        let shared = grant("limited", Some(1 << 30), 2, None);
        grant("unlimited", None, 1, None);
        grant("cores", None, 1, Some(30));
        // Records of this test process (alive), and of one that is gone.
        let me = std::process::id();
        let start = crishim_proto::shim::pid_file::start_time(me as i32).unwrap();
        let entry = |used| Entry {
            pid: me,
            start,
            uuid: [1; 16],
            used,
            host_pid: 0,
            window: 0,
            throttled_us: 0,
        };
        let dead = Entry {
            pid: me,
            start: start + 1,
            uuid: [1; 16],
            used: 1 << 20,
            host_pid: 0,
            window: 0,
            throttled_us: 0,
        };
        // Throttled and GPU time count from process records, live, dead or the totals; the last
        // second's share from live ones, and fresh.
        let now = now_second();
        let process = |pid, start, throttled_us, gpu_ns, window| Entry {
            pid,
            start,
            uuid: PROCESS,
            used: gpu_ns,
            host_pid: 77,
            window,
            throttled_us,
        };
        use crishim_proto::vgpu::ledger::window;
        let mut file = Vec::new();
        file.extend(dead.encode());
        file.extend(process(me, start, 1000, 5_000_000, window(now - 1, 300)).encode());
        file.extend(process(me, start + 1, 20, 7, window(now - 1, 500)).encode());
        file.extend(process(0, 0, 3, 11, 0).encode());
        file.extend(entry(100).encode());
        let mut torn = entry(1 << 40).encode();
        torn[40] ^= 1;
        file.extend(torn);
        file.extend([0u8; 64]);
        file.extend(entry(23).encode());
        std::fs::write(shared.join("usage"), &file).unwrap();
        assert_eq!(
            usage(dir.path()),
            [
                GpuUsage {
                    container_id: "cores".into(),
                    limit_bytes: None,
                    used_bytes: 0,
                    throttled_us: 0,
                    core_percent: Some(30),
                    gpu_ns: 0,
                    share_permille: None,
                },
                GpuUsage {
                    container_id: "limited".into(),
                    limit_bytes: Some(2 << 30),
                    used_bytes: 123,
                    throttled_us: 1023,
                    core_percent: None,
                    gpu_ns: 5_000_018,
                    share_permille: Some(300),
                }
            ]
        );
        // The container cannot grow the file (or fill the directory) past the tmpfs, whose size
        // is the cap.
        assert!(crishim_sys::mountinfo::is_mountpoint(&shared));
        let mut big = vec![0u8; (MAX_LEDGER_RECORDS as usize) * 64];
        big.extend(entry(5).encode());
        let e = std::fs::write(shared.join("usage"), &big).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        // A FIFO, a symlink to a host file of valid records, a directory: none is read, and
        // nothing blocks.
        let host = dir.path().join("host-ledger");
        std::fs::write(&host, &file).unwrap();
        let usage_file = shared.join("usage");
        std::fs::remove_file(&usage_file).unwrap();
        nix::unistd::mkfifo(&usage_file, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let t = std::time::Instant::now();
        assert_eq!(usage(dir.path())[1].used_bytes, 0);
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        std::fs::remove_file(&usage_file).unwrap();
        std::os::unix::fs::symlink(&host, &usage_file).unwrap();
        assert_eq!(usage(dir.path())[1].used_bytes, 0);
        std::fs::remove_file(&usage_file).unwrap();
        std::fs::write(&usage_file, &file).unwrap();
        assert_eq!(
            usage_within(dir.path(), std::time::Duration::from_secs(2)).unwrap()[1].used_bytes,
            123
        );
    }

    #[test]
    fn preload_names_the_interceptor_first_and_keeps_the_images_entries() {
        let dir = tempfile::tempdir().unwrap();
        let d = ContainerDir::create(dir.path().join("c")).unwrap();
        let p = d
            .write_preload(
                "/etc/crishim/vgpu/libcrishim_vgpu.so",
                Some("/lib/libmine.so\n\n"),
            )
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(p).unwrap(),
            "/etc/crishim/vgpu/libcrishim_vgpu.so\n/lib/libmine.so\n"
        );
    }

    #[test]
    fn grants_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let g = Grant {
            container_id: "c1".into(),
            container_name: "n".into(),
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            pod_uid: "u".into(),
            uuids: vec!["GPU-1".into()],
            memory_limit_bytes: Some(1),
            core_percent: None,
            capabilities: vec![Capability::Compute],
            driver_view: None,
        };
        ContainerDir::create(dir.path().join("c1"))
            .unwrap()
            .write_grant(&g)
            .unwrap();
        std::fs::create_dir_all(dir.path().join("broken")).unwrap();
        assert_eq!(grants(dir.path()), vec![g]);
        // The accounting directory is a tmpfs of its own: mounting it takes root.
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let usage = ContainerDir::create(dir.path().join("c1"))
            .unwrap()
            .create_accounting()
            .unwrap()
            .join("usage");
        let mode = std::fs::metadata(&usage).unwrap().permissions().mode() & 0o777;
        release_accounting(&dir.path().join("c1")).unwrap();
        assert_eq!(mode, 0o666);
    }
}
