//! Contexts. What a context takes on its GPU is charged to the process that made it, measured
//! from the driver; and a process's first context tells the interceptor its pid as the driver
//! names it (the host's), which the core limiter and the process lists go by.
//!
//! NVML lists the processes with a context on a GPU, by host pid, with the device memory each
//! holds. The list is read before and after the process's first context is made: the one new
//! pid is the process's own (HAMi-core finds it the same way). After every context change, the
//! process's charge on that GPU is what NVML says the process holds there, less what the
//! interceptor already counts for its allocations and pools: the context, and whatever else the
//! driver keeps for the process.
//!
//! The exported functions are the driver API's own: their safety contract is the one `cuda.h`
//! documents, and they are meant to be called from C only.

#![allow(clippy::missing_safety_doc)]

use std::ffi::c_void;

use crate::account::{device_uuid, On};
use crate::charges::Contexts;
use crate::cuda::*;
use crate::lock;
use crate::real::{Lib, Slot};
use crate::state::{mode, Limited, Mode};

pub mod slots {
    use super::{Lib, Slot};

    pub static CU_CTX_CREATE_V2: Slot = Slot::new(Lib::Cuda, c"cuCtxCreate_v2");
    pub static CU_CTX_CREATE_V3: Slot = Slot::new(Lib::Cuda, c"cuCtxCreate_v3");
    pub static CU_CTX_CREATE_V4: Slot = Slot::new(Lib::Cuda, c"cuCtxCreate_v4");
    pub static CU_CTX_DESTROY_V2: Slot = Slot::new(Lib::Cuda, c"cuCtxDestroy_v2");
    pub static CU_PRIMARY_CTX_RETAIN: Slot = Slot::new(Lib::Cuda, c"cuDevicePrimaryCtxRetain");
    pub static CU_PRIMARY_CTX_RELEASE: Slot = Slot::new(Lib::Cuda, c"cuDevicePrimaryCtxRelease");
    pub static CU_PRIMARY_CTX_RELEASE_V2: Slot =
        Slot::new(Lib::Cuda, c"cuDevicePrimaryCtxRelease_v2");
    pub static CU_PRIMARY_CTX_RESET: Slot = Slot::new(Lib::Cuda, c"cuDevicePrimaryCtxReset");
    pub static CU_PRIMARY_CTX_RESET_V2: Slot = Slot::new(Lib::Cuda, c"cuDevicePrimaryCtxReset_v2");
}

/// A charge larger than this is not believed: a misreporting driver must not lock a container
/// out of its GPU.
const MAX_CHARGE: u64 = 4 << 30;

/// The one pid in `after` that is not in `before`.
fn new_pid(before: &[(u32, Option<u64>)], after: &[(u32, Option<u64>)]) -> Option<u32> {
    let mut new = after
        .iter()
        .map(|p| p.0)
        .filter(|p| !before.iter().any(|b| b.0 == *p));
    match (new.next(), new.next()) {
        (Some(p), None) => Some(p),
        _ => None,
    }
}

/// The charge for a process NVML says holds `held` on a GPU where the interceptor counts
/// `tracked` for it.
fn charge_for(held: u64, tracked: u64) -> u64 {
    held.saturating_sub(tracked).min(MAX_CHARGE)
}

/// Make, retain, release or destroy a context with `call`, then settle the charges of the GPUs
/// it may have changed: `dev`'s, or (a context destroyed, its device unknown) every GPU this
/// process has a charge on. A new context is refused when the container has no room left on
/// its GPU.
fn change(dev: Option<CUdevice>, creating: bool, call: impl FnOnce() -> CUresult) -> CUresult {
    let l = match mode() {
        Mode::Broken(_) => return CUDA_ERROR_NOT_PERMITTED,
        Mode::PassThrough => return call(),
        Mode::Limited(l) => l,
    };
    let mut contexts = lock(&l.contexts);
    let uuids: Vec<CUuuid> = match dev {
        // Before cuInit there is no UUID: the driver will refuse the call itself.
        Some(d) => device_uuid(l, On::Ordinal(d)).ok().into_iter().collect(),
        None => contexts.charged.keys().copied().collect(),
    };
    if creating {
        if let (Some(limit), [uuid]) = (l.config.memory_limit_bytes, &uuids[..]) {
            if lock(&l.ledger).used(uuid).is_ok_and(|used| used >= limit) {
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
    }
    let before = match (&uuids[..], crate::nvml::host_pid()) {
        ([uuid], None) if creating => crate::nvml::device(uuid).and_then(crate::nvml::processes),
        _ => None,
    };
    let r = call();
    if r == CUDA_SUCCESS {
        for uuid in uuids {
            settle(l, &mut contexts, &uuid, before.as_deref());
        }
    }
    r
}

/// Learn the host pid if `before` allows, and set this process's context charge on `uuid` to
/// what the driver says it holds there beyond what is counted already.
fn settle(
    l: &Limited,
    contexts: &mut Contexts,
    uuid: &CUuuid,
    before: Option<&[(u32, Option<u64>)]>,
) {
    let Some(after) = crate::nvml::device(uuid).and_then(crate::nvml::processes) else {
        return;
    };
    if let (None, Some(before)) = (crate::nvml::host_pid(), before) {
        match new_pid(before, &after) {
            Some(pid) => {
                crate::nvml::set_host_pid(pid);
                if let Err(e) = lock(&l.ledger).set_host_pid(pid) {
                    crate::warn(format_args!("accounting failed: {e}"));
                }
            }
            None => crate::debug(format_args!(
                "this process's host pid is not known: the driver's process list did not \
                 change by exactly one"
            )),
        }
    }
    let Some(host) = crate::nvml::host_pid() else {
        return;
    };
    let held = match after.iter().find(|p| p.0 == host) {
        Some((_, Some(held))) => *held,
        // NVML cannot say: leave the charge as it is.
        Some((_, None)) => return,
        // No context left on this GPU.
        None => 0,
    };
    let tracked = crate::pool::charged_on(l, uuid).saturating_add(
        lock(&l.allocations)
            .values()
            .filter(|(u, _)| u == uuid)
            .fold(0u64, |sum, (_, size)| sum.saturating_add(*size)),
    );
    let want = charge_for(held, tracked);
    let had = contexts.charged.get(uuid).copied().unwrap_or(0);
    match lock(&l.ledger).rebase(uuid, had, want) {
        Ok(()) => {
            contexts.charged.insert(*uuid, want);
        }
        Err(e) => crate::warn(format_args!("accounting failed: {e}")),
    }
    crate::debug(format_args!(
        "context charge on {}: {want} bytes",
        format_uuid(uuid)
    ));
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut *mut c_void,
    flags: u32,
    dev: CUdevice,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut *mut c_void, u32, CUdevice) -> CUresult;
    let f = real!(slots::CU_CTX_CREATE_V2, F);
    // SAFETY: forwarding the caller's arguments.
    change(Some(dev), true, || unsafe { f(pctx, flags, dev) })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut *mut c_void,
    params: *mut c_void,
    num_params: i32,
    flags: u32,
    dev: CUdevice,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, i32, u32, CUdevice) -> CUresult;
    let f = real!(slots::CU_CTX_CREATE_V3, F);
    // SAFETY: forwarding the caller's arguments.
    change(Some(dev), true, || unsafe {
        f(pctx, params, num_params, flags, dev)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut *mut c_void,
    params: *mut c_void,
    flags: u32,
    dev: CUdevice,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u32, CUdevice) -> CUresult;
    let f = real!(slots::CU_CTX_CREATE_V4, F);
    // SAFETY: forwarding the caller's arguments.
    change(Some(dev), true, || unsafe { f(pctx, params, flags, dev) })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    pctx: *mut *mut c_void,
    dev: CUdevice,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut *mut c_void, CUdevice) -> CUresult;
    let f = real!(slots::CU_PRIMARY_CTX_RETAIN, F);
    // SAFETY: forwarding the caller's arguments.
    change(Some(dev), true, || unsafe { f(pctx, dev) })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: *mut c_void) -> CUresult {
    let f = real!(
        slots::CU_CTX_DESTROY_V2,
        unsafe extern "C" fn(*mut c_void) -> CUresult
    );
    // Its events go with it: the reaper must not read them after.
    crate::timing::forget_context(ctx as usize);
    // SAFETY: forwarding the caller's argument.
    change(None, false, || unsafe { f(ctx) })
}

type OnDevice = unsafe extern "C" fn(CUdevice) -> CUresult;

fn on_device(slot: &Slot, dev: CUdevice) -> CUresult {
    let f = real!(slot, OnDevice);
    // The primary context may go, and its events with it.
    crate::timing::forget_all();
    // SAFETY: forwarding the caller's argument.
    change(Some(dev), false, || unsafe { f(dev) })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    on_device(&slots::CU_PRIMARY_CTX_RELEASE, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    on_device(&slots::CU_PRIMARY_CTX_RELEASE_V2, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    on_device(&slots::CU_PRIMARY_CTX_RESET, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    on_device(&slots::CU_PRIMARY_CTX_RESET_V2, dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_pid_is_the_one_new_process_and_only_that() {
        let before = [(100, Some(1)), (200, None)];
        assert_eq!(
            new_pid(&before, &[(100, None), (200, None), (300, Some(5))]),
            Some(300)
        );
        assert_eq!(new_pid(&before, &before), None, "nothing new");
        assert_eq!(
            new_pid(&before, &[(300, None), (301, None)]),
            None,
            "two processes started at once: ambiguous"
        );
    }

    #[test]
    fn the_charge_is_what_the_driver_holds_beyond_what_is_counted() {
        assert_eq!(charge_for(300 << 20, 100 << 20), 200 << 20);
        assert_eq!(charge_for(100, 300), 0);
        assert_eq!(
            charge_for(u64::MAX - 1, 0),
            MAX_CHARGE,
            "not believed past the cap"
        );
    }
}
