//! CUDA graphs and the core limit: the driver launches a graph's kernels itself, so the hooks on
//! kernel launches never see them. A graph's cost is therefore taken when it is instantiated —
//! the blocks of every kernel node, child graphs included — and charged at each `cuGraphLaunch`
//! (see `hooks`). `cuGraphExecUpdate` takes the cost again from the new graph; a single node's
//! parameters set on an instantiated graph (`cuGraphExecKernelNodeSetParams`) are not seen.
//!
//! The exported functions are the driver API's own: their safety contract is the one `cuda.h`
//! documents, and they are meant to be called from C only.

#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::Mutex;

use crate::cuda::{CUresult, CUDA_SUCCESS};
use crate::real::{Lib, Slot};
use crate::state::{lock, mode, Mode};

pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraphNode = *mut c_void;

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
    // Not hooked: what a graph's kernels are read with.
    pub static CU_GRAPH_GET_NODES: Slot = Slot::new(Lib::Cuda, c"cuGraphGetNodes");
    pub static CU_GRAPH_NODE_GET_TYPE: Slot = Slot::new(Lib::Cuda, c"cuGraphNodeGetType");
    pub static CU_GRAPH_KERNEL_NODE_GET_PARAMS: Slot =
        Slot::new(Lib::Cuda, c"cuGraphKernelNodeGetParams");
    pub static CU_GRAPH_KERNEL_NODE_GET_PARAMS_V2: Slot =
        Slot::new(Lib::Cuda, c"cuGraphKernelNodeGetParams_v2");
    pub static CU_GRAPH_CHILD_GRAPH_NODE_GET_GRAPH: Slot =
        Slot::new(Lib::Cuda, c"cuGraphChildGraphNodeGetGraph");
}

/// `CUgraphNodeType`s.
const CU_GRAPH_NODE_TYPE_KERNEL: i32 = 0;
const CU_GRAPH_NODE_TYPE_GRAPH: i32 = 5;

/// Bounds on what is read of a graph, child graphs included: its nodes are the application's to
/// make. Nodes past the first `MAX_NODES` are not counted.
const MAX_NODES: usize = 1 << 16;
const MAX_DEPTH: u32 = 8;
/// Instantiated graphs whose cost is kept; past it one is forgotten for each new one.
const MAX_EXECS: usize = 1 << 16;

/// The cost in blocks of each instantiated graph, by its handle.
static COSTS: Mutex<Option<HashMap<usize, u64>>> = Mutex::new(None);

/// Hold the costs' lock across a `fork` (see `state::register_fork_handlers`).
pub(crate) fn hold_for_fork(held: &mut Vec<Box<dyn std::any::Any>>) {
    held.push(Box::new(lock(&COSTS)));
}

/// What a launch of `exec` costs: its kernels' blocks, or 1 for a graph instantiated before any
/// hook saw it.
pub(crate) fn cost(exec: CUgraphExec) -> u64 {
    lock(&COSTS)
        .as_ref()
        .and_then(|m| m.get(&(exec as usize)).copied())
        .unwrap_or(1)
}

/// Whether a core limit is in force: only then is a graph's cost worth reading.
fn limited() -> bool {
    matches!(mode(), Mode::Limited(l) if crate::hooks::core_limit(l).is_some())
}

/// After a successful instantiation of `graph` into `*exec`, keep its cost.
fn instantiated(r: CUresult, exec: *mut CUgraphExec, graph: CUgraph) -> CUresult {
    if r == CUDA_SUCCESS && !exec.is_null() {
        // SAFETY: the driver wrote the new handle there.
        remember(unsafe { *exec }, graph);
    }
    r
}

/// Keep what a launch of `exec`, made from `graph`, costs (where a core limit is in force).
fn remember(exec: CUgraphExec, graph: CUgraph) {
    if !limited() {
        return;
    }
    let exec = exec as usize;
    let blocks = graph_blocks(graph, 0, &mut { MAX_NODES });
    let mut costs = lock(&COSTS);
    let m = costs.get_or_insert_with(HashMap::new);
    if m.len() >= MAX_EXECS && !m.contains_key(&exec) {
        if let Some(k) = m.keys().next().copied() {
            m.remove(&k);
        }
    }
    m.insert(exec, blocks.max(1));
}

/// The blocks of every kernel node of `graph` and of the graphs its child nodes hold, reading at
/// most `budget` nodes.
fn graph_blocks(graph: CUgraph, depth: u32, budget: &mut usize) -> u64 {
    type GetNodes = unsafe extern "C" fn(CUgraph, *mut CUgraphNode, *mut usize) -> CUresult;
    type GetType = unsafe extern "C" fn(CUgraphNode, *mut i32) -> CUresult;
    type GetChild = unsafe extern "C" fn(CUgraphNode, *mut CUgraph) -> CUresult;
    // SAFETY: the cuda.h signatures of these symbols.
    let (Some(get_nodes), Some(get_type)) = (
        unsafe { slots::CU_GRAPH_GET_NODES.get::<GetNodes>() },
        unsafe { slots::CU_GRAPH_NODE_GET_TYPE.get::<GetType>() },
    ) else {
        return 0;
    };
    if depth > MAX_DEPTH || *budget == 0 {
        return 0;
    }
    let mut n = 0usize;
    // SAFETY: a null array asks for the count.
    if unsafe { get_nodes(graph, std::ptr::null_mut(), &mut n) } != CUDA_SUCCESS {
        return 0;
    }
    let mut nodes = vec![std::ptr::null_mut(); n.min(*budget)];
    let mut got = nodes.len();
    // SAFETY: `nodes` has room for `got` handles; the driver writes at most that many.
    if unsafe { get_nodes(graph, nodes.as_mut_ptr(), &mut got) } != CUDA_SUCCESS {
        return 0;
    }
    nodes.truncate(got);
    *budget -= nodes.len();
    let mut total = 0u64;
    for node in nodes {
        let mut kind = -1;
        // SAFETY: a node handle from the driver and an output it fills.
        if unsafe { get_type(node, &mut kind) } != CUDA_SUCCESS {
            continue;
        }
        let blocks = match kind {
            CU_GRAPH_NODE_TYPE_KERNEL => kernel_blocks(node),
            CU_GRAPH_NODE_TYPE_GRAPH => {
                // SAFETY: the cuda.h signature.
                let Some(get_child) =
                    (unsafe { slots::CU_GRAPH_CHILD_GRAPH_NODE_GET_GRAPH.get::<GetChild>() })
                else {
                    continue;
                };
                let mut child = std::ptr::null_mut();
                // SAFETY: a child graph node and an output the driver fills.
                if unsafe { get_child(node, &mut child) } != CUDA_SUCCESS {
                    continue;
                }
                graph_blocks(child, depth + 1, budget)
            }
            _ => 0,
        };
        total = total.saturating_add(blocks);
    }
    total
}

/// The head of `CUDA_KERNEL_NODE_PARAMS`, alike in `_v2`: the function, then the grid.
#[repr(C)]
struct KernelNodeParamsHead {
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
    crate::hooks::blocks(head.grid_dim_x, head.grid_dim_y, head.grid_dim_z)
}

/// A graph instantiated into `*exec` from `graph`: its cost is kept.
macro_rules! instantiate_hook {
    ($name:ident, $slot:ident, ($($arg:ident: $ty:ty),*)) => {
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
            // SAFETY: forwarding the caller's arguments to the real entry point.
            instantiated(unsafe { real(exec, graph, $($arg),*) }, exec, graph)
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
    (params: *mut c_void)
);
instantiate_hook!(
    cuGraphInstantiateWithParams_ptsz,
    CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ,
    (params: *mut c_void)
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
            let r = unsafe { real(exec, graph, $($arg),*) };
            if r == CUDA_SUCCESS {
                remember(exec, graph);
            }
            r
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
    if let Some(m) = lock(&COSTS).as_mut() {
        m.remove(&(exec as usize));
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real(exec) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_unknown_graph_costs_one_block() {
        assert_eq!(super::cost(0x1234 as super::CUgraphExec), 1);
    }
}
