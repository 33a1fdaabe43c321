//! Which setting a search moves: the power cap, the locked SM clocks, or both compared.
//!
//! A power cap does not always bind: a kernel that draws less than the cap runs at full clock
//! whatever the cap, and some phases are decided by the clock rather than the power. Locking
//! the SM clocks below their maximum (`nvmlDeviceSetGpuLockedClocks`, what `nvidia-smi -lgc`
//! does) acts there too. [`Knob::Clocks`] searches the top of the locked range, from the
//! highest clock (unlocked, the reference of every saving) down to half of it; the lowest
//! clock of the range stays the GPU's own, so an idle GPU still clocks down.
//!
//! The search itself is [`Tuner`]'s, unchanged: its "caps" are then MHz, and [`KnobSearch`]
//! turns each [`SearchStep::SetCap`] into [`SearchStep::SetClock`]. `--knob both` runs the cap
//! search, puts the cap back, runs the clock search on the same run, and keeps the knob whose
//! best saves more against its own default window (both defaults are the same operating
//! point: the starting cap, clocks unlocked); the other's result stays in the winner's
//! `other`.

use serde::{Deserialize, Serialize};

use super::search::{Observation, Progress, Search, SearchStep, TuneResult, Tuner};

/// The setting a search moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Knob {
    /// The GPUs' power cap, watts.
    #[default]
    Cap,
    /// The top of the GPUs' locked SM clock range, MHz.
    Clocks,
    /// Both, one after the other, keeping the better.
    Both,
}

impl Knob {
    /// The name on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Knob::Cap => "cap",
            Knob::Clocks => "clocks",
            Knob::Both => "both",
        }
    }

    /// A value of this knob with its unit: `300 W`, `1410 MHz`.
    pub fn show(self, v: f64) -> String {
        match self {
            Knob::Clocks => format!("{v:.0} MHz"),
            Knob::Cap | Knob::Both => format!("{v:.0} W"),
        }
    }

    /// Whether it is the power cap (results and progress leave the field out then).
    pub fn is_cap(&self) -> bool {
        *self == Knob::Cap
    }
}

/// The lowest top of the locked range searched, as a share of the highest clock: below about
/// half the clock, training GPUs spend more energy per sample (the static power is paid over a
/// longer time), so the search does not go there.
pub const CLOCK_FLOOR_SHARE: f64 = 0.5;
/// The step of NVML's clock grids, MHz: locked clocks are multiples of it.
pub const CLOCK_GRID_MHZ: f64 = 15.0;
/// Clocks in a plan by default: the step is the searched range over this, on the grid.
const CLOCK_STEPS: f64 = 12.0;

/// The clock range a search tries for a GPU whose SM clocks run `min_mhz..=max_mhz`: the
/// floor (half the maximum, on the grid) and the default step (`step_mhz` when given).
pub fn clock_plan(min_mhz: f64, max_mhz: f64, step_mhz: Option<f64>) -> (f64, f64) {
    let floor = (CLOCK_FLOOR_SHARE * max_mhz / CLOCK_GRID_MHZ).ceil() * CLOCK_GRID_MHZ;
    let floor = floor.max(min_mhz).min(max_mhz);
    let step = step_mhz.unwrap_or_else(|| {
        ((max_mhz - floor) / CLOCK_STEPS / CLOCK_GRID_MHZ)
            .round()
            .max(1.0)
            * CLOCK_GRID_MHZ
    });
    (floor, step)
}

/// Where a [`KnobSearch`] is.
#[derive(Debug, Clone)]
enum Stage {
    /// Searching with the stage at this position.
    Searching(usize),
    /// A stage finished and its knob was put back: the next starts at the next observation.
    Between(usize),
    Done,
}

/// One or two searches, each on its knob, run one after the other (see the module doc).
#[derive(Debug, Clone)]
pub struct KnobSearch {
    stages: Vec<(Knob, Tuner)>,
    stage: Stage,
    results: Vec<TuneResult>,
}

impl KnobSearch {
    /// The clock search alone (`tuner`'s values are MHz).
    pub fn clocks(tuner: Tuner) -> KnobSearch {
        KnobSearch {
            stages: vec![(Knob::Clocks, tuner)],
            stage: Stage::Searching(0),
            results: Vec::new(),
        }
    }

    /// The cap search (watts), then the clock search (MHz), keeping the better.
    pub fn both(cap: Tuner, clocks: Tuner) -> KnobSearch {
        KnobSearch {
            stages: vec![(Knob::Cap, cap), (Knob::Clocks, clocks)],
            stage: Stage::Searching(0),
            results: Vec::new(),
        }
    }

    /// `step` of stage `i`'s search, in its knob.
    fn on_knob(&mut self, i: usize, step: SearchStep) -> SearchStep {
        let knob = self.stages[i].0;
        match step {
            SearchStep::SetCap(v) if knob == Knob::Clocks => SearchStep::SetClock(v),
            SearchStep::Finish { result, .. } => {
                let mut result = *result;
                result.knob = knob;
                let back = result.start_w;
                self.results.push(result);
                if i + 1 < self.stages.len() {
                    // This knob back where it started before the next is searched.
                    self.stage = Stage::Between(i + 1);
                    return match knob {
                        Knob::Clocks => SearchStep::SetClock(back),
                        Knob::Cap | Knob::Both => SearchStep::SetCap(back),
                    };
                }
                self.stage = Stage::Done;
                let result = self.keep_better();
                SearchStep::Finish {
                    apply_w: result.best.cap_w,
                    result: Box::new(result),
                }
            }
            other => other,
        }
    }

    /// The result whose best saves more cost against its own default (a missing saving counts
    /// as none; on a tie the first searched, the cap), with the other in its `other`.
    fn keep_better(&mut self) -> TuneResult {
        let mut results = std::mem::take(&mut self.results);
        let saving = |r: &TuneResult| r.cost_saving_pct.unwrap_or(0.0);
        let win = (1..results.len()).fold(0, |best, i| {
            if saving(&results[i]) > saving(&results[best]) {
                i
            } else {
                best
            }
        });
        let mut winner = results.remove(win);
        winner.other = results.pop().map(Box::new);
        winner
    }
}

impl Search for KnobSearch {
    fn start(&mut self, now: &Observation) -> SearchStep {
        let step = self.stages[0].1.start(now);
        self.on_knob(0, step)
    }

    fn observe(&mut self, obs: &Observation) -> Option<SearchStep> {
        match self.stage {
            Stage::Searching(i) => {
                let step = self.stages[i].1.observe(obs)?;
                Some(self.on_knob(i, step))
            }
            Stage::Between(i) => {
                self.stage = Stage::Searching(i);
                let step = self.stages[i].1.start(obs);
                Some(self.on_knob(i, step))
            }
            Stage::Done => None,
        }
    }

    fn cancel(&mut self) -> Option<SearchStep> {
        match self.stage {
            Stage::Searching(i) => {
                let first = self.stages[0].1.config().start_w;
                // Whatever stage: the driver puts every changed knob back.
                self.stages[i]
                    .1
                    .cancel()
                    .map(|_| SearchStep::Restore(first))
            }
            Stage::Between(_) => {
                self.stage = Stage::Done;
                Some(SearchStep::Restore(self.stages[0].1.config().start_w))
            }
            Stage::Done => None,
        }
    }

    fn progress(&self) -> Progress {
        let i = match self.stage {
            Stage::Searching(i) | Stage::Between(i) => i,
            Stage::Done => self.stages.len() - 1,
        };
        let (knob, tuner) = &self.stages[i];
        Progress {
            knob: *knob,
            ..tuner.progress()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::search::{TunerConfig, Window};
    use super::*;

    /// A GPU whose kernel draws less than the lowest cap, so the cap never binds, while a
    /// locked clock does: energy per sample falls with the clock to 1400 MHz and rises below;
    /// time rises as it falls.
    struct Gpu {
        obs: Observation,
        cap_w: f64,
        clock_mhz: f64,
    }

    impl Gpu {
        fn step(&mut self) -> Observation {
            // The cap binds only below 180 W (the kernel draws that at full clock).
            let f = self.clock_mhz.min(1980.0 * (self.cap_w / 180.0).min(1.0));
            let x = (f - 1400.0) / 300.0;
            let joules = 2.0 + 0.4 * x * x;
            let seconds = 0.01 * 1980.0 / f;
            self.obs.time_s += 16.0 * seconds;
            self.obs.energy_j += 16.0 * joules;
            self.obs.samples += 16.0;
            self.obs.steps = self.obs.steps.map(|s| s + 1.0);
            self.obs
        }
    }

    fn drive(s: &mut KnobSearch, gpu: &mut Gpu) -> (Vec<SearchStep>, TuneResult) {
        let mut seen = Vec::new();
        let mut act = Some(s.start(&gpu.obs));
        for _ in 0..100_000 {
            match act.take() {
                Some(SearchStep::SetCap(w)) => gpu.cap_w = w,
                Some(SearchStep::SetClock(f)) => gpu.clock_mhz = f,
                Some(SearchStep::Finish { result, .. }) => return (seen, *result),
                Some(other) => panic!("{other:?}"),
                None => {}
            }
            if let Some(a) = s.observe(&gpu.step()) {
                seen.push(a.clone());
                act = Some(a);
            }
        }
        panic!("the search never ended")
    }

    fn gpu() -> Gpu {
        Gpu {
            obs: Observation {
                time_s: 0.0,
                steps: Some(0.0),
                energy_j: 0.0,
                samples: 0.0,
                batch: None,
                oom: false,
            },
            cap_w: 700.0,
            clock_mhz: 1980.0,
        }
    }

    fn configs() -> (TunerConfig, TunerConfig) {
        let mut cap = TunerConfig::new(200.0, 700.0, 700.0, 700.0, 1);
        cap.eta = 1.0;
        let (floor, step) = clock_plan(345.0, 1980.0, None);
        let mut clocks = TunerConfig::new(floor, 1980.0, 1980.0, 1980.0, 1);
        clocks.step_w = step;
        clocks.eta = 1.0;
        clocks.max_power_w = cap.max_power_w;
        clocks.window = Window::GOLDEN_STEPS;
        (cap, clocks)
    }

    #[test]
    fn the_clock_plan_runs_from_the_top_to_half_of_it_on_the_grid() {
        assert_eq!(clock_plan(345.0, 1980.0, None), (990.0, 90.0));
        assert_eq!(clock_plan(1200.0, 1980.0, Some(30.0)), (1200.0, 30.0));
        let (floor, step) = clock_plan(135.0, 1530.0, None);
        assert_eq!((floor % 15.0, step % 15.0), (0.0, 0.0));
    }

    #[test]
    fn the_clock_search_sets_clocks_and_finds_the_clock_minimum() {
        let (_, clocks) = configs();
        let mut s = KnobSearch::clocks(Tuner::new(clocks).unwrap());
        let (steps, r) = drive(&mut s, &mut gpu());
        assert!(
            steps.iter().all(|s| !matches!(s, SearchStep::SetCap(_))),
            "{steps:?}"
        );
        assert_eq!(r.knob, Knob::Clocks);
        // The plan's clocks nearest 1400 MHz: 1350 and 1440 (1980 − k·90).
        assert!([1350.0, 1440.0].contains(&r.best.cap_w), "{r:?}");
        assert!(r.energy_saving_pct.unwrap() > 10.0, "{r:?}");
        assert!(r.summary().contains("MHz"), "{}", r.summary());
    }

    #[test]
    fn both_knobs_are_searched_and_the_better_kept_with_the_other_beside_it() {
        let (cap, clocks) = configs();
        let mut s = KnobSearch::both(Tuner::new(cap).unwrap(), Tuner::new(clocks).unwrap());
        let mut g = gpu();
        let (steps, r) = drive(&mut s, &mut g);
        // The cap search first, its cap put back, then the clocks.
        let first_clock = steps
            .iter()
            .position(|s| matches!(s, SearchStep::SetClock(_)))
            .unwrap();
        assert_eq!(
            steps[first_clock - 1],
            SearchStep::SetCap(700.0),
            "{steps:?}"
        );
        assert!(
            steps[first_clock..]
                .iter()
                .all(|s| !matches!(s, SearchStep::SetCap(_))),
            "{steps:?}"
        );
        // The clock binds where the cap does not: the clocks win.
        assert_eq!(r.knob, Knob::Clocks, "{r:?}");
        let other = r.other.as_deref().expect("the cap's result beside it");
        assert_eq!(other.knob, Knob::Cap);
        assert!(
            r.cost_saving_pct.unwrap() > other.cost_saving_pct.unwrap(),
            "{r:?}"
        );
        assert_eq!(s.progress().knob, Knob::Clocks);
    }

    #[test]
    fn cancelling_between_the_two_asks_for_everything_back() {
        let (cap, clocks) = configs();
        let mut s = KnobSearch::both(Tuner::new(cap).unwrap(), Tuner::new(clocks).unwrap());
        let mut g = gpu();
        let mut act = Some(s.start(&g.obs));
        loop {
            if let Some(SearchStep::SetCap(w)) = act.take() {
                g.cap_w = w;
            }
            if matches!(s.stage, Stage::Between(_)) {
                break;
            }
            act = s.observe(&g.step());
        }
        assert_eq!(s.cancel(), Some(SearchStep::Restore(700.0)));
        assert_eq!(s.cancel(), None);
    }
}
