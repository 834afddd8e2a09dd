//! The real driver libraries and libc's own `dlsym`.
//!
//! This library defines `dlsym` itself, so nothing here may call `dlsym` through a symbol
//! reference (it would land in our own definition): libc's is found once with `dlvsym`, and every
//! lookup goes through that pointer.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::state::{mode, Mode, HANDLES};

/// Which real library a hooked symbol comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    Cuda,
    Nvml,
}

/// Where the real libraries are looked for when no config names them: crishim's replace-mode
/// layout first, then its preload-mode layout, then the loader's search path.
const CUDA_CANDIDATES: &[&str] = &[
    "/usr/local/nvidia/origin/lib64/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "libcuda.so.1",
];
const NVML_CANDIDATES: &[&str] = &[
    "/usr/local/nvidia/origin/lib64/libnvidia-ml.so.1",
    "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
    "libnvidia-ml.so.1",
];

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// libc's `dlsym`, as an address (0: not looked up yet). Read by the `dlsym` trampoline.
pub(crate) static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// libc's `dlsym`. Aborts if glibc does not have one: nothing could work then.
pub(crate) fn real_dlsym() -> DlsymFn {
    let mut addr = REAL_DLSYM.load(Ordering::Acquire);
    if addr == 0 {
        addr = find_real_dlsym();
        REAL_DLSYM.store(addr, Ordering::Release);
    }
    // SAFETY: `addr` is libc's dlsym (non-zero, checked in find_real_dlsym), whose C signature
    // is DlsymFn.
    unsafe { std::mem::transmute::<usize, DlsymFn>(addr) }
}

fn find_real_dlsym() -> usize {
    // glibc 2.34 moved dlsym into libc.so.6 under a new version; older ones have only the base
    // version (which newer ones keep for compatibility).
    #[cfg(target_arch = "aarch64")]
    const BASE: &CStr = c"GLIBC_2.17";
    #[cfg(not(target_arch = "aarch64"))]
    const BASE: &CStr = c"GLIBC_2.2.5";
    // SAFETY: dlopen/dlvsym with valid C strings; RTLD_NOLOAD only returns an already loaded libc.
    unsafe {
        let mut libc_handle =
            libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if libc_handle.is_null() {
            libc_handle = libc::RTLD_NEXT;
        }
        for version in [c"GLIBC_2.34", BASE] {
            let p = libc::dlvsym(libc_handle, c"dlsym".as_ptr(), version.as_ptr());
            if !p.is_null() {
                return p as usize;
            }
        }
    }
    crate::warn(format_args!("libc's dlsym not found; aborting"));
    std::process::abort()
}

/// Look `name` up on `handle` with libc's dlsym.
pub(crate) fn lookup(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: libc's dlsym with a handle from dlopen (or a pseudo-handle) and a C string.
    unsafe { real_dlsym()(handle, name.as_ptr()) }
}

/// Whether `addr` lies in this library (so a lookup found one of our hooks, not the driver).
pub(crate) fn is_ours(addr: *const c_void) -> bool {
    object_base(addr).is_some_and(|b| Some(b) == object_base(is_ours as *const c_void))
}

fn object_base(addr: *const c_void) -> Option<usize> {
    // SAFETY: dladdr only reads loader state; `info` is plain data it fills in.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        (libc::dladdr(addr, &mut info) != 0).then_some(info.dli_fbase as usize)
    }
}

/// The library an application was seen looking hooked CUDA names up in (see `dlsym`): without a
/// config, hooks forward to that same library, never to a second copy.
static APP_CUDA: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn note_app_handle(lib: Lib, handle: *mut c_void) {
    if lib == Lib::Cuda {
        let _ = APP_CUDA.compare_exchange(0, handle as usize, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// The real library's path from the config, if one is in force.
fn library_path(lib: Lib) -> Option<PathBuf> {
    match mode() {
        Mode::Limited(l) => match lib {
            Lib::Cuda => Some(l.config.libcuda.clone()),
            Lib::Nvml => l.config.libnvidia_ml.clone(),
        },
        _ => None,
    }
}

/// The real library's handle, loading it on first use: the config's path, else the library the
/// application uses, else the candidates. A candidate that resolves to ourselves (our own
/// replace-mode forwarder) is skipped.
fn handle(lib: Lib) -> Option<*mut c_void> {
    let mut h = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    let slot = match lib {
        Lib::Cuda => &mut h.cuda,
        Lib::Nvml => &mut h.nvml,
    };
    if let Some(p) = *slot {
        return Some(p as *mut c_void);
    }
    let configured = library_path(lib);
    let found = match configured {
        Some(path) => {
            claim_soname(lib);
            open(&path)
        }
        None => {
            let app = APP_CUDA.load(Ordering::Acquire);
            if lib == Lib::Cuda && app != 0 {
                Some(app as *mut c_void)
            } else {
                let candidates = match lib {
                    Lib::Cuda => CUDA_CANDIDATES,
                    Lib::Nvml => NVML_CANDIDATES,
                };
                candidates
                    .iter()
                    .filter_map(|c| open(&PathBuf::from(c)))
                    .find(|&h| !resolves_to_us(lib, h))
            }
        }
    };
    if let Some(p) = found {
        *slot = Some(p as usize);
    }
    found
}

/// Load what the application gets when it opens the library by its soname, before the real
/// library is loaded from the configured path. The loader hands a later `dlopen` of a soname
/// the first object loaded under that name; the real library carries the same soname, so were
/// it loaded first (NVML, at the first context), an application opening `libnvidia-ml.so.1`
/// afterwards would get it instead of crishim's replace-mode forwarder, and go around the
/// hooks. The handle is kept for the life of the process.
fn claim_soname(lib: Lib) {
    let soname = match lib {
        Lib::Cuda => "libcuda.so.1",
        Lib::Nvml => "libnvidia-ml.so.1",
    };
    let _ = open(std::path::Path::new(soname));
}

fn resolves_to_us(lib: Lib, h: *mut c_void) -> bool {
    let probe = match lib {
        Lib::Cuda => c"cuInit",
        Lib::Nvml => c"nvmlInit_v2",
    };
    let p = lookup(h, probe);
    !p.is_null() && is_ours(p)
}

fn open(path: &std::path::Path) -> Option<*mut c_void> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: dlopen with a valid C string.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if h.is_null() {
        crate::debug(format_args!("dlopen {}: {}", path.display(), dlerror()));
        return None;
    }
    Some(h)
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a C string valid until the next dl* call on this thread.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            String::new()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// A real function, looked up once. 0: not yet; 1: the library lacks it.
pub struct Slot {
    pub lib: Lib,
    pub name: &'static CStr,
    addr: AtomicUsize,
}

const MISSING: usize = 1;

impl Slot {
    pub const fn new(lib: Lib, name: &'static CStr) -> Self {
        Slot {
            lib,
            name,
            addr: AtomicUsize::new(0),
        }
    }

    /// The real function's address, if the real library has it.
    pub fn addr(&self) -> Option<usize> {
        match self.addr.load(Ordering::Acquire) {
            0 => {
                let found = handle(self.lib)
                    .map(|h| lookup(h, self.name))
                    .filter(|p| !p.is_null() && !is_ours(*p))
                    .map_or(MISSING, |p| p as usize);
                self.addr.store(found, Ordering::Release);
                (found != MISSING).then_some(found)
            }
            MISSING => None,
            a => Some(a),
        }
    }

    /// The real function as `F`, an `unsafe extern "C" fn` type matching its C signature.
    ///
    /// # Safety
    /// `F` must be a function pointer type with the C signature of the symbol `self.name`.
    pub unsafe fn get<F: Copy>(&self) -> Option<F> {
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<usize>()) };
        // SAFETY: the caller guarantees F is the function pointer type of this symbol, and
        // the address is that symbol's (non-null).
        self.addr()
            .map(|a| unsafe { std::mem::transmute_copy::<usize, F>(&a) })
    }
}
