//! The GPU interceptor's accounting file. The interceptor is a `cdylib` that defines `dlsym`,
//! so it is not linked here: its ledger (and the CUDA types it uses) are compiled in from source.

use std::io;

use crate::cuda::CUuuid;
use crate::interceptor_ledger::{Ledger, Processes};

/// Processes for the ledger: this one is pid 4242, and even pids are alive.
struct EvenPidsAlive;

impl Processes for EvenPidsAlive {
    fn me(&self) -> io::Result<(u32, u64)> {
        Ok((4242, 7))
    }
    fn alive(&self, pid: u32, _start: u64) -> bool {
        pid.is_multiple_of(2)
    }
}

/// The file as another process of the container left it, then a reserve, a query, the process
/// record's host pid, throttled and GPU time and last second's share (which a dead process's
/// record hands to the totals), the container's host pids, and a release.
pub fn vgpu_ledger(data: &[u8]) {
    let file = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(file.path(), data).expect("writing the ledger");
    let mut ledger = Ledger::with_processes(file.path().into(), Box::new(EvenPidsAlive));
    let gpu = CUuuid { bytes: [1; 16] };
    const LIMIT: u64 = 1 << 30;
    if let Ok(true) = ledger.reserve(&gpu, 1 << 20, LIMIT) {
        let used = ledger.used(&gpu).expect("reading the ledger back");
        assert!(
            used <= LIMIT,
            "{used} bytes in use after a reserve within {LIMIT}"
        );
    }
    let _ = ledger.set_host_pid(77);
    let _ = ledger.add_throttled(u64::MAX);
    // The GPU time of the others comes back whatever they wrote, saturated, never a panic.
    let _ = ledger.flush_gpu_time(u64::MAX, u64::MAX, Some((u64::MAX, u32::MAX)));
    let _ = ledger.flush_gpu_time(1, 1, None);
    if let Ok(pids) = ledger.host_pids() {
        assert!(pids.contains(&77), "this process's host pid: {pids:?}");
    }
    let _ = ledger.release(&gpu, 1 << 20);
}

/// A ledger file with three records (pids 4242, 4243 and 4244 on two GPUs), for the seed corpus.
#[doc(hidden)]
pub fn ledger_seed() -> Vec<u8> {
    struct Pid(u32);
    impl Processes for Pid {
        fn me(&self) -> io::Result<(u32, u64)> {
            Ok((self.0, 7))
        }
        fn alive(&self, _: u32, _: u64) -> bool {
            true
        }
    }
    let file = tempfile::NamedTempFile::new().expect("a temporary file");
    for (pid, gpu) in [(4242, 0), (4243, 0), (4244, 1)] {
        let mut l = Ledger::with_processes(file.path().into(), Box::new(Pid(pid)));
        let uuid = CUuuid {
            bytes: [gpu + 1; 16],
        };
        l.reserve(&uuid, u64::from(pid) << 10, u64::MAX)
            .expect("writing the seed ledger");
    }
    std::fs::read(file.path()).expect("reading the seed ledger")
}
