//! `crishim run POD.yaml`: a Kubernetes Pod run as a workflow step, the way Argo's executor and
//! native sidecars do it, with no cluster: init containers one after another, then the main
//! containers with their sidecars; when the main work is done the sidecars are stopped, exit codes
//! and outputs collected, and the pod torn down. It drives the same CRI server as a kubelet would.

mod attach;
mod endpoint;
mod error;
mod lifecycle;
pub mod manifest;
mod resources;
mod result;
mod subpath;
mod translate;

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crishim_cri::config::Config;

pub use error::WorkflowError;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The Pod manifest, YAML or JSON (`-` for stdin).
    manifest: PathBuf,
    /// Config file (TOML). Default: /etc/crishim/config.toml, if present.
    #[arg(long)]
    config: Option<PathBuf>,
    /// CRI socket of a running daemon (default: the configured socket when a daemon answers
    /// there, else the run serves CRI in this process).
    #[arg(long)]
    endpoint: Option<String>,
    /// Write the result JSON here instead of stdout.
    #[arg(long)]
    result: Option<PathBuf>,
    /// Stream the containers' logs to stderr, prefixed by container name.
    #[arg(long)]
    attach: bool,
    /// Bytes of each container's stdout kept in the result.
    #[arg(long, default_value_t = 64 * 1024)]
    log_tail: usize,
    /// Largest output file collected, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_output: u64,
}

/// Run the `run` subcommand; returns the process exit code: 0 when the run succeeded, else the
/// failing main (or init) container's exit code, or 1.
pub fn main(args: RunArgs) -> Result<i32> {
    let text = if args.manifest.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the manifest from stdin")?;
        s
    } else {
        std::fs::read_to_string(&args.manifest)
            .with_context(|| format!("reading {}", args.manifest.display()))?
    };
    let plan = manifest::parse(&text)
        .with_context(|| format!("{} was not run", args.manifest.display()))?;
    let config = Config::load(args.config.as_deref())?;
    config.validate().map_err(anyhow::Error::msg)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args, plan, config))
}

async fn run(args: RunArgs, plan: manifest::Plan, config: Config) -> Result<i32> {
    // Before anything starts, so that Ctrl-C stops the run instead of killing this process.
    let mut interrupts = lifecycle::Interrupts::new().context("installing signal handlers")?;
    let (cri, server) = endpoint::connect(&config, args.endpoint.as_deref()).await?;
    let run_dir = config.state_dir.join("runs").join(&plan.uid);
    // Root's alone, like the rest of the state directory: it holds the containers' logs. Volumes
    // inside reach the containers as mounts.
    crishim_sys::hostfs::create_private_dir(&run_dir)
        .with_context(|| format!("creating {}", run_dir.display()))?;
    let runner = lifecycle::Runner::new(
        cri,
        plan,
        run_dir,
        lifecycle::Options {
            log_tail: args.log_tail,
            max_output: args.max_output,
        },
    );
    let follower = args
        .attach
        .then(|| attach::Follower::start(runner.log_dir()));
    let result = runner.run(&mut interrupts, follower).await;
    if let Some(server) = server {
        server.stop().await?;
    }
    let json = serde_json::to_string_pretty(&result)? + "\n";
    match &args.result {
        Some(path) => std::fs::write(path, json)
            .with_context(|| format!("writing the result to {}", path.display()))?,
        None => print!("{json}"),
    }
    Ok(result.exit_code)
}
