//! The shim's records are the shared atomic record files of `crishim-proto`.

pub use crishim_sys::record::{now_nanos, write_atomic};
