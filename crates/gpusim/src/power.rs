//! Power model and power-cap clock solver, plus steady-state energy helpers for tuners.
//!
//! Stateless: functions of a `GpuSpec` and a load. `gpu.rs` owns the state that uses them.
//!
//! `P(f) = idle + util · (static + memory·rate(f) + intensity · K · x · v(x)²)` watts, with
//! `x = f / f_max`, `v` the core voltage relative to its floor and `K` chosen so that the
//! heaviest workload (intensity 1, util 1) at `f_max` draws `FULL_LOAD_OVER_DEFAULT ·
//! power_default_w`.

use crate::catalog::GpuSpec;
use crate::workload::{StepTiming, find_model};

/// SM clocks move in steps of this size from `sm_clock_min_mhz`, as on real parts, MHz.
pub const CLOCK_STEP_MHZ: u32 = 15;

/// Heaviest workload at max clock draws this multiple of the default power limit, so the default
/// cap binds slightly on the biggest models and not on lighter ones.
pub const FULL_LOAD_OVER_DEFAULT: f64 = 1.02;

/// Core voltage relative to the floor: flat up to the knee, then linear up to
/// `voltage_max_ratio` at max clock.
pub fn voltage_ratio(spec: &GpuSpec, clock_mhz: f64) -> f64 {
    let knee = f64::from(spec.voltage_knee_mhz);
    if clock_mhz <= knee {
        return 1.0;
    }
    let span = f64::from(spec.sm_clock_max_mhz) - knee;
    1.0 + (spec.voltage_max_ratio - 1.0) * (clock_mhz - knee) / span
}

/// `K`: dynamic power at max clock and floor voltage for intensity 1, watts.
pub fn dynamic_coefficient_w(spec: &GpuSpec) -> f64 {
    let full = FULL_LOAD_OVER_DEFAULT * spec.power_default_w;
    (full - spec.idle_w - spec.load_static_w - spec.memory_power_w) / spec.voltage_max_ratio.powi(2)
}

/// Board power, watts, at `clock_mhz` when busy a fraction `util` (0..=1) of the time on work of
/// dynamic `intensity` (0..=1) proceeding at `rate` (0..=1) of its max-clock throughput.
pub fn board_power_w(spec: &GpuSpec, clock_mhz: f64, util: f64, intensity: f64, rate: f64) -> f64 {
    let x = clock_mhz / f64::from(spec.sm_clock_max_mhz);
    let v = voltage_ratio(spec, clock_mhz);
    let dynamic = intensity * dynamic_coefficient_w(spec) * x * v * v;
    spec.idle_w + util * (spec.load_static_w + spec.memory_power_w * rate + dynamic)
}

/// The largest clock on the grid (`sm_clock_min_mhz + k·CLOCK_STEP_MHZ`) strictly below
/// `clock_mhz`, or the minimum clock.
pub fn grid_below(spec: &GpuSpec, clock_mhz: u32) -> u32 {
    let min = spec.sm_clock_min_mhz;
    if clock_mhz <= min {
        return min;
    }
    min + (clock_mhz - min - 1) / CLOCK_STEP_MHZ * CLOCK_STEP_MHZ
}

/// The largest grid clock at or below `clock_mhz`.
pub fn grid_floor(spec: &GpuSpec, clock_mhz: u32) -> u32 {
    grid_below(spec, clock_mhz + 1)
}

/// The highest clock in `[lo, hi]` (hi itself, then grid clocks below it, then lo) whose power
/// is within `cap_w`. Returns the clock and whether the cap held it below `hi`. When even `lo`
/// draws more than the cap the GPU stays at `lo` and [`duty_cycle`] meets the cap.
///
/// A linear scan rather than a bisection: when the job is data-bound, power need not rise
/// monotonically with the clock (a faster GPU waits longer for data).
pub fn cap_clock_mhz(
    spec: &GpuSpec,
    lo: u32,
    hi: u32,
    cap_w: f64,
    power_at: impl Fn(u32) -> f64,
) -> (u32, bool) {
    let mut f = hi;
    loop {
        if power_at(f) <= cap_w {
            return (f, f < hi);
        }
        if f <= lo {
            return (lo, true);
        }
        f = grid_below(spec, f).max(lo);
    }
}

/// When even the lowest clock draws `power_w` above `cap_w`, the driver gates the SM clock part
/// of the time: busy time stretches by `1/duty` while the power drawn above idle shrinks until
/// the board sits exactly at the cap. With busy power `D` above idle and `q = (cap − idle)/D`,
/// `idle + D·c·duty/(c + w·duty) = cap` gives `duty = q·c/(c − q·w)`. Returns `timing` unchanged
/// when the cap is met.
pub fn duty_cycle(idle_w: f64, power_w: f64, timing: StepTiming, cap_w: f64) -> StepTiming {
    if power_w <= cap_w || timing.util <= 0.0 {
        return timing;
    }
    let (c, w) = (timing.compute_s, timing.data_wait_s);
    let busy_w = (power_w - idle_w) / timing.util;
    let q = ((cap_w - idle_w) / busy_w).max(1e-6);
    let duty = (q * c / (c - q * w)).clamp(1e-6, 1.0);
    let compute_s = c / duty;
    StepTiming {
        compute_s,
        data_wait_s: w,
        step_s: compute_s + w,
        util: compute_s / (compute_s + w),
    }
}

/// Power at full utilization of `model` at `clock_mhz` (no data stalls), watts.
fn full_load_power_w(spec: &GpuSpec, model: &crate::ModelSpec, clock_mhz: f64) -> f64 {
    board_power_w(
        spec,
        clock_mhz,
        1.0,
        model.power_intensity,
        model.relative_rate(spec, clock_mhz),
    )
}

/// Steady-state energy and time per sample, `(joules, seconds)`, of training `model_id` with
/// `batch` on `spec` under a power cap of `cap_w`, assuming the data pipeline keeps up and no
/// thermal limit. `None` for an unknown model, a batch that does not fit, or a cap outside
/// `[power_min_w, power_max_w]`.
pub fn energy_per_sample_at_cap(
    spec: &GpuSpec,
    model_id: &str,
    batch: u32,
    cap_w: f64,
) -> Option<(f64, f64)> {
    let model = find_model(model_id)?;
    if batch == 0
        || !model.fits(spec, batch)
        || !(spec.power_min_w..=spec.power_max_w).contains(&cap_w)
    {
        return None;
    }
    let power_at = |f: u32| full_load_power_w(spec, model, f64::from(f));
    let (f, _) = cap_clock_mhz(
        spec,
        spec.sm_clock_min_mhz,
        spec.sm_clock_max_mhz,
        cap_w,
        power_at,
    );
    let compute_s = model.compute_time_s(spec, batch, f64::from(f));
    let busy = StepTiming {
        compute_s,
        data_wait_s: 0.0,
        step_s: compute_s,
        util: 1.0,
    };
    let power_w = power_at(f);
    let step_s = duty_cycle(spec.idle_w, power_w, busy, cap_w).step_s;
    let b = f64::from(batch);
    Some((power_w.min(cap_w) * step_s / b, step_s / b))
}

/// The energy-optimal power cap: scans whole watts over the settable range and returns the
/// lowest cap reaching the minimum, as `(cap_w, joules_per_sample, seconds_per_sample)`.
/// Same assumptions and `None` cases as [`energy_per_sample_at_cap`].
pub fn energy_optimal_cap_w(spec: &GpuSpec, model_id: &str, batch: u32) -> Option<(f64, f64, f64)> {
    let lo = spec.power_min_w.ceil() as u32;
    let hi = spec.power_max_w.floor() as u32;
    let mut best: Option<(f64, f64, f64)> = None;
    for cap in lo..=hi {
        let cap = f64::from(cap);
        let (j, s) = energy_per_sample_at_cap(spec, model_id, batch, cap)?;
        if best.is_none_or(|(_, bj, _)| j < bj) {
            best = Some((cap, j, s));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{CATALOG, find};
    use crate::workload::MODELS;

    #[test]
    fn voltage_is_flat_then_linear() {
        let s = find("h100").unwrap();
        assert_eq!(voltage_ratio(s, 345.0), 1.0);
        assert_eq!(voltage_ratio(s, 1425.0), 1.0);
        assert!((voltage_ratio(s, 1980.0) - 1.25).abs() < 1e-12);
        let mid = voltage_ratio(s, (1425.0 + 1980.0) / 2.0);
        assert!((mid - 1.125).abs() < 1e-12);
    }

    #[test]
    fn heaviest_load_at_max_clock_is_calibrated_to_the_default_limit() {
        for s in CATALOG {
            let p = board_power_w(s, f64::from(s.sm_clock_max_mhz), 1.0, 1.0, 1.0);
            assert!((p - 1.02 * s.power_default_w).abs() < 1e-9, "{}", s.id);
            assert_eq!(board_power_w(s, 1000.0, 0.0, 1.0, 1.0), s.idle_w);
            assert!(dynamic_coefficient_w(s) > 0.0);
        }
    }

    #[test]
    fn duty_cycling_meets_caps_below_the_lowest_clock() {
        let s = find("a100").unwrap();
        let m = crate::find_model("gpt-1.3b").unwrap();
        let f = f64::from(s.sm_clock_min_mhz);
        let p = board_power_w(s, f, 1.0, 1.0, m.relative_rate(s, f));
        assert!(p > 100.0, "premise: A100 at 210 MHz draws {p:.0} W");
        let busy = StepTiming {
            compute_s: 1.0,
            data_wait_s: 0.1,
            step_s: 1.1,
            util: 1.0 / 1.1,
        };
        let p_busy = s.idle_w + busy.util * (p - s.idle_w);
        let gated = duty_cycle(s.idle_w, p_busy, busy, 100.0);
        let p_gated = s.idle_w + gated.util * (p - s.idle_w) * (busy.compute_s / gated.compute_s);
        assert!((p_gated - 100.0).abs() < 1e-9, "{p_gated}");
        assert_eq!(gated.data_wait_s, 0.1);
        assert!(gated.compute_s > 1.0);
        assert_eq!(duty_cycle(s.idle_w, 90.0, busy, 100.0), busy);
        for s in CATALOG {
            for m in MODELS {
                if m.fits(s, 1) {
                    let (j, _) = energy_per_sample_at_cap(s, m.id, 1, s.power_min_w).unwrap();
                    let (j1, _) =
                        energy_per_sample_at_cap(s, m.id, 1, s.power_min_w + 1.0).unwrap();
                    assert!(
                        j.is_finite() && j > 0.0 && j >= j1 * 0.999,
                        "{} {}",
                        s.id,
                        m.id
                    );
                }
            }
        }
    }

    #[test]
    fn grid_steps_are_15_mhz_from_the_minimum() {
        let s = find("h100").unwrap();
        assert_eq!(grid_below(s, 1980), 1965);
        assert_eq!(grid_below(s, 1970), 1965);
        assert_eq!(grid_floor(s, 1970), 1965);
        assert_eq!(grid_floor(s, 1965), 1965);
        assert_eq!(grid_below(s, 345), 345);
        assert_eq!(grid_below(s, 100), 345);
    }

    #[test]
    fn energy_optimum_is_strictly_inside_the_cap_range() {
        for s in CATALOG {
            for model in ["resnet50", "bert-large"] {
                let batch = if model == "resnet50" { 128 } else { 8 };
                let (cap, j, _) = energy_optimal_cap_w(s, model, batch).unwrap();
                let (j_min, _) = energy_per_sample_at_cap(s, model, batch, s.power_min_w).unwrap();
                let (j_max, _) = energy_per_sample_at_cap(s, model, batch, s.power_max_w).unwrap();
                assert!(
                    cap > s.power_min_w && cap < s.power_max_w,
                    "{} {model}: {cap}",
                    s.id
                );
                // Clearly better than both ends, not a rounding artefact.
                assert!(
                    j < 0.97 * j_min && j < 0.97 * j_max,
                    "{} {model}: {j} {j_min} {j_max}",
                    s.id
                );
                // Zeus-like: optimum well below the top of the range.
                let frac = cap / s.power_max_w;
                assert!((0.4..0.86).contains(&frac), "{} {model}: {frac:.2}", s.id);
            }
        }
    }

    #[test]
    fn energy_helper_refuses_what_cannot_run() {
        let s = find("h100").unwrap();
        assert!(energy_per_sample_at_cap(s, "resnet50", 4096, 500.0).is_none());
        assert!(energy_per_sample_at_cap(s, "nope", 8, 500.0).is_none());
        assert!(energy_per_sample_at_cap(s, "resnet50", 8, 100.0).is_none());
        assert!(energy_per_sample_at_cap(s, "resnet50", 0, 500.0).is_none());
        for m in MODELS {
            assert!(
                energy_per_sample_at_cap(s, m.id, 1, 700.0).is_some(),
                "{}",
                m.id
            );
        }
    }
}
