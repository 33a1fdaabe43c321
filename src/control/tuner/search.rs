//! The search itself: a plan of caps, the order they are tried in ([`Strategy`]), a warm-up
//! and a measured window per cap (fixed, or ended once the cost is known well enough), the
//! result. Driven by [`Observation`]s; answers with [`SearchStep`]s.

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

/// How the caps to try are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Golden-section search over the plan's caps from the default cap ([`super::golden`]),
    /// each window ended once its cost is known to [`NOISE_TOL`].
    #[default]
    Golden,
    /// From the maximum down, stopping once the cost has clearly risen (the first search;
    /// fixed windows).
    Descend,
    /// Every cap of the plan, fixed windows: the exhaustive sweep searches are judged by.
    Sweep,
}

impl Strategy {
    /// The name on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Golden => "golden",
            Strategy::Descend => "descend",
            Strategy::Sweep => "sweep",
        }
    }
}

/// A noise-sized window ends once the standard error of its cost is below this fraction of
/// the cost: two caps whose costs differ by more than a few times that are ranked right, and
/// caps closer than that cost about the same, so the ranking matters little.
pub const NOISE_TOL: f64 = 0.005;

/// A noise-sized window is cut into this many chunks at most (each `measure / CHUNKS` long),
/// and ends no sooner than [`MIN_CHUNKS`] of them.
const CHUNKS: f64 = 10.0;
const MIN_CHUNKS: usize = 3;

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
    /// The golden search's: 5 warm-up steps (a cap acts within milliseconds; the data
    /// pipeline settles in a few steps), at most 40 measured, fewer once the cost is known.
    pub const GOLDEN_STEPS: Window = Window {
        unit: Unit::Steps,
        warmup: 5.0,
        measure: 40.0,
    };
    /// The golden search's without step counts: 3 s warm-up, at most 20 s measured.
    pub const GOLDEN_SECONDS: Window = Window {
        unit: Unit::Seconds,
        warmup: 3.0,
        measure: 20.0,
    };

    /// The default window of `strategy`, in steps or (`seconds`) in seconds.
    pub fn default_for(strategy: Strategy, seconds: bool) -> Window {
        match (strategy, seconds) {
            (Strategy::Golden, false) => Window::GOLDEN_STEPS,
            (Strategy::Golden, true) => Window::GOLDEN_SECONDS,
            (_, false) => Window::DEFAULT_STEPS,
            (_, true) => Window::DEFAULT_SECONDS,
        }
    }
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
    /// How the caps are chosen.
    #[serde(default)]
    pub strategy: Strategy,
    /// Where the optimum is expected (the last result for the run's profile), watts: the
    /// golden search brackets it first.
    #[serde(default)]
    pub prior_w: Option<f64>,
    /// Search the batch size with the cap (`--with batch-size`, [`super::joint`]).
    #[serde(default)]
    pub with_batch: bool,
    /// The setting searched: the power cap, the locked SM clocks, or both ([`super::knob`]).
    #[serde(default)]
    pub knob: super::knob::Knob,
    /// Distance between the clocks tried, MHz (`None`: the searched range over twelve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_mhz: Option<f64>,
}

impl Default for TuneSettings {
    /// Energy and time weighed alike, 25 W between caps, the golden search and its window.
    fn default() -> TuneSettings {
        TuneSettings {
            eta: 0.5,
            step_w: 25.0,
            window: Window::GOLDEN_STEPS,
            strategy: Strategy::Golden,
            prior_w: None,
            with_batch: false,
            knob: super::knob::Knob::Cap,
            step_mhz: None,
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
    /// Stop after this many rises in a row ([`Strategy::Descend`]).
    pub patience: u32,
    pub strategy: Strategy,
    /// End a window once the standard error of its cost is below this fraction of it (`None`:
    /// always the whole window).
    pub noise_tol: Option<f64>,
    /// Where the optimum is expected, watts ([`TuneSettings::prior_w`]).
    pub prior_w: Option<f64>,
    /// The golden search measures the default cap first, the reference of every saving; a
    /// joint search does so at its starting batch only ([`super::joint`]).
    #[serde(default = "yes")]
    pub measure_default: bool,
}

fn yes() -> bool {
    true
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
            strategy: s.strategy,
            noise_tol: Some(NOISE_TOL),
            prior_w: None,
            measure_default: true,
        }
    }

    /// This configuration searching as `s` asks.
    pub fn with_settings(self, s: &TuneSettings) -> TunerConfig {
        TunerConfig {
            eta: s.eta,
            step_w: s.step_w,
            window: s.window,
            prior_w: s.prior_w,
            ..self.with_strategy(s.strategy)
        }
    }

    /// This configuration with `strategy` and its kind of window: noise-sized for the golden
    /// search, whole for the others (the sweep and the first search measure as they always
    /// did, so that they stay comparable).
    pub fn with_strategy(self, strategy: Strategy) -> TunerConfig {
        TunerConfig {
            strategy,
            noise_tol: (strategy == Strategy::Golden).then_some(NOISE_TOL),
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
        if self.noise_tol.is_some_and(|t| !(t > 0.0 && t.is_finite())) {
            return bad("the noise tolerance must be positive");
        }
        if self.prior_w.is_some_and(|w| !w.is_finite()) {
            return bad("the prior cap must be a number of watts");
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
    /// The batch size the newest reports trained with (a joint search waits for the batch it
    /// asked for to show here).
    #[serde(default)]
    pub batch: Option<u32>,
    /// The run ran out of memory (or a rank refused a batch as too large) since the last
    /// observation.
    #[serde(default)]
    pub oom: bool,
}

/// The cap change the search asks the caller to make.
#[derive(Debug, Clone, PartialEq)]
pub enum SearchStep {
    /// Set this cap on every tuned GPU (the next cap to try).
    SetCap(f64),
    /// Lock every tuned GPU's SM clocks up to this, MHz (a clock search, [`super::knob`]; the
    /// highest clock unlocks them).
    SetClock(f64),
    /// Change the run's batch size to this (every rank at one step; a joint search).
    SetBatch(u32),
    /// The search is over: set `apply_w` (the best cap) and, after a joint search, the best
    /// batch (`result.batch`), and keep `result`.
    Finish {
        apply_w: f64,
        result: Box<TuneResult>,
    },
    /// Cancelled mid-way: set the cap (and the batch) the run started with.
    Restore(f64),
}

/// One cap's measured window and its score.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CapPoint {
    pub cap_w: f64,
    /// The batch size it was measured at (a joint search's points).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
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
    /// The standard error of the cost, percent of it, from the window's chunks (absent for a
    /// window measured whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub se_pct: Option<f64>,
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
            batch: None,
            energy_j,
            samples,
            seconds,
            energy_per_sample_j: e,
            time_per_sample_s: t,
            avg_power_w: energy_j / seconds,
            cost: zeus_cost(eta, max_p, e, t),
            se_pct: None,
        }
    }

    /// This cap measured again: both windows together, their errors combined by weight.
    fn merged(&self, again: &CapPoint, eta: f64, max_p: f64) -> CapPoint {
        let n = self.samples + again.samples;
        let (a, b) = (self.samples / n, again.samples / n);
        let se_pct = match (self.se_pct, again.se_pct) {
            (Some(x), Some(y)) => Some(((a * x).powi(2) + (b * y).powi(2)).sqrt()),
            (x, y) => x.or(y),
        };
        CapPoint {
            batch: self.batch,
            se_pct,
            ..CapPoint::new(
                self.cap_w,
                self.energy_j + again.energy_j,
                n,
                self.seconds + again.seconds,
                eta,
                max_p,
            )
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
    /// How the caps were chosen (results written before there was a choice: descend).
    #[serde(default = "descend")]
    pub strategy: Strategy,
    /// Caps in the plan.
    pub planned: usize,
    /// From start to finish on the observations' clock, seconds.
    pub duration_s: f64,
    /// A joint search's batch dimension (`None`: the cap alone was searched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<super::joint::BatchOutcome>,
    /// How far the best is told apart from the runner-up ([`Confidence`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<Confidence>,
    /// The setting searched: `best.cap_w` and every point's are MHz for the clocks.
    #[serde(default, skip_serializing_if = "super::knob::Knob::is_cap")]
    pub knob: super::knob::Knob,
    /// `--knob both`: the other knob's search, which saved less.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other: Option<Box<TuneResult>>,
    /// The savings' uncertainty, percentage points either way: two standard errors of the
    /// best's cost against the default's (absent where the windows were measured whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saving_uncertainty_pct: Option<f64>,
}

impl TuneResult {
    /// One line for people: the cap and the saving.
    pub fn summary(&self) -> String {
        let k = self.knob;
        let (what, many) = match k {
            super::knob::Knob::Clocks => ("SM clock lock", "clocks"),
            _ => ("cap", "caps"),
        };
        let mut s = match &self.batch {
            None => format!(
                "best {what} {} (cost {:.3} J/sample at eta {:.2}; {} of {} {many} tried in {:.0} s)",
                k.show(self.best.cap_w),
                self.best.cost,
                self.eta,
                self.curve.len(),
                self.planned,
                self.duration_s
            ),
            Some(b) => format!(
                "best cap {:.0} W at batch {} (from batch {}; cost {:.3} J/sample at eta {:.2}; {} \
                 of {} batch × cap points tried, {} batches, in {:.0} s)",
                self.best.cap_w,
                b.best,
                b.start,
                self.best.cost,
                self.eta,
                self.curve.len(),
                self.planned,
                b.searched.len(),
                self.duration_s
            ),
        };
        let is_default = (self.best.cap_w - self.default_w).abs() < 0.5 && self.batch.is_none();
        if is_default {
            s.push_str(&format!(
                "; the default {} is the best {what}: no saving",
                k.show(self.default_w)
            ));
        } else if let (Some(e), Some(t)) = (self.energy_saving_pct, self.time_change_pct) {
            s.push_str(&format!(
                "; against the default {}{}: {:.1}% less energy per sample, {:.1}% {} per sample",
                k.show(self.default_w),
                self.batch
                    .as_ref()
                    .map_or(String::new(), |b| format!(" at batch {}", b.start)),
                e,
                t.abs(),
                if t >= 0.0 { "more time" } else { "less time" }
            ));
            if let Some(u) = self.saving_uncertainty_pct {
                s.push_str(&format!(" (±{u:.1} points"));
                if self.cost_saving_pct.is_some_and(|c| c <= u) {
                    s.push_str(": no saving the measurement can tell apart from none");
                }
                s.push(')');
            }
        }
        if let Some(c) = self.confidence.filter(|c| !c.resolved()) {
            s.push_str(&format!(
                "; {} costs within the noise of the best ({:.1}% more, ±{:.1}%)",
                k.show(c.runner_up_w),
                c.margin_pct,
                c.noise_pct
            ));
        }
        if let Some(o) = &self.other {
            s.push_str(&format!(
                "; kept over the {} search (best {}, {})",
                o.knob.name(),
                o.knob.show(o.best.cap_w),
                o.cost_saving_pct
                    .map_or("no default measured".into(), |c| format!(
                        "{c:.1}% less cost"
                    ))
            ));
        }
        s
    }
}

fn descend() -> Strategy {
    Strategy::Descend
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
    /// How many caps were measured before it (0-based), and the plan's length (the most a
    /// search can try).
    pub index: usize,
    pub planned: usize,
    /// How far through the current warm-up or window, 0..=1.
    pub fraction: f64,
    pub curve: Vec<CapPoint>,
    pub best_cap_w: Option<f64>,
    /// A joint search's batch dimension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<super::joint::BatchProgress>,
    /// The setting under test (`cap_w` is MHz for the clocks).
    #[serde(default, skip_serializing_if = "super::knob::Knob::is_cap")]
    pub knob: super::knob::Knob,
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
        /// Where the chunk in progress began, and the costs of the chunks measured
        /// (noise-sized windows).
        chunk_from: Observation,
        chunks: Vec<f64>,
    },
    Done(Box<TuneResult>),
    Cancelled,
}

/// How sure a search is of its best cap ([`Tuner::confidence`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Confidence {
    /// The second-cheapest cap measured.
    pub runner_up_w: f64,
    /// How much more it cost than the best, percent.
    pub margin_pct: f64,
    /// The standard error of that margin, percent: the two windows' errors added in
    /// quadrature (0: neither window was cut into chunks, so no error was measured).
    pub noise_pct: f64,
}

impl Confidence {
    /// Whether the best is told apart from the runner-up: the margin is more than two
    /// standard errors of it. Otherwise the two cost the same as far as the measurement can
    /// say, and either is a fine cap; the golden search measures both again once before it
    /// ends ([`Tuner`]).
    pub fn resolved(&self) -> bool {
        self.margin_pct > 2.0 * self.noise_pct
    }
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
    /// The golden search's bracket, positions in `plan`.
    bracket: (usize, usize),
    /// The largest relative standard error of a measured window's cost so far (0 until a
    /// window is cut into chunks): the error of a point measured whole.
    noise: f64,
    /// Positions to measure again (the best and the runner-up, when the noise does not tell
    /// them apart), taken from the end; `rechecked` once that was decided.
    recheck: Vec<usize>,
    rechecked: bool,
}

impl Tuner {
    pub fn new(cfg: TunerConfig) -> Result<Tuner, TunerError> {
        cfg.check()?;
        let plan = cfg.plan();
        let last = plan.len().saturating_sub(1);
        let bracket = match cfg.prior_w {
            // Three caps either side of the prior; the walk at the end goes further if the
            // minimum turns out to lie outside.
            Some(w) => {
                let c = nearest(&plan, w);
                (c.saturating_sub(3), (c + 3).min(last))
            }
            None => (0, last),
        };
        Ok(Tuner {
            cfg,
            plan,
            state: State::NotStarted,
            curve: Vec::new(),
            rises: 0,
            started_s: 0.0,
            bracket,
            noise: 0.0,
            recheck: Vec::new(),
            rechecked: false,
        })
    }

    /// A search that already measured `points` (a search resumed after a restart): the golden
    /// search reuses them instead of measuring those caps again; the others start over.
    pub fn with_points(mut self, points: &[CapPoint]) -> Tuner {
        if self.cfg.strategy == Strategy::Golden {
            self.curve = points
                .iter()
                .filter(|p| self.plan.iter().any(|c| (c - p.cap_w).abs() < 0.5))
                .copied()
                .collect();
        }
        self.golden_replay();
        self
    }

    /// Narrow the bracket as the points measured already allow (the narrowing depends only
    /// on them, so replaying it gives the bracket the search had).
    fn golden_replay(&mut self) {
        if self.cfg.strategy != Strategy::Golden || self.curve.is_empty() {
            return;
        }
        let costs = self.costs();
        let mut b = self.bracket;
        let _ = super::golden::next_probe(&mut b, self.plan.len(), &|i| costs[i]);
        self.bracket = b;
    }

    /// The measured cost at each position of the plan.
    fn costs(&self) -> Vec<Option<f64>> {
        self.plan
            .iter()
            .map(|c| {
                self.curve
                    .iter()
                    .find(|p| (p.cap_w - c).abs() < 0.5)
                    .map(|p| p.cost)
            })
            .collect()
    }

    /// The golden search's next position; `None` when it is done.
    fn golden_next(&mut self) -> Option<usize> {
        let costs = self.costs();
        // The default cap first: every saving is reported against it.
        if let Some(d) = self.default_idx().filter(|_| self.cfg.measure_default) {
            if costs[d].is_none() {
                return Some(d);
            }
        }
        let mut b = self.bracket;
        let n = self.plan.len();
        let next = super::golden::next_probe(&mut b, n, &|i| costs[i]);
        self.bracket = b;
        // A search of the whole range covers it too (a second dip); one around a prior
        // searches where the prior says.
        next.or_else(|| {
            self.cfg.prior_w.is_none().then(|| {
                let step = super::golden::cover_step(n.saturating_sub(1));
                super::golden::next_gap_probe(n, step, &|i| costs[i])
            })?
        })
    }

    /// How sure the choice is, once two caps are measured: the runner-up and how much more
    /// it cost, against the noise of the windows.
    pub fn confidence(&self) -> Option<Confidence> {
        let best = self.best()?;
        let runner_up = self
            .curve
            .iter()
            .filter(|p| (p.cap_w - best.cap_w).abs() >= 0.5)
            .min_by(|a, b| a.cost.total_cmp(&b.cost))?;
        let (eb, er) = (self.se_pct(best), self.se_pct(runner_up));
        Some(Confidence {
            runner_up_w: runner_up.cap_w,
            margin_pct: 100.0 * (runner_up.cost - best.cost) / best.cost,
            noise_pct: (eb * eb + er * er).sqrt(),
        })
    }

    /// A point's standard error, percent: its own, else the noisiest window's.
    fn se_pct(&self, p: &CapPoint) -> f64 {
        p.se_pct.unwrap_or(100.0 * self.noise)
    }

    /// Once the search would end: the best and the runner-up to measure again, when the noise
    /// does not tell them apart (once per search).
    fn recheck_start(&mut self) -> Option<usize> {
        if self.rechecked || self.confidence().is_none_or(|c| c.resolved()) {
            return None;
        }
        self.rechecked = true;
        let c = self.confidence()?;
        let best = self.best()?.cap_w;
        let at = |w: f64| self.plan.iter().position(|c| (c - w).abs() < 0.5);
        self.recheck = [at(best), at(c.runner_up_w)]
            .into_iter()
            .flatten()
            .collect();
        self.recheck.pop()
    }

    fn default_idx(&self) -> Option<usize> {
        self.plan
            .iter()
            .position(|c| (c - self.cfg.default_w).abs() < 0.5)
    }

    pub fn config(&self) -> &TunerConfig {
        &self.cfg
    }

    pub fn plan(&self) -> &[f64] {
        &self.plan
    }

    /// Begin: set the first cap (the highest; for the golden search the default cap).
    pub fn start(&mut self, now: &Observation) -> SearchStep {
        self.started_s = now.time_s;
        let idx = match self.cfg.strategy {
            Strategy::Golden => self.golden_next().unwrap_or(0),
            Strategy::Descend | Strategy::Sweep => 0,
        };
        let cap = self.plan[idx];
        if (cap - self.cfg.start_w).abs() < 0.5 && self.cfg.window.warmup <= 0.0 {
            // The cap does not change and no warm-up is asked: measure from now. Otherwise the
            // first cap warms up as every other does, so that the default's window (every
            // saving is reported against it) is measured the way the others are.
            self.state = self.measuring(idx, now);
        } else {
            self.state = State::WarmUp {
                idx,
                from: self.coord(now),
                done: 0.0,
            };
        }
        SearchStep::SetCap(cap)
    }

    fn measuring(&self, idx: usize, from: &Observation) -> State {
        State::Measure {
            idx,
            from: *from,
            done: 0.0,
            chunk_from: *from,
            chunks: Vec::new(),
        }
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
                    self.state = self.measuring(idx, obs);
                } else {
                    self.state = State::WarmUp {
                        idx,
                        from: Some(from),
                        done: (p - from) / self.cfg.window.warmup.max(f64::MIN_POSITIVE),
                    };
                }
                None
            }
            State::Measure {
                idx,
                from,
                mut chunk_from,
                mut chunks,
                ..
            } => {
                let (Some(p), Some(p0)) = (p, self.coord(&from)) else {
                    return None;
                };
                let de = obs.energy_j - from.energy_j;
                let ds = obs.samples - from.samples;
                let dt = obs.time_s - from.time_s;
                if p < p0 || de < 0.0 || ds < 0.0 || dt < 0.0 {
                    // A counter went backwards: this window is void, measure again.
                    self.state = self.measuring(idx, obs);
                    return None;
                }
                let window = self.cfg.window;
                if let Some(pc) = self.coord(&chunk_from) {
                    if p - pc >= window.measure / CHUNKS {
                        let (cs, ct) = (
                            obs.samples - chunk_from.samples,
                            obs.time_s - chunk_from.time_s,
                        );
                        if cs > 0.0 && ct > 0.0 {
                            let ce = obs.energy_j - chunk_from.energy_j;
                            chunks.push(zeus_cost(
                                self.cfg.eta,
                                self.cfg.max_power_w,
                                ce / cs,
                                ct / cs,
                            ));
                        }
                        chunk_from = *obs;
                    }
                }
                let known = self
                    .cfg
                    .noise_tol
                    .is_some_and(|tol| chunks.len() >= MIN_CHUNKS && relative_se(&chunks) <= tol);
                if p - p0 < window.measure && !known {
                    self.state = State::Measure {
                        idx,
                        from,
                        done: (p - p0) / window.measure,
                        chunk_from,
                        chunks,
                    };
                    return None;
                }
                if ds <= 0.0 || dt <= 0.0 {
                    // Steps went by without samples (an evaluation pass, a checkpoint): nothing
                    // to score, measure again.
                    self.state = self.measuring(idx, obs);
                    return None;
                }
                let se = (chunks.len() >= 2).then(|| relative_se(&chunks));
                if let Some(se) = se {
                    self.noise = self.noise.max(se);
                }
                let point = CapPoint {
                    se_pct: se.map(|x| 100.0 * x),
                    ..CapPoint::new(
                        self.plan[idx],
                        de,
                        ds,
                        dt,
                        self.cfg.eta,
                        self.cfg.max_power_w,
                    )
                };
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
                let index = match self.cfg.strategy {
                    Strategy::Golden => self.curve.len(),
                    Strategy::Descend | Strategy::Sweep => idx,
                };
                (Some(self.plan[idx]), index, done.clamp(0.0, 1.0))
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
            batch: None,
            knob: super::knob::Knob::Cap,
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
        let (eta, max_p) = (self.cfg.eta, self.cfg.max_power_w);
        match self
            .curve
            .iter_mut()
            .find(|p| (p.cap_w - point.cap_w).abs() < 0.5)
        {
            // Measured again (the best and the runner-up, too close to tell): both windows.
            Some(p) => *p = p.merged(&point, eta, max_p),
            None => self.curve.push(point),
        }
        match best_before {
            Some(best) if point.cost > best * (1.0 + self.cfg.rise_margin) => self.rises += 1,
            _ => self.rises = 0,
        }
        let next = match self.cfg.strategy {
            Strategy::Golden => self
                .recheck
                .pop()
                .or_else(|| self.golden_next())
                .or_else(|| self.recheck_start()),
            Strategy::Descend | Strategy::Sweep => {
                let default_seen = self.curve.iter().any(|c| c.cap_w <= self.cfg.default_w);
                let early = self.cfg.strategy == Strategy::Descend
                    && default_seen
                    && self.rises >= self.cfg.patience;
                (!early && idx + 1 < self.plan.len()).then_some(idx + 1)
            }
        };
        let Some(next) = next else {
            let result = Box::new(self.result_at(obs));
            let apply_w = result.best.cap_w;
            self.state = State::Done(result.clone());
            return SearchStep::Finish { apply_w, result };
        };
        self.state = State::WarmUp {
            idx: next,
            from: Some(p),
            done: 0.0,
        };
        SearchStep::SetCap(self.plan[next])
    }

    fn result_at(&self, obs: &Observation) -> TuneResult {
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
            stopped_early: self.curve.len() < self.plan.len(),
            strategy: self.cfg.strategy,
            planned: self.plan.len(),
            duration_s: obs.time_s - self.started_s,
            batch: None,
            knob: super::knob::Knob::Cap,
            other: None,
            confidence: self.confidence(),
            saving_uncertainty_pct: saving_uncertainty(&best, default.as_ref()),
        }
    }
}

/// A search as its drivers see it ([`super::live::drive`], the simulator harness): the cap
/// search ([`Tuner`]) and the joint search of batch size and cap ([`super::JointTuner`]).
pub trait Search: Send {
    /// Begin at the counters `now`: the first change to make.
    fn start(&mut self, now: &Observation) -> SearchStep;
    /// Feed the counters now; `Some` when the caller must act.
    fn observe(&mut self, obs: &Observation) -> Option<SearchStep>;
    /// Stop now; `Some(Restore)` when something must be put back.
    fn cancel(&mut self) -> Option<SearchStep>;
    fn progress(&self) -> Progress;
}

impl Search for Tuner {
    fn start(&mut self, now: &Observation) -> SearchStep {
        Tuner::start(self, now)
    }
    fn observe(&mut self, obs: &Observation) -> Option<SearchStep> {
        Tuner::observe(self, obs)
    }
    fn cancel(&mut self) -> Option<SearchStep> {
        Tuner::cancel(self)
    }
    fn progress(&self) -> Progress {
        Tuner::progress(self)
    }
}

/// The uncertainty of a saving of `best` against `default`, percentage points either way: two
/// standard errors of the ratio of their costs. `None` where either was measured whole, or
/// where the best is the default itself (no saving, nothing to be unsure of).
pub(super) fn saving_uncertainty(best: &CapPoint, default: Option<&CapPoint>) -> Option<f64> {
    let d = default.filter(|d| d.cap_w != best.cap_w || d.batch != best.batch)?;
    let (eb, ed) = (best.se_pct?, d.se_pct?);
    Some(2.0 * best.cost / d.cost * (eb * eb + ed * ed).sqrt())
}

/// The position in `plan` nearest to `w`.
fn nearest(plan: &[f64], w: f64) -> usize {
    (0..plan.len())
        .min_by(|a, b| (plan[*a] - w).abs().total_cmp(&(plan[*b] - w).abs()))
        .unwrap_or(0)
}

/// The standard error of the mean of `xs` over their mean.
fn relative_se(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (var / n).sqrt() / mean.abs().max(f64::MIN_POSITIVE)
}

#[cfg(test)]
mod measured;
#[cfg(test)]
mod tests;
