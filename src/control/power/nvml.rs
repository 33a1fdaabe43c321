//! [`GpuControl`] over NVML. NVML speaks milliwatts (power) and whole degrees (thresholds);
//! gpupilot speaks watts and °C, converted here and nowhere else.

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureThreshold};
use nvml_wrapper::enums::device::GpuLockedClocksSetting;
use nvml_wrapper::error::NvmlError;

use super::{ClockRange, GPU_MAX_FLOOR_C, GpuControl, TempTarget, needs_root};
use crate::control::{ControlError, PowerControl, PowerLimits};
use crate::telemetry::Source;
use crate::telemetry::nvml::NvmlSource;

/// An NVML answer as a [`ControlError`] that says what to do.
fn map_err(what: &str, gpu: usize, e: NvmlError) -> ControlError {
    match e {
        NvmlError::NoPermission => needs_root(what, gpu),
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) => ControlError::NotSupported(
            format!("{what} is not supported on GPU {gpu} by this GPU or driver"),
        ),
        NvmlError::InvalidArg => ControlError::OutOfRange(format!(
            "{what} on GPU {gpu}: the driver refused the value (NVML answered INVALID_ARGUMENT)"
        )),
        NvmlError::GpuLost => ControlError::NoGpu(format!(
            "GPU {gpu} has fallen off the bus (NVML answered GPU_IS_LOST)"
        )),
        other => ControlError::Failed(format!("{what} on GPU {gpu}: NVML answered {other}")),
    }
}

/// Milliwatts as NVML reports them to watts; 0 (a driver oddity) is unknown.
fn w(mw: u32) -> Option<f64> {
    (mw > 0).then(|| f64::from(mw) / 1000.0)
}

impl NvmlSource {
    fn device(&self, what: &str, gpu: usize) -> Result<nvml_wrapper::Device<'_>, ControlError> {
        if gpu >= Source::gpu_count(self) {
            return Err(ControlError::NoGpu(format!(
                "no GPU {gpu}: this node has {} GPUs",
                Source::gpu_count(self)
            )));
        }
        self.nvml()
            .device_by_index(gpu as u32)
            .map_err(|e| map_err(what, gpu, e))
    }
}

impl PowerControl for NvmlSource {
    fn gpu_count(&self) -> usize {
        Source::gpu_count(self)
    }

    fn power_limits(&self, gpu: usize) -> Result<PowerLimits, ControlError> {
        let what = "reading the power limits";
        let dev = self.device(what, gpu)?;
        let c = dev
            .power_management_limit_constraints()
            .map_err(|e| map_err(what, gpu, e))?;
        let (min_w, max_w) = match (w(c.min_limit), w(c.max_limit)) {
            (Some(lo), Some(hi)) => (lo, hi),
            _ => {
                return Err(ControlError::NotSupported(format!(
                    "GPU {gpu} reports no power-limit range: its cap cannot be set"
                )));
            }
        };
        let default_w = dev
            .power_management_limit_default()
            .ok()
            .and_then(w)
            .unwrap_or(max_w);
        Ok(PowerLimits {
            // 0 mW is no limit anyone set: say "unknown" as 0 and let callers fall back.
            current_w: dev.power_management_limit().ok().and_then(w).unwrap_or(0.0),
            enforced_w: dev.enforced_power_limit().ok().and_then(w),
            default_w,
            min_w,
            max_w,
        })
    }

    fn set_power_limit_w(&self, gpu: usize, watts: f64) -> Result<(), ControlError> {
        let what = "setting the power limit";
        let mut dev = self.device(what, gpu)?;
        // NVML takes milliwatts.
        let mw = (watts * 1000.0).round().clamp(0.0, f64::from(u32::MAX)) as u32;
        dev.set_power_management_limit(mw)
            .map_err(|e| map_err(what, gpu, e))
    }
}

impl GpuControl for NvmlSource {
    fn gpu_uuid(&self, gpu: usize) -> Option<String> {
        self.nvml().device_by_index(gpu as u32).ok()?.uuid().ok()
    }

    fn clock_range(&self, gpu: usize) -> Result<ClockRange, ControlError> {
        let what = "reading the supported clocks";
        let dev = self.device(what, gpu)?;
        let mem = match dev.supported_memory_clocks() {
            Ok(m) if !m.is_empty() => m.into_iter().max(),
            _ => dev.max_clock_info(Clock::Memory).ok(),
        };
        let listed = mem
            .and_then(|m| dev.supported_graphics_clocks(m).ok())
            .filter(|v| !v.is_empty());
        match listed {
            Some(v) => Ok(ClockRange {
                min_mhz: *v.iter().min().expect("not empty"),
                max_mhz: *v.iter().max().expect("not empty"),
            }),
            None => Err(ControlError::NotSupported(format!(
                "GPU {gpu} lists no supported SM clocks: its clocks cannot be locked"
            ))),
        }
    }

    fn lock_clocks(&self, gpu: usize, min_mhz: u32, max_mhz: u32) -> Result<(), ControlError> {
        let what = "locking the SM clocks";
        let mut dev = self.device(what, gpu)?;
        dev.set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric {
            min_clock_mhz: min_mhz,
            max_clock_mhz: max_mhz,
        })
        .map_err(|e| map_err(what, gpu, e))
    }

    fn reset_clocks(&self, gpu: usize) -> Result<(), ControlError> {
        let what = "unlocking the SM clocks";
        let mut dev = self.device(what, gpu)?;
        dev.reset_gpu_locked_clocks()
            .map_err(|e| map_err(what, gpu, e))
    }

    fn gpu_max_temp(&self, gpu: usize) -> Result<TempTarget, ControlError> {
        let what = "reading the driver's target temperature";
        let dev = self.device(what, gpu)?;
        let current = dev
            .temperature_threshold(TemperatureThreshold::GpuMax)
            .map_err(|e| map_err(what, gpu, e))?;
        // Above the slowdown threshold a target means nothing: the hardware slows first.
        let max_c = dev
            .temperature_threshold(TemperatureThreshold::Slowdown)
            .map(f64::from)
            .unwrap_or(f64::from(current));
        Ok(TempTarget {
            current_c: f64::from(current),
            min_c: GPU_MAX_FLOOR_C.min(max_c),
            max_c,
        })
    }

    fn set_gpu_max_temp(&self, gpu: usize, celsius: i32) -> Result<(), ControlError> {
        let what = "setting the driver's target temperature";
        let dev = self.device(what, gpu)?;
        dev.set_temperature_threshold(TemperatureThreshold::GpuMax, celsius)
            .map_err(|e| map_err(what, gpu, e))
    }
}
