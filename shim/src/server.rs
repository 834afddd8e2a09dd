//! The shim's request loop: a current-thread runtime, one task per connection.

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use crishim_proto::shim::{paths, ErrorKind, InfraSpec, OciRuntimeSpec, Request, Response};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::container::{self, Shared, Shim, Stdio};
use crate::record::write_atomic;

/// Requests are small; refuse anything absurd before buffering it.
const MAX_REQUEST: usize = 1 << 20;

/// Run the shim. `ready` is written `ok` and closed once requests can be served; on an error before
/// that, the caller reports it through `ready` instead. Without `infra` (a bundle's shim) there is
/// no infra process: the bundle's own config says which namespaces its container gets.
pub fn serve(
    dir: PathBuf,
    infra: Option<InfraSpec>,
    oci: Option<OciRuntimeSpec>,
    ready: &mut Option<std::fs::File>,
) -> Result<(), String> {
    become_subreaper()?;
    let oci = oci
        .map(|spec| crate::oci_runtime::OciRuntime::new(spec, &dir))
        .transpose()?;
    // The daemon's empty mount namespace: the infra process joins it, and the create views are
    // made from it.
    let empty_mnt = infra
        .as_ref()
        .and_then(|spec| spec.empty_mnt.as_ref())
        .and_then(|p| std::fs::File::open(p).ok());
    let infra_pid = match &infra {
        Some(spec) => {
            let pid = crate::infra::spawn(spec, empty_mnt.as_ref())?;
            write_atomic(
                &dir.join(paths::INFRA_PID),
                crishim_proto::shim::pid_file::text(pid).as_bytes(),
            )
            .map_err(|e| format!("recording infra pid: {e}"))?;
            pid
        }
        None => 0,
    };
    let rt = runtime()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let listener = listen(&dir)?;
        let mut shim = Shim::new(dir, infra_pid);
        shim.oci = oci;
        shim.empty_mnt = empty_mnt;
        shim.kubelet_dir = infra
            .as_ref()
            .and_then(|i| i.pod_uid.as_deref())
            .and_then(crate::lean_ns::kubelet_pod_dir);
        let shim: Shared = Rc::new(RefCell::new(shim));
        tokio::task::spawn_local(crate::reaper::run(shim.clone()));
        if let Some(mut r) = ready.take() {
            let _ = r.write_all(crishim_proto::shim::ready_line(infra_pid).as_bytes());
        }
        // What the pod's first create needs, built while the daemon runs the CNI ADD.
        if shim.borrow().prepare_first_view() {
            let shim = shim.clone();
            tokio::task::spawn_local(async move {
                tokio::time::sleep(crate::lean_ns::SPARE_VIEW_MAX_AGE).await;
                shim.borrow().drop_spare_view();
            });
        }
        // The start-up's and the view's garbage goes back before the first request's peak.
        // SAFETY: plain libc call.
        unsafe { libc::malloc_trim(0) };
        accept(listener, shim).await
    })
}

/// Adopt every orphan of our containers, so that we reap them.
pub fn become_subreaper() -> Result<(), String> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(format!(
            "PR_SET_CHILD_SUBREAPER: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The shim's event loop: one thread, as libcontainer forks.
pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting runtime: {e}"))
}

/// Bind the request socket in `dir`. Call within the runtime.
pub fn listen(dir: &Path) -> Result<UnixListener, String> {
    let sock = dir.join(paths::SOCKET);
    let _ = std::fs::remove_file(&sock);
    let (_dirfd, short) = paths::short_socket_path(dir, paths::SOCKET)
        .map_err(|e| format!("opening {}: {e}", dir.display()))?;
    UnixListener::bind(&short).map_err(|e| format!("binding {}: {e}", sock.display()))
}

/// Serve requests, one task per connection, for as long as the shim lives.
pub async fn accept(listener: UnixListener, shim: Shared) -> ! {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                tokio::task::spawn_local(connection(shim.clone(), conn));
            }
            Err(e) => eprintln!("crishim-shim: accept: {e}"),
        }
    }
}

async fn connection(shim: Shared, conn: UnixStream) {
    let (r, mut w) = conn.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(r).take(MAX_REQUEST as u64);
    if reader.read_line(&mut line).await.is_err() {
        return;
    }
    let (response, exit) = match serde_json::from_str::<Request>(&line) {
        Ok(Request::Watch) => return watch(&shim, w).await,
        Ok(Request::ExecStream {
            id,
            args,
            tty,
            stdin,
        }) => {
            let r = reader.into_inner();
            return crate::stream::exec(&shim, &id, args, tty, stdin, r, w).await;
        }
        Ok(Request::Attach {
            id,
            stdin,
            close_stdin,
        }) => {
            let r = reader.into_inner();
            return crate::stream::attach(&shim, &id, stdin, close_stdin, r, w).await;
        }
        Ok(Request::Shutdown) => (shutdown(&shim).await, true),
        Ok(req) => (handle(&shim, req).await, false),
        Err(e) => (
            Response::error(
                ErrorKind::InvalidArgument,
                format!("malformed request: {e}"),
            ),
            false,
        ),
    };
    // Hand memory that creating or exec'ing containers used at its peak back to the kernel: a
    // shim idles for days, and its private pages are the per-pod cost.
    // SAFETY: plain libc call.
    unsafe { libc::malloc_trim(0) };
    let mut out = serde_json::to_vec(&response).unwrap_or_default();
    out.push(b'\n');
    let _ = w.write_all(&out).await;
    let _ = w.shutdown().await;
    // Off the reply's path: the client has its answer.
    release_unused_stack();
    shim.borrow().build_lean_from_view();
    // A foreground shim ends with its container, restoring the caller's terminal on the way.
    if exit && !shim.borrow().foreground {
        let dir = shim.borrow().dir.clone();
        let _ = std::fs::remove_file(dir.join(paths::SOCKET));
        std::process::exit(0);
    }
}

/// Hand back the main stack's pages below this frame (less a margin): libcontainer's create and
/// exec run deep and leave some 80 KiB of the stack touched, which would stay resident for the
/// pod's lifetime. The pages are zero-filled again if ever touched.
fn release_unused_stack() {
    const MARGIN: usize = 16 * 1024;
    // The stack's lowest address, read once: `/proc/self/maps` after every request was a
    // quarter of a percent of a pod start burst's CPU. Pages the stack gains below it later
    // (it only grows so deep again in another create) stay.
    static LOW: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let Some(low) = *LOW.get_or_init(|| {
        std::fs::read_to_string("/proc/self/maps")
            .ok()?
            .lines()
            .find(|l| l.ends_with("[stack]"))
            .and_then(|l| l.split('-').next())
            .and_then(|a| usize::from_str_radix(a, 16).ok())
    }) else {
        return;
    };
    let here = 0u8;
    let sp = std::ptr::addr_of!(here) as usize;
    // Only on the main thread's stack (the shim's loop runs there).
    let page = 4096;
    let top = sp.saturating_sub(MARGIN) & !(page - 1);
    if top > low && sp - low < 64 * 1024 * 1024 {
        // SAFETY: the range lies in this thread's stack below the live frames and the margin;
        // MADV_DONTNEED drops those pages and leaves them zero-filled on the next touch.
        unsafe { libc::madvise(low as *mut libc::c_void, top - low, libc::MADV_DONTNEED) };
    }
}

/// Stream exit records to a watcher until it goes away.
async fn watch(shim: &Shared, mut w: tokio::net::unix::OwnedWriteHalf) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // The exits so far, taken with the registration so that none falls between the two.
    let replay: Vec<_> = {
        let mut s = shim.borrow_mut();
        let exited = s
            .containers
            .values()
            .filter(|c| c.state.status == crishim_proto::shim::Status::Exited)
            .map(|c| Response::State(c.state.clone()))
            .collect();
        s.watchers.push(tx);
        exited
    };
    // Then `Ok`: the watcher has caught up, and every later exit follows as it happens.
    for r in replay.into_iter().chain([Response::Ok]) {
        if crate::stream::answer(&mut w, &r).await.is_err() {
            return;
        }
    }
    while let Some(state) = rx.recv().await {
        if crate::stream::answer(&mut w, &Response::State(state))
            .await
            .is_err()
        {
            return;
        }
    }
}

async fn handle(shim: &Shared, req: Request) -> Response {
    match req {
        Request::Ping => Response::Pong {
            infra_pid: shim.borrow().infra_pid,
            shim_pid: std::process::id() as i32,
        },
        Request::Create {
            id,
            bundle,
            log_path,
            log_root,
            stdin,
            tty,
            start_error_at_start,
        } => {
            let stdio = Stdio::Log {
                root: &log_root,
                path: &log_path,
                stdin,
                tty,
            };
            let created = shim
                .borrow_mut()
                .create(&id, &bundle, stdio, start_error_at_start);
            let r = match created {
                Ok(_) => shim.borrow().state(&id),
                Err(e) => e,
            };
            // The container's init may already be a zombie; reap before answering.
            crate::reaper::reap(shim);
            r
        }
        Request::Start { id } => {
            let r = shim.borrow_mut().start(&id);
            crate::reaper::reap(shim);
            match r {
                Response::State(_) => shim.borrow().state(&id),
                other => other,
            }
        }
        Request::Kill { id, signal, all } => shim.borrow_mut().kill(&id, signal, all),
        Request::Delete { id } => container::delete(shim, &id).await,
        Request::State { id } => {
            crate::reaper::reap(shim);
            shim.borrow().state(&id)
        }
        Request::Exec { id, args, timeout } => container::exec(shim, &id, args, timeout).await,
        Request::ReopenLog { id } => shim.borrow_mut().reopen_log(&id),
        Request::Update { id, resources } => shim.borrow_mut().update(&id, &resources),
        Request::Shutdown
        | Request::Watch
        | Request::ExecStream { .. }
        | Request::Attach { .. } => unreachable!("handled by the connection"),
    }
}

/// Kill and delete every container, then the infra process. Records of exits stay on disk.
async fn shutdown(shim: &Shared) -> Response {
    let ids: Vec<String> = shim.borrow().containers.keys().cloned().collect();
    for id in &ids {
        let _ = shim.borrow_mut().kill(id, libc::SIGKILL, true);
    }
    for id in &ids {
        container::wait_exited(shim, id, Duration::from_secs(10)).await;
        // Keep the exit record (delete removes it), so the daemon can still read it.
        let state = shim.borrow().containers.get(id).map(|c| c.state.clone());
        let _ = container::delete(shim, id).await;
        if let Some(state) = state {
            let dir = shim.borrow().dir.clone();
            if let Ok(json) = serde_json::to_vec(&state) {
                let _ = write_atomic(&dir.join(paths::state_file(id)), &json);
            }
        }
    }
    let infra = shim.borrow().infra_pid;
    if infra > 0 {
        let pid = nix::unistd::Pid::from_raw(infra);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        wait_infra_exit(shim).await;
    }
    Response::Ok
}

/// The infra process exits within this after its SIGKILL, or the shutdown goes on without it.
const INFRA_EXIT_WAIT: Duration = Duration::from_secs(5);

/// Wait for the killed infra process. As its pid namespace's init it exits only once every other
/// process of the namespace is reaped, and the processes of containers sharing that namespace are
/// our children: so every child is reaped meanwhile (the reaper records the infra's exit too),
/// never the infra alone. A blocking wait for it alone waited forever on a container's zombie,
/// and the shim stopped answering.
async fn wait_infra_exit(shim: &Shared) {
    let deadline = tokio::time::Instant::now() + INFRA_EXIT_WAIT;
    loop {
        crate::reaper::reap(shim);
        if shim.borrow().infra_pid == 0 || tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
