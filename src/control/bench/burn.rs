//! The sustained burn (`gpupilot bench burn`): full load on the chosen GPUs for a while, their
//! temperature, clock, power and throttle reasons read as it runs, and a verdict.
//!
//! Per GPU the verdict says:
//! - whether and when (seconds into the burn) it first reported thermal slowdown (software or
//!   hardware thermal, or hardware slowdown) and power slowdown (the software power cap or the
//!   hardware power brake);
//! - its **steady** state: the means of temperature, SM clock and power over the last quarter
//!   of the burn ([`STEADY_SHARE`]), when a sustained load has settled, and its throughput over
//!   the same span;
//! - against its siblings: a GPU whose steady throughput is [`SLOW_SHARE`] (15 %) or more below
//!   the median of the other GPUs' is named, with the cause its telemetry shows in the steady
//!   span (thermal slowdown, power cap, or a lower clock with no reason reported).
//!
//! [`BurnProgress`] is what the console's bench view draws while the burn runs.

use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use super::sweep::{mean, poll};
use super::{BenchNode, Label, Load, Loads, Work, WorkUnit, Workload, label_of, sample_of};
use crate::cuda::measure::median;
use crate::telemetry::throttle;

/// The share of the burn, at its end, taken as steady.
pub const STEADY_SHARE: f64 = 0.25;
/// A GPU this share or more below its siblings' median throughput is named.
pub const SLOW_SHARE: f64 = 0.15;
/// The `schema` of a burn's JSON.
pub const SCHEMA: &str = "gpupilot.bench.burn/1";
/// Points kept per GPU for the chart; older ones are thinned.
const MAX_POINTS: usize = 600;

/// What to burn.
#[derive(Debug, Clone, PartialEq)]
pub struct BurnConfig {
    /// Empty: every GPU.
    pub gpus: Vec<u32>,
    pub duration_s: f64,
    pub workload: Workload,
    pub poll_s: f64,
}

/// One read of one GPU during the burn.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct BurnPoint {
    /// Seconds into the burn.
    pub t_s: f64,
    pub temperature_c: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    pub power_w: Option<f64>,
    pub throttle_reasons: u64,
}

/// One GPU's series so far.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuSeries {
    pub gpu: u32,
    pub name: Option<String>,
    pub temp_slowdown_c: Option<f64>,
    pub sm_clock_max_mhz: Option<u32>,
    pub points: Vec<BurnPoint>,
}

/// The burn as it stands: what the console's bench view draws.
#[derive(Debug, Clone, PartialEq)]
pub struct BurnProgress {
    pub label: Label,
    pub workload: Workload,
    pub elapsed_s: f64,
    pub duration_s: f64,
    pub gpus: Vec<GpuSeries>,
}

/// Steady figures of one GPU (the last [`STEADY_SHARE`] of the burn).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Steady {
    /// Seconds into the burn where the steady span starts.
    pub from_s: f64,
    pub temperature_c: Option<f64>,
    pub sm_clock_mhz: Option<f64>,
    pub power_w: Option<f64>,
    /// Work units a second over the span.
    pub throughput_per_s: f64,
    /// Throttle reasons seen in the span (NVML bits, or-ed) and their names.
    pub throttle_reasons: u64,
    pub throttle: Vec<String>,
}

/// A GPU named as slower than its siblings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slow {
    /// How far below the median of the other GPUs, percent.
    pub below_median_pct: f64,
    pub cause: String,
}

/// One GPU's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuVerdict {
    pub gpu: u32,
    pub name: Option<String>,
    /// Seconds into the burn of the first thermal slowdown; `None`: none.
    pub thermal_slowdown_at_s: Option<f64>,
    /// Seconds into the burn of the first power slowdown; `None`: none.
    pub power_slowdown_at_s: Option<f64>,
    pub peak_temperature_c: Option<f64>,
    pub temp_slowdown_c: Option<f64>,
    pub steady: Steady,
    /// Work over the whole burn, units a second.
    pub throughput_per_s: f64,
    pub slow: Option<Slow>,
}

/// A burn's result: what `--json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BurnResult {
    pub schema: String,
    pub label: Label,
    pub workload: Workload,
    pub unit: WorkUnit,
    pub duration_s: f64,
    /// Whether a stop (signal) ended it before its duration.
    pub stopped: bool,
    pub gpus: Vec<GpuVerdict>,
}

/// Burn the GPUs `cfg` names, calling `tick` after each read with the burn so far; the loads
/// are stopped at the end, on a stop and on an error.
pub fn run(
    node: &mut dyn BenchNode,
    loads: &mut dyn Loads,
    cfg: &BurnConfig,
    stop: &AtomicBool,
    tick: &mut dyn FnMut(&BurnProgress),
) -> anyhow::Result<BurnResult> {
    let samples = node.samples()?;
    let gpus: Vec<u32> = if cfg.gpus.is_empty() {
        samples
            .iter()
            .filter(|s| !s.lost)
            .map(|s| s.index)
            .collect()
    } else {
        cfg.gpus.clone()
    };
    if gpus.is_empty() {
        anyhow::bail!("the daemon reports no GPU to burn");
    }
    let mut progress = BurnProgress {
        label: label_of(node, loads),
        workload: cfg.workload,
        elapsed_s: 0.0,
        duration_s: cfg.duration_s,
        gpus: Vec::new(),
    };
    let mut running: Vec<Box<dyn Load>> = Vec::new();
    for &g in &gpus {
        let s = sample_of(&samples, g)?;
        progress.gpus.push(GpuSeries {
            gpu: g,
            name: s.name.clone(),
            temp_slowdown_c: s.temp_slowdown_c,
            sm_clock_max_mhz: s.sm_clock_max_mhz,
            points: Vec::new(),
        });
        match loads.start(g, cfg.workload, s) {
            Ok(l) => running.push(l),
            Err(e) => {
                for l in running {
                    let _ = l.stop();
                }
                return Err(e);
            }
        }
    }
    let start = node.now_s();
    let steady_from = cfg.duration_s * (1.0 - STEADY_SHARE);
    // Per GPU, the last read at or before `steady_from` and the work done then: where the
    // steady span starts (so it covers at least the last quarter, however coarse the reads).
    let mut at_steady: Vec<(f64, Work)> = Vec::new();
    let outcome = (|| -> anyhow::Result<()> {
        for (load, gpu) in running.iter_mut().zip(&gpus) {
            poll(node, load.as_mut(), *gpu)?;
            at_steady.push((0.0, load.work()));
        }
        loop {
            let t = node.now_s() - start;
            if stop.load(Ordering::SeqCst) || t >= cfg.duration_s - 1e-9 {
                return Ok(());
            }
            node.wait((cfg.duration_s - t).min(cfg.poll_s));
            let t = node.now_s() - start;
            for (k, (load, series)) in running.iter_mut().zip(&mut progress.gpus).enumerate() {
                let s = poll(node, load.as_mut(), series.gpu)?;
                series.points.push(BurnPoint {
                    t_s: t,
                    temperature_c: s.temperature_c,
                    sm_clock_mhz: s.sm_clock_mhz,
                    power_w: s.power_w,
                    throttle_reasons: s.throttle_reasons.unwrap_or(0),
                });
                if t <= steady_from + 1e-9 {
                    at_steady[k] = (t, load.work());
                }
            }
            progress.elapsed_s = t;
            progress.thin();
            tick(&progress);
        }
    })();
    let mut totals = Vec::new();
    let mut stop_error = None;
    for load in running {
        match load.stop() {
            Ok(w) => totals.push(w),
            Err(e) => {
                totals.push(Work::default());
                stop_error.get_or_insert(e);
            }
        }
    }
    outcome?;
    if let Some(e) = stop_error {
        return Err(e);
    }
    let verdicts = progress
        .gpus
        .iter()
        .zip(&totals)
        .zip(&at_steady)
        .map(|((series, total), (from_s, from))| verdict(series, *total, *from, *from_s))
        .collect();
    Ok(BurnResult {
        schema: SCHEMA.into(),
        label: progress.label,
        workload: cfg.workload,
        unit: cfg.workload.unit(),
        duration_s: cfg.duration_s,
        stopped: stop.load(Ordering::SeqCst),
        gpus: compare(verdicts),
    })
}

/// One GPU's verdict from its series and its load's work (in all, and at `steady_from`, where
/// the steady span begins), before comparing it with its siblings.
fn verdict(series: &GpuSeries, total: Work, from: Work, steady_from: f64) -> GpuVerdict {
    let first = |pred: fn(u64) -> bool| {
        series
            .points
            .iter()
            .find(|p| pred(p.throttle_reasons))
            .map(|p| p.t_s)
    };
    let span: Vec<&BurnPoint> = series
        .points
        .iter()
        .filter(|p| p.t_s > steady_from)
        .collect();
    let of = |f: fn(&BurnPoint) -> Option<f64>| {
        mean(&span.iter().filter_map(|p| f(p)).collect::<Vec<_>>())
    };
    let bits = span.iter().fold(0, |b, p| b | p.throttle_reasons);
    let steady_work = if total.seconds > from.seconds {
        (total.units - from.units) / (total.seconds - from.seconds)
    } else {
        0.0
    };
    GpuVerdict {
        gpu: series.gpu,
        name: series.name.clone(),
        thermal_slowdown_at_s: first(thermal),
        power_slowdown_at_s: first(throttle::power_limited),
        peak_temperature_c: series
            .points
            .iter()
            .filter_map(|p| p.temperature_c)
            .reduce(f64::max),
        temp_slowdown_c: series.temp_slowdown_c,
        steady: Steady {
            from_s: steady_from,
            temperature_c: of(|p| p.temperature_c),
            sm_clock_mhz: of(|p| p.sm_clock_mhz.map(f64::from)),
            power_w: of(|p| p.power_w),
            throughput_per_s: steady_work,
            throttle_reasons: bits,
            throttle: crate::telemetry::throttle_reason_names(bits & !throttle::GPU_IDLE)
                .into_iter()
                .map(String::from)
                .collect(),
        },
        throughput_per_s: if total.seconds > 0.0 {
            total.units / total.seconds
        } else {
            0.0
        },
        slow: None,
    }
}

/// Thermal slowdown of any kind: software or hardware thermal, or the hardware slowdown the
/// board asserts when it runs hot.
fn thermal(bits: u64) -> bool {
    throttle::thermal_limited(bits) || bits & throttle::HW_SLOWDOWN != 0
}

/// Name each GPU [`SLOW_SHARE`] or more below the median of the others, with its cause.
fn compare(mut verdicts: Vec<GpuVerdict>) -> Vec<GpuVerdict> {
    let figures: Vec<(f64, Option<f64>)> = verdicts
        .iter()
        .map(|v| (v.steady.throughput_per_s, v.steady.sm_clock_mhz))
        .collect();
    for (i, v) in verdicts.iter_mut().enumerate() {
        let others: Vec<f64> = figures
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, f)| f.0)
            .collect();
        let Some(mid) = median(&others) else {
            continue;
        };
        if mid <= 0.0 || v.steady.throughput_per_s > (1.0 - SLOW_SHARE) * mid {
            continue;
        }
        let clocks: Vec<f64> = figures
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, f)| f.1)
            .collect();
        v.slow = Some(Slow {
            below_median_pct: 100.0 * (1.0 - v.steady.throughput_per_s / mid),
            cause: cause(v, median(&clocks)),
        });
    }
    verdicts
}

/// Why a GPU is slow, from what its telemetry showed in the steady span.
fn cause(v: &GpuVerdict, sibling_clock: Option<f64>) -> String {
    let s = &v.steady;
    let temp = s
        .temperature_c
        .map(|t| format!("{t:.0} °C"))
        .unwrap_or_else(|| "temperature N/A".into());
    let clock = |c: Option<f64>| c.map_or("N/A".into(), |c| format!("{c:.0} MHz"));
    let clocks = format!(
        "clock {} against its siblings' {}",
        clock(s.sm_clock_mhz),
        clock(sibling_clock)
    );
    if thermal(s.throttle_reasons) {
        let limit = v
            .temp_slowdown_c
            .map(|c| format!(", slowdown at {c:.0} °C"))
            .unwrap_or_default();
        return format!("thermal slowdown: {temp}{limit}; {clocks}");
    }
    if throttle::power_limited(s.throttle_reasons) {
        let power = s.power_w.map_or("N/A".into(), |p| format!("{p:.0} W"));
        return format!("power cap: drawing {power}; {clocks}");
    }
    format!("{clocks}, with no throttle reason reported")
}

impl BurnProgress {
    /// Thin each series to at most [`MAX_POINTS`] (every other point of the older half).
    pub fn thin(&mut self) {
        for s in &mut self.gpus {
            if s.points.len() > MAX_POINTS {
                let half = s.points.len() / 2;
                let mut k = 0;
                s.points.retain(|_| {
                    k += 1;
                    k > half || k % 2 == 0
                });
            }
        }
    }
}
