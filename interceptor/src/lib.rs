//! `libcrishim_vgpu.so`: the interceptor crishim injects into GPU containers that have a memory or
//! core limit. It hooks the CUDA driver API entry points that allocate, free and report device
//! memory (and launch kernels), keeps the container's usage in a shared accounting file, and
//! refuses allocations past the limit with `CUDA_ERROR_OUT_OF_MEMORY`.
//!
//! # How it gets between the application and the driver
//!
//! crishim injects it in one of two ways (`inject` in crishim's `[gpu]` config):
//!
//! - **preload** (the default): a generated `/etc/ld.so.preload` names this library, so the
//!   dynamic loader maps it into every dynamically linked process of the container, ahead of
//!   everything but the executable. Programs linked against `libcuda.so.1` bind the hooked names
//!   to it through the global scope. Programs (and the CUDA runtime) that `dlopen` libcuda and
//!   look symbols up on that handle would bypass a preload, so this library also defines
//!   [`dlsym`](dlsym::dlsym): for a hooked name on a specific handle it returns the hook; every
//!   other lookup is a *tail jump* into libc's `dlsym`, so `RTLD_NEXT` and `RTLD_DEFAULT` still
//!   resolve relative to the real caller.
//! - **replace**: crishim's `shared/` driver mirror has `libcuda.so.1` and `libnvidia-ml.so.1`
//!   replaced by tiny generated ELF objects whose only content is two `DT_NEEDED` entries: this
//!   library first, then the real library from the `origin/` mirror (mounted at
//!   `/usr/local/nvidia/origin/lib64`). A lookup on such a handle searches its dependencies in
//!   that order, so hooked names resolve here and every other symbol (functions and data, any
//!   driver version) resolves in the real library: no symbol list to keep up to date.
//!
//! Either way, `cuGetProcAddress` and `cuGetProcAddress_v2` are hooked: they ask the real driver,
//! then map the pointer it returns back to the hook for the same entry point (by identity, then
//! by name), so the CUDA runtime (≥ 11.3), which fetches every entry point this way, cannot go
//! around the hooks either.
//!
//! Hooks call the real functions of the library named in the config (`libcuda`, `libnvidia_ml`),
//! loaded with `dlopen` on first use; nothing happens at load time, so a preloaded copy costs
//! processes that never touch CUDA nothing.
//!
//! # Modes
//!
//! The config is `/etc/crishim/vgpu/config.json` (see [`config`]), read on the first hooked call:
//! - absent: a transparent pass-through;
//! - valid: limits enforced;
//! - unreadable or invalid: fail closed. Every hooked call returns `CUDA_ERROR_NOT_PERMITTED`
//!   and the reason is printed on stderr once.
//!
//! # Accounting
//!
//! All processes of a container share one file (see [`ledger`]): one record per process and
//! device (by UUID, so `CUDA_VISIBLE_DEVICES` reordering cannot confuse it), updated under a
//! `fcntl` lock that the kernel drops when a process dies. A record whose process is gone (or a
//! zombie, or a reused pid) is reclaimed by the next process that takes the lock.

#![allow(non_snake_case)]

/// The real CUDA function behind `$slot` as `$ty`, or return `CUDA_ERROR_NOT_FOUND` when the
/// driver lacks it. (NVML's hooks have their own, returning NVML's code.)
macro_rules! real {
    ($slot:expr, $ty:ty) => {
        // SAFETY: $ty is the C signature of the slot's symbol, as declared in cuda.h.
        match unsafe { $slot.get::<$ty>() } {
            Some(f) => f,
            None => return $crate::cuda::CUDA_ERROR_NOT_FOUND,
        }
    };
}

pub mod account;
pub mod charges;
pub mod config;
pub mod context;
pub mod costs;
pub mod cuda;
pub mod dlsym;
pub mod graph;
pub mod hooks;
pub mod ledger;
pub mod limiter;
pub mod nvml;
pub mod pool;
pub mod real;
pub mod state;
pub mod table;
pub mod timing;

/// One line on stderr, prefixed so users know who speaks.
pub(crate) fn warn(msg: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "crishim-vgpu: {msg}");
}

/// Debug output when `CRISHIM_VGPU_DEBUG` is set.
pub(crate) fn debug(msg: std::fmt::Arguments<'_>) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("CRISHIM_VGPU_DEBUG").is_some()) {
        warn(msg);
    }
}

/// The wall clock, µs since the epoch, as NVML stamps its samples.
pub(crate) fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// `Mutex::lock` that survives a poisoned lock: a panic elsewhere must not wedge CUDA calls.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
