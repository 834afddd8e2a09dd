//! The detached lifecycle, `create` → `start` → `state`/`kill` → `delete`, through a daemonized
//! shim per container (`crishim-shim start --dir DIR`, with no infra process) and the same
//! requests the CRI server sends a pod's shim.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crishim_proto::shim::{paths, ContainerState, Request, Response, Status};
use crishim_sys::record::now_nanos;

use super::config::Bundle;
use super::error::BundleError;
use super::state::OciState;
use super::store::{BundleRecord, Store};
use crishim_cri::shim_client::ShimClient;

/// libcontainer's create and start, which may mount, fork and wait for hooks.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Shutdown kills and waits up to 10 s per container.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a shim may take to exit after its shutdown.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where bundles' state lives, and the shim that runs them.
pub struct Env {
    pub store: Store,
    pub shim: PathBuf,
}

impl Env {
    /// Run `crishim-shim <subcommand> --dir DIR`; a failure comes back as its stderr (the outer
    /// error is the shim binary itself failing to run).
    async fn shim_command(
        &self,
        subcommand: &str,
        dir: &Path,
    ) -> Result<Result<(), String>, BundleError> {
        let out = tokio::process::Command::new(&self.shim)
            .arg(subcommand)
            .arg("--dir")
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .map_err(|source| BundleError::ShimBinary {
                path: self.shim.clone(),
                source,
            })?;
        Ok(match out.status.success() {
            true => Ok(()),
            false => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        })
    }

    /// Fail early and clearly when the shim binary is missing.
    pub fn check_shim(&self) -> Result<(), BundleError> {
        std::fs::metadata(&self.shim)
            .map(drop)
            .map_err(|source| BundleError::ShimBinary {
                path: self.shim.clone(),
                source,
            })
    }
}

pub fn record(bundle: &Bundle, id: &str, log: Option<PathBuf>) -> BundleRecord {
    BundleRecord {
        id: id.to_string(),
        bundle: bundle.dir.clone(),
        rootfs: bundle.rootfs.clone(),
        oci_version: bundle.oci_version.clone(),
        created: now_nanos(),
        log,
    }
}

/// Create the container and leave it created; its output goes to `log` (default: `container.log`
/// in its state directory) in the CRI format.
pub async fn create(
    env: &Env,
    bundle: &Bundle,
    id: &str,
    log: Option<PathBuf>,
) -> Result<(), BundleError> {
    env.check_shim()?;
    let log = match log {
        Some(l) => std::path::absolute(&l).map_err(|e| BundleError::io("resolving", l, e))?,
        None => env.store.dir(id).join("container.log"),
    };
    let reservation = env.store.reserve(&record(bundle, id, Some(log.clone())))?;
    let dir = reservation.dir().to_path_buf();
    env.shim_command("start", &dir)
        .await?
        .map_err(BundleError::ShimFailed)?;
    let req = Request::Create {
        id: id.to_string(),
        bundle: bundle.dir.clone(),
        log_path: log,
        log_root: PathBuf::new(),
        stdin: false,
        tty: bundle.terminal,
        start_error_at_start: false,
    };
    match call(&dir, &req, CREATE_TIMEOUT).await {
        Ok(Response::State(_)) => {
            reservation.keep();
            Ok(())
        }
        answer => {
            let err = match answer {
                Ok(other) => refusal(other),
                Err(e) => e,
            };
            if let Err(e) = teardown(env, &dir).await {
                // Keep the state, so that `delete` can finish the job.
                reservation.keep();
                return Err(BundleError::ShimFailed(format!(
                    "{err}; cleaning up also failed: {e}"
                )));
            }
            Err(err)
        }
    }
}

pub async fn start(env: &Env, id: &str) -> Result<(), BundleError> {
    let (dir, _) = env.store.load(id)?;
    match call(&dir, &Request::Start { id: id.into() }, CREATE_TIMEOUT).await? {
        Response::State(_) => Ok(()),
        other => Err(refusal(other)),
    }
}

pub async fn state(env: &Env, id: &str) -> Result<OciState, BundleError> {
    let (dir, record) = env.store.load(id)?;
    let current = current_state(&dir, id).await?;
    Ok(OciState::new(&record, current.as_ref()))
}

pub async fn kill(env: &Env, id: &str, signal: i32, all: bool) -> Result<(), BundleError> {
    let (dir, _) = env.store.load(id)?;
    let status = container_state(&dir, id).await?.status;
    if status == Status::Exited {
        return Err(BundleError::WrongStatus {
            id: id.into(),
            status: "stopped",
            hint: "there is nothing left to signal",
        });
    }
    let req = Request::Kill {
        id: id.into(),
        signal,
        all,
    };
    match call(&dir, &req, CALL_TIMEOUT).await? {
        Response::Ok => Ok(()),
        other => Err(refusal(other)),
    }
}

/// Remove the container, its shim and its state directory. A running one only with `force`
/// (it is killed first); a shim that died is cleaned up after.
pub async fn delete(env: &Env, id: &str, force: bool) -> Result<(), BundleError> {
    let (dir, _) = env.store.load(id)?;
    if let Ok(Some(s)) = current_state(&dir, id).await {
        if s.status == Status::Running && !force {
            return Err(BundleError::WrongStatus {
                id: id.into(),
                status: "running",
                hint: "stop it first (`crishim bundle kill`), or delete it with --force",
            });
        }
    }
    teardown(env, &dir).await
}

/// Stop the shim (it kills and deletes its container), or clean up after a dead one, then remove
/// the state directory.
async fn teardown(env: &Env, dir: &Path) -> Result<(), BundleError> {
    let shim_pid = read_pid(dir);
    if call(dir, &Request::Shutdown, STOP_TIMEOUT).await.is_err() {
        if let Some(shim) = shim_pid.filter(|p| is_shim_of(p, dir)) {
            crishim_proto::shim::kill_if_ours(&shim);
        }
        // What the dead shim left (processes, cgroup, libcontainer state) goes through
        // libcontainer, in the shim binary.
        env.shim_command("cleanup", dir)
            .await?
            .map_err(|e| BundleError::ShimFailed(format!("cleaning up {}: {e}", dir.display())))?;
    }
    // A foreground shim removes the directory itself as it exits: let it finish first.
    if let Some(shim) = shim_pid {
        let deadline = Instant::now() + EXIT_TIMEOUT;
        while is_shim_of(&shim, dir) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if is_shim_of(&shim, dir) {
            return Err(BundleError::ShimFailed(format!(
                "shim {} did not exit within {EXIT_TIMEOUT:?}",
                shim.pid
            )));
        }
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(BundleError::io("removing", dir, e))
        }
        _ => Ok(()),
    }
}

/// What the shim reports; when the shim is gone, its last record, with the process checked: a
/// container can outlive its shim. `None` when there is neither.
async fn current_state(dir: &Path, id: &str) -> Result<Option<ContainerState>, BundleError> {
    match container_state(dir, id).await {
        Ok(s) => Ok(Some(s)),
        Err(BundleError::Unreachable(_)) => Ok(last_record(dir, id)),
        Err(e) => Err(e),
    }
}

fn last_record(dir: &Path, id: &str) -> Option<ContainerState> {
    let raw = std::fs::read(dir.join(paths::state_file(id))).ok()?;
    let mut state: ContainerState = serde_json::from_slice(&raw).ok()?;
    let alive = state.pid > 0 && process_state(state.pid).is_some_and(|s| s != 'Z');
    if !alive {
        state.status = Status::Exited;
    }
    Some(state)
}

async fn container_state(dir: &Path, id: &str) -> Result<ContainerState, BundleError> {
    match call(dir, &Request::State { id: id.into() }, CALL_TIMEOUT).await? {
        Response::State(s) => Ok(s),
        other => Err(refusal(other)),
    }
}

async fn call(dir: &Path, req: &Request, timeout: Duration) -> Result<Response, BundleError> {
    Ok(ShimClient::new(dir).call(req, timeout).await?)
}

/// An answer that is not the one expected, as an error.
fn refusal(answer: Response) -> BundleError {
    match answer {
        Response::Error { kind, message } => BundleError::Shim { kind, message },
        other => BundleError::ShimFailed(format!("unexpected answer {other:?}")),
    }
}

fn read_pid(dir: &Path) -> Option<crishim_proto::shim::pid_file::Recorded> {
    crishim_proto::shim::pid_file::read(&dir.join(paths::SHIM_PID))
}

/// The state letter of a process (`R`, `S`, `Z`…); `None` when there is no such process.
fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// The recorded shim is alive (not a zombie) and is the shim of `dir`: pids get reused. A pid
/// file with a start time names one process only; older ones are matched by command line.
fn is_shim_of(shim: &crishim_proto::shim::pid_file::Recorded, dir: &Path) -> bool {
    let pid = shim.pid;
    if shim.start.is_some() {
        return shim.is_running();
    }
    let Some(state) = process_state(pid) else {
        return false;
    };
    let zombie = state == 'Z';
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    // A whole argument, so that `bundles/a` does not match `bundles/ab`.
    let mut needle = dir.as_os_str().as_encoded_bytes().to_vec();
    needle.push(0);
    !zombie && cmdline.windows(needle.len()).any(|w| w == needle)
}
