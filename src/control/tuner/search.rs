//! The search itself: a plan of caps, a warm-up and a measured window per cap, early stop,
//! the result. Driven by [`Observation`]s; answers with [`SearchStep`]s.

use serde::{Deserialize, Serialize};

/// What a window is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Training steps as the trainer reports them.
    Steps,
    /// Seconds, for runs that report no steps.
    Seconds,
}

/// How long each cap is held: `warmup` (not scored: the clock and the data pipeline settle),
/// then `measure` (scored), both in `unit`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub unit: Unit,
    pub warmup: f64,
    pub measure: f64,
}

impl Window {
    /// Zeus's defaults: 10 warm-up steps, 40 measured.
    pub const DEFAULT_STEPS: Window = Window {
        unit: Unit::Steps,
        warmup: 10.0,
        measure: 40.0,
    };
    /// For runs without step counts: 5 s warm-up, 20 s measured.
    pub const DEFAULT_SECONDS: Window = Window {
        unit: Unit::Seconds,
        warmup: 5.0,
        measure: 20.0,
    };
}

/// What a search is asked for: the weight of energy against time, the distance between the
/// caps tried, and how long each is held. `gpupilot tune energy`'s flags set it; the console's
/// tuner and the simulator harness take the defaults, and this `Default` is the one place they
/// are written.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TuneSettings {
    /// Weight of energy against time in the cost, 0..=1 (1: energy only, 0: time only).
    pub eta: f64,
    /// Distance between the caps tried, watts.
    pub step_w: f64,
    pub window: Window,
}

impl Default for TuneSettings {
    /// Energy and time weighed alike, 25 W between caps, Zeus's step window.
    fn default() -> TuneSettings {
        TuneSettings {
            eta: 0.5,
            step_w: 25.0,
            window: Window::DEFAULT_STEPS,
        }
    }
}

/// Everything the search needs to know up front. Watts throughout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunerConfig {
    /// Weight of energy against time in the cost, 0..=1 (1: energy only, 0: time only).
    pub eta: f64,
    /// Distance between the caps tried, watts.
    pub step_w: f64,
    /// The settable range and the default limit (the reference of every saving).
    pub min_w: f64,
    pub max_w: f64,
    pub default_w: f64,
    /// The cap in force when the search starts, restored if it is cancelled mid-way.
    pub start_w: f64,
    /// Zeus's MAXPOWER: the sum of the tuned GPUs' maximum limits, watts.
    pub max_power_w: f64,
    pub window: Window,
    /// A cap whose cost is above the best by more than this fraction counts as a rise.
    pub rise_margin: f64,
    /// Stop after this many rises in a row.
    pub patience: u32,
    /// `false`: try every cap in the plan (the exhaustive sweep).
    pub early_stop: bool,
}

impl TunerConfig {
    /// The default [`TuneSettings`] (and stop after two caps 2% above the best) for `gpus`
    /// GPUs sharing one set of limits, starting at `start_w`.
    pub fn new(min_w: f64, default_w: f64, max_w: f64, start_w: f64, gpus: usize) -> TunerConfig {
        let s = TuneSettings::default();
        TunerConfig {
            eta: s.eta,
            step_w: s.step_w,
            min_w,
            max_w,
            default_w,
            start_w,
            max_power_w: max_w * gpus.max(1) as f64,
            window: s.window,
            rise_margin: 0.02,
            patience: 2,
            early_stop: true,
        }
    }

    /// This configuration searching as `s` asks.
    pub fn with_settings(self, s: &TuneSettings) -> TunerConfig {
        TunerConfig {
            eta: s.eta,
            step_w: s.step_w,
            window: s.window,
            ..self
        }
    }

    /// The caps to try, highest first: from `max_w` down by `step_w` to no lower than `min_w`,
    /// with the default cap added where the grid misses it.
    pub fn plan(&self) -> Vec<f64> {
        let mut caps = Vec::new();
        let mut k = 0.0;
        loop {
            let cap = self.max_w - k * self.step_w;
            if cap < self.min_w - 1e-9 {
                break;
            }
            caps.push(cap);
            k += 1.0;
        }
        if !caps.iter().any(|c| (c - self.default_w).abs() < 0.5) {
            caps.push(self.default_w);
            caps.sort_by(|a, b| b.total_cmp(a));
        }
        caps
    }

    fn check(&self) -> Result<(), TunerError> {
        let bad = |what: &str| Err(TunerError::Config(what.to_string()));
        if !(0.0..=1.0).contains(&self.eta) {
            return bad("eta must be between 0 (time only) and 1 (energy only)");
        }
        if !(self.step_w.is_finite() && self.step_w >= 1.0) {
            return bad("the cap step must be at least 1 W");
        }
        if !(self.min_w > 0.0 && self.min_w <= self.default_w && self.default_w <= self.max_w) {
            return bad("the GPU's power limits are inconsistent (need 0 < min ≤ default ≤ max)");
        }
        if !(self.max_power_w > 0.0 && self.max_power_w.is_finite()) {
            return bad("max power must be positive");
        }
        let w = self.window;
        if !(w.warmup >= 0.0 && w.measure > 0.0 && w.warmup.is_finite() && w.measure.is_finite()) {
            return bad("the measured window must be positive and the warm-up not negative");
        }
        if self.patience == 0 || self.rise_margin.is_nan() || self.rise_margin < 0.0 {
            return bad("patience must be at least 1 and the rise margin not negative");
        }
        Ok(())
    }
}

/// Why a search cannot start.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TunerError {
    #[error("energy tuner: {0}")]
    Config(String),
}

/// Zeus's cost of one sample: `eta · joules + (1 − eta) · max_power · seconds`, joules.
pub fn zeus_cost(eta: f64, max_power_w: f64, joules: f64, seconds: f64) -> f64 {
    eta * joules + (1.0 - eta) * max_power_w * seconds
}

/// Cumulative counters of the tuned run at one moment. Only differences are used, so each
/// counter may start anywhere; one that goes backwards (a restarted trainer, a reset GPU)
/// restarts the window in progress.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// A monotonic clock, seconds.
    pub time_s: f64,
    /// The trainer's step counter; required when the window counts steps.
    pub steps: Option<f64>,
    /// Energy of the tuned GPUs together, joules.
    pub energy_j: f64,
    /// Samples trained (over all the run's GPUs).
    pub samples: f64,
}

/// The cap change the search asks the caller to make.
#[derive(Debug, Clone, PartialEq)]
pub enum SearchStep {
    /// Set this cap on every tuned GPU (the next cap to try).
    SetCap(f64),
    /// The search is over: set `apply_w` (the best cap) and keep `result`.
    Finish {
        apply_w: f64,
        result: Box<TuneResult>,
    },
    /// Cancelled mid-way: set the cap the run started with.
    Restore(f64),
}

/// One cap's measured window and its score.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CapPoint {
    pub cap_w: f64,
    /// Over the measured window: energy (J), samples, seconds.
    pub energy_j: f64,
    pub samples: f64,
    pub seconds: f64,
    pub energy_per_sample_j: f64,
    pub time_per_sample_s: f64,
    /// Mean power over the window (all tuned GPUs), watts.
    pub avg_power_w: f64,
    /// Zeus's cost per sample, joules.
    pub cost: f64,
}

impl CapPoint {
    fn new(
        cap_w: f64,
        energy_j: f64,
        samples: f64,
        seconds: f64,
        eta: f64,
        max_p: f64,
    ) -> CapPoint {
        let e = energy_j / samples;
        let t = seconds / samples;
        CapPoint {
            cap_w,
            energy_j,
            samples,
            seconds,
            energy_per_sample_j: e,
            time_per_sample_s: t,
            avg_power_w: energy_j / seconds,
            cost: zeus_cost(eta, max_p, e, t),
        }
    }
}

/// The outcome: the best cap, the whole curve, and what it saves against the default cap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneResult {
    pub eta: f64,
    pub max_power_w: f64,
    pub window: Window,
    pub start_w: f64,
    pub default_w: f64,
    pub best: CapPoint,
    /// The default cap's point (absent only when a search stopped before reaching it, which
    /// [`Tuner`] never does).
    pub default: Option<CapPoint>,
    /// Every cap tried, in the order tried (highest first).
    pub curve: Vec<CapPoint>,
    /// Energy per sample saved at the best cap against the default, percent (positive: less).
    pub energy_saving_pct: Option<f64>,
    /// Time per sample at the best cap against the default, percent (positive: slower).
    pub time_change_pct: Option<f64>,
    /// Cost per sample saved against the default, percent.
    pub cost_saving_pct: Option<f64>,
    /// Whether it stopped before the end of the plan.
    pub stopped_early: bool,
    /// Caps in the plan.
    pub planned: usize,
    /// From start to finish on the observations' clock, seconds.
    pub duration_s: f64,
}

impl TuneResult {
    /// One line for people: the cap and the saving.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "best cap {:.0} W (cost {:.3} J/sample at eta {:.2}; {} of {} caps tried in {:.0} s)",
            self.best.cap_w,
            self.best.cost,
            self.eta,
            self.curve.len(),
            self.planned,
            self.duration_s
        );
        if let (Some(e), Some(t)) = (self.energy_saving_pct, self.time_change_pct) {
            s.push_str(&format!(
                "; against the default {:.0} W: {:.1}% less energy per sample, {:.1}% {} per sample",
                self.default_w,
                e,
                t.abs(),
                if t >= 0.0 { "more time" } else { "less time" }
            ));
        }
        s
    }
}

/// Where the search stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    NotStarted,
    WarmUp,
    Measure,
    Done,
    Cancelled,
}

/// A view of the search for a progress display.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub phase: Phase,
    /// The cap under test.
    pub cap_w: Option<f64>,
    /// Its position in the plan (0-based) and the plan's length.
    pub index: usize,
    pub planned: usize,
    /// How far through the current warm-up or window, 0..=1.
    pub fraction: f64,
    pub curve: Vec<CapPoint>,
    pub best_cap_w: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    NotStarted,
    /// `from`: the window coordinate when the cap was set (`None` until one is seen).
    WarmUp {
        idx: usize,
        from: Option<f64>,
        done: f64,
    },
    Measure {
        idx: usize,
        from: Observation,
        done: f64,
    },
    Done(Box<TuneResult>),
    Cancelled,
}

/// The search. `start`, then `observe` as counters arrive (every second, or on every metrics
/// report), carrying out each [`SearchStep`]; `cancel` at any time.
#[derive(Debug, Clone)]
pub struct Tuner {
    cfg: TunerConfig,
    plan: Vec<f64>,
    state: State,
    curve: Vec<CapPoint>,
    rises: u32,
    started_s: f64,
}

impl Tuner {
    pub fn new(cfg: TunerConfig) -> Result<Tuner, TunerError> {
        cfg.check()?;
        let plan = cfg.plan();
        Ok(Tuner {
            cfg,
            plan,
            state: State::NotStarted,
            curve: Vec::new(),
            rises: 0,
            started_s: 0.0,
        })
    }

    pub fn config(&self) -> &TunerConfig {
        &self.cfg
    }

    pub fn plan(&self) -> &[f64] {
        &self.plan
    }

    /// Begin: set the first (highest) cap.
    pub fn start(&mut self, now: &Observation) -> SearchStep {
        self.started_s = now.time_s;
        self.state = State::WarmUp {
            idx: 0,
            from: self.coord(now),
            done: 0.0,
        };
        SearchStep::SetCap(self.plan[0])
    }

    /// Feed the counters now; `Some` when the caller must act.
    pub fn observe(&mut self, obs: &Observation) -> Option<SearchStep> {
        let p = self.coord(obs);
        match self.state.clone() {
            State::WarmUp { idx, from, .. } => {
                let (Some(p), Some(from)) = (p, from.or(p)) else {
                    return None;
                };
                if p < from {
                    // The counter restarted: count the warm-up again from here.
                    self.state = State::WarmUp {
                        idx,
                        from: Some(p),
                        done: 0.0,
                    };
                } else if p - from >= self.cfg.window.warmup {
                    self.state = State::Measure {
                        idx,
                        from: *obs,
                        done: 0.0,
                    };
                } else {
                    self.state = State::WarmUp {
                        idx,
                        from: Some(from),
                        done: (p - from) / self.cfg.window.warmup.max(f64::MIN_POSITIVE),
                    };
                }
                None
            }
            State::Measure { idx, from, .. } => {
                let (Some(p), Some(p0)) = (p, self.coord(&from)) else {
                    return None;
                };
                let de = obs.energy_j - from.energy_j;
                let ds = obs.samples - from.samples;
                let dt = obs.time_s - from.time_s;
                if p < p0 || de < 0.0 || ds < 0.0 || dt < 0.0 {
                    // A counter went backwards: this window is void, measure again.
                    self.state = State::Measure {
                        idx,
                        from: *obs,
                        done: 0.0,
                    };
                    return None;
                }
                if p - p0 < self.cfg.window.measure {
                    self.state = State::Measure {
                        idx,
                        from,
                        done: (p - p0) / self.cfg.window.measure,
                    };
                    return None;
                }
                if ds <= 0.0 || dt <= 0.0 {
                    // Steps went by without samples (an evaluation pass, a checkpoint): nothing
                    // to score, measure again.
                    self.state = State::Measure {
                        idx,
                        from: *obs,
                        done: 0.0,
                    };
                    return None;
                }
                let point = CapPoint::new(
                    self.plan[idx],
                    de,
                    ds,
                    dt,
                    self.cfg.eta,
                    self.cfg.max_power_w,
                );
                Some(self.scored(idx, point, obs, p))
            }
            State::NotStarted | State::Done(_) | State::Cancelled => None,
        }
    }

    /// Stop now. Mid-way this asks for the starting cap back; before the start or after the
    /// end there is nothing to undo.
    pub fn cancel(&mut self) -> Option<SearchStep> {
        match self.state {
            State::WarmUp { .. } | State::Measure { .. } => {
                self.state = State::Cancelled;
                Some(SearchStep::Restore(self.cfg.start_w))
            }
            State::NotStarted => {
                self.state = State::Cancelled;
                None
            }
            State::Done(_) | State::Cancelled => None,
        }
    }

    pub fn phase(&self) -> Phase {
        match self.state {
            State::NotStarted => Phase::NotStarted,
            State::WarmUp { .. } => Phase::WarmUp,
            State::Measure { .. } => Phase::Measure,
            State::Done(_) => Phase::Done,
            State::Cancelled => Phase::Cancelled,
        }
    }

    /// The result once done.
    pub fn result(&self) -> Option<&TuneResult> {
        match &self.state {
            State::Done(r) => Some(r),
            _ => None,
        }
    }

    pub fn progress(&self) -> Progress {
        let (cap_w, index, fraction) = match self.state {
            State::WarmUp { idx, done, .. } | State::Measure { idx, done, .. } => {
                (Some(self.plan[idx]), idx, done.clamp(0.0, 1.0))
            }
            State::Done(_) => (None, self.curve.len(), 1.0),
            State::NotStarted | State::Cancelled => (None, self.curve.len(), 0.0),
        };
        Progress {
            phase: self.phase(),
            cap_w,
            index,
            planned: self.plan.len(),
            fraction,
            curve: self.curve.clone(),
            best_cap_w: self.best().map(|b| b.cap_w),
        }
    }

    fn coord(&self, obs: &Observation) -> Option<f64> {
        match self.cfg.window.unit {
            Unit::Steps => obs.steps,
            Unit::Seconds => Some(obs.time_s),
        }
    }

    fn best(&self) -> Option<&CapPoint> {
        self.curve.iter().min_by(|a, b| a.cost.total_cmp(&b.cost))
    }

    /// Record a measured cap and decide: the next cap, or the end.
    fn scored(&mut self, idx: usize, point: CapPoint, obs: &Observation, p: f64) -> SearchStep {
        let best_before = self.best().map(|b| b.cost);
        self.curve.push(point);
        match best_before {
            Some(best) if point.cost > best * (1.0 + self.cfg.rise_margin) => self.rises += 1,
            _ => self.rises = 0,
        }
        let default_seen = self.curve.iter().any(|c| c.cap_w <= self.cfg.default_w);
        let early = self.cfg.early_stop && default_seen && self.rises >= self.cfg.patience;
        let last = idx + 1 >= self.plan.len();
        if early || last {
            let result = Box::new(self.result_at(obs, early && !last));
            let apply_w = result.best.cap_w;
            self.state = State::Done(result.clone());
            return SearchStep::Finish { apply_w, result };
        }
        self.state = State::WarmUp {
            idx: idx + 1,
            from: Some(p),
            done: 0.0,
        };
        SearchStep::SetCap(self.plan[idx + 1])
    }

    fn result_at(&self, obs: &Observation, stopped_early: bool) -> TuneResult {
        let best = *self.best().expect("a point was just recorded");
        let default = self
            .curve
            .iter()
            .find(|c| (c.cap_w - self.cfg.default_w).abs() < 0.5)
            .copied();
        let pct = |base: f64, new: f64| 100.0 * (base - new) / base;
        TuneResult {
            eta: self.cfg.eta,
            max_power_w: self.cfg.max_power_w,
            window: self.cfg.window,
            start_w: self.cfg.start_w,
            default_w: self.cfg.default_w,
            best,
            default,
            curve: self.curve.clone(),
            energy_saving_pct: default
                .map(|d| pct(d.energy_per_sample_j, best.energy_per_sample_j)),
            time_change_pct: default.map(|d| -pct(d.time_per_sample_s, best.time_per_sample_s)),
            cost_saving_pct: default.map(|d| pct(d.cost, best.cost)),
            stopped_early,
            planned: self.plan.len(),
            duration_s: obs.time_s - self.started_s,
        }
    }
}

#[cfg(test)]
mod tests;
