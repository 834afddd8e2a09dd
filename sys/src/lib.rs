//! Host helpers shared by the daemon, the shim and the image store: system calls and files on the
//! host, no wire protocol (those are `crishim-proto`'s).
//!
//! - `hostfs`: creating and tightening root-only directories and files; `record`: files written
//!   whole or not at all (the daemon's and the shim's records), and the CRI's clock.
//! - `mountinfo`: the mounts of `/proc/self/mountinfo`, and whether a path is a mount point;
//!   `idmap`: detached (and idmapped) mount trees; `empty_ns`: an empty mount namespace.
//! - `confined`: reading a bounded file beneath a root, never leaving it (the one `openat2`
//!   wrapper).
//! - `path`: paths cleaned lexically (`//`, `.`, `..`), without touching the file system.
//! - `walk`: walking a tree others may be changing (volumes, writable layers) by descriptor.
//! - `daemon`: forking a process that outlives its starter, which waits for its report.
//! - `random`: ids and tokens from `getrandom(2)`.
//! - `shown`: attacker-sized names cut to a bounded length for error messages and logs.
//! - `blocking` (feature `tokio`): disk waits off an async runtime's workers, children's output
//!   read to a cap.
//! - `testing`: helpers for tests that need a mount namespace of their own.

#[cfg(feature = "tokio")]
pub mod blocking;
pub mod confined;
pub mod daemon;
pub mod empty_ns;
pub mod hostfs;
pub mod idmap;
pub mod mountinfo;
pub mod path;
pub mod random;
pub mod record;
pub mod shown;
pub mod testing;
pub mod walk;
