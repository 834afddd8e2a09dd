//! The CRI v1 server: the RuntimeService and ImageService handlers (one file per RPC under
//! `server/`), the one place their errors become gRPC statuses, and the daemon around them:
//! configuration, start-up and recovery, shims, container images, metrics and stats.

pub mod authority;
pub mod bounds;
pub mod config;
pub mod container_images;
pub mod cri_client;
pub mod daemon;
pub mod empty_mnt;
pub mod host_files;
pub mod metrics;
pub mod runtimes;
pub mod server;
pub mod shim_client;
pub mod stats;
