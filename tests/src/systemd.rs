//! A real systemd for the systemd cgroup driver's tests, booted as PID 1 of its own pid, mount and
//! cgroup namespaces on a cgroup v2 subtree of this host (the way systemd runs in a container).
//! It loads units only from a private directory, so it starts nothing of the host's. The daemon
//! runs inside it through `nsenter` ([`NestedSystemd::enter`]), so its shims reach systemd at
//! /run/systemd/private and see the same cgroup tree. Dropping it kills everything in it.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::random_hex;

/// The target it boots into.
const TARGET: &str = "crishim-test.target";

/// Its only units: the target and the system bus, as Debian's dbus package defines it. Without a
/// bus, clients fall back to /run/systemd/private, where systemd 252 leaves a method call that
/// arrives in the same read as the client's `BEGIN` unanswered, and libcgroups then waits out its
/// 10 s receive timeout before reconnecting. The target pulls in the socket itself: when only
/// the service's `Requires=` did, the socket was left dead in about two boots in three, and
/// dbus-daemon failed with "No socket received" (then CI's stall).
const UNITS: [(&str, &str); 3] = [
    (
        TARGET,
        "[Unit]\nDescription=crishim test target\nWants=dbus.socket dbus.service\n\
         After=dbus.socket dbus.service\n",
    ),
    (
        "dbus.socket",
        "[Unit]\nDescription=D-Bus System Message Bus Socket\n\
         [Socket]\nListenStream=/run/dbus/system_bus_socket\n",
    ),
    (
        "dbus.service",
        "[Unit]\nDescription=D-Bus System Message Bus\nRequires=dbus.socket\n\
         [Service]\nType=notify\nNotifyAccess=main\nExecStart=/usr/bin/dbus-daemon --system \
         --address=systemd: --nofork --nopidfile --systemd-activation --syslog-only\n",
    ),
];

pub struct NestedSystemd {
    unshare: Child,
    /// systemd's pid in this (the host's) pid namespace.
    pid: i32,
    /// Its cgroup namespace's root, on the host.
    cgroup: PathBuf,
    dir: tempfile::TempDir,
}

/// Where this host mounts the cgroup v2 hierarchy (the unified one of a hybrid host).
fn cgroup2_mount() -> Option<PathBuf> {
    crishim_sys::mountinfo::read()
        .into_iter()
        .find(|m| m.fs_type == "cgroup2")
        .map(|m| m.mount_point)
}

impl NestedSystemd {
    pub fn boot() -> Result<Self> {
        let systemd = Path::new("/lib/systemd/systemd");
        if !systemd.is_file() {
            bail!("{} is missing: apt-get install systemd", systemd.display());
        }
        let root = cgroup2_mount().context("this host mounts no cgroup v2 hierarchy")?;
        let cgroup = root.join(format!("crishim-systemd-{}", random_hex(6)));
        std::fs::create_dir(&cgroup).with_context(|| format!("creating {}", cgroup.display()))?;
        let dir = tempfile::Builder::new()
            .prefix("crishim-systemd-")
            .tempdir()?;
        for (name, text) in UNITS {
            std::fs::write(dir.path().join(name), text)?;
        }
        let log = std::fs::File::create(dir.path().join("systemd.log"))?;
        let procs = cgroup.join("cgroup.procs");
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--pid",
            "--mount",
            "--cgroup",
            "--fork",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t proc proc /proc && mount -t cgroup2 cgroup2 /sys/fs/cgroup && \
             mount -t tmpfs tmpfs /run && exec \"$0\" --unit=\"$1\" --log-target=console",
        ])
        .arg(systemd)
        .arg(TARGET)
        .env("container", "crishim-test")
        .env("SYSTEMD_UNIT_PATH", dir.path())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
        // SAFETY: only a write(2) to a cgroup file between fork and exec. Moving in first makes
        // the cgroup namespace's root this cgroup.
        unsafe {
            cmd.pre_exec(move || std::fs::write(&procs, b"0"));
        }
        let unshare = cmd.spawn().context("spawning unshare")?;
        let mut me = NestedSystemd {
            pid: 0,
            unshare,
            cgroup,
            dir,
        };
        me.wait_until_running()?;
        Ok(me)
    }

    fn wait_until_running(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let children = format!("/proc/{0}/task/{0}/children", self.unshare.id());
        loop {
            if self.pid == 0 {
                self.pid = std::fs::read_to_string(&children)
                    .ok()
                    .and_then(|c| c.split_whitespace().next()?.parse().ok())
                    .unwrap_or(0);
            }
            if self.pid != 0 {
                let state = self.systemctl(&["is-system-running"]);
                match String::from_utf8_lossy(&state.stdout).trim() {
                    "running" => return Ok(()),
                    // A unit failed: without the bus, the driver's calls would stall (see UNITS).
                    "degraded" => {
                        let failed = self.systemctl(&["--failed", "--no-pager", "--full"]);
                        bail!(
                            "systemd came up degraded:\n{}",
                            String::from_utf8_lossy(&failed.stdout)
                        );
                    }
                    _ => {}
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "systemd did not come up within 30 s; its log:\n{}",
                    std::fs::read_to_string(self.dir.path().join("systemd.log"))
                        .unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `nsenter` arguments that run a command inside this systemd's namespaces.
    pub fn enter(&self) -> Vec<String> {
        [
            "nsenter",
            "-t",
            &self.pid.to_string(),
            "-p",
            "-m",
            "-C",
            "--",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Run `systemctl ARGS` against this systemd.
    pub fn systemctl(&self, args: &[&str]) -> Output {
        let enter = self.enter();
        Command::new(&enter[0])
            .args(&enter[1..])
            .arg("systemctl")
            .args(args)
            .output()
            .expect("running systemctl through nsenter")
    }

    /// Run `argv` inside this systemd's namespaces; its stdout, trimmed.
    pub fn run(&self, argv: &[&str]) -> String {
        let enter = self.enter();
        let out = Command::new(&enter[0])
            .args(&enter[1..])
            .args(argv)
            .output()
            .expect("running a command through nsenter");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// One property of `unit` (`systemctl show -P`).
    pub fn property(&self, unit: &str, property: &str) -> String {
        let out = self.systemctl(&["show", "-P", property, unit]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The host directory of cgroup `path` as this systemd names it (`/a.slice/b.scope`).
    pub fn cgroup_dir(&self, path: &str) -> PathBuf {
        self.cgroup.join(path.trim_start_matches('/'))
    }
}

impl Drop for NestedSystemd {
    fn drop(&mut self) {
        // Killing a pid namespace's init kills everything in it; its mounts go with the last one.
        if self.pid > 0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while remove_tree(&self.cgroup).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Remove a cgroup directory and the ones under it, deepest first.
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_tree(&entry.path())?;
        }
    }
    std::fs::remove_dir(dir)
}
