//! The straggler of a data-parallel job: the rank every other rank waits for at each gradient
//! all-reduce, and why.
//!
//! Each rank reports its own step time (what its step would take alone: compute and data wait;
//! the synthetic trainer and the SDK report the wait for the others apart, as `sync_wait_s`).
//! Over each rank's newest [`REPORTS`] reports inside the window (at least [`MIN_REPORTS`] of
//! them, so one slow step is not a straggler), the rank with the longest median step is the
//! straggler when that median is at least [`RATIO`] times the median of the other ranks'. By
//! count, not by time: a rank reporting four times a second is judged on its last four seconds,
//! one reporting every ten seconds on its last minutes, and a straggler that recovered stops
//! being named as soon as its newest reports say so.
//!
//! The cause is read from its GPU's newest sample (the rank's `gpu` → the telemetry's GPU of
//! that index) against its siblings' (the other ranks' GPUs), in this order:
//!
//! 1. **thermal slowdown**: a thermal throttle reason, or the temperature at its slowdown
//!    threshold with the SM clock well below the siblings' → a thermal target a few degrees
//!    lower (the governor trades a little clock for no slowdown);
//! 2. **power cap**: the software power-cap reason (or the draw at the cap) with a cap below
//!    the siblings' or the clock below theirs → the siblings' cap;
//! 3. **degraded PCIe link**: a lower link generation or width than its siblings' (only where
//!    telemetry has them) → no command: reseat the card, check the riser;
//! 4. **another process on its GPU**: more processes that are not the job's ranks than its
//!    siblings have (a simulated node shows one made-up process per busy GPU, so the count is
//!    compared, not the presence);
//! 5. **its own input pipeline**: its data wait explains at least half of the gap to the
//!    others → a deeper prefetch.
//!
//! Otherwise it is named without a cause its GPU shows. "The job loses" is the share of each
//! step the others spend waiting: `(own − median of others) / own`.

use serde::{Deserialize, Serialize};

mod cause;
#[cfg(test)]
mod tests;

use super::rules::{Window, ev};
use super::{Hint, HintKind, RankWindow, RunWindow, StepPoint};
use cause::{Scene, Told};

/// A rank is a straggler when its own step time is at least this many times the median of the
/// others'.
pub const RATIO: f64 = 1.10;
/// Each rank is judged on at most its newest this many reports (inside the window).
pub const REPORTS: usize = 16;
/// Each rank compared needs at least this many reports in that time.
pub const MIN_REPORTS: usize = 5;
/// The thermal target suggested for a throttled straggler, below its slowdown temperature, °C.
pub const THERMAL_TARGET_MARGIN_C: f64 = 7.0;
/// The straggler's clock counts as held down below this share of its siblings'.
pub const CLOCK_BEHIND_SHARE: f64 = 0.9;
/// Its input pipeline is the cause when its extra data wait is at least this share of the gap.
pub const INPUT_GAP_SHARE: f64 = 0.5;

/// How far the slowest rank of a job is behind the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// The slowest rank.
    pub rank: u32,
    /// Its GPU, where it said.
    pub gpu: Option<u32>,
    /// Its own step time (the median of its recent reports), seconds.
    pub step_s: f64,
    /// The median of the other ranks' own step times, seconds.
    pub others_step_s: f64,
    /// `step_s / others_step_s`.
    pub ratio: f64,
    /// Its data wait and the others' (medians), seconds, where reported.
    pub data_wait_s: Option<f64>,
    pub others_data_wait_s: Option<f64>,
    /// Ranks with enough reports to compare.
    pub ranks: usize,
}

impl Spread {
    /// How much slower than the median rank, percent.
    pub fn slower_pct(&self) -> f64 {
        100.0 * (self.ratio - 1.0)
    }

    /// The share of each step the others wait for it, percent.
    pub fn loss_pct(&self) -> f64 {
        100.0 * (self.step_s - self.others_step_s).max(0.0) / self.step_s
    }
}

/// Why a straggler is slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    ThermalSlowdown,
    PowerCap,
    PcieLink,
    OtherProcess,
    InputPipeline,
    /// Its GPU shows nothing its siblings' do not, and its data wait is like theirs.
    Unknown,
}

/// The straggler verdict on one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub run: String,
    /// None: too few ranks with enough recent reports to compare.
    pub spread: Option<Spread>,
    /// What its GPU (or its data wait) shows, when it is a straggler.
    pub cause: Option<Cause>,
    /// The straggler hint, when the spread makes one.
    pub hint: Option<Hint>,
}

/// The kind of GPU hint a straggler hint already says, for its GPU.
pub(super) fn covers(cause: Cause) -> Option<HintKind> {
    match cause {
        Cause::ThermalSlowdown => Some(HintKind::ThermalThrottle),
        Cause::PowerCap => Some(HintKind::PowerCapThrottle),
        _ => None,
    }
}

/// The verdict on `run`; None for a run of fewer than two ranks.
pub(super) fn assess(w: &Window, run: &RunWindow) -> Option<Verdict> {
    if run.ranks.len() < 2 {
        return None;
    }
    let spread = spread(w, run);
    let found = spread
        .as_ref()
        .filter(|s| s.ratio >= w.th.straggler_ratio)
        .map(|s| hint(w, run, s));
    Some(Verdict {
        run: run.run.clone(),
        spread,
        cause: found.as_ref().map(|f| f.1),
        hint: found.map(|f| f.0),
    })
}

pub(super) fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// One rank's recent medians: (rank, step, data wait).
fn rank_medians<'r>(w: &Window, r: &'r RankWindow) -> Option<(&'r RankWindow, f64, Option<f64>)> {
    let mut recent: Vec<&StepPoint> = r
        .metrics
        .iter()
        .rev()
        .filter(|m| m.t >= w.from && m.t <= w.input.now)
        .filter(|m| m.step_time_s.is_some_and(|s| s > 0.0))
        .take(w.th.straggler_reports.max(1))
        .collect();
    recent.reverse();
    if recent.len() < w.th.straggler_min_reports.max(1) {
        return None;
    }
    let step = median(recent.iter().filter_map(|m| m.step_time_s).collect())?;
    let wait = median(recent.iter().filter_map(|m| m.data_wait_s).collect());
    Some((r, step, wait))
}

/// The slowest rank against the median of the others, over their recent reports.
pub(super) fn spread(w: &Window, run: &RunWindow) -> Option<Spread> {
    let per: Vec<(&RankWindow, f64, Option<f64>)> = run
        .ranks
        .iter()
        .filter_map(|r| rank_medians(w, r))
        .collect();
    if per.len() < 2 {
        return None;
    }
    let slowest = per
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.rank.cmp(&a.0.rank)))?;
    let others: Vec<&(&RankWindow, f64, Option<f64>)> =
        per.iter().filter(|p| p.0.rank != slowest.0.rank).collect();
    let others_step_s = median(others.iter().map(|p| p.1).collect())?;
    if others_step_s <= 0.0 {
        return None;
    }
    Some(Spread {
        rank: slowest.0.rank,
        gpu: slowest.0.gpu,
        step_s: slowest.1,
        others_step_s,
        ratio: slowest.1 / others_step_s,
        data_wait_s: slowest.2,
        others_data_wait_s: median(others.iter().filter_map(|p| p.2).collect()),
        ranks: per.len(),
    })
}

/// The straggler hint for `sp`, with its cause.
fn hint(w: &Window, run: &RunWindow, sp: &Spread) -> (Hint, Cause) {
    let sibling_gpus: Vec<u32> = run
        .ranks
        .iter()
        .filter(|r| r.rank != sp.rank)
        .filter_map(|r| r.gpu)
        .filter(|g| Some(*g) != sp.gpu)
        .collect();
    let hottest_c = sp.gpu.and_then(|i| {
        let s = w.input.gpus.iter().find(|g| g.index == i)?;
        s.points
            .iter()
            .filter(|p| p.t >= w.from && p.t <= w.input.now)
            .filter_map(|p| p.temperature_c)
            .chain(s.latest.as_ref().and_then(|l| l.temperature_c))
            .reduce(f64::max)
    });
    let scene = Scene {
        gpu: sp.gpu.and_then(|g| cause::sample(w, g)),
        siblings: sibling_gpus
            .iter()
            .filter_map(|g| cause::sample(w, *g))
            .collect(),
        pids: run.ranks.iter().filter_map(|r| r.pid).collect(),
        hottest_c,
    };
    let told = sp
        .gpu
        .and_then(|g| {
            cause::thermal(&scene, w.th.thermal_margin_c, g)
                .or_else(|| cause::power_cap(&scene, g))
                .or_else(|| cause::pcie_link(&scene))
                .or_else(|| cause::other_process(&scene, g))
        })
        .or_else(|| cause::input_pipeline(run, sp))
        .unwrap_or_else(|| Told {
            cause: Cause::Unknown,
            words: match (sp.gpu, scene.gpu) {
                (Some(_), Some(_)) => "its GPU shows no cause (no throttling, its link and processes like its siblings') and its data wait is like theirs: look at its host (CPU, memory, network)".into(),
                (Some(g), None) => format!("GPU {g} is not in this node's telemetry, and its data wait is like the other ranks': look at its node"),
                (None, _) => "it did not say which GPU it trains on, and its data wait is like the other ranks'".into(),
            },
            evidence: Vec::new(),
            action: None,
        });
    let whose = match sp.gpu {
        Some(g) => format!("rank {} on GPU {g}", sp.rank),
        None => format!("rank {}", sp.rank),
    };
    let summary = format!(
        "{whose} is {:.0}% slower than the median rank: {}; the job loses {:.0}% of its time",
        sp.slower_pct(),
        told.words,
        sp.loss_pct()
    );
    let mut evidence = vec![
        ev(&format!("step time (rank {})", sp.rank), sp.step_s, "s"),
        ev(
            "step time (median of the other ranks)",
            sp.others_step_s,
            "s",
        ),
        ev("slower than the median rank", sp.slower_pct(), "%"),
        ev("job time lost", sp.loss_pct(), "%"),
        ev("ranks compared", sp.ranks as f64, ""),
    ];
    evidence.extend(told.evidence);
    (
        Hint {
            kind: HintKind::Straggler,
            gpu: sp.gpu,
            run: Some(run.run.clone()),
            summary,
            evidence,
            action: told.action,
        },
        told.cause,
    )
}
