//! Debian's containerd (1.6) with its CRI plugin, on a private socket with private root and
//! state directories.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::client::Cri;

pub const BIN: &str = "/usr/bin/containerd";
pub const RUNC: &str = "/usr/sbin/runc";
/// The namespace the CRI plugin keeps its containers in.
pub const NAMESPACE: &str = "k8s.io";

/// What containerd is configured with.
pub struct Config<'a> {
    /// Everything of this containerd lives here.
    pub dir: &'a Path,
    /// The registry that stands in for docker.io and registry.k8s.io.
    pub mirror: &'a str,
    pub cni_conf_dir: &'a Path,
    pub cni_bin_dir: &'a Path,
    pub sandbox_image: &'a str,
}

impl Config<'_> {
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    pub fn toml(&self) -> String {
        let p = |name: &str| q(&self.dir.join(name));
        let mirror = serde_json::to_string(self.mirror).expect("string to json");
        let cri = r#"plugins."io.containerd.grpc.v1.cri""#;
        format!(
            r#"version = 2
root = {root}
state = {state}
# Snapshotters this host cannot use, and the plugin that would write to /opt/containerd.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.internal.v1.opt",
]

[grpc]
  address = {sock}
[ttrpc]
  address = {ttrpc}

[{cri}]
  sandbox_image = {sandbox}
  # This machine refuses negative OOM scores (containerd's own -999 would be inherited).
  restrict_oom_score_adj = true
  # Pod network namespaces in the private state dir, not /var/run/netns.
  netns_mounts_under_state_dir = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = {runc}
        # runc's state, which would otherwise go to /run/containerd/runc (a tmpfs, as state/ is).
        Root = {runc_root}
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
    max_conf_num = 1
  [{cri}.registry.mirrors."docker.io"]
    endpoint = [{mirror}]
  [{cri}.registry.mirrors."registry.k8s.io"]
    endpoint = [{mirror}]
"#,
            root = p("root"),
            state = p("state"),
            sock = q(&self.socket()),
            ttrpc = p("containerd.sock.ttrpc"),
            sandbox = serde_json::to_string(self.sandbox_image).expect("string to json"),
            runc = q(Path::new(RUNC)),
            runc_root = p("state/runc"),
            cni_bin = q(self.cni_bin_dir),
            cni_conf = q(self.cni_conf_dir),
        )
    }
}

/// A TOML string for a path (a JSON string is a valid TOML basic string).
fn q(p: &Path) -> String {
    serde_json::to_string(&p.to_string_lossy()).expect("string to json")
}

/// A running containerd; SIGTERM (then SIGKILL after 10 s) when dropped. Its shims outlive it:
/// stop the pods first, or let a [`crate::host::Sweeper`] kill them.
pub struct Containerd {
    child: Child,
    pub socket: PathBuf,
    log: PathBuf,
}

impl Containerd {
    pub async fn start(cfg: &Config<'_>) -> Result<Containerd> {
        for bin in [BIN, RUNC, "/usr/bin/containerd-shim-runc-v2"] {
            if !Path::new(bin).exists() {
                bail!("{bin} not found: install containerd and runc (hack/install-deps.sh)");
            }
        }
        fs::create_dir_all(cfg.dir)?;
        let config = cfg.dir.join("config.toml");
        fs::write(&config, cfg.toml())?;
        let log = cfg.dir.join("containerd.log");
        let logf = fs::File::create(&log)?;
        let child = Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .with_context(|| format!("spawning {BIN}"))?;
        let mut c = Containerd {
            child,
            socket: cfg.socket(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = c.child.try_wait()? {
                bail!("containerd exited with {st}:\n{}", c.log_tail());
            }
            if c.socket.exists() {
                if let Ok(cri) = Cri::connect(&c.socket).await {
                    if cri.version().await.is_ok() {
                        return Ok(c);
                    }
                }
            }
            if Instant::now() > deadline {
                bail!("containerd did not answer within 30 s:\n{}", c.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        crate::text::tail(&text, 6000).to_string()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = nix::unistd::Pid::from_raw(self.pid());
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
