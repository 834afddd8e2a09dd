//! `crishim-shim`: one per pod. It runs the pod's infra process and containers (with youki's
//! libcontainer, which forks and changes process-wide state, so it lives here and not in the
//! multi-threaded daemon), is their subreaper, records every exit on disk, writes CRI log files, and
//! keeps running when the daemon restarts.
//!
//! Modes:
//! - `crishim-shim start --dir DIR [--infra JSON]`: daemonize a shim for the pod (or, without
//!   `--infra`, the detached OCI bundle) whose state lives in DIR; exits once its socket is ready,
//!   printing `ok <infra pid>`.
//! - `crishim-shim run --dir DIR --id ID --bundle BUNDLE`: run one bundle in the foreground
//!   (`crishim bundle run`) and exit with its exit code.
//! - `crishim-shim cleanup --dir DIR`: kill and remove what a dead shim left behind.

mod bus;
mod cleanup;
mod container;
mod exec_seccomp;
mod exec_userns;
mod foreground;
mod infra;
mod lean_ns;
mod logs;
mod lsm_attr;
mod oci_runtime;
mod reaper;
mod record;
mod seccomp_program;
mod server;
mod start;
mod stream;
mod tty;
#[cfg(test)]
mod v2_devices_test;

/// Does nothing: see [`main`].
extern "C" fn on_sigpipe(_: libc::c_int) {}

fn main() {
    // Rust starts with SIGPIPE ignored, and an ignored signal stays ignored across exec, so every
    // container process would inherit it (`yes | head` would end in a write error, not SIGPIPE).
    // A handler that does nothing keeps our own writes failing with EPIPE instead of killing us,
    // and exec resets it to the default in each process we start.
    // SAFETY: installs an async-signal-safe handler that touches nothing.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigpipe as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGPIPE, &sa, std::ptr::null_mut());
    }
    // Every pod has a shim, so its resident memory is per-pod memory. Blocks of 16 KiB and more
    // (a bundle's config, a seccomp profile's JSON, read and dropped per create and exec) come
    // from mmap and go back to the kernel when freed, rather than leaving the heap grown and
    // dirty for the pod's lifetime; a freed heap top beyond 64 KiB is returned too.
    // SAFETY: mallopt only tunes glibc's allocator; called before anything else allocates much.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 16 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 * 1024);
    }
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("start") => start::run(&args[2..]),
        Some("run") => foreground::run(&args[2..]),
        Some("cleanup") => cleanup::run(&args[2..]),
        _ => {
            eprintln!(
                "usage: crishim-shim start --dir DIR [--infra JSON] | run --dir DIR --id ID --bundle BUNDLE | cleanup --dir DIR"
            );
            std::process::exit(2);
        }
    }
}
