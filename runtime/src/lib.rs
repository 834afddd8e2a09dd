//! The crishim daemon: configuration, the CRI gRPC server and the lifecycle around it.

pub mod apparmor;
pub mod authority;
pub mod bounds;
pub mod bundle;
pub mod cgroups;
pub mod cni;
pub mod config;
pub mod container_images;
pub mod cri_client;
pub mod daemon;
pub mod empty_mnt;
pub mod gpu_cli;
pub mod host_files;
pub mod metrics;
pub mod runtimes;
pub mod selinux;
pub mod server;
pub mod shim_client;
pub mod spec;
pub mod stats;
pub mod userns;
pub mod workflow;
