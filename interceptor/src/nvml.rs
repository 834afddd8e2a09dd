//! NVML: the memory queries report the limit (so `nvidia-smi` in the container shows it), and
//! the core limiter's watcher reads GPU utilization through it.
//!
//! The exported functions are the driver API's own: their safety contract is the one `cuda.h`
//! (`nvml.h`) documents, and they are meant to be called from C only.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::cuda::{format_uuid, parse_uuid, CUuuid};
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
pub(crate) fn own_pids(l: &Limited) -> Vec<u32> {
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

/// NVML's per-process utilization samples of the granted GPUs, read as they come: whose
/// context held the GPU at each sample's instant. A time-slicing GPU gives each sample to one
/// process (at about 99): the samples that fall while the container's kernels are in flight say
/// how much of that time was its own (see `limiter::Dilation`).
pub(crate) struct Samples {
    /// (device, NVML's timestamp of the newest sample read, µs).
    devices: Vec<(usize, u64)>,
    get: ProcessUtilization,
}

/// Samples are read no further back than this.
const HORIZON_US: u64 = 5_000_000;

impl Samples {
    pub(crate) fn new(uuids: &[String]) -> Option<Samples> {
        // SAFETY: the nvml.h signature.
        let get = unsafe { slots::GET_PROCESS_UTILIZATION.get::<ProcessUtilization>() }?;
        let devices: Vec<(usize, u64)> = uuids
            .iter()
            .filter_map(|u| parse_uuid(u))
            .filter_map(|u| device(&u))
            // Samples from before this process's limiter started are not its business.
            .map(|d| (d as usize, crate::wall_us()))
            .collect();
        (!devices.is_empty()).then_some(Samples { devices, get })
    }

    /// (host pid, µs since the epoch) of each sample newer than those read before in which a
    /// process used the SMs.
    pub(crate) fn read(&mut self) -> Vec<(u32, u64)> {
        let get = self.get;
        let wall = crate::wall_us();
        let mut out = Vec::new();
        for (d, newest) in &mut self.devices {
            let after = (*newest).max(wall.saturating_sub(HORIZON_US));
            // SAFETY: NVML fills at most `count` samples.
            let Ok(raw) = read_list(SAMPLE, |c, b| unsafe { get(*d as NvmlDevice, b, c, after) })
            else {
                continue;
            };
            *newest = fresh(&raw, after, wall, &mut out).max(*newest);
        }
        out
    }
}

/// Append the (pid, time) of `raw`'s samples newer than `after` with SM use to `out`; the
/// newest time, no later than a second past `wall` (a timestamp from the future, from a clock
/// step or a bad driver, must not hide every later sample).
fn fresh(raw: &[u8], after: u64, wall: u64, out: &mut Vec<(u32, u64)>) -> u64 {
    let mut newest = after;
    for e in raw.chunks_exact(SAMPLE) {
        let (pid, at, sm) = (u32_at(e, 0), u64_at(e, 8), u32_at(e, 16));
        if at <= after {
            continue;
        }
        newest = newest.max(at.min(wall.saturating_add(1_000_000)));
        if sm > 0 {
            out.push((pid, at));
        }
    }
    newest
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
    fn only_new_samples_with_sm_use_are_kept_and_the_future_is_clamped() {
        let raw: Vec<u8> = [
            sample(10, 5, 99),
            sample(99, 6, 0), // idle
            sample(11, 7, 99),
            sample(12, u64::MAX, 99), // from the future
        ]
        .concat();
        let mut out = Vec::new();
        let newest = fresh(&raw, 5, 100, &mut out);
        assert_eq!(out, vec![(11, 7), (12, u64::MAX)]);
        assert_eq!(newest, 1_000_100);
        let mut none = Vec::new();
        assert_eq!(
            fresh(&[0u8; SAMPLE - 1], 3, 100, &mut none),
            3,
            "a torn entry"
        );
        assert!(none.is_empty());
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
