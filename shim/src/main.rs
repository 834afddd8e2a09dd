//! `crishim-shim`: one per pod. It runs the pod's infra process and containers (with youki's
//! libcontainer, which forks and changes process-wide state, so it lives here and not in the
//! multi-threaded daemon), is their subreaper, records every exit on disk, writes CRI log files, and
//! keeps running when the daemon restarts.
//!
//! Modes:
//! - `crishim-shim start --dir DIR [--infra JSON]`: daemonize a shim for the pod (or, without
//!   `--infra`, the detached OCI bundle) whose state lives in DIR; exits once its socket is ready.
//! - `crishim-shim run --dir DIR --id ID --bundle BUNDLE`: run one bundle in the foreground
//!   (`crishim bundle run`) and exit with its exit code.
//! - `crishim-shim infra`: the pod's infra process (pins namespaces; PID 1 of a shared pid namespace).
//! - `crishim-shim cleanup --dir DIR`: kill and remove what a dead shim left behind.

mod cleanup;
mod container;
mod foreground;
mod infra;
mod logs;
mod reaper;
mod record;
mod server;
mod start;
mod stream;
mod tty;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("infra") => infra::run(),
        Some("start") => start::run(&args[2..]),
        Some("run") => foreground::run(&args[2..]),
        Some("cleanup") => cleanup::run(&args[2..]),
        _ => {
            eprintln!(
                "usage: crishim-shim start --dir DIR [--infra JSON] | run --dir DIR --id ID --bundle BUNDLE | infra | cleanup --dir DIR"
            );
            std::process::exit(2);
        }
    }
}
