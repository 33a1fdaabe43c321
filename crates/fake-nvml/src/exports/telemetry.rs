//! What a GPU is doing now: utilization, memory, temperatures, fan, P-state, PCIe traffic, video
//! engines, field values. Every value comes from gpusim's reading at the current step (clocks
//! and power have their own modules).

use std::ffi::{c_int, c_uint};

use super::*;
use crate::identity;
use crate::scenario::Health;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetUtilizationRates", device, |ctx, i| {
        super::mig::no_utilization_in_mig(ctx, i)?;
        let r = ctx.reading(i);
        put(
            utilization,
            nvmlUtilization_t {
                gpu: pct(r.util_gpu_pct),
                memory: pct(r.util_mem_pct),
            },
        )
    })
}

/// (total, used) in bytes. Nothing is reserved, so v1 and v2 agree on "used" and every tool
/// shows the same number whichever symbol it reads.
fn memory(ctx: &mut Context, t: super::mig::Target) -> (u64, u64) {
    super::mig::memory_of(ctx, t)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory_: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    super::mig::with_target("nvmlDeviceGetMemoryInfo", device, |ctx, i| {
        let (total, used) = memory(ctx, i);
        put(
            memory_,
            nvmlMemory_t {
                total,
                free: total - used,
                used,
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory_: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    super::mig::with_target("nvmlDeviceGetMemoryInfo_v2", device, |ctx, i| {
        if memory_.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller sets `version` before the call, as nvml.h requires.
        let version = unsafe { (*memory_).version };
        if version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used) = memory(ctx, i);
        put(
            memory_,
            nvmlMemory_v2_t {
                version,
                total,
                reserved: 0,
                free: total - used,
                used,
            },
        )
    })
}

fn celsius(c: f64) -> c_uint {
    c.round().max(0.0) as c_uint
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensorType: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetTemperature", device, |ctx, i| {
        if sensorType != NVML_TEMPERATURE_GPU {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        put(temp, celsius(ctx.reading(i).temperature_c))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureV(
    device: nvmlDevice_t,
    temperature: *mut nvmlTemperature_v1_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetTemperatureV", device, |ctx, i| {
        if temperature.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller fills `version` and `sensorType` before the call.
        let (version, sensor) = unsafe { ((*temperature).version, (*temperature).sensorType) };
        if version != NVML_TEMPERATURE_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        if sensor != NVML_TEMPERATURE_GPU {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let t = ctx.reading(i).temperature_c.round() as c_int;
        put(
            temperature,
            nvmlTemperature_v1_t {
                version,
                sensorType: sensor,
                temperature: t,
            },
        )
    })
}

/// HBM's maximum operating temperature on the data-centre parts.
const HBM_MAX_C: c_uint = 95;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: nvmlDevice_t,
    thresholdType: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetTemperatureThreshold", device, |ctx, i| {
        let spec = ctx.gpu(i).spec();
        let value = match thresholdType {
            NVML_TEMPERATURE_THRESHOLD_SHUTDOWN => celsius(spec.shutdown_c),
            NVML_TEMPERATURE_THRESHOLD_SLOWDOWN => celsius(spec.slowdown_c),
            NVML_TEMPERATURE_THRESHOLD_MEM_MAX if identity::is_datacenter(spec) => HBM_MAX_C,
            NVML_TEMPERATURE_THRESHOLD_GPU_MAX => match ctx.extra(i).gpu_max_threshold_c {
                Some(c) => c.max(0) as c_uint,
                None => celsius(spec.gpu_max_operating_c),
            },
            // Memory max on GDDR parts, acoustic and GPS thresholds: not on these boards.
            2..=7 => return Err(NVML_ERROR_NOT_SUPPORTED),
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        put(temp, value)
    })
}

/// `nvmlMarginTemperature_v1_t`: degrees left before the slowdown threshold.
#[repr(C)]
pub struct nvmlMarginTemperature_v1_t {
    pub version: c_uint,
    pub marginTemperature: c_int,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMarginTemperature(
    device: nvmlDevice_t,
    marginTempInfo: *mut nvmlMarginTemperature_v1_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMarginTemperature", device, |ctx, i| {
        if marginTempInfo.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller sets `version` before the call.
        let version = unsafe { (*marginTempInfo).version };
        if version != struct_version::<nvmlMarginTemperature_v1_t>(1) {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let slowdown = ctx.gpu(i).spec().slowdown_c;
        let margin = (slowdown - ctx.reading(i).temperature_c).round() as c_int;
        put(
            marginTempInfo,
            nvmlMarginTemperature_v1_t {
                version,
                marginTemperature: margin,
            },
        )
    })
}

fn fan(ctx: &mut Context, i: usize, fan: c_uint, out: *mut c_uint) -> Res {
    let speed = ctx.reading(i).fan_pct.ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    if fan != 0 {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    put(out, pct(speed))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(
    device: nvmlDevice_t,
    speed: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetFanSpeed", device, |ctx, i| {
        fan(ctx, i, 0, speed)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    device: nvmlDevice_t,
    fan_: c_uint,
    speed: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetFanSpeed_v2", device, |ctx, i| {
        fan(ctx, i, fan_, speed)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    device: nvmlDevice_t,
    pState: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPerformanceState", device, |ctx, i| {
        put(pState, ctx.reading(i).pstate)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerState(
    device: nvmlDevice_t,
    pState: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPowerState", device, |ctx, i| {
        put(pState, ctx.reading(i).pstate)
    })
}

// ---- PCIe ----

/// The link trains down to generation 1 while the GPU idles (P8), as real boards do; while
/// it works, the board's best or the generation a degraded link trained at.
fn current_link_gen(ctx: &mut Context, i: usize) -> c_uint {
    if ctx.reading(i).pstate >= 8 {
        1
    } else {
        health(ctx, i)
            .pcie_link_gen
            .unwrap_or(ctx.gpu(i).spec().pcie_gen)
    }
}

/// The scenario's health figures for GPU `i`.
fn health(ctx: &Context, i: usize) -> Health {
    ctx.scenario.health.get(i).copied().unwrap_or_default()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    device: nvmlDevice_t,
    currLinkGen: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetCurrPcieLinkGeneration", device, |ctx, i| {
        put(currLinkGen, current_link_gen(ctx, i))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    device: nvmlDevice_t,
    currLinkWidth: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetCurrPcieLinkWidth", device, |ctx, i| {
        let width = health(ctx, i)
            .pcie_link_width
            .unwrap_or(ctx.gpu(i).spec().pcie_width);
        put(currLinkWidth, width)
    })
}

/// Current link speed in MT/s per lane.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieSpeed(
    device: nvmlDevice_t,
    pcieSpeed: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPcieSpeed", device, |ctx, i| {
        let speed = match current_link_gen(ctx, i) {
            1 => 2500,
            2 => 5000,
            3 => 8000,
            4 => 16000,
            5 => 32000,
            _ => 64000,
        };
        put(pcieSpeed, speed)
    })
}

/// KB/s over the last 20 ms, as NVML reports it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: nvmlDevice_t,
    counter: c_uint,
    value: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPcieThroughput", device, |ctx, i| {
        let r = ctx.reading(i);
        let kbps = match counter {
            NVML_PCIE_UTIL_TX_BYTES => r.pcie_tx_kbps,
            NVML_PCIE_UTIL_RX_BYTES => r.pcie_rx_kbps,
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        put(value, kbps.min(u64::from(u32::MAX)) as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPcieReplayCounter", device, |ctx, i| {
        put(value, replays(ctx, i))
    })
}

/// Replays since the node started: the scenario's rate over simulated time.
fn replays(ctx: &Context, i: usize) -> c_uint {
    let n = health(ctx, i).pcie_replays_per_min * ctx.sim_time_s() / 60.0;
    n.clamp(0.0, f64::from(c_uint::MAX)) as c_uint
}

/// Video engines: training uses none. `samplingPeriodUs` is the driver's usual window.
fn engine_util(utilization: *mut c_uint, period: *mut c_uint) -> Res {
    if utilization.is_null() || period.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    put(utilization, 0)?;
    put(period, 167_000)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    samplingPeriodUs: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetEncoderUtilization", device, |_, _| {
        engine_util(utilization, samplingPeriodUs)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    samplingPeriodUs: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetDecoderUtilization", device, |_, _| {
        engine_util(utilization, samplingPeriodUs)
    })
}

/// Field values this library serves (any other field answers NOT_SUPPORTED in its own slot,
/// and the call itself succeeds, which is how a driver without those counters behaves).
const NVML_FI_DEV_MEMORY_TEMP: c_uint = 82;
const NVML_FI_DEV_PCIE_REPLAY_COUNTER: c_uint = 94;
const NVML_FI_DEV_REMAPPED_COR: c_uint = 142;
const NVML_FI_DEV_REMAPPED_UNC: c_uint = 143;
const NVML_FI_DEV_REMAPPED_PENDING: c_uint = 144;
const NVML_FI_DEV_REMAPPED_FAILURE: c_uint = 145;

/// One field's value on GPU `i`, or why not. Memory temperature: data-centre (HBM) parts
/// only, and gpusim has no thermal model of its own for memory, so it reads 3 °C above the
/// die. Row remapping: data-centre parts from Ampere on (Volta retires pages instead).
fn field_value(ctx: &mut Context, i: usize, field: c_uint) -> Result<c_uint, nvmlReturn_t> {
    let spec = ctx.gpu(i).spec();
    let datacenter = identity::is_datacenter(spec);
    let remaps = datacenter && identity::architecture(spec) >= NVML_DEVICE_ARCH_AMPERE;
    let h = health(ctx, i);
    match field {
        NVML_FI_DEV_MEMORY_TEMP if datacenter => {
            Ok((ctx.reading(i).temperature_c + 3.0).round().max(0.0) as c_uint)
        }
        NVML_FI_DEV_PCIE_REPLAY_COUNTER => Ok(replays(ctx, i)),
        NVML_FI_DEV_REMAPPED_COR if remaps => {
            Ok(h.remapped_correctable.min(u64::from(c_uint::MAX)) as c_uint)
        }
        NVML_FI_DEV_REMAPPED_UNC if remaps => {
            Ok(h.remapped_uncorrectable.min(u64::from(c_uint::MAX)) as c_uint)
        }
        NVML_FI_DEV_REMAPPED_PENDING if remaps => Ok(c_uint::from(h.remap_pending)),
        NVML_FI_DEV_REMAPPED_FAILURE if remaps => Ok(c_uint::from(h.remap_failure)),
        _ => Err(NVML_ERROR_NOT_SUPPORTED),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    valuesCount: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetFieldValues", device, |ctx, i| {
        if valuesCount < 0 || (valuesCount > 0 && values.is_null()) {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        for k in 0..valuesCount as usize {
            // SAFETY: the caller passes `valuesCount` entries with `fieldId` (and `scopeId`) set.
            let (field, scope) = unsafe { ((*values.add(k)).fieldId, (*values.add(k)).scopeId) };
            if let Some(answer) = super::nvlink::field_value(ctx, i, field, scope) {
                // SAFETY: as above.
                unsafe { super::nvlink::write(values.add(k), answer, ctx.step_unix_us()) };
                continue;
            }
            let answer = field_value(ctx, i, field);
            // SAFETY: as above; each entry is written whole, in place.
            unsafe {
                let v = values.add(k);
                (*v).timestamp = 0;
                (*v).latencyUsec = 0;
                (*v).valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
                match answer {
                    Ok(x) => {
                        (*v).nvmlReturn = NVML_SUCCESS;
                        (*v).value = nvmlValue_t { ullVal: 0 };
                        (*v).value.uiVal = x;
                    }
                    Err(e) => {
                        (*v).nvmlReturn = e;
                        (*v).value = nvmlValue_t { ullVal: 0 };
                    }
                }
            }
        }
        Ok(())
    })
}
