//! The advisor's findings over a whole run: the same rules the console applies to its last
//! five minutes ([`crate::advisor`]), given the run's whole span instead, for its report.
//!
//! Input is what a finished run keeps: the GPU history over its span (means per bucket, with
//! the share of each bucket spent at the power cap or in thermal slowdown), the GPUs' rated
//! figures recorded when it started (`environment.json`), every metrics report of every rank,
//! the knob ranges of its profile (`run.toml`) and where each rank ran. A rule whose input the
//! run did not keep says nothing (no history: no GPU rule; no rated memory: no batch-size
//! headroom).
//!
//! The suggestions keep the advisor's commands: for a run that has ended they are what to
//! change in the next one (a knob's value in the profile, a cap or a thermal target on the
//! node).

use std::collections::BTreeMap;

use super::environment::Environment;
use super::model::GpuSeries;
use crate::advisor::adapt::{self, Rated};
use crate::advisor::{self, AdvisorInput, Hint, Thresholds};
use crate::control::owner::{CapOwner, GpuOwner, SAME_CAP_W, TunerChoice};
use crate::control::tuner::TuneResult;
use crate::history::Metric;
use crate::profile::Knobs;
use crate::protocol::{MetricsPoint, RankInfo, RankSpec, TrainerInfo};
use crate::telemetry::{GpuSample, throttle};

/// The advisor's thresholds over a span of `span_s` seconds: the console's, with the window
/// the whole span and the straggler judged on every report rather than the newest few.
pub fn thresholds(span_s: f64) -> Thresholds {
    Thresholds {
        window_s: span_s.max(0.0) + 1.0,
        straggler_reports: usize::MAX,
        ..Thresholds::default()
    }
}

/// What the whole-run findings are made from.
pub struct RunRecord<'a> {
    pub run: &'a str,
    /// The run's GPUs, where known.
    pub gpus: Option<&'a [u32]>,
    pub history: Option<&'a [GpuSeries]>,
    pub environment: Option<&'a Environment>,
    /// Every report of every rank, oldest first.
    pub points: &'a [MetricsPoint],
    /// The profile's knobs (their ranges), when `run.toml` could be read.
    pub knobs: Option<&'a Knobs>,
    pub end_s: f64,
    pub span_s: f64,
    /// What an energy search on this run chose (its `tune-energy.json`), where one finished.
    pub tuned: Option<TunerChoice>,
}

/// The choice a finished energy search on run `run` (of `gpus`) wrote to its result file,
/// `text`, whose file was last written at `written_s`; None where it is not one, or where the
/// search kept a clock lock (see [`TunerChoice::of_result`], which the daemon's records use
/// too).
pub fn tuner_choice(run: &str, gpus: &[u32], text: &str, written_s: f64) -> Option<TunerChoice> {
    let result: TuneResult = serde_json::from_str(text).ok()?;
    // It was written when the search ended.
    let started_s = (written_s - result.duration_s.max(0.0)).max(0.0);
    let started =
        crate::time::rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(started_s));
    TunerChoice::of_result(run, gpus, &started, &result)
}

/// A GPU over the whole run as one sample, for the rules that compare a GPU with its
/// siblings (the straggler's cause): means of what moved, the cap at the end, and each
/// throttle reason held in at least half of the run's buckets. None without points.
fn over_run(index: u32, rated: &Rated, points: &[advisor::GpuPoint]) -> Option<GpuSample> {
    let last = points.last()?;
    let mean = |f: fn(&advisor::GpuPoint) -> Option<f64>| {
        let v: Vec<f64> = points.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let reasons: Vec<u64> = points.iter().filter_map(|p| p.throttle_reasons).collect();
    let held = |bit: u64| {
        let n = reasons.iter().filter(|r| *r & bit != 0).count();
        if 2 * n >= reasons.len() { bit } else { 0 }
    };
    let throttle_reasons = (!reasons.is_empty())
        .then(|| held(throttle::SW_POWER_CAP) | held(throttle::SW_THERMAL_SLOWDOWN));
    Some(GpuSample {
        index,
        time_s: last.t,
        util_gpu_pct: mean(|p| p.util_pct),
        memory_used_bytes: points.iter().filter_map(|p| p.memory_used_bytes).max(),
        memory_total_bytes: rated.memory_total_bytes,
        power_w: mean(|p| p.power_w),
        power_limit_w: last.power_limit_w,
        power_default_w: rated.power_default_w,
        power_max_w: rated.power_max_w,
        temperature_c: mean(|p| p.temperature_c),
        temp_slowdown_c: rated.temp_slowdown_c,
        throttle_reasons,
        sm_clock_mhz: mean(|p| p.sm_clock_mhz.map(f64::from)).map(|c| c.round() as u32),
        sm_clock_max_mhz: rated.sm_clock_max_mhz,
        ..GpuSample::default()
    })
}

/// The findings, in the advisor's order (runs first, then GPUs).
pub fn whole_run(rec: &RunRecord<'_>) -> Vec<Hint> {
    let rated: BTreeMap<u32, Rated> = rec
        .environment
        .map(|e| {
            e.gpus
                .iter()
                .map(|g| {
                    let r = Rated {
                        memory_total_bytes: g.memory_total_bytes,
                        power_default_w: g.power_default_w,
                        power_max_w: g.power_max_w,
                        temp_slowdown_c: g.temp_slowdown_c,
                        sm_clock_max_mhz: g.sm_clock_max_mhz,
                    };
                    (g.index, r)
                })
                .collect()
        })
        .unwrap_or_default();
    let mut gpus = Vec::new();
    let mut caps = Vec::new();
    for h in rec.history.unwrap_or_default() {
        let rated = rated.get(&h.gpu).copied().unwrap_or_default();
        let points = adapt::gpu_points(&rated, &h.series);
        let latest = over_run(h.gpu, &rated, &points);
        gpus.push(advisor::GpuSeries {
            index: h.gpu,
            points,
            latest,
        });
        if let Some(limits) = h.get(Metric::PowerLimit) {
            caps.extend(adapt::cap_changes(h.gpu, limits));
        }
    }
    // The tuner's choice holds a GPU that ended the run at its cap: it is not advised
    // against (docs/operations.md, "One voice"), as `advise` does while the run lives.
    let owners = rec
        .tuned
        .iter()
        .flat_map(|c| {
            gpus.iter()
                .filter(|g| c.gpus.contains(&g.index))
                .filter_map(|g| {
                    let cap = g.latest.as_ref()?.power_limit_w?;
                    ((cap - c.cap_w).abs() <= SAME_CAP_W).then(|| GpuOwner {
                        gpu: g.index,
                        cap_w: Some(cap),
                        owner: Some(CapOwner::Tuner(c.clone())),
                    })
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let trainer = TrainerInfo {
        world_size: rec
            .environment
            .and_then(|e| u32::try_from(e.ranks.len()).ok())
            .filter(|n| *n > 0),
        ranks: rec
            .environment
            .map(|e| {
                e.ranks
                    .iter()
                    .map(|r| RankInfo {
                        spec: RankSpec {
                            rank: r.rank,
                            host: r.host.clone(),
                            gpu: r.gpu,
                            ..RankSpec::default()
                        },
                        attached: false,
                        pid: None,
                        last: None,
                        steps_per_s: None,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        ..TrainerInfo::default()
    };
    let mut run = adapt::run_window(
        rec.run,
        rec.gpus.map(<[u32]>::to_vec).unwrap_or_default(),
        rec.points,
        &trainer,
        caps,
    );
    let range = |k: Option<crate::profile::Knob>| {
        let k = k?;
        let lo = u32::try_from(k.min).ok()?;
        let hi = k.max.map_or(Some(u32::MAX), |m| u32::try_from(m).ok())?;
        Some((lo, hi))
    };
    if let Some(k) = rec.knobs {
        run.batch_range = range(k.batch_size);
        run.prefetch_range = range(k.prefetch);
    }
    let input = AdvisorInput {
        now: rec.end_s,
        gpus,
        runs: vec![run],
        // A report judges the run as it ran, not against sweeps made since.
        curves: Vec::new(),
        owners,
    };
    advisor::advise(&input, &thresholds(rec.span_s))
}

#[cfg(test)]
mod tests;
