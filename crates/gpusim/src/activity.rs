//! How a busy training node's figures move from one second to the next.
//!
//! Without an [`Activity`], a GPU training a fixed model at a fixed batch settles: utilization,
//! power and clock become flat lines, which no real node shows. A real step is a mix of kernels
//! whose power draw differs (attention, GEMMs, all-reduce, the optimizer), the loader stalls
//! now and then (a slow shard, a page-cache miss), and every few minutes the job evaluates or
//! writes a checkpoint while the GPU mostly waits. An `Activity` adds those three to a GPU's
//! physics, so that what follows from them follows: under a power cap the clock drops when the
//! kernels draw more, temperature trails power, PCIe traffic follows samples/s.
//!
//! Opt-in (a scenario's `[activity]`), so the tuner's and the tests' figures stay those of the
//! steady model.

use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::rng::SplitMix64;

/// Longest loader stall, seconds; each stall lasts uniformly from [`STALL_MIN_S`] to this.
const STALL_MAX_S: f64 = 3.0;
const STALL_MIN_S: f64 = 1.0;
/// In a stall the GPU waits for data this share of the time, drawn uniformly per stall: the
/// loader falls behind, it does not stop (what a 1 s utilization sample shows).
const STALL_IDLE: (f64, f64) = (0.2, 0.7);
/// Between kernels (launch gaps, synchronisation) the GPU idles up to this share of any step:
/// a busy GPU reads 96–100%, not a flat 100.
const GAPS_MAX: f64 = 0.04;
/// A stall or evaluation never leaves the GPU less than this busy within a step (the job's
/// own bookkeeping kernels keep running).
const MIN_BUSY: f64 = 0.05;

/// What moves, and how much. All rates are per simulated second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Activity {
    /// Spread of the kernels' power intensity around the model's mean: the standard deviation
    /// of a relative, mean-reverting (Ornstein–Uhlenbeck) factor. 0 keeps it steady.
    pub intensity_sigma: f64,
    /// How long that factor stays high or low, seconds (its correlation time).
    pub intensity_tau_s: f64,
    /// Loader stalls per minute, each 1–3 s with the GPU waiting for data 20–70% of the time.
    pub stalls_per_min: f64,
    /// An evaluation or checkpoint every this many seconds (0: never) ...
    pub eval_every_s: f64,
    /// ... lasting this long ...
    pub eval_s: f64,
    /// ... during which the GPU is busy this fraction of the time.
    pub eval_busy: f64,
}

impl Default for Activity {
    /// A busy node: ±6% kernel power over a few seconds, two loader stalls a minute, a
    /// 12-second evaluation every five minutes at a third of the load.
    fn default() -> Activity {
        Activity {
            intensity_sigma: 0.06,
            intensity_tau_s: 3.0,
            stalls_per_min: 2.0,
            eval_every_s: 300.0,
            eval_s: 12.0,
            eval_busy: 0.35,
        }
    }
}

impl Activity {
    /// Refuses values no node shows: negative or non-finite spreads and rates, an evaluation
    /// longer than its period, a busy fraction outside 0..=1.
    pub fn validate(&self) -> Result<(), SimError> {
        let check = |what: &'static str, value: f64, min: f64, max: f64| {
            if value.is_finite() && (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(SimError::OutOfRange {
                    what,
                    value,
                    min,
                    max,
                })
            }
        };
        check("activity intensity_sigma", self.intensity_sigma, 0.0, 0.5)?;
        check(
            "activity intensity_tau_s",
            self.intensity_tau_s,
            0.01,
            3600.0,
        )?;
        check("activity stalls_per_min", self.stalls_per_min, 0.0, 600.0)?;
        check("activity eval_every_s", self.eval_every_s, 0.0, 86_400.0)?;
        let longest = if self.eval_every_s > 0.0 {
            self.eval_every_s
        } else {
            86_400.0
        };
        check("activity eval_s", self.eval_s, 0.0, longest)?;
        check("activity eval_busy", self.eval_busy, 0.0, 1.0)
    }
}

/// What the activity asks of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Drive {
    /// Multiplies the model's power intensity.
    pub intensity: f64,
    /// Share of the step the GPU waits (stall or evaluation), 0..1.
    pub idle: f64,
}

impl Drive {
    pub const STEADY: Drive = Drive {
        intensity: 1.0,
        idle: 0.0,
    };
}

/// An activity and where it is: the intensity factor, the stall under way, the clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ActivityState {
    pattern: Activity,
    /// The relative intensity deviation, mean 0, standard deviation `intensity_sigma`.
    level: f64,
    /// Seconds of the current loader stall still to come, and its idle share.
    stall_left_s: f64,
    #[serde(default)]
    stall_idle: f64,
    /// Seconds this GPU has run with the activity (evaluations are on this clock, which every
    /// GPU of a node shares, so a data-parallel job evaluates on all GPUs at once).
    t_s: f64,
}

impl ActivityState {
    pub fn new(pattern: Activity) -> ActivityState {
        ActivityState {
            pattern,
            level: 0.0,
            stall_left_s: 0.0,
            stall_idle: 0.0,
            t_s: 0.0,
        }
    }

    pub fn pattern(&self) -> &Activity {
        &self.pattern
    }

    /// Moves the activity on by `dt_s` and says what this step does.
    pub fn step(&mut self, dt_s: f64, rng: &mut SplitMix64) -> Drive {
        let p = &self.pattern;
        // Exact Ornstein–Uhlenbeck update; the sum of three uniforms on [-1, 1) has variance 1
        // and is close enough to normal for a load pattern.
        let a = (-dt_s / p.intensity_tau_s).exp();
        let z = rng.next_signed() + rng.next_signed() + rng.next_signed();
        self.level = a * self.level + p.intensity_sigma * (1.0 - a * a).sqrt() * z;

        if self.stall_left_s <= 0.0 && rng.next_f64() < p.stalls_per_min * dt_s / 60.0 {
            self.stall_left_s = STALL_MIN_S + (STALL_MAX_S - STALL_MIN_S) * rng.next_f64();
            self.stall_idle = STALL_IDLE.0 + (STALL_IDLE.1 - STALL_IDLE.0) * rng.next_f64();
        }
        let mut idle = if p.intensity_sigma > 0.0 {
            GAPS_MAX * rng.next_f64()
        } else {
            0.0
        };
        if self.stall_left_s > 0.0 {
            idle = idle.max(self.stall_idle * (self.stall_left_s / dt_s).min(1.0));
            self.stall_left_s = (self.stall_left_s - dt_s).max(0.0);
        }
        if p.eval_every_s > 0.0 && self.t_s % p.eval_every_s >= p.eval_every_s - p.eval_s {
            idle = idle.max(1.0 - p.eval_busy);
        }
        self.t_s += dt_s;
        Drive {
            intensity: (1.0 + self.level).max(0.5),
            idle: idle.min(1.0 - MIN_BUSY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pattern: Activity, seconds: f64, dt: f64) -> Vec<Drive> {
        let mut s = ActivityState::new(pattern);
        let mut rng = SplitMix64::new(7);
        (0..(seconds / dt).round() as usize)
            .map(|_| s.step(dt, &mut rng))
            .collect()
    }

    #[test]
    fn intensity_spreads_as_configured_around_one() {
        let drives = run(Activity::default(), 3600.0, 0.1);
        let n = drives.len() as f64;
        let mean = drives.iter().map(|d| d.intensity).sum::<f64>() / n;
        let var = drives
            .iter()
            .map(|d| (d.intensity - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
        assert!((var.sqrt() - 0.06).abs() < 0.015, "sd {}", var.sqrt());
    }

    #[test]
    fn stalls_and_evaluations_idle_the_gpu_for_their_share_of_time() {
        let p = Activity {
            intensity_sigma: 0.0,
            ..Activity::default()
        };
        let drives = run(p, 3000.0, 0.1);
        let idle_steps = drives.iter().filter(|d| d.idle > 0.0).count() as f64;
        assert!(
            drives.iter().any(|d| d.idle == 0.0),
            "no gaps without intensity noise"
        );
        // Evaluations: 12 s of every 300 s (4%); stalls: 2 a minute of 2 s on average
        // (6.7%). Together about 10.5% of steps.
        let share = idle_steps / drives.len() as f64;
        assert!((0.08..0.13).contains(&share), "idle share {share}");
        // During an evaluation the GPU is busy `eval_busy` of the time (or less in a stall).
        let last_eval = &drives[(3000.0 / 0.1) as usize - 1];
        assert!(last_eval.idle >= 0.65 - 1e-9, "{last_eval:?}");
        assert!(drives.iter().all(|d| d.idle <= 1.0 - MIN_BUSY));
    }

    #[test]
    fn a_quiet_activity_is_steady() {
        let p = Activity {
            intensity_sigma: 0.0,
            stalls_per_min: 0.0,
            eval_every_s: 0.0,
            ..Activity::default()
        };
        assert!(run(p, 60.0, 0.1).iter().all(|d| *d == Drive::STEADY));
    }

    #[test]
    fn impossible_patterns_are_refused() {
        let bad = [
            Activity {
                intensity_sigma: -0.1,
                ..Activity::default()
            },
            Activity {
                intensity_tau_s: f64::NAN,
                ..Activity::default()
            },
            Activity {
                eval_s: 400.0,
                ..Activity::default()
            },
            Activity {
                eval_busy: 1.5,
                ..Activity::default()
            },
        ];
        for a in bad {
            assert!(a.validate().is_err(), "{a:?}");
        }
        assert!(Activity::default().validate().is_ok());
    }
}
