//! Support for crishim's integration tests: a real `docker-registry`, hand-built OCI/Docker
//! images pushed to it, and the `crishim` daemon driven over its CRI socket.
//!
//! Environment:
//! - `CRISHIM_BIN`: the daemon binary (default: `crishim` in this test binary's
//!   `target/<profile>/`, else `<workspace>/target/debug/crishim`).
//! - `DOCKER_REGISTRY_BIN` (default `/usr/bin/docker-registry`), `BUSYBOX_BIN` (default
//!   `/bin/busybox`, must be static).
//! - `CRISHIM_TEST_QUIET`: set to stop printing registry and daemon logs when a test panics.
//! - `RUST_LOG`: passed to the daemon (default: debug for crishim crates).

pub mod cri;
pub mod daemon;
pub mod fixtures;
pub mod fsutil;
pub mod gpu;
pub mod image;
pub mod pods;
pub mod registry;
pub mod systemd;
pub mod throttle;

pub use daemon::{Daemon, DaemonOptions};
pub use image::{
    busybox_image, busybox_layer, Compression, Format, Image, Index, Layer, LayerBuilder,
    PushedImage, PushedIndex, RawTar,
};
pub use registry::{Registry, RegistryOptions};
pub use throttle::{Throttle, ThrottleOptions};

/// A random lowercase hex string of `n` bytes (from /dev/urandom).
pub fn random_hex(n: usize) -> String {
    use std::io::Read as _;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("reading /dev/urandom");
    hex::encode(buf)
}
