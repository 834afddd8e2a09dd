//! Every hooked name: its real function's slot and our hook. `dlsym` and `cuGetProcAddress` use
//! it to hand out hooks in place of the driver's functions; the `cuGetProcAddress` hooks are here,
//! as the table holds them too.
//!
//! The exported functions are the driver API's own: their safety contract is the one `cuda.h`
//! documents, and they are meant to be called from C only.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

use crate::context::{self, slots as ctx};
use crate::cuda::{
    CUresult, CUDA_SUCCESS, CUDA_VERSION_V2_API, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
};
use crate::graph::{self, slots as gr};
use crate::hooks::{self, slots as cu};
use crate::nvml::{self, slots as nv};
use crate::pool::{self, slots as pl};
use crate::real::{Lib, Slot};

/// The real functions behind the `cuGetProcAddress` hooks.
pub mod slots {
    use super::{Lib, Slot};

    pub static CU_GET_PROC_ADDRESS: Slot = Slot::new(Lib::Cuda, c"cuGetProcAddress");
    pub static CU_GET_PROC_ADDRESS_V2: Slot = Slot::new(Lib::Cuda, c"cuGetProcAddress_v2");
}

pub struct Entry {
    pub slot: &'static Slot,
    /// The hook's address.
    pub hook: usize,
}

impl Entry {
    pub fn name(&self) -> &'static CStr {
        self.slot.name
    }
}

pub fn entries() -> &'static [Entry] {
    static TABLE: OnceLock<Vec<Entry>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let e = |slot: &'static Slot, hook: usize| Entry { slot, hook };
        vec![
            e(&cu::CU_INIT, hooks::cuInit as *const () as usize),
            e(&cu::CU_MEM_ALLOC, hooks::cuMemAlloc as *const () as usize),
            e(
                &cu::CU_MEM_ALLOC_V2,
                hooks::cuMemAlloc_v2 as *const () as usize,
            ),
            e(
                &cu::CU_MEM_ALLOC_PITCH,
                hooks::cuMemAllocPitch as *const () as usize,
            ),
            e(
                &cu::CU_MEM_ALLOC_PITCH_V2,
                hooks::cuMemAllocPitch_v2 as *const () as usize,
            ),
            e(
                &cu::CU_MEM_ALLOC_MANAGED,
                hooks::cuMemAllocManaged as *const () as usize,
            ),
            e(
                &cu::CU_MEM_ALLOC_MANAGED_V2,
                hooks::cuMemAllocManaged_v2 as *const () as usize,
            ),
            e(
                &cu::CU_MEM_ALLOC_ASYNC,
                hooks::cuMemAllocAsync as *const () as usize,
            ),
            e(
                &cu::CU_MEM_ALLOC_ASYNC_V2,
                hooks::cuMemAllocAsync_v2 as *const () as usize,
            ),
            e(
                &cu::CU_MEM_ALLOC_ASYNC_PTSZ,
                hooks::cuMemAllocAsync_ptsz as *const () as usize,
            ),
            e(&cu::CU_MEM_CREATE, hooks::cuMemCreate as *const () as usize),
            e(
                &cu::CU_MEM_ALLOC_FROM_POOL_ASYNC,
                hooks::cuMemAllocFromPoolAsync as *const () as usize,
            ),
            e(
                &cu::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
                hooks::cuMemAllocFromPoolAsync_ptsz as *const () as usize,
            ),
            e(
                &cu::CU_ARRAY_CREATE_V2,
                hooks::cuArrayCreate_v2 as *const () as usize,
            ),
            e(
                &cu::CU_ARRAY_3D_CREATE_V2,
                hooks::cuArray3DCreate_v2 as *const () as usize,
            ),
            e(
                &cu::CU_MIPMAPPED_ARRAY_CREATE,
                hooks::cuMipmappedArrayCreate as *const () as usize,
            ),
            e(
                &cu::CU_MIPMAPPED_ARRAY_DESTROY,
                hooks::cuMipmappedArrayDestroy as *const () as usize,
            ),
            e(
                &cu::CU_ARRAY_DESTROY,
                hooks::cuArrayDestroy as *const () as usize,
            ),
            e(
                &cu::CU_MEM_RELEASE,
                hooks::cuMemRelease as *const () as usize,
            ),
            e(&cu::CU_MEM_FREE, hooks::cuMemFree as *const () as usize),
            e(
                &cu::CU_MEM_FREE_V2,
                hooks::cuMemFree_v2 as *const () as usize,
            ),
            e(
                &cu::CU_MEM_FREE_ASYNC,
                hooks::cuMemFreeAsync as *const () as usize,
            ),
            e(
                &cu::CU_MEM_FREE_ASYNC_PTSZ,
                hooks::cuMemFreeAsync_ptsz as *const () as usize,
            ),
            e(
                &cu::CU_MEM_GET_INFO,
                hooks::cuMemGetInfo as *const () as usize,
            ),
            e(
                &cu::CU_MEM_GET_INFO_V2,
                hooks::cuMemGetInfo_v2 as *const () as usize,
            ),
            e(
                &cu::CU_DEVICE_TOTAL_MEM,
                hooks::cuDeviceTotalMem as *const () as usize,
            ),
            e(
                &cu::CU_DEVICE_TOTAL_MEM_V2,
                hooks::cuDeviceTotalMem_v2 as *const () as usize,
            ),
            e(
                &slots::CU_GET_PROC_ADDRESS,
                cuGetProcAddress as *const () as usize,
            ),
            e(
                &slots::CU_GET_PROC_ADDRESS_V2,
                cuGetProcAddress_v2 as *const () as usize,
            ),
            e(
                &cu::CU_LAUNCH_KERNEL,
                hooks::cuLaunchKernel as *const () as usize,
            ),
            e(
                &cu::CU_LAUNCH_KERNEL_PTSZ,
                hooks::cuLaunchKernel_ptsz as *const () as usize,
            ),
            e(
                &cu::CU_LAUNCH_KERNEL_EX,
                hooks::cuLaunchKernelEx as *const () as usize,
            ),
            e(
                &cu::CU_LAUNCH_KERNEL_EX_PTSZ,
                hooks::cuLaunchKernelEx_ptsz as *const () as usize,
            ),
            e(
                &cu::CU_LAUNCH_COOPERATIVE_KERNEL,
                hooks::cuLaunchCooperativeKernel as *const () as usize,
            ),
            e(
                &cu::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ,
                hooks::cuLaunchCooperativeKernel_ptsz as *const () as usize,
            ),
            e(
                &cu::CU_GRAPH_LAUNCH,
                hooks::cuGraphLaunch as *const () as usize,
            ),
            e(
                &cu::CU_GRAPH_LAUNCH_PTSZ,
                hooks::cuGraphLaunch_ptsz as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_INSTANTIATE,
                graph::cuGraphInstantiate as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_INSTANTIATE_V2,
                graph::cuGraphInstantiate_v2 as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_INSTANTIATE_WITH_FLAGS,
                graph::cuGraphInstantiateWithFlags as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_INSTANTIATE_WITH_PARAMS,
                graph::cuGraphInstantiateWithParams as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ,
                graph::cuGraphInstantiateWithParams_ptsz as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_EXEC_UPDATE,
                graph::cuGraphExecUpdate as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_EXEC_UPDATE_V2,
                graph::cuGraphExecUpdate_v2 as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_EXEC_DESTROY,
                graph::cuGraphExecDestroy as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS,
                graph::cuGraphExecKernelNodeSetParams as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS_V2,
                graph::cuGraphExecKernelNodeSetParams_v2 as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_EXEC_CHILD_GRAPH_NODE_SET_PARAMS,
                graph::cuGraphExecChildGraphNodeSetParams as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_EXEC_NODE_SET_PARAMS,
                graph::cuGraphExecNodeSetParams as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_UPLOAD,
                graph::cuGraphUpload as *const () as usize,
            ),
            e(
                &gr::CU_GRAPH_UPLOAD_PTSZ,
                graph::cuGraphUpload_ptsz as *const () as usize,
            ),
            e(
                &pl::CU_DEVICE_GRAPH_MEM_TRIM,
                pool::cuDeviceGraphMemTrim as *const () as usize,
            ),
            e(
                &nv::GET_MEMORY_INFO,
                nvml::nvmlDeviceGetMemoryInfo as *const () as usize,
            ),
            e(
                &nv::GET_MEMORY_INFO_V2,
                nvml::nvmlDeviceGetMemoryInfo_v2 as *const () as usize,
            ),
            e(
                &ctx::CU_CTX_CREATE_V2,
                context::cuCtxCreate_v2 as *const () as usize,
            ),
            e(
                &ctx::CU_CTX_CREATE_V3,
                context::cuCtxCreate_v3 as *const () as usize,
            ),
            e(
                &ctx::CU_CTX_CREATE_V4,
                context::cuCtxCreate_v4 as *const () as usize,
            ),
            e(
                &ctx::CU_CTX_DESTROY_V2,
                context::cuCtxDestroy_v2 as *const () as usize,
            ),
            e(
                &ctx::CU_PRIMARY_CTX_RETAIN,
                context::cuDevicePrimaryCtxRetain as *const () as usize,
            ),
            e(
                &ctx::CU_PRIMARY_CTX_RELEASE,
                context::cuDevicePrimaryCtxRelease as *const () as usize,
            ),
            e(
                &ctx::CU_PRIMARY_CTX_RELEASE_V2,
                context::cuDevicePrimaryCtxRelease_v2 as *const () as usize,
            ),
            e(
                &ctx::CU_PRIMARY_CTX_RESET,
                context::cuDevicePrimaryCtxReset as *const () as usize,
            ),
            e(
                &ctx::CU_PRIMARY_CTX_RESET_V2,
                context::cuDevicePrimaryCtxReset_v2 as *const () as usize,
            ),
            e(
                &pl::CU_MEM_POOL_CREATE,
                pool::cuMemPoolCreate as *const () as usize,
            ),
            e(
                &pl::CU_MEM_POOL_DESTROY,
                pool::cuMemPoolDestroy as *const () as usize,
            ),
            e(
                &pl::CU_MEM_POOL_TRIM_TO,
                pool::cuMemPoolTrimTo as *const () as usize,
            ),
            e(
                &pl::CU_DEVICE_GET_DEFAULT_MEM_POOL,
                pool::cuDeviceGetDefaultMemPool as *const () as usize,
            ),
            e(
                &pl::CU_DEVICE_GET_MEM_POOL,
                pool::cuDeviceGetMemPool as *const () as usize,
            ),
            e(
                &nv::GET_PROCESS_UTILIZATION,
                nvml::nvmlDeviceGetProcessUtilization as *const () as usize,
            ),
            e(
                &nv::COMPUTE_PROCS,
                nvml::nvmlDeviceGetComputeRunningProcesses as *const () as usize,
            ),
            e(
                &nv::COMPUTE_PROCS_V2,
                nvml::nvmlDeviceGetComputeRunningProcesses_v2 as *const () as usize,
            ),
            e(
                &nv::COMPUTE_PROCS_V3,
                nvml::nvmlDeviceGetComputeRunningProcesses_v3 as *const () as usize,
            ),
            e(
                &nv::GRAPHICS_PROCS,
                nvml::nvmlDeviceGetGraphicsRunningProcesses as *const () as usize,
            ),
            e(
                &nv::GRAPHICS_PROCS_V2,
                nvml::nvmlDeviceGetGraphicsRunningProcesses_v2 as *const () as usize,
            ),
            e(
                &nv::GRAPHICS_PROCS_V3,
                nvml::nvmlDeviceGetGraphicsRunningProcesses_v3 as *const () as usize,
            ),
            e(
                &nv::MPS_PROCS,
                nvml::nvmlDeviceGetMPSComputeRunningProcesses as *const () as usize,
            ),
            e(
                &nv::MPS_PROCS_V2,
                nvml::nvmlDeviceGetMPSComputeRunningProcesses_v2 as *const () as usize,
            ),
            e(
                &nv::MPS_PROCS_V3,
                nvml::nvmlDeviceGetMPSComputeRunningProcesses_v3 as *const () as usize,
            ),
        ]
    })
}

/// The entry hooking `name`, if any.
pub fn find(name: &CStr) -> Option<&'static Entry> {
    let b = name.to_bytes();
    // Most lookups are for other names: skip the scan for them.
    if !(b.starts_with(b"cu") || b.starts_with(b"nvml")) {
        return None;
    }
    entries().iter().find(|e| e.name() == name)
}

/// Un-suffixed names that mean their `_v2` entry point from CUDA 3.2 on.
const V2_SINCE_3020: &[&str] = &[
    "cuCtxCreate",
    "cuCtxDestroy",
    "cuArrayCreate",
    "cuArray3DCreate",
    "cuMemAlloc",
    "cuMemAllocPitch",
    "cuMemFree",
    "cuMemGetInfo",
    "cuDeviceTotalMem",
];

/// Names whose meaning changed with a later CUDA, as `cuda.h` maps them: (name, from version,
/// entry point), the newest first for each name.
const RENAMED: &[(&str, i32, &str)] = &[
    ("cuGetProcAddress", 12000, "cuGetProcAddress_v2"),
    ("cuGraphInstantiate", 12000, "cuGraphInstantiateWithFlags"),
    ("cuGraphInstantiate", 11000, "cuGraphInstantiate_v2"),
    ("cuGraphExecUpdate", 12000, "cuGraphExecUpdate_v2"),
    (
        "cuGraphExecKernelNodeSetParams",
        12000,
        "cuGraphExecKernelNodeSetParams_v2",
    ),
];

/// What `cuGetProcAddress(symbol, …, version, flags)` should hand out instead of the driver's
/// `found`: the hook for the entry point `found` is (by address), or else the hook for the
/// variant the driver's rules select for that name and version (per-thread-stream `_ptsz`,
/// `_v2`). `None`: not hooked, keep the driver's.
pub fn redirect(
    symbol: &CStr,
    found: *mut c_void,
    version: i32,
    flags: u64,
) -> Option<*mut c_void> {
    if found.is_null() {
        return None;
    }
    let cuda = || entries().iter().filter(|e| e.slot.lib == Lib::Cuda);
    if let Some(e) = cuda().find(|e| e.slot.addr() == Some(found as usize)) {
        return Some(e.hook as *mut c_void);
    }
    let base = symbol.to_str().ok()?;
    let mut candidates = Vec::new();
    if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 {
        candidates.push(format!("{base}_ptsz"));
    }
    if version >= CUDA_VERSION_V2_API && V2_SINCE_3020.contains(&base) {
        candidates.push(format!("{base}_v2"));
    }
    if let Some((_, _, to)) = RENAMED
        .iter()
        .find(|(name, since, _)| *name == base && version >= *since)
    {
        candidates.push(to.to_string());
    }
    candidates.push(base.to_string());
    candidates.iter().find_map(|c| {
        cuda()
            .find(|e| e.name().to_bytes() == c.as_bytes())
            .map(|e| e.hook as *mut c_void)
    })
}

/// Replace what the real `cuGetProcAddress` returned for `symbol` by our hook for it.
///
/// # Safety
/// `symbol` is a C string (or null) and `pfn` the caller's output pointer (or null).
unsafe fn hand_out_hook(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: per this function's contract.
    unsafe {
        let name = CStr::from_ptr(symbol);
        if let Some(hook) = redirect(name, *pfn, version, flags) {
            *pfn = hook;
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: i32,
    flags: u64,
) -> CUresult {
    if let Some(r) = crate::hooks::refused() {
        return r;
    }
    type F = unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64) -> CUresult;
    let f = real!(slots::CU_GET_PROC_ADDRESS, F);
    // SAFETY: forwarding the caller's arguments; `pfn` was filled on success.
    unsafe {
        let r = f(symbol, pfn, cuda_version, flags);
        if r == CUDA_SUCCESS {
            hand_out_hook(symbol, pfn, cuda_version, flags);
        }
        r
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: i32,
    flags: u64,
    symbol_status: *mut i32,
) -> CUresult {
    if let Some(r) = crate::hooks::refused() {
        return r;
    }
    type F = unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64, *mut i32) -> CUresult;
    let f = real!(slots::CU_GET_PROC_ADDRESS_V2, F);
    // SAFETY: as in cuGetProcAddress.
    unsafe {
        let r = f(symbol, pfn, cuda_version, flags, symbol_status);
        if r == CUDA_SUCCESS {
            hand_out_hook(symbol, pfn, cuda_version, flags);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        let mut names: Vec<_> = entries().iter().map(|e| e.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), entries().len());
        assert_eq!(
            find(c"cuMemAlloc_v2").map(|e| e.hook),
            Some(hooks::cuMemAlloc_v2 as *const () as usize)
        );
        assert!(find(c"cuCtxSynchronize").is_none());
        assert!(find(c"malloc").is_none());
    }

    #[test]
    fn unknown_pointers_map_by_name_and_version() {
        // No real driver here: every slot is missing, so only the name rules apply.
        let p = 0x1000 as *mut c_void;
        let ptsz = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        let cases: &[(&CStr, i32, u64, usize)] = &[
            (
                c"cuMemAlloc",
                12000,
                0,
                hooks::cuMemAlloc_v2 as *const () as usize,
            ),
            (
                c"cuMemAlloc",
                3000,
                0,
                hooks::cuMemAlloc as *const () as usize,
            ),
            (
                c"cuMemAllocAsync",
                12000,
                ptsz,
                hooks::cuMemAllocAsync_ptsz as *const () as usize,
            ),
            (
                c"cuLaunchCooperativeKernel",
                12000,
                ptsz,
                hooks::cuLaunchCooperativeKernel_ptsz as *const () as usize,
            ),
            (
                c"cuGetProcAddress",
                12000,
                0,
                cuGetProcAddress_v2 as *const () as usize,
            ),
            (
                c"cuGetProcAddress",
                11030,
                0,
                cuGetProcAddress as *const () as usize,
            ),
            (
                c"cuCtxCreate",
                12000,
                0,
                context::cuCtxCreate_v2 as *const () as usize,
            ),
            // A graph call whose signature changed: the hook for the one the version means.
            (
                c"cuGraphInstantiate",
                12040,
                0,
                graph::cuGraphInstantiateWithFlags as *const () as usize,
            ),
            (
                c"cuGraphInstantiate",
                11080,
                0,
                graph::cuGraphInstantiate_v2 as *const () as usize,
            ),
            (
                c"cuGraphInstantiate",
                10020,
                0,
                graph::cuGraphInstantiate as *const () as usize,
            ),
            (
                c"cuGraphExecKernelNodeSetParams",
                12000,
                0,
                graph::cuGraphExecKernelNodeSetParams_v2 as *const () as usize,
            ),
            (
                c"cuGraphExecUpdate",
                11080,
                0,
                graph::cuGraphExecUpdate as *const () as usize,
            ),
        ];
        for &(name, version, flags, want) in cases {
            assert_eq!(
                redirect(name, p, version, flags),
                Some(want as *mut c_void),
                "{name:?} at {version}, flags {flags}"
            );
        }
        assert_eq!(redirect(c"cuCtxSynchronize", p, 12000, 0), None);
        assert_eq!(
            redirect(c"cuMemAlloc", std::ptr::null_mut(), 12000, 0),
            None
        );
    }
}
