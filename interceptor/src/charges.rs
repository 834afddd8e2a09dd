//! What this process holds in the ledger beyond its plain allocations: its contexts' share (see
//! `context`) and its memory pools' and graph memory's (see `pool`). `state::Limited` keeps them
//! under its locks, which the fork handlers hold; `context` and `pool` keep them up to date.

use std::collections::HashMap;

use crate::cuda::{CUdevice, CUuuid};

/// What the ledger holds for this process's contexts, per GPU.
#[derive(Default)]
pub struct Contexts {
    pub charged: HashMap<CUuuid, u64>,
}

/// What a charge is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// A memory pool, by handle.
    Pool(usize),
    /// A device's graph memory, by ordinal.
    Graphs(CUdevice),
}

pub struct Pool {
    /// Its GPU; `None` for a pool of host memory, which is not the GPU's to limit.
    pub uuid: Option<CUuuid>,
    /// Allocated from it and not freed.
    pub live: u64,
    /// What the ledger holds for it.
    pub charged: u64,
    /// Destroyed while allocations were live: the driver is not asked about it again.
    pub destroyed: bool,
}

/// This process's pools and graph memory, and the allocations made from the pools.
#[derive(Default)]
pub struct Pools {
    pub pools: HashMap<Source, Pool>,
    /// Pointer → (pool, bytes).
    pub allocations: HashMap<u64, (usize, u64)>,
}

impl Pool {
    pub fn on(uuid: Option<CUuuid>) -> Pool {
        Pool {
            uuid,
            live: 0,
            charged: 0,
            destroyed: false,
        }
    }
}
