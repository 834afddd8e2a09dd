//! NVML: the memory queries report the limit (so `nvidia-smi` in the container shows it), and
//! the core limiter's watcher reads GPU utilization through it.
//!
//! The exported functions are the driver API's own: their safety contract is the one `cuda.h`
//! (`nvml.h`) documents, and they are meant to be called from C only.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::cuda::{format_uuid, parse_uuid, CUuuid};
use crate::limiter::{Bucket, PERIOD};
use crate::real::{Lib, Slot};
use crate::state::{lock, mode, Limited, Mode};

pub type NvmlReturn = i32;
pub type NvmlDevice = *mut c_void;

pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_NO_PERMISSION: NvmlReturn = 4;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;

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

/// The pid whose watcher thread runs (a forked child starts its own).
static WATCHER: AtomicU32 = AtomicU32::new(0);

/// Start the thread that steers the core limiter's bucket, once per process.
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
        .spawn(move || loop {
            std::thread::sleep(PERIOD);
            let util = sample.utilization();
            let mut b = lock(bucket);
            let now = Instant::now();
            b.get_or_insert_with(|| Bucket::new(now))
                .steer(percent, util, now);
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
        type Init = unsafe extern "C" fn() -> NvmlReturn;
        type ByUuid = unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn;
        type Get = unsafe extern "C" fn(NvmlDevice, *mut NvmlUtilization) -> NvmlReturn;
        // SAFETY: the types are nvml.h's signatures of these symbols.
        let (init, by_uuid, get) = unsafe {
            (
                slots::INIT_V2.get::<Init>()?,
                slots::GET_HANDLE_BY_UUID.get::<ByUuid>()?,
                slots::GET_UTILIZATION.get::<Get>()?,
            )
        };
        // SAFETY: nvmlInit_v2 takes no arguments.
        if unsafe { init() } != NVML_SUCCESS {
            return None;
        }
        let mut devices = Vec::new();
        for u in uuids {
            // Normalised, so what NVML gets is exactly its own form.
            let Some(c) = parse_uuid(u).map(|p| format_uuid(&p)) else {
                continue;
            };
            let c = std::ffi::CString::new(c).ok()?;
            let mut d: NvmlDevice = std::ptr::null_mut();
            // SAFETY: `c` and `d` outlive the call.
            if unsafe { by_uuid(c.as_ptr(), &mut d) } == NVML_SUCCESS {
                devices.push(d as usize);
            }
        }
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
}
