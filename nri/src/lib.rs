//! NRI (`containerd/nri`), the runtime's side, written from the protocol's facts.
//!
//! - [`api`]: NRI's messages, generated from `proto/nri.proto`.
//! - [`mux`]: one unix connection carries several logical ones, each frame an 8-byte header
//!   (connection id, payload length, both big-endian) and its payload. The plugin's services
//!   are connection [`mux::PLUGIN_SERVICE_CONN`], the runtime's [`mux::RUNTIME_SERVICE_CONN`].
//! - [`ttrpc`]: on each logical connection, ttrpc messages: a 10-byte header (length, stream
//!   id, type, flags) and a protobuf `Request`, `Response` or data payload.
//! - [`conn`]: one connection's calls, both ways, with timeouts.
//! - [`adaptation`]: plugins registered, configured, synchronized and told of events.
//! - [`merge`], [`limits`], [`oci`]: plugins' adjustments merged (conflicts named), bounded,
//!   and applied to an OCI spec.
//! - [`stub`]: the plugin's side, for plugins written in Rust.
//!
//! A plugin is hostile until bounded: every length is checked against its limit before
//! anything is allocated for it, a decoder holds at most one frame's worth of bytes, and every
//! call has a deadline.

pub mod adaptation;
pub mod api;
mod buffer;
pub mod conn;
pub mod limits;
pub mod merge;
pub mod mux;
pub mod oci;
pub mod stub;
pub mod ttrpc;
