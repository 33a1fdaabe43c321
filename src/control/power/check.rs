//! Range checks made before a setter is called: a value the GPU would refuse is refused here,
//! with the range in the message, and NVML is never asked.

use super::{ClockRange, TempTarget, watts};
use crate::control::{ControlError, PowerLimits};

/// Whether `w` watts is a cap GPU `gpu` accepts (its constraints, inclusive).
pub fn check_power(gpu: usize, w: f64, limits: &PowerLimits) -> Result<(), ControlError> {
    if !w.is_finite() {
        return Err(ControlError::OutOfRange(format!(
            "{w} is not a power limit: give watts, e.g. 250"
        )));
    }
    // NVML compares integer milliwatts; so do we, so that the advertised bounds themselves pass.
    let mw = |x: f64| (x * 1000.0).round() as i64;
    if mw(w) < mw(limits.min_w) || mw(w) > mw(limits.max_w) {
        return Err(ControlError::OutOfRange(format!(
            "{} is outside GPU {gpu}'s range {}–{}",
            watts(w),
            watts(limits.min_w).trim_end_matches(" W"),
            watts(limits.max_w)
        )));
    }
    Ok(())
}

/// Whether a lock of `[min, max]` MHz fits GPU `gpu`'s supported SM clocks.
pub fn check_clocks(
    gpu: usize,
    min_mhz: u32,
    max_mhz: u32,
    range: &ClockRange,
) -> Result<(), ControlError> {
    if min_mhz > max_mhz {
        return Err(ControlError::OutOfRange(format!(
            "the lowest clock ({min_mhz} MHz) is above the highest ({max_mhz} MHz): give MIN then MAX"
        )));
    }
    for v in [min_mhz, max_mhz] {
        if v < range.min_mhz || v > range.max_mhz {
            return Err(ControlError::OutOfRange(format!(
                "{v} MHz is outside GPU {gpu}'s SM clock range {}–{} MHz",
                range.min_mhz, range.max_mhz
            )));
        }
    }
    Ok(())
}

/// Whether `c` °C is a GPU-max target gpupilot sets on GPU `gpu`.
pub fn check_gpu_max(gpu: usize, c: f64, target: &TempTarget) -> Result<(), ControlError> {
    if !c.is_finite() || c.fract() != 0.0 {
        return Err(ControlError::OutOfRange(format!(
            "{c} °C: the driver's target temperature is a whole number of degrees"
        )));
    }
    if c < target.min_c || c > target.max_c {
        return Err(ControlError::OutOfRange(format!(
            "{c:.0} °C is outside GPU {gpu}'s target range {:.0}–{:.0} °C",
            target.min_c, target.max_c
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> PowerLimits {
        PowerLimits {
            current_w: 700.0,
            enforced_w: Some(700.0),
            default_w: 700.0,
            min_w: 200.0,
            max_w: 700.0,
        }
    }

    #[test]
    fn power_range_is_inclusive_and_names_the_range() {
        let l = h100();
        assert!(check_power(1, 200.0, &l).is_ok());
        assert!(check_power(1, 700.0, &l).is_ok());
        assert!(check_power(1, 250.0, &l).is_ok());
        // A rounding hair above the bound is still the bound in milliwatts.
        assert!(check_power(1, 700.0004, &l).is_ok());
        let e = check_power(1, 150.0, &l).unwrap_err();
        assert_eq!(
            e,
            ControlError::OutOfRange("150 W is outside GPU 1's range 200–700 W".into())
        );
        let e = check_power(3, 701.0, &l).unwrap_err().to_string();
        assert_eq!(e, "701 W is outside GPU 3's range 200–700 W");
        assert!(check_power(0, f64::NAN, &l).is_err());
        assert!(check_power(0, 212.5, &l).is_ok());
        let e = check_power(0, 12.5, &l).unwrap_err().to_string();
        assert!(e.starts_with("12.5 W is outside"), "{e}");
    }

    #[test]
    fn clock_locks_fit_the_range_in_order() {
        let r = ClockRange {
            min_mhz: 345,
            max_mhz: 1980,
        };
        assert!(check_clocks(0, 345, 1980, &r).is_ok());
        assert!(check_clocks(0, 1200, 1200, &r).is_ok());
        let e = check_clocks(2, 300, 1500, &r).unwrap_err().to_string();
        assert_eq!(e, "300 MHz is outside GPU 2's SM clock range 345–1980 MHz");
        assert!(check_clocks(0, 1500, 2000, &r).is_err());
        let e = check_clocks(0, 1500, 1000, &r).unwrap_err().to_string();
        assert!(e.contains("give MIN then MAX"), "{e}");
    }

    #[test]
    fn gpu_max_is_whole_degrees_in_range() {
        let t = TempTarget {
            current_c: 87.0,
            min_c: 40.0,
            max_c: 90.0,
        };
        assert!(check_gpu_max(0, 80.0, &t).is_ok());
        assert!(check_gpu_max(0, 40.0, &t).is_ok());
        assert!(check_gpu_max(0, 90.0, &t).is_ok());
        assert!(check_gpu_max(0, 80.5, &t).is_err());
        let e = check_gpu_max(1, 95.0, &t).unwrap_err().to_string();
        assert_eq!(e, "95 °C is outside GPU 1's target range 40–90 °C");
    }
}
