//! The tuner on a simulated GPU, in simulated time, and the exhaustive sweep it is judged by.
//!
//! One gpusim GPU trains a model; the harness sets each cap the [`Tuner`] asks for through
//! gpusim, advances the node, and feeds back the GPU's energy counter and the training's step
//! and sample counts. Each search ([`Strategy`]: the golden search, the first search that
//! descends from the maximum, the sweep of every cap) runs on its own node. The
//! simulator's own optimum comes from [`gpusim::power`], which computes the steady state
//! (no loader stalls) instead of measuring it.

use gpusim::{Node, NodeConfig, SimError, TrainingConfig, find};

use super::joint::{JointTuner, batch_plan};
use super::knob::{Knob, KnobSearch};
use super::search::{
    Observation, Search, SearchStep, Strategy, TuneResult, TuneSettings, Tuner, TunerConfig,
    TunerError, Window, zeus_cost,
};

/// Why a simulated search could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("simulator: {0}")]
    Sim(#[from] SimError),
    #[error(transparent)]
    Tuner(#[from] TunerError),
    #[error("the search had not ended after {0:.0} simulated seconds")]
    NoEnd(f64),
}

/// A GPU and a training job.
#[derive(Debug, Clone, PartialEq)]
pub struct SimCase {
    /// gpusim catalog id.
    pub gpu: &'static str,
    /// gpusim model id.
    pub model: &'static str,
    pub batch_size: u32,
}

impl SimCase {
    pub const fn new(gpu: &'static str, model: &'static str, batch_size: u32) -> SimCase {
        SimCase {
            gpu,
            model,
            batch_size,
        }
    }
}

/// How the harness runs the search. Each strategy measures with its own default window
/// ([`Window::default_for`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SimSettings {
    pub eta: f64,
    pub step_w: f64,
    /// gpusim's time step, seconds.
    pub sim_step_s: f64,
    pub seed: u64,
}

impl Default for SimSettings {
    /// The search's defaults ([`TuneSettings`]), 10 ms simulation steps.
    fn default() -> SimSettings {
        let t = TuneSettings::default();
        SimSettings {
            eta: t.eta,
            step_w: t.step_w,
            sim_step_s: 0.01,
            seed: 1,
        }
    }
}

/// A search carried out on the simulator.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRun {
    pub result: TuneResult,
    /// Simulated seconds from the start to the end of the search.
    pub sim_time_s: f64,
}

/// One search judged by the sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    pub run: SimRun,
    /// Its cap as the sweep measured it, cost per sample, J.
    pub cost: f64,
    /// `(cost − sweep's best) / sweep's best`, percent.
    pub gap_pct: f64,
    /// Its time over the sweep's.
    pub time_fraction: f64,
    /// Caps it measured.
    pub probes: usize,
}

/// The golden search and the first search against the sweep and the model's computed optimum.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub case: SimCase,
    /// The golden search (the default).
    pub golden: Judged,
    /// The first search: from the maximum down, early stop, whole windows.
    pub descend: Judged,
    pub sweep: SimRun,
    pub sweep_best_cost: f64,
    /// gpusim's steady-state optimum of the same cost over whole watts: (cap, J/sample).
    pub model_cost_optimum: (f64, f64),
    /// gpusim's energy-only optimum ([`gpusim::energy_optimal_cap_w`]): (cap, J/sample).
    pub model_energy_optimum: (f64, f64),
}

/// A one-GPU node training `case` under the default cap.
fn node_for(case: &SimCase, s: &SimSettings) -> Result<Node, SimError> {
    Node::new(&NodeConfig {
        gpus: vec![case.gpu.to_string()],
        ambient_c: 25.0,
        seed: s.seed,
        step_s: s.sim_step_s,
        training: Some(TrainingConfig {
            model: case.model.to_string(),
            batch_size: case.batch_size,
            prefetch_depth: 2,
            workers: 8,
        }),
    })
}

fn observe(node: &Node) -> Observation {
    let gpu = &node.gpus()[0];
    let t = gpu.training();
    Observation {
        time_s: node.time_s(),
        steps: t.map(|t| t.step as f64),
        energy_j: gpu.reading().energy_mj as f64 / 1000.0,
        samples: t.map_or(0.0, |t| t.samples_seen),
        batch: t.map(|t| t.config.batch_size),
        oom: t.is_some_and(|t| t.oom),
    }
}

/// Carry out `step` on the node: a cap, or a batch (which clears an out-of-memory, as a
/// trainer that restarts with a batch that fits).
fn act(node: &mut Node, step: &SearchStep) -> Result<(), SimError> {
    match step {
        SearchStep::SetCap(w) | SearchStep::Restore(w) => {
            node.try_gpu_mut(0)?.set_power_limit_w(*w)
        }
        SearchStep::SetBatch(b) => {
            if let Some(t) = node.try_gpu_mut(0)?.training_mut() {
                t.config.batch_size = *b;
                t.oom = false;
            }
            Ok(())
        }
        SearchStep::SetClock(f) => lock_clock(node, *f),
        SearchStep::Finish { apply_w, result } => {
            match result.knob {
                super::Knob::Clocks => lock_clock(node, *apply_w)?,
                _ => node.try_gpu_mut(0)?.set_power_limit_w(*apply_w)?,
            }
            if let Some(o) = result
                .other
                .as_deref()
                .filter(|o| o.knob == super::Knob::Clocks)
            {
                lock_clock(node, o.start_w)?;
            }
            if let Some(b) = &result.batch {
                act(node, &SearchStep::SetBatch(b.best))?;
            }
            Ok(())
        }
    }
}

/// Lock GPU 0's SM clocks from its lowest up to `mhz`; its highest clock unlocks them.
fn lock_clock(node: &mut Node, mhz: f64) -> Result<(), SimError> {
    let gpu = node.try_gpu_mut(0)?;
    let (lo, hi) = (gpu.spec().sm_clock_min_mhz, gpu.spec().sm_clock_max_mhz);
    if mhz >= f64::from(hi) {
        gpu.reset_locked_clocks();
        Ok(())
    } else {
        gpu.set_locked_clocks(lo, mhz.round() as u32)
    }
}

/// Drive `search` on `node` to its end; the result and the simulated time it took.
fn drive_sim(
    node: &mut Node,
    search: &mut dyn Search,
    limit_s: f64,
) -> Result<SimRun, HarnessError> {
    // The run has been training for a while before anyone tunes it.
    node.advance_to(10.0);
    let t0 = node.time_s();
    let mut action = search.start(&observe(node));
    loop {
        act(node, &action)?;
        match action {
            SearchStep::Finish { result, .. } => {
                return Ok(SimRun {
                    sim_time_s: node.time_s() - t0,
                    result: *result,
                });
            }
            SearchStep::Restore(_) => return Err(HarnessError::NoEnd(node.time_s() - t0)),
            SearchStep::SetCap(_) | SearchStep::SetClock(_) | SearchStep::SetBatch(_) => {}
        }
        action = loop {
            node.step();
            if node.time_s() > t0 + limit_s {
                return Err(HarnessError::NoEnd(node.time_s() - t0));
            }
            if let Some(a) = search.observe(&observe(node)) {
                break a;
            }
        };
    }
}

/// Run a search as `strategy` chooses on a fresh node.
pub fn run_on_sim(
    case: &SimCase,
    s: &SimSettings,
    strategy: Strategy,
) -> Result<SimRun, HarnessError> {
    let spec = find(case.gpu).ok_or_else(|| SimError::UnknownGpu(case.gpu.to_string()))?;
    let mut node = node_for(case, s)?;
    let mut cfg = TunerConfig::new(
        spec.power_min_w,
        spec.power_default_w,
        spec.power_max_w,
        spec.power_default_w,
        1,
    )
    .with_strategy(strategy);
    cfg.eta = s.eta;
    cfg.step_w = s.step_w;
    cfg.window = Window::default_for(strategy, false);
    let mut tuner = Tuner::new(cfg)?;
    // Enough for any plan: a cap's window is a few minutes at most on the slowest case.
    let limit_s = tuner.plan().len() as f64 * 3600.0;
    drive_sim(&mut node, &mut tuner, limit_s)
}

/// The search of `knob` on a fresh node, with `strategy` (the clocks' plan from the GPU's
/// SM clock range, [`super::knob::clock_plan`]); `--knob both` runs the golden cap search and
/// then the clocks searched with `strategy`.
pub fn knob_on_sim(
    case: &SimCase,
    s: &SimSettings,
    knob: Knob,
    strategy: Strategy,
) -> Result<SimRun, HarnessError> {
    let spec = find(case.gpu).ok_or_else(|| SimError::UnknownGpu(case.gpu.to_string()))?;
    let mut node = node_for(case, s)?;
    let mut caps = TunerConfig::new(
        spec.power_min_w,
        spec.power_default_w,
        spec.power_max_w,
        spec.power_default_w,
        1,
    );
    caps.eta = s.eta;
    caps.step_w = s.step_w;
    let (lo, hi) = (
        f64::from(spec.sm_clock_min_mhz),
        f64::from(spec.sm_clock_max_mhz),
    );
    let (floor, step) = super::knob::clock_plan(lo, hi, None);
    let clocks = TunerConfig {
        min_w: floor,
        max_w: hi,
        default_w: hi,
        start_w: hi,
        step_w: step,
        ..caps.clone().with_strategy(strategy)
    };
    let clocks = TunerConfig {
        window: Window::default_for(strategy, false),
        ..clocks
    };
    let mut search = match knob {
        Knob::Cap => return run_on_sim(case, s, strategy),
        Knob::Clocks => KnobSearch::clocks(Tuner::new(clocks)?),
        Knob::Both => KnobSearch::both(Tuner::new(caps)?, Tuner::new(clocks)?),
    };
    drive_sim(&mut node, &mut search, 100.0 * 3600.0)
}

/// A joint search's case: a GPU, a workload, the batch it trains at and the profile's
/// `[knobs.batch_size]` range.
#[derive(Debug, Clone, PartialEq)]
pub struct JointCase {
    pub gpu: &'static str,
    pub model: &'static str,
    pub start: u32,
    pub min: u32,
    pub max: u32,
}

impl JointCase {
    pub const fn new(
        gpu: &'static str,
        model: &'static str,
        start: u32,
        min: u32,
        max: u32,
    ) -> JointCase {
        JointCase {
            gpu,
            model,
            start,
            min,
            max,
        }
    }

    /// The batches the joint search may try.
    pub fn plan(&self) -> Vec<u32> {
        batch_plan(self.start, self.min, self.max)
    }
}

/// The joint search of batch size and cap on a fresh node training at `case.start`. No
/// memory headroom is predicted here: a batch that does not fit runs out of memory in gpusim,
/// and the search has to cope.
pub fn joint_on_sim(case: &JointCase, s: &SimSettings) -> Result<SimRun, HarnessError> {
    let spec = find(case.gpu).ok_or_else(|| SimError::UnknownGpu(case.gpu.to_string()))?;
    let mut node = node_for(&SimCase::new(case.gpu, case.model, case.start), s)?;
    let mut cfg = TunerConfig::new(
        spec.power_min_w,
        spec.power_default_w,
        spec.power_max_w,
        spec.power_default_w,
        1,
    );
    cfg.eta = s.eta;
    cfg.step_w = s.step_w;
    let plan = case.plan();
    let caps = Tuner::new(cfg.clone())?.plan().len();
    let mut joint = JointTuner::new(cfg, plan.clone(), case.start)?;
    drive_sim(&mut node, &mut joint, (caps * plan.len()) as f64 * 3600.0)
}

/// A joint search judged by the exhaustive 2-D sweep (every cap at every batch that fits).
#[derive(Debug, Clone, PartialEq)]
pub struct JointComparison {
    pub case: JointCase,
    pub joint: SimRun,
    /// The joint search's (batch, cap) as the sweep measured it, J/sample.
    pub cost: f64,
    pub gap_pct: f64,
    pub time_fraction: f64,
    /// Points the joint search measured, and the sweep's.
    pub probes: usize,
    pub sweep_probes: usize,
    /// The sweep's best: (batch, cap, cost).
    pub sweep_best: (u32, f64, f64),
    pub sweep_time_s: f64,
}

/// The joint search against the 2-D sweep of `case`'s batches (each cap sweep on its own
/// node, with another seed, as in [`compare`]).
pub fn compare_joint(case: &JointCase, s: &SimSettings) -> Result<JointComparison, HarnessError> {
    let other = SimSettings {
        seed: s.seed.wrapping_add(1),
        ..s.clone()
    };
    let model = gpusim::find_model(case.model)
        .ok_or_else(|| SimError::UnknownModel(case.model.to_string()))?;
    let spec = find(case.gpu).ok_or_else(|| SimError::UnknownGpu(case.gpu.to_string()))?;
    let mut sweeps = Vec::new();
    for b in case.plan().into_iter().filter(|b| model.fits(spec, *b)) {
        sweeps.push((
            b,
            run_on_sim(
                &SimCase::new(case.gpu, case.model, b),
                &other,
                Strategy::Sweep,
            )?,
        ));
    }
    let sweep_time_s: f64 = sweeps.iter().map(|(_, r)| r.sim_time_s).sum();
    let sweep_probes = sweeps.iter().map(|(_, r)| r.result.curve.len()).sum();
    let sweep_best = sweeps
        .iter()
        .map(|(b, r)| (*b, r.result.best.cap_w, r.result.best.cost))
        .min_by(|a, b| a.2.total_cmp(&b.2))
        .ok_or_else(|| SimError::UnknownModel(format!("{}: no batch fits", case.model)))?;
    let joint = joint_on_sim(case, s)?;
    let (jb, jw) = (
        joint.result.batch.as_ref().map_or(case.start, |b| b.best),
        joint.result.best.cap_w,
    );
    let cost = sweeps
        .iter()
        .find(|(b, _)| *b == jb)
        .and_then(|(_, r)| r.result.curve.iter().find(|p| p.cap_w == jw))
        .map_or(joint.result.best.cost, |p| p.cost);
    Ok(JointComparison {
        case: case.clone(),
        cost,
        gap_pct: 100.0 * (cost - sweep_best.2) / sweep_best.2,
        time_fraction: joint.sim_time_s / sweep_time_s,
        probes: joint.result.curve.len(),
        sweep_probes,
        sweep_best,
        sweep_time_s,
        joint,
    })
}

/// The joint benchmark's cases: two workloads on three GPUs, from the batch the cap table
/// uses, within a range of ÷4 to ×8 (large enough that some batches run out of memory).
pub const JOINT_CASES: &[JointCase] = &[
    JointCase::new("h100-sxm", "resnet50", 256, 64, 2048),
    JointCase::new("h100-sxm", "bert-large", 16, 4, 128),
    JointCase::new("a100-sxm-80gb", "resnet50", 256, 64, 2048),
    JointCase::new("a100-sxm-80gb", "bert-large", 16, 4, 128),
    JointCase::new("v100-sxm2", "resnet50", 128, 32, 1024),
    JointCase::new("v100-sxm2", "bert-large", 8, 2, 64),
];

/// The joint comparisons as a Markdown table.
pub fn joint_table(rows: &[JointComparison]) -> String {
    let mut out = String::from(
        "| GPU | workload (batch range) | 2-D sweep best (points, time) | joint: batch, cap | gap | points | time share | out of memory | energy saved vs default cap and batch | time vs default |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in rows {
        let r = &c.joint.result;
        let b = r.batch.as_ref();
        out.push_str(&format!(
            "| {} | {} (from {}, {}–{}) | batch {}, {:.0} W ({}, {:.0} s) | batch {}, {:.0} W | {:.2}% | {} | {:.2} | {} | {:.1}% | {:+.1}% |\n",
            c.case.gpu,
            c.case.model,
            c.case.start,
            c.case.min,
            c.case.max,
            c.sweep_best.0,
            c.sweep_best.1,
            c.sweep_probes,
            c.sweep_time_s,
            b.map_or(c.case.start, |b| b.best),
            r.best.cap_w,
            c.gap_pct,
            c.probes,
            c.time_fraction,
            b.and_then(|b| b.oom).map_or("-".to_string(), |o| format!("batch {o}")),
            r.energy_saving_pct.unwrap_or(f64::NAN),
            r.time_change_pct.unwrap_or(f64::NAN),
        ));
    }
    out
}

/// gpusim's steady-state cost per sample at `cap_w` (no loader stalls), J.
pub fn model_cost(case: &SimCase, eta: f64, cap_w: f64) -> Option<f64> {
    let spec = find(case.gpu)?;
    let (j, s) = gpusim::energy_per_sample_at_cap(spec, case.model, case.batch_size, cap_w)?;
    Some(zeus_cost(eta, spec.power_max_w, j, s))
}

/// The searches, the sweep and the model's optimum for one case.
pub fn compare(case: &SimCase, s: &SimSettings) -> Result<Comparison, HarnessError> {
    let spec = find(case.gpu).ok_or_else(|| SimError::UnknownGpu(case.gpu.to_string()))?;
    // The sweep on an independent run (another seed, so other loader jitter): the gap then
    // includes the noise of measuring, not only what a search missed.
    let other = SimSettings {
        seed: s.seed.wrapping_add(1),
        ..s.clone()
    };
    let sweep = run_on_sim(case, &other, Strategy::Sweep)?;
    let sweep_best_cost = sweep.result.best.cost;
    let judge = |run: SimRun| {
        let chosen = run.result.best.cap_w;
        let cost = sweep
            .result
            .curve
            .iter()
            .find(|p| p.cap_w == chosen)
            .map_or(run.result.best.cost, |p| p.cost);
        Judged {
            cost,
            gap_pct: 100.0 * (cost - sweep_best_cost) / sweep_best_cost,
            time_fraction: run.sim_time_s / sweep.sim_time_s,
            probes: run.result.curve.len(),
            run,
        }
    };
    let golden = judge(run_on_sim(case, s, Strategy::Golden)?);
    let descend = judge(run_on_sim(case, s, Strategy::Descend)?);
    let no_fit = || SimError::UnknownModel(format!("{} batch {}", case.model, case.batch_size));
    let (lo, hi) = (
        spec.power_min_w.ceil() as u32,
        spec.power_max_w.floor() as u32,
    );
    let model_cost_optimum = (lo..=hi)
        .filter_map(|w| Some((f64::from(w), model_cost(case, s.eta, f64::from(w))?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .ok_or_else(no_fit)?;
    let (ecap, ej, _) =
        gpusim::energy_optimal_cap_w(spec, case.model, case.batch_size).ok_or_else(no_fit)?;
    Ok(Comparison {
        case: case.clone(),
        golden,
        descend,
        sweep,
        sweep_best_cost,
        model_cost_optimum,
        model_energy_optimum: (ecap, ej),
    })
}

/// The cases of the benchmark table: five GPUs, three workloads where they fit.
pub const BENCH_CASES: &[SimCase] = &[
    SimCase::new("h100-sxm", "resnet50", 256),
    SimCase::new("h100-sxm", "bert-large", 16),
    SimCase::new("h100-sxm", "gpt-1.3b", 8),
    SimCase::new("h200", "resnet50", 256),
    SimCase::new("h200", "bert-large", 16),
    SimCase::new("a100-sxm-80gb", "resnet50", 256),
    SimCase::new("a100-sxm-80gb", "bert-large", 16),
    SimCase::new("a100-sxm-80gb", "gpt-1.3b", 8),
    SimCase::new("v100-sxm2", "resnet50", 256),
    SimCase::new("v100-sxm2", "bert-large", 16),
    SimCase::new("rtx-4090", "resnet50", 256),
    SimCase::new("rtx-4090", "bert-large", 16),
];

/// The comparisons as a Markdown table: each search's cap, cost gap to the sweep's best,
/// caps measured and time as a share of the sweep's.
pub fn table(rows: &[Comparison]) -> String {
    let mut out = String::from(
        "| GPU | workload | sweep best (caps, time) | golden: cap, gap, caps, time share | descend: cap, gap, caps, time share | model optimum (cost / energy) | energy saved vs default (golden) | time vs default (golden) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let cell = |j: &Judged| {
        format!(
            "{:.0} W, {:.2}%, {}, {:.0} s = {:.2}",
            j.run.result.best.cap_w, j.gap_pct, j.probes, j.run.sim_time_s, j.time_fraction
        )
    };
    for c in rows {
        let r = &c.golden.run.result;
        out.push_str(&format!(
            "| {} | {} (batch {}) | {:.0} W ({}, {:.0} s) | {} | {} | {:.0} W / {:.0} W | {:.1}% | {:+.1}% |\n",
            c.case.gpu,
            c.case.model,
            c.case.batch_size,
            c.sweep.result.best.cap_w,
            c.sweep.result.curve.len(),
            c.sweep.sim_time_s,
            cell(&c.golden),
            cell(&c.descend),
            c.model_cost_optimum.0,
            c.model_energy_optimum.0,
            r.energy_saving_pct.unwrap_or(f64::NAN),
            r.time_change_pct.unwrap_or(f64::NAN),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The acceptance check: on three GPUs and two workloads the golden search's cap costs
    /// within 3% of the sweep's best in at most a third of its time and in fewer caps than the
    /// first search; the first search stays within 3% too, in less time than the sweep.
    #[test]
    fn tuner_is_within_three_percent_of_the_sweep_in_a_third_of_its_time() {
        let s = SimSettings::default();
        let mut fractions = Vec::new();
        for gpu in ["h100-sxm", "a100-sxm-80gb", "v100-sxm2"] {
            for (model, batch) in [("resnet50", 256), ("bert-large", 16)] {
                let c = compare(&SimCase::new(gpu, model, batch), &s).unwrap();
                let (g, d) = (&c.golden, &c.descend);
                assert!(g.gap_pct <= 3.0, "{gpu} {model}: gap {:.2}%", g.gap_pct);
                assert!(d.gap_pct <= 3.0, "{gpu} {model}: gap {:.2}%", d.gap_pct);
                assert!(
                    g.time_fraction <= 1.0 / 3.0,
                    "{gpu} {model}: {}",
                    g.time_fraction
                );
                assert!(
                    g.probes < d.probes,
                    "{gpu} {model}: {} vs {}",
                    g.probes,
                    d.probes
                );
                // Never more than the sweep (the two runs differ only by loader jitter).
                assert!(d.time_fraction < 1.02, "{gpu} {model}");
                fractions.push(d.time_fraction);
                let r = &g.run.result;
                // The saving is real and the cap inside the range, as the model predicts.
                assert!(r.cost_saving_pct.unwrap() > 0.0, "{gpu} {model}");
                assert!(r.energy_saving_pct.unwrap() > 0.0, "{gpu} {model}");
                let spec = find(gpu).unwrap();
                assert!(r.best.cap_w < spec.power_default_w, "{gpu} {model}");
                assert!(r.best.cap_w > spec.power_min_w, "{gpu} {model}");
                // Within 3% of the model's own optimum too, judged by the model.
                let (_, opt) = c.model_cost_optimum;
                let at = model_cost(&c.case, s.eta, r.best.cap_w).unwrap();
                assert!((at - opt) / opt < 0.03, "{gpu} {model}: {at} vs {opt}");
            }
        }
        let mean = fractions.iter().sum::<f64>() / fractions.len() as f64;
        assert!(mean < 0.75, "{fractions:?}");
    }

    /// The joint search against the 2-D sweep on two GPUs: within a few per cent of its best,
    /// in a fraction of its time and in fewer than half its points (the V100's cap range has
    /// seven caps, so a batch's golden search saves less there); the batch that runs out of
    /// memory is avoided.
    #[test]
    fn the_joint_search_is_within_a_few_percent_of_the_2d_sweep() {
        let s = SimSettings::default();
        for case in [
            JointCase::new("h100-sxm", "resnet50", 256, 64, 2048),
            JointCase::new("v100-sxm2", "bert-large", 8, 2, 64),
        ] {
            let c = compare_joint(&case, &s).unwrap();
            let what = format!("{} {}", case.gpu, case.model);
            assert!(c.gap_pct <= 3.0, "{what}: gap {:.2}%", c.gap_pct);
            assert!(c.time_fraction <= 0.35, "{what}: {}", c.time_fraction);
            assert!(
                c.probes * 2 < c.sweep_probes,
                "{what}: {} of {}",
                c.probes,
                c.sweep_probes
            );
            let b = c.joint.result.batch.clone().unwrap();
            let model = gpusim::find_model(case.model).unwrap();
            let spec = find(case.gpu).unwrap();
            assert!(model.fits(spec, b.best), "{what}: {b:?}");
            if let Some(o) = b.oom {
                assert!(!model.fits(spec, o), "{what}: {b:?}");
                assert!(c.joint.result.curve.iter().all(|p| p.batch.unwrap() < o));
            }
            assert!(c.joint.result.cost_saving_pct.unwrap() > 0.0, "{what}");
        }
    }

    /// The clock search on gpusim: within 3% of the sweep of every clock of its plan, in at
    /// most a third of its time; `--knob both` keeps the knob that saves more and says so.
    #[test]
    fn the_clock_search_is_within_three_percent_of_the_clock_sweep() {
        let s = SimSettings::default();
        for (gpu, model, batch) in [
            ("h100-sxm", "resnet50", 256),
            ("a100-sxm-80gb", "bert-large", 16),
        ] {
            let case = SimCase::new(gpu, model, batch);
            let other = SimSettings {
                seed: 2,
                ..s.clone()
            };
            let sweep = knob_on_sim(&case, &other, Knob::Clocks, Strategy::Sweep).unwrap();
            let golden = knob_on_sim(&case, &s, Knob::Clocks, Strategy::Golden).unwrap();
            let (r, w) = (&golden.result, &sweep.result);
            assert_eq!((r.knob, w.knob), (Knob::Clocks, Knob::Clocks));
            let best = w.best.cost;
            let chosen = w
                .curve
                .iter()
                .find(|p| p.cap_w == r.best.cap_w)
                .unwrap()
                .cost;
            let gap = 100.0 * (chosen - best) / best;
            let share = golden.sim_time_s / sweep.sim_time_s;
            eprintln!(
                "{gpu} {model}: clocks {} MHz (sweep {} MHz), gap {gap:.2}%, {} of {} clocks, \
                 time share {share:.2}, saving {:.1}%",
                r.best.cap_w,
                w.best.cap_w,
                r.curve.len(),
                w.curve.len(),
                r.cost_saving_pct.unwrap()
            );
            assert!(gap <= 3.0, "{gpu} {model}: gap {gap:.2}%");
            assert!(share <= 1.0 / 3.0 + 0.02, "{gpu} {model}: share {share:.2}");
            // Locked clocks save on gpusim as the cap does: the default is not the best.
            assert!(r.cost_saving_pct.unwrap() > 0.0, "{r:?}");
            let both = knob_on_sim(&case, &s, Knob::Both, Strategy::Golden)
                .unwrap()
                .result;
            let other = both.other.as_deref().expect("the other knob's result");
            assert_ne!(both.knob, other.knob);
            assert!(
                both.cost_saving_pct.unwrap() >= other.cost_saving_pct.unwrap(),
                "{both:?}"
            );
            assert!(
                both.summary().contains("kept over the"),
                "{}",
                both.summary()
            );
        }
    }

    #[test]
    fn the_measured_curve_follows_the_model() {
        // Where the loader keeps up, the measured cost at each cap is the model's steady state.
        let case = SimCase::new("a100-sxm-80gb", "bert-large", 16);
        let run = run_on_sim(&case, &SimSettings::default(), Strategy::Sweep).unwrap();
        for p in &run.result.curve {
            let m = model_cost(&case, 0.5, p.cap_w).unwrap();
            assert!(
                (p.cost - m).abs() / m < 0.03,
                "{} W: measured {:.3} model {m:.3}",
                p.cap_w,
                p.cost
            );
        }
    }
}
