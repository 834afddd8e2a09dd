//! `crishim run POD.yaml`: a Kubernetes Pod run as a workflow step (init → main → wait).

use clap::Args;

#[derive(Debug, Args)]
pub struct RunArgs {}

/// Run the `run` subcommand; returns the process exit code.
pub fn main(_args: RunArgs) -> anyhow::Result<i32> {
    anyhow::bail!("crishim run is not implemented yet")
}
