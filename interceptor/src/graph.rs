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
    let blocks = graph_blocks(&Driver, graph, 0, &mut { MAX_NODES });
    let mut costs = lock(&COSTS);
    let m = costs.get_or_insert_with(HashMap::new);
    if m.len() >= MAX_EXECS && !m.contains_key(&exec) {
        if let Some(k) = m.keys().next().copied() {
            m.remove(&k);
        }
    }
    m.insert(exec, blocks.max(1));
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
}

/// The blocks of every kernel node of `graph` and of the graphs its child nodes hold, reading at
/// most `budget` nodes and [`MAX_DEPTH`] levels.
fn graph_blocks(api: &impl Graphs, graph: CUgraph, depth: u32, budget: &mut usize) -> u64 {
    if depth > MAX_DEPTH || *budget == 0 {
        return 0;
    }
    let Some(nodes) = api.nodes(graph, *budget) else {
        return 0;
    };
    *budget = budget.saturating_sub(nodes.len());
    let mut total = 0u64;
    for node in nodes {
        let blocks = match api.kind(node) {
            Some(CU_GRAPH_NODE_TYPE_KERNEL) => api.kernel_blocks(node),
            Some(CU_GRAPH_NODE_TYPE_GRAPH) => api
                .child(node)
                .map_or(0, |child| graph_blocks(api, child, depth + 1, budget)),
            _ => 0,
        };
        total = total.saturating_add(blocks);
    }
    total
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
    use super::*;
    use std::cell::Cell;

    #[test]
    fn an_unknown_graph_costs_one_block() {
        assert_eq!(cost(0x1234 as CUgraphExec), 1);
    }

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
    }

    #[test]
    fn a_graph_that_holds_itself_is_read_to_a_bounded_depth() {
        let api = Hostile {
            fan_out: 2,
            child_of: |g| g,
            read: Cell::new(0),
        };
        // Each level: one kernel of 10 blocks and the same graph again.
        let blocks = graph_blocks(&api, 1 as CUgraph, 0, &mut { MAX_NODES });
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
        let blocks = graph_blocks(&api, 1 as CUgraph, 0, &mut { MAX_NODES });
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
        assert_eq!(
            graph_blocks(&api, 1 as CUgraph, 0, &mut { MAX_NODES }),
            20 * graphs
        );
    }
}
