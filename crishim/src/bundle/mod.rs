//! `crishim bundle`: run plain OCI bundles the way `runc` does, through the same shim and
//! libcontainer path as pods (the daemon's process never calls libcontainer itself).
//!
//! - `run` execs the shim's foreground mode: stdio attached (a relayed pty with
//!   `process.terminal`), signals forwarded, orphans reaped, the exit code propagated.
//! - `create`/`start`/`state`/`kill`/`delete` drive a daemonized shim per container, as the CRI
//!   server drives a pod's; the container's output goes to a CRI-format log file.
//! - `spec` writes a default `config.json`.
//!
//! State: `<state_dir>/bundles/<id>/` (see [`store`]).

mod config;
mod error;
mod lifecycle;
mod run;
mod signal;
mod spec;
mod state;
mod store;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

pub use error::BundleError;

use config::Bundle;
use crishim_cri::config::Config;
use lifecycle::Env;
use store::Store;

#[derive(Debug, Args)]
pub struct BundleArgs {
    /// Config file (TOML) for `state_dir` and `shim_binary`. Default: /etc/crishim/config.toml,
    /// if present.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// State directory (overrides `state_dir`); each container's state is in ROOT/bundles/ID.
    #[arg(long, visible_alias = "state-dir", global = true, value_name = "ROOT")]
    root: Option<PathBuf>,
    /// The shim binary (overrides `shim_binary`; default: crishim-shim next to crishim).
    #[arg(long, global = true)]
    shim: Option<PathBuf>,
    #[command(subcommand)]
    command: BundleCommand,
}

#[derive(Debug, Subcommand)]
enum BundleCommand {
    /// Run a bundle in the foreground: stdio attached, signals forwarded, exits with the
    /// container's exit code (or 128 + signal), and removes the container.
    Run {
        /// The bundle directory (config.json and its rootfs).
        dir: PathBuf,
        /// Container id (default: the bundle directory's name).
        #[arg(long)]
        id: Option<String>,
    },
    /// Create a container from a bundle and leave it created, its output going to a log file.
    Create {
        dir: PathBuf,
        /// Container id (default: the bundle directory's name).
        #[arg(long)]
        id: Option<String>,
        /// CRI-format log of the container's output (default: in its state directory).
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Start a created container.
    Start { id: String },
    /// Print a container's state as JSON: ociVersion, id, pid, status, bundle, rootfs, created.
    State { id: String },
    /// Send a signal (default SIGTERM) to a container's init, or to all its processes.
    Kill {
        id: String,
        /// A name (TERM, SIGKILL) or a number.
        #[arg(default_value = "TERM")]
        signal: String,
        /// Signal every process of the container.
        #[arg(long, short)]
        all: bool,
    },
    /// Delete a container and its state; a running one only with --force, which kills it.
    Delete {
        id: String,
        #[arg(long, short)]
        force: bool,
    },
    /// Write a default config.json (running `sh` on a terminal, rootfs "rootfs") into DIR.
    Spec {
        /// Default: the current directory.
        dir: Option<PathBuf>,
    },
}

impl BundleCommand {
    fn name(&self) -> &'static str {
        match self {
            BundleCommand::Run { .. } => "run",
            BundleCommand::Create { .. } => "create",
            BundleCommand::Start { .. } => "start",
            BundleCommand::State { .. } => "state",
            BundleCommand::Kill { .. } => "kill",
            BundleCommand::Delete { .. } => "delete",
            BundleCommand::Spec { .. } => "spec",
        }
    }
}

/// Run the `bundle` subcommand; returns the process exit code. Errors are printed here, on one
/// line, as `crishim bundle <command>: <what>: <why>`, and exit with 1.
pub fn main(args: BundleArgs) -> anyhow::Result<i32> {
    let name = args.command.name();
    match dispatch(args) {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("crishim bundle {name}: {e:#}");
            Ok(1)
        }
    }
}

fn dispatch(args: BundleArgs) -> anyhow::Result<i32> {
    if let BundleCommand::Spec { dir } = &args.command {
        let dir = dir.clone().unwrap_or_else(|| PathBuf::from("."));
        spec::write_default(&dir)?;
        return Ok(0);
    }
    let env = env(&args)?;
    match args.command {
        BundleCommand::Run { dir, id } => {
            let bundle = Bundle::load(&dir)?;
            let id = id.unwrap_or_else(|| bundle.default_id());
            Err(run::run(&env, &bundle, &id).into())
        }
        command => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(detached(&env, command))?;
            Ok(0)
        }
    }
}

async fn detached(env: &Env, command: BundleCommand) -> Result<(), BundleError> {
    match command {
        BundleCommand::Create { dir, id, log } => {
            let bundle = Bundle::load(&dir)?;
            let id = id.unwrap_or_else(|| bundle.default_id());
            lifecycle::create(env, &bundle, &id, log).await
        }
        BundleCommand::Start { id } => lifecycle::start(env, &id).await,
        BundleCommand::State { id } => {
            let state = lifecycle::state(env, &id).await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&state).expect("a state serializes")
            );
            Ok(())
        }
        BundleCommand::Kill { id, signal, all } => {
            let signal = signal::parse(&signal)?;
            lifecycle::kill(env, &id, signal, all).await
        }
        BundleCommand::Delete { id, force } => lifecycle::delete(env, &id, force).await,
        BundleCommand::Run { .. } | BundleCommand::Spec { .. } => {
            unreachable!("handled without a runtime")
        }
    }
}

/// State directory and shim binary: flags, then the config file, then defaults.
fn env(args: &BundleArgs) -> anyhow::Result<Env> {
    let config = Config::load(args.config.as_deref())?;
    let state_dir = match &args.root {
        Some(root) => std::path::absolute(root)
            .with_context(|| format!("resolving --root {}", root.display()))?,
        None => config.state_dir,
    };
    let shim = args
        .shim
        .clone()
        .or(config.shim_binary)
        .unwrap_or_else(|| sibling_binary("crishim-shim"));
    Ok(Env {
        store: Store::new(&state_dir),
        shim,
    })
}

/// `name` next to the running `crishim`.
fn sibling_binary(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from("/usr/local/bin").join(name))
}
