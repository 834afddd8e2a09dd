//! Create: a container's stdio and log, the view of the node's mounts it is created in, its
//! init's config and seccomp program, and the checks on the namespaces it joins.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crishim_proto::cgroups_path;
use crishim_proto::shim::{paths, ContainerState, ErrorKind, Response, Status};
use crishim_sys::shown::shown;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::syscall::syscall::SyscallType;
use nix::fcntl::OFlag;

use crate::bus::closing_leaked_connections;
use crate::exec_seccomp::SeccompExecutor;
use crate::lean_ns::{self, CreateView, ViewScope};
use crate::logs::{self, LogSink};
use crate::oci_runtime::CallIo;
use crate::record::now_nanos;

use super::console::Console;
use super::{internal, labelled, log_error, with_stdio, Ctr, Shim, Stdio};

impl Shim {
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
        crishim_sys::hostfs::create_private_dir(&self.lc_root)
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
                crishim_sys::hostfs::tighten_dir_and_files(&self.lc_root.join(id), |_, _| {});
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

    /// Keep a created container, recorded on disk first.
    fn insert_created(&mut self, ctr: Ctr) {
        self.persist(&ctr.state);
        self.containers.insert(ctr.state.id.clone(), ctr);
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

    fn view_work(&self) -> PathBuf {
        self.dir.join("create-view")
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

fn cgroups_path(bundle: &Path) -> Option<String> {
    let raw = std::fs::read(bundle.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&raw).ok()?;
    v.pointer("/linux/cgroupsPath")?
        .as_str()
        .map(str::to_string)
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
    crishim_sys::hostfs::create_private_dir(&dir)
        .and_then(|()| crishim_sys::hostfs::write_private(&dir.join("config.json"), &json))
        .map_err(|e| format!("writing {}/config.json: {e}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use nix::sys::wait::WaitStatus;

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
