//! Daemonize: fork, detach into a new session, and report readiness to the parent through a pipe,
//! so the caller's spawn returns only once the shim can take requests (or with the reason it
//! cannot). The parent prints the report (`ok <infra pid>`) on its stdout and exits. A pod's
//! shim gets `--infra`; a detached bundle's (`crishim bundle create`) does not.
//!
//! The fork also keeps the shim small: its start-up (the loader, libc's and libseccomp's set-up,
//! the argument parsing) touched pages the child never maps, so they are not in its PSS.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use crishim_proto::shim::{paths, InfraSpec, OciRuntimeSpec};

pub fn run(args: &[String]) -> ! {
    let mut dir = None;
    let mut infra = None;
    let mut oci = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--dir" => dir = it.next().map(PathBuf::from),
            "--infra" => infra = it.next().map(|s| serde_json::from_str::<InfraSpec>(s)),
            "--oci-runtime" => oci = it.next().map(|s| serde_json::from_str::<OciRuntimeSpec>(s)),
            "--seccomp-cache" => match it.next() {
                Some(d) if Path::new(d).is_absolute() => {
                    crate::seccomp_program::set_disk_cache(PathBuf::from(d))
                }
                _ => fail("--seccomp-cache needs an absolute path"),
            },
            other => fail(&format!("unknown argument {other:?}")),
        }
    }
    let Some(dir) = dir else {
        fail("--dir is required")
    };
    // A bundle's shim has no infra process.
    let infra = match infra {
        Some(Ok(i)) => Some(i),
        Some(Err(e)) => fail(&format!("--infra: {e}")),
        None => None,
    };
    let oci = match oci {
        Some(Ok(o)) if o.binary.is_absolute() && o.root.is_absolute() => Some(o),
        Some(Ok(_)) => fail("--oci-runtime: binary and root must be absolute paths"),
        Some(Err(e)) => fail(&format!("--oci-runtime: {e}")),
        None => None,
    };
    if let Err(e) = crishim_sys::hostfs::create_private_dir(&dir) {
        fail(&format!("creating {}: {e}", dir.display()));
    }
    // Kept for `cleanup`, which must find the runtime that holds the containers' state.
    if let Some(o) = &oci {
        let json = serde_json::to_vec(o).unwrap_or_default();
        if let Err(e) = crishim_sys::hostfs::write_private(&dir.join(paths::OCI_RUNTIME), &json) {
            fail(&format!("recording the OCI runtime: {e}"));
        }
    }
    // The report (`ok <infra pid>`) goes to the caller, which need not ask the shim.
    crishim_sys::daemon::fork_with_report(
        "crishim-shim",
        |msg| msg.starts_with("ok"),
        |w| {
            redirect_stdio(&dir);
            let mut ready = Some(w);
            match crate::server::serve(dir, infra, oci, &mut ready) {
                Ok(()) => 0,
                Err(e) => {
                    if let Some(mut r) = ready {
                        let _ = r.write_all(format!("error: {e}").as_bytes());
                    }
                    eprintln!("crishim-shim: {e}");
                    1
                }
            }
        },
    )
}

/// stdin and stdout to /dev/null, stderr to `shim.log` in the pod directory.
fn redirect_stdio(dir: &std::path::Path) {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(crishim_sys::hostfs::FILE_MODE)
        .open(dir.join("shim.log"));
    if let Ok(null) = null {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
        let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
    }
    if let Ok(log) = log {
        let _ = nix::unistd::dup2(log.as_raw_fd(), 2);
    }
    let _ = crishim_sys::hostfs::write_private(
        &dir.join(paths::SHIM_PID),
        crishim_proto::shim::pid_file::text(std::process::id() as i32).as_bytes(),
    );
}

fn fail(msg: &str) -> ! {
    eprintln!("crishim-shim: {msg}");
    std::process::exit(1)
}
