//! Fuzz targets for every parser that reads outside input, one `pub fn <target>(data: &[u8])`
//! each. They run two ways:
//! - `fuzz/` (cargo-fuzz, nightly): `fuzz_targets/<target>.rs` calls the function here;
//! - `tests/replay.rs` (stable `cargo test`): every file of `fuzz/corpus/<target>/` and
//!   `fuzz/regressions/<target>/` goes through it, so CI replays the corpora without nightly.
//!
//! A target returns normally on any input, however malformed: a panic, a hang (over 1 s) or
//! a large allocation is a finding.

// The interceptor's own source (see ledger.rs); only the ledger's parts are used.
#[allow(dead_code)]
#[path = "../../interceptor/src/cuda.rs"]
mod cuda;
#[allow(dead_code)]
#[path = "../../interceptor/src/ledger.rs"]
mod interceptor_ledger;

mod images;
mod input;
mod lazy;
mod ledger;
mod nri;
mod runtime;
mod shim;
mod streaming;

pub use images::{hosts_toml, image_reference, registry_reply, tar_unpack, www_authenticate};
pub use lazy::lazy_toc;
pub use ledger::{ledger_seed, vgpu_ledger};
pub use nri::{nri_reply, nri_wire};
pub use runtime::{cni_result, config_toml, journal, mountinfo, pod_manifest, records};
pub use shim::shim_protocol;
pub use streaming::{
    portforward_spdy, portforward_ws, remotecommand_spdy, remotecommand_ws, spdy_frames,
    spdy_headers, websocket_frames,
};

/// A fuzz target: any bytes in, nothing out.
pub type Target = fn(&[u8]);

/// Every target by name, as `fuzz/fuzz_targets/<name>.rs` and the corpus directories name it.
pub const TARGETS: &[(&str, Target)] = &[
    ("spdy_frames", spdy_frames),
    ("spdy_headers", spdy_headers),
    ("websocket_frames", websocket_frames),
    ("remotecommand_spdy", remotecommand_spdy),
    ("remotecommand_ws", remotecommand_ws),
    ("portforward_spdy", portforward_spdy),
    ("portforward_ws", portforward_ws),
    ("tar_unpack", tar_unpack),
    ("image_reference", image_reference),
    ("registry_reply", registry_reply),
    ("www_authenticate", www_authenticate),
    ("hosts_toml", hosts_toml),
    ("shim_protocol", shim_protocol),
    ("records", records),
    ("journal", journal),
    ("mountinfo", mountinfo),
    ("cni_result", cni_result),
    ("pod_manifest", pod_manifest),
    ("config_toml", config_toml),
    ("vgpu_ledger", vgpu_ledger),
    ("lazy_toc", lazy_toc),
    ("nri_wire", nri_wire),
    ("nri_reply", nri_reply),
];
