//! The pod's containers, run with libcontainer. All state lives in one [`Shim`], owned by the
//! single-threaded event loop; no borrow of it is ever held across an `.await`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use crishim_proto::cgroups_path;
use crishim_proto::shim::{
    paths, truncate_exec_output, ContainerState, ErrorKind, Response, Status, MAX_EXEC_OUTPUT,
    START_ERROR, START_ERROR_EXIT_CODE,
};
use crishim_proto::shown::shown;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::syscall::syscall::SyscallType;

use crate::lean_ns::{self, CreateView, LeanNs, ViewScope, Workspace};
use nix::fcntl::OFlag;
use nix::sys::wait::WaitStatus;
use tokio::io::AsyncReadExt;

use crate::bus::closing_leaked_connections;
use crate::exec_seccomp::SeccompExecutor;
use crate::logs::{self, LogSink};
use crate::oci_runtime::{console_address, CallIo, OciRuntime};
use crate::record::{now_nanos, write_atomic};

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

/// systemd's D-Bus API failing or slow is transient (the kubelet retries `Unavailable`); the
/// rest of the systemd driver's errors are about the request.
fn systemd_error_kind(e: &libcgroups::systemd::manager::SystemdManagerError) -> ErrorKind {
    use libcgroups::systemd::manager::SystemdManagerError as E;
    match e {
        E::SystemdClient(_) | E::WaitForProcessInCgroupTimeout(_) => ErrorKind::Unavailable,
        _ => ErrorKind::InvalidArgument,
    }
}

/// A new container's state, before it starts.
fn created_state(id: &str, pid: i32) -> ContainerState {
    ContainerState::new(id, Status::Created, pid, now_nanos())
}

/// libcontainer checks the executable in the container's init, at create; runc and containerd
/// report a missing or non-executable one when the container starts.
fn is_start_error(message: &str) -> bool {
    [
        "not found in $PATH",
        "does not have correct permissions",
        "failed to check permissions for executable",
    ]
    .iter()
    .any(|m| message.contains(m))
}

fn not_found(id: &str) -> Response {
    Response::error(
        ErrorKind::NotFound,
        format!("container {id:?} not found in this pod's shim"),
    )
}

/// Exit code as a shell reports it: the code, or 128 + the signal.
pub fn exit_code(status: &WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(*code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + *sig as i32),
        _ => None,
    }
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

    fn lean_paths(&self) -> (Vec<PathBuf>, PathBuf) {
        (lean_ns::drop_roots(&self.dir), self.dir.join("lean"))
    }

    /// Build the lean namespace from a create's view, if a create left one and none is built
    /// yet: the server calls this once a reply is on its way, when the shim would be idle.
    pub fn build_lean_from_view(&self) {
        let Some(view) = self.pending_view.borrow_mut().take() else {
            return;
        };
        if self.lean.get().is_some() {
            return;
        }
        let Ok(host) = std::fs::File::open("/proc/thread-self/ns/mnt") else {
            return;
        };
        let (drop, work) = self.lean_paths();
        let must_see = self.lean_must_see();
        match LeanNs::build_from(&view, host, &drop, self.workspace(&work), &must_see) {
            Ok(ns) => {
                let _ = self.lean.set(Some(ns));
            }
            // The first exec, kill or delete builds it from the shim's own namespace instead.
            Err(e) => eprintln!("crishim-shim: {e}"),
        }
    }

    /// Build the view for the pod's first create ahead of it, once, when the shim would be idle:
    /// the daemon runs the pod's CNI ADD and mounts the rootfs before it asks. Not for a pod of an
    /// external OCI runtime, nor a shim outside the daemon's state layout. Whether one was built.
    pub fn prepare_first_view(&self) -> bool {
        if self.spare_tried.replace(true) || self.oci.is_some() || !self.containers.is_empty() {
            return false;
        }
        let (Some(state), Some(keep)) = (lean_ns::state_dir(&self.dir), self.view_keep(None))
        else {
            return false;
        };
        let drops = self.view_drops(&state, &[]);
        let near = self.view_near(&keep, []);
        let scope = ViewScope {
            drop_below: &drops,
            keep: &keep,
            near: Some(&near),
        };
        let work = self.view_work();
        let view = CreateView::build(scope, self.workspace(&work));
        let built = view.is_some();
        *self.spare_view.borrow_mut() = view;
        built
    }

    /// Let go of a spare view no create took: one too old to be used gains the node's new mounts.
    pub fn drop_spare_view(&self) {
        self.spare_view.borrow_mut().take();
    }

    /// What a create's view keeps below the roots it drops: the pod's directory, its network
    /// namespace, its files' tmpfs, its kubelet directory and, when known, the container's bundle.
    fn view_keep(&self, bundle: Option<&Path>) -> Option<Vec<PathBuf>> {
        let state = lean_ns::state_dir(&self.dir)?;
        let pod = self.dir.file_name()?;
        let mut keep = vec![
            self.dir.clone(),
            state.join("netns").join(pod),
            state.join(paths::POD_FILES).join(pod),
        ];
        keep.extend(self.kubelet_dir.clone());
        keep.extend(bundle.map(Path::to_path_buf));
        Some(keep)
    }

    /// What a create reads on the node, `reads` besides: its pod's and bundle's directories
    /// (`keep`), libcontainer's state and [`lean_ns::CREATE_NEEDS`]. A path through a link
    /// counts with where it leads (`/etc/resolv.conf` into `/run`, say).
    fn view_near(
        &self,
        keep: &[PathBuf],
        reads: impl IntoIterator<Item = PathBuf>,
    ) -> Vec<PathBuf> {
        let mut near = keep.to_vec();
        near.push(self.lc_root.clone());
        near.extend(lean_ns::CREATE_NEEDS.map(PathBuf::from));
        for path in reads {
            let real = std::fs::canonicalize(&path).ok().filter(|r| *r != path);
            near.push(path);
            near.extend(real);
        }
        near
    }

    /// Below which roots a create's view drops mounts, for a container binding `sources`.
    fn view_drops(&self, state: &Path, sources: &[PathBuf]) -> Vec<PathBuf> {
        lean_ns::create_view_drops(state, self.kubelet_dir.is_some(), sources)
    }

    /// Where the shim builds a namespace in `dir` (see [`Workspace`]).
    fn workspace<'a>(&'a self, dir: &'a Path) -> Workspace<'a> {
        Workspace {
            dir,
            empty: self.empty_mnt.as_ref(),
        }
    }

    fn view_work(&self) -> PathBuf {
        self.dir.join("create-view")
    }

    fn lean_must_see(&self) -> [&Path; 3] {
        [
            self.dir.as_path(),
            Path::new("/proc/self"),
            Path::new("/sys/fs/cgroup"),
        ]
    }

    /// Run a libcontainer call that needs none of the pods' mounts (exec, kill, delete) in the
    /// lean mount namespace (`lean_ns`), where its cgroup lookups do not read every pod's mounts.
    /// Where that namespace cannot be built, the call runs in the shim's own.
    fn in_lean_ns<T>(&self, f: impl FnOnce() -> T) -> T {
        let lean = self.lean.get_or_init(|| {
            let (drop, work) = self.lean_paths();
            match LeanNs::build(&drop, self.workspace(&work), &self.lean_must_see()) {
                Ok(ns) => Some(ns),
                Err(e) => {
                    eprintln!(
                        "crishim-shim: {e}; exec, kill and delete stay in the shim's namespace"
                    );
                    None
                }
            }
        });
        match lean {
            Some(ns) => ns.enter(f),
            None => f(),
        }
    }

    /// Keep a created container, recorded on disk first.
    fn insert_created(&mut self, ctr: Ctr) {
        self.persist(&ctr.state);
        self.containers.insert(ctr.state.id.clone(), ctr);
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

    /// Create a container (it does not run yet). With [`Stdio::Inherit`] and a tty, the pty's
    /// master is returned for the caller to relay. With `start_error_at_start`, a command that
    /// cannot be executed fails the start rather than the create (see `Ctr::start_error`).
    pub fn create(
        &mut self,
        id: &str,
        bundle: &Path,
        stdio: Stdio<'_>,
        start_error_at_start: bool,
    ) -> Result<Option<OwnedFd>, Response> {
        if self.containers.contains_key(id) {
            return Err(Response::error(
                ErrorKind::AlreadyExists,
                format!("container {id:?} already exists"),
            ));
        }
        let cgroup = cgroups_path(bundle).unwrap_or_default();
        let (log_root, log_path, stdin, tty) = match stdio {
            Stdio::Log {
                root,
                path,
                stdin,
                tty,
            } => (root, path, stdin, tty),
            // No log file: the container writes to the shim's own stdout and stderr.
            Stdio::Inherit { tty } => (Path::new(""), Path::new(""), false, tty),
        };
        let log = match LogSink::new(log_root.to_path_buf(), log_path.to_path_buf()) {
            Ok(l) => Rc::new(l),
            Err(e) => {
                return Err(log_error(
                    &format!("opening log file {}", log_path.display()),
                    e,
                ))
            }
        };
        // With a tty the container's stdio is the pty, whose master the runtime sends us over a
        // console socket; otherwise three pipes, or nothing to do when the container inherits ours.
        let console = if tty {
            match Console::bind(&self.dir, &format!("{id}.console")) {
                Ok(c) => Some(c),
                Err(e) => return Err(internal("binding the console socket", e)),
            }
        } else {
            None
        };
        let inherit = matches!(stdio, Stdio::Inherit { .. });
        let mut outputs = Vec::new();
        let mut stdin_w = None;
        let mut io = CallIo::default();
        if console.is_none() && !inherit {
            let pipes = (|| -> nix::Result<_> {
                let out = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
                let err = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
                let inp = if stdin {
                    Some(nix::unistd::pipe2(OFlag::O_CLOEXEC)?)
                } else {
                    None
                };
                Ok((out, err, inp))
            })();
            let ((out_r, out_w), (err_r, err_w), inp) = match pipes {
                Ok(p) => p,
                Err(e) => return Err(internal("creating stdio pipes", e)),
            };
            io.stdout = Some(out_w);
            io.stderr = Some(err_w);
            if let Some((r, w)) = inp {
                io.stdin = Some(r);
                stdin_w = Some(w);
            }
            outputs = vec![(out_r, "stdout"), (err_r, "stderr")];
        }
        let systemd = cgroups_path::is_systemd(&cgroup);
        let created = match &self.oci {
            Some(oci) => oci_spec::runtime::Spec::load(bundle.join("config.json"))
                .map_err(|e| format!("reading {}/config.json: {e}", bundle.display()))
                .and_then(|spec| self.check_namespace_paths(&spec))
                .and_then(|()| {
                    oci.create(
                        id,
                        bundle,
                        console.as_ref().map(|c| c.address.as_path()),
                        io,
                    )
                    .inspect_err(|_| {
                        // A half-created container may have left state behind; remove it.
                        let _ = oci.delete(id);
                    })
                }),
            // A pod's container loads its seccomp program compiled once per node; a plain
            // bundle's (`crishim bundle`) is left to libcontainer, the reference path.
            None => {
                self.create_with_libcontainer(id, bundle, systemd, console.as_ref(), io, !inherit)
            }
        };
        let pid = match created {
            Ok(pid) => pid,
            Err(full) => {
                drop(console);
                // It quotes the command, which a request sizes: cut, as every echoed name is.
                let message = shown(&full).into_owned();
                if !(start_error_at_start && is_start_error(&full)) {
                    return Err(Response::error(
                        ErrorKind::FailedPrecondition,
                        format!("creating container {id}: {message}"),
                    ));
                }
                // Created with nothing to run; start then fails (exit 128, StartError).
                let mut ctr = Ctr::new(created_state(id, 0), bundle, cgroup, log);
                ctr.start_error = Some(message);
                self.insert_created(ctr);
                return Ok(None);
            }
        };
        let mut relay = None;
        if let Some(console) = console {
            match console.receive() {
                Ok(fd) if inherit => relay = Some(fd),
                Ok(fd) => match nix::unistd::dup(fd.as_raw_fd()) {
                    // One end for the log, one kept for stdin.
                    Ok(dup) => {
                        // SAFETY: dup returned a fresh descriptor that we now own.
                        stdin_w =
                            Some(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(dup) });
                        outputs.push((fd, "stdout"));
                    }
                    Err(_) => outputs.push((fd, "stdout")),
                },
                Err(e) => eprintln!("crishim-shim: {id}: no pty from the container: {e}"),
            }
        }
        for (fd, stream) in outputs {
            tokio::task::spawn_local(logs::copy(fd, stream, log.clone()));
        }
        let mut ctr = Ctr::new(created_state(id, pid), bundle, cgroup, log);
        ctr._stdin = stdin_w;
        self.insert_created(ctr);
        Ok(relay)
    }

    /// A pod's container joins namespaces by `/proc/<pid>/ns/*` paths: each pid must be our
    /// infra process or a running container's init, still our unreaped children. Their pids
    /// cannot be reused until we reap them, and we reap only between awaits, never during the
    /// synchronous create that opens the paths; so a path checked here names the pod's
    /// namespace when it is opened. Once reaped (`infra_pid` 0, or the container `Exited`), the
    /// pid may be any process's, the host's own included: refused.
    fn check_namespace_paths(&self, spec: &oci_spec::runtime::Spec) -> Result<(), String> {
        if !self.pod {
            return Ok(());
        }
        let paths = spec
            .linux()
            .as_ref()
            .and_then(|l| l.namespaces().as_ref())
            .into_iter()
            .flatten()
            .filter_map(|n| n.path().clone());
        for path in paths {
            let Some(pid) = proc_pid(&path) else {
                continue;
            };
            let ours = (pid == self.infra_pid && pid > 0)
                || self
                    .containers
                    .values()
                    .any(|c| c.state.pid == pid && c.state.status != Status::Exited);
            if !ours {
                return Err(format!(
                    "namespace {}: pid {pid} is neither the pod's infra process nor a running \
                     container of the pod (it exited; the pod must be recreated)",
                    path.display()
                ));
            }
        }
        Ok(())
    }

    /// Create with libcontainer, in this process; returns the init's pid.
    fn create_with_libcontainer(
        &self,
        id: &str,
        bundle: &Path,
        systemd: bool,
        console: Option<&Console>,
        io: CallIo,
        cached_seccomp: bool,
    ) -> Result<i32, String> {
        let mut builder = ContainerBuilder::new(id.to_string(), SyscallType::Linux);
        let own_bundle = bundle.to_path_buf();
        let mut bundle = bundle.to_path_buf();
        let spec = oci_spec::runtime::Spec::load(bundle.join("config.json"))
            .map_err(|e| format!("reading {}/config.json: {e}", bundle.display()))?;
        self.check_namespace_paths(&spec)?;
        let propagates_back = shares_mounts_with_the_node(&spec);
        // What the container's mounts are made from: each must be the same file in a view.
        let seen_sources = mount_sources(&spec, &own_bundle);
        // What else it reads on the node; a create running hooks, or talking to systemd, may
        // read anything.
        let reads = (!systemd).then(|| node_paths_read(&spec)).flatten();
        // The SELinux process label, which libcontainer does not apply: the executor does.
        let label = spec
            .process()
            .as_ref()
            .and_then(|p| p.selinux_label().clone());
        let mut spec = spec;
        let cached = if cached_seccomp {
            init_with_cached_seccomp(&bundle, &mut spec)?
        } else {
            None
        };
        let executor = match cached {
            Some((init_bundle, executor)) => {
                bundle = init_bundle;
                Some(executor)
            }
            // libcontainer loads the filter itself: it must read the profile as runc does.
            None => {
                if let Some(init_bundle) = init_in_libcontainer_order(&bundle, spec)? {
                    bundle = init_bundle;
                }
                None
            }
        };
        if let Some(executor) = labelled(executor, label) {
            builder = builder.with_executor(executor);
        }
        builder = with_stdio(builder, console, io);
        // libcontainer creates its root (and each container's directory in it, holding its
        // state and notify socket) with 0755; the root is made first, root's alone.
        crishim_proto::hostfs::create_private_dir(&self.lc_root)
            .map_err(|e| format!("creating {}: {e}", self.lc_root.display()))?;
        let build = || {
            builder
                .with_root_path(&self.lc_root)
                .and_then(|b| b.validate_id())
                .and_then(|b| {
                    b.as_init(&bundle)
                        .with_systemd(systemd)
                        .with_detach(true)
                        .build()
                })
        };
        // A container whose mounts propagate back to the node needs the node's own namespace
        // (the view's mounts are slaves); so does a shim outside the daemon's state layout.
        let spare = self.spare_view.borrow_mut().take();
        let state_dir = lean_ns::state_dir(&self.dir).filter(|_| !propagates_back);
        let built = match (state_dir, self.view_keep(Some(&own_bundle))) {
            (Some(state), Some(keep)) => {
                let drops = self.view_drops(&state, &seen_sources);
                let near =
                    reads.map(|r| self.view_near(&keep, seen_sources.iter().cloned().chain(r)));
                let mut same = vec![own_bundle.clone(), self.lc_root.clone()];
                // The pod files' tmpfs, mounted while the shim started: a view built before it
                // gains it (a mount root in `same` is attached where the view lacks it).
                let pod_files = self
                    .dir
                    .file_name()
                    .map(|pod| state.join(paths::POD_FILES).join(pod));
                same.extend(pod_files.filter(|p| p.is_dir()));
                same.extend(seen_sources);
                let scope = ViewScope {
                    drop_below: &drops,
                    keep: &keep,
                    near: near.as_deref(),
                };
                let work = self.view_work();
                let (built, view) =
                    lean_ns::with_create_view(spare, scope, self.workspace(&work), &same, build);
                if view.is_some() {
                    // For a person (and the tests) asking why a container sees the mounts it does.
                    eprintln!("crishim-shim: created {id} in a view of the node's mounts");
                }
                if self.lean.get().is_none() {
                    *self.pending_view.borrow_mut() = view;
                }
                built
            }
            _ => build(),
        };
        match built {
            Ok(c) => {
                // Its state and config (hooks with their env) become root's alone.
                crishim_proto::hostfs::tighten_dir_and_files(&self.lc_root.join(id), |_, _| {});
                Ok(c.pid().map_or(0, |p| p.as_raw()))
            }
            Err(e) => {
                // A half-created container may have left state behind; remove it.
                closing_leaked_connections(|| {
                    if let Ok(mut c) = Container::load(self.lc_root.join(id)) {
                        let _ = c.delete(true);
                    }
                });
                let _ = std::fs::remove_dir_all(self.lc_root.join(id));
                Err(e.to_string())
            }
        }
    }

    pub fn start(&mut self, id: &str) -> Response {
        let Some(c) = self.containers.get(id) else {
            return not_found(id);
        };
        if c.state.status != Status::Created {
            return Response::error(
                ErrorKind::FailedPrecondition,
                format!(
                    "container {id} is {:?}, only a created container can start",
                    c.state.status
                ),
            );
        }
        if let Some(e) = c.start_error.clone() {
            return self.fail_start(id, e);
        }
        let started = match &self.oci {
            Some(oci) => oci.start(id),
            None => closing_leaked_connections(|| {
                Container::load(self.lc_root.join(id)).and_then(|mut lc| lc.start())
            })
            .map_err(|e| e.to_string()),
        };
        if let Err(e) = started {
            return Response::error(
                ErrorKind::FailedPrecondition,
                format!("starting container {id}: {e}"),
            );
        }
        let c = self.containers.get_mut(id).expect("checked above");
        // It may already have exited and been reaped in between; keep that.
        if c.state.status == Status::Created {
            c.state.status = Status::Running;
        }
        c.state.started_at = now_nanos();
        let state = c.state.clone();
        self.persist(&state);
        Response::State(state)
    }

    /// Record a container whose process could not start as exited, and answer with that state.
    fn fail_start(&mut self, id: &str, message: String) -> Response {
        let Some(c) = self.containers.get_mut(id) else {
            return not_found(id);
        };
        c.start_error = None;
        c.state.status = Status::Exited;
        c.state.exit_code = START_ERROR_EXIT_CODE;
        c.state.finished_at = now_nanos();
        c.state.reason = START_ERROR.into();
        c.state.message = message;
        let state = c.state.clone();
        self.record_exit(&state);
        Response::State(state)
    }

    /// An exit, recorded on disk, then told to waiters and to every `Watch` stream.
    fn record_exit(&mut self, state: &ContainerState) {
        self.persist(state);
        self.exited.notify_waiters();
        self.watchers.retain(|w| w.send(state.clone()).is_ok());
    }

    pub fn kill(&mut self, id: &str, signal: i32, all: bool) -> Response {
        let Some(c) = self.containers.get(id) else {
            return not_found(id);
        };
        // Created with no process (see `start_error`): signalled, it will never run, so it is
        // recorded exited now (else a stop would wait for an exit that cannot come).
        if let Some(e) = c.start_error.clone() {
            self.fail_start(id, e);
            return Response::Ok;
        }
        if c.state.status == Status::Exited || c.state.pid == 0 {
            return Response::Ok;
        }
        if let Some(oci) = &self.oci {
            if !(1..=64).contains(&signal) {
                return Response::error(
                    ErrorKind::InvalidArgument,
                    format!("signal {signal} is not a signal number"),
                );
            }
            return match oci.kill(id, signal, all) {
                Ok(()) => Response::Ok,
                // Exited between our check and the kill: nothing left to signal.
                Err(_) if !oci.knows(id) || !pid_alive(c.state.pid) => Response::Ok,
                Err(e) => internal(&format!("signalling container {id}"), e),
            };
        }
        let sig = match libcontainer::signal::Signal::try_from(signal) {
            Ok(s) => s,
            Err(e) => {
                return Response::error(ErrorKind::InvalidArgument, format!("signal {signal}: {e}"))
            }
        };
        let kill = || {
            closing_leaked_connections(|| {
                Container::load(self.lc_root.join(id)).and_then(|mut lc| lc.kill(sig, all))
            })
        };
        // Only a kill of all processes looks up the cgroups.
        let killed = if all { self.in_lean_ns(kill) } else { kill() };
        match killed {
            Ok(()) => Response::Ok,
            // Exited between our check and the kill: nothing left to signal.
            Err(libcontainer::error::LibcontainerError::IncorrectStatus(_)) => Response::Ok,
            Err(e) => internal(&format!("signalling container {id}"), e),
        }
    }

    /// New cgroup limits for a live container (`UpdateContainerResources`).
    pub fn update(&mut self, id: &str, resources: &oci_spec::runtime::LinuxResources) -> Response {
        use libcgroups::common::{
            create_cgroup_manager, AnyManagerError, CgroupConfig, CgroupManager, ControllerOpt,
            CreateCgroupSetupError,
        };
        let Some(c) = self.containers.get(id) else {
            return not_found(id);
        };
        if c.state.status == Status::Exited {
            return Response::error(
                ErrorKind::FailedPrecondition,
                format!("container {id} has exited"),
            );
        }
        let config = CgroupConfig {
            cgroup_path: PathBuf::from(&c.cgroup),
            systemd_cgroup: cgroups_path::is_systemd(&c.cgroup),
            container_name: id.to_string(),
        };
        let opt = ControllerOpt {
            resources,
            disable_oom_killer: false,
            oom_score_adj: None,
            freezer_state: None,
        };
        let applied = self.in_lean_ns(|| {
            closing_leaked_connections(|| match create_cgroup_manager(config) {
                Ok(m) => m.apply(&opt).map_err(|e| {
                    let kind = match &e {
                        AnyManagerError::Systemd(e) => systemd_error_kind(e),
                        _ => ErrorKind::InvalidArgument,
                    };
                    (kind, e.to_string())
                }),
                Err(e) => Err((
                    match &e {
                        CreateCgroupSetupError::Systemd(e) => systemd_error_kind(e),
                        _ => ErrorKind::InvalidArgument,
                    },
                    e.to_string(),
                )),
            })
        });
        match applied {
            Ok(()) => Response::Ok,
            Err((kind, e)) => Response::error(kind, format!("updating resources of {id}: {e}")),
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

    /// Record a reaped child: a container's init, an exec'd process, or an orphan.
    pub fn on_exit(&mut self, status: WaitStatus) {
        let Some(pid) = status.pid().map(|p| p.as_raw()) else {
            return;
        };
        if pid == self.infra_pid {
            eprintln!("crishim-shim: infra process {pid} exited: {status:?}");
            self.infra_pid = 0;
            return;
        }
        if let Some(tx) = self.exec_waiters.remove(&pid) {
            let _ = tx.send(status);
            return;
        }
        let Some(code) = exit_code(&status) else {
            return;
        };
        let hit = self
            .containers
            .values_mut()
            .find(|c| c.state.pid == pid && c.state.status != Status::Exited);
        if let Some(c) = hit {
            c.state.status = Status::Exited;
            c.state.exit_code = code;
            c.state.finished_at = now_nanos();
            // Any OOM kill in the container's cgroup, as containerd reports it: the killed
            // process is often a child, and the init then exits with its status.
            c.state.oom_killed = oom_killed(&c.cgroup);
            let state = c.state.clone();
            self.record_exit(&state);
        }
    }
}

/// Stop (SIGKILL every process) and remove a container's runtime state and cgroup. Idempotent.
pub async fn delete(shim: &Shared, id: &str) -> Response {
    let running = match shim.borrow().containers.get(id) {
        None => return Response::Ok,
        Some(c) => c.state.status != Status::Exited && c.state.pid != 0,
    };
    if running {
        let _ = shim.borrow_mut().kill(id, libc::SIGKILL, true);
        wait_exited(shim, id, Duration::from_secs(10)).await;
    }
    {
        let s = shim.borrow();
        if let Some(oci) = &s.oci {
            if let Err(e) = oci.delete(id) {
                if oci.knows(id) {
                    return internal(&format!("deleting container {id}"), e);
                }
            }
        }
    }
    let root = shim.borrow().lc_root.join(id);
    if root.exists() {
        let delete = || {
            closing_leaked_connections(|| {
                Container::load(root.clone()).and_then(|mut lc| lc.delete(true))
            })
        };
        // Poststop hooks run with the shim's own view of the mounts.
        let hooks = libcontainer::config::YoukiConfig::load(&root)
            .map_or(true, |c| c.hooks.is_some_and(|h| h.poststop().is_some()));
        let deleted = if hooks {
            delete()
        } else {
            shim.borrow().in_lean_ns(delete)
        };
        if let Err(e) = deleted {
            eprintln!("crishim-shim: libcontainer delete {id}: {e}");
            let _ = std::fs::remove_dir_all(&root);
        }
    }
    let mut s = shim.borrow_mut();
    let _ = std::fs::remove_file(s.dir.join(paths::state_file(id)));
    s.containers.remove(id);
    Response::Ok
}

/// Wait until the container has been reaped, or the timeout passes.
pub async fn wait_exited(shim: &Shared, id: &str, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let notify = shim.borrow().exited.clone();
        let notified = notify.notified();
        match shim.borrow().containers.get(id) {
            None => return true,
            Some(c) if c.state.status == Status::Exited => return true,
            _ => {}
        }
        // Also poll: a process that vanished without a SIGCHLD to us (re-parented) still ends the wait.
        if tokio::time::timeout_at(
            deadline.min(tokio::time::Instant::now() + Duration::from_millis(200)),
            notified,
        )
        .await
        .is_err()
            && tokio::time::Instant::now() >= deadline
        {
            return false;
        }
    }
}

/// Run a process in the container (`ExecSync`): collect stdout and stderr; on timeout kill its whole
/// process group and report it.
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

/// Kill an exec'd process and its process group (it is a session leader).
pub fn kill_exec(pid: i32) {
    for p in [-pid, pid] {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

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

/// `executor`, applying the SELinux process `label` too (libcontainer applies none); an
/// executor of its own when there is a label and no other.
fn labelled(executor: Option<SeccompExecutor>, label: Option<String>) -> Option<SeccompExecutor> {
    match (executor, label) {
        (Some(e), label) => Some(e.with_label(label)),
        (None, Some(label)) => Some(SeccompExecutor::label_only(label)),
        (None, None) => None,
    }
}

/// Write the exec'd process's spec (the container's, with `args`) to `out`, and return the
/// executor that gives it the container's seccomp filter, if the container has one.
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
    process.set_args(Some(args));
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
    crishim_proto::hostfs::write_private(out, &json)
        .map_err(|e| internal(&format!("writing {}", out.display()), e))?;
    Ok(seccomp)
}

/// The pid of a `/proc/<pid>/…` path; `None` for any other path (a pinned nsfs file).
fn proc_pid(path: &Path) -> Option<i32> {
    let mut parts = path.components();
    if parts.next() != Some(std::path::Component::RootDir) {
        return None;
    }
    if parts.next()?.as_os_str() != "proc" {
        return None;
    }
    let pid = parts.next()?.as_os_str().to_str()?;
    // `self`, `thread-self`: our own, named by no pid. A number is anyone's (too long: no one's).
    let digits = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| pid.parse().unwrap_or(-1))
}

/// The node's paths a create reads besides its bundle and its binds' sources: the namespaces it
/// joins and the devices it may bind. `None` for a spec with hooks, which may read anything.
fn node_paths_read(spec: &oci_spec::runtime::Spec) -> Option<Vec<PathBuf>> {
    if spec.hooks().is_some() {
        return None;
    }
    let linux = spec.linux().as_ref();
    let namespaces = linux
        .and_then(|l| l.namespaces().as_ref())
        .into_iter()
        .flatten()
        .filter_map(|n| n.path().clone());
    let devices = linux
        .and_then(|l| l.devices().as_ref())
        .into_iter()
        .flatten()
        .map(|d| d.path().clone());
    Some(namespaces.chain(devices).collect())
}

/// The rootfs and the sources of the spec's bind mounts, relative ones taken from the bundle.
fn mount_sources(spec: &oci_spec::runtime::Spec, bundle: &Path) -> Vec<PathBuf> {
    let is_bind = |m: &oci_spec::runtime::Mount| {
        m.typ().as_deref() == Some("bind")
            || m.options()
                .iter()
                .flatten()
                .any(|o| o == "bind" || o == "rbind")
    };
    let binds = spec
        .mounts()
        .iter()
        .flatten()
        .filter(|m| is_bind(m))
        .filter_map(|m| m.source().clone());
    spec.root()
        .as_ref()
        .map(|r| r.path().clone())
        .into_iter()
        .chain(binds)
        .map(|p| bundle.join(p))
        .collect()
}

/// Whether a container's mounts propagate back to the node (a Bidirectional volume, or a shared
/// root propagation): those must be peers of the node's mounts.
fn shares_mounts_with_the_node(spec: &oci_spec::runtime::Spec) -> bool {
    let shared = |o: &str| o == "shared" || o == "rshared";
    spec.mounts()
        .iter()
        .flatten()
        .any(|m| m.options().iter().flatten().any(|o| shared(o)))
        || spec
            .linux()
            .as_ref()
            .and_then(|l| l.rootfs_propagation().as_deref())
            .is_some_and(shared)
}

/// Where a container's init loads its seccomp program compiled once (`seccomp_program`) rather
/// than having libcontainer compile it: a copy of the bundle's config (`<bundle>/init-config/config.json`,
/// root's alone) without `linux.seccomp`, its root made absolute, and the executor that loads
/// the program last before `execve` (gaining, then dropping, what loading needs, as for an
/// exec'd process). `None` leaves the container to libcontainer: no profile, a notify profile, a
/// profile that may refuse the `capset`/`prctl` the drop back needs (libcontainer loads such a
/// filter before the drop, as runc does), or a relative bind source. There, libcontainer loads
/// the filter from [`init_in_libcontainer_order`]'s copy.
fn init_with_cached_seccomp(
    bundle: &Path,
    spec: &mut oci_spec::runtime::Spec,
) -> Result<Option<(PathBuf, SeccompExecutor)>, String> {
    let Some(seccomp) = spec.linux().as_ref().and_then(|l| l.seccomp().clone()) else {
        return Ok(None);
    };
    let relative_source = spec.mounts().iter().flatten().any(|m| {
        m.source()
            .as_ref()
            .is_some_and(|s| s.is_relative() && m.typ().as_deref() == Some("bind"))
    });
    if relative_source {
        return Ok(None);
    }
    let mut process = spec.process().clone().unwrap_or_default();
    let executor = SeccompExecutor::prepare(&mut process, seccomp);
    if !executor.has_program() || !executor.can_drop_back() {
        return Ok(None);
    }
    let mut spec = spec.clone();
    spec.set_process(Some(process));
    if let Some(mut linux) = spec.linux().clone() {
        linux.set_seccomp(None);
        spec.set_linux(Some(linux));
    }
    Ok(Some((write_init_config(bundle, spec)?, executor)))
}

/// Where libcontainer loads a container init's filter itself (no cached program, or `crishim
/// bundle run`): a copy of the bundle's config as [`init_with_cached_seccomp`] writes it, with
/// the profile's `SCMP_CMP_MASKED_EQ` operands swapped into libcontainer's reading
/// (`seccomp_program::for_libcontainer`), so that the bundle's `config.json` means what it
/// says to runc. `None`: no masked comparison, the bundle is read as it is. Relative bind
/// sources stay as they are (libcontainer resolves them from its working directory, wherever
/// the config lies).
fn init_in_libcontainer_order(
    bundle: &Path,
    mut spec: oci_spec::runtime::Spec,
) -> Result<Option<PathBuf>, String> {
    let Some(mut linux) = spec.linux().clone() else {
        return Ok(None);
    };
    let Some(translated) = linux
        .seccomp()
        .as_ref()
        .and_then(crate::seccomp_program::for_libcontainer)
    else {
        return Ok(None);
    };
    linux.set_seccomp(Some(translated));
    spec.set_linux(Some(linux));
    write_init_config(bundle, spec).map(Some)
}

/// Write `spec`, its root made absolute, to `<bundle>/init-config/config.json` (root's alone);
/// that directory, the bundle libcontainer is handed.
fn write_init_config(bundle: &Path, mut spec: oci_spec::runtime::Spec) -> Result<PathBuf, String> {
    if let Some(root) = spec.root().clone() {
        if root.path().is_relative() {
            let mut root = root;
            root.set_path(bundle.join(root.path()));
            spec.set_root(Some(root));
        }
    }
    let dir = bundle.join("init-config");
    let json = serde_json::to_vec(&spec).map_err(|e| format!("encoding the init config: {e}"))?;
    crishim_proto::hostfs::create_private_dir(&dir)
        .and_then(|()| crishim_proto::hostfs::write_private(&dir.join("config.json"), &json))
        .map_err(|e| format!("writing {}/config.json: {e}", dir.display()))?;
    Ok(dir)
}

/// A console socket, bound in the shim's directory, over which the runtime sends a new pty's
/// master. Its file goes when it is dropped.
struct Console {
    listener: std::os::unix::net::UnixListener,
    path: PathBuf,
    /// An address short enough for a socket, whatever the directory's path (see
    /// [`console_address`]); valid while `_dir` is open.
    address: PathBuf,
    _dir: OwnedFd,
}

impl Console {
    fn bind(dir: &Path, name: &str) -> std::io::Result<Self> {
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        // Bound through our directory's descriptor, as the full path may be too long for a
        // socket address.
        let (dir_fd, short) = paths::short_socket_path(dir, name)?;
        let listener = std::os::unix::net::UnixListener::bind(short)?;
        Ok(Console {
            listener,
            path,
            address: console_address(&dir_fd, name),
            _dir: dir_fd,
        })
    }

    fn receive(&self) -> Result<OwnedFd, String> {
        receive_pty(&self.listener)
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether `pid` is a live (not yet reaped, not zombie) process.
fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Receive the pty master that the container's init sends over the console socket.
fn receive_pty(listener: &std::os::unix::net::UnixListener) -> Result<OwnedFd, String> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => return Err(format!("accepting the console connection: {e}")),
        }
    };
    conn.set_nonblocking(false).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut name = [0u8; 64];
    let mut iov = [std::io::IoSliceMut::new(&mut name)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| format!("receiving the pty: {e}"))?;
    for cmsg in msg.cmsgs().map_err(|e| e.to_string())? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            if let Some(&fd) = fds.first() {
                // SAFETY: the kernel installed this descriptor for us.
                return Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
            }
        }
    }
    Err("the console message carried no descriptor".into())
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

fn cgroups_path(bundle: &Path) -> Option<String> {
    let raw = std::fs::read(bundle.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&raw).ok()?;
    v.pointer("/linux/cgroupsPath")?
        .as_str()
        .map(str::to_string)
}

/// Did the kernel's OOM killer act in this cgroup? (v2 `memory.events`, v1 `memory.oom_control`.)
fn oom_killed(cgroup: &str) -> bool {
    let Some(dir) = cgroups_path::dir(cgroup) else {
        return false;
    };
    if dir.is_empty() || dir.contains("..") {
        return false;
    }
    let rel = dir.trim_start_matches('/');
    let candidates = [
        format!("/sys/fs/cgroup/{rel}/memory.events"),
        format!("/sys/fs/cgroup/memory/{rel}/memory.oom_control"),
    ];
    candidates.iter().any(|p| {
        std::fs::read_to_string(p).is_ok_and(|text| {
            text.lines().any(|l| {
                l.strip_prefix("oom_kill ")
                    .is_some_and(|n| n.trim().parse::<u64>().unwrap_or(0) > 0)
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A create's view keeps what its spec reads on the node, and where a link there leads: a
    /// bind of `/etc/resolv.conf` reads a file in `/run` on many nodes.
    #[test]
    fn a_view_keeps_what_the_spec_reads_and_where_its_links_lead() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real/resolv.conf");
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(&target, "").unwrap();
        let link = dir.path().join("resolv.conf");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let spec: oci_spec::runtime::Spec = serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "linux": {
                "namespaces": [{"type": "network", "path": "/run/netns/p1"}, {"type": "pid"}],
                "devices": [{"type": "c", "path": "/dev/nvidia0", "major": 195, "minor": 0}]
            }
        }))
        .unwrap();
        let reads = node_paths_read(&spec).unwrap();
        assert_eq!(
            reads,
            [
                PathBuf::from("/run/netns/p1"),
                PathBuf::from("/dev/nvidia0")
            ]
        );
        let shim = Shim::new(dir.path().join("pod"), 0);
        let near = shim.view_near(&[dir.path().join("pod")], [link.clone()]);
        for p in [&link, &target.canonicalize().unwrap(), &shim.lc_root] {
            assert!(near.contains(p), "{} not kept: {near:?}", p.display());
        }
        assert!(near.contains(&PathBuf::from("/sys/fs/cgroup")));

        // Hooks may read anything: no scope.
        let hooked: oci_spec::runtime::Spec = serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "hooks": {"createRuntime": [{"path": "/usr/bin/true"}]}
        }))
        .unwrap();
        assert_eq!(node_paths_read(&hooked), None);
    }

    fn joining(paths: &[&str]) -> oci_spec::runtime::Spec {
        let ns: Vec<_> = ["network", "ipc", "uts", "pid"]
            .iter()
            .zip(paths)
            .map(|(t, p)| serde_json::json!({"type": t, "path": p}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "linux": {"namespaces": ns}
        }))
        .unwrap()
    }

    /// The daemon's `/proc/<pid>/ns/*` paths name our unreaped infra process or a running
    /// container of ours, or the create is refused: once reaped, the pid may be anyone's.
    #[test]
    fn a_create_joins_only_the_namespaces_of_our_unreaped_children() {
        let dir = tempfile::tempdir().unwrap();
        let mut shim = Shim::new(dir.path().join("pod"), 4242);
        let infra = joining(&[
            "/proc/4242/ns/net",
            "/proc/4242/ns/ipc",
            "/proc/4242/ns/uts",
        ]);
        shim.check_namespace_paths(&infra).unwrap();
        // A pinned namespace names itself; `/proc/self` is no pid.
        shim.check_namespace_paths(&joining(&["/run/netns/p1", "/proc/self/ns/ipc"]))
            .unwrap();
        let other = joining(&["/proc/4242/ns/net", "/proc/4243/ns/ipc"]);
        let e = shim.check_namespace_paths(&other).unwrap_err();
        assert!(
            e.contains("/proc/4243/ns/ipc") && e.contains("pid 4243"),
            "{e}"
        );
        let huge = joining(&["/proc/99999999999999999999/ns/net"]);
        assert!(shim.check_namespace_paths(&huge).is_err());

        // A running container is a pid namespace target; an exited one is not.
        let log = Rc::new(LogSink::new(PathBuf::new(), PathBuf::new()).unwrap());
        let mut ctr = Ctr::new(created_state("t", 5151), dir.path(), String::new(), log);
        ctr.state.status = Status::Running;
        shim.containers.insert("t".into(), ctr);
        let target = joining(&[
            "/proc/4242/ns/net",
            "/proc/4242/ns/ipc",
            "/proc/4242/ns/uts",
            "/proc/5151/ns/pid",
        ]);
        shim.check_namespace_paths(&target).unwrap();
        shim.containers.get_mut("t").unwrap().state.status = Status::Exited;
        assert!(shim.check_namespace_paths(&target).is_err());

        // The infra process reaped: its pid is free for any process, the host's own included.
        shim.on_exit(WaitStatus::Exited(nix::unistd::Pid::from_raw(4242), 0));
        assert_eq!(shim.infra_pid, 0);
        let e = shim.check_namespace_paths(&infra).unwrap_err();
        assert!(e.contains("infra process"), "{e}");

        // Through a create: refused before libcontainer runs, as FailedPrecondition.
        let bundle = dir.path().join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec(&infra).unwrap(),
        )
        .unwrap();
        match shim.create("c", &bundle, Stdio::Inherit { tty: false }, false) {
            Err(Response::Error { kind, message }) => {
                assert_eq!(kind, ErrorKind::FailedPrecondition);
                assert!(message.contains("/proc/4242/ns/net"), "{message}");
            }
            other => panic!("created: {:?}", other.map(|_| ())),
        }
        assert!(!shim.lc_root.join("c").exists(), "libcontainer never ran");

        // A bundle's shim (no infra process) takes its config's paths as they are.
        let bundle_shim = Shim::new(dir.path().join("b"), 0);
        bundle_shim.check_namespace_paths(&other).unwrap();
    }

    #[test]
    fn only_executable_failures_wait_for_start() {
        // libcontainer's messages for a missing or non-executable command.
        assert!(is_start_error(
            "failed to create container: executable 'nope' not found in $PATH"
        ));
        assert!(is_start_error(
            "executable '/etc/passwd' at path '\"/etc/passwd\"' does not have correct permissions"
        ));
        // Everything else still fails the create.
        assert!(!is_start_error("mount failed: EPERM"));
        assert!(!is_start_error("invalid cgroups path"));
    }
}
