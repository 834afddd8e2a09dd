//! Resource usage as the kernel counts it, for the CRI stats RPCs: cgroup counters (v1 and v2),
//! a network namespace's `/proc/<pid>/net/dev`, and the disk use of a directory tree.
//!
//! Every reader takes its root (the cgroup mount, a file, a directory), so tests point them at a
//! fake tree. Nothing is estimated: a counter that cannot be read is `None` (or an error), never 0.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

/// Where the cgroup hierarchies are mounted on a host.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// v1's "no limit" is `PAGE_COUNTER_MAX` pages (0x7FFFFFFFFFFFF000 with 4 KiB pages); anything
/// this large is no limit whatever the page size.
const V1_UNLIMITED: u64 = 1 << 62;

/// The cgroup hierarchies under one root: v2 (unified, `cgroup.controllers` at the root) or v1
/// (one directory per controller, `<root>/<controller>/<path>`; a hybrid host's
/// `<root>/unified` is not used).
#[derive(Debug, Clone)]
pub struct Cgroups {
    root: PathBuf,
    v2: bool,
}

/// One line of a pressure file (`some` or `full`): the stall averages (percent) and the total
/// stalled time (µs).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pressure {
    pub total: u64,
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
}

/// A resource's pressure stall information (cgroup v2 `<resource>.pressure`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Psi {
    pub some: Option<Pressure>,
    pub full: Option<Pressure>,
}

/// The pressure of the three resources PSI reports.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pressures {
    pub cpu: Option<Psi>,
    pub memory: Option<Psi>,
    pub io: Option<Psi>,
}

/// Swap in use and the room left (`None`: no limit to measure against).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swap {
    pub usage: u64,
    pub available: Option<u64>,
}

/// The limits a cgroup enforces, in the CRI's units (0: none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    pub cpu_period: i64,
    pub cpu_quota: i64,
    pub cpu_shares: i64,
    pub memory_limit: i64,
    pub cpuset_cpus: String,
    pub cpuset_mems: String,
}

/// A cgroup's memory counters, as the kubelet wants them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// v1 `memory.usage_in_bytes`, v2 `memory.current`.
    pub usage: u64,
    /// `usage` less the inactive file cache (v1 `total_inactive_file`, v2 `inactive_file`), not
    /// below 0.
    pub working_set: Option<u64>,
    /// v1 `total_rss`, v2 `anon`.
    pub rss: Option<u64>,
    /// v1 `total_pgfault`, v2 `pgfault`.
    pub page_faults: Option<u64>,
    /// v1 `total_pgmajfault`, v2 `pgmajfault`.
    pub major_page_faults: Option<u64>,
    /// v1 `memory.limit_in_bytes`, v2 `memory.max`; `None` when unlimited.
    pub limit: Option<u64>,
}

impl Memory {
    /// What is left below the limit (limit − working set, not below 0), when there is a limit.
    pub fn available(&self) -> Option<u64> {
        let used = self.working_set.unwrap_or(self.usage);
        self.limit.map(|l| l.saturating_sub(used))
    }

    /// Field-wise sum; a field is known in the sum only when it is known in both.
    pub fn add(&self, o: &Memory) -> Memory {
        let add = |a: Option<u64>, b: Option<u64>| Some(a?.saturating_add(b?));
        Memory {
            usage: self.usage.saturating_add(o.usage),
            working_set: add(self.working_set, o.working_set),
            rss: add(self.rss, o.rss),
            page_faults: add(self.page_faults, o.page_faults),
            major_page_faults: add(self.major_page_faults, o.major_page_faults),
            limit: None,
        }
    }
}

impl Cgroups {
    /// The host's hierarchies at [`CGROUP_ROOT`].
    pub fn host() -> Self {
        Self::at(CGROUP_ROOT)
    }

    /// The hierarchies mounted at `root`: v2 when `root/cgroup.controllers` exists, else v1.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let v2 = root.join("cgroup.controllers").exists();
        Cgroups { root, v2 }
    }

    pub fn is_v2(&self) -> bool {
        self.v2
    }

    /// The directory of cgroup `path` (cgroupfs style `/a/b`, a slice, or the systemd form; see
    /// `crishim_proto::cgroups_path`) in the hierarchy holding
    /// `controller` (v1), or in the unified one (v2). `None` for a path that climbs (`..`).
    pub fn dir(&self, controller: &str, path: &str) -> Option<PathBuf> {
        let path = crishim_proto::cgroups_path::dir(path)?;
        let rel = Path::new(path.trim_start_matches('/'));
        if rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return None;
        }
        Some(if self.v2 {
            self.root.join(rel)
        } else {
            self.root.join(controller).join(rel)
        })
    }

    fn file(&self, controller: &str, path: &str, file: &str) -> io::Result<PathBuf> {
        self.dir(controller, path)
            .map(|d| d.join(file))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "cgroup path climbs"))
    }

    /// Write one control file (the daemon does so only for pod cgroups it made).
    pub fn write(&self, controller: &str, path: &str, file: &str, value: &str) -> io::Result<()> {
        std::fs::write(self.file(controller, path, file)?, value)
    }

    fn read(&self, controller: &str, path: &str, file: &str) -> io::Result<String> {
        std::fs::read_to_string(self.file(controller, path, file)?)
    }

    /// Whether the cgroup exists (v1: in the memory or the cpuacct hierarchy).
    pub fn exists(&self, path: &str) -> bool {
        ["memory", "cpuacct"]
            .iter()
            .any(|c| self.dir(c, path).is_some_and(|d| d.is_dir()))
    }

    /// Cumulative CPU time in nanoseconds: v1 `cpuacct.usage`, v2 `cpu.stat` `usage_usec` × 1000.
    pub fn cpu_usage_ns(&self, path: &str) -> io::Result<u64> {
        if self.v2 {
            let stat = self.read("cpu", path, "cpu.stat")?;
            let usec = flat_keyed(&stat)
                .get("usage_usec")
                .copied()
                .ok_or_else(|| invalid("cpu.stat has no usage_usec"))?;
            Ok(usec.saturating_mul(1000))
        } else {
            parse_u64(&self.read("cpuacct", path, "cpuacct.usage")?)
        }
    }

    /// The CPU and memory limits in force, read back from the control files (0: no limit, as in
    /// the CRI), for `ContainerStatus.resources`.
    pub fn limits(&self, path: &str) -> io::Result<Limits> {
        let text = |c: &str, f: &str| self.read(c, path, f).map(|s| s.trim().to_string());
        let number = |c: &str, f: &str| -> io::Result<i64> {
            let s = text(c, f)?;
            s.parse::<i64>()
                .map_err(|_| invalid(&format!("{f} holds {:?}", crishim_sys::shown::shown(&s))))
        };
        // cpuset is optional (not every v2 tree delegates it).
        let optional = |c: &str, f: &str| text(c, f).unwrap_or_default();
        let mut l = Limits {
            cpuset_cpus: optional("cpuset", "cpuset.cpus"),
            cpuset_mems: optional("cpuset", "cpuset.mems"),
            ..Limits::default()
        };
        if self.v2 {
            let max = text("cpu", "cpu.max")?;
            let mut parts = max.split_whitespace();
            let quota = parts.next().unwrap_or("max");
            l.cpu_period = parts.next().and_then(|p| p.parse().ok()).unwrap_or(100_000);
            l.cpu_quota = quota.parse().unwrap_or(0);
            let weight = number("cpu", "cpu.weight")?.clamp(1, 10_000);
            l.cpu_shares = 2 + ((weight - 1) * 262_142) / 9_999;
            let memory = text("memory", "memory.max")?;
            l.memory_limit = memory.parse().unwrap_or(0);
        } else {
            l.cpu_period = number("cpu", "cpu.cfs_period_us")?;
            l.cpu_quota = number("cpu", "cpu.cfs_quota_us")?.max(0);
            l.cpu_shares = number("cpu", "cpu.shares")?;
            let memory = number("memory", "memory.limit_in_bytes")?;
            l.memory_limit = if memory as u64 >= V1_UNLIMITED {
                0
            } else {
                memory
            };
        }
        Ok(l)
    }

    /// Pressure stall information of `resource` (`cpu`, `memory`, `io`): cgroup v2 only, and only
    /// where the kernel has PSI (`None` otherwise).
    pub fn psi(&self, path: &str, resource: &str) -> Option<Psi> {
        if !self.v2 {
            return None;
        }
        let text = self
            .read(resource, path, &format!("{resource}.pressure"))
            .ok()?;
        Some(parse_psi(&text))
    }

    /// [`psi`](Self::psi) of cpu, memory and io.
    pub fn pressures(&self, path: &str) -> Pressures {
        Pressures {
            cpu: self.psi(path, "cpu"),
            memory: self.psi(path, "memory"),
            io: self.psi(path, "io"),
        }
    }

    /// Swap usage: v2 `memory.swap.current` against `memory.swap.max`; v1 the memsw counter less
    /// memory usage (where swap is accounted). `None` where neither exists.
    pub fn swap(&self, path: &str) -> Option<Swap> {
        if self.v2 {
            let usage = parse_u64(&self.read("memory", path, "memory.swap.current").ok()?).ok()?;
            let max = self.read("memory", path, "memory.swap.max").ok()?;
            let available = parse_u64(&max).ok().map(|m| m.saturating_sub(usage));
            return Some(Swap { usage, available });
        }
        let memsw = parse_u64(
            &self
                .read("memory", path, "memory.memsw.usage_in_bytes")
                .ok()?,
        )
        .ok()?;
        let memory = parse_u64(&self.read("memory", path, "memory.usage_in_bytes").ok()?).ok()?;
        let limit = parse_u64(
            &self
                .read("memory", path, "memory.memsw.limit_in_bytes")
                .ok()?,
        )
        .ok()
        .filter(|l| *l < V1_UNLIMITED);
        let usage = memsw.saturating_sub(memory);
        Some(Swap {
            usage,
            available: limit.map(|l| l.saturating_sub(memsw)),
        })
    }

    /// Memory counters: usage, working set, rss, page faults and the limit.
    pub fn memory(&self, path: &str) -> io::Result<Memory> {
        let (usage_file, limit_file, prefix) = if self.v2 {
            ("memory.current", "memory.max", "")
        } else {
            ("memory.usage_in_bytes", "memory.limit_in_bytes", "total_")
        };
        let usage = parse_u64(&self.read("memory", path, usage_file)?)?;
        let stat_text = self.read("memory", path, "memory.stat")?;
        let stat = flat_keyed(&stat_text);
        let key = |k: &str| stat.get(format!("{prefix}{k}").as_str()).copied();
        let limit = match self.read("memory", path, limit_file) {
            Ok(s) if s.trim() == "max" => None,
            Ok(s) => Some(parse_u64(&s)?).filter(|&l| l < V1_UNLIMITED),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        Ok(Memory {
            usage,
            working_set: key("inactive_file").map(|i| usage.saturating_sub(i)),
            rss: key(if self.v2 { "anon" } else { "rss" }),
            page_faults: key("pgfault"),
            major_page_faults: key("pgmajfault"),
            limit,
        })
    }

    /// Tasks in the cgroup and below: `pids.current`.
    pub fn pids(&self, path: &str) -> io::Result<u64> {
        parse_u64(&self.read("pids", path, "pids.current")?)
    }
}

/// `some avg10=0.12 avg60=0.00 avg300=0.00 total=1234` and the `full` line; what does not parse
/// is left out.
pub fn parse_psi(text: &str) -> Psi {
    let mut psi = Psi::default();
    for line in text.lines().take(2) {
        let mut words = line.split_whitespace();
        let kind = words.next();
        let mut p = Pressure::default();
        for kv in words {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            match k {
                "total" => p.total = v.parse().unwrap_or(0),
                "avg10" => p.avg10 = v.parse().unwrap_or(0.0),
                "avg60" => p.avg60 = v.parse().unwrap_or(0.0),
                "avg300" => p.avg300 = v.parse().unwrap_or(0.0),
                _ => {}
            }
        }
        match kind {
            Some("some") => psi.some = Some(p),
            Some("full") => psi.full = Some(p),
            _ => {}
        }
    }
    psi
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

fn parse_u64(s: &str) -> io::Result<u64> {
    s.trim()
        .parse()
        .map_err(|_| invalid(&format!("not a counter: {:?}", s.trim())))
}

/// A flat-keyed cgroup file (`memory.stat`, `cpu.stat`): `key value` per line.
pub fn flat_keyed(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let k = f.next()?;
            let v = f.next()?.parse().ok()?;
            Some((k, v))
        })
        .collect()
}

/// One interface's counters from `net/dev`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

/// The interfaces of `/proc/<pid>/net/dev` (the network namespace of `pid`).
pub fn net_dev(pid: i32) -> io::Result<Vec<Interface>> {
    Ok(parse_net_dev(&std::fs::read_to_string(format!(
        "/proc/{pid}/net/dev"
    ))?))
}

/// Parse a `net/dev` table: two header lines, then `name: rx_bytes rx_packets rx_errs … (8
/// receive columns) tx_bytes tx_packets tx_errs …`.
pub fn parse_net_dev(text: &str) -> Vec<Interface> {
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(|v| v.parse().ok())
                .collect::<Option<_>>()?;
            if f.len() < 16 {
                return None;
            }
            Some(Interface {
                name: name.trim().to_string(),
                rx_bytes: f[0],
                rx_errors: f[2],
                tx_bytes: f[8],
                tx_errors: f[10],
            })
        })
        .collect()
}

/// Disk space and inodes a directory tree takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Allocated blocks (`st_blocks` × 512), each inode once.
    pub bytes: u64,
    /// Inodes, the root's included; hard links counted once.
    pub inodes: u64,
}

/// Entries a writable layer's walk counts at most, and the time it takes at most: a layer
/// beyond either is reported as what was counted (a lower bound), with a warning.
const DISK_USAGE_ENTRIES: u64 = 1_000_000;
const DISK_USAGE_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// Walk `root` (a container's writable layer, which its container writes while this reads) by
/// descriptor ([`crishim_sys::walk`]): no symlink followed, no other mount counted, so a
/// directory swapped for a link mid-walk never adds the host's files. Entries that vanish during
/// the walk are skipped; an unreadable `root` is an error. A layer of more than
/// [`DISK_USAGE_ENTRIES`] entries, or whose walk takes more than [`DISK_USAGE_TIME`], counts as
/// what was counted by then.
pub fn disk_usage(root: &Path) -> io::Result<DiskUsage> {
    use crishim_sys::walk;
    let limits = walk::Limits {
        deadline: Some(std::time::Instant::now() + DISK_USAGE_TIME),
        ..walk::Limits::entries(DISK_USAGE_ENTRIES)
    };
    let mut usage = DiskUsage::default();
    let mut seen = HashSet::new();
    let walked = walk::walk(root, &limits, |e| {
        let s = e.stat();
        if s.nlink > 1 && !s.is_dir() && !seen.insert((s.dev, s.ino)) {
            return Ok(());
        }
        usage.bytes = usage.bytes.saturating_add(s.blocks.saturating_mul(512));
        usage.inodes += 1;
        Ok(())
    })?;
    if let Some(stop) = walked.stopped {
        tracing::warn!(
            dir = %root.display(),
            bytes = usage.bytes,
            inodes = usage.inodes,
            "writable layer counted in part: {stop}"
        );
    }
    Ok(usage)
}

/// CPU rates (nanocores) from successive samples of cumulative usage, per key (a container or
/// pod id): the rate is the usage added since the key's previous sample over the time between.
#[derive(Default)]
pub struct CpuRates {
    last: Mutex<HashMap<String, Sample>>,
}

#[derive(Clone, Copy)]
struct Sample {
    at: i64,
    usage: u64,
    rate: u64,
}

impl CpuRates {
    /// Samples closer than this to the previous one give its rate rather than a noisy new one.
    pub const MIN_WINDOW_NS: i64 = 100_000_000;

    /// The rate since `key`'s previous sample, with this sample (`usage` ns of CPU at `at` ns)
    /// kept for the next call: 0 for the first sample and after a counter reset.
    pub fn rate(&self, key: &str, at: i64, usage: u64) -> u64 {
        let mut last = self.last.lock().unwrap();
        let rate = match last.get(key) {
            Some(prev) if usage >= prev.usage && at - prev.at < Self::MIN_WINDOW_NS => {
                return prev.rate;
            }
            Some(prev) if usage >= prev.usage && at > prev.at => {
                ((usage - prev.usage) as u128 * 1_000_000_000 / (at - prev.at) as u128) as u64
            }
            _ => 0,
        };
        last.insert(key.to_string(), Sample { at, usage, rate });
        rate
    }

    /// Forget the keys for which `keep` is false (containers and pods that are gone).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.last.lock().unwrap().retain(|k, _| keep(k));
    }

    pub fn len(&self) -> usize {
        self.last.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn pressure_and_swap_are_read_where_the_kernel_has_them() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        write(r, "cgroup.controllers", "cpu memory io");
        write(
            r,
            "c/memory.pressure",
            "some avg10=1.50 avg60=0.25 avg300=0.00 total=4242\nfull avg10=0.50 avg60=0.00 avg300=0.00 total=99\n",
        );
        write(r, "c/memory.swap.current", "4096\n");
        write(r, "c/memory.swap.max", "65536\n");
        let cg = Cgroups::at(r);
        let psi = cg.psi("/c", "memory").unwrap();
        assert_eq!(
            psi.some,
            Some(Pressure {
                total: 4242,
                avg10: 1.5,
                avg60: 0.25,
                avg300: 0.0
            })
        );
        assert_eq!(psi.full.unwrap().total, 99);
        assert!(cg.psi("/c", "io").is_none(), "no io.pressure file");
        assert_eq!(
            cg.swap("/c"),
            Some(Swap {
                usage: 4096,
                available: Some(61440)
            })
        );
        write(r, "c/memory.swap.max", "max\n");
        assert_eq!(cg.swap("/c").unwrap().available, None);
        assert_eq!(parse_psi("garbage\n"), Psi::default());

        // v1: no PSI per cgroup; swap from memsw where accounted.
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        write(r, "memory/c/memory.usage_in_bytes", "1000\n");
        let cg = Cgroups::at(r);
        assert!(cg.psi("/c", "cpu").is_none());
        assert!(cg.swap("/c").is_none(), "swap not accounted");
        write(r, "memory/c/memory.memsw.usage_in_bytes", "1500\n");
        write(r, "memory/c/memory.memsw.limit_in_bytes", "2000\n");
        assert_eq!(
            cg.swap("/c"),
            Some(Swap {
                usage: 500,
                available: Some(500)
            })
        );
    }

    #[test]
    fn limits_read_back_from_v1_and_v2_files() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        write(r, "cpu/c/cpu.cfs_period_us", "100000\n");
        write(r, "cpu/c/cpu.cfs_quota_us", "-1\n");
        write(r, "cpu/c/cpu.shares", "1024\n");
        write(r, "memory/c/memory.limit_in_bytes", "9223372036854771712\n");
        write(r, "cpuset/c/cpuset.cpus", "0-1\n");
        write(r, "cpuset/c/cpuset.mems", "0\n");
        let l = Cgroups::at(r).limits("/c").unwrap();
        assert_eq!(
            l,
            Limits {
                cpu_period: 100_000,
                cpu_quota: 0,
                cpu_shares: 1024,
                memory_limit: 0,
                cpuset_cpus: "0-1".into(),
                cpuset_mems: "0".into(),
            }
        );
        write(r, "cpu/c/cpu.shares", "lots\n");
        assert!(Cgroups::at(r).limits("/c").is_err(), "garbage is an error");

        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        write(r, "cgroup.controllers", "cpu memory");
        write(r, "c/cpu.max", "50000 100000\n");
        write(r, "c/cpu.weight", "39\n");
        write(r, "c/memory.max", "67108864\n");
        let l = Cgroups::at(r).limits("/c").unwrap();
        assert_eq!(
            (l.cpu_period, l.cpu_quota, l.cpu_shares, l.memory_limit),
            (100_000, 50_000, 998, 64 << 20)
        );
        write(r, "c/cpu.max", "max 100000\n");
        write(r, "c/memory.max", "max\n");
        let l = Cgroups::at(r).limits("/c").unwrap();
        assert_eq!(
            (l.cpu_quota, l.memory_limit, l.cpuset_cpus.as_str()),
            (0, 0, "")
        );
    }

    #[test]
    fn stats_v1_tree() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        let cg = "/kubepods/pod1/c1";
        write(r, "cpuacct/kubepods/pod1/c1/cpuacct.usage", "123456789\n");
        write(
            r,
            "memory/kubepods/pod1/c1/memory.usage_in_bytes",
            "10000\n",
        );
        write(
            r,
            "memory/kubepods/pod1/c1/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(
            r,
            "memory/kubepods/pod1/c1/memory.stat",
            "cache 1\nrss 2\ninactive_file 3\npgfault 4\ntotal_cache 100\ntotal_rss 2000\n\
             total_inactive_file 4000\ntotal_pgfault 77\ntotal_pgmajfault 5\n",
        );
        write(r, "pids/kubepods/pod1/c1/pids.current", "3\n");
        let c = Cgroups::at(r);
        assert!(!c.is_v2());
        assert!(c.exists(cg) && !c.exists("/kubepods/none"));
        assert_eq!(c.cpu_usage_ns(cg).unwrap(), 123456789);
        let m = c.memory(cg).unwrap();
        assert_eq!(
            m,
            Memory {
                usage: 10000,
                working_set: Some(6000),
                rss: Some(2000),
                page_faults: Some(77),
                major_page_faults: Some(5),
                limit: None,
            }
        );
        assert_eq!(m.available(), None, "v1's huge limit is no limit");
        assert_eq!(c.pids(cg).unwrap(), 3);

        // A limit, and more inactive cache than usage: the working set stops at 0.
        write(
            r,
            "memory/kubepods/pod1/c1/memory.limit_in_bytes",
            "1048576\n",
        );
        write(
            r,
            "memory/kubepods/pod1/c1/memory.stat",
            "total_inactive_file 20000\n",
        );
        let m = c.memory(cg).unwrap();
        assert_eq!(m.working_set, Some(0));
        assert_eq!((m.rss, m.page_faults), (None, None), "absent, not 0");
        assert_eq!(m.limit, Some(1048576));
        assert_eq!(m.available(), Some(1048576));

        assert_eq!(
            c.cpu_usage_ns("/kubepods/none").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert!(c.cpu_usage_ns("/kubepods/../../etc").is_err());
        assert!(c.dir("memory", "/a/../b").is_none());
    }

    #[test]
    fn stats_v2_tree() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        write(r, "cgroup.controllers", "cpu memory pids\n");
        write(
            r,
            "crishim/p/c/cpu.stat",
            "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n",
        );
        write(r, "crishim/p/c/memory.current", "8192\n");
        write(r, "crishim/p/c/memory.max", "max\n");
        write(
            r,
            "crishim/p/c/memory.stat",
            "anon 4096\nfile 4096\ninactive_file 1024\npgfault 10\npgmajfault 1\n",
        );
        write(r, "crishim/p/c/pids.current", "2\n");
        let c = Cgroups::at(r);
        assert!(c.is_v2());
        assert!(c.exists("crishim/p/c"));
        assert_eq!(c.cpu_usage_ns("/crishim/p/c").unwrap(), 2_500_000);
        let m = c.memory("/crishim/p/c").unwrap();
        assert_eq!(
            m,
            Memory {
                usage: 8192,
                working_set: Some(7168),
                rss: Some(4096),
                page_faults: Some(10),
                major_page_faults: Some(1),
                limit: None,
            }
        );
        write(r, "crishim/p/c/memory.max", "16384\n");
        assert_eq!(c.memory("/crishim/p/c").unwrap().available(), Some(9216));
        assert_eq!(c.pids("/crishim/p/c").unwrap(), 2);

        write(r, "crishim/p/bad/cpu.stat", "user_usec 1\n");
        assert_eq!(
            c.cpu_usage_ns("/crishim/p/bad").unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );

        let sum = m.add(&Memory {
            usage: 8,
            working_set: Some(8),
            rss: None,
            page_faults: Some(1),
            major_page_faults: Some(0),
            limit: Some(1),
        });
        assert_eq!(sum.usage, 8200);
        assert_eq!(sum.working_set, Some(7176));
        assert_eq!(sum.rss, None, "unknown in one part, unknown in the sum");
        assert_eq!(sum.limit, None);
    }

    #[test]
    fn stats_net_dev() {
        let text = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     140       2    0    0    0     0          0         0      140       2    0    0    0     0       0          0
  eth0:123456789012 10    1    0    0     0          0         0 987654   9    2    0    0     0       0          0
";
        let ifs = parse_net_dev(text);
        assert_eq!(ifs.len(), 2);
        assert_eq!(ifs[0].name, "lo");
        assert_eq!(
            ifs[1],
            Interface {
                name: "eth0".into(),
                rx_bytes: 123456789012,
                rx_errors: 1,
                tx_bytes: 987654,
                tx_errors: 2,
            }
        );
        // Our own namespace has at least the loopback.
        let own = net_dev(std::process::id() as i32).unwrap();
        assert!(own.iter().any(|i| i.name == "lo"), "{own:?}");
    }

    #[test]
    fn stats_disk_usage() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        std::fs::write(r.join("a/b/f"), vec![1u8; 100_000]).unwrap();
        std::fs::hard_link(r.join("a/b/f"), r.join("a/link")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", r.join("dangling")).unwrap();
        let u = disk_usage(r).unwrap();
        // root, a, a/b, f (once for its two names), the symlink.
        assert_eq!(u.inodes, 5);
        let f_bytes = std::fs::metadata(r.join("a/b/f")).unwrap().blocks() * 512;
        assert!(f_bytes >= 100_000);
        assert!(
            u.bytes >= f_bytes && u.bytes < 2 * f_bytes,
            "{u:?} vs {f_bytes}"
        );
        assert!(disk_usage(&r.join("none")).is_err());
    }

    /// A writable layer whose container made an entry a link to `/`: the link counts, not `/`.
    #[test]
    fn stats_disk_usage_never_counts_a_links_target() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path().join("upper");
        std::fs::create_dir_all(r.join("d")).unwrap();
        std::os::unix::fs::symlink("/", r.join("x")).unwrap();
        let u = disk_usage(&r).unwrap();
        assert_eq!(u.inodes, 3, "{u:?}");
        assert!(u.bytes < 1 << 20, "{u:?}");
    }

    #[test]
    fn stats_cpu_rates() {
        let r = CpuRates::default();
        assert_eq!(r.rate("c", 1_000_000_000, 5_000), 0, "first sample");
        // Half a core over a second.
        assert_eq!(r.rate("c", 2_000_000_000, 500_005_000), 500_000_000);
        // Too close to the previous sample: its rate again, the sample not replaced.
        assert_eq!(r.rate("c", 2_010_000_000, 500_006_000), 500_000_000);
        // Two cores over two seconds since the kept sample.
        assert_eq!(r.rate("c", 4_000_000_000, 4_500_005_000), 2_000_000_000);
        // A counter that went back (a new cgroup under the same key): start again.
        assert_eq!(r.rate("c", 5_000_000_000, 10), 0);
        assert_eq!(r.rate("d", 5_000_000_000, 10), 0);
        r.retain(|k| k != "c");
        assert_eq!(r.len(), 1);
        assert_eq!(r.rate("c", 6_000_000_000, 1_000_000_000), 0, "forgotten");
    }
}
