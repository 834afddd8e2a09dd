//! What only NVML knows (the `information` files do not have it): each GPU's memory size, to
//! refuse limits larger than a device, and its MIG devices. The driver is loaded in a child
//! process (`crishim gpu probe`), never in the daemon: a misbehaving driver library must not
//! take the daemon down.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long the probe may take (NVML initialisation is slow without persistence mode).
const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probed {
    pub uuid: String,
    pub memory: u64,
    /// Its MIG devices, where MIG mode is on.
    #[serde(default)]
    pub migs: Vec<ProbedMig>,
}

/// A MIG device: a compute instance of a GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbedMig {
    /// `MIG-…`.
    pub uuid: String,
    pub gpu_instance: u32,
    pub compute_instance: u32,
    pub memory: u64,
}

/// What the probe tells of a node: device memory by UUID (GPUs' and MIG devices'), and the MIG
/// devices, each on its GPU of `inventory` with its capability nodes.
#[derive(Debug, Default)]
pub struct NvmlView {
    pub memory: HashMap<String, u64>,
    pub migs: Vec<super::discover::Gpu>,
}

impl NvmlView {
    /// Probe through the NVML library `nvml` (in a child process).
    pub fn of(
        nvml: &Path,
        inventory: &super::discover::Inventory,
        device_root: &Path,
        proc_root: &Path,
    ) -> NvmlView {
        let found = run(nvml);
        NvmlView {
            memory: memory_by_uuid(&found),
            migs: super::discover::migs(inventory, &found, device_root, proc_root),
        }
    }
}

/// Memory sizes by UUID, GPUs' and MIG devices', from [`run`].
fn memory_by_uuid(probed: &[Probed]) -> HashMap<String, u64> {
    probed
        .iter()
        .flat_map(|p| {
            std::iter::once((p.uuid.clone(), p.memory))
                .chain(p.migs.iter().map(|m| (m.uuid.clone(), m.memory)))
        })
        .collect()
}

/// Run `crishim gpu probe NVML`; empty on any failure (logged).
pub fn run(nvml: &Path) -> Vec<Probed> {
    let Ok(exe) = std::env::current_exe() else {
        return Vec::new();
    };
    // Only the crishim binary has the probe subcommand (not, say, a test harness).
    if exe.file_name().is_none_or(|n| n != "crishim") {
        return Vec::new();
    }
    let child = std::process::Command::new(&exe)
        .args(["gpu", "probe"])
        .arg(nvml)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "running the NVML probe");
            return Vec::new();
        }
    };
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!(nvml = %nvml.display(), "NVML probe timed out; GPU memory sizes unknown");
                return Vec::new();
            }
        }
    }
    let out = match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "reading the NVML probe");
            return Vec::new();
        }
    };
    if !out.status.success() {
        tracing::warn!(status = %out.status, stderr = %String::from_utf8_lossy(&out.stderr), "NVML probe failed; GPU memory sizes unknown");
        return Vec::new();
    }
    // The child's output is bounded by what it lists: a JSON document per GPU.
    serde_json::from_slice::<Vec<Probed>>(&out.stdout).unwrap_or_default()
}

/// At most this many MIG devices per GPU are asked for (7 on today's GPUs).
const MAX_MIGS: u32 = 64;

type Ret = i32;
type Dev = *mut c_void;

#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

/// The probe itself, in the child: load NVML from `lib` and list every device's memory.
pub fn probe(lib: &Path) -> Result<Vec<Probed>, String> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = CString::new(lib.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen with a valid path; the handle stays open until the process exits.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err(format!("dlopen {}: {}", lib.display(), dlerror()));
    }
    let sym = |name: &CStr| {
        // SAFETY: dlsym on a live handle with a C string.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) };
        if p.is_null() {
            Err(format!("{} has no {name:?}", lib.display()))
        } else {
            Ok(p)
        }
    };
    // SAFETY: each symbol has the C signature from nvml.h it is transmuted to.
    unsafe {
        let init: extern "C" fn() -> Ret = std::mem::transmute(sym(c"nvmlInit_v2")?);
        let count: extern "C" fn(*mut u32) -> Ret =
            std::mem::transmute(sym(c"nvmlDeviceGetCount_v2")?);
        let by_index: extern "C" fn(u32, *mut Dev) -> Ret =
            std::mem::transmute(sym(c"nvmlDeviceGetHandleByIndex_v2")?);
        let uuid: extern "C" fn(Dev, *mut c_char, u32) -> Ret =
            std::mem::transmute(sym(c"nvmlDeviceGetUUID")?);
        let memory: extern "C" fn(Dev, *mut Memory) -> Ret =
            std::mem::transmute(sym(c"nvmlDeviceGetMemoryInfo")?);
        let check = |what: &str, r: Ret| {
            if r == 0 {
                Ok(())
            } else {
                Err(format!("{what}: NVML error {r}"))
            }
        };
        check("nvmlInit_v2", init())?;
        let mut n = 0u32;
        check("nvmlDeviceGetCount_v2", count(&mut n))?;
        let mig = MigFns::load(&sym);
        let mut out = Vec::new();
        for i in 0..n.min(MAX_GPUS) {
            let mut d: Dev = std::ptr::null_mut();
            check("nvmlDeviceGetHandleByIndex_v2", by_index(i, &mut d))?;
            let mut buf = [0 as c_char; 96];
            check(
                "nvmlDeviceGetUUID",
                uuid(d, buf.as_mut_ptr(), buf.len() as u32),
            )?;
            let mut m = Memory::default();
            check("nvmlDeviceGetMemoryInfo", memory(d, &mut m))?;
            let migs = match &mig {
                Some(f) => f.list(d, |d| {
                    let mut buf = [0 as c_char; 96];
                    let mut m = Memory::default();
                    (uuid(d, buf.as_mut_ptr(), buf.len() as u32) == 0 && memory(d, &mut m) == 0)
                        .then(|| {
                            (
                                CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned(),
                                m.total,
                            )
                        })
                }),
                None => Vec::new(),
            };
            out.push(Probed {
                uuid: CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned(),
                memory: m.total,
                migs,
            });
        }
        Ok(out)
    }
}

/// At most this many GPUs are listed.
const MAX_GPUS: u32 = 256;

/// NVML's MIG entry points, where the library has them.
struct MigFns {
    mode: extern "C" fn(Dev, *mut u32, *mut u32) -> Ret,
    max: extern "C" fn(Dev, *mut u32) -> Ret,
    by_index: extern "C" fn(Dev, u32, *mut Dev) -> Ret,
    gi: extern "C" fn(Dev, *mut u32) -> Ret,
    ci: extern "C" fn(Dev, *mut u32) -> Ret,
}

impl MigFns {
    fn load(sym: &impl Fn(&CStr) -> Result<*mut c_void, String>) -> Option<MigFns> {
        // SAFETY: each symbol has the C signature from nvml.h it is transmuted to.
        unsafe {
            Some(MigFns {
                mode: std::mem::transmute::<
                    *mut c_void,
                    extern "C" fn(Dev, *mut u32, *mut u32) -> Ret,
                >(sym(c"nvmlDeviceGetMigMode").ok()?),
                max: std::mem::transmute::<*mut c_void, extern "C" fn(Dev, *mut u32) -> Ret>(
                    sym(c"nvmlDeviceGetMaxMigDeviceCount").ok()?,
                ),
                by_index: std::mem::transmute::<
                    *mut c_void,
                    extern "C" fn(Dev, u32, *mut Dev) -> Ret,
                >(sym(c"nvmlDeviceGetMigDeviceHandleByIndex").ok()?),
                gi: std::mem::transmute::<*mut c_void, extern "C" fn(Dev, *mut u32) -> Ret>(
                    sym(c"nvmlDeviceGetGpuInstanceId").ok()?,
                ),
                ci: std::mem::transmute::<*mut c_void, extern "C" fn(Dev, *mut u32) -> Ret>(
                    sym(c"nvmlDeviceGetComputeInstanceId").ok()?,
                ),
            })
        }
    }

    /// The MIG devices of `gpu` where MIG mode is on; `describe` gives a device's (UUID,
    /// memory). A device NVML cannot describe is left out.
    fn list(&self, gpu: Dev, describe: impl Fn(Dev) -> Option<(String, u64)>) -> Vec<ProbedMig> {
        let (mut current, mut pending, mut max) = (0u32, 0u32, 0u32);
        if (self.mode)(gpu, &mut current, &mut pending) != 0 || current != 1 {
            return Vec::new();
        }
        if (self.max)(gpu, &mut max) != 0 {
            return Vec::new();
        }
        (0..max.min(MAX_MIGS))
            .filter_map(|i| {
                let mut d: Dev = std::ptr::null_mut();
                if (self.by_index)(gpu, i, &mut d) != 0 {
                    return None;
                }
                let (mut gi, mut ci) = (0u32, 0u32);
                if (self.gi)(d, &mut gi) != 0 || (self.ci)(d, &mut ci) != 0 {
                    return None;
                }
                let (uuid, memory) = describe(d)?;
                uuid.starts_with("MIG-").then_some(ProbedMig {
                    uuid,
                    gpu_instance: gi,
                    compute_instance: ci,
                    memory,
                })
            })
            .collect()
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a C string valid until the next dl* call.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            String::new()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}
