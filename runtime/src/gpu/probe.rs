//! GPU memory sizes from NVML (the `information` files do not have them), to refuse limits
//! larger than a device. The driver is loaded in a child process (`crishim gpu probe`), never
//! in the daemon: a misbehaving driver library must not take the daemon down.

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
}

/// Run `crishim gpu probe NVML` and collect memory sizes by UUID; empty on any failure (logged).
pub fn memory_by_uuid(nvml: &Path) -> HashMap<String, u64> {
    let Ok(exe) = std::env::current_exe() else {
        return HashMap::new();
    };
    // Only the crishim binary has the probe subcommand (not, say, a test harness).
    if exe.file_name().is_none_or(|n| n != "crishim") {
        return HashMap::new();
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
            return HashMap::new();
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
                return HashMap::new();
            }
        }
    }
    let out = match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "reading the NVML probe");
            return HashMap::new();
        }
    };
    if !out.status.success() {
        tracing::warn!(status = %out.status, stderr = %String::from_utf8_lossy(&out.stderr), "NVML probe failed; GPU memory sizes unknown");
        return HashMap::new();
    }
    serde_json::from_slice::<Vec<Probed>>(&out.stdout)
        .map(|v| v.into_iter().map(|p| (p.uuid, p.memory)).collect())
        .unwrap_or_default()
}

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
        let mut out = Vec::new();
        for i in 0..n {
            let mut d: Dev = std::ptr::null_mut();
            check("nvmlDeviceGetHandleByIndex_v2", by_index(i, &mut d))?;
            let mut buf = [0 as c_char; 96];
            check(
                "nvmlDeviceGetUUID",
                uuid(d, buf.as_mut_ptr(), buf.len() as u32),
            )?;
            let mut m = Memory::default();
            check("nvmlDeviceGetMemoryInfo", memory(d, &mut m))?;
            out.push(Probed {
                uuid: CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned(),
                memory: m.total,
            });
        }
        Ok(out)
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
