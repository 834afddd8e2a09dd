//! `/etc/crishim/vgpu/config.json`: what crishim tells the GPU interceptor in a container with
//! limits. The runtime writes it at `CreateContainer` (`crishim-gpu`); the interceptor
//! (`interceptor/src/config.rs`) reads it. Unknown keys are refused: a config the interceptor
//! does not fully understand is a broken one, and a broken config fails closed.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where the config is mounted in the container.
pub const CONFIG_PATH: &str = "/etc/crishim/vgpu/config.json";

pub const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub version: u32,
    pub container_id: String,
    pub pod_uid: String,
    /// The granted GPUs, `GPU-…`.
    pub device_uuids: Vec<String>,
    /// Per GPU.
    pub memory_limit_bytes: Option<u64>,
    /// Percent of one GPU, 1..=100.
    pub core_percent: Option<u32>,
    /// The real driver libraries, as seen in the container.
    pub libcuda: PathBuf,
    pub libnvidia_ml: Option<PathBuf>,
    /// The accounting file all the container's processes share.
    pub accounting_file: PathBuf,
    /// When the core limit holds; absent: [`CorePolicy::Force`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_policy: Option<CorePolicy>,
    /// The node runs MPS: the core limit is MPS's active thread percentage, so the interceptor
    /// measures GPU time but does not hold launches back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mps: bool,
}

/// When a container's core limit holds (`[gpu] core_policy`), after HAMi-core's
/// `GPU_CORE_UTILIZATION_POLICY`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CorePolicy {
    /// Always, alone on the GPU or not: a limit a user can plan on.
    #[default]
    Force,
    /// Only while another process uses the GPU: a container alone may use what would sit idle.
    Shared,
    /// Never: GPU time is measured and shown, launches are not held back.
    Disable,
}

/// The accounting file every process of a GPU container shares (written by the interceptor,
/// `interceptor/src/ledger.rs`; read by the daemon for its GPU memory gauges): an array of
/// 64-byte records, one per (process, GPU).
///
/// | bytes  | field                                                  |
/// |--------|--------------------------------------------------------|
/// | 0..4   | magic `0x56475055`; 0 marks a free record              |
/// | 4..8   | pid (in the container's pid namespace)                 |
/// | 8..16  | the process's start time (`/proc/<pid>/stat` field 22) |
/// | 16..32 | GPU UUID                                               |
/// | 32..40 | bytes held                                             |
/// | 40..44 | the process's pid as the driver (NVML) names it: the host's; 0 if not known |
/// | 44..48 | process records: the share of the GPU its kernels took in the last whole second, permille (low 16 bits), and that second since the epoch mod 65536 (high 16 bits); 0 if none |
/// | 48..56 | microseconds the core limiter has held its kernel launches back |
/// | 56..64 | FNV-1a checksum of bytes 0..56                         |
///
/// A record whose UUID is all zeros is a *process record*: it holds no memory, but the host pid,
/// the throttled time, the last second's share and, in bytes 32..40, the GPU time its kernels
/// took, in nanoseconds. The process record with pid 0 and start 0 keeps the throttled and GPU
/// time of the container's processes that are gone, folded in when their records are reclaimed,
/// so the container's totals only grow.
pub mod ledger {
    pub const MAGIC: u32 = 0x5647_5055;
    pub const RECORD: usize = 64;

    /// One record's fields.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Entry {
        pub pid: u32,
        pub start: u64,
        pub uuid: [u8; 16],
        pub used: u64,
        pub host_pid: u32,
        /// Process records: (second mod 65536) << 16 | permille of the GPU.
        pub window: u32,
        pub throttled_us: u64,
    }

    /// A process record's `window`: the share of `second`, permille.
    pub fn window(second: u64, permille: u32) -> u32 {
        ((second as u32) << 16) | permille.min(0xffff)
    }

    /// The share in `window`, permille, if its second is within `fresh` seconds of `now`.
    pub fn fresh_share(window: u32, now: u64, fresh: u64) -> Option<u32> {
        let second = u64::from(window >> 16);
        let age = (now.wrapping_sub(second)) & 0xffff;
        (window != 0 && age <= fresh).then_some(window & 0xffff)
    }

    /// The UUID of process records.
    pub const PROCESS: [u8; 16] = [0; 16];

    impl Entry {
        /// Whether this is the record of the throttled time of the processes that are gone.
        pub fn is_totals(&self) -> bool {
            self.pid == 0 && self.start == 0 && self.uuid == PROCESS
        }
    }

    impl Entry {
        pub fn encode(&self) -> [u8; RECORD] {
            let mut b = [0u8; RECORD];
            b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
            b[4..8].copy_from_slice(&self.pid.to_le_bytes());
            b[8..16].copy_from_slice(&self.start.to_le_bytes());
            b[16..32].copy_from_slice(&self.uuid);
            b[32..40].copy_from_slice(&self.used.to_le_bytes());
            b[40..44].copy_from_slice(&self.host_pid.to_le_bytes());
            b[44..48].copy_from_slice(&self.window.to_le_bytes());
            b[48..56].copy_from_slice(&self.throttled_us.to_le_bytes());
            let sum = fnv1a(&b[..56]);
            b[56..64].copy_from_slice(&sum.to_le_bytes());
            b
        }

        /// `None` for a free record, a short one, or one whose checksum does not match.
        pub fn decode(b: &[u8]) -> Option<Entry> {
            let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
            let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
            if b.len() != RECORD || u32_at(0) != MAGIC || u64_at(56) != fnv1a(&b[..56]) {
                return None;
            }
            let mut uuid = [0u8; 16];
            uuid.copy_from_slice(&b[16..32]);
            Some(Entry {
                pid: u32_at(4),
                start: u64_at(8),
                uuid,
                used: u64_at(32),
                host_pid: u32_at(40),
                window: u32_at(44),
                throttled_us: u64_at(48),
            })
        }
    }

    fn fnv1a(data: &[u8]) -> u64 {
        data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn entries_encode_and_decode_and_torn_ones_do_not() {
            let e = Entry {
                pid: 42,
                start: 7,
                uuid: [9; 16],
                used: 123,
                host_pid: 4242,
                window: window(70_000, 300),
                throttled_us: 99,
            };
            let mut b = e.encode();
            assert_eq!(Entry::decode(&b), Some(e));
            assert_eq!(Entry::decode(&[0u8; RECORD]), None);
            assert_eq!(Entry::decode(&b[..RECORD - 1]), None);
            b[33] ^= 1;
            assert_eq!(Entry::decode(&b), None, "a torn write fails its checksum");
            assert_eq!(fresh_share(e.window, 70_002, 3), Some(300));
            assert_eq!(fresh_share(e.window, 70_010, 3), None, "stale");
            assert_eq!(
                fresh_share(window(65_535, 10), 65_537, 3),
                Some(10),
                "wraps"
            );
            assert_eq!(fresh_share(0, 0, 3), None);
        }
    }
}
