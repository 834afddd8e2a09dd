//! What the hooks that account memory share: the GPU a call is on, by UUID, and reserving bytes
//! on it in the ledger.

use crate::cuda::*;
use crate::lock;
use crate::real::{Lib, Slot};
use crate::state::Limited;

/// Not hooked; what the hooks need to know the current device.
pub mod slots {
    use super::{Lib, Slot};

    pub static CU_CTX_GET_DEVICE: Slot = Slot::new(Lib::Cuda, c"cuCtxGetDevice");
    pub static CU_DEVICE_GET_UUID: Slot = Slot::new(Lib::Cuda, c"cuDeviceGetUuid");
    pub static CU_DEVICE_GET_UUID_V2: Slot = Slot::new(Lib::Cuda, c"cuDeviceGetUuid_v2");
}

/// Which device an allocation lands on.
#[derive(Clone, Copy)]
pub(crate) enum On {
    /// The current context's.
    Current,
    Ordinal(CUdevice),
}

pub(crate) fn device_uuid(l: &Limited, on: On) -> Result<CUuuid, CUresult> {
    let dev = match on {
        On::Ordinal(d) => d,
        On::Current => {
            type F = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
            // SAFETY: cuCtxGetDevice(CUdevice *device).
            let Some(f) = (unsafe { slots::CU_CTX_GET_DEVICE.get::<F>() }) else {
                return Err(CUDA_ERROR_NOT_FOUND);
            };
            let mut d = 0;
            // SAFETY: `d` outlives the call.
            let r = unsafe { f(&mut d) };
            if r != CUDA_SUCCESS {
                return Err(r);
            }
            d
        }
    };
    if let Some(u) = lock(&l.uuids).get(&dev) {
        return Ok(*u);
    }
    type G = unsafe extern "C" fn(*mut CUuuid, CUdevice) -> CUresult;
    // SAFETY: cuDeviceGetUuid[_v2](CUuuid *uuid, CUdevice dev).
    let f = unsafe {
        slots::CU_DEVICE_GET_UUID_V2
            .get::<G>()
            .or_else(|| slots::CU_DEVICE_GET_UUID.get::<G>())
    }
    .ok_or(CUDA_ERROR_NOT_FOUND)?;
    let mut u = CUuuid::default();
    // SAFETY: `u` outlives the call.
    let r = unsafe { f(&mut u, dev) };
    if r != CUDA_SUCCESS {
        return Err(r);
    }
    // All zeros names the ledger's process records, never a GPU: account nothing to it.
    if u.bytes == crishim_proto::vgpu::ledger::PROCESS {
        return Err(CUDA_ERROR_NOT_FOUND);
    }
    lock(&l.uuids).insert(dev, u);
    Ok(u)
}

/// Add `bytes` to this process's share of `uuid` within `limit`, or the error to return:
/// `CUDA_ERROR_OUT_OF_MEMORY` past the limit, `CUDA_ERROR_NOT_PERMITTED` if accounting failed
/// (never an allocation unaccounted).
pub(crate) fn reserve(l: &Limited, uuid: &CUuuid, bytes: u64, limit: u64) -> Result<(), CUresult> {
    match lock(&l.ledger).reserve(uuid, bytes, limit) {
        Ok(true) => Ok(()),
        Ok(false) => {
            crate::debug(format_args!(
                "refusing {bytes} bytes on {}: over the {limit}-byte limit",
                format_uuid(uuid)
            ));
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
        Err(e) => {
            crate::warn(format_args!(
                "accounting failed, refusing the allocation: {e}"
            ));
            Err(CUDA_ERROR_NOT_PERMITTED)
        }
    }
}
