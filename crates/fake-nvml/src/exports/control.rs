//! Setters. Each goes through `with_setter`: the scenario's NO_PERMISSION fault, then the
//! shared-node update (lock, reload, advance, apply, publish), then one line in the setter log
//! with the argument exactly as NVML received it.

use std::ffi::{c_int, c_uint};

use serde_json::json;

use super::*;

fn sim_error(_: gpusim::SimError) -> nvmlReturn_t {
    NVML_ERROR_INVALID_ARGUMENT
}

/// `limit` is in milliwatts; outside the constraints is `NVML_ERROR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPowerManagementLimit(
    device: nvmlDevice_t,
    limit: c_uint,
) -> nvmlReturn_t {
    with_setter(
        "nvmlDeviceSetPowerManagementLimit",
        device,
        json!(limit),
        |node, _, i| {
            let gpu = node.gpu_mut(i).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
            let spec = gpu.spec();
            // Compare in NVML's integer milliwatts, so the advertised bounds themselves are accepted.
            if limit < mw(spec.power_min_w) || limit > mw(spec.power_max_w) {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            let watts = (f64::from(limit) / 1000.0).clamp(spec.power_min_w, spec.power_max_w);
            gpu.set_power_limit_w(watts).map_err(sim_error)
        },
    )
}

/// Resolves the special `NVML_CLOCK_LIMIT_ID_*` values into MHz.
fn clock_limit(spec: &gpusim::GpuSpec, v: c_uint) -> c_uint {
    match v {
        NVML_CLOCK_LIMIT_ID_RANGE_START => spec.sm_clock_min_mhz,
        NVML_CLOCK_LIMIT_ID_TDP => spec.sm_clock_base_mhz,
        NVML_CLOCK_LIMIT_ID_UNLIMITED => spec.sm_clock_max_mhz,
        mhz => mhz,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetGpuLockedClocks(
    device: nvmlDevice_t,
    minGpuClockMHz: c_uint,
    maxGpuClockMHz: c_uint,
) -> nvmlReturn_t {
    with_setter(
        "nvmlDeviceSetGpuLockedClocks",
        device,
        json!([minGpuClockMHz, maxGpuClockMHz]),
        |node, _, i| {
            let gpu = node.gpu_mut(i).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
            let spec = gpu.spec();
            let (lo, hi) = (
                clock_limit(spec, minGpuClockMHz),
                clock_limit(spec, maxGpuClockMHz),
            );
            gpu.set_locked_clocks(lo, hi).map_err(sim_error)
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceResetGpuLockedClocks(device: nvmlDevice_t) -> nvmlReturn_t {
    with_setter(
        "nvmlDeviceResetGpuLockedClocks",
        device,
        serde_json::Value::Null,
        |node, _, i| {
            node.gpu_mut(i)
                .ok_or(NVML_ERROR_INVALID_ARGUMENT)?
                .reset_locked_clocks();
            Ok(())
        },
    )
}

/// Recorded and reported back by the applications-clock getters; gpusim's clock follows the
/// power cap and locked clocks only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetApplicationsClocks(
    device: nvmlDevice_t,
    memClockMHz: c_uint,
    graphicsClockMHz: c_uint,
) -> nvmlReturn_t {
    with_setter(
        "nvmlDeviceSetApplicationsClocks",
        device,
        json!([memClockMHz, graphicsClockMHz]),
        |node, extras, i| {
            let spec = node.gpu(i).ok_or(NVML_ERROR_INVALID_ARGUMENT)?.spec();
            let graphics_ok =
                (spec.sm_clock_min_mhz..=spec.sm_clock_max_mhz).contains(&graphicsClockMHz);
            if memClockMHz != spec.mem_clock_mhz || !graphics_ok {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            extras[i].app_clocks_mhz = Some((memClockMHz, graphicsClockMHz));
            Ok(())
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceResetApplicationsClocks(device: nvmlDevice_t) -> nvmlReturn_t {
    with_setter(
        "nvmlDeviceResetApplicationsClocks",
        device,
        serde_json::Value::Null,
        |_, extras, i| {
            extras[i].app_clocks_mhz = None;
            Ok(())
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPersistenceMode(
    device: nvmlDevice_t,
    mode: c_uint,
) -> nvmlReturn_t {
    with_setter(
        "nvmlDeviceSetPersistenceMode",
        device,
        json!(mode),
        |node, _, i| {
            let on = match mode {
                NVML_FEATURE_DISABLED => false,
                NVML_FEATURE_ENABLED => true,
                _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
            };
            node.gpu_mut(i)
                .ok_or(NVML_ERROR_INVALID_ARGUMENT)?
                .set_persistence(on);
            Ok(())
        },
    )
}

/// Only the GPU max operating temperature can be set (between 40 °C and the slowdown
/// threshold). It is recorded and read back; gpusim's thermal model is not changed by it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetTemperatureThreshold(
    device: nvmlDevice_t,
    thresholdType: c_uint,
    temp: *mut c_int,
) -> nvmlReturn_t {
    // Read the input before logging it; a null pointer is logged as null and refused.
    let value = if temp.is_null() {
        None
    } else {
        // SAFETY: non-null; nvml.h passes the new threshold by pointer.
        Some(unsafe { temp.read() })
    };
    with_setter(
        "nvmlDeviceSetTemperatureThreshold",
        device,
        json!([thresholdType, value]),
        |node, extras, i| {
            let c = value.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
            if thresholdType != NVML_TEMPERATURE_THRESHOLD_GPU_MAX {
                return Err(NVML_ERROR_NOT_SUPPORTED);
            }
            let slowdown = node
                .gpu(i)
                .ok_or(NVML_ERROR_INVALID_ARGUMENT)?
                .spec()
                .slowdown_c;
            if c < 40 || f64::from(c) > slowdown {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            extras[i].gpu_max_threshold_c = Some(c);
            Ok(())
        },
    )
}
