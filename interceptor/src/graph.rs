//! CUDA graphs and the limits: the driver launches a graph's kernels itself, so the hooks on
//! kernel launches never see them, and maps the memory of its memory nodes when it is launched
//! or uploaded, so no allocation hook sees that either. A graph's cost is therefore taken when it
//! is instantiated — the blocks of every kernel node and the bytes of every memory allocation
//! node, child graphs included — and charged at each `cuGraphLaunch` (blocks, see `hooks`) and
//! `cuGraphLaunch` or `cuGraphUpload` (memory, see `pool::graph_memory`). The driver keeps a
//! graph's memory mapped to it across its launches, until `cuDeviceGraphMemTrim` (as an NVIDIA
//! H100 showed): a graph launched again maps nothing new. `cuGraphExecUpdate`
//! takes the cost again from the new graph; a kernel or child graph node's parameters set on an
//! instantiated graph (`cuGraphExecKernelNodeSetParams`, `cuGraphExecChildGraphNodeSetParams`,
//! `cuGraphExecNodeSetParams`) change it by that node's blocks.
//!
//! The exported functions are the driver API's own: their safety contract is the one `cuda.h`
//! documents, and they are meant to be called from C only.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void};

use crate::costs::{self, keep, mappings, Cost, Mapping, MAX_KEPT_NODES};
use crate::cuda::CU_MEM_LOCATION_TYPE_DEVICE;
use crate::cuda::{
    CUdevice, CUgraph, CUgraphExec, CUgraphNode, CUmemLocation, CUresult, CUstream, CUDA_SUCCESS,
};
use crate::real::{Lib, Slot};
use crate::state::{core_limit, mode, Mode};

pub mod slots {
    use super::{Lib, Slot};

    pub static CU_GRAPH_INSTANTIATE: Slot = Slot::new(Lib::Cuda, c"cuGraphInstantiate");
    pub static CU_GRAPH_INSTANTIATE_V2: Slot = Slot::new(Lib::Cuda, c"cuGraphInstantiate_v2");
    pub static CU_GRAPH_INSTANTIATE_WITH_FLAGS: Slot =
        Slot::new(Lib::Cuda, c"cuGraphInstantiateWithFlags");
    pub static CU_GRAPH_INSTANTIATE_WITH_PARAMS: Slot =
        Slot::new(Lib::Cuda, c"cuGraphInstantiateWithParams");
    pub static CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ: Slot =
        Slot::new(Lib::Cuda, c"cuGraphInstantiateWithParams_ptsz");
    pub static CU_GRAPH_EXEC_DESTROY: Slot = Slot::new(Lib::Cuda, c"cuGraphExecDestroy");
    pub static CU_GRAPH_EXEC_UPDATE: Slot = Slot::new(Lib::Cuda, c"cuGraphExecUpdate");
    pub static CU_GRAPH_EXEC_UPDATE_V2: Slot = Slot::new(Lib::Cuda, c"cuGraphExecUpdate_v2");
    pub static CU_GRAPH_UPLOAD: Slot = Slot::new(Lib::Cuda, c"cuGraphUpload");
    pub static CU_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS: Slot =
        Slot::new(Lib::Cuda, c"cuGraphExecKernelNodeSetParams");
    pub static CU_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS_V2: Slot =
        Slot::new(Lib::Cuda, c"cuGraphExecKernelNodeSetParams_v2");
    pub static CU_GRAPH_EXEC_CHILD_GRAPH_NODE_SET_PARAMS: Slot =
        Slot::new(Lib::Cuda, c"cuGraphExecChildGraphNodeSetParams");
    pub static CU_GRAPH_EXEC_NODE_SET_PARAMS: Slot =
        Slot::new(Lib::Cuda, c"cuGraphExecNodeSetParams");
    pub static CU_GRAPH_UPLOAD_PTSZ: Slot = Slot::new(Lib::Cuda, c"cuGraphUpload_ptsz");
    // Not hooked: what a graph's nodes are read with.
    pub static CU_GRAPH_GET_NODES: Slot = Slot::new(Lib::Cuda, c"cuGraphGetNodes");
    pub static CU_GRAPH_NODE_GET_TYPE: Slot = Slot::new(Lib::Cuda, c"cuGraphNodeGetType");
    pub static CU_GRAPH_KERNEL_NODE_GET_PARAMS: Slot =
        Slot::new(Lib::Cuda, c"cuGraphKernelNodeGetParams");
    pub static CU_GRAPH_KERNEL_NODE_GET_PARAMS_V2: Slot =
        Slot::new(Lib::Cuda, c"cuGraphKernelNodeGetParams_v2");
    pub static CU_GRAPH_CHILD_GRAPH_NODE_GET_GRAPH: Slot =
        Slot::new(Lib::Cuda, c"cuGraphChildGraphNodeGetGraph");
    pub static CU_GRAPH_MEM_ALLOC_NODE_GET_PARAMS: Slot =
        Slot::new(Lib::Cuda, c"cuGraphMemAllocNodeGetParams");
}

/// `CUgraphNodeType`s.
const CU_GRAPH_NODE_TYPE_KERNEL: i32 = 0;
const CU_GRAPH_NODE_TYPE_GRAPH: i32 = 4;
const CU_GRAPH_NODE_TYPE_MEM_ALLOC: i32 = 10;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`: `cuGraphInstantiateWithParams` uploads the graph too.
const CU_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;

/// Bounds on what is read of a graph, child graphs included: its nodes are the application's to
/// make. Nodes past the first `MAX_NODES` are not counted.
const MAX_NODES: usize = 1 << 16;
const MAX_DEPTH: u32 = 8;
/// Make `call`, a launch or upload of `exec`, within the memory limit: the graph memory it may
/// map is reserved first (see `pool::graph_memory`). The graph's memory is looked up only where
/// a memory limit is in force: a launch is a hot path.
pub(crate) fn mapping(exec: CUgraphExec, call: impl FnOnce() -> CUresult) -> CUresult {
    let mut asked = false;
    let memory = || {
        asked = true;
        mappings(exec)
    };
    let r = crate::pool::graph_memory(memory, call);
    if asked && r == CUDA_SUCCESS {
        costs::note_mapped(exec);
    }
    r
}

/// Whether a core or memory limit is in force: only then is a graph's cost worth reading.
fn limited() -> bool {
    matches!(mode(), Mode::Limited(l)
        if core_limit(l).is_some() || l.config.memory_limit_bytes.is_some())
}

/// What a launch of a graph made from `graph` costs, where a limit is in force.
fn read_cost(graph: CUgraph) -> Option<Cost> {
    limited().then(|| {
        let mut cost = Cost::default();
        graph_cost(&Driver, graph, 0, &mut { MAX_NODES }, &mut cost);
        cost.blocks = cost.blocks.max(1);
        cost
    })
}

/// Instantiate `graph` (anew or in place) with `call`, which maps its memory too where
/// `uploads`, and keep its cost for the instantiated graph `exec` names after success.
fn instantiate(
    graph: CUgraph,
    uploads: bool,
    call: impl FnOnce() -> CUresult,
    exec: impl FnOnce() -> Option<CUgraphExec>,
) -> CUresult {
    let cost = read_cost(graph);
    let r = match &cost {
        Some(c) if uploads => {
            let first = || c.memory.iter().map(|&(d, b)| Mapping::new(d, b)).collect();
            crate::pool::graph_memory(first, call)
        }
        _ => call(),
    };
    if let (CUDA_SUCCESS, Some(mut cost)) = (r, cost) {
        if let Some(exec) = exec() {
            cost.mapped = uploads && !cost.memory.is_empty();
            keep(exec, cost);
        }
    }
    r
}

/// Whether `cuGraphInstantiateWithParams`'s params (`CUDA_GRAPH_INSTANTIATE_PARAMS`, whose
/// first field is its flags) ask for an upload.
fn uploads(params: *mut c_void) -> bool {
    // SAFETY: the caller's, null (the driver's to refuse) or the struct cuda.h lays out.
    unsafe { params.cast::<u64>().as_ref() }
        .is_some_and(|flags| flags & CU_GRAPH_INSTANTIATE_FLAG_UPLOAD != 0)
}

/// What a graph's cost is read with: the driver's calls, behind a trait so that the walk and
/// its bounds can be tested against graphs no driver would make.
trait Graphs {
    /// At most `max` of `graph`'s nodes; `None` where the driver cannot say.
    fn nodes(&self, graph: CUgraph, max: usize) -> Option<Vec<CUgraphNode>>;
    /// The node's `CUgraphNodeType`.
    fn kind(&self, node: CUgraphNode) -> Option<i32>;
    /// A kernel node's grid size, in blocks.
    fn kernel_blocks(&self, node: CUgraphNode) -> u64;
    /// The graph a child graph node holds.
    fn child(&self, node: CUgraphNode) -> Option<CUgraph>;
    /// A memory allocation node's device and bytes; `None` for host memory or where the driver
    /// cannot say.
    fn allocation(&self, node: CUgraphNode) -> Option<(CUdevice, u64)>;
}

/// Add to `cost` the blocks of every kernel node of `graph` and the bytes of every memory
/// allocation node, and those of the graphs its child nodes hold, reading at most `budget`
/// nodes and [`MAX_DEPTH`] levels.
fn graph_cost(api: &impl Graphs, graph: CUgraph, depth: u32, budget: &mut usize, cost: &mut Cost) {
    if depth > MAX_DEPTH || *budget == 0 {
        return;
    }
    let Some(nodes) = api.nodes(graph, *budget) else {
        return;
    };
    *budget = budget.saturating_sub(nodes.len());
    for node in nodes {
        match api.kind(node) {
            Some(CU_GRAPH_NODE_TYPE_KERNEL) => {
                let blocks = api.kernel_blocks(node);
                cost.blocks = cost.blocks.saturating_add(blocks);
                if depth == 0 && cost.nodes.len() < MAX_KEPT_NODES {
                    cost.nodes.insert(node as usize, blocks);
                }
            }
            Some(CU_GRAPH_NODE_TYPE_GRAPH) => {
                if let Some(child) = api.child(node) {
                    let before = cost.blocks;
                    graph_cost(api, child, depth + 1, budget, cost);
                    if depth == 0 && cost.nodes.len() < MAX_KEPT_NODES {
                        cost.nodes
                            .insert(node as usize, cost.blocks.saturating_sub(before));
                    }
                }
            }
            Some(CU_GRAPH_NODE_TYPE_MEM_ALLOC) => {
                if let Some((dev, bytes)) = api.allocation(node) {
                    cost.allocate(dev, bytes);
                }
            }
            _ => {}
        }
    }
}

/// The driver's graph calls.
struct Driver;

impl Graphs for Driver {
    fn nodes(&self, graph: CUgraph, max: usize) -> Option<Vec<CUgraphNode>> {
        type F = unsafe extern "C" fn(CUgraph, *mut CUgraphNode, *mut usize) -> CUresult;
        // SAFETY: the cuda.h signature of cuGraphGetNodes.
        let get = unsafe { slots::CU_GRAPH_GET_NODES.get::<F>() }?;
        let mut n = 0usize;
        // SAFETY: a null array asks for the count.
        if unsafe { get(graph, std::ptr::null_mut(), &mut n) } != CUDA_SUCCESS {
            return None;
        }
        let mut nodes = vec![std::ptr::null_mut(); n.min(max)];
        let mut got = nodes.len();
        // SAFETY: `nodes` has room for `got` handles; the driver writes at most that many.
        if unsafe { get(graph, nodes.as_mut_ptr(), &mut got) } != CUDA_SUCCESS {
            return None;
        }
        nodes.truncate(got);
        Some(nodes)
    }

    fn kind(&self, node: CUgraphNode) -> Option<i32> {
        type F = unsafe extern "C" fn(CUgraphNode, *mut i32) -> CUresult;
        // SAFETY: the cuda.h signature of cuGraphNodeGetType.
        let get = unsafe { slots::CU_GRAPH_NODE_GET_TYPE.get::<F>() }?;
        let mut kind = -1;
        // SAFETY: a node handle from the driver and an output it fills.
        (unsafe { get(node, &mut kind) } == CUDA_SUCCESS).then_some(kind)
    }

    fn kernel_blocks(&self, node: CUgraphNode) -> u64 {
        kernel_blocks(node)
    }

    fn child(&self, node: CUgraphNode) -> Option<CUgraph> {
        type F = unsafe extern "C" fn(CUgraphNode, *mut CUgraph) -> CUresult;
        // SAFETY: the cuda.h signature of cuGraphChildGraphNodeGetGraph.
        let get = unsafe { slots::CU_GRAPH_CHILD_GRAPH_NODE_GET_GRAPH.get::<F>() }?;
        let mut child = std::ptr::null_mut();
        // SAFETY: a child graph node and an output the driver fills.
        (unsafe { get(node, &mut child) } == CUDA_SUCCESS).then_some(child)
    }

    fn allocation(&self, node: CUgraphNode) -> Option<(CUdevice, u64)> {
        type F = unsafe extern "C" fn(CUgraphNode, *mut MemAllocNodeParams) -> CUresult;
        // SAFETY: the cuda.h signature of cuGraphMemAllocNodeGetParams.
        let get = unsafe { slots::CU_GRAPH_MEM_ALLOC_NODE_GET_PARAMS.get::<F>() }?;
        // Room to spare past the struct, zeroed, 8-aligned.
        let mut buf = [0u64; 32];
        let params = buf.as_mut_ptr().cast::<MemAllocNodeParams>();
        // SAFETY: `buf` is larger than the struct the driver fills.
        if unsafe { get(node, params) } != CUDA_SUCCESS {
            return None;
        }
        // SAFETY: filled by the driver; every bit pattern is a valid value of its fields.
        let p = unsafe { &*params };
        (p.location.typ == CU_MEM_LOCATION_TYPE_DEVICE)
            .then_some((p.location.id, p.bytesize as u64))
    }
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (`_v1`, which `cuGraphMemAllocNodeGetParams` fills): the pool's
/// properties (`CUmemPoolProps`, 88 bytes whose head is a `CUmemAllocationProp`'s), then the
/// access descriptors, the size and the address.
#[repr(C)]
struct MemAllocNodeParams {
    alloc_type: u32,
    handle_types: u32,
    location: CUmemLocation,
    win32_security_attributes: *mut c_void,
    /// `maxSize`, `usage` and reserved bytes.
    pool_props_rest: [u8; 64],
    access_descs: *const c_void,
    access_desc_count: usize,
    bytesize: usize,
    dptr: u64,
}

const _: () = assert!(std::mem::size_of::<MemAllocNodeParams>() == 120);
const _: () = assert!(std::mem::offset_of!(MemAllocNodeParams, bytesize) == 104);

/// After `exec`'s node `node` was given new parameters, its cost takes `blocks` (where a core
/// limit is in force and the graph's cost is known).
fn repriced(r: CUresult, exec: CUgraphExec, node: CUgraphNode, blocks: impl FnOnce() -> u64) {
    if r != CUDA_SUCCESS || !limited() {
        return;
    }
    costs::reprice(exec, node, blocks());
}

/// The grid of the `CUDA_KERNEL_NODE_PARAMS` (any version) at `params`, in blocks.
fn params_blocks(params: *const KernelNodeParamsHead) -> u64 {
    // SAFETY: the caller's, null (the driver's to refuse) or a struct whose head this is.
    unsafe { params.as_ref() }.map_or(0, |h| {
        crate::limiter::blocks(h.grid_dim_x, h.grid_dim_y, h.grid_dim_z)
    })
}

/// The blocks of the graph a child graph node now holds.
fn child_blocks(child: CUgraph) -> u64 {
    let mut cost = Cost::default();
    graph_cost(&Driver, child, 1, &mut { MAX_NODES }, &mut cost);
    cost.blocks
}

type SetKernelParams =
    unsafe extern "C" fn(CUgraphExec, CUgraphNode, *const KernelNodeParamsHead) -> CUresult;

fn set_kernel_params(
    slot: &Slot,
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const KernelNodeParamsHead,
) -> CUresult {
    let real = real!(slot, SetKernelParams);
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real(exec, node, params) };
    repriced(r, exec, node, || params_blocks(params));
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const KernelNodeParamsHead,
) -> CUresult {
    set_kernel_params(
        &slots::CU_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS,
        exec,
        node,
        params,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams_v2(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const KernelNodeParamsHead,
) -> CUresult {
    set_kernel_params(
        &slots::CU_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS_V2,
        exec,
        node,
        params,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecChildGraphNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    child: CUgraph,
) -> CUresult {
    let real = real!(
        slots::CU_GRAPH_EXEC_CHILD_GRAPH_NODE_SET_PARAMS,
        unsafe extern "C" fn(CUgraphExec, CUgraphNode, CUgraph) -> CUresult
    );
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real(exec, node, child) };
    repriced(r, exec, node, || child_blocks(child));
    r
}

/// The head of `CUgraphNodeParams` (CUDA 12.2): the node's type, then (after three reserved
/// ints) its type's parameters.
#[repr(C)]
pub struct GraphNodeParamsHead {
    kind: i32,
    reserved: [i32; 3],
    /// A kernel node's `CUDA_KERNEL_NODE_PARAMS_v3`, or a child graph node's graph.
    params: KernelNodeParamsHead,
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const GraphNodeParamsHead,
) -> CUresult {
    let real = real!(
        slots::CU_GRAPH_EXEC_NODE_SET_PARAMS,
        unsafe extern "C" fn(CUgraphExec, CUgraphNode, *const GraphNodeParamsHead) -> CUresult
    );
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real(exec, node, params) };
    if r != CUDA_SUCCESS {
        return r;
    }
    // SAFETY: the driver took them: the struct cuda.h lays out.
    match unsafe { params.as_ref() } {
        Some(p) if p.kind == CU_GRAPH_NODE_TYPE_KERNEL => {
            repriced(r, exec, node, || params_blocks(&p.params));
        }
        Some(p) if p.kind == CU_GRAPH_NODE_TYPE_GRAPH => {
            repriced(r, exec, node, || child_blocks(p.params.func));
        }
        _ => {}
    }
    r
}

/// The head of `CUDA_KERNEL_NODE_PARAMS`, alike in `_v2` and `_v3`: the function, then the grid.
#[repr(C)]
pub struct KernelNodeParamsHead {
    func: *mut c_void,
    grid_dim_x: u32,
    grid_dim_y: u32,
    grid_dim_z: u32,
}

/// A kernel node's grid size, from `cuGraphKernelNodeGetParams` (`_v2` where the driver has it).
fn kernel_blocks(node: CUgraphNode) -> u64 {
    type GetParams = unsafe extern "C" fn(CUgraphNode, *mut c_void) -> CUresult;
    // Room for the largest version of the struct (72 bytes today), zeroed, 8-aligned.
    let mut params = [0u64; 16];
    let got = [
        &slots::CU_GRAPH_KERNEL_NODE_GET_PARAMS_V2,
        &slots::CU_GRAPH_KERNEL_NODE_GET_PARAMS,
    ]
    .into_iter()
    // SAFETY: the cuda.h signature; `params` is larger than either struct.
    .filter_map(|s| unsafe { s.get::<GetParams>() })
    .any(|f| unsafe { f(node, params.as_mut_ptr().cast()) } == CUDA_SUCCESS);
    if !got {
        return 0;
    }
    // SAFETY: `params` is 8-aligned and larger than the head, which the driver filled.
    let head = unsafe { &*params.as_ptr().cast::<KernelNodeParamsHead>() };
    crate::limiter::blocks(head.grid_dim_x, head.grid_dim_y, head.grid_dim_z)
}

/// A graph instantiated into `*exec` from `graph`: its cost is kept. `uploads` (an expression of
/// the arguments) says whether the call maps the graph's memory too.
macro_rules! instantiate_hook {
    ($name:ident, $slot:ident, ($($arg:ident: $ty:ty),*)) => {
        instantiate_hook!($name, $slot, ($($arg: $ty),*), false);
    };
    ($name:ident, $slot:ident, ($($arg:ident: $ty:ty),*), $uploads:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            exec: *mut CUgraphExec,
            graph: CUgraph,
            $($arg: $ty),*
        ) -> CUresult {
            let real = real!(
                slots::$slot,
                unsafe extern "C" fn(*mut CUgraphExec, CUgraph, $($ty),*) -> CUresult
            );
            instantiate(
                graph,
                $uploads,
                // SAFETY: forwarding the caller's arguments to the real entry point.
                || unsafe { real(exec, graph, $($arg),*) },
                // SAFETY: after success the driver wrote the new handle there.
                || (!exec.is_null()).then(|| unsafe { *exec }),
            )
        }
    };
}

instantiate_hook!(
    cuGraphInstantiate,
    CU_GRAPH_INSTANTIATE,
    (error_node: *mut CUgraphNode, log: *mut c_char, size: usize)
);
instantiate_hook!(
    cuGraphInstantiate_v2,
    CU_GRAPH_INSTANTIATE_V2,
    (error_node: *mut CUgraphNode, log: *mut c_char, size: usize)
);
instantiate_hook!(cuGraphInstantiateWithFlags, CU_GRAPH_INSTANTIATE_WITH_FLAGS, (flags: u64));
instantiate_hook!(
    cuGraphInstantiateWithParams,
    CU_GRAPH_INSTANTIATE_WITH_PARAMS,
    (params: *mut c_void),
    uploads(params)
);
instantiate_hook!(
    cuGraphInstantiateWithParams_ptsz,
    CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ,
    (params: *mut c_void),
    uploads(params)
);

/// A graph instantiated again in place from `graph`: its cost is taken again.
macro_rules! update_hook {
    ($name:ident, $slot:ident, ($($arg:ident: $ty:ty),*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            exec: CUgraphExec,
            graph: CUgraph,
            $($arg: $ty),*
        ) -> CUresult {
            let real = real!(
                slots::$slot,
                unsafe extern "C" fn(CUgraphExec, CUgraph, $($ty),*) -> CUresult
            );
            // SAFETY: forwarding the caller's arguments to the real entry point.
            instantiate(graph, false, || unsafe { real(exec, graph, $($arg),*) }, || Some(exec))
        }
    };
}

update_hook!(
    cuGraphExecUpdate,
    CU_GRAPH_EXEC_UPDATE,
    (error_node: *mut CUgraphNode, result: *mut i32)
);
update_hook!(cuGraphExecUpdate_v2, CU_GRAPH_EXEC_UPDATE_V2, (info: *mut c_void));

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    let real = real!(
        slots::CU_GRAPH_EXEC_DESTROY,
        unsafe extern "C" fn(CUgraphExec) -> CUresult
    );
    costs::forget(exec);
    // SAFETY: forwarding the caller's argument.
    unsafe { real(exec) }
}

type Upload = unsafe extern "C" fn(CUgraphExec, CUstream) -> CUresult;

/// An upload maps the graph's memory ahead of its launches: it must fit the memory limit.
#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let real = real!(slots::CU_GRAPH_UPLOAD, Upload);
    // SAFETY: forwarding the caller's arguments.
    mapping(exec, || unsafe { real(exec, stream) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let real = real!(slots::CU_GRAPH_UPLOAD_PTSZ, Upload);
    // SAFETY: forwarding the caller's arguments.
    mapping(exec, || unsafe { real(exec, stream) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Graphs as numbers: graph `g` has `fan_out` nodes; node `i` of it is a kernel of 10 blocks
    /// when `i` is even, else a child node holding graph `child_of(g)`. Counts the nodes read.
    struct Hostile {
        fan_out: usize,
        child_of: fn(usize) -> usize,
        read: Cell<usize>,
    }

    impl Graphs for Hostile {
        fn nodes(&self, graph: CUgraph, max: usize) -> Option<Vec<CUgraphNode>> {
            let n = self.fan_out.min(max);
            self.read.set(self.read.get() + n);
            assert!(self.read.get() <= MAX_NODES, "read past the node budget");
            // A node is its graph and index, packed.
            Some(
                (0..n)
                    .map(|i| ((graph as usize) << 20 | i) as CUgraphNode)
                    .collect(),
            )
        }
        fn kind(&self, node: CUgraphNode) -> Option<i32> {
            Some(if (node as usize & 0xfffff).is_multiple_of(2) {
                CU_GRAPH_NODE_TYPE_KERNEL
            } else {
                CU_GRAPH_NODE_TYPE_GRAPH
            })
        }
        fn kernel_blocks(&self, _: CUgraphNode) -> u64 {
            10
        }
        fn child(&self, node: CUgraphNode) -> Option<CUgraph> {
            Some((self.child_of)(node as usize >> 20) as CUgraph)
        }
        fn allocation(&self, _: CUgraphNode) -> Option<(CUdevice, u64)> {
            None
        }
    }

    fn blocks_of(api: &impl Graphs, graph: usize) -> u64 {
        let mut cost = Cost::default();
        graph_cost(api, graph as CUgraph, 0, &mut { MAX_NODES }, &mut cost);
        cost.blocks
    }

    #[test]
    fn a_graph_that_holds_itself_is_read_to_a_bounded_depth() {
        let api = Hostile {
            fan_out: 2,
            child_of: |g| g,
            read: Cell::new(0),
        };
        // Each level: one kernel of 10 blocks and the same graph again.
        let blocks = blocks_of(&api, 1);
        assert_eq!(blocks, 10 * u64::from(MAX_DEPTH + 1));
        assert_eq!(api.read.get(), 2 * (MAX_DEPTH as usize + 1));
    }

    #[test]
    fn a_wide_deep_graph_is_read_within_the_node_budget() {
        let api = Hostile {
            fan_out: 1 << 20,
            child_of: |g| g + 1,
            read: Cell::new(0),
        };
        let blocks = blocks_of(&api, 1);
        assert_eq!(
            api.read.get(),
            MAX_NODES,
            "no more nodes read than the budget"
        );
        assert!(blocks > 0);
    }

    #[test]
    fn child_graphs_count() {
        let api = Hostile {
            fan_out: 4,
            child_of: |g| g + 1,
            read: Cell::new(0),
        };
        // Two kernels a level, MAX_DEPTH + 1 levels of two children each: 2^(levels) - 1
        // graphs of 20 blocks.
        let levels = MAX_DEPTH + 1;
        let graphs = (1u64 << levels) - 1;
        assert_eq!(blocks_of(&api, 1), 20 * graphs);
    }

    /// Graph 1: a kernel, two allocations on device 0 and one on device 1, and a child graph
    /// (2) with another on device 1 and a free node; node handles are (graph, index).
    struct Allocating;

    impl Graphs for Allocating {
        fn nodes(&self, graph: CUgraph, max: usize) -> Option<Vec<CUgraphNode>> {
            let n = if graph as usize == 1 { 5 } else { 2 };
            Some(
                (0..n.min(max))
                    .map(|i| ((graph as usize) << 8 | i) as CUgraphNode)
                    .collect(),
            )
        }
        fn kind(&self, node: CUgraphNode) -> Option<i32> {
            Some(match (node as usize >> 8, node as usize & 0xff) {
                (1, 0) => CU_GRAPH_NODE_TYPE_KERNEL,
                (1, 4) => CU_GRAPH_NODE_TYPE_GRAPH,
                (2, 1) => 11,
                _ => CU_GRAPH_NODE_TYPE_MEM_ALLOC,
            })
        }
        fn kernel_blocks(&self, _: CUgraphNode) -> u64 {
            7
        }
        fn child(&self, _: CUgraphNode) -> Option<CUgraph> {
            Some(2 as CUgraph)
        }
        fn allocation(&self, node: CUgraphNode) -> Option<(CUdevice, u64)> {
            Some(match (node as usize >> 8, node as usize & 0xff) {
                (1, 1) => (0, 100),
                (1, 2) => (0, u64::MAX),
                (1, 3) => (1, 30),
                _ => (1, 5),
            })
        }
    }

    #[test]
    fn memory_nodes_count_by_device_child_graphs_included_and_saturate() {
        let mut cost = Cost::default();
        graph_cost(&Allocating, 1 as CUgraph, 0, &mut { MAX_NODES }, &mut cost);
        assert_eq!(cost.blocks, 7);
        assert_eq!(cost.memory, [(0, u64::MAX), (1, 35)]);
    }

    #[test]
    fn a_nodes_new_parameters_replace_its_blocks_however_often_they_change() {
        // Graph 1: a kernel of 7 blocks (node 0x100) and a child graph (node 0x104) holding none.
        let mut cost = Cost::default();
        graph_cost(&Allocating, 1 as CUgraph, 0, &mut { MAX_NODES }, &mut cost);
        assert_eq!(cost.nodes.get(&0x100), Some(&7));
        assert_eq!(cost.nodes.get(&0x104), Some(&0));
        for _ in 0..3 {
            cost.reprice(0x100 as CUgraphNode, 1000);
            cost.reprice(0x104 as CUgraphNode, 500);
        }
        assert_eq!(cost.blocks, 1500);
        cost.reprice(0x100 as CUgraphNode, 1);
        assert_eq!(cost.blocks, 501);
        // A node not kept (past the bound, or never seen) is charged without taking anything
        // off, once; later changes to it are exact.
        cost.reprice(0x999 as CUgraphNode, 100);
        cost.reprice(0x999 as CUgraphNode, 100);
        assert_eq!(cost.blocks, 601);
    }
}
