//! The shim's records are the shared atomic record files of `crishim-sys`.

pub use crishim_sys::record::{now_nanos, write_atomic};
