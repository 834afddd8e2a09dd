//! What each instantiated graph costs a launch: its kernels' blocks and the graph memory it maps
//! (see `graph`). `graph`'s hooks keep it, the launch hooks and `pool` read it; the fork handlers
//! hold its lock, so it sits below them all.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::cuda::{CUdevice, CUgraphExec, CUgraphNode};
use crate::lock;

/// Instantiated graphs whose cost is kept; past it one is forgotten for each new one.
const MAX_EXECS: usize = 1 << 16;
/// Devices a graph's memory is counted on (an allocation node names one the driver knows).
const MAX_DEVICES: usize = 64;
/// A graph's top-level kernel and child graph nodes whose blocks are kept, for a later change of
/// one node's parameters; a change to a node past them is charged without taking its old blocks
/// off.
pub(crate) const MAX_KEPT_NODES: usize = 1024;

/// What a launch of an instantiated graph takes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Cost {
    /// Its kernels' blocks.
    pub blocks: u64,
    /// The bytes its memory allocation nodes map, by device ordinal.
    pub memory: Vec<(CUdevice, u64)>,
    /// The blocks of its top-level kernel and child graph nodes, by node handle.
    pub nodes: HashMap<usize, u64>,
    /// Whether the driver holds its memory mapped: from a launch or upload until the graph
    /// memory is trimmed.
    pub mapped: bool,
}

/// What a launch or upload of a graph maps on one device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Mapping {
    pub dev: CUdevice,
    /// Its allocation nodes' bytes.
    pub bytes: u64,
    /// What of them the driver holds mapped to it already.
    pub held: u64,
    /// What every graph mapped on the device holds, by this process's count: where the driver
    /// reports less in use, graphs share pages or some were let go, and `held` cannot be relied on.
    pub all_held: u64,
}

impl Mapping {
    /// Memory a graph maps for the first time.
    pub fn new(dev: CUdevice, bytes: u64) -> Mapping {
        Mapping {
            dev,
            bytes,
            held: 0,
            all_held: 0,
        }
    }
}

impl Cost {
    /// Node `node`'s blocks are `blocks` now.
    pub fn reprice(&mut self, node: CUgraphNode, blocks: u64) {
        let old = match self.nodes.get_mut(&(node as usize)) {
            Some(old) => std::mem::replace(old, blocks),
            None => {
                if self.nodes.len() < MAX_KEPT_NODES {
                    self.nodes.insert(node as usize, blocks);
                }
                0
            }
        };
        self.blocks = self
            .blocks
            .saturating_sub(old)
            .saturating_add(blocks)
            .max(1);
    }

    pub fn allocate(&mut self, dev: CUdevice, bytes: u64) {
        if let Some((_, b)) = self.memory.iter_mut().find(|(d, _)| *d == dev) {
            *b = b.saturating_add(bytes);
        } else if self.memory.len() < MAX_DEVICES {
            self.memory.push((dev, bytes));
        }
    }
}

/// The cost of each instantiated graph, by its handle.
static COSTS: Mutex<Option<HashMap<usize, Cost>>> = Mutex::new(None);

/// Hold the costs' lock across a `fork` (see `state::register_fork_handlers`).
pub(crate) fn hold_for_fork(held: &mut Vec<Box<dyn std::any::Any>>) {
    held.push(Box::new(lock(&COSTS)));
}

/// The blocks of `exec`'s kernels (1 for a graph instantiated before any hook saw it): with the
/// graph, what names a launch of it for the core limiter's estimates.
pub(crate) fn cost(exec: CUgraphExec) -> u64 {
    lock(&COSTS)
        .as_ref()
        .and_then(|m| m.get(&(exec as usize)).map(|c| c.blocks))
        .unwrap_or(1)
}

/// What a launch or upload of `exec` maps, device by device.
pub(crate) fn mappings(exec: CUgraphExec) -> Vec<Mapping> {
    let costs = lock(&COSTS);
    let Some((m, c)) = costs
        .as_ref()
        .and_then(|m| Some((m, m.get(&(exec as usize))?)))
    else {
        return Vec::new();
    };
    let held_on = |dev: CUdevice| {
        m.values()
            .filter(|o| o.mapped)
            .flat_map(|o| o.memory.iter())
            .filter(|(d, _)| *d == dev)
            .fold(0u64, |sum, (_, b)| sum.saturating_add(*b))
    };
    c.memory
        .iter()
        .map(|&(dev, bytes)| match c.mapped {
            true => Mapping {
                dev,
                bytes,
                held: bytes,
                all_held: held_on(dev),
            },
            false => Mapping::new(dev, bytes),
        })
        .collect()
}

/// Device `dev`'s graph memory was trimmed: the driver let go of the memory of every graph not
/// running, so each graph's next launch is taken to map its memory anew.
pub(crate) fn trimmed(dev: CUdevice) {
    if let Some(m) = lock(&COSTS).as_mut() {
        for c in m.values_mut() {
            if c.memory.iter().any(|(d, _)| *d == dev) {
                c.mapped = false;
            }
        }
    }
}

/// Keep what a launch of `exec` costs.
pub(crate) fn keep(exec: CUgraphExec, cost: Cost) {
    let exec = exec as usize;
    let mut costs = lock(&COSTS);
    let m = costs.get_or_insert_with(HashMap::new);
    if m.len() >= MAX_EXECS && !m.contains_key(&exec) {
        if let Some(k) = m.keys().next().copied() {
            m.remove(&k);
        }
    }
    m.insert(exec, cost);
}

/// A launch or upload of `exec` mapped its memory: the driver holds it until a trim.
pub(crate) fn note_mapped(exec: CUgraphExec) {
    if let Some(c) = lock(&COSTS)
        .as_mut()
        .and_then(|m| m.get_mut(&(exec as usize)))
    {
        c.mapped = !c.memory.is_empty();
    }
}

/// `exec`'s node `node` takes `blocks` now.
pub(crate) fn reprice(exec: CUgraphExec, node: CUgraphNode, blocks: u64) {
    if let Some(c) = lock(&COSTS)
        .as_mut()
        .and_then(|m| m.get_mut(&(exec as usize)))
    {
        c.reprice(node, blocks);
    }
}

/// `exec` is destroyed: its cost is not kept.
pub(crate) fn forget(exec: CUgraphExec) {
    if let Some(m) = lock(&COSTS).as_mut() {
        m.remove(&(exec as usize));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_graph_costs_one_block() {
        assert_eq!(cost(0x1234 as CUgraphExec), 1);
    }

    /// A launched graph holds its memory (the driver keeps it mapped) until its device's graph
    /// memory is trimmed; what every mapped graph holds is summed for the check against the
    /// driver's count. Device 7 and these handles are this test's alone (the costs are global).
    #[test]
    fn a_mapped_graph_holds_its_memory_until_the_device_is_trimmed() {
        let (a, b) = (0xa11a_0001 as CUgraphExec, 0xa11a_0002 as CUgraphExec);
        let on7 = |bytes| Cost {
            memory: vec![(7, bytes)],
            ..Cost::default()
        };
        keep(a, on7(100));
        keep(b, on7(50));
        let launched = |exec: CUgraphExec| {
            lock(&COSTS)
                .as_mut()
                .unwrap()
                .get_mut(&(exec as usize))
                .unwrap()
                .mapped = true;
        };
        assert_eq!(mappings(a), vec![Mapping::new(7, 100)], "never launched");
        launched(a);
        let held = |held, all_held| Mapping {
            dev: 7,
            bytes: 100,
            held,
            all_held,
        };
        assert_eq!(mappings(a), vec![held(100, 100)]);
        launched(b);
        assert_eq!(mappings(a), vec![held(100, 150)]);
        trimmed(8);
        assert_eq!(mappings(a), vec![held(100, 150)], "another device's trim");
        trimmed(7);
        assert_eq!(mappings(a), vec![Mapping::new(7, 100)]);
        assert_eq!(mappings(b), vec![Mapping::new(7, 50)]);
    }

    #[test]
    fn memory_is_counted_on_a_bounded_number_of_devices() {
        let mut cost = Cost::default();
        for dev in 0..1000 {
            cost.allocate(dev, 1);
        }
        assert_eq!(cost.memory.len(), MAX_DEVICES);
    }

    #[test]
    fn the_nodes_kept_for_new_parameters_are_bounded() {
        let mut cost = Cost::default();
        for node in 1..=2 * MAX_KEPT_NODES {
            cost.reprice(node as CUgraphNode, 1);
        }
        assert_eq!(cost.nodes.len(), MAX_KEPT_NODES);
        assert_eq!(cost.blocks, 2 * MAX_KEPT_NODES as u64);
    }

    #[test]
    fn costs_are_kept_for_a_bounded_number_of_graphs() {
        // Handles far from any other test's.
        let base = 1usize << 40;
        for i in 0..MAX_EXECS + 10 {
            keep((base + i) as CUgraphExec, Cost::default());
        }
        let mut costs = lock(&COSTS);
        let m = costs.as_mut().unwrap();
        assert!(m.len() <= MAX_EXECS, "{} graphs kept", m.len());
        m.retain(|k, _| *k < base);
    }
}
