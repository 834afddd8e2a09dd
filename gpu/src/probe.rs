//! What only NVML knows (the `information` files do not have it): each GPU's memory size, to
//! refuse limits larger than a device, and its MIG devices. The driver is loaded in a child
//! process (`crishim gpu probe`), never in the daemon: a misbehaving driver library must not
//! take the daemon down.
//!
//! What it finds is placed on `discover`'s inventory (`NvmlView`, with the MIG devices' capability
//! nodes): this module is above `discover`, which knows nothing of NVML.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::discover::{node_at, Gpu, Inventory, Mig, Node};

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
    pub migs: Vec<Gpu>,
}

impl NvmlView {
    /// Probe through the NVML library `nvml` (in a child process).
    pub fn of(
        nvml: &Path,
        inventory: &Inventory,
        device_root: &Path,
        proc_root: &Path,
    ) -> NvmlView {
        let found = run(nvml);
        NvmlView {
            memory: memory_by_uuid(&found),
            migs: migs(inventory, &found, device_root, proc_root),
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

/// `mig-minors` is the driver's short table; anything longer is not it.
const MAX_MIG_MINORS: u64 = 1 << 20;

/// `<proc_root>/driver/nvidia-caps/mig-minors`: capability name (`gpu0/gi1/ci0/access`) → the
/// minor of its `nvidia-cap<minor>` node.
fn mig_minors(proc_root: &Path) -> HashMap<String, u32> {
    use std::io::Read as _;
    let mut text = String::new();
    let path = proc_root.join("driver/nvidia-caps/mig-minors");
    if let Ok(f) = std::fs::File::open(&path) {
        let _ = f.take(MAX_MIG_MINORS).read_to_string(&mut text);
    }
    text.lines()
        .filter_map(|l| {
            let (name, minor) = l.trim().rsplit_once(' ')?;
            Some((name.trim().to_string(), minor.trim().parse().ok()?))
        })
        .collect()
}

/// The MIG devices NVML reported (`probed`), each on its GPU in `inventory`, with the two
/// capability nodes that grant it (its GPU instance's and its compute instance's `access`, as
/// the NVIDIA toolkit injects them). A device whose nodes are missing is left out, with a
/// warning: a container given it could not use it.
fn migs(
    inventory: &Inventory,
    probed: &[Probed],
    device_root: &Path,
    proc_root: &Path,
) -> Vec<Gpu> {
    let minors = mig_minors(proc_root);
    let mut out = Vec::new();
    for p in probed {
        let Some(parent) = inventory.by_uuid(&p.uuid) else {
            continue;
        };
        for m in &p.migs {
            let gi = format!("gpu{}/gi{}/access", parent.minor, m.gpu_instance);
            let ci = format!(
                "gpu{}/gi{}/ci{}/access",
                parent.minor, m.gpu_instance, m.compute_instance
            );
            let caps: Option<Vec<Node>> = [&gi, &ci]
                .iter()
                .map(|name| {
                    let minor = minors.get(*name)?;
                    let file = format!("nvidia-cap{minor}");
                    let mut node = node_at(&device_root.join("nvidia-caps").join(&file))
                        .ok()
                        .flatten()?;
                    node.container = Path::new("/dev/nvidia-caps").join(file);
                    Some(node)
                })
                .collect();
            let Some(caps) = caps else {
                tracing::warn!(mig = %m.uuid, gpu = %parent.uuid, "MIG device without its nvidia-caps nodes (run nvidia-modprobe -f /proc/driver/nvidia-caps/mig-minors); ignored");
                continue;
            };
            out.push(Gpu {
                uuid: m.uuid.clone(),
                memory: Some(m.memory),
                mig: Some(Mig {
                    parent: parent.uuid.clone(),
                    gpu_instance: m.gpu_instance,
                    compute_instance: m.compute_instance,
                    caps,
                }),
                ..parent.clone()
            });
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_minors_are_read_by_name_and_junk_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let caps = dir.path().join("driver/nvidia-caps");
        std::fs::create_dir_all(&caps).unwrap();
        std::fs::write(
            caps.join("mig-minors"),
            "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\nnonsense\ngpu1/gi2/access x\n",
        )
        .unwrap();
        let m = mig_minors(dir.path());
        assert_eq!(m.get("gpu0/gi1/access"), Some(&12));
        assert_eq!(m.get("gpu0/gi1/ci0/access"), Some(&13));
        assert_eq!(m.len(), 4, "{m:?}");
        assert!(mig_minors(&dir.path().join("none")).is_empty());
    }
}
