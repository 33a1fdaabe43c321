//! A MIG device's GPU instance id and compute instance id.
//!
//! nvml-wrapper 0.13 binds MIG mode, MIG device handles and their parent, but not
//! `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId`, without which a MIG device
//! cannot be named the way operators name it (`nvidia-smi`'s GI/CI columns, dcgm-exporter's
//! `GPU_I_ID`, `GPU:GI`). This crate is those two calls, through the library nvml-wrapper
//! already loaded, so that the console crate keeps `#![forbid(unsafe_code)]`: the only
//! `unsafe` here is the call itself.

#![deny(clippy::unwrap_used, clippy::panic)]

use std::ffi::c_uint;

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

/// Both calls' shape: a device handle in, one unsigned int out.
type IdCall = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;

/// Calls `sym` (a symbol of the library `device` came from) for `device`'s id.
fn read_id<E: ToString>(device: &Device<'_>, sym: Result<&IdCall, E>) -> Result<u32, NvmlError> {
    let sym = sym.map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut id: c_uint = 0;
    // SAFETY: `handle()` is a live handle of the library `sym` came from, and `id` is a valid
    // place for the one unsigned int NVML writes.
    nvml_try(unsafe { sym(device.handle(), &mut id) })?;
    Ok(id)
}

/// The GPU instance id of a MIG device handle (NOT_SUPPORTED on a physical GPU's).
pub fn gpu_instance_id(device: &Device<'_>) -> Result<u32, NvmlError> {
    read_id(
        device,
        device.nvml().lib().nvmlDeviceGetGpuInstanceId.as_ref(),
    )
}

/// The compute instance id of a MIG device handle (NOT_SUPPORTED on a physical GPU's).
pub fn compute_instance_id(device: &Device<'_>) -> Result<u32, NvmlError> {
    read_id(
        device,
        device.nvml().lib().nvmlDeviceGetComputeInstanceId.as_ref(),
    )
}
