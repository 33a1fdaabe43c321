//! [`GpuControl`] over the simulator: gpusim's own setters on the node the source samples.

use super::{ClockRange, GpuControl, TempTarget};
use crate::control::{ControlError, PowerControl, PowerLimits};
use crate::telemetry::Source;
use crate::telemetry::sim::SimSource;

fn no_gpu(gpu: usize) -> ControlError {
    ControlError::NoGpu(format!("no GPU {gpu} on the simulated node"))
}

/// A simulated GPU's power limits, as NVML would give them.
pub fn limits_of(g: &gpusim::Gpu) -> PowerLimits {
    let s = g.spec();
    PowerLimits {
        current_w: g.power_limit_w(),
        enforced_w: Some(g.power_limit_w()),
        default_w: s.power_default_w,
        min_w: s.power_min_w,
        max_w: s.power_max_w,
    }
}

impl PowerControl for SimSource {
    fn gpu_count(&self) -> usize {
        Source::gpu_count(self)
    }

    fn power_limits(&self, gpu: usize) -> Result<PowerLimits, ControlError> {
        self.with_node(|node| node.gpu(gpu).map(limits_of).ok_or_else(|| no_gpu(gpu)))
    }

    fn set_power_limit_w(&self, gpu: usize, watts: f64) -> Result<(), ControlError> {
        self.with_node(|node| {
            let g = node.gpu_mut(gpu).ok_or_else(|| no_gpu(gpu))?;
            g.set_power_limit_w(watts)
                .map_err(|e| ControlError::OutOfRange(e.to_string()))
        })
    }
}

impl GpuControl for SimSource {
    fn gpu_uuid(&self, gpu: usize) -> Option<String> {
        self.sample_gpu(gpu).uuid
    }

    fn clock_range(&self, gpu: usize) -> Result<ClockRange, ControlError> {
        self.with_node(|node| {
            let s = node.gpu(gpu).ok_or_else(|| no_gpu(gpu))?.spec();
            Ok(ClockRange {
                min_mhz: s.sm_clock_min_mhz,
                max_mhz: s.sm_clock_max_mhz,
            })
        })
    }

    fn lock_clocks(&self, gpu: usize, min_mhz: u32, max_mhz: u32) -> Result<(), ControlError> {
        self.with_node(|node| {
            let g = node.gpu_mut(gpu).ok_or_else(|| no_gpu(gpu))?;
            g.set_locked_clocks(min_mhz, max_mhz)
                .map_err(|e| ControlError::OutOfRange(e.to_string()))
        })
    }

    fn reset_clocks(&self, gpu: usize) -> Result<(), ControlError> {
        self.with_node(|node| {
            node.gpu_mut(gpu)
                .ok_or_else(|| no_gpu(gpu))?
                .reset_locked_clocks();
            Ok(())
        })
    }

    fn gpu_max_temp(&self, gpu: usize) -> Result<TempTarget, ControlError> {
        if gpu >= Source::gpu_count(self) {
            return Err(no_gpu(gpu));
        }
        Err(sim_no_target())
    }

    fn set_gpu_max_temp(&self, gpu: usize, _celsius: i32) -> Result<(), ControlError> {
        self.gpu_max_temp(gpu).map(|_| ())
    }
}

/// gpusim models slowdown but not the driver's adjustable target: say what works instead.
fn sim_no_target() -> ControlError {
    ControlError::NotSupported(
        "the simulated GPUs have no adjustable driver target temperature; the thermal governor \
         (`gpupilot thermal target`) holds a temperature on any GPU"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusim::NodeConfig;

    #[test]
    fn sim_caps_and_locks_change_what_the_source_reads() {
        let src = SimSource::new(&NodeConfig::default(), 60.0)
            .unwrap()
            .with_speed(100.0);
        let l = src.power_limits(1).unwrap();
        assert_eq!((l.min_w, l.max_w, l.current_w), (200.0, 700.0, 700.0));
        src.set_power_limit_w(1, 250.0).unwrap();
        assert_eq!(src.sample_gpu(1).power_limit_w, Some(250.0));
        assert_eq!(
            src.sample_gpu(0).power_limit_w,
            Some(700.0),
            "GPU 0 untouched"
        );
        assert!(matches!(
            src.set_power_limit_w(1, 100.0),
            Err(ControlError::OutOfRange(_))
        ));
        let r = src.clock_range(0).unwrap();
        assert!(r.min_mhz < r.max_mhz);
        src.lock_clocks(0, r.min_mhz, r.min_mhz + 300).unwrap();
        // The node runs on: within a few simulated seconds the clock holds the lock.
        let mut held = false;
        for _ in 0..50 {
            let s = src.sample_gpu(0);
            if s.sm_clock_mhz.unwrap() <= r.min_mhz + 300 {
                held = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(held, "the locked clock did not hold");
        src.reset_clocks(0).unwrap();
        assert!(matches!(
            src.gpu_max_temp(0),
            Err(ControlError::NotSupported(_))
        ));
        assert!(matches!(src.power_limits(9), Err(ControlError::NoGpu(_))));
    }
}
