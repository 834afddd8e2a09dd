//! Wire protocols spoken by crishim.
//!
//! `cri` is the Kubernetes CRI v1 API (generated tonic/prost bindings from `k8s-cri`).

pub use k8s_cri::v1 as cri;
