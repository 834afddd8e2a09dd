//! The real [`PodShims`]: `crishim-shim start` and `crishim-shim cleanup` processes, signals,
//! and reaping as the shims' subreaper.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crishim_proto::shim::{paths, InfraSpec, OciRuntimeSpec};
use crishim_sys::blocking::read_capped;
use tracing::warn;

use super::PodShims;
use crate::server::errors::Error;
use crate::shim_client::SHIM_TIMEOUT;

/// The real shims: `crishim-shim start` and `crishim-shim cleanup` processes, and signals.
pub struct ProcessPodShims {
    binary: PathBuf,
    seccomp_cache: PathBuf,
}

impl ProcessPodShims {
    /// Shims run from `binary`, caching compiled seccomp filters in `seccomp_cache`.
    pub fn new(binary: PathBuf, seccomp_cache: PathBuf) -> Self {
        ProcessPodShims {
            binary,
            seccomp_cache,
        }
    }
}

#[tonic::async_trait]
impl PodShims for ProcessPodShims {
    async fn start(
        &self,
        _pod_id: &str,
        dir: &Path,
        infra: &InfraSpec,
        oci: Option<&OciRuntimeSpec>,
    ) -> Result<i32, Error> {
        let infra_json =
            serde_json::to_string(infra).map_err(|e| Error::internal(e.to_string()))?;
        let mut cmd = tokio::process::Command::new(&self.binary);
        cmd.arg("start")
            .arg("--dir")
            .arg(dir)
            .arg("--infra")
            .arg(infra_json)
            .arg("--seccomp-cache")
            .arg(&self.seccomp_cache);
        if let Some(oci) = oci {
            let json = serde_json::to_string(oci).map_err(|e| Error::internal(e.to_string()))?;
            cmd.arg("--oci-runtime").arg(json);
        }
        // `crishim-shim start` exits once the shim it forked is ready, printing `ok <infra pid>`
        // (so no request needs to ask). Bounded: a shim that never gets ready is killed (on
        // drop), and only the first bytes of what it prints are kept.
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::internal(format!("running shim {}: {e}", self.binary.display())))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let run = async {
            let (stdout, stderr) = tokio::join!(
                read_capped(stdout, SHIM_REPORT_MAX),
                read_capped(stderr, SHIM_REPORT_MAX)
            );
            Ok::<_, std::io::Error>((child.wait().await?, stdout?, stderr?))
        };
        let (status, stdout, stderr) = match tokio::time::timeout(SHIM_TIMEOUT, run).await {
            Ok(out) => out.map_err(|e| {
                Error::internal(format!("waiting for shim {}: {e}", self.binary.display()))
            })?,
            Err(_) => {
                return Err(Error::internal(format!(
                    "the pod's shim did not report ready in {}s",
                    SHIM_TIMEOUT.as_secs()
                )))
            }
        };
        if !status.success() {
            return Err(Error::internal(format!(
                "starting the pod's shim failed: {}",
                String::from_utf8_lossy(&stderr).trim()
            )));
        }
        crishim_proto::shim::parse_ready(&stdout)
            .map_err(|why| Error::internal(format!("starting the pod's shim failed: {why}")))
    }

    async fn cleanup_dead(&self, dir: &Path) {
        cleanup_dead_shim(&self.binary, dir).await
    }

    async fn kill_orphan(&self, pid: i32) {
        kill_child(pid);
        reap(pid).await;
    }

    async fn kill_shim_then_infra(&self, _pod_id: &str, dir: &Path) {
        kill_shim_then_infra(dir).await
    }

    fn remove_cgroups(&self, owned: &[String]) {
        crishim_spec::cgroups::remove(owned)
    }
}

/// At most this much of a starting shim's report, and of its error, is kept: the report is a
/// line, and the error goes into a gRPC status, whose message must fit the client's header limit.
const SHIM_REPORT_MAX: u64 = 4 * 1024;

/// Kill and delete the containers a dead shim left, through `crishim-shim cleanup` (run from
/// `shim_binary`), which runs libcontainer in its own process.
pub(super) async fn cleanup_dead_shim(shim_binary: &std::path::Path, dir: &std::path::Path) {
    let out = tokio::process::Command::new(shim_binary)
        .arg("cleanup")
        .arg("--dir")
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            warn!(dir = %dir.display(), status = %o.status, stderr = %String::from_utf8_lossy(&o.stderr).trim(), "shim cleanup")
        }
        Err(e) => warn!(dir = %dir.display(), error = %e, "running shim cleanup"),
    }
}

/// Kill what is left of the pod's shim, then of its infra process, and reap both. The shim
/// first: the infra is its child, and a shim that hangs would never reap an infra killed before
/// it; once the shim is gone the infra is the daemon's (the subreaper's) to reap.
pub(super) async fn kill_shim_then_infra(dir: &std::path::Path) {
    for file in [paths::SHIM_PID, paths::INFRA_PID] {
        // Only a process's own pid: `waitpid` takes 0 and -1 for "any child", which would reap
        // one of the daemon's that another task waits for.
        if let Some(recorded) = crishim_proto::shim::pid_file::read(&dir.join(file)) {
            crishim_proto::shim::kill_if_ours(&recorded);
            reap(recorded.pid).await;
        }
    }
}

/// The daemon is the shims' subreaper: collect an exited shim so it leaves no zombie. A pid that is
/// not our child (the daemon restarted since) is someone else's to reap.
pub(super) async fn reap(pid: i32) {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let pid = nix::unistd::Pid::from_raw(pid);
    // Polled from 1 ms up to every 10 ms, for at most about 2 s: a shim that was told to shut
    // down is usually gone within a few milliseconds.
    let mut delay = std::time::Duration::from_millis(1);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    while tokio::time::Instant::now() < deadline {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_millis(10));
            }
            _ => return,
        }
    }
}

/// SIGKILL `pid` only if it is our own unreaped child: such a pid cannot have been reused.
pub(super) fn kill_child(pid: i32) {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let p = nix::unistd::Pid::from_raw(pid);
    if let Ok(WaitStatus::StillAlive) = waitpid(p, Some(WaitPidFlag::WNOHANG)) {
        let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` in a forked child that is a subreaper, as the daemon is, so the test process
    /// keeps its own children and parentage.
    fn in_subreaper(f: impl FnOnce() -> Option<Vec<bool>>) -> Option<Vec<bool>> {
        crishim_sys::testing::in_child_mount_ns(|| {
            // SAFETY: prctl with integer arguments.
            if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
                return None;
            }
            f()
        })
    }

    fn run(dir: &std::path::Path) -> Option<()> {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .ok()?
            .block_on(kill_shim_then_infra(dir));
        Some(())
    }

    /// A shim that hangs (here: one that never waits for its children) and its infra, left for
    /// the teardown to kill: both are gone after it, not left as zombies.
    #[test]
    fn a_hung_shim_and_its_infra_are_killed_and_both_reaped() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let gone = |pid: i32| !std::path::Path::new(&format!("/proc/{pid}")).exists();
        let seen = in_subreaper(|| {
            // The infra runs under the name the teardown checks for; the shim then becomes a
            // process that never reaps it.
            let script = format!(
                "bash -c 'exec -a crishim-pause sleep 60' & echo $! > {}; \
                 exec -a crishim-shim sleep 60",
                dir.path().join(paths::INFRA_PID).display()
            );
            let shim = std::process::Command::new("bash")
                .args(["-c", &script])
                .spawn()
                .ok()?;
            let shim_pid = shim.id() as i32;
            std::fs::write(dir.path().join(paths::SHIM_PID), shim_pid.to_string()).ok()?;
            let infra_pid = (0..500).find_map(|_| {
                let named = |pid: i32, name: &str| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| c.starts_with(name.as_bytes()))
                };
                let infra = std::fs::read_to_string(dir.path().join(paths::INFRA_PID))
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok())
                    .filter(|&p| named(p, "crishim-pause") && named(shim_pid, "crishim-shim"));
                if infra.is_none() {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                infra
            })?;
            run(dir.path())?;
            Some(vec![gone(shim_pid), gone(infra_pid)])
        });
        assert_eq!(
            seen,
            Some(vec![true, true]),
            "[shim gone, infra gone] (None: the setup failed)"
        );
    }

    /// Pid files that say 0 or -1 (damaged after a crash) reap nothing: `waitpid` would take
    /// them for any child, here one of the daemon's own that has exited and is still its to wait
    /// for.
    #[test]
    fn pid_files_of_zero_or_minus_one_reap_no_other_child() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let seen = in_subreaper(|| {
            std::fs::write(dir.path().join(paths::SHIM_PID), "0").ok()?;
            std::fs::write(dir.path().join(paths::INFRA_PID), "-1").ok()?;
            let mut other = std::process::Command::new("true").spawn().ok()?;
            let other_pid = other.id();
            // Exited, not yet waited for.
            let zombie = (0..500).any(|_| {
                let state =
                    std::fs::read_to_string(format!("/proc/{other_pid}/stat")).unwrap_or_default();
                let z = state
                    .rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z'));
                if !z {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                z
            });
            run(dir.path())?;
            Some(vec![zombie, other.wait().is_ok_and(|s| s.success())])
        });
        assert_eq!(
            seen,
            Some(vec![true, true]),
            "[the other child exited, its status was still ours to read]"
        );
    }
}
