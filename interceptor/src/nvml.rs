//! NVML: the memory queries report the limit (so `nvidia-smi` in the container shows it), and
//! the core limiter's watcher reads GPU utilization through it.
//!
//! The exported functions are the driver API's own: their safety contract is the one `cuda.h`
//! (`nvml.h`) documents, and they are meant to be called from C only.

#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::cuda::{format_uuid, parse_uuid, CUuuid};
use crate::limiter::{Bucket, PERIOD};
use crate::lock;
use crate::real::{Lib, Slot};
use crate::state::{mode, Limited, Mode};

pub type NvmlReturn = i32;
pub type NvmlDevice = *mut c_void;

pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NO_PERMISSION: NvmlReturn = 4;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
/// NVML's "not available" for a process's memory.
const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;
/// The most list entries read from NVML at once: far more processes than one GPU runs.
const MAX_LIST: u32 = 4096;

#[repr(C)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
#[derive(Default)]
struct NvmlUtilization {
    gpu: u32,
    memory: u32,
}

pub mod slots {
    use super::{Lib, Slot};

    pub static GET_MEMORY_INFO: Slot = Slot::new(Lib::Nvml, c"nvmlDeviceGetMemoryInfo");
    pub static GET_MEMORY_INFO_V2: Slot = Slot::new(Lib::Nvml, c"nvmlDeviceGetMemoryInfo_v2");
    pub static GET_UUID: Slot = Slot::new(Lib::Nvml, c"nvmlDeviceGetUUID");
    pub static INIT_V2: Slot = Slot::new(Lib::Nvml, c"nvmlInit_v2");
    pub static GET_HANDLE_BY_UUID: Slot = Slot::new(Lib::Nvml, c"nvmlDeviceGetHandleByUUID");
    pub static GET_UTILIZATION: Slot = Slot::new(Lib::Nvml, c"nvmlDeviceGetUtilizationRates");
    pub static GET_PROCESS_UTILIZATION: Slot =
        Slot::new(Lib::Nvml, c"nvmlDeviceGetProcessUtilization");
    pub static COMPUTE_PROCS: Slot = Slot::new(Lib::Nvml, c"nvmlDeviceGetComputeRunningProcesses");
    pub static COMPUTE_PROCS_V2: Slot =
        Slot::new(Lib::Nvml, c"nvmlDeviceGetComputeRunningProcesses_v2");
    pub static COMPUTE_PROCS_V3: Slot =
        Slot::new(Lib::Nvml, c"nvmlDeviceGetComputeRunningProcesses_v3");
    pub static GRAPHICS_PROCS: Slot =
        Slot::new(Lib::Nvml, c"nvmlDeviceGetGraphicsRunningProcesses");
    pub static GRAPHICS_PROCS_V2: Slot =
        Slot::new(Lib::Nvml, c"nvmlDeviceGetGraphicsRunningProcesses_v2");
    pub static GRAPHICS_PROCS_V3: Slot =
        Slot::new(Lib::Nvml, c"nvmlDeviceGetGraphicsRunningProcesses_v3");
    pub static MPS_PROCS: Slot = Slot::new(Lib::Nvml, c"nvmlDeviceGetMPSComputeRunningProcesses");
    pub static MPS_PROCS_V2: Slot =
        Slot::new(Lib::Nvml, c"nvmlDeviceGetMPSComputeRunningProcesses_v2");
    pub static MPS_PROCS_V3: Slot =
        Slot::new(Lib::Nvml, c"nvmlDeviceGetMPSComputeRunningProcesses_v3");
}

macro_rules! real {
    ($slot:expr, $ty:ty) => {
        // SAFETY: $ty is the C signature of the slot's symbol, as declared in nvml.h.
        match unsafe { $slot.get::<$ty>() } {
            Some(f) => f,
            None => return NVML_ERROR_FUNCTION_NOT_FOUND,
        }
    };
}

/// The device's UUID, from NVML.
fn device_uuid(device: NvmlDevice) -> Option<CUuuid> {
    type F = unsafe extern "C" fn(NvmlDevice, *mut c_char, u32) -> NvmlReturn;
    // SAFETY: nvmlDeviceGetUUID(nvmlDevice_t, char *uuid, unsigned int length).
    let f = unsafe { slots::GET_UUID.get::<F>() }?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: `buf` outlives the call and its length is passed.
    if unsafe { f(device, buf.as_mut_ptr(), buf.len() as u32) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated string into `buf`.
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
    parse_uuid(s.to_str().ok()?)
}

/// (total, free, used) as the container may see them.
fn limited(device: NvmlDevice, total: u64, free: u64, used: u64) -> (u64, u64, u64) {
    let Mode::Limited(l) = mode() else {
        return (total, free, used);
    };
    let (Some(limit), Some(uuid)) = (l.config.memory_limit_bytes, device_uuid(device)) else {
        return (total, free, used);
    };
    let used = lock(&l.ledger).used(&uuid).unwrap_or(used);
    let total = total.min(limit);
    (total, free.min(total.saturating_sub(used)), used)
}

fn refused() -> bool {
    matches!(mode(), Mode::Broken(_))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut NvmlMemory,
) -> NvmlReturn {
    if refused() {
        return NVML_ERROR_NO_PERMISSION;
    }
    type F = unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> NvmlReturn;
    let f = real!(slots::GET_MEMORY_INFO, F);
    // SAFETY: forwarding the caller's arguments; `memory` was filled on success.
    unsafe {
        let r = f(device, memory);
        if let (NVML_SUCCESS, Some(m)) = (r, memory.as_mut()) {
            (m.total, m.free, m.used) = limited(device, m.total, m.free, m.used);
        }
        r
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    if refused() {
        return NVML_ERROR_NO_PERMISSION;
    }
    type F = unsafe extern "C" fn(NvmlDevice, *mut NvmlMemoryV2) -> NvmlReturn;
    let f = real!(slots::GET_MEMORY_INFO_V2, F);
    // SAFETY: as in nvmlDeviceGetMemoryInfo.
    unsafe {
        let r = f(device, memory);
        if let (NVML_SUCCESS, Some(m)) = (r, memory.as_mut()) {
            (m.total, m.free, m.used) = limited(device, m.total, m.free, m.used);
        }
        r
    }
}

/// NVML initialised for the interceptor's own queries, once per process.
fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        type Init = unsafe extern "C" fn() -> NvmlReturn;
        // SAFETY: nvmlInit_v2 takes no arguments.
        unsafe { slots::INIT_V2.get::<Init>() }
            .is_some_and(|init| unsafe { init() } == NVML_SUCCESS)
    })
}

/// NVML's handle of the GPU with this UUID.
pub(crate) fn device(uuid: &CUuuid) -> Option<NvmlDevice> {
    type ByUuid = unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn;
    if !ready() {
        return None;
    }
    // SAFETY: nvml.h's signature.
    let by_uuid = unsafe { slots::GET_HANDLE_BY_UUID.get::<ByUuid>() }?;
    // As the config names it (a MIG device is `MIG-…`), else NVML's form of a GPU's.
    let configured = match mode() {
        Mode::Limited(l) => l
            .config
            .device_uuids
            .iter()
            .find(|u| parse_uuid(u).as_ref() == Some(uuid))
            .cloned(),
        _ => None,
    };
    let c = std::ffi::CString::new(configured.unwrap_or_else(|| format_uuid(uuid))).ok()?;
    let mut d: NvmlDevice = std::ptr::null_mut();
    // SAFETY: `c` and `d` outlive the call.
    (unsafe { by_uuid(c.as_ptr(), &mut d) } == NVML_SUCCESS).then_some(d)
}

/// Bytes per entry of NVML's lists: `nvmlProcessInfo_v1_t`; `nvmlProcessInfo_v2_t` (and `_t`);
/// `nvmlProcessUtilizationSample_t`. Each starts with the pid as an `unsigned int`.
const PROCESS_V1: usize = 16;
const PROCESS_V2: usize = 24;
const SAMPLE: usize = 32;

/// A whole list from NVML: `call(count, buffer)` is asked for the count first, then filled,
/// with room for a few more should processes have started in between. Capped at [`MAX_LIST`]
/// entries. The entries' raw bytes, `stride` each.
fn read_list(
    stride: usize,
    call: impl Fn(*mut u32, *mut c_void) -> NvmlReturn,
) -> Result<Vec<u8>, NvmlReturn> {
    let mut n = 0u32;
    match call(&mut n, std::ptr::null_mut()) {
        NVML_SUCCESS if n == 0 => return Ok(Vec::new()),
        NVML_SUCCESS | NVML_ERROR_INSUFFICIENT_SIZE => {}
        r => return Err(r),
    }
    for _ in 0..3 {
        let cap = n.saturating_add(8).min(MAX_LIST);
        // u64s, so the entries' 64-bit fields are aligned.
        let mut buf = vec![0u64; (cap as usize * stride).div_ceil(8)];
        let mut got = cap;
        match call(&mut got, buf.as_mut_ptr().cast()) {
            NVML_SUCCESS => {
                let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
                return Ok(bytes[..got.min(cap) as usize * stride].to_vec());
            }
            NVML_ERROR_INSUFFICIENT_SIZE if cap < MAX_LIST => n = got.max(cap),
            r => return Err(r),
        }
    }
    Err(NVML_ERROR_INSUFFICIENT_SIZE)
}

fn u32_at(entry: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(entry[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(entry: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(entry[at..at + 8].try_into().unwrap_or_default())
}

type ListFn = unsafe extern "C" fn(NvmlDevice, *mut u32, *mut c_void) -> NvmlReturn;

/// The processes running on `device` as NVML names them (host pids) and the device memory
/// each holds (`None` where NVML cannot say).
pub(crate) fn processes(device: NvmlDevice) -> Option<Vec<(u32, Option<u64>)>> {
    let (slot, stride) = [
        (&slots::COMPUTE_PROCS_V3, PROCESS_V2),
        (&slots::COMPUTE_PROCS_V2, PROCESS_V2),
        (&slots::COMPUTE_PROCS, PROCESS_V1),
    ]
    .into_iter()
    .find(|(s, _)| s.addr().is_some())?;
    // SAFETY: the nvml.h signature of these three.
    let f = unsafe { slot.get::<ListFn>() }?;
    // SAFETY: NVML fills at most `count` entries of `stride` bytes.
    let raw = read_list(stride, |c, b| unsafe { f(device, c, b) }).ok()?;
    Some(
        raw.chunks(stride)
            .map(|e| {
                let used = u64_at(e, 8);
                (
                    u32_at(e, 0),
                    (used != NVML_VALUE_NOT_AVAILABLE).then_some(used),
                )
            })
            .collect(),
    )
}

/// (this process's pid << 32) | its host pid; 0 while not known. Tagged with the pid because a
/// forked child is another process to the driver.
static HOST_PID: AtomicU64 = AtomicU64::new(0);

/// This process's pid as the driver names it, once a context has told (see `context`).
pub fn host_pid() -> Option<u32> {
    let v = HOST_PID.load(Ordering::Acquire);
    let (me, host) = ((v >> 32) as u32, v as u32);
    (me == std::process::id() && host != 0).then_some(host)
}

/// Remember `pid` as this process's host pid.
pub(crate) fn set_host_pid(pid: u32) {
    let me = u64::from(std::process::id());
    HOST_PID.store(me << 32 | u64::from(pid), Ordering::Release);
}

/// The container's processes as NVML names them: every host pid its live processes recorded.
fn own_pids(l: &Limited) -> Vec<u32> {
    let mut own = lock(&l.ledger).host_pids().unwrap_or_default();
    own.extend(host_pid());
    own
}

/// Keep the entries of `raw` whose pid is in `own`, and hand them to the caller as NVML would:
/// `count` in, the room there is; out, how many there are.
///
/// # Safety
/// `count` is valid; `out` has room for `*count` entries of `stride` bytes (or is null).
unsafe fn hand_out(
    raw: &[u8],
    stride: usize,
    own: &[u32],
    count: *mut u32,
    out: *mut c_void,
) -> NvmlReturn {
    let kept: Vec<&[u8]> = raw
        .chunks(stride)
        .filter(|e| own.contains(&u32_at(e, 0)))
        .collect();
    // SAFETY: per this function's contract.
    unsafe {
        let room = *count as usize;
        *count = kept.len() as u32;
        if kept.len() > room {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        if kept.is_empty() {
            return NVML_SUCCESS;
        }
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        for (i, e) in kept.iter().enumerate() {
            std::ptr::copy_nonoverlapping(e.as_ptr(), out.cast::<u8>().add(i * stride), stride);
        }
    }
    NVML_SUCCESS
}

/// A process list hook: the container sees its own processes only, never its neighbours'.
unsafe fn own_processes(
    slot: &Slot,
    stride: usize,
    device: NvmlDevice,
    count: *mut u32,
    infos: *mut c_void,
) -> NvmlReturn {
    if refused() {
        return NVML_ERROR_NO_PERMISSION;
    }
    let f = real!(slot, ListFn);
    let Mode::Limited(l) = mode() else {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { f(device, count, infos) };
    };
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: NVML fills at most `count` entries of `stride` bytes.
    let raw = match read_list(stride, |c, b| unsafe { f(device, c, b) }) {
        Ok(raw) => raw,
        Err(r) => return r,
    };
    // SAFETY: the caller's count and buffer, per nvml.h.
    unsafe { hand_out(&raw, stride, &own_pids(l), count, infos) }
}

macro_rules! process_list_hooks {
    ($($name:ident: $slot:ident, $stride:expr;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            device: NvmlDevice,
            count: *mut u32,
            infos: *mut c_void,
        ) -> NvmlReturn {
            // SAFETY: forwarding the caller's arguments.
            unsafe { own_processes(&slots::$slot, $stride, device, count, infos) }
        }
    )*};
}

process_list_hooks! {
    nvmlDeviceGetComputeRunningProcesses: COMPUTE_PROCS, PROCESS_V1;
    nvmlDeviceGetComputeRunningProcesses_v2: COMPUTE_PROCS_V2, PROCESS_V2;
    nvmlDeviceGetComputeRunningProcesses_v3: COMPUTE_PROCS_V3, PROCESS_V2;
    nvmlDeviceGetGraphicsRunningProcesses: GRAPHICS_PROCS, PROCESS_V1;
    nvmlDeviceGetGraphicsRunningProcesses_v2: GRAPHICS_PROCS_V2, PROCESS_V2;
    nvmlDeviceGetGraphicsRunningProcesses_v3: GRAPHICS_PROCS_V3, PROCESS_V2;
    nvmlDeviceGetMPSComputeRunningProcesses: MPS_PROCS, PROCESS_V1;
    nvmlDeviceGetMPSComputeRunningProcesses_v2: MPS_PROCS_V2, PROCESS_V2;
    nvmlDeviceGetMPSComputeRunningProcesses_v3: MPS_PROCS_V3, PROCESS_V2;
}

type ProcessUtilization =
    unsafe extern "C" fn(NvmlDevice, *mut c_void, *mut u32, u64) -> NvmlReturn;

/// Per-process utilization samples: the container's own only.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: NvmlDevice,
    samples: *mut c_void,
    count: *mut u32,
    last_seen: u64,
) -> NvmlReturn {
    if refused() {
        return NVML_ERROR_NO_PERMISSION;
    }
    let f = real!(slots::GET_PROCESS_UTILIZATION, ProcessUtilization);
    let Mode::Limited(l) = mode() else {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { f(device, samples, count, last_seen) };
    };
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: NVML fills at most `count` samples.
    let raw = match read_list(SAMPLE, |c, b| unsafe { f(device, b, c, last_seen) }) {
        Ok(raw) => raw,
        Err(r) => return r,
    };
    // SAFETY: the caller's count and buffer, per nvml.h.
    unsafe { hand_out(&raw, SAMPLE, &own_pids(l), count, samples) }
}

/// The pid whose watcher thread runs (a forked child starts its own).
static WATCHER: AtomicU32 = AtomicU32::new(0);

/// Start the thread that steers the core limiter's bucket, once per process.
///
/// It steers by the SM use of the container's own processes (NVML's per-process utilization,
/// for the host pids the container's processes recorded), so a busy neighbour on the same GPU
/// does not slow the container. Where per-process utilization is not available, or the
/// container's pids are not known, it steers by the whole GPU's utilization instead (said once
/// on stderr): never less strict than the limit.
pub(crate) fn ensure_watcher(
    l: &'static Limited,
    percent: u32,
    bucket: &'static Mutex<Option<Bucket>>,
) {
    let me = std::process::id();
    if WATCHER.swap(me, Ordering::AcqRel) == me {
        return;
    }
    let Some(sample) = Sampler::new(&l.config.device_uuids) else {
        crate::warn(format_args!(
            "core limit {percent}% not enforced: NVML utilization is not available"
        ));
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("crishim-vgpu".into())
        .spawn(move || {
            let mut said = false;
            let mut seen = vec![Seen::default(); sample.devices.len()];
            loop {
                std::thread::sleep(PERIOD);
                let util = match sample.own_utilization(&own_pids(l), &mut seen) {
                    Ok(u) => u,
                    Err(why) => {
                        if !said {
                            said = true;
                            crate::warn(format_args!(
                                "core limit {percent}% steered by the whole GPU's utilization: {why}"
                            ));
                        }
                        Some(sample.utilization())
                    }
                };
                // No new sample: steering again on the last one would act on it twice.
                if let Some(util) = util {
                    let mut b = lock(bucket);
                    let now = Instant::now();
                    b.get_or_insert_with(|| Bucket::new(now))
                        .steer(percent, util, now);
                }
                let waited = crate::limiter::take_throttled();
                if waited > 0 {
                    let _ = lock(&l.ledger).add_throttled(waited);
                }
            }
        });
    if let Err(e) = spawned {
        crate::warn(format_args!("core limit {percent}% not enforced: {e}"));
    }
}

/// Reads the granted GPUs' utilization.
struct Sampler {
    devices: Vec<usize>,
    get: unsafe extern "C" fn(NvmlDevice, *mut NvmlUtilization) -> NvmlReturn,
}

impl Sampler {
    fn new(uuids: &[String]) -> Option<Sampler> {
        type Get = unsafe extern "C" fn(NvmlDevice, *mut NvmlUtilization) -> NvmlReturn;
        // SAFETY: the type is nvml.h's signature of this symbol.
        let get = unsafe { slots::GET_UTILIZATION.get::<Get>() }?;
        let devices: Vec<usize> = uuids
            .iter()
            .filter_map(|u| parse_uuid(u))
            .filter_map(|u| device(&u))
            .map(|d| d as usize)
            .collect();
        (!devices.is_empty()).then_some(Sampler { devices, get })
    }

    /// The busiest granted GPU's utilization, percent.
    fn utilization(&self) -> u32 {
        self.devices
            .iter()
            .filter_map(|d| {
                let mut u = NvmlUtilization::default();
                // SAFETY: a device handle from NVML and an output it fills.
                (unsafe { (self.get)(*d as NvmlDevice, &mut u) } == NVML_SUCCESS).then_some(u.gpu)
            })
            .max()
            .unwrap_or(0)
    }

    /// The container's share of the busiest granted GPU, percent, from the per-process samples
    /// NVML made since the ones `seen` records; `None` while there are none (NVML samples every
    /// 1/6 to 1/5 s). A GPU with no sample for [`STALE`] ran nothing: 0.
    fn own_utilization(&self, own: &[u32], seen: &mut [Seen]) -> Result<Option<u32>, &'static str> {
        if own.is_empty() {
            return Err("the container's processes are not known to the driver yet");
        }
        // SAFETY: the nvml.h signature.
        let f = unsafe { slots::GET_PROCESS_UTILIZATION.get::<ProcessUtilization>() }
            .ok_or("the driver has no per-process utilization")?;
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let now = Instant::now();
        let mut busiest: Option<u32> = None;
        for (d, seen) in self.devices.iter().zip(seen.iter_mut()) {
            // Samples after the newest already used, and none older than a second.
            let after = seen
                .newest
                .max(wall.saturating_sub(STALE.as_micros() as u64));
            // SAFETY: NVML fills at most `count` samples.
            let raw = match read_list(SAMPLE, |c, b| unsafe { f(*d as NvmlDevice, b, c, after) }) {
                Ok(raw) => raw,
                Err(NVML_ERROR_NOT_FOUND) => Vec::new(),
                Err(_) => return Err("per-process utilization failed"),
            };
            let share = match own_share(&raw, own, after) {
                Some((share, newest)) => {
                    // A timestamp from the future (a clock step, a bad driver) must not hide
                    // every later sample.
                    let newest = newest.min(wall.saturating_add(STALE.as_micros() as u64));
                    *seen = Seen {
                        newest,
                        at: Some(now),
                    };
                    share
                }
                None if seen.at.is_some_and(|at| now.duration_since(at) < STALE) => continue,
                None => {
                    seen.at = Some(now);
                    0
                }
            };
            busiest = Some(busiest.map_or(share, |b| b.max(share)));
        }
        Ok(busiest)
    }
}

/// A GPU with no new per-process sample for this long ran nothing.
const STALE: Duration = Duration::from_secs(1);

/// The per-process samples of one GPU the watcher has used.
#[derive(Clone, Copy, Default)]
struct Seen {
    /// NVML's timestamp of the newest, microseconds.
    newest: u64,
    /// When the watcher last had a new one, or read the GPU as idle.
    at: Option<Instant>,
}

/// The SM use of `own`'s processes in raw `nvmlProcessUtilizationSample_t`s newer than `after`,
/// averaged over the distinct sample times, at most 100; and the newest time. `None` when no
/// sample is newer.
///
/// Each sample time is one slice of the GPU's time. A time-slicing GPU gives each slice to the
/// one process whose context ran, at about 99; a neighbour's slice counts 0 for the container.
/// Where several processes share a slice, the container's processes' use in it is summed.
fn own_share(raw: &[u8], own: &[u32], after: u64) -> Option<(u32, u64)> {
    let mut slices: HashMap<u64, u32> = HashMap::new();
    for e in raw.chunks_exact(SAMPLE) {
        let (pid, at, sm) = (u32_at(e, 0), u64_at(e, 8), u32_at(e, 16));
        if at <= after {
            continue;
        }
        let mine = slices.entry(at).or_default();
        if own.contains(&pid) {
            *mine = (*mine + sm.min(100)).min(100);
        }
    }
    let newest = *slices.keys().max()?;
    let sum: u64 = slices.values().map(|&v| u64::from(v)).sum();
    Some(((sum / slices.len() as u64) as u32, newest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, at: u64, sm: u32) -> [u8; SAMPLE] {
        let mut e = [0u8; SAMPLE];
        e[0..4].copy_from_slice(&pid.to_ne_bytes());
        e[8..16].copy_from_slice(&at.to_ne_bytes());
        e[16..20].copy_from_slice(&sm.to_ne_bytes());
        e
    }

    #[test]
    fn own_share_averages_the_containers_use_over_the_sample_times() {
        // A slice per process on a time-slicing GPU: two of the container's, one neighbour's.
        let sliced: Vec<u8> = [
            sample(10, 5, 99),
            sample(99, 6, 99), // a neighbour
            sample(11, 7, 99),
        ]
        .concat();
        assert_eq!(own_share(&sliced, &[10, 11], 0), Some((66, 7)));
        assert_eq!(
            own_share(&sliced, &[12], 0),
            Some((0, 7)),
            "a neighbour's only"
        );
        // Only samples after the last one used count; none newer is no reading.
        assert_eq!(own_share(&sliced, &[10, 11], 5), Some((49, 7)));
        assert_eq!(own_share(&sliced, &[10, 11], 7), None);
        // Processes that share one sample time (a fake driver, MPS): their use is summed.
        let shared: Vec<u8> = [
            sample(10, 1, 20),
            sample(11, 1, 15),
            sample(99, 1, 100),
            sample(10, 2, 80),
            sample(11, 2, 80),
        ]
        .concat();
        assert_eq!(
            own_share(&shared, &[10, 11], 0),
            Some((67, 2)),
            "(35 + 100) / 2"
        );
        assert_eq!(
            own_share(&[0u8; SAMPLE - 1], &[10], 0),
            None,
            "a torn entry"
        );
    }

    #[test]
    fn lists_are_handed_out_filtered_and_sized_as_nvml_does() {
        let entry = |pid: u32| {
            let mut e = [0u8; PROCESS_V2];
            e[0..4].copy_from_slice(&pid.to_ne_bytes());
            e[8..16].copy_from_slice(&u64::from(pid).to_ne_bytes());
            e
        };
        let raw: Vec<u8> = [entry(10), entry(99), entry(11)].concat();
        let mut out = [0u8; PROCESS_V2 * 2];
        let mut count = 1u32;
        let mut give = |count: &mut u32| {
            // SAFETY: `out` has room for 2 entries; `count` says at most that.
            unsafe { hand_out(&raw, PROCESS_V2, &[10, 11], count, out.as_mut_ptr().cast()) }
        };
        let r = give(&mut count);
        assert_eq!((r, count), (NVML_ERROR_INSUFFICIENT_SIZE, 2));
        let r = give(&mut count);
        assert_eq!((r, count), (NVML_SUCCESS, 2));
        assert_eq!(out[..PROCESS_V2], entry(10));
        assert_eq!(out[PROCESS_V2..], entry(11));
        let mut none = 0u32;
        // SAFETY: nothing is written with nothing kept.
        let r = unsafe { hand_out(&raw, PROCESS_V2, &[], &mut none, std::ptr::null_mut()) };
        assert_eq!((r, none), (NVML_SUCCESS, 0), "no pid known: nothing shown");
    }

    #[test]
    fn lists_are_read_whole_and_capped() {
        let calls = std::cell::Cell::new(0);
        let raw = read_list(PROCESS_V1, |c, b| {
            calls.set(calls.get() + 1);
            // SAFETY: `c` is read_list's.
            let room = unsafe { *c };
            unsafe { *c = 3 };
            if b.is_null() || room < 3 {
                return NVML_ERROR_INSUFFICIENT_SIZE;
            }
            NVML_SUCCESS
        })
        .unwrap();
        assert_eq!(raw.len(), 3 * PROCESS_V1);
        // A list that never fits is given up on, not grown without bound.
        let r = read_list(PROCESS_V1, |c, _| {
            // SAFETY: `c` is read_list's.
            unsafe { *c = u32::MAX };
            NVML_ERROR_INSUFFICIENT_SIZE
        });
        assert_eq!(r, Err(NVML_ERROR_INSUFFICIENT_SIZE));
    }
}
