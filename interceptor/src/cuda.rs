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
pub type CUarray = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraphNode = *mut c_void;

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`, size_t extents).
#[repr(C)]
pub struct CudaArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: u32,
    pub num_channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
pub struct CudaArray3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub num_channels: u32,
    pub flags: u32,
}

/// The bytes an array of these extents holds at least (a 1D array has height 0, a 2D one depth
/// 0): elements × channels × the format's size. Formats this does not know count 4 bytes (the
/// widest plain ones, `FLOAT` and the 32-bit integers). The driver's padding comes on top.
pub fn array_bytes(width: usize, height: usize, depth: usize, format: u32, channels: u32) -> u64 {
    let element: u64 = match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        _ => 4,
    };
    [width, height.max(1), depth.max(1), channels.max(1) as usize]
        .iter()
        .fold(element, |n, d| n.saturating_mul(*d as u64))
}

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

/// The head of `CUlaunchConfig`, up to its stream; the grid size and the stream are read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfigHead {
    pub grid_dim_x: u32,
    pub grid_dim_y: u32,
    pub grid_dim_z: u32,
    pub block_dim_x: u32,
    pub block_dim_y: u32,
    pub block_dim_z: u32,
    pub shared_mem_bytes: u32,
    pub stream: CUstream,
}

/// Parse `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (NVML's and crishim's form; `MIG-` for a MIG
/// device) into the raw bytes `cuDeviceGetUuid` returns.
pub fn parse_uuid(s: &str) -> Option<CUuuid> {
    let hex: String = s
        .strip_prefix("GPU-")
        .or_else(|| s.strip_prefix("MIG-"))?
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
        assert_eq!(
            parse_uuid("MIG-c0ffee00-0000-4000-8000-000000000001"),
            Some(u),
            "a MIG device's UUID has the same bytes"
        );
        assert!(parse_uuid("GPU-zz").is_none());
    }
}

/// A mipmapped array's levels, each half the previous one in every extent it has (at least 1),
/// summed. At most 32 levels count (no extent halves further).
pub fn mipmapped_bytes(d: &CudaArray3dDescriptor, levels: u32) -> u64 {
    let shrink = |extent: usize, level: u32| {
        if extent == 0 {
            0
        } else {
            (extent >> level).max(1)
        }
    };
    (0..levels.min(32)).fold(0u64, |sum, l| {
        sum.saturating_add(array_bytes(
            shrink(d.width, l),
            shrink(d.height, l),
            shrink(d.depth, l),
            d.format,
            d.num_channels,
        ))
    })
}

#[cfg(test)]
mod array_tests {
    use super::{array_bytes, mipmapped_bytes, CudaArray3dDescriptor};

    #[test]
    fn mipmapped_levels_halve_each_extent() {
        let d = CudaArray3dDescriptor {
            width: 1024,
            height: 1024,
            depth: 0,
            format: 0x20,
            num_channels: 1,
            flags: 0,
        };
        let full = 1024 * 1024 * 4;
        assert_eq!(mipmapped_bytes(&d, 1), full);
        assert_eq!(mipmapped_bytes(&d, 2), full + full / 4);
        // Past 11 levels the extents stay at 1x1.
        assert_eq!(mipmapped_bytes(&d, 13) - mipmapped_bytes(&d, 12), 4);
        assert_eq!(mipmapped_bytes(&d, u32::MAX), mipmapped_bytes(&d, 32));
    }

    #[test]
    fn arrays_count_elements_channels_and_format() {
        assert_eq!(array_bytes(1024, 0, 0, 0x20, 1), 4096, "1D float");
        assert_eq!(array_bytes(1024, 256, 0, 0x01, 4), 1 << 20, "2D uchar4");
        assert_eq!(
            array_bytes(16, 16, 16, 0x10, 2),
            16 * 16 * 16 * 2 * 2,
            "3D half2"
        );
        assert_eq!(
            array_bytes(8, 8, 0, 0xb0, 1),
            8 * 8 * 4,
            "an unknown format counts 4"
        );
        assert_eq!(
            array_bytes(usize::MAX, usize::MAX, 2, 0x20, 4),
            u64::MAX,
            "saturates"
        );
    }
}
