//! The hooked CUDA driver API entry points. Each forwards to the real function (see
//! [`crate::real`]); with a memory limit in force, allocations are reserved in the shared ledger
//! first and refused with `CUDA_ERROR_OUT_OF_MEMORY` past the limit, frees give their share back,
//! and the memory queries report the limit. Kernel launches go through the core limiter.
//!
//! The exported functions are the driver API's own: their safety contract is the one `cuda.h`
//! (`nvml.h`) documents, and they are meant to be called from C only.

#![allow(clippy::missing_safety_doc)]

use std::ffi::c_void;

use crate::account::{device_uuid, reserve, On};
use crate::cuda::*;
use crate::limiter::{blocks, Key};
use crate::lock;
use crate::real::{Lib, Slot};
use crate::state::{core_limit, mode, Mode};

/// The real functions behind the hooks.
pub mod slots {
    use super::{Lib, Slot};

    pub static CU_INIT: Slot = Slot::new(Lib::Cuda, c"cuInit");
    pub static CU_MEM_ALLOC: Slot = Slot::new(Lib::Cuda, c"cuMemAlloc");
    pub static CU_MEM_ALLOC_V2: Slot = Slot::new(Lib::Cuda, c"cuMemAlloc_v2");
    pub static CU_MEM_ALLOC_PITCH: Slot = Slot::new(Lib::Cuda, c"cuMemAllocPitch");
    pub static CU_MEM_ALLOC_PITCH_V2: Slot = Slot::new(Lib::Cuda, c"cuMemAllocPitch_v2");
    pub static CU_MEM_ALLOC_MANAGED: Slot = Slot::new(Lib::Cuda, c"cuMemAllocManaged");
    pub static CU_MEM_ALLOC_MANAGED_V2: Slot = Slot::new(Lib::Cuda, c"cuMemAllocManaged_v2");
    pub static CU_MEM_ALLOC_ASYNC: Slot = Slot::new(Lib::Cuda, c"cuMemAllocAsync");
    pub static CU_MEM_ALLOC_ASYNC_V2: Slot = Slot::new(Lib::Cuda, c"cuMemAllocAsync_v2");
    pub static CU_MEM_ALLOC_ASYNC_PTSZ: Slot = Slot::new(Lib::Cuda, c"cuMemAllocAsync_ptsz");
    pub static CU_MEM_CREATE: Slot = Slot::new(Lib::Cuda, c"cuMemCreate");
    pub static CU_MEM_ALLOC_FROM_POOL_ASYNC: Slot =
        Slot::new(Lib::Cuda, c"cuMemAllocFromPoolAsync");
    pub static CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ: Slot =
        Slot::new(Lib::Cuda, c"cuMemAllocFromPoolAsync_ptsz");
    pub static CU_ARRAY_CREATE_V2: Slot = Slot::new(Lib::Cuda, c"cuArrayCreate_v2");
    pub static CU_ARRAY_3D_CREATE_V2: Slot = Slot::new(Lib::Cuda, c"cuArray3DCreate_v2");
    pub static CU_ARRAY_DESTROY: Slot = Slot::new(Lib::Cuda, c"cuArrayDestroy");
    pub static CU_MIPMAPPED_ARRAY_CREATE: Slot = Slot::new(Lib::Cuda, c"cuMipmappedArrayCreate");
    pub static CU_MIPMAPPED_ARRAY_DESTROY: Slot = Slot::new(Lib::Cuda, c"cuMipmappedArrayDestroy");
    pub static CU_MEM_RELEASE: Slot = Slot::new(Lib::Cuda, c"cuMemRelease");
    pub static CU_MEM_FREE: Slot = Slot::new(Lib::Cuda, c"cuMemFree");
    pub static CU_MEM_FREE_V2: Slot = Slot::new(Lib::Cuda, c"cuMemFree_v2");
    pub static CU_MEM_FREE_ASYNC: Slot = Slot::new(Lib::Cuda, c"cuMemFreeAsync");
    pub static CU_MEM_FREE_ASYNC_PTSZ: Slot = Slot::new(Lib::Cuda, c"cuMemFreeAsync_ptsz");
    pub static CU_MEM_GET_INFO: Slot = Slot::new(Lib::Cuda, c"cuMemGetInfo");
    pub static CU_MEM_GET_INFO_V2: Slot = Slot::new(Lib::Cuda, c"cuMemGetInfo_v2");
    pub static CU_DEVICE_TOTAL_MEM: Slot = Slot::new(Lib::Cuda, c"cuDeviceTotalMem");
    pub static CU_DEVICE_TOTAL_MEM_V2: Slot = Slot::new(Lib::Cuda, c"cuDeviceTotalMem_v2");
    pub static CU_LAUNCH_KERNEL: Slot = Slot::new(Lib::Cuda, c"cuLaunchKernel");
    pub static CU_LAUNCH_KERNEL_PTSZ: Slot = Slot::new(Lib::Cuda, c"cuLaunchKernel_ptsz");
    pub static CU_LAUNCH_KERNEL_EX: Slot = Slot::new(Lib::Cuda, c"cuLaunchKernelEx");
    pub static CU_LAUNCH_KERNEL_EX_PTSZ: Slot = Slot::new(Lib::Cuda, c"cuLaunchKernelEx_ptsz");
    pub static CU_LAUNCH_COOPERATIVE_KERNEL: Slot =
        Slot::new(Lib::Cuda, c"cuLaunchCooperativeKernel");
    pub static CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ: Slot =
        Slot::new(Lib::Cuda, c"cuLaunchCooperativeKernel_ptsz");
    pub static CU_GRAPH_LAUNCH: Slot = Slot::new(Lib::Cuda, c"cuGraphLaunch");
    pub static CU_GRAPH_LAUNCH_PTSZ: Slot = Slot::new(Lib::Cuda, c"cuGraphLaunch_ptsz");
    // Not hooked: whether a launch only records into a graph being captured.
    pub static CU_STREAM_IS_CAPTURING: Slot = Slot::new(Lib::Cuda, c"cuStreamIsCapturing");
    pub static CU_STREAM_IS_CAPTURING_PTSZ: Slot =
        Slot::new(Lib::Cuda, c"cuStreamIsCapturing_ptsz");
}

/// Reserve `size` bytes on the device, make the allocation with `call`, and remember it under
/// the key `key` returns (device pointer or handle) so its free gives the share back.
fn allocate(
    size: u64,
    on: On,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> u64,
) -> CUresult {
    let l = match mode() {
        Mode::Broken(_) => return CUDA_ERROR_NOT_PERMITTED,
        Mode::PassThrough => return call(),
        Mode::Limited(l) => l,
    };
    let Some(limit) = l.config.memory_limit_bytes else {
        return call();
    };
    // Without a device the driver would refuse too; never allocate unaccounted.
    let uuid = match device_uuid(l, on) {
        Ok(u) => u,
        Err(r) => return r,
    };
    if let Err(r) = reserve(l, &uuid, size, limit) {
        return r;
    }
    let r = call();
    if r == CUDA_SUCCESS {
        lock(&l.allocations).insert(key(), (uuid, size));
    } else {
        let _ = lock(&l.ledger).release(&uuid, size);
    }
    r
}

/// Free with `call`; on success give the allocation's share back.
fn free(key: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let l = match mode() {
        Mode::Broken(_) => return CUDA_ERROR_NOT_PERMITTED,
        Mode::PassThrough => return call(),
        Mode::Limited(l) => l,
    };
    if crate::pool::owns(l, key) {
        return crate::pool::free(l, key, call);
    }
    let r = call();
    if r == CUDA_SUCCESS {
        if let Some((uuid, size)) = lock(&l.allocations).remove(&key) {
            if let Err(e) = lock(&l.ledger).release(&uuid, size) {
                crate::warn(format_args!("accounting failed on free: {e}"));
            }
        }
    }
    r
}

/// (free, total) of the current device as the container may see them: the limit is the total.
fn limited_info(free: u64, total: u64) -> (u64, u64) {
    let Mode::Limited(l) = mode() else {
        return (free, total);
    };
    let Some(limit) = l.config.memory_limit_bytes else {
        return (free, total);
    };
    let Ok(uuid) = device_uuid(l, On::Current) else {
        return (free, total);
    };
    crate::pool::refresh(l);
    let used = lock(&l.ledger).used(&uuid).unwrap_or(0);
    let total = total.min(limit);
    (free.min(total.saturating_sub(used)), total)
}

pub(crate) fn refused() -> Option<CUresult> {
    matches!(mode(), Mode::Broken(_)).then_some(CUDA_ERROR_NOT_PERMITTED)
}

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: u32) -> CUresult {
    if let Some(r) = refused() {
        return r;
    }
    let f = real!(slots::CU_INIT, unsafe extern "C" fn(u32) -> CUresult);
    // SAFETY: forwarding the caller's arguments.
    unsafe { f(flags) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut CUdeviceptrV1, bytesize: u32) -> CUresult {
    type F = unsafe extern "C" fn(*mut CUdeviceptrV1, u32) -> CUresult;
    let f = real!(slots::CU_MEM_ALLOC, F);
    // SAFETY: forwarding the caller's arguments; `dptr` is read only after success.
    allocate(
        u64::from(bytesize),
        On::Current,
        || unsafe { f(dptr, bytesize) },
        || unsafe { u64::from(*dptr) },
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    type F = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
    let f = real!(slots::CU_MEM_ALLOC_V2, F);
    // SAFETY: as in cuMemAlloc.
    allocate(
        bytesize as u64,
        On::Current,
        || unsafe { f(dptr, bytesize) },
        || unsafe { *dptr },
    )
}

/// Pitched allocations: reserve width × height first; the pitch (≥ width) is only known after
/// the driver answers, so the difference is reserved then, or the allocation undone.
fn allocate_pitched(
    width: u64,
    height: u64,
    call: impl FnOnce() -> CUresult,
    result: impl Fn() -> (u64, u64),
    undo: impl FnOnce(),
) -> CUresult {
    let asked = width.saturating_mul(height);
    let r = allocate(asked, On::Current, call, || result().0);
    if r != CUDA_SUCCESS {
        return r;
    }
    let (ptr, pitch) = result();
    let extra = pitch.saturating_mul(height).saturating_sub(asked);
    let Mode::Limited(l) = mode() else {
        return r;
    };
    let (Some(limit), Some((uuid, _))) = (
        l.config.memory_limit_bytes,
        lock(&l.allocations).get(&ptr).copied(),
    ) else {
        return r;
    };
    if extra == 0 {
        return r;
    }
    if matches!(lock(&l.ledger).reserve(&uuid, extra, limit), Ok(true)) {
        if let Some(a) = lock(&l.allocations).get_mut(&ptr) {
            a.1 += extra;
        }
        return r;
    }
    undo();
    if let Some((uuid, size)) = lock(&l.allocations).remove(&ptr) {
        let _ = lock(&l.ledger).release(&uuid, size);
    }
    CUDA_ERROR_OUT_OF_MEMORY
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut CUdeviceptrV1,
    pitch: *mut u32,
    width: u32,
    height: u32,
    element_size: u32,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut CUdeviceptrV1, *mut u32, u32, u32, u32) -> CUresult;
    let f = real!(slots::CU_MEM_ALLOC_PITCH, F);
    // SAFETY: forwarding the caller's arguments; the outputs are read only after success.
    allocate_pitched(
        width.into(),
        height.into(),
        || unsafe { f(dptr, pitch, width, height, element_size) },
        || unsafe { (u64::from(*dptr), u64::from(*pitch)) },
        || unsafe {
            if let Some(free) = slots::CU_MEM_FREE.get::<unsafe extern "C" fn(u32) -> CUresult>() {
                free(*dptr);
            }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: u32,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, u32) -> CUresult;
    let f = real!(slots::CU_MEM_ALLOC_PITCH_V2, F);
    // SAFETY: as in cuMemAllocPitch.
    allocate_pitched(
        width as u64,
        height as u64,
        || unsafe { f(dptr, pitch, width, height, element_size) },
        || unsafe { (*dptr, *pitch as u64) },
        || unsafe {
            if let Some(free) = slots::CU_MEM_FREE_V2.get::<unsafe extern "C" fn(u64) -> CUresult>()
            {
                free(*dptr);
            }
        },
    )
}

type AllocManaged = unsafe extern "C" fn(*mut CUdeviceptr, usize, u32) -> CUresult;

fn alloc_managed(slot: &Slot, dptr: *mut CUdeviceptr, bytesize: usize, flags: u32) -> CUresult {
    let f = real!(slot, AllocManaged);
    // SAFETY: forwarding the caller's arguments; `dptr` is read only after success.
    allocate(
        bytesize as u64,
        On::Current,
        || unsafe { f(dptr, bytesize, flags) },
        || unsafe { *dptr },
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: u32,
) -> CUresult {
    alloc_managed(&slots::CU_MEM_ALLOC_MANAGED, dptr, bytesize, flags)
}

/// The CUDA driver has no `_v2` of this entry point; the name is hooked all the same, should a
/// driver ever export it.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged_v2(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: u32,
) -> CUresult {
    alloc_managed(&slots::CU_MEM_ALLOC_MANAGED_V2, dptr, bytesize, flags)
}

type AllocAsync = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;

/// Whether an asynchronous allocation on `stream` only adds an allocation node to a graph being
/// captured: the graph's launches map that memory (see `pool::graph_memory`), so it is not
/// charged here. Asked only where a memory limit is in force.
fn captured_allocation(stream: CUstream, per_thread: bool) -> bool {
    matches!(mode(), Mode::Limited(l) if l.config.memory_limit_bytes.is_some())
        && capturing(stream, per_thread)
}

/// `cuMemAllocAsync` allocates from the current device's current pool: accounted as that pool
/// (see [`crate::pool`]), or as a plain allocation where the driver cannot name the pool.
fn alloc_async(
    slot: &Slot,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
    per_thread: bool,
) -> CUresult {
    let f = real!(slot, AllocAsync);
    // SAFETY: forwarding the caller's arguments; `dptr` is read only after success.
    let call = || unsafe { f(dptr, bytesize, stream) };
    let key = || unsafe { *dptr };
    if captured_allocation(stream, per_thread) {
        return call();
    }
    let pool = match mode() {
        Mode::Limited(_) => crate::pool::current_pool(),
        _ => None,
    };
    match pool {
        Some(pool) => crate::pool::allocate(pool, On::Current, bytesize as u64, call, key),
        None => allocate(bytesize as u64, On::Current, call, key),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(&slots::CU_MEM_ALLOC_ASYNC, dptr, bytesize, stream, false)
}

/// As [`cuMemAllocManaged_v2`]: no such driver entry point today.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_v2(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(&slots::CU_MEM_ALLOC_ASYNC_V2, dptr, bytesize, stream, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(
        &slots::CU_MEM_ALLOC_ASYNC_PTSZ,
        dptr,
        bytesize,
        stream,
        true,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationPropHead,
    flags: u64,
) -> CUresult {
    type F = unsafe extern "C" fn(
        *mut CUmemGenericAllocationHandle,
        usize,
        *const CUmemAllocationPropHead,
        u64,
    ) -> CUresult;
    let f = real!(slots::CU_MEM_CREATE, F);
    // SAFETY: `prop` is the caller's (null is the driver's to refuse).
    let location = unsafe { prop.as_ref() }.map(|p| p.location);
    let call = || unsafe { f(handle, size, prop, flags) };
    match location {
        // Host memory is not the GPU's to limit.
        Some(loc) if loc.typ == CU_MEM_LOCATION_TYPE_DEVICE => {
            // SAFETY: `handle` is read only after success.
            allocate(size as u64, On::Ordinal(loc.id), call, || unsafe {
                *handle
            })
        }
        _ => match refused() {
            Some(r) => r,
            None => call(),
        },
    }
}

/// An allocation from a memory pool: accounted as the pool's (see [`crate::pool`]).
fn alloc_from_pool(
    slot: &Slot,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
    per_thread: bool,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
    let f = real!(slot, F);
    // SAFETY: forwarding the caller's arguments; `dptr` is read only after success.
    let call = || unsafe { f(dptr, bytesize, pool, stream) };
    if captured_allocation(stream, per_thread) {
        return call();
    }
    // SAFETY: as above.
    crate::pool::allocate(
        pool as usize,
        On::Current,
        bytesize as u64,
        call,
        || unsafe { *dptr },
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    alloc_from_pool(
        &slots::CU_MEM_ALLOC_FROM_POOL_ASYNC,
        dptr,
        bytesize,
        pool,
        stream,
        false,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    alloc_from_pool(
        &slots::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
        dptr,
        bytesize,
        pool,
        stream,
        true,
    )
}

/// An array create: reserved as its size before the driver is called, as an allocation is.
fn array_create(
    bytes: Option<u64>,
    handle: *mut CUarray,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    match bytes {
        // SAFETY: `handle` is read only after success.
        Some(bytes) => allocate(bytes, On::Current, call, || unsafe {
            *handle as usize as u64
        }),
        // A null descriptor is the driver's to refuse.
        None => match refused() {
            Some(r) => r,
            None => call(),
        },
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    handle: *mut CUarray,
    desc: *const CudaArrayDescriptor,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut CUarray, *const CudaArrayDescriptor) -> CUresult;
    let f = real!(slots::CU_ARRAY_CREATE_V2, F);
    // SAFETY: the caller's descriptor, read before the call.
    let bytes = unsafe { desc.as_ref() }
        .map(|d| array_bytes(d.width, d.height, 0, d.format, d.num_channels));
    // SAFETY: forwarding the caller's arguments.
    array_create(bytes, handle, || unsafe { f(handle, desc) })
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    handle: *mut CUarray,
    desc: *const CudaArray3dDescriptor,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut CUarray, *const CudaArray3dDescriptor) -> CUresult;
    let f = real!(slots::CU_ARRAY_3D_CREATE_V2, F);
    // SAFETY: the caller's descriptor, read before the call.
    let bytes = unsafe { desc.as_ref() }
        .map(|d| array_bytes(d.width, d.height, d.depth, d.format, d.num_channels));
    // SAFETY: forwarding the caller's arguments.
    array_create(bytes, handle, || unsafe { f(handle, desc) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: *mut CUarray,
    desc: *const CudaArray3dDescriptor,
    levels: u32,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut CUarray, *const CudaArray3dDescriptor, u32) -> CUresult;
    let f = real!(slots::CU_MIPMAPPED_ARRAY_CREATE, F);
    // SAFETY: the caller's descriptor, read before the call.
    let bytes = unsafe { desc.as_ref() }.map(|d| mipmapped_bytes(d, levels));
    // SAFETY: forwarding the caller's arguments.
    array_create(bytes, handle, || unsafe { f(handle, desc, levels) })
}

/// An array destroy: its share given back once the driver has freed it.
fn array_destroy(slot: &Slot, handle: CUarray) -> CUresult {
    let f = real!(slot, unsafe extern "C" fn(CUarray) -> CUresult);
    // SAFETY: forwarding the caller's argument.
    free(handle as usize as u64, || unsafe { f(handle) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(handle: CUarray) -> CUresult {
    array_destroy(&slots::CU_MIPMAPPED_ARRAY_DESTROY, handle)
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(handle: CUarray) -> CUresult {
    array_destroy(&slots::CU_ARRAY_DESTROY, handle)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    let f = real!(slots::CU_MEM_RELEASE, unsafe extern "C" fn(u64) -> CUresult);
    // SAFETY: forwarding the caller's argument.
    free(handle, || unsafe { f(handle) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree(dptr: CUdeviceptrV1) -> CUresult {
    let f = real!(slots::CU_MEM_FREE, unsafe extern "C" fn(u32) -> CUresult);
    // SAFETY: forwarding the caller's argument.
    free(dptr.into(), || unsafe { f(dptr) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    let f = real!(slots::CU_MEM_FREE_V2, unsafe extern "C" fn(u64) -> CUresult);
    // SAFETY: forwarding the caller's argument.
    free(dptr, || unsafe { f(dptr) })
}

type FreeAsync = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let f = real!(slots::CU_MEM_FREE_ASYNC, FreeAsync);
    // SAFETY: forwarding the caller's arguments.
    free(dptr, || unsafe { f(dptr, stream) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let f = real!(slots::CU_MEM_FREE_ASYNC_PTSZ, FreeAsync);
    // SAFETY: forwarding the caller's arguments.
    free(dptr, || unsafe { f(dptr, stream) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut u32, total: *mut u32) -> CUresult {
    if let Some(r) = refused() {
        return r;
    }
    let f = real!(
        slots::CU_MEM_GET_INFO,
        unsafe extern "C" fn(*mut u32, *mut u32) -> CUresult
    );
    // SAFETY: forwarding the caller's pointers, which the driver filled on success.
    unsafe {
        let r = f(free, total);
        if r == CUDA_SUCCESS && !free.is_null() && !total.is_null() {
            let (fr, t) = limited_info((*free).into(), (*total).into());
            *free = fr as u32;
            *total = t as u32;
        }
        r
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    if let Some(r) = refused() {
        return r;
    }
    type F = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
    let f = real!(slots::CU_MEM_GET_INFO_V2, F);
    // SAFETY: as in cuMemGetInfo.
    unsafe {
        let r = f(free, total);
        if r == CUDA_SUCCESS && !free.is_null() && !total.is_null() {
            let (fr, t) = limited_info(*free as u64, *total as u64);
            *free = fr as usize;
            *total = t as usize;
        }
        r
    }
}

fn limit_total(total: u64) -> u64 {
    match mode() {
        Mode::Limited(l) => l.config.memory_limit_bytes.map_or(total, |m| total.min(m)),
        _ => total,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut u32, dev: CUdevice) -> CUresult {
    if let Some(r) = refused() {
        return r;
    }
    let f = real!(
        slots::CU_DEVICE_TOTAL_MEM,
        unsafe extern "C" fn(*mut u32, CUdevice) -> CUresult
    );
    // SAFETY: forwarding the caller's arguments; `bytes` was filled on success.
    unsafe {
        let r = f(bytes, dev);
        if r == CUDA_SUCCESS && !bytes.is_null() {
            *bytes = limit_total((*bytes).into()) as u32;
        }
        r
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    if let Some(r) = refused() {
        return r;
    }
    type F = unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult;
    let f = real!(slots::CU_DEVICE_TOTAL_MEM_V2, F);
    // SAFETY: as in cuDeviceTotalMem.
    unsafe {
        let r = f(bytes, dev);
        if r == CUDA_SUCCESS && !bytes.is_null() {
            *bytes = limit_total(*bytes as u64) as usize;
        }
        r
    }
}

/// Make a launch with the real entry point in `slot` (`F` is its C signature): in a container
/// with a core limit, it waits for the container's share and its GPU time is measured (see
/// `timing`); `key` names what it runs. A launch into a stream being captured only records it
/// in a graph: it runs nothing, and the graph's launches are measured.
fn throttled<F: Copy>(
    slot: &Slot,
    stream: (CUstream, bool),
    key: impl FnOnce() -> Key,
    launch: impl FnOnce(F) -> CUresult,
) -> CUresult {
    let real = real!(slot, F);
    let l = match mode() {
        Mode::Broken(_) => return CUDA_ERROR_NOT_PERMITTED,
        Mode::PassThrough => return launch(real),
        Mode::Limited(l) => l,
    };
    match core_limit(l) {
        Some(percent) if !capturing(stream.0, stream.1) => {
            crate::timing::launch(l, percent, stream, key(), || launch(real))
        }
        _ => launch(real),
    }
}

/// Whether `stream` (in the per-thread default stream's sense where `per_thread`) is being
/// captured into a graph. Where the driver cannot say, it is not.
fn capturing(stream: CUstream, per_thread: bool) -> bool {
    type F = unsafe extern "C" fn(CUstream, *mut i32) -> CUresult;
    /// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
    const ACTIVE: i32 = 1;
    let slot = if per_thread {
        &slots::CU_STREAM_IS_CAPTURING_PTSZ
    } else {
        &slots::CU_STREAM_IS_CAPTURING
    };
    // SAFETY: the cuda.h signature of cuStreamIsCapturing.
    let Some(f) = (unsafe { slot.get::<F>() }) else {
        return false;
    };
    let mut status = 0;
    // SAFETY: the caller's stream and an output that outlives the call.
    (unsafe { f(stream, &mut status) }) == CUDA_SUCCESS && status == ACTIVE
}

/// Hooked launch entry points, `name: slot: per-thread stream` each, with one C signature:
/// `key` (an expression of the arguments) names the launch for the core limiter, and the real
/// one runs with the same arguments.
macro_rules! launch_hooks {
    ($($name:ident: $slot:ident: $ptsz:expr),+; $args:tt, $stream:expr, $key:expr) => {
        $(launch_hooks!(@one $name, $slot, $ptsz, $args, $stream, $key);)+
    };
    (@one $name:ident, $slot:ident, $ptsz:expr, ($($arg:ident: $ty:ty),*), $stream:expr, $key:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            throttled(
                &slots::$slot,
                ($stream, $ptsz),
                || $key,
                |real: unsafe extern "C" fn($($ty),*) -> CUresult| {
                    // SAFETY: forwarding the caller's arguments to the real entry point.
                    unsafe { real($($arg),*) }
                },
            )
        }
    };
}

/// The grid size of `cuLaunchKernelEx`'s config (null is the driver's to refuse).
fn config_blocks(config: *const CUlaunchConfigHead) -> u64 {
    // SAFETY: `config` is the caller's, null or a `CUlaunchConfig` per cuda.h.
    unsafe { config.as_ref() }.map_or(1, |c| blocks(c.grid_dim_x, c.grid_dim_y, c.grid_dim_z))
}

/// The stream of `cuLaunchKernelEx`'s config.
fn config_stream(config: *const CUlaunchConfigHead) -> CUstream {
    // SAFETY: as in `config_blocks`.
    unsafe { config.as_ref() }.map_or(std::ptr::null_mut(), |c| c.stream)
}

launch_hooks!(
    cuLaunchKernel: CU_LAUNCH_KERNEL: false, cuLaunchKernel_ptsz: CU_LAUNCH_KERNEL_PTSZ: true;
    (f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32,
     stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void),
    stream,
    (f as usize, blocks(gx, gy, gz))
);
// A cooperative launch is a kernel launch like any other: its GPU time counts against the limit.
launch_hooks!(
    cuLaunchCooperativeKernel: CU_LAUNCH_COOPERATIVE_KERNEL: false,
    cuLaunchCooperativeKernel_ptsz: CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ: true;
    (f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32,
     stream: CUstream, params: *mut *mut c_void),
    stream,
    (f as usize, blocks(gx, gy, gz))
);
/// A graph's kernels are launched by the driver: a graph launch is measured as a whole, and the
/// graph memory it maps must fit the memory limit (see `graph`).
fn graph_launch(slot: &Slot, exec: CUgraphExec, stream: CUstream, per_thread: bool) -> CUresult {
    type F = unsafe extern "C" fn(CUgraphExec, CUstream) -> CUresult;
    throttled(
        slot,
        (stream, per_thread),
        // An update or new parameters change its kernels: a new key, a new estimate.
        || (exec as usize, crate::costs::cost(exec)),
        // SAFETY: forwarding the caller's arguments to the real entry point.
        |real: F| crate::graph::mapping(exec, || unsafe { real(exec, stream) }),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    graph_launch(&slots::CU_GRAPH_LAUNCH, exec, stream, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    graph_launch(&slots::CU_GRAPH_LAUNCH_PTSZ, exec, stream, true)
}
launch_hooks!(
    cuLaunchKernelEx: CU_LAUNCH_KERNEL_EX: false, cuLaunchKernelEx_ptsz: CU_LAUNCH_KERNEL_EX_PTSZ: true;
    (config: *const CUlaunchConfigHead, f: CUfunction, params: *mut *mut c_void,
     extra: *mut *mut c_void),
    config_stream(config),
    (f as usize, config_blocks(config))
);
