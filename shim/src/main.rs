//! `crishim-shim`: one per pod. It runs the pod's infra process and containers (with youki's
//! libcontainer, which forks and changes process-wide state, so it lives here and not in the
//! multi-threaded daemon), is their subreaper, records every exit on disk, writes CRI log files, and
//! keeps running when the daemon restarts.
//!
//! Modes:
//! - `crishim-shim start --dir DIR --infra JSON`: daemonize a shim for the pod whose state lives in
//!   DIR; exits once the shim's socket is ready.
//! - `crishim-shim infra`: the pod's infra process (pins namespaces; PID 1 of a shared pid namespace).
//! - `crishim-shim cleanup --dir DIR`: kill and remove what a dead shim left behind.

mod cleanup;
mod container;
mod infra;
mod logs;
mod reaper;
mod record;
mod server;
mod start;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("infra") => infra::run(),
        Some("start") => start::run(&args[2..]),
        Some("cleanup") => cleanup::run(&args[2..]),
        _ => {
            eprintln!(
                "usage: crishim-shim start --dir DIR --infra JSON | infra | cleanup --dir DIR"
            );
            std::process::exit(2);
        }
    }
}
