//! The `crishim` binary's subcommands beside `serve`: `run` (a pod manifest as a workflow),
//! `bundle` (plain OCI bundles, like runc) and `gpu` (the node's GPUs and who holds them).

pub mod bundle;
pub mod gpu_cli;
pub mod image_cli;
pub mod images_cli;
pub mod workflow;
