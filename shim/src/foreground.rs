//! `crishim-shim run --dir DIR --id ID --bundle BUNDLE`: the shim of `crishim bundle run`, which
//! execs it, so it runs in the caller's place, in the foreground. It creates and starts the bundle's
//! container on the caller's stdio (or on a pty relayed to it, with `process.terminal`), forwards
//! the signals it gets to the container's init, reaps every child, and answers the same requests as
//! a daemonized shim (so `crishim bundle state|kill|delete ID` work meanwhile). When the init exits,
//! it deletes the container and the state directory DIR, and exits with the init's exit code (or
//! 128 + the signal that killed it).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crishim_proto::shim::{paths, Response, Status};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use tokio::signal::unix::{signal, SignalKind};

use crate::container::{self, Shared, Shim, Stdio};
use crate::tty::Console;

/// What a shell or a supervisor sends a foreground job, passed on to the container's init.
/// SIGCHLD is the shim's own (reaping), SIGWINCH resizes the pty, and job-control signals stop the
/// shim itself, as they would any foreground program.
const FORWARDED: &[Signal] = &[
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
    Signal::SIGTERM,
];

/// How long children still alive after the container's deletion (they were sent SIGKILL) may
/// take to be reaped before the shim exits anyway.
const REAP_GRACE: Duration = Duration::from_secs(5);

struct Opts {
    dir: PathBuf,
    id: String,
    bundle: PathBuf,
}

pub fn run(args: &[String]) -> ! {
    let opts = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("crishim-shim run: {e}");
            eprintln!("usage: crishim-shim run --dir DIR --id ID --bundle BUNDLE");
            std::process::exit(2);
        }
    };
    let code = match main(&opts) {
        Ok(code) => code,
        Err(e) => {
            // We run in place of `crishim bundle run`, so speak as it.
            eprintln!("crishim bundle run: {e}");
            1
        }
    };
    reap_remaining();
    if let Err(e) = std::fs::remove_dir_all(&opts.dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            eprintln!("crishim bundle run: removing {}: {e}", opts.dir.display());
        }
    }
    std::process::exit(code)
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let (mut dir, mut id, mut bundle) = (None, None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let slot = match a.as_str() {
            "--dir" => &mut dir,
            "--id" => &mut id,
            "--bundle" => &mut bundle,
            other => return Err(format!("unknown argument {other:?}")),
        };
        *slot = Some(
            it.next()
                .ok_or_else(|| format!("{a} needs a value"))?
                .clone(),
        );
    }
    Ok(Opts {
        dir: dir.ok_or("--dir is required")?.into(),
        id: id.ok_or("--id is required")?,
        bundle: bundle.ok_or("--bundle is required")?.into(),
    })
}

fn main(o: &Opts) -> Result<i32, String> {
    crate::server::become_subreaper()?;
    // `crishim bundle delete` waits for this pid to be gone.
    crishim_sys::hostfs::write_private(
        &o.dir.join(paths::SHIM_PID),
        crishim_proto::shim::pid_file::text(std::process::id() as i32).as_bytes(),
    )
    .map_err(|e| format!("writing {}: {e}", o.dir.display()))?;
    let tty = wants_terminal(&o.bundle)?;
    let rt = crate::server::runtime()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, supervise(o, tty))
}

fn wants_terminal(bundle: &Path) -> Result<bool, String> {
    let config = bundle.join("config.json");
    let spec = oci_spec::runtime::Spec::load(&config)
        .map_err(|e| format!("reading {}: {e}", config.display()))?;
    Ok(spec
        .process()
        .as_ref()
        .and_then(|p| p.terminal())
        .unwrap_or(false))
}

async fn supervise(o: &Opts, tty: bool) -> Result<i32, String> {
    // Registered before the container exists: from now on a signal is held for it rather than
    // ending the shim and leaving the container behind.
    let mut signals = Vec::new();
    for &sig in FORWARDED {
        let stream =
            signal(SignalKind::from_raw(sig as i32)).map_err(|e| format!("watching {sig}: {e}"))?;
        signals.push((sig, stream));
    }
    let listener = crate::server::listen(&o.dir)?;
    let mut shim = Shim::new(o.dir.clone(), 0);
    shim.foreground = true;
    let (tx, mut exits) = tokio::sync::mpsc::unbounded_channel();
    shim.watchers.push(tx);
    let shim: Shared = Rc::new(RefCell::new(shim));
    tokio::task::spawn_local(crate::reaper::run(shim.clone()));
    tokio::task::spawn_local(crate::server::accept(listener, shim.clone()));

    let created = shim
        .borrow_mut()
        .create(&o.id, &o.bundle, Stdio::Inherit { tty }, false);
    let master = created.map_err(message)?;
    let console = match master.map(Console::attach).transpose() {
        Ok(c) => c,
        Err(e) => {
            container::delete(&shim, &o.id).await;
            return Err(e);
        }
    };
    let started = shim.borrow_mut().start(&o.id);
    if let Response::Error { .. } = started {
        container::delete(&shim, &o.id).await;
        return Err(message(started));
    }
    for (sig, mut stream) in signals {
        let (shim, id) = (shim.clone(), o.id.clone());
        tokio::task::spawn_local(async move {
            while stream.recv().await.is_some() {
                forward(&shim, &id, sig);
            }
        });
    }

    let state = loop {
        match exits.recv().await {
            Some(s) if s.id == o.id => break s,
            Some(_) => continue,
            None => return Err("lost track of the container".into()),
        }
    };
    // Kills what the init left behind (without its own pid namespace) and removes the cgroup.
    container::delete(&shim, &o.id).await;
    if let Some(console) = console {
        console.finish().await;
    }
    Ok(state.exit_code)
}

/// Signal the container's init, unless it has been reaped (its pid may be reused then). The reaper
/// runs on this same thread, so the check and the kill cannot be split by a reap.
fn forward(shim: &Shared, id: &str, sig: Signal) {
    let s = shim.borrow();
    if let Some(c) = s.containers.get(id) {
        if c.state.status != Status::Exited && c.state.pid > 0 {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.state.pid), sig);
        }
    }
}

/// Reap the children still exiting after the container was deleted, so none is left a zombie.
fn reap_remaining() {
    let deadline = Instant::now() + REAP_GRACE;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            // ECHILD: no children left.
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn message(r: Response) -> String {
    match r {
        Response::Error { message, .. } => message,
        other => format!("unexpected answer: {other:?}"),
    }
}
