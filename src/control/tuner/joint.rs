//! The joint search of batch size and power cap (`tune energy RUN --with batch-size`), scored
//! by the same Zeus cost per sample as the cap search.
//!
//! A 2-D sweep measures every cap at every batch: 21 caps × 4 batches is 84 windows, hours of
//! training at poor settings. This search measures far fewer, on two observations about the
//! cost surface:
//!
//! - **Over batch sizes it is unimodal**: a larger batch amortizes the per-step overhead
//!   (kernel launches, the optimizer step) until the loader or memory stops it, so the cost
//!   falls, then flattens or rises. The batches are a coarse geometric set around the run's
//!   (×2 and ÷2 within the profile's `[knobs.batch_size]` range and the memory the advisor
//!   predicts), walked as a line search: from the starting batch upwards while each batch
//!   beats every one before it, then (if going up did not help) downwards the same way.
//!   Which batch comes next depends only on the batches finished and their best costs
//!   ([`next_batch`]), so a search resumed after a restart picks up where it was.
//! - **The best cap moves little with the batch**: the clock that balances static power
//!   against the V² term is a property of the GPU more than of the step. So each batch after
//!   the first runs the golden cap search ([`Tuner`]) bracketed around the best cap so far
//!   (three grid steps either side, the walk at the end going further if needed), without
//!   measuring the default cap again: about four windows instead of seven. The default cap is
//!   measured once, at the starting batch: every saving is reported against it.
//!
//! An out-of-memory (the trainer's OOM, a restart, or a rank refusing the batch as too large)
//! while a batch is being tried or measured ends that batch's probe: the last good batch is
//! asked back, that batch and every larger one are avoided from then on, and the walk goes on
//! downwards (or ends).
//!
//! Pure, like [`Tuner`]: [`Observation`]s in (with the batch the run trains at and whether it
//! ran out of memory), [`SearchStep`]s out.

use serde::{Deserialize, Serialize};

use super::search::{
    CapPoint, Observation, Phase, Progress, Search, SearchStep, TuneResult, Tuner, TunerConfig,
    TunerError, Unit,
};

/// Said before a search that changes the batch size (the CLI and the console).
pub const BATCH_WARNING: &str = "changing the batch size changes training dynamics: the \
learning rate usually needs scaling with it, convergence (and the final accuracy) may differ, and \
an epoch becomes fewer or more steps; the search tries batches live on this run, and the result is \
a suggestion for the profile, not a verdict on the model";

/// The most batch sizes either side of the starting one.
const MAX_STEPS_EACH_WAY: usize = 4;

/// The batch sizes a joint search may try, ascending: the starting batch, doubled and halved
/// within `min..=max` (at most [`MAX_STEPS_EACH_WAY`] each way).
pub fn batch_plan(start: u32, min: u32, max: u32) -> Vec<u32> {
    let mut out = vec![start];
    let mut b = start;
    for _ in 0..MAX_STEPS_EACH_WAY {
        match b.checked_mul(2).filter(|n| *n <= max) {
            Some(n) => {
                out.push(n);
                b = n;
            }
            None => break,
        }
    }
    let mut b = start;
    for _ in 0..MAX_STEPS_EACH_WAY {
        let n = b / 2;
        if n == 0 || n < min.max(1) {
            break;
        }
        out.push(n);
        b = n;
    }
    out.sort_unstable();
    out
}

/// The next batch to search, given those finished (`done`: batch and its best cost), the
/// smallest batch that ran out of memory, and the plan (ascending); `None` when the walk is
/// over. From `start` upwards while the highest batch tried is the best so far, then
/// downwards while the lowest one is.
pub fn next_batch(plan: &[u32], start: u32, done: &[(u32, f64)], oom: Option<u32>) -> Option<u32> {
    if done.is_empty() {
        return Some(start);
    }
    let best = done
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|d| d.0)?;
    let fits = |b: &&u32| oom.is_none_or(|o| **b < o) && !done.iter().any(|d| d.0 == **b);
    let top = done.iter().map(|d| d.0).max()?;
    if top == best {
        if let Some(up) = plan.iter().filter(|b| **b > top).find(fits) {
            return Some(*up);
        }
    }
    let bottom = done.iter().map(|d| d.0).min()?;
    if bottom == best && best <= start {
        return plan
            .iter()
            .rev()
            .filter(|b| **b < bottom)
            .find(fits)
            .copied();
    }
    None
}

/// The batch dimension of a joint search's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchOutcome {
    /// The batch the run trained at before the search (the reference of every saving).
    pub start: u32,
    /// The best batch (at the best cap).
    pub best: u32,
    /// The batches the search could try, ascending.
    pub planned: Vec<u32>,
    /// Each batch searched, in order, with its best cap and cost.
    pub searched: Vec<BatchBest>,
    /// The smallest batch that ran out of memory: it and larger ones were avoided.
    pub oom: Option<u32>,
}

/// One batch's best cap.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BatchBest {
    pub batch: u32,
    pub cap_w: f64,
    pub cost: f64,
}

/// Where a joint search stands in the batch dimension (beside [`Progress`]'s caps).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchProgress {
    pub start: u32,
    /// The batch being tried or measured.
    pub current: Option<u32>,
    pub planned: Vec<u32>,
    /// Batches whose cap search finished, in order.
    pub done: Vec<BatchBest>,
    pub oom: Option<u32>,
    /// The last batch measured through without running out of memory (the starting batch
    /// until one is): what an out-of-memory goes back to.
    pub last_good: u32,
}

#[derive(Debug, Clone)]
enum State {
    NotStarted,
    /// The batch is asked for (`asked`) and awaited in the reports; then `warmup` units from
    /// `from` (the coordinate when it showed) before its cap search starts.
    Switching {
        batch: u32,
        asked: bool,
        from: Option<f64>,
    },
    Searching {
        batch: u32,
        inner: Box<Tuner>,
    },
    Done,
    Cancelled,
}

/// The joint search. See the module doc.
#[derive(Debug, Clone)]
pub struct JointTuner {
    cfg: TunerConfig,
    plan: Vec<u32>,
    start_batch: u32,
    /// Every cap point measured, each with its batch.
    points: Vec<CapPoint>,
    done: Vec<BatchBest>,
    oom: Option<u32>,
    last_good: u32,
    /// The cap in force.
    cap_w: f64,
    state: State,
    started_s: f64,
    /// Caps in one batch's plan.
    caps_planned: usize,
}

impl JointTuner {
    /// A joint search from `start_batch` over `plan` (ascending, containing it), the caps as
    /// `cfg` says (its `start_w`: the cap in force).
    pub fn new(
        cfg: TunerConfig,
        plan: Vec<u32>,
        start_batch: u32,
    ) -> Result<JointTuner, TunerError> {
        let caps_planned = Tuner::new(cfg.clone())?.plan().len();
        if !plan.contains(&start_batch) || plan.windows(2).any(|w| w[0] >= w[1]) {
            return Err(TunerError::Config(
                "the batch plan must be ascending and hold the starting batch".into(),
            ));
        }
        Ok(JointTuner {
            cap_w: cfg.start_w,
            cfg,
            plan,
            start_batch,
            points: Vec::new(),
            done: Vec::new(),
            oom: None,
            last_good: start_batch,
            state: State::NotStarted,
            started_s: 0.0,
            caps_planned,
        })
    }

    /// A search resumed after a restart: the batches finished, the points measured (a batch
    /// in progress reuses its own) and the memory limit found are kept.
    pub fn resumed(mut self, points: &[CapPoint], progress: Option<&BatchProgress>) -> JointTuner {
        self.points = points
            .iter()
            .filter(|p| p.batch.is_some())
            .copied()
            .collect();
        if let Some(b) = progress {
            self.done = b.done.clone();
            self.oom = b.oom;
        }
        // The run is back at its starting batch (a resumed search restores it first).
        self.last_good = self.start_batch;
        self
    }

    pub fn plan(&self) -> &[u32] {
        &self.plan
    }

    fn coord(&self, obs: &Observation) -> Option<f64> {
        match self.cfg.window.unit {
            Unit::Steps => obs.steps,
            Unit::Seconds => Some(obs.time_s),
        }
    }

    fn costs(&self) -> Vec<(u32, f64)> {
        self.done.iter().map(|d| (d.batch, d.cost)).collect()
    }

    fn best(&self) -> Option<BatchBest> {
        self.done
            .iter()
            .min_by(|a, b| a.cost.total_cmp(&b.cost))
            .copied()
    }

    /// The cap search for `batch`: bracketed around the best cap so far, the default cap
    /// measured at the starting batch only, the points of `batch` measured already reused.
    fn inner_for(&self, batch: u32) -> Result<Tuner, TunerError> {
        let cfg = TunerConfig {
            start_w: self.cap_w,
            prior_w: self.best().map(|b| b.cap_w).or(self.cfg.prior_w),
            measure_default: batch == self.start_batch,
            ..self.cfg.clone()
        };
        let mine: Vec<CapPoint> = self
            .points
            .iter()
            .filter(|p| p.batch == Some(batch))
            .copied()
            .collect();
        Ok(Tuner::new(cfg)?.with_points(&mine))
    }

    /// Go to the next batch, or finish.
    fn next(&mut self, obs: &Observation) -> SearchStep {
        match next_batch(&self.plan, self.start_batch, &self.costs(), self.oom) {
            Some(b) => {
                let asked = obs.batch == Some(b);
                self.state = State::Switching {
                    batch: b,
                    asked,
                    from: None,
                };
                if asked {
                    // Already there: the observation after this one starts its warm-up.
                    return SearchStep::SetCap(self.cap_w);
                }
                self.state = State::Switching {
                    batch: b,
                    asked: true,
                    from: None,
                };
                SearchStep::SetBatch(b)
            }
            None => self.finish(obs),
        }
    }

    fn finish(&mut self, obs: &Observation) -> SearchStep {
        let Some(best) = self.best() else {
            // Nothing measured at all (every batch ran out of memory): back to the start.
            self.state = State::Cancelled;
            return SearchStep::Restore(self.cfg.start_w);
        };
        let point = self
            .points
            .iter()
            .filter(|p| p.batch == Some(best.batch))
            .min_by(|a, b| a.cost.total_cmp(&b.cost))
            .copied();
        let Some(point) = point else {
            self.state = State::Cancelled;
            return SearchStep::Restore(self.cfg.start_w);
        };
        let default = self
            .points
            .iter()
            .find(|p| {
                p.batch == Some(self.start_batch) && (p.cap_w - self.cfg.default_w).abs() < 0.5
            })
            .copied();
        let pct = |base: f64, new: f64| 100.0 * (base - new) / base;
        let result = TuneResult {
            eta: self.cfg.eta,
            max_power_w: self.cfg.max_power_w,
            window: self.cfg.window,
            start_w: self.cfg.start_w,
            default_w: self.cfg.default_w,
            best: point,
            default,
            curve: self.points.clone(),
            energy_saving_pct: default
                .map(|d| pct(d.energy_per_sample_j, point.energy_per_sample_j)),
            time_change_pct: default.map(|d| -pct(d.time_per_sample_s, point.time_per_sample_s)),
            cost_saving_pct: default.map(|d| pct(d.cost, point.cost)),
            saving_uncertainty_pct: super::search::saving_uncertainty(&point, default.as_ref()),
            confidence: None,
            knob: super::knob::Knob::Cap,
            other: None,
            stopped_early: true,
            strategy: self.cfg.strategy,
            planned: self.caps_planned * self.plan.len(),
            duration_s: obs.time_s - self.started_s,
            batch: Some(BatchOutcome {
                start: self.start_batch,
                best: best.batch,
                planned: self.plan.clone(),
                searched: self.done.clone(),
                oom: self.oom,
            }),
        };
        self.state = State::Done;
        SearchStep::Finish {
            apply_w: point.cap_w,
            result: Box::new(result),
        }
    }

    /// The run ran out of memory at `batch`: avoid it and larger ones, ask the last good batch
    /// back, and go on with the next batch once it shows.
    fn out_of_memory(&mut self, batch: u32, obs: &Observation) -> SearchStep {
        self.oom = Some(self.oom.map_or(batch, |o| o.min(batch)));
        self.points.retain(|p| p.batch != Some(batch));
        let good = self.last_good;
        if batch == good {
            // The batch the run trained at before this probe ran out of memory (its memory
            // grew): nothing to go back to; end with what was measured, or put things back.
            return self.finish(obs);
        }
        match next_batch(&self.plan, self.start_batch, &self.costs(), self.oom) {
            Some(b) => {
                self.state = State::Switching {
                    batch: b,
                    asked: b == good,
                    from: None,
                };
                SearchStep::SetBatch(good)
            }
            None => {
                // The walk is over: the finish sets the best batch, which fits.
                let step = self.finish(obs);
                match step {
                    SearchStep::Finish { .. } => step,
                    _ => SearchStep::SetBatch(good),
                }
            }
        }
    }
}

impl Search for JointTuner {
    fn start(&mut self, now: &Observation) -> SearchStep {
        self.started_s = now.time_s;
        let step = self.next(now);
        if let (SearchStep::SetCap(_), State::Switching { batch, .. }) = (&step, &self.state) {
            // The run trains at the first batch already, at the cap in force: its cap search
            // starts at once (as the cap search does at the cap in force).
            let batch = *batch;
            match self.inner_for(batch) {
                Ok(mut inner) => {
                    let s = inner.start(now);
                    if let SearchStep::SetCap(w) = s {
                        self.cap_w = w;
                    }
                    self.state = State::Searching {
                        batch,
                        inner: Box::new(inner),
                    };
                    return s;
                }
                Err(_) => return step,
            }
        }
        step
    }

    fn observe(&mut self, obs: &Observation) -> Option<SearchStep> {
        let coord = self.coord(obs);
        let warmup = self.cfg.window.warmup;
        match &mut self.state {
            State::Switching { batch, asked, from } => {
                let batch = *batch;
                if obs.oom {
                    return Some(self.out_of_memory(batch, obs));
                }
                if !*asked {
                    *asked = true;
                    return Some(SearchStep::SetBatch(batch));
                }
                if obs.batch != Some(batch) {
                    return None;
                }
                let p = coord?;
                let from = *from.get_or_insert(p);
                if p < from {
                    self.state = State::Switching {
                        batch,
                        asked: true,
                        from: Some(p),
                    };
                    return None;
                }
                if p - from < warmup {
                    return None;
                }
                let mut inner = match self.inner_for(batch) {
                    Ok(t) => t,
                    Err(_) => return Some(self.finish(obs)),
                };
                let step = inner.start(obs);
                if let SearchStep::SetCap(w) = step {
                    self.cap_w = w;
                }
                self.state = State::Searching {
                    batch,
                    inner: Box::new(inner),
                };
                Some(step)
            }
            State::Searching { batch, inner } => {
                let batch = *batch;
                if obs.oom {
                    return Some(self.out_of_memory(batch, obs));
                }
                let step = inner.observe(obs)?;
                let curve = inner.progress().curve;
                match step {
                    SearchStep::SetCap(w) => {
                        self.record(batch, curve);
                        self.cap_w = w;
                        Some(SearchStep::SetCap(w))
                    }
                    SearchStep::Finish { result, .. } => {
                        self.record(batch, result.curve.clone());
                        self.done.push(BatchBest {
                            batch,
                            cap_w: result.best.cap_w,
                            cost: result.best.cost,
                        });
                        // Measured through without running out of memory.
                        self.last_good = batch;
                        Some(self.next(obs))
                    }
                    other => Some(other),
                }
            }
            State::NotStarted | State::Done | State::Cancelled => None,
        }
    }

    fn cancel(&mut self) -> Option<SearchStep> {
        match self.state {
            State::Switching { .. } | State::Searching { .. } => {
                self.state = State::Cancelled;
                Some(SearchStep::Restore(self.cfg.start_w))
            }
            State::NotStarted => {
                self.state = State::Cancelled;
                None
            }
            State::Done | State::Cancelled => None,
        }
    }

    fn progress(&self) -> Progress {
        let (mut p, current) = match &self.state {
            State::Searching { inner, batch } => (inner.progress(), Some(*batch)),
            State::Switching { batch, .. } => (
                Progress {
                    phase: Phase::WarmUp,
                    cap_w: Some(self.cap_w),
                    index: self.points.len(),
                    planned: 0,
                    fraction: 0.0,
                    curve: Vec::new(),
                    best_cap_w: None,
                    batch: None,
                    knob: super::knob::Knob::Cap,
                },
                Some(*batch),
            ),
            State::NotStarted | State::Done | State::Cancelled => (
                Progress {
                    phase: match self.state {
                        State::Done => Phase::Done,
                        State::Cancelled => Phase::Cancelled,
                        _ => Phase::NotStarted,
                    },
                    cap_w: None,
                    index: self.points.len(),
                    planned: 0,
                    fraction: if matches!(self.state, State::Done) {
                        1.0
                    } else {
                        0.0
                    },
                    curve: Vec::new(),
                    best_cap_w: None,
                    batch: None,
                    knob: super::knob::Knob::Cap,
                },
                None,
            ),
        };
        // The whole curve, every batch's points (the one in progress's included).
        let mut curve = self.points.clone();
        for c in p.curve.iter_mut() {
            c.batch = current;
            if !curve
                .iter()
                .any(|q| q.batch == c.batch && (q.cap_w - c.cap_w).abs() < 0.5)
            {
                curve.push(*c);
            }
        }
        p.index = curve.len();
        p.planned = self.caps_planned * self.plan.len();
        p.best_cap_w = curve
            .iter()
            .min_by(|a, b| a.cost.total_cmp(&b.cost))
            .map(|c| c.cap_w);
        p.curve = curve;
        p.batch = Some(BatchProgress {
            start: self.start_batch,
            current,
            planned: self.plan.clone(),
            done: self.done.clone(),
            oom: self.oom,
            last_good: self.last_good,
        });
        p
    }
}

impl JointTuner {
    /// Keep `curve` (a batch's points so far) among the points, marked with the batch.
    fn record(&mut self, batch: u32, curve: Vec<CapPoint>) {
        for mut c in curve {
            c.batch = Some(batch);
            if !self
                .points
                .iter()
                .any(|q| q.batch == Some(batch) && (q.cap_w - c.cap_w).abs() < 0.5)
            {
                self.points.push(c);
            }
        }
    }

    pub fn phase(&self) -> Phase {
        self.progress().phase
    }
}

#[cfg(test)]
mod tests;
