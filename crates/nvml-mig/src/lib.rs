//! A MIG device's GPU instance id and compute instance id.
//!
//! nvml-wrapper 0.13 binds MIG mode, MIG device handles and their parent, but not
//! `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId`, without which a MIG device
//! cannot be named the way operators name it (`nvidia-smi`'s GI/CI columns, dcgm-exporter's
//! `GPU_I_ID`, `GPU:GI`). This crate is those two calls, through the library nvml-wrapper
//! already loaded, so that the console crate keeps `#![forbid(unsafe_code)]`: the only
//! `unsafe` here is the calls themselves.

#![deny(clippy::unwrap_used, clippy::panic)]

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_try};

/// The GPU instance id of a MIG device handle (NOT_SUPPORTED on a physical GPU's).
pub fn gpu_instance_id(device: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = device
        .nvml()
        .lib()
        .nvmlDeviceGetGpuInstanceId
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut id: u32 = 0;
    // SAFETY: `handle()` is a live handle of the library `sym` came from, and `id` is a valid
    // place for the one unsigned int NVML writes.
    nvml_try(unsafe { sym(device.handle(), &mut id) })?;
    Ok(id)
}

/// The compute instance id of a MIG device handle (NOT_SUPPORTED on a physical GPU's).
pub fn compute_instance_id(device: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = device
        .nvml()
        .lib()
        .nvmlDeviceGetComputeInstanceId
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut id: u32 = 0;
    // SAFETY: as in `gpu_instance_id`.
    nvml_try(unsafe { sym(device.handle(), &mut id) })?;
    Ok(id)
}
