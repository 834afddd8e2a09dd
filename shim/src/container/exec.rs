//! Exec: a process started in a running container, with the container's process settings and
//! seccomp filter; `ExecSync` collects its output.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use crishim_proto::shim::{truncate_exec_output, ErrorKind, Response, Status, MAX_EXEC_OUTPUT};
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::fcntl::OFlag;
use nix::sys::wait::WaitStatus;
use tokio::io::AsyncReadExt;

use crate::exec_seccomp::SeccompExecutor;
use crate::logs;
use crate::oci_runtime::CallIo;

use super::console::Console;
use super::{exit_code, internal, labelled, not_found, with_stdio, Shared};

/// The stdio of an exec'd process: pipes given by the caller, or a new pty.
pub enum ExecIo {
    Pipes {
        stdin: Option<OwnedFd>,
        stdout: OwnedFd,
        stderr: OwnedFd,
    },
    Tty,
}

/// A process started in a container: its pid, its exit status once reaped, and the pty master
/// for [`ExecIo::Tty`].
pub struct Spawned {
    pub pid: i32,
    pub exited: tokio::sync::oneshot::Receiver<WaitStatus>,
    pub pty: Option<OwnedFd>,
}

/// Start `args` in the running container `id` with the container's own process settings (user,
/// env, cwd, capabilities) and the command replaced, as `runc exec --process` does.
pub fn spawn_exec(
    shim: &Shared,
    id: &str,
    args: Vec<String>,
    io: ExecIo,
) -> Result<Spawned, Response> {
    let (bundle, lc_root, dir, n) = {
        let mut s = shim.borrow_mut();
        s.exec_counter += 1;
        let n = s.exec_counter;
        match s.containers.get(id) {
            None => return Err(not_found(id)),
            Some(c) if c.state.status != Status::Running => {
                return Err(Response::error(
                    ErrorKind::FailedPrecondition,
                    format!("container {id} is not running"),
                ))
            }
            Some(c) => (c.bundle.clone(), s.lc_root.clone(), s.dir.clone(), n),
        }
    };
    if args.is_empty() {
        return Err(Response::error(
            ErrorKind::InvalidArgument,
            "exec: no command given",
        ));
    }
    let tty = matches!(io, ExecIo::Tty);
    let process_file = bundle.join(format!("exec-{n}.json"));
    let oci = shim.borrow().oci.is_some();
    // An external runtime applies the container's seccomp filter to exec'd processes itself.
    let seccomp = write_exec_process(&bundle, &process_file, args, tty, !oci)?;
    let console = match io {
        ExecIo::Tty => Some(
            Console::bind(&dir, &format!("exec-{n}.console"))
                .map_err(|e| internal("binding the console socket", e))?,
        ),
        ExecIo::Pipes { .. } => None,
    };
    let call_io = match io {
        ExecIo::Pipes {
            stdin,
            stdout,
            stderr,
        } => CallIo {
            stdin,
            stdout: Some(stdout),
            stderr: Some(stderr),
        },
        ExecIo::Tty => CallIo::default(),
    };
    let spawned = {
        let s = shim.borrow();
        match &s.oci {
            Some(oci) => {
                let address = console.as_ref().map(|c| c.address.as_path());
                oci.exec(id, &process_file, address, call_io)
            }
            None => s.in_lean_ns(|| {
                exec_with_libcontainer(
                    id,
                    &lc_root,
                    &process_file,
                    seccomp,
                    console.as_ref(),
                    call_io,
                )
            }),
        }
    };
    let _ = std::fs::remove_file(&process_file);
    let pid = match spawned {
        Ok(pid) => pid,
        // libcontainer's workload errors end in a NUL from the C side; not for a client.
        Err(e) => {
            return Err(Response::error(
                ErrorKind::FailedPrecondition,
                format!("exec in {id}: {e}").replace('\0', ""),
            ))
        }
    };
    // Registered before the next await, so the reaper cannot miss it.
    let (tx, exited) = tokio::sync::oneshot::channel();
    shim.borrow_mut().exec_waiters.insert(pid, tx);
    let pty = match console.map(|c| c.receive()) {
        Some(Ok(fd)) => Some(fd),
        Some(Err(e)) => {
            kill_exec(pid);
            return Err(internal("receiving the exec's pty", e));
        }
        None => None,
    };
    Ok(Spawned { pid, exited, pty })
}

/// Run a process in the container (`ExecSync`): collect stdout and stderr; on timeout kill its whole
/// process group and report it.
pub async fn exec(shim: &Shared, id: &str, args: Vec<String>, timeout: u64) -> Response {
    let pipes = nix::unistd::pipe2(OFlag::O_CLOEXEC)
        .and_then(|o| Ok((o, nix::unistd::pipe2(OFlag::O_CLOEXEC)?)));
    let ((out_r, out_w), (err_r, err_w)) = match pipes {
        Ok(p) => p,
        Err(e) => return internal("creating exec pipes", e),
    };
    let io = ExecIo::Pipes {
        stdin: None,
        stdout: out_w,
        stderr: err_w,
    };
    let Spawned { pid, exited, .. } = match spawn_exec(shim, id, args, io) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let collect = async {
        let (out, err) = tokio::join!(read_all(out_r), read_all(err_r));
        let status = exited.await.ok();
        (out, err, status)
    };
    let result = if timeout == 0 {
        Ok(collect.await)
    } else {
        tokio::time::timeout(Duration::from_secs(timeout), collect).await
    };
    match result {
        Ok((mut stdout, mut stderr, status)) => {
            truncate_exec_output(&mut stdout, &mut stderr);
            Response::Exec {
                exit_code: status.as_ref().and_then(exit_code).unwrap_or(-1),
                stdout,
                stderr,
                timed_out: false,
            }
        }
        Err(_) => {
            kill_exec(pid);
            Response::Exec {
                exit_code: -1,
                stdout: vec![],
                stderr: vec![],
                timed_out: true,
            }
        }
    }
}

/// Kill an exec'd process and its process group (it is a session leader).
pub fn kill_exec(pid: i32) {
    for p in [-pid, pid] {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Start an exec'd process with libcontainer's tenant builder; returns its pid.
fn exec_with_libcontainer(
    id: &str,
    lc_root: &Path,
    process_file: &Path,
    seccomp: Option<SeccompExecutor>,
    console: Option<&Console>,
    io: CallIo,
) -> Result<i32, String> {
    let mut builder = ContainerBuilder::new(id.to_string(), SyscallType::Linux);
    if let Some(executor) = seccomp {
        builder = builder.with_executor(executor);
    }
    with_stdio(builder, console, io)
        .with_root_path(lc_root)
        .map(|b| {
            b.as_tenant()
                .with_process(Some(process_file))
                .with_detach(true)
        })
        .and_then(|t| t.build())
        .map(|pid| pid.as_raw())
        .map_err(|e| e.to_string())
}

/// Write the exec'd process's spec (the container's, with `args`) to `out`, and return the
/// executor that gives it the container's seccomp filter, if the container has one.
/// `args`, run through `crishim-init --exec` when the container's environment has values that
/// are not UTF-8: an exec'd process gets them exactly, as the container's own did.
fn with_raw_env(process: &oci_spec::runtime::Process, args: Vec<String>) -> Vec<String> {
    use crishim_proto::init;
    let carrier = format!("{}=", init::RAW_ENV);
    let raw = process
        .env()
        .as_ref()
        .is_some_and(|env| env.iter().any(|e| e.starts_with(&carrier)));
    if !raw {
        return args;
    }
    [init::PATH, init::EXEC_FLAG, "--"]
        .into_iter()
        .map(str::to_string)
        .chain(args)
        .collect()
}

fn write_exec_process(
    bundle: &Path,
    out: &Path,
    args: Vec<String>,
    tty: bool,
    load_seccomp: bool,
) -> Result<Option<SeccompExecutor>, Response> {
    let spec = oci_spec::runtime::Spec::load(bundle.join("config.json"))
        .map_err(|e| internal(&format!("reading {}/config.json", bundle.display()), e))?;
    let mut process = spec.process().clone().unwrap_or_default();
    process.set_args(Some(with_raw_env(&process, args)));
    process.set_terminal(Some(tty));
    let profile = spec
        .linux()
        .as_ref()
        .and_then(|l| l.seccomp().clone())
        .filter(|_| load_seccomp);
    // The pod's user namespace, which libcontainer's exec path would not join.
    let userns = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .and_then(|ns| {
            ns.iter()
                .find(|n| n.typ() == oci_spec::runtime::LinuxNamespaceType::User)
        })
        .and_then(|n| n.path().clone())
        .filter(|_| load_seccomp);
    let label = process.selinux_label().clone();
    let seccomp = match userns {
        Some(path) => {
            let join = crate::exec_userns::UsernsJoin::prepare(&path, &mut process)
                .map_err(|e| internal("finding the pod's user namespace", e))?;
            Some(SeccompExecutor::for_userns(&process, profile, join))
        }
        None => profile.map(|s| SeccompExecutor::prepare(&mut process, s)),
    };
    let seccomp = labelled(seccomp, label);
    let json = serde_json::to_vec(&process).map_err(|e| internal("encoding exec process", e))?;
    // It carries the container's environment: 0600 from the start.
    crishim_sys::hostfs::write_private(out, &json)
        .map_err(|e| internal(&format!("writing {}", out.display()), e))?;
    Ok(seccomp)
}

/// Read a pipe to EOF, keeping at most what one CRI reply can carry; the rest is drained.
async fn read_all(fd: OwnedFd) -> Vec<u8> {
    const LIMIT: usize = MAX_EXEC_OUTPUT;
    let Ok(mut rx) = logs::FdReader::new(fd) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                let keep = n.min(LIMIT.saturating_sub(out.len()));
                out.extend_from_slice(&buf[..keep]);
            }
        }
    }
}
