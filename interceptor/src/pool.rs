//! Memory pools: the path of `cuMemAllocAsync` (`cudaMallocAsync`, PyTorch's `cudaMallocAsync`
//! backend) and `cuMemAllocFromPoolAsync`. A pool keeps the memory of freed allocations, up to
//! its release threshold, for the next ones; that memory is the container's as much as what is
//! allocated. So a pool is charged what the driver says it has reserved
//! (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`), and never less than what is allocated from it.
//!
//! An allocation reserves, before the driver is called, what the pool would have to grow by:
//! the request less what the pool keeps unused. Before refusing, every pool is read again (the
//! driver may have released memory at a synchronisation since). After each pool operation the
//! charge is set to what the driver reports.
//!
//! A device's graph memory, which the driver maps for graphs' memory allocation nodes when they
//! are launched or uploaded and keeps until `cuDeviceGraphMemTrim`, is charged the same way: as
//! a pool whose reservation the driver reports (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`). A
//! launch first reserves what the graph's allocation nodes may add: their bytes less what the
//! graph memory holds unused, and nothing for a graph whose memory the driver still holds
//! mapped to it from an earlier launch ([`graph_memory`]).
//!
//! The exported functions are the driver API's own: their safety contract is the one `cuda.h`
//! documents, and they are meant to be called from C only.

#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;

use crate::account::{device_uuid, reserve, On};
use crate::charges::{Pool, Pools, Source};
use crate::costs::Mapping;
use crate::cuda::*;
use crate::lock;
use crate::real::{Lib, Slot};
use crate::state::{mode, Limited, Mode};

pub mod slots {
    use super::{Lib, Slot};

    pub static CU_MEM_POOL_CREATE: Slot = Slot::new(Lib::Cuda, c"cuMemPoolCreate");
    pub static CU_MEM_POOL_DESTROY: Slot = Slot::new(Lib::Cuda, c"cuMemPoolDestroy");
    pub static CU_MEM_POOL_TRIM_TO: Slot = Slot::new(Lib::Cuda, c"cuMemPoolTrimTo");
    pub static CU_DEVICE_GET_DEFAULT_MEM_POOL: Slot =
        Slot::new(Lib::Cuda, c"cuDeviceGetDefaultMemPool");
    pub static CU_DEVICE_GET_MEM_POOL: Slot = Slot::new(Lib::Cuda, c"cuDeviceGetMemPool");
    pub static CU_DEVICE_GRAPH_MEM_TRIM: Slot = Slot::new(Lib::Cuda, c"cuDeviceGraphMemTrim");
    // Not hooked: what the charges are read with.
    pub static CU_MEM_POOL_GET_ATTRIBUTE: Slot = Slot::new(Lib::Cuda, c"cuMemPoolGetAttribute");
    pub static CU_DEVICE_GET_GRAPH_MEM_ATTRIBUTE: Slot =
        Slot::new(Lib::Cuda, c"cuDeviceGetGraphMemAttribute");
}

/// `CUmemPool_attribute`: the bytes the pool holds from the driver.
const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: i32 = 5;
/// `CUgraphMem_attribute`s: the bytes of a device's graph memory in use by graphs' allocations,
/// and those it holds from the driver.
const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: i32 = 0;
const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: i32 = 2;

/// What the ledger holds for this process's pools on `uuid`.
pub(crate) fn charged_on(l: &Limited, uuid: &CUuuid) -> u64 {
    lock(&l.pools)
        .pools
        .values()
        .filter(|p| p.uuid.as_ref() == Some(uuid))
        .fold(0, |sum, p| sum.saturating_add(p.charged))
}

/// What the driver says `source` has reserved.
fn reserved(source: Source) -> Option<u64> {
    match source {
        Source::Pool(pool) => pool_reserved(pool),
        Source::Graphs(dev) => graph_attribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
    }
}

/// A `CUgraphMem_attribute` of device `dev`.
fn graph_attribute(dev: CUdevice, attribute: i32) -> Option<u64> {
    type F = unsafe extern "C" fn(CUdevice, i32, *mut u64) -> CUresult;
    // SAFETY: cuDeviceGetGraphMemAttribute(CUdevice, CUgraphMem_attribute, void *value); these
    // attributes' values are cuuint64_t.
    let f = unsafe { slots::CU_DEVICE_GET_GRAPH_MEM_ATTRIBUTE.get::<F>() }?;
    let mut v = 0u64;
    // SAFETY: `v` outlives the call.
    (unsafe { f(dev, attribute, &mut v) } == CUDA_SUCCESS).then_some(v)
}

/// What the driver says `pool` has reserved.
fn pool_reserved(pool: usize) -> Option<u64> {
    type F = unsafe extern "C" fn(CUmemoryPool, i32, *mut u64) -> CUresult;
    // SAFETY: cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute, void *value); this
    // attribute's value is a cuuint64_t.
    let f = unsafe { slots::CU_MEM_POOL_GET_ATTRIBUTE.get::<F>() }?;
    let mut v = 0u64;
    // SAFETY: `v` outlives the call.
    let r = unsafe {
        f(
            pool as CUmemoryPool,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            &mut v,
        )
    };
    (r == CUDA_SUCCESS).then_some(v)
}

/// The charge `p` should have: what the driver reports, at least what is allocated. Graph
/// memory the driver cannot report on keeps its charge.
fn wanted(source: Source, p: &Pool) -> u64 {
    if p.destroyed {
        return p.live;
    }
    let unknown = match source {
        Source::Pool(_) => p.live,
        Source::Graphs(_) => p.charged,
    };
    reserved(source).map_or(unknown, |r| r.max(p.live))
}

/// Set `p`'s charge to what the driver reports.
fn resync(l: &Limited, source: Source, p: &mut Pool) {
    let Some(uuid) = p.uuid else { return };
    let want = wanted(source, p);
    match lock(&l.ledger).rebase(&uuid, p.charged, want) {
        Ok(()) => p.charged = want,
        Err(e) => crate::warn(format_args!("accounting failed: {e}")),
    }
}

fn resync_all(l: &Limited, pools: &mut HashMap<Source, Pool>) {
    for (source, p) in pools.iter_mut() {
        resync(l, *source, p);
    }
    pools.retain(|_, p| !(p.destroyed && p.live == 0));
}

/// Read every pool's reservation again: the driver releases what a pool keeps past its
/// threshold at synchronisations, which no hook sees.
pub(crate) fn refresh(l: &Limited) {
    resync_all(l, &mut lock(&l.pools).pools);
}

/// Whether `ptr` was allocated from a pool.
pub(crate) fn owns(l: &Limited, ptr: u64) -> bool {
    lock(&l.pools).allocations.contains_key(&ptr)
}

fn limited() -> Result<Option<(&'static Limited, u64)>, CUresult> {
    match mode() {
        Mode::Broken(_) => Err(CUDA_ERROR_NOT_PERMITTED),
        Mode::PassThrough => Ok(None),
        Mode::Limited(l) => Ok(l.config.memory_limit_bytes.map(|limit| (&**l, limit))),
    }
}

/// Allocate `size` bytes from `pool` (on `on`'s device if the pool was not seen made) with
/// `call`; `key` reads the pointer after success.
pub(crate) fn allocate(
    pool: usize,
    on: On,
    size: u64,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> u64,
) -> CUresult {
    let (l, limit) = match limited() {
        Err(r) => return r,
        Ok(None) => return call(),
        Ok(Some(x)) => x,
    };
    let mut guard = lock(&l.pools);
    let Pools { pools, allocations } = &mut *guard;
    let source = Source::Pool(pool);
    if let std::collections::hash_map::Entry::Vacant(e) = pools.entry(source) {
        match device_uuid(l, on) {
            Ok(u) => e.insert(Pool::on(Some(u))),
            Err(r) => return r,
        };
    }
    let Some(uuid) = pools.get(&source).and_then(|p| p.uuid) else {
        return call();
    };
    // What the pool must grow by: the request less what it keeps unused.
    let unused = |p: &Pool| p.charged.saturating_sub(p.live);
    if let Err(r) = grow(l, pools, source, uuid, size, limit, unused) {
        return r;
    }
    let p = pools.entry(source).or_insert_with(|| Pool::on(Some(uuid)));
    let r = call();
    if r == CUDA_SUCCESS {
        p.live = p.live.saturating_add(size);
        allocations.insert(key(), (pool, size));
    }
    resync(l, source, p);
    r
}

/// Charge `source` (on `uuid`) what it must grow by to hold `size` more bytes: `size` less what
/// `unused` says it holds unused. Where that is past the limit, every charge is first set to
/// what the driver reports (it may have released memory since) and the growth taken again.
fn grow(
    l: &Limited,
    pools: &mut HashMap<Source, Pool>,
    source: Source,
    uuid: CUuuid,
    size: u64,
    limit: u64,
    unused: impl Fn(&Pool) -> u64,
) -> Result<(), CUresult> {
    let growth = |pools: &HashMap<Source, Pool>| {
        pools
            .get(&source)
            .map_or(size, |p| size.saturating_sub(unused(p)))
    };
    let mut need = growth(pools);
    if need > 0 && reserve(l, &uuid, need, limit).is_err() {
        resync_all(l, pools);
        need = growth(pools);
        reserve(l, &uuid, need, limit)?;
    }
    let p = pools.entry(source).or_insert_with(|| Pool::on(Some(uuid)));
    p.charged = p.charged.saturating_add(need);
    Ok(())
}

/// Make `call`, a graph launch or upload that maps `memory()` (its allocation nodes' bytes by
/// device; asked only where a memory limit is in force) within the limit: each device's graph
/// memory is first charged what it must grow by (the bytes not mapped to the graph already, less
/// what it holds unused), and after the call what the driver reports.
pub(crate) fn graph_memory(
    memory: impl FnOnce() -> Vec<Mapping>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let (l, limit) = match limited() {
        Err(r) => return r,
        Ok(None) => return call(),
        Ok(Some(x)) => x,
    };
    let memory = memory();
    if memory.is_empty() {
        return call();
    }
    let mut guard = lock(&l.pools);
    let pools = &mut guard.pools;
    let mut charged = Vec::with_capacity(memory.len());
    let mut refused = None;
    for m in memory {
        let source = Source::Graphs(m.dev);
        let used = || graph_attribute(m.dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
        // The graph's own mapping counts only while the driver reports at least every mapping
        // this process knows of in use (asked only of a graph that holds one).
        let held = match m.held {
            0 => 0,
            held => used().filter(|&u| u >= m.all_held).map_or(0, |_| held),
        };
        let unused = |p: &Pool| used().map_or(0, |u| p.charged.saturating_sub(u));
        let bytes = m.bytes.saturating_sub(held);
        let r = device_uuid(l, On::Ordinal(m.dev))
            .and_then(|uuid| grow(l, pools, source, uuid, bytes, limit, unused));
        charged.push(source);
        if let Err(r) = r {
            refused = Some(r);
            break;
        }
    }
    let r = refused.unwrap_or_else(call);
    for source in charged {
        if let Some(p) = pools.get_mut(&source) {
            resync(l, source, p);
        }
    }
    r
}

/// Free a pool allocation with `call`, and charge the pool what the driver says it keeps.
pub(crate) fn free(l: &Limited, ptr: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let mut guard = lock(&l.pools);
    let r = call();
    if r != CUDA_SUCCESS {
        return r;
    }
    let Pools { pools, allocations } = &mut *guard;
    if let Some((pool, size)) = allocations.remove(&ptr) {
        let source = Source::Pool(pool);
        if let Some(p) = pools.get_mut(&source) {
            p.live = p.live.saturating_sub(size);
            resync(l, source, p);
            if p.destroyed && p.live == 0 {
                pools.remove(&source);
            }
        }
    }
    r
}

/// Remember that `pool` is on `uuid` (or host memory), unless known already.
fn note(l: &Limited, pool: usize, uuid: Option<CUuuid>) {
    lock(&l.pools)
        .pools
        .entry(Source::Pool(pool))
        .or_insert_with(|| Pool::on(uuid));
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemAllocationPropHead,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut CUmemoryPool, *const CUmemAllocationPropHead) -> CUresult;
    let f = real!(slots::CU_MEM_POOL_CREATE, F);
    let l = match limited() {
        Err(r) => return r,
        // SAFETY: forwarding the caller's arguments.
        Ok(None) => return unsafe { f(pool, props) },
        Ok(Some((l, _))) => l,
    };
    // SAFETY: the caller's (null is the driver's to refuse); `CUmemPoolProps` starts as
    // `CUmemAllocationProp` does.
    let location = unsafe { props.as_ref() }.map(|p| p.location);
    let uuid = match location {
        Some(loc) if loc.typ == CU_MEM_LOCATION_TYPE_DEVICE => {
            match device_uuid(l, On::Ordinal(loc.id)) {
                Ok(u) => Some(u),
                Err(r) => return r,
            }
        }
        _ => None,
    };
    // SAFETY: forwarding the caller's arguments; `pool` is read only after success.
    let r = unsafe { f(pool, props) };
    if r == CUDA_SUCCESS {
        // SAFETY: the driver filled it.
        note(l, unsafe { *pool } as usize, uuid);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    let f = real!(
        slots::CU_MEM_POOL_DESTROY,
        unsafe extern "C" fn(CUmemoryPool) -> CUresult
    );
    let l = match limited() {
        Err(r) => return r,
        // SAFETY: forwarding the caller's argument.
        Ok(None) => return unsafe { f(pool) },
        Ok(Some((l, _))) => l,
    };
    let mut guard = lock(&l.pools);
    // SAFETY: forwarding the caller's argument.
    let r = unsafe { f(pool) };
    if r == CUDA_SUCCESS {
        if let Some(p) = guard.pools.get_mut(&Source::Pool(pool as usize)) {
            p.destroyed = true;
        }
        resync_all(l, &mut guard.pools);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    type F = unsafe extern "C" fn(CUmemoryPool, usize) -> CUresult;
    let f = real!(slots::CU_MEM_POOL_TRIM_TO, F);
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { f(pool, keep) };
    if let (CUDA_SUCCESS, Ok(Some((l, _)))) = (r, limited()) {
        refresh(l);
    }
    r
}

/// Trimming gives back the graph memory no graph uses: the device's charge follows.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    let f = real!(
        slots::CU_DEVICE_GRAPH_MEM_TRIM,
        unsafe extern "C" fn(CUdevice) -> CUresult
    );
    // SAFETY: forwarding the caller's argument.
    let r = unsafe { f(dev) };
    if r == CUDA_SUCCESS {
        crate::costs::trimmed(dev);
    }
    if let (CUDA_SUCCESS, Ok(Some((l, _)))) = (r, limited()) {
        let mut guard = lock(&l.pools);
        let source = Source::Graphs(dev);
        if let Some(p) = guard.pools.get_mut(&source) {
            resync(l, source, p);
        }
    }
    r
}

type GetPool = unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult;

/// `cuDeviceGetDefaultMemPool` and `cuDeviceGetMemPool`: the pool is on `dev`.
fn get_pool(slot: &Slot, pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    let f = real!(slot, GetPool);
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { f(pool, dev) };
    if let (CUDA_SUCCESS, Ok(Some((l, _)))) = (r, limited()) {
        if let Ok(uuid) = device_uuid(l, On::Ordinal(dev)) {
            // SAFETY: the driver filled it.
            note(l, unsafe { *pool } as usize, Some(uuid));
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    get_pool(&slots::CU_DEVICE_GET_DEFAULT_MEM_POOL, pool, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    get_pool(&slots::CU_DEVICE_GET_MEM_POOL, pool, dev)
}

/// The pool `cuMemAllocAsync` allocates from: the current device's current pool, if the driver
/// can say.
pub(crate) fn current_pool() -> Option<usize> {
    type Dev = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
    // SAFETY: the cuda.h signatures.
    let (ctx_dev, get) = unsafe {
        (
            crate::account::slots::CU_CTX_GET_DEVICE.get::<Dev>()?,
            slots::CU_DEVICE_GET_MEM_POOL.get::<GetPool>()?,
        )
    };
    let mut dev = 0;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: outputs that outlive the calls.
    unsafe {
        if ctx_dev(&mut dev) != CUDA_SUCCESS || get(&mut pool, dev) != CUDA_SUCCESS {
            return None;
        }
    }
    (!pool.is_null()).then_some(pool as usize)
}
