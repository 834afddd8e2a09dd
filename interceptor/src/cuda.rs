//! The few CUDA driver API types and constants the hooks need (from `cuda.h`).

use std::ffi::c_void;

pub type CUresult = i32;
pub type CUdevice = i32;
/// `CUdeviceptr` (64-bit) and the legacy `CUdeviceptr_v1` of the un-suffixed entry points.
pub type CUdeviceptr = u64;
pub type CUdeviceptrV1 = u32;
pub type CUstream = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;

/// `cuGetProcAddress` flags.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
/// The CUDA version from which un-suffixed names mean their `_v2` (64-bit) entry points.
pub const CUDA_VERSION_V2_API: i32 = 3020;

/// `CUuuid`: 16 raw bytes.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq, Hash)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub typ: u32,
    pub id: i32,
}

pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;

/// The head of `CUmemAllocationProp`; only `location` is read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationPropHead {
    pub typ: u32,
    pub requested_handle_types: u32,
    pub location: CUmemLocation,
}

/// The head of `CUlaunchConfig`; only the grid size is read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfigHead {
    pub grid_dim_x: u32,
    pub grid_dim_y: u32,
    pub grid_dim_z: u32,
}

/// Parse `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (NVML's and crishim's form) into the raw bytes
/// `cuDeviceGetUuid` returns.
pub fn parse_uuid(s: &str) -> Option<CUuuid> {
    let hex: String = s
        .strip_prefix("GPU-")?
        .chars()
        .filter(|c| *c != '-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = CUuuid::default();
    for (i, b) in out.bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The `GPU-…` string form of raw UUID bytes.
pub fn format_uuid(u: &CUuuid) -> String {
    let h: String = u.bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_round_trip() {
        let s = "GPU-c0ffee00-0000-4000-8000-000000000001";
        let u = parse_uuid(s).unwrap();
        assert_eq!(u.bytes[0], 0xc0);
        assert_eq!(u.bytes[15], 0x01);
        assert_eq!(format_uuid(&u), s);
        assert!(parse_uuid("c0ffee00-0000-4000-8000-000000000001").is_none());
        assert!(parse_uuid("GPU-zz").is_none());
    }
}
