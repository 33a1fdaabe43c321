//! Clocks (current, maximum, applications, supported) and the clock event ("throttle")
//! reasons gpusim raises.

use std::ffi::{c_uint, c_ulonglong};

use gpusim::throttle;

use super::*;

/// Video clock as a fraction of the SM clock (H100 SXM: 1755 of 1980 MHz at boost).
fn video_mhz(sm_mhz: u32) -> u32 {
    (f64::from(sm_mhz) * 0.886).round() as u32
}

fn current_clock(ctx: &mut Context, i: usize, clock_type: c_uint) -> Result<c_uint, nvmlReturn_t> {
    let r = ctx.reading(i);
    Ok(match clock_type {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => r.sm_clock_mhz,
        NVML_CLOCK_MEM => r.mem_clock_mhz,
        NVML_CLOCK_VIDEO => video_mhz(r.sm_clock_mhz),
        _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
    })
}

fn max_clock(ctx: &Context, i: usize, clock_type: c_uint) -> Result<c_uint, nvmlReturn_t> {
    let spec = ctx.gpu(i).spec();
    Ok(match clock_type {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => spec.sm_clock_max_mhz,
        NVML_CLOCK_MEM => spec.mem_clock_mhz,
        NVML_CLOCK_VIDEO => video_mhz(spec.sm_clock_max_mhz),
        _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
    })
}

/// Applications clocks: the setting if one was made, else the default (the boost maximum).
fn app_clock(
    ctx: &Context,
    i: usize,
    clock_type: c_uint,
    default: bool,
) -> Result<c_uint, nvmlReturn_t> {
    let set = if default {
        None
    } else {
        ctx.extra(i).app_clocks_mhz
    };
    match (set, clock_type) {
        (Some((_, graphics)), NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM) => Ok(graphics),
        (Some((mem, _)), NVML_CLOCK_MEM) => Ok(mem),
        (Some((_, graphics)), NVML_CLOCK_VIDEO) => Ok(video_mhz(graphics)),
        _ => max_clock(ctx, i, clock_type),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    type_: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetClockInfo", device, |ctx, i| {
        put(clock, current_clock(ctx, i, type_)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    type_: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMaxClockInfo", device, |ctx, i| {
        put(clock, max_clock(ctx, i, type_)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxCustomerBoostClock(
    device: nvmlDevice_t,
    clockType: c_uint,
    clockMHz: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMaxCustomerBoostClock", device, |ctx, i| {
        put(clockMHz, max_clock(ctx, i, clockType)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetApplicationsClock(
    device: nvmlDevice_t,
    clockType: c_uint,
    clockMHz: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetApplicationsClock", device, |ctx, i| {
        put(clockMHz, app_clock(ctx, i, clockType, false)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDefaultApplicationsClock(
    device: nvmlDevice_t,
    clockType: c_uint,
    clockMHz: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetDefaultApplicationsClock", device, |ctx, i| {
        put(clockMHz, app_clock(ctx, i, clockType, true)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClock(
    device: nvmlDevice_t,
    clockType: c_uint,
    clockId: c_uint,
    clockMHz: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetClock", device, |ctx, i| {
        let v = match clockId {
            NVML_CLOCK_ID_CURRENT => current_clock(ctx, i, clockType)?,
            NVML_CLOCK_ID_APP_CLOCK_TARGET => app_clock(ctx, i, clockType, false)?,
            NVML_CLOCK_ID_APP_CLOCK_DEFAULT => app_clock(ctx, i, clockType, true)?,
            NVML_CLOCK_ID_CUSTOMER_BOOST_MAX => max_clock(ctx, i, clockType)?,
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        put(clockMHz, v)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedMemoryClocks(
    device: nvmlDevice_t,
    count: *mut c_uint,
    clocksMHz: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetSupportedMemoryClocks", device, |ctx, i| {
        put_list(count, clocksMHz, vec![ctx.gpu(i).spec().mem_clock_mhz])
    })
}

/// Graphics clocks the GPU can be locked to: the range in 15 MHz steps, highest first.
pub(super) fn supported_graphics_clocks(spec: &gpusim::GpuSpec) -> Vec<c_uint> {
    let mut v: Vec<c_uint> = (0..)
        .map(|k| spec.sm_clock_max_mhz.saturating_sub(15 * k))
        .take_while(|c| *c > spec.sm_clock_min_mhz)
        .collect();
    v.push(spec.sm_clock_min_mhz);
    v
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedGraphicsClocks(
    device: nvmlDevice_t,
    memoryClockMHz: c_uint,
    count: *mut c_uint,
    clocksMHz: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetSupportedGraphicsClocks", device, |ctx, i| {
        let spec = ctx.gpu(i).spec();
        if memoryClockMHz != spec.mem_clock_mhz {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        put_list(count, clocksMHz, supported_graphics_clocks(spec))
    })
}

// ---- Clock event (throttle) reasons ----

/// Every reason gpusim can raise; the bit values are nvml.h's.
const SUPPORTED_REASONS: u64 = throttle::GPU_IDLE
    | throttle::APPLICATIONS_CLOCKS_SETTING
    | throttle::SW_POWER_CAP
    | throttle::HW_SLOWDOWN
    | throttle::SYNC_BOOST
    | throttle::SW_THERMAL_SLOWDOWN
    | throttle::HW_THERMAL_SLOWDOWN
    | throttle::HW_POWER_BRAKE_SLOWDOWN;

fn reasons(name: &str, device: nvmlDevice_t, out: *mut c_ulonglong) -> nvmlReturn_t {
    with_device(name, device, |ctx, i| {
        put(out, ctx.reading(i).throttle_reasons & SUPPORTED_REASONS)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: nvmlDevice_t,
    clocksEventReasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    reasons(
        "nvmlDeviceGetCurrentClocksEventReasons",
        device,
        clocksEventReasons,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    clocksThrottleReasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    reasons(
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        device,
        clocksThrottleReasons,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksEventReasons(
    device: nvmlDevice_t,
    supportedClocksEventReasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device(
        "nvmlDeviceGetSupportedClocksEventReasons",
        device,
        |_, _| put(supportedClocksEventReasons, SUPPORTED_REASONS),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(
    device: nvmlDevice_t,
    supportedClocksThrottleReasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device(
        "nvmlDeviceGetSupportedClocksThrottleReasons",
        device,
        |_, _| put(supportedClocksThrottleReasons, SUPPORTED_REASONS),
    )
}
