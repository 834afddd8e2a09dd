//! The daemon's state, with no gRPC in it: the record journals ([`journal`]), the pod and container
//! records kept in them ([`records`]), and the [`store::Store`] the CRI server reads and writes
//! them through (names, per-id locks, the shims' live states). Errors are [`store::StoreError`];
//! the server maps them onto gRPC statuses.

pub mod journal;
pub mod records;
pub mod store;
