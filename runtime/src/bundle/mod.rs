//! `crishim bundle`: run plain OCI bundles the way `runc` does, through the same shim and
//! libcontainer path as pods.

use clap::Args;

#[derive(Debug, Args)]
pub struct BundleArgs {}

/// Run the `bundle` subcommand; returns the process exit code.
pub fn main(_args: BundleArgs) -> anyhow::Result<i32> {
    anyhow::bail!("crishim bundle is not implemented yet")
}
