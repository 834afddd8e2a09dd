//! The host side: the CNI config both runtimes share, pod cgroups, the processes a runtime owns,
//! their PSS, and a [`Sweeper`] that removes whatever a run left, even after a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crishim_tests::pods::{cgroup_roots, host_processes, mounts, with_descendants, HostProcess};
use sha2::Digest as _;

/// Load average (1, 5, 15 minutes).
pub fn loadavg() -> [f64; 3] {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut f = s.split_whitespace().map(|v| v.parse().unwrap_or(f64::NAN));
    [(); 3].map(|_| f.next().unwrap_or(f64::NAN))
}

/// The node's busy CPU time so far (all CPUs, idle and I/O wait left out), in clock ticks, from
/// `/proc/stat`; None where it cannot be read.
pub fn busy_ticks() -> Option<u64> {
    parse_busy_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The `cpu` line's user, nice, system, irq, softirq and steal (guest time is inside user).
fn parse_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    Some([0, 1, 2, 5, 6, 7].iter().map(|&i| at(i)).sum())
}

/// Milliseconds per `/proc/stat` clock tick.
pub fn ms_per_tick() -> f64 {
    // SAFETY: plain libc call.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1000.0 / if hz > 0 { hz as f64 } else { 100.0 }
}

pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `Pss:` of `/proc/PID/smaps_rollup`, in KiB (None when the process is gone).
pub fn pss_kib(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Live processes that belong to a runtime: those whose command line names one of `dirs` (the
/// daemon, its shims), those in a cgroup under `cgroup_top`, and all their descendants.
pub fn owned_processes(dirs: &[PathBuf], cgroup_top: &str) -> Vec<HostProcess> {
    let me = std::process::id() as i32;
    let procs = host_processes();
    let needles: Vec<String> = dirs
        .iter()
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    let cg = format!("/{cgroup_top}/");
    let roots: Vec<i32> = procs
        .iter()
        .filter(|p| p.pid != me && !p.is_zombie())
        .filter(|p| {
            let cmd = p.command();
            needles.iter().any(|n| cmd.contains(n.as_str())) || p.cgroups().contains(&cg)
        })
        .map(|p| p.pid)
        .collect();
    with_descendants(&procs, &roots)
        .into_iter()
        .filter(|p| p.pid != me && !p.is_zombie())
        .collect()
}

/// `mkdir -p` a pod's cgroup in every controller hierarchy, as the kubelet's cgroupfs driver
/// does before RunPodSandbox.
pub fn create_pod_cgroup(path: &str) -> Result<()> {
    crishim_tests::pods::create_cgroup_dirs(path)
        .with_context(|| format!("creating cgroup {path}"))?;
    Ok(())
}

/// Remove the cgroup tree `/<top>` in every hierarchy, deepest first. Directories still holding
/// a process are left (and named in the result).
pub fn remove_cgroup_tree(top: &str) -> Vec<String> {
    let mut failed = Vec::new();
    for root in cgroup_roots() {
        let base = root.join(top);
        if !base.is_dir() {
            continue;
        }
        let mut dirs: Vec<PathBuf> = crishim_tests::fsutil::walk(&base)
            .into_iter()
            .filter(|p| p.is_dir())
            .collect();
        dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        dirs.push(base);
        for d in dirs {
            // A cgroup whose last process just died may stay busy for a moment.
            let deadline = Instant::now() + Duration::from_secs(2);
            while std::fs::remove_dir(&d).is_err() && d.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if d.exists() {
                failed.push(d.display().to_string());
            }
        }
    }
    failed
}

/// The conflist both runtimes read: bridge + host-local + portmap, as in the integration tests.
pub fn write_cni_conf(dir: &Path, bridge: &str, subnet: &str, ipam_dir: &Path) -> Result<()> {
    let list = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "crishim-bench",
        "plugins": [
            {
                "type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": ipam_dir}
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("10-bench.conflist"),
        serde_json::to_vec_pretty(&list)?,
    )
    .with_context(|| format!("writing the CNI config in {}", dir.display()))
}

pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Where containerd 1.6's runc v2 shim puts its socket: `/run/containerd/s/<sha256(address/ns/id)>`.
/// (The directory is fixed at build time, outside any root we could give it.)
pub fn containerd_shim_socket(address: &str, namespace: &str, id: &str) -> PathBuf {
    let key = Path::new(address).join(namespace).join(id);
    let sum = sha2::Sha256::digest(key.as_os_str().as_encoded_bytes());
    Path::new("/run/containerd/s").join(hex::encode(sum))
}

/// Force-removes what a runtime run left on the host when dropped: kills its processes (by the
/// directories their command lines name and by cgroup), unmounts everything under its
/// directories, removes its pod cgroups, its CNI bridge, and the containerd shim sockets of the
/// shims it killed. A clean run leaves nothing, and then this does nothing.
pub struct Sweeper {
    pub dirs: Vec<PathBuf>,
    pub cgroup_top: String,
    pub bridge: String,
    /// containerd's gRPC address, to find the sockets of its shims.
    pub containerd_address: Option<String>,
    /// Directories made outside our own (`/run/containerd/s`), removed last if empty.
    pub empty_dirs: Vec<PathBuf>,
}

/// A tmpfs mounted on a runtime's state directory, as `/run` is on a node; unmounted on drop.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path) -> Result<Tmpfs> {
        std::fs::create_dir_all(dir)?;
        crishim_tests::daemon::mount_state_tmpfs(dir)?;
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

impl Sweeper {
    pub fn sweep(&self) -> Vec<String> {
        let mut did = Vec::new();
        let victims = owned_processes(&self.dirs, &self.cgroup_top);
        let mut sockets = Vec::new();
        for p in &victims {
            if let (Some(addr), Some(id)) = (&self.containerd_address, arg_after(p, "-id")) {
                sockets.push(containerd_shim_socket(
                    addr,
                    crate::containerd::NAMESPACE,
                    &id,
                ));
            }
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            did.push(format!("killed {} ({})", p.pid, p.command()));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while victims.iter().any(HostProcess::is_alive) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for s in sockets {
            if std::fs::remove_file(&s).is_ok() {
                did.push(format!("removed {}", s.display()));
            }
        }
        // Nested mounts (a rootfs inside a state dir): deepest first, a few passes.
        for _ in 0..5 {
            let mut left: Vec<String> = mounts()
                .into_iter()
                .map(|m| m.mount_point)
                .filter(|mp| self.dirs.iter().any(|d| Path::new(mp).starts_with(d)))
                .collect();
            if left.is_empty() {
                break;
            }
            left.sort_by_key(|m| std::cmp::Reverse(m.len()));
            for mp in left {
                match nix::mount::umount2(mp.as_str(), nix::mount::MntFlags::MNT_DETACH) {
                    Ok(()) => did.push(format!("unmounted {mp}")),
                    Err(e) => did.push(format!("unmounting {mp}: {e}")),
                }
            }
        }
        for d in remove_cgroup_tree(&self.cgroup_top) {
            did.push(format!("could not remove cgroup {d}"));
        }
        if link_exists(&self.bridge) {
            let ok = Command::new("ip")
                .args(["link", "del", &self.bridge])
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                did.push(format!("could not delete bridge {}", self.bridge));
            }
        }
        for d in &self.empty_dirs {
            let _ = std::fs::remove_dir(d);
        }
        did
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        let did = self.sweep();
        if !did.is_empty() {
            eprintln!("cleanup:\n  {}", did.join("\n  "));
        }
    }
}

/// The argument after `flag` in a process's command line.
fn arg_after(p: &HostProcess, flag: &str) -> Option<String> {
    let i = p.cmdline.iter().position(|a| a == flag)?;
    p.cmdline.get(i + 1).cloned()
}

#[cfg(test)]
mod tests {
    use super::parse_busy_ticks;

    #[test]
    fn busy_ticks_leave_out_idle_iowait_and_guest() {
        let stat = "cpu  100 2 30 5000 40 3 4 5 77 0\ncpu0 1 1 1 1 1 1 1 1 0 0\nintr 1\n";
        assert_eq!(parse_busy_ticks(stat), Some(100 + 2 + 30 + 3 + 4 + 5));
    }

    #[test]
    fn a_stat_without_a_cpu_line_or_with_garbage_reads_as_none() {
        assert_eq!(parse_busy_ticks("intr 1\n"), None);
        assert_eq!(parse_busy_ticks("cpu  1 x 3\n"), None);
    }
}
