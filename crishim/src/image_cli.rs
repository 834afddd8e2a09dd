//! `crishim image`: images outside the daemon. `convert` makes lazy images.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};

use crishim_cri::config::Config;
use crishim_images::registry::RegistryClient;
use crishim_images::Reference;
use crishim_lazy::convert::{convert, ConvertLimits};
use crishim_lazy::Format;

#[derive(Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Clone, Copy, ValueEnum)]
enum LazyFormat {
    Estargz,
    #[value(name = "zstd-chunked")]
    ZstdChunked,
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Pull SRC, write each layer as eStargz or zstd:chunked, and push the result as DST, with
    /// the registry configuration of the config file (mirrors, hosts.toml, auth).
    Convert {
        #[arg(long, value_enum)]
        format: LazyFormat,
        /// Config file (TOML). Default: /etc/crishim/config.toml, if present.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The largest chunk a file is cut into, bytes.
        #[arg(long, default_value_t = 4 << 20)]
        chunk_size: u64,
        src: String,
        dst: String,
    },
}

pub fn main(args: ImageArgs) -> Result<i32> {
    match args.command {
        ImageCommand::Convert {
            format,
            config,
            chunk_size,
            src,
            dst,
        } => {
            let cfg = Config::load(config.as_deref())?;
            let client = RegistryClient::new(cfg.registry.clone())?;
            let src_ref = Reference::parse(&src).with_context(|| format!("SRC {src}"))?;
            let dst_ref = Reference::parse(&dst).with_context(|| format!("DST {dst}"))?;
            let format = match format {
                LazyFormat::Estargz => Format::Estargz,
                LazyFormat::ZstdChunked => Format::ZstdChunked,
            };
            anyhow::ensure!(chunk_size > 0, "--chunk-size must be more than 0");
            let limits = ConvertLimits {
                chunk_size,
                ..ConvertLimits::default()
            };
            let done = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(convert(
                    &client,
                    &src_ref,
                    &dst_ref,
                    (None, None),
                    format,
                    limits,
                ))
                .with_context(|| format!("converting {src} to {dst}"))?;
            println!(
                "{dst}: {} ({} layers)",
                done.manifest_digest,
                done.layers.len()
            );
            Ok(0)
        }
    }
}
