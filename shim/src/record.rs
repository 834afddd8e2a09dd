//! The shim's records are the shared atomic record files of `crishim-proto`.

pub use crishim_proto::record::{now_nanos, write_atomic};
