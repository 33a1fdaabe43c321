//! Power draw, power limits and the energy counter. NVML speaks milliwatts and millijoules;
//! gpusim speaks watts — `mw()` is the only conversion.

use std::ffi::{c_uint, c_ulonglong};

use super::*;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPowerUsage", device, |ctx, i| {
        put(power, mw(ctx.reading(i).power_w))
    })
}

/// The limit in force, or 0 under a `power_limit_zero` fault, or what a `wild_readings` fault
/// says.
fn limit_mw(ctx: &mut Context, i: usize) -> c_uint {
    if HAS_FAULTS.load(Ordering::Relaxed) {
        let faults = &ctx.scenario.faults;
        if faults.power_limit_zero(i) {
            return 0;
        }
        if let Some(wild) = faults.wild_power_limit_mw(i, ctx.sim_time_s()) {
            return wild;
        }
    }
    mw(ctx.reading(i).power_limit_w)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPowerManagementLimit", device, |ctx, i| {
        put(limit, limit_mw(ctx, i))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetEnforcedPowerLimit", device, |ctx, i| {
        put(limit, limit_mw(ctx, i))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device: nvmlDevice_t,
    minLimit: *mut c_uint,
    maxLimit: *mut c_uint,
) -> nvmlReturn_t {
    with_device(
        "nvmlDeviceGetPowerManagementLimitConstraints",
        device,
        |ctx, i| {
            if minLimit.is_null() || maxLimit.is_null() {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            let spec = ctx.gpu(i).spec();
            put(minLimit, mw(spec.power_min_w))?;
            put(maxLimit, mw(spec.power_max_w))
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(
    device: nvmlDevice_t,
    defaultLimit: *mut c_uint,
) -> nvmlReturn_t {
    with_device(
        "nvmlDeviceGetPowerManagementDefaultLimit",
        device,
        |ctx, i| put(defaultLimit, mw(ctx.gpu(i).spec().power_default_w)),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetTotalEnergyConsumption", device, |ctx, i| {
        let mut mj = ctx.reading(i).energy_mj;
        if HAS_FAULTS.load(Ordering::Relaxed) {
            let t = ctx.sim_time_s();
            mj = mj.wrapping_add_signed(ctx.scenario.faults.energy_offset_mj(i, t));
        }
        put(energy, mj)
    })
}
