//! The process-wide state: the mode the config puts us in (read once, on the first hooked call),
//! the accounting ledger, this process's live allocations and the real libraries' handles; and
//! the fork handlers, which hold every lock of ours across a `fork`, so the modules that own one
//! (`limiter`, `costs`) sit below this one.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Mutex, Once, OnceLock};

use crate::charges::{Contexts, Pools};
use crate::config::{self, Config, Loaded};
use crate::cuda::CUuuid;
use crate::ledger::Ledger;
use crate::lock;

pub enum Mode {
    PassThrough,
    Limited(Box<Limited>),
    Broken(String),
}

pub struct Limited {
    pub config: Config,
    pub ledger: Mutex<Ledger>,
    /// Live allocations of this process: device pointer or allocation handle → (device, bytes).
    pub allocations: Mutex<HashMap<u64, (CUuuid, u64)>>,
    /// Device ordinal → UUID, as this process numbers its devices.
    pub uuids: Mutex<HashMap<i32, CUuuid>>,
    /// What this process's contexts are charged. Taken before `pools`.
    pub contexts: Mutex<Contexts>,
    /// This process's memory pools. Taken before `allocations` and the ledger.
    pub pools: Mutex<Pools>,
}

static MODE: OnceLock<Mode> = OnceLock::new();

pub fn mode() -> &'static Mode {
    register_fork_handlers();
    MODE.get_or_init(|| {
        let mode = from_loaded(config::load(std::path::Path::new(config::CONFIG_PATH)));
        if let Mode::Broken(why) = &mode {
            crate::warn(format_args!(
                "{why}; refusing CUDA calls (fail closed) until the config is fixed"
            ));
        }
        mode
    })
}

pub fn from_loaded(loaded: Loaded) -> Mode {
    match loaded {
        Loaded::Absent => Mode::PassThrough,
        Loaded::Broken(why) => Mode::Broken(why),
        Loaded::Valid(config) => Mode::Limited(Box::new(Limited {
            ledger: Mutex::new(Ledger::new(config.accounting_file.clone())),
            config,
            allocations: Mutex::default(),
            uuids: Mutex::default(),
            contexts: Mutex::default(),
            pools: Mutex::default(),
        })),
    }
}

/// The core limit in force for `l`, percent: none at 100.
pub(crate) fn core_limit(l: &Limited) -> Option<u32> {
    l.config.core_percent.filter(|p| *p < 100)
}

/// The loaded real libraries (see `real`). Here, not in `real`, so that the fork handlers below
/// can hold the lock: `real` asks this module which library the config names.
pub(crate) struct Handles {
    pub cuda: Option<usize>,
    pub nvml: Option<usize>,
}

pub(crate) static HANDLES: Mutex<Handles> = Mutex::new(Handles {
    cuda: None,
    nvml: None,
});

thread_local! {
    /// The locks the forking thread holds from `fork`'s prepare handler to its parent and child
    /// handlers (see [`register_fork_handlers`]).
    static HELD_ACROSS_FORK: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// Take every lock of ours before `fork`, and release them on both sides after it, so that a
/// child never starts with a lock some other thread held (that thread does not exist in the
/// child, and the lock would never be released). The ledger's file lock needs nothing: `fcntl`
/// locks are not inherited, and the child's ledger opens the file again (its pid differs).
fn register_fork_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handlers are plain functions that live as long as the library.
        unsafe {
            libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork_child));
        }
    });
}

extern "C" fn before_fork() {
    let mut held: Vec<Box<dyn Any>> = Vec::new();
    // In the order the hooks nest them: contexts, pools, allocations, the ledger.
    if let Some(Mode::Limited(l)) = MODE.get() {
        held.push(Box::new(lock(&l.contexts)));
        held.push(Box::new(lock(&l.pools)));
        held.push(Box::new(lock(&l.allocations)));
        held.push(Box::new(lock(&l.ledger)));
        held.push(Box::new(lock(&l.uuids)));
    }
    crate::timing::hold_for_fork(&mut held);
    held.push(Box::new(lock(&HANDLES)));
    crate::costs::hold_for_fork(&mut held);
    HELD_ACROSS_FORK.with(|h| *h.borrow_mut() = held);
}

extern "C" fn after_fork_child() {
    after_fork();
    crate::limiter::forget_throttled();
}

extern "C" fn after_fork() {
    // Dropping the guards unlocks them: in the parent, and in the child's copy.
    let held = HELD_ACROSS_FORK.with(|h| std::mem::take(&mut *h.borrow_mut()));
    drop(held);
}
