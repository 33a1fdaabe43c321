//! One function per hint. Each looks only at points inside the window and returns `None`
//! unless its evidence is there.

use super::{
    AdvisorInput, Evidence, GpuPoint, GpuSeries, Hint, HintKind, Knob, RunWindow, StepPoint,
    Suggestion, Thresholds,
};
use crate::control::owner::CapOwner;
use crate::telemetry::throttle;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The window: what counts as recent, and the GPUs' points within it.
pub(super) struct Window<'a> {
    pub(super) input: &'a AdvisorInput,
    pub(super) th: &'a Thresholds,
    pub(super) from: f64,
}

impl<'a> Window<'a> {
    pub(super) fn new(input: &'a AdvisorInput, th: &'a Thresholds) -> Window<'a> {
        Window {
            input,
            th,
            from: input.now - th.window_s,
        }
    }

    pub(super) fn recent_gpu<'p>(&self, s: &'p GpuSeries) -> Vec<&'p GpuPoint> {
        s.points
            .iter()
            .filter(|p| p.t >= self.from && p.t <= self.input.now)
            .collect()
    }

    pub(super) fn recent_metrics<'p>(&self, run: &'p RunWindow) -> Vec<&'p StepPoint> {
        run.metrics
            .iter()
            .filter(|p| p.t >= self.from && p.t <= self.input.now)
            .collect()
    }

    /// Enough points over a long enough span to say anything.
    fn enough(&self, times: &[f64]) -> bool {
        times.len() >= self.th.min_points
            && times.last().zip(times.first()).map_or(0.0, |(b, a)| b - a) >= self.th.min_span_s
    }

    /// The run's GPUs (every GPU when the run does not say).
    fn run_gpus(&self, run: &RunWindow) -> Vec<&'a GpuSeries> {
        self.input
            .gpus
            .iter()
            .filter(|g| run.gpus.is_empty() || run.gpus.contains(&g.index))
            .collect()
    }
}

pub(super) fn mean(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (n, sum) = values
        .into_iter()
        .fold((0usize, 0.0), |(n, s), v| (n + 1, s + v));
    (n > 0).then(|| sum / n as f64)
}

pub(super) fn ev(name: &str, value: f64, unit: &str) -> Evidence {
    Evidence::new(name, value, unit)
}

/// The newest value of a field among the reports.
fn latest<T: Copy>(ms: &[&StepPoint], f: impl Fn(&StepPoint) -> Option<T>) -> Option<T> {
    ms.iter().rev().find_map(|m| f(m))
}

pub(super) fn data_stall(w: &Window, run: &RunWindow) -> Option<Hint> {
    let th = w.th;
    let ms = w.recent_metrics(run);
    let timed: Vec<&&StepPoint> = ms
        .iter()
        .filter(|m| m.step_time_s.is_some_and(|s| s > 0.0) && m.data_wait_s.is_some())
        .collect();
    let times: Vec<f64> = timed.iter().map(|m| m.t).collect();
    if !w.enough(&times) {
        return None;
    }
    let wait = mean(timed.iter().filter_map(|m| m.data_wait_s))?;
    let step = mean(timed.iter().filter_map(|m| m.step_time_s))?;
    let share = wait / step;
    if share < th.stall_wait_share {
        return None;
    }
    // The GPUs must show it: utilization below the line on average.
    let utils: Vec<f64> = w
        .run_gpus(run)
        .into_iter()
        .flat_map(|g| w.recent_gpu(g))
        .filter_map(|p| p.util_pct)
        .collect();
    if utils.len() < th.min_points {
        return None;
    }
    let util = mean(utils.iter().copied())?;
    let util_min = utils.iter().copied().fold(f64::INFINITY, f64::min);
    if util >= th.stall_util_pct {
        return None;
    }
    let prefetch = latest(&ms, |m| m.prefetch);
    let max = run.prefetch_range.map_or(u32::MAX, |r| r.1);
    let next = prefetch
        .map(|p| (p * 2).max(p + 1).min(max))
        .filter(|n| Some(*n) != prefetch);
    let mut evidence = vec![
        ev("data wait share of step", 100.0 * share, "%"),
        ev("data wait per step", wait, "s"),
        ev("step time", step, "s"),
        ev("GPU utilization (mean)", util, "%"),
        ev("GPU utilization (lowest)", util_min, "%"),
    ];
    if let Some(p) = prefetch {
        evidence.push(ev("prefetch depth", f64::from(p), ""));
    }
    let summary = match (prefetch, next) {
        (Some(p), Some(n)) => format!(
            "data stalls: {:.0}% of each step waits for data, GPU {:.0}% busy; raise prefetch {p} → {n}",
            100.0 * share,
            util
        ),
        (Some(p), None) => format!(
            "data stalls: {:.0}% of each step waits for data, GPU {:.0}% busy; prefetch is at its maximum ({p}): add loader workers",
            100.0 * share,
            util
        ),
        (None, _) => format!(
            "data stalls: {:.0}% of each step waits for data, GPU {:.0}% busy; raise the prefetch depth or add loader workers",
            100.0 * share,
            util
        ),
    };
    Some(Hint {
        kind: HintKind::DataStall,
        gpu: None,
        run: Some(run.run.clone()),
        summary,
        evidence,
        action: next.map(|n| Suggestion::SetKnob {
            run: run.run.clone(),
            knob: Knob::Prefetch,
            value: f64::from(n),
        }),
    })
}

/// Memory use as `static + batch · per_sample`, bytes: fitted from two batch sizes seen in the
/// window, else all of it per sample (an upper bound: static memory does not grow).
fn memory_model(pairs: &[(u32, f64)], batch: u32, used: f64) -> (f64, f64, bool) {
    let lo = pairs.iter().min_by_key(|p| p.0);
    let hi = pairs.iter().max_by_key(|p| p.0);
    if let (Some(&(b0, m0)), Some(&(b1, m1))) = (lo, hi) {
        if b1 > b0 && m1 > m0 {
            let per = (m1 - m0) / f64::from(b1 - b0);
            return ((m0 - per * f64::from(b0)).max(0.0), per, true);
        }
    }
    (0.0, used / f64::from(batch.max(1)), false)
}

pub(super) fn memory_headroom(w: &Window, run: &RunWindow) -> Option<Hint> {
    let th = w.th;
    let ms = w.recent_metrics(run);
    let batch = latest(&ms, |m| m.batch_size)?;
    let gpus = w.run_gpus(run);
    let points: Vec<&GpuPoint> = gpus.iter().flat_map(|g| w.recent_gpu(g)).collect();
    // Only points since the run has had this batch size say what it uses.
    let since = ms
        .iter()
        .rev()
        .take_while(|m| m.batch_size.is_none_or(|b| b == batch))
        .last()
        .map_or(w.from, |m| m.t);
    let now_points: Vec<&&GpuPoint> = points.iter().filter(|p| p.t >= since).collect();
    let times: Vec<f64> = now_points
        .iter()
        .filter(|p| p.memory_used_bytes.is_some())
        .map(|p| p.t)
        .collect();
    if !w.enough(&times) || ms.is_empty() {
        return None;
    }
    let used = now_points
        .iter()
        .filter_map(|p| p.memory_used_bytes)
        .max()? as f64;
    let total = points.iter().filter_map(|p| p.memory_total_bytes).min()? as f64;
    if used <= 0.0 || used / total > th.headroom_used_share {
        return None;
    }
    // (batch, peak memory) for each batch size the window saw, over the reports that had it.
    let mut pairs: Vec<(u32, f64)> = Vec::new();
    let mut segments: Vec<(u32, f64, f64)> = Vec::new();
    for m in &ms {
        let Some(b) = m.batch_size else { continue };
        match segments.last_mut() {
            Some(seg) if seg.0 == b => seg.2 = m.t,
            _ => segments.push((b, m.t, m.t)),
        }
    }
    for (b, t0, t1) in segments {
        let peak = points
            .iter()
            .filter(|p| p.t >= t0 && p.t <= t1)
            .filter_map(|p| p.memory_used_bytes)
            .max();
        if let Some(peak) = peak {
            match pairs.iter_mut().find(|p| p.0 == b) {
                Some(p) => p.1 = p.1.max(peak as f64),
                None => pairs.push((b, peak as f64)),
            }
        }
    }
    let (fixed, per_sample, fitted) = memory_model(&pairs, batch, used);
    let max = run.batch_range.map_or(u32::MAX, |r| r.1);
    let predict = |b: u32| fixed + per_sample * f64::from(b);
    let mut next = None;
    let mut b = batch;
    while let Some(n) = b.checked_mul(2).filter(|n| *n <= max) {
        if predict(n) > th.headroom_fit_share * total {
            break;
        }
        next = Some(n);
        b = n;
    }
    let next = next?;
    let predicted = predict(next);
    Some(Hint {
        kind: HintKind::MemoryHeadroom,
        gpu: None,
        run: Some(run.run.clone()),
        summary: format!(
            "memory headroom: {:.1} of {:.1} GiB used at batch {batch}; batch {next} is predicted to use {:.1} GiB ({:.0}%)",
            used / GIB,
            total / GIB,
            predicted / GIB,
            100.0 * predicted / total
        ),
        evidence: vec![
            ev("memory used (peak)", used / GIB, "GiB"),
            ev("memory total", total / GIB, "GiB"),
            ev("batch size", f64::from(batch), ""),
            ev("predicted memory at the new batch", predicted / GIB, "GiB"),
            ev(
                if fitted {
                    "memory per sample (fitted from two batch sizes)"
                } else {
                    "memory per sample (upper bound: all memory scales)"
                },
                per_sample / (1024.0 * 1024.0),
                "MiB",
            ),
        ],
        action: Some(Suggestion::SetKnob {
            run: run.run.clone(),
            knob: Knob::BatchSize,
            value: f64::from(next),
        }),
    })
}

pub(super) fn throughput_drop(w: &Window, run: &RunWindow) -> Option<Hint> {
    let th = w.th;
    let ms = w.recent_metrics(run);
    // The newest change inside the window with reports on both sides.
    let change = run
        .changes
        .iter()
        .rev()
        .find(|c| c.t >= w.from && c.t <= w.input.now)?;
    let rate = |m: &&&StepPoint| m.samples_per_s;
    let before: Vec<&&StepPoint> = ms.iter().filter(|m| m.t < change.t).collect();
    let after: Vec<&&StepPoint> = ms
        .iter()
        .filter(|m| m.t >= change.t + th.drop_settle_s)
        .collect();
    let before_rates: Vec<f64> = before.iter().filter_map(rate).collect();
    let after_rates: Vec<f64> = after.iter().filter_map(rate).collect();
    let half = (th.min_points / 2).max(2);
    if before_rates.len() < half || after_rates.len() < half {
        return None;
    }
    let b = mean(before_rates)?;
    let a = mean(after_rates)?;
    if b <= 0.0 || (b - a) / b < th.drop_share {
        return None;
    }
    // A cap the loops or the tuner chose is theirs: its cost in throughput is what they traded
    // (the tuned-cap hint questions the tuner's choice, with its reason).
    if change.knob == Knob::PowerCap && change.gpu.is_some_and(|g| w.chosen(g).is_some()) {
        return None;
    }
    let action = match change.knob {
        Knob::PowerCap => change.gpu.map(|gpu| Suggestion::PowerCap {
            gpus: vec![gpu],
            watts: change.old,
        }),
        knob => Some(Suggestion::SetKnob {
            run: run.run.clone(),
            knob,
            value: change.old,
        }),
    };
    Some(Hint {
        kind: HintKind::ThroughputDrop,
        gpu: change.gpu,
        run: Some(run.run.clone()),
        summary: format!(
            "throughput fell {:.0}% ({b:.0} → {a:.0} samples/s) after {} {} → {}; undo it",
            100.0 * (b - a) / b,
            change.knob.name(),
            change.old,
            change.new
        ),
        evidence: vec![
            ev("samples/s before", b, "samples/s"),
            ev("samples/s after", a, "samples/s"),
            ev("drop", 100.0 * (b - a) / b, "%"),
            ev("seconds since the change", w.input.now - change.t, "s"),
        ],
        action,
    })
}

/// The share of points in thermal slowdown, read as the console's badges read the reasons
/// ([`throttle::HeldCount`]); None when no point reports reasons.
pub(super) fn thermal_share(points: &[&GpuPoint]) -> Option<f64> {
    throttle::HeldCount::of(points.iter().map(|p| p.throttle_reasons)).thermal_share()
}

/// The share of points held by the power cap: the reasons' reading ([`throttle::held`]) where a
/// point has reasons, else power within 2% of the limit.
fn capped_share(points: &[&GpuPoint]) -> Option<f64> {
    let held: Vec<bool> = points
        .iter()
        .filter_map(|p| match (p.throttle_reasons, p.power_w, p.power_limit_w) {
            (Some(r), _, _) => Some(throttle::held(r).power_cap),
            (None, Some(w), Some(l)) if l > 0.0 => Some(w >= 0.98 * l),
            _ => None,
        })
        .collect();
    (!held.is_empty()).then(|| held.iter().filter(|h| **h).count() as f64 / held.len() as f64)
}

pub(super) fn power_cap_throttle(w: &Window, g: &GpuSeries) -> Option<Hint> {
    let th = w.th;
    // Only a person's cap is a throttle to remove: the loops and the tuner hold theirs on
    // purpose.
    if w.chosen(g.index).is_some() {
        return None;
    }
    let ps = w.recent_gpu(g);
    let times: Vec<f64> = ps.iter().map(|p| p.t).collect();
    if !w.enough(&times) {
        return None;
    }
    let share = capped_share(&ps)?;
    let clock = mean(ps.iter().filter_map(|p| p.sm_clock_mhz.map(f64::from)))?;
    let max_clock = ps
        .iter()
        .rev()
        .find_map(|p| p.sm_clock_max_mhz)
        .map(f64::from)?;
    let last = ps.last()?;
    let (limit, default) = (last.power_limit_w?, last.power_default_w?);
    if share < th.throttle_share || clock >= th.throttle_clock_share * max_clock {
        return None;
    }
    // At or above the default the board is at its rated power: nothing to undo.
    if limit >= default - 0.5 {
        return None;
    }
    let power = mean(ps.iter().filter_map(|p| p.power_w)).unwrap_or(f64::NAN);
    Some(Hint {
        kind: HintKind::PowerCapThrottle,
        gpu: Some(g.index),
        run: None,
        summary: format!(
            "GPU {}: power cap {limit:.0} W (default {default:.0} W) holds the clock at {clock:.0} of {max_clock:.0} MHz {:.0}% of the time; raise it to the default",
            g.index,
            100.0 * share
        ),
        evidence: vec![
            ev("time at the power cap", 100.0 * share, "%"),
            ev("power cap", limit, "W"),
            ev("default cap", default, "W"),
            ev("power drawn (mean)", power, "W"),
            ev("SM clock (mean)", clock, "MHz"),
            ev("SM clock max", max_clock, "MHz"),
        ],
        action: Some(Suggestion::PowerCap {
            gpus: vec![g.index],
            watts: default,
        }),
    })
}

pub(super) fn thermal_throttle(w: &Window, g: &GpuSeries) -> Option<Hint> {
    let th = w.th;
    let ps = w.recent_gpu(g);
    let times: Vec<f64> = ps.iter().map(|p| p.t).collect();
    if !w.enough(&times) {
        return None;
    }
    let reported = thermal_share(&ps);
    let share = reported.unwrap_or(0.0);
    let slowdown = ps.iter().rev().find_map(|p| p.temp_slowdown_c);
    let temps: Vec<f64> = ps.iter().filter_map(|p| p.temperature_c).collect();
    let hottest = temps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let near = slowdown.is_some_and(|s| hottest >= s - th.thermal_margin_c);
    if share < th.throttle_share && !near {
        return None;
    }
    let mut evidence = vec![ev("time in thermal slowdown", 100.0 * share, "%")];
    if hottest.is_finite() {
        evidence.push(ev("temperature (highest)", hottest, "C"));
    }
    if let Some(s) = slowdown {
        evidence.push(ev("slowdown threshold", s, "C"));
    }
    if let Some(c) = mean(ps.iter().filter_map(|p| p.sm_clock_mhz.map(f64::from))) {
        evidence.push(ev("SM clock (mean)", c, "MHz"));
    }
    // A governor already holds a target there: another one is no fix.
    let governed = match w.chosen(g.index) {
        Some(o @ CapOwner::Governor { .. }) => Some(o.describe()),
        _ => None,
    };
    let target = slowdown.map(|s| s - 5.0).filter(|_| governed.is_none());
    // The share is the badges' reading over the window; a GPU that only runs hot is said to
    // be near its slowdown, not throttling.
    let how = match reported {
        None => "its throttle reasons are not reported".to_string(),
        Some(_) if share >= th.throttle_share => {
            format!("thermal throttling {:.0}% of the time", 100.0 * share)
        }
        Some(_) => format!(
            "near its thermal slowdown (in it {:.0}% of the time)",
            100.0 * share
        ),
    };
    let summary = match (slowdown, target, governed) {
        (Some(s), _, Some(by)) => format!(
            "GPU {}: {how}, up to {hottest:.0} C against a {s:.0} C slowdown, with {by} holding its cap; improve cooling",
            g.index,
        ),
        (Some(s), Some(t), None) => format!(
            "GPU {}: {how}, up to {hottest:.0} C against a {s:.0} C slowdown; hold it at {t:.0} C with the thermal governor, or improve cooling",
            g.index,
        ),
        _ => format!("GPU {}: {how}; check cooling and airflow", g.index),
    };
    Some(Hint {
        kind: HintKind::ThermalThrottle,
        gpu: Some(g.index),
        run: None,
        summary,
        evidence,
        action: target.map(|celsius| Suggestion::ThermalTarget {
            gpus: vec![g.index],
            celsius,
        }),
    })
}

pub(super) fn idle_drawing_power(w: &Window, g: &GpuSeries) -> Option<Hint> {
    let th = w.th;
    let ps = w.recent_gpu(g);
    let utils: Vec<(f64, f64)> = ps
        .iter()
        .filter_map(|p| p.util_pct.map(|u| (p.t, u)))
        .collect();
    let times: Vec<f64> = utils.iter().map(|u| u.0).collect();
    if !w.enough(&times) || times.last()? - times.first()? < th.idle_min_s {
        return None;
    }
    if utils.iter().any(|(_, u)| *u > th.idle_util_pct) {
        return None;
    }
    let power = mean(ps.iter().filter_map(|p| p.power_w))?;
    if power < th.idle_power_w {
        return None;
    }
    // Only a GPU something holds is waste one key can end: a run that has it.
    let run = w.input.runs.iter().find(|r| r.gpus.contains(&g.index))?;
    let minutes = (times.last()? - times.first()?) / 60.0;
    let memory = ps
        .iter()
        .rev()
        .find_map(|p| p.memory_used_bytes)
        .map_or(0.0, |b| b as f64 / GIB);
    Some(Hint {
        kind: HintKind::IdleDrawingPower,
        gpu: Some(g.index),
        run: Some(run.run.clone()),
        summary: format!(
            "GPU {}: idle for {minutes:.0} min while run {} holds it ({memory:.1} GiB), drawing {power:.0} W ({:.1} kWh a day); stop the run if it is stuck",
            g.index,
            run.run,
            power * 24.0 / 1000.0
        ),
        evidence: vec![
            ev("minutes idle", minutes, "min"),
            ev(
                "utilization (highest)",
                utils.iter().map(|u| u.1).fold(0.0, f64::max),
                "%",
            ),
            ev("power drawn (mean)", power, "W"),
            ev("memory held", memory, "GiB"),
        ],
        action: Some(Suggestion::StopRun {
            run: run.run.clone(),
        }),
    })
}

/// A busy GPU's cap against the power sweep kept for its model (see the module doc).
pub(super) fn measured_cap(w: &Window, g: &GpuSeries) -> Option<Hint> {
    // A cap the loops hold, or one the tuner measured on this very run, is not a GEMM sweep's
    // to move.
    if w.chosen(g.index).is_some() {
        return None;
    }
    let ps = w.recent_gpu(g);
    let times: Vec<f64> = ps.iter().map(|p| p.t).collect();
    if !w.enough(&times) {
        return None;
    }
    let model = g.latest.as_ref()?.name.as_deref()?;
    let curve = w.input.curves.iter().find(|c| c.model == model)?;
    let cap = ps.last()?.power_limit_w?;
    let util = mean(ps.iter().filter_map(|p| p.util_pct))?;
    if util < 50.0 {
        return None;
    }
    let per_joule = |&(_, work, power): &(f64, f64, f64)| work / power;
    let usable: Vec<&(f64, f64, f64)> = curve
        .points
        .iter()
        .filter(|p| p.1 > 0.0 && p.2 > 0.0)
        .collect();
    let best = usable
        .iter()
        .copied()
        .max_by(|a, b| per_joule(a).total_cmp(&per_joule(b)))?;
    // The curve's point nearest the GPU's own cap stands for what it does now.
    let here = usable
        .iter()
        .copied()
        .min_by(|a, b| (a.0 - cap).abs().total_cmp(&(b.0 - cap).abs()))?;
    let gain = per_joule(best) / per_joule(here) - 1.0;
    if cap < best.0 + MEASURED_CAP_MARGIN_W || gain < MEASURED_CAP_GAIN {
        return None;
    }
    let speed = best.1 / here.1;
    Some(Hint {
        kind: HintKind::MeasuredCap,
        gpu: Some(g.index),
        run: None,
        summary: format!(
            "GPU {}: a {} power sweep of its model did {:.0}% more work per joule at {:.0} W than \
             at its {cap:.0} W cap, at {:.0}% of the throughput; cap it there, or tune its run \
             (`gpupilot tune energy RUN`)",
            g.index,
            curve.label,
            100.0 * gain,
            best.0,
            100.0 * speed
        ),
        evidence: vec![
            ev("power cap", cap, "W"),
            ev("best cap of the sweep (work per joule)", best.0, "W"),
            ev("more work per joule there", 100.0 * gain, "%"),
            ev("throughput there, of the cap's", 100.0 * speed, "%"),
            ev("utilization (mean)", util, "%"),
        ],
        action: Some(Suggestion::PowerCap {
            gpus: vec![g.index],
            watts: best.0,
        }),
    })
}

/// A cap this far above the sweep's best, at least, to speak…
const MEASURED_CAP_MARGIN_W: f64 = 25.0;
/// …and this much more work per joule there.
const MEASURED_CAP_GAIN: f64 = 0.10;
