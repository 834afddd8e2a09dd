//! The process-wide state: the mode the config puts us in (read once, on the first hooked call),
//! the accounting ledger, and this process's live allocations.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use crate::config::{self, Config, Loaded};
use crate::cuda::CUuuid;
use crate::ledger::Ledger;
use crate::real::Lib;

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
}

static MODE: OnceLock<Mode> = OnceLock::new();

pub fn mode() -> &'static Mode {
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
        })),
    }
}

/// The real library's path from the config, if one is in force.
pub fn library_path(lib: Lib) -> Option<PathBuf> {
    match mode() {
        Mode::Limited(l) => match lib {
            Lib::Cuda => Some(l.config.libcuda.clone()),
            Lib::Nvml => l.config.libnvidia_ml.clone(),
        },
        _ => None,
    }
}

/// `Mutex::lock` that survives a poisoned lock: a panic elsewhere must not wedge CUDA calls.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
