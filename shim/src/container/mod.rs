//! The pod's containers, run with libcontainer. All state lives in one [`Shim`], owned by the
//! single-threaded event loop; no borrow of it is ever held across an `.await`.
//!
//! One file per verb, each with its own `impl Shim`: `create` (with the views of the node's
//! mounts a create runs in), `start`, `kill`, `update`, `delete`, `exec`, and `exit` (reaped
//! children, recorded exits); `console` holds the console socket a pty comes over, and `lean`
//! the lean mount namespace that exec, kill, update and delete run in.

mod console;
mod create;
mod delete;
mod exec;
mod exit;
mod kill;
mod lean;
mod start;
mod update;

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crishim_proto::shim::{paths, ContainerState, ErrorKind, Response};
use libcontainer::container::builder::ContainerBuilder;
use nix::sys::wait::WaitStatus;

use crate::exec_seccomp::SeccompExecutor;
use crate::lean_ns::{CreateView, LeanNs};
use crate::logs::LogSink;
use crate::oci_runtime::{CallIo, OciRuntime};
use crate::record::write_atomic;
use console::Console;

pub use delete::delete;
pub use exec::{exec, kill_exec, spawn_exec, ExecIo, Spawned};
pub use exit::{exit_code, wait_exited};

pub struct Ctr {
    pub state: ContainerState,
    pub bundle: PathBuf,
    /// `linux.cgroupsPath` of the bundle, for the OOM counters.
    pub cgroup: String,
    pub log: Rc<LogSink>,
    /// Held open for a later attach; the container sees EOF only when it is closed.
    pub _stdin: Option<OwnedFd>,
    /// Why its process cannot start (its executable is missing): kept from create for start,
    /// which then fails and records the container exited, as runc and containerd do.
    pub start_error: Option<String>,
}

impl Ctr {
    fn new(state: ContainerState, bundle: &Path, cgroup: String, log: Rc<LogSink>) -> Self {
        Ctr {
            state,
            bundle: bundle.to_path_buf(),
            cgroup,
            log,
            _stdin: None,
            start_error: None,
        }
    }
}

pub struct Shim {
    pub dir: PathBuf,
    /// libcontainer's state root.
    pub lc_root: PathBuf,
    /// The pod's external OCI runtime (its RuntimeClass handler names one); `None`: libcontainer.
    pub oci: Option<OciRuntime>,
    /// The pod's infra process while it is our unreaped child; 0 once reaped (or for a bundle).
    pub infra_pid: i32,
    /// A pod's shim (it started an infra process): its containers' `/proc/<pid>/ns/*` paths must
    /// name that process or a running container of ours, see [`Shim::check_namespace_paths`].
    pod: bool,
    /// Run by `crishim bundle run`: the shim lives exactly as long as its one container.
    pub foreground: bool,
    pub containers: HashMap<String, Ctr>,
    /// Exec'd processes waiting for their exit status, by pid.
    pub exec_waiters: HashMap<i32, tokio::sync::oneshot::Sender<WaitStatus>>,
    /// Woken on every reaped container exit.
    pub exited: Rc<tokio::sync::Notify>,
    /// Connections watching for exits (`Request::Watch`).
    pub watchers: Vec<tokio::sync::mpsc::UnboundedSender<ContainerState>>,
    exec_counter: u64,
    /// Built at the first exec, kill or delete, or after the first create made in a view;
    /// `None` inside: it could not be built.
    lean: std::cell::OnceCell<Option<LeanNs>>,
    /// A create's view of the mounts, kept until the lean namespace is built from it.
    pending_view: RefCell<Option<std::fs::File>>,
    /// The view for the pod's first create, built while the shim waits for it.
    spare_view: RefCell<Option<CreateView>>,
    /// Whether a spare view was tried: once per shim.
    spare_tried: std::cell::Cell<bool>,
    /// The kubelet's directory for this pod (from its uid): a create's view keeps it and drops
    /// the other pods' volumes. `None`: the view keeps every pod's volumes.
    pub kubelet_dir: Option<PathBuf>,
    /// The daemon's empty mount namespace, which create views are made from (see
    /// `lean_ns::CreateView::build`); `None`: from a copy of the shim's.
    pub empty_mnt: Option<std::fs::File>,
}

pub type Shared = Rc<RefCell<Shim>>;

/// Where a new container's stdio goes.
pub enum Stdio<'a> {
    /// Pipes (or the pty, with a tty) copied into a CRI log file (none for an empty path); with
    /// `stdin`, a pipe held open for it.
    Log {
        /// Below it, no symlink is followed (see [`LogSink::new`]).
        root: &'a Path,
        path: &'a Path,
        stdin: bool,
        tty: bool,
    },
    /// The shim's own stdin, stdout and stderr (`crishim bundle run`); with a tty, the pty, whose
    /// master the caller relays to its own stdio.
    Inherit { tty: bool },
}

fn internal(what: &str, e: impl std::fmt::Display) -> Response {
    Response::error(ErrorKind::Internal, format!("{what}: {e}"))
}

/// A log file refused for what lies at its path (`logs::refused`) is the caller's to fix.
fn log_error(what: &str, e: std::io::Error) -> Response {
    let kind = match e.kind() {
        std::io::ErrorKind::InvalidInput => ErrorKind::FailedPrecondition,
        _ => ErrorKind::Internal,
    };
    Response::error(kind, format!("{what}: {e}"))
}

fn not_found(id: &str) -> Response {
    Response::error(
        ErrorKind::NotFound,
        format!("container {id:?} not found in this pod's shim"),
    )
}

/// `executor`, applying the SELinux process `label` too (libcontainer applies none); an
/// executor of its own when there is a label and no other.
fn labelled(executor: Option<SeccompExecutor>, label: Option<String>) -> Option<SeccompExecutor> {
    match (executor, label) {
        (Some(e), label) => Some(e.with_label(label)),
        (None, Some(label)) => Some(SeccompExecutor::label_only(label)),
        (None, None) => None,
    }
}

/// The process's stdio for libcontainer: a console socket (which libcontainer reaches through a
/// short symlink of its own), and the given descriptors.
fn with_stdio(
    mut builder: ContainerBuilder,
    console: Option<&Console>,
    io: CallIo,
) -> ContainerBuilder {
    if let Some(console) = console {
        builder = builder.with_console_socket(Some(&console.path));
    }
    if let Some(fd) = io.stdin {
        builder = builder.with_stdin(fd);
    }
    if let Some(fd) = io.stdout {
        builder = builder.with_stdout(fd);
    }
    if let Some(fd) = io.stderr {
        builder = builder.with_stderr(fd);
    }
    builder
}

impl Shim {
    pub fn new(dir: PathBuf, infra_pid: i32) -> Self {
        Shim {
            lc_root: dir.join("runc"),
            oci: None,
            dir,
            infra_pid,
            pod: infra_pid > 0,
            foreground: false,
            containers: HashMap::new(),
            exec_waiters: HashMap::new(),
            exited: Rc::new(tokio::sync::Notify::new()),
            watchers: Vec::new(),
            exec_counter: 0,
            lean: std::cell::OnceCell::new(),
            pending_view: RefCell::new(None),
            spare_view: RefCell::new(None),
            spare_tried: std::cell::Cell::new(false),
            kubelet_dir: None,
            empty_mnt: None,
        }
    }

    fn persist(&self, state: &ContainerState) {
        let path = self.dir.join(paths::state_file(&state.id));
        if let Ok(json) = serde_json::to_vec(state) {
            if let Err(e) = write_atomic(&path, &json) {
                eprintln!("crishim-shim: recording state of {}: {e}", state.id);
            }
        }
    }

    pub fn state(&self, id: &str) -> Response {
        match self.containers.get(id) {
            Some(c) => Response::State(c.state.clone()),
            None => not_found(id),
        }
    }

    pub fn reopen_log(&mut self, id: &str) -> Response {
        let Some(c) = self.containers.get(id) else {
            return not_found(id);
        };
        match c.log.reopen() {
            Ok(()) => Response::Ok,
            Err(e) => log_error(&format!("reopening log of {id}"), e),
        }
    }
}
