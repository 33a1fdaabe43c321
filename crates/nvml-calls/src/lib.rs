//! NVML device calls that nvml-wrapper 0.13 does not bind, each a device handle in and one
//! unsigned int out, made through the library nvml-wrapper already loaded so that the console
//! crate keeps `#![forbid(unsafe_code)]`: the only `unsafe` here is the call itself.
//!
//! - A MIG device's GPU instance id and compute instance id (`nvmlDeviceGetGpuInstanceId`,
//!   `nvmlDeviceGetComputeInstanceId`), without which a MIG device cannot be named the way
//!   operators name it (`nvidia-smi`'s GI/CI columns, dcgm-exporter's `GPU_I_ID`, `GPU:GI`).
//! - The first fan's speed through `nvmlDeviceGetFanSpeed`, the call before `_v2`: nvml-wrapper
//!   reads fans only through `nvmlDeviceGetFanSpeed_v2`, which some drivers' libraries lack or
//!   answer NOT_SUPPORTED while they answer this one (nvidia-smi, nvtop and gpustat show it).

#![deny(clippy::unwrap_used, clippy::panic)]

use std::ffi::c_uint;

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

/// Every call's shape here: a device handle in, one unsigned int out.
type UintCall = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;

/// Calls `sym` (a symbol of the library `device` came from) for `device`'s number.
fn read_uint<E: ToString>(
    device: &Device<'_>,
    sym: Result<&UintCall, E>,
) -> Result<u32, NvmlError> {
    let sym = sym.map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut out: c_uint = 0;
    // SAFETY: `handle()` is a live handle of the library `sym` came from, and `out` is a valid
    // place for the one unsigned int NVML writes.
    nvml_try(unsafe { sym(device.handle(), &mut out) })?;
    Ok(out)
}

/// The GPU instance id of a MIG device handle (NOT_SUPPORTED on a physical GPU's).
pub fn gpu_instance_id(device: &Device<'_>) -> Result<u32, NvmlError> {
    read_uint(
        device,
        device.nvml().lib().nvmlDeviceGetGpuInstanceId.as_ref(),
    )
}

/// The compute instance id of a MIG device handle (NOT_SUPPORTED on a physical GPU's).
pub fn compute_instance_id(device: &Device<'_>) -> Result<u32, NvmlError> {
    read_uint(
        device,
        device.nvml().lib().nvmlDeviceGetComputeInstanceId.as_ref(),
    )
}

/// The first fan's intended speed, percent of its maximum, through `nvmlDeviceGetFanSpeed`
/// (NOT_SUPPORTED on a board without a fan; `FailedToLoadSymbol` from a library without it).
pub fn fan_speed_v1(device: &Device<'_>) -> Result<u32, NvmlError> {
    read_uint(device, device.nvml().lib().nvmlDeviceGetFanSpeed.as_ref())
}
