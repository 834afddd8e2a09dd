//! `crishim`: a Kubernetes container runtime serving CRI v1 on a unix socket.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use crishim_cri::config::Config;

#[derive(Parser)]
#[command(name = "crishim", version, about = "A Kubernetes CRI runtime")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the CRI RuntimeService and ImageService on a unix socket.
    Serve {
        /// Config file (TOML). Default: /etc/crishim/config.toml, if present.
        #[arg(long)]
        config: Option<PathBuf>,
        /// CRI socket path (overrides `socket`).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Persistent state directory (overrides `root_dir`).
        #[arg(long)]
        root_dir: Option<PathBuf>,
        /// Volatile state directory (overrides `state_dir`).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Log filter, e.g. `info` or `crishim=debug` (default: $RUST_LOG or `info`).
        #[arg(long)]
        log_level: Option<String>,
    },
    /// Run a Kubernetes Pod manifest as a workflow: init containers, then main containers and
    /// sidecars; stop the sidecars when the main work is done, collect exit codes and outputs.
    Run(crishim::workflow::RunArgs),
    /// Run plain OCI bundles, like runc.
    Bundle(crishim::bundle::BundleArgs),
    /// GPUs: `crishim gpu list` shows them and the containers holding them.
    Gpu(crishim::gpu_cli::GpuArgs),
    /// Images: `crishim image convert --format estargz|zstd-chunked SRC DST` makes lazy images.
    Image(crishim::image_cli::ImageArgs),
    /// The daemon's images, and how much of each is local (lazy pull).
    Images(crishim::images_cli::ImagesArgs),
}

fn main() {
    // One line, with the causes: `crishim: <what failed>: <why>`.
    if let Err(e) = run(Cli::parse()) {
        eprintln!("crishim: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Serve {
            config,
            socket,
            root_dir,
            state_dir,
            log_level,
        } => {
            init_logging(log_level.as_deref());
            let mut cfg = Config::load(config.as_deref())?;
            cfg.socket = socket.unwrap_or(cfg.socket);
            cfg.root_dir = root_dir.unwrap_or(cfg.root_dir);
            cfg.state_dir = state_dir.unwrap_or(cfg.state_dir);
            cfg.validate().map_err(anyhow::Error::msg)?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("crishim")
                .build()?
                .block_on(crishim_cri::daemon::serve(cfg))
        }
        Command::Run(args) => std::process::exit(crishim::workflow::main(args)?),
        Command::Bundle(args) => std::process::exit(crishim::bundle::main(args)?),
        Command::Gpu(args) => std::process::exit(crishim::gpu_cli::main(args)?),
        Command::Image(args) => std::process::exit(crishim::image_cli::main(args)?),
        Command::Images(args) => std::process::exit(crishim::images_cli::main(args)?),
    }
}

fn init_logging(level: Option<&str>) {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(l) => EnvFilter::new(l),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
