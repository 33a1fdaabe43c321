//! The thermal governor: holds one GPU at a target temperature by moving its power cap.
//!
//! A PI controller in velocity form: each decision moves the cap by
//! `Δcap = −(kp·Δerror + ki·error·dt)`, where `error = temperature − target + lead·trend` (the
//! trend is the temperature's slope, filtered, so a GPU heating fast is cut before it crosses
//! its target rather than after). The velocity form carries no integral state of its own (the
//! cap *is* the integral), so a cap pinned at a bound cannot wind up: the next decision starts
//! from the clamped cap. A step never goes against the error's sign (a GPU above its target
//! never gets more watts). On top of that:
//!
//! - a hysteresis band: within `band_c` of the target nothing moves, so a GPU sitting at its
//!   target is not nudged every sample;
//! - bounded steps: no decision moves the cap by more than `max_step_frac` of the GPU's cap range;
//! - limits: the cap never leaves `[min_w, min(max_w, user cap)]` (the user's cap is a ceiling
//!   the governor never raises above);
//! - a cap far above the draw does not limit anything, so cutting it would change nothing: when
//!   too hot, the cut starts from the power actually drawn;
//! - stale telemetry (the sampler says stale, the GPU is lost, no temperature, or a sample older
//!   than `stale_after_s`): it holds the cap where it is and says so, every time;
//! - implausible limits (a limit read as 0 W, NaN, outside its range, a range upside down:
//!   [`super::limits_problem`]): it moves nothing ([`Mode::Refused`]) and says why.
//!
//! Gains are set per GPU from its cap range, so one setting suits a 300 W V100 and a 700 W H100:
//! `kp = kp_frac_per_c · (max_w − min_w)` watts per °C, `ki = kp / ti_s`.
//!
//! Pure: no clock, no GPU, no I/O. The caller feeds [`GovernorInput`]s and applies the
//! [`Decision`]s (the daemon's control loop; tests on a gpusim node in simulated time).

use serde::{Deserialize, Serialize};

/// What temperature to hold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Degrees Celsius.
    Celsius(f64),
    /// Degrees below the GPU's slowdown threshold.
    BelowSlowdown(f64),
}

impl Target {
    /// The absolute target for a GPU whose slowdown threshold is `slowdown_c` (None: unknown,
    /// and a margin cannot be resolved).
    pub fn resolve(self, slowdown_c: Option<f64>) -> Option<f64> {
        match self {
            Target::Celsius(c) => Some(c),
            Target::BelowSlowdown(m) => slowdown_c.map(|s| s - m),
        }
    }

    /// `78 °C` or `8 °C below slowdown`.
    pub fn describe(self) -> String {
        match self {
            Target::Celsius(c) => format!("{c:.0} °C"),
            Target::BelowSlowdown(m) => format!("{m:.0} °C below slowdown"),
        }
    }
}

impl From<crate::profile::ThermalTarget> for Target {
    fn from(t: crate::profile::ThermalTarget) -> Target {
        match t {
            crate::profile::ThermalTarget::Celsius(c) => Target::Celsius(c),
            crate::profile::ThermalTarget::BelowSlowdown(m) => Target::BelowSlowdown(m),
        }
    }
}

/// The controller's tuning. The defaults are what the daemon uses (and the tests check).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GovernorConfig {
    /// Proportional gain as a fraction of the cap range per °C.
    pub kp_frac_per_c: f64,
    /// Integral time, seconds (`ki = kp / ti_s`).
    pub ti_s: f64,
    /// No decision moves the cap by more than this fraction of the cap range.
    pub max_step_frac: f64,
    /// Within this many °C of the target the cap holds.
    pub band_c: f64,
    /// A change smaller than this (watts) is not worth a driver call.
    pub min_change_w: f64,
    /// A sample older than this (seconds, against the decision's time) is stale.
    pub stale_after_s: f64,
    /// When too hot, the cut starts from the draw plus this (watts) if the cap is above it.
    pub draw_headroom_w: f64,
    /// The controller acts on the temperature this many seconds ahead (the current one plus
    /// the filtered trend): it starts cutting before a fast-heating GPU crosses its target.
    pub lead_s: f64,
    /// Time constant of the trend filter, seconds (smooths NVML's whole-degree readings).
    pub trend_tau_s: f64,
}

impl Default for GovernorConfig {
    fn default() -> Self {
        GovernorConfig {
            kp_frac_per_c: 0.08,
            ti_s: 40.0,
            max_step_frac: 0.06,
            band_c: 0.5,
            min_change_w: 1.0,
            stale_after_s: 5.0,
            draw_headroom_w: 10.0,
            lead_s: 15.0,
            trend_tau_s: 10.0,
        }
    }
}

/// One GPU as the governor sees it at one decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GovernorInput {
    /// When the decision is made, seconds (any monotonic base, the same as `sample_time_s`).
    pub now_s: f64,
    /// When the sample was read.
    pub sample_time_s: f64,
    pub temperature_c: Option<f64>,
    pub slowdown_c: Option<f64>,
    /// The sampler marked the sample stale, or the GPU is lost.
    pub stale: bool,
    /// Power drawn now, watts.
    pub power_w: Option<f64>,
    /// The management cap set now, watts.
    pub cap_w: f64,
    pub min_w: f64,
    pub max_w: f64,
    /// The user's cap: the governor never goes above it.
    pub user_cap_w: Option<f64>,
}

/// What to do with the cap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum CapMove {
    /// Set the cap to `to_w` (from `from_w`).
    Set { from_w: f64, to_w: f64 },
    /// Leave the cap as it is.
    Hold,
}

/// Why the governor holds or moves, as a state clients show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Moving the cap toward the target.
    Tracking,
    /// Within the hysteresis band.
    Settled,
    /// Telemetry is stale: the cap is held where it is.
    Stale,
    /// At the user's cap (or the maximum) and still below target: nothing to give back.
    AtCeiling,
    /// At the minimum cap and still above target: the governor can do no more.
    AtFloor,
    /// The GPU's power limits are unknown or implausible (a limit of 0 W, NaN, outside its
    /// range): the cap is not touched until they make sense.
    Refused,
}

/// One decision, with the reason in words (`81.3 °C > target 78 °C: −20 W`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    #[serde(flatten)]
    pub action: CapMove,
    pub mode: Mode,
    pub temperature_c: Option<f64>,
    pub target_c: Option<f64>,
    pub why: String,
}

impl Decision {
    /// The new cap, when the decision moves it.
    pub fn new_cap_w(&self) -> Option<f64> {
        match self.action {
            CapMove::Set { to_w, .. } => Some(to_w),
            CapMove::Hold => None,
        }
    }
}

/// One GPU's governor. See the module doc.
#[derive(Debug, Clone, PartialEq)]
pub struct Governor {
    target: Target,
    config: GovernorConfig,
    /// Effective error, temperature and time of the last decision that used a fresh sample.
    last: Option<Last>,
    /// Filtered temperature trend, °C per second.
    trend_c_per_s: f64,
    mode: Mode,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Last {
    error: f64,
    temp: f64,
    time: f64,
}

impl Governor {
    pub fn new(target: Target, config: GovernorConfig) -> Governor {
        Governor {
            target,
            config,
            last: None,
            trend_c_per_s: 0.0,
            mode: Mode::Tracking,
        }
    }

    pub fn target(&self) -> Target {
        self.target
    }

    pub fn config(&self) -> &GovernorConfig {
        &self.config
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Decide what to do with the cap for this input.
    pub fn decide(&mut self, input: &GovernorInput) -> Decision {
        let c = self.config;
        let user_bad = input
            .user_cap_w
            .is_some_and(|u| !(u.is_finite() && u > 0.0));
        let problem = super::limits_problem(input.cap_w, input.min_w, input.max_w)
            .or_else(|| user_bad.then(|| format!("its user's cap reads {:?} W", input.user_cap_w)));
        if let Some(problem) = problem {
            // Nothing learnt from figures that make no sense: start afresh once they do.
            return self.forget(
                Mode::Refused,
                input,
                format!("{problem}: the cap is not moved until the GPU reports plausible limits"),
            );
        }
        let ceiling = input
            .user_cap_w
            .map_or(input.max_w, |u| u.min(input.max_w))
            .max(input.min_w);
        let target_c = self.target.resolve(input.slowdown_c);
        let age = input.now_s - input.sample_time_s;
        let fresh_temp = input.temperature_c.filter(|t| t.is_finite());
        let stale_why = if input.stale {
            Some("telemetry is stale".to_string())
        } else if fresh_temp.is_none() {
            Some("no temperature reading".to_string())
        } else if age > c.stale_after_s {
            Some(format!("newest sample is {age:.0} s old"))
        } else {
            None
        };
        if let Some(why) = stale_why {
            // Forget the last error: the next fresh sample starts the derivative afresh.
            let why = format!("{why}: holding the cap at {:.0} W", input.cap_w);
            return self.forget(Mode::Stale, input, why);
        }
        let temp = fresh_temp.expect("checked above");
        let Some(target) = target_c else {
            self.mode = Mode::Stale;
            return Decision {
                action: CapMove::Hold,
                mode: Mode::Stale,
                temperature_c: Some(temp),
                target_c: None,
                why: "the GPU reports no slowdown temperature to hold a margin below: \
                      holding the cap (give an absolute target instead)"
                    .into(),
            };
        };
        let range = (input.max_w - input.min_w).max(1.0);
        let kp = c.kp_frac_per_c * range;
        let ki = kp / c.ti_s.max(1e-3);
        let max_step = c.max_step_frac * range;
        let dt = match self.last {
            Some(l) => (input.now_s - l.time).clamp(0.0, 30.0),
            // First decision: one nominal second of integral.
            None => 1.0,
        };
        if let Some(l) = self.last.filter(|_| dt > 0.0) {
            let a = (-dt / c.trend_tau_s.max(1e-3)).exp();
            self.trend_c_per_s = a * self.trend_c_per_s + (1.0 - a) * (temp - l.temp) / dt;
        }
        let error = temp - target + c.lead_s * self.trend_c_per_s;
        let d_error = self.last.map_or(0.0, |l| error - l.error);
        self.last = Some(Last {
            error,
            temp,
            time: input.now_s,
        });
        let cap = input.cap_w.clamp(input.min_w, ceiling);
        // Above the ceiling (the user lowered their cap, or limits changed): come down at once.
        if input.cap_w > ceiling + c.min_change_w {
            return self.set(
                input.cap_w,
                ceiling,
                Mode::Tracking,
                temp,
                target,
                "above the ceiling",
            );
        }
        if error.abs() <= c.band_c {
            self.mode = Mode::Settled;
            return self.hold(Mode::Settled, temp, target, input.cap_w, "within the band");
        }
        let mut delta = -(kp * d_error + ki * error * dt);
        // Inside the loop's reach the sign follows the error: the P term alone may not push the
        // cap the wrong way (a falling temperature above target is no reason to raise the cap).
        if error > 0.0 {
            delta = delta.min(0.0);
        } else {
            delta = delta.max(0.0);
        }
        delta = delta.clamp(-max_step, max_step);
        let base = match input.power_w {
            Some(p) if error > 0.0 && cap > p + c.draw_headroom_w => {
                (p + c.draw_headroom_w).max(input.min_w)
            }
            _ => cap,
        };
        let new = (base + delta).clamp(input.min_w, ceiling).round();
        let new = new.clamp(input.min_w, ceiling);
        if (new - input.cap_w).abs() < c.min_change_w {
            let (mode, why) = if error > 0.0 && cap <= input.min_w + c.min_change_w {
                (Mode::AtFloor, "at the minimum cap")
            } else if error < 0.0 && cap >= ceiling - c.min_change_w {
                (Mode::AtCeiling, "at the ceiling")
            } else {
                (Mode::Tracking, "change below 1 W")
            };
            self.mode = mode;
            return self.hold(mode, temp, target, input.cap_w, why);
        }
        self.set(input.cap_w, new, Mode::Tracking, temp, target, "")
    }

    /// Hold in `mode`, forgetting the last error and the trend (the next usable sample starts
    /// the controller afresh).
    fn forget(&mut self, mode: Mode, input: &GovernorInput, why: String) -> Decision {
        self.last = None;
        self.trend_c_per_s = 0.0;
        self.mode = mode;
        Decision {
            action: CapMove::Hold,
            mode,
            temperature_c: input.temperature_c,
            target_c: self.target.resolve(input.slowdown_c),
            why,
        }
    }

    fn hold(&mut self, mode: Mode, temp: f64, target: f64, cap: f64, why: &str) -> Decision {
        self.mode = mode;
        let rel = relation(temp, target);
        Decision {
            action: CapMove::Hold,
            mode,
            temperature_c: Some(temp),
            target_c: Some(target),
            why: format!("{temp:.1} °C {rel} target {target:.0} °C: {why}, cap stays {cap:.0} W"),
        }
    }

    fn set(
        &mut self,
        from: f64,
        to: f64,
        mode: Mode,
        temp: f64,
        target: f64,
        note: &str,
    ) -> Decision {
        self.mode = mode;
        let rel = relation(temp, target);
        let note = if note.is_empty() {
            String::new()
        } else {
            format!(" ({note})")
        };
        Decision {
            action: CapMove::Set {
                from_w: from,
                to_w: to,
            },
            mode,
            temperature_c: Some(temp),
            target_c: Some(target),
            why: format!(
                "{temp:.1} °C {rel} target {target:.0} °C: cap {from:.0} → {to:.0} W ({:+.0} W){note}",
                to - from
            ),
        }
    }
}

fn relation(temp: f64, target: f64) -> &'static str {
    if temp > target {
        ">"
    } else if temp < target {
        "<"
    } else {
        "="
    }
}

pub mod stale;

#[cfg(test)]
mod tests;
