//! The perf-per-watt sweep over power caps (`gpupilot bench power-sweep`).
//!
//! With a load running on one GPU, each cap from the highest down is set (through the
//! [`BenchNode`], so through the daemon's control and into its events), held for a warm-up and
//! then for a measured window. Per cap: throughput (work units a second, from the load's
//! count), mean power (the energy counter's difference over the window, else the mean of the
//! power samples), energy per unit (J) and perf/W (units per joule).
//!
//! **The knee** is the lowest cap of the plateau: going down from the highest cap, every cap
//! down to the knee keeps its throughput within [`KNEE_DROP`] (2 %) of the best measured, and
//! the next cap below it is the first that falls further. Above the knee a lower cap costs no
//! speed; below it the clock, and with it the throughput, starts to fall. 2 % sits above the
//! window-to-window noise of a steady kernel and below any slowdown worth a decision.
//!
//! **The best perf/W cap** is the cap whose window did the most work per joule.
//!
//! The GPU's cap before the sweep is put back at the end, on an error and on a stop (the
//! `stop` flag: Ctrl-C, SIGTERM, SIGHUP), and the load is stopped before.

use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use super::{BenchNode, Label, Load, Loads, Refused, WorkUnit, Workload, label_of, sample_of};
use crate::control::PowerLimits;
use crate::telemetry::GpuSample;

/// A cap whose throughput is more than this share below the best is off the plateau.
pub const KNEE_DROP: f64 = 0.02;

/// The `schema` of a sweep's JSON.
pub const SCHEMA: &str = "gpupilot.bench.power-sweep/1";

/// The caps to try: `MAX:MIN:STEP` watts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapSteps {
    pub max_w: f64,
    pub min_w: f64,
    pub step_w: f64,
}

impl CapSteps {
    /// `MAX:MIN:STEP` in watts, e.g. `700:300:50`.
    pub fn parse(text: &str) -> Result<CapSteps, String> {
        let parts: Vec<&str> = text.split(':').map(str::trim).collect();
        let [max, min, step] = parts.as_slice() else {
            return Err(format!(
                "`{text}`: expected MAX:MIN:STEP in watts, e.g. 700:300:50"
            ));
        };
        let num = |s: &str, what: &str| -> Result<f64, String> {
            let v: f64 = s
                .trim_end_matches(['W', 'w'])
                .parse()
                .map_err(|_| format!("`{text}`: {what} `{s}` is not a number of watts"))?;
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(format!("`{text}`: {what} must be above 0 W"))
            }
        };
        let caps = CapSteps {
            max_w: num(max, "MAX")?,
            min_w: num(min, "MIN")?,
            step_w: num(step, "STEP")?,
        };
        if caps.min_w > caps.max_w {
            return Err(format!("`{text}`: MIN is above MAX"));
        }
        if caps.count() > MAX_CAPS {
            return Err(format!(
                "`{text}` makes {} caps; at most {MAX_CAPS}: take a larger STEP",
                caps.count()
            ));
        }
        Ok(caps)
    }

    /// The GPU's whole range in 8 steps (9 caps), on whole watts.
    pub fn over(limits: &PowerLimits) -> CapSteps {
        let step = ((limits.max_w - limits.min_w) / 8.0).round().max(1.0);
        CapSteps {
            max_w: limits.max_w,
            min_w: limits.min_w,
            step_w: step,
        }
    }

    fn count(&self) -> usize {
        ((self.max_w - self.min_w) / self.step_w + 1e-9).floor() as usize + 1
    }

    /// The caps, highest first: MAX, MAX − STEP, … down to MIN (MIN itself included).
    pub fn caps(&self) -> Vec<f64> {
        let mut caps: Vec<f64> = (0..self.count())
            .map(|k| self.max_w - k as f64 * self.step_w)
            .collect();
        if caps.last().is_some_and(|c| *c - self.min_w > 1e-6) {
            caps.push(self.min_w);
        }
        caps
    }
}

/// At most this many caps in one sweep.
pub const MAX_CAPS: usize = 64;

/// What to sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepConfig {
    pub gpu: u32,
    /// `None`: the GPU's whole range ([`CapSteps::over`]).
    pub caps: Option<CapSteps>,
    pub workload: Workload,
    /// Seconds at each cap before measuring (the clock and the temperature settle).
    pub warmup_s: f64,
    /// Seconds measured at each cap.
    pub window_s: f64,
    /// Seconds between reads of the GPU.
    pub poll_s: f64,
}

/// One cap's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    pub cap_w: f64,
    /// Work units a second over the window.
    pub throughput_per_s: f64,
    /// Mean board power over the window, W.
    pub power_w: f64,
    /// Joules per unit of work.
    pub energy_per_unit_j: f64,
    /// Units of work per joule (= per watt-second).
    pub perf_per_w: f64,
    /// Mean SM clock over the window, MHz.
    pub sm_clock_mhz: Option<f64>,
    /// Temperature at the end of the window, °C.
    pub temperature_c: Option<f64>,
    /// Throttle reasons seen in the window (NVML bits, or-ed).
    pub throttle_reasons: u64,
}

/// The knee of the curve (see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Knee {
    pub cap_w: f64,
    /// The first cap below the knee, whose throughput fell more than [`KNEE_DROP`]; `None`
    /// when no cap of the sweep fell off.
    pub falloff_at_w: Option<f64>,
}

/// A sweep's result: what `--json` prints and the curve file holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepResult {
    pub schema: String,
    pub label: Label,
    pub gpu: u32,
    pub gpu_name: Option<String>,
    pub workload: Workload,
    pub unit: WorkUnit,
    pub warmup_s: f64,
    pub window_s: f64,
    /// The cap before the sweep, put back after it.
    pub original_cap_w: f64,
    /// Whether the sweep was stopped (signal) before its last cap.
    pub stopped: bool,
    /// Highest cap first.
    pub points: Vec<SweepPoint>,
    pub knee: Option<Knee>,
    /// The cap with the most work per joule.
    pub best_perf_per_w_cap_w: Option<f64>,
}

/// Sweep `cfg.gpu` under a load from `loads`, then put its cap back. `stop` turning true ends
/// the sweep early (the result says so); the cap goes back in every case, errors included.
pub fn run(
    node: &mut dyn BenchNode,
    loads: &mut dyn Loads,
    cfg: &SweepConfig,
    stop: &AtomicBool,
) -> anyhow::Result<SweepResult> {
    let limits = node.limits(cfg.gpu)?;
    if let Some(p) = limits.problem() {
        anyhow::bail!("GPU {}'s power limits: {p}", cfg.gpu);
    }
    let steps = cfg.caps.unwrap_or_else(|| CapSteps::over(&limits));
    let caps = steps.caps();
    if let Some(c) = caps
        .iter()
        .find(|c| **c < limits.min_w - 1e-6 || **c > limits.max_w + 1e-6)
    {
        return Err(Refused(format!(
            "a cap of {c:.0} W is outside GPU {}'s range, {:.0}–{:.0} W",
            cfg.gpu, limits.min_w, limits.max_w
        ))
        .into());
    }
    let samples = node.samples()?;
    let first = sample_of(&samples, cfg.gpu)?.clone();
    let label = label_of(node, loads);
    let mut load = loads.start(cfg.gpu, cfg.workload, &first)?;
    let original = limits.current_w;
    let mut points = Vec::new();
    let outcome = caps.iter().try_for_each(|&cap| {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let why = format!("bench power-sweep: measuring at {cap:.0} W");
        node.set_cap(&[cfg.gpu], cap, &why)?;
        if let Some(p) = measure(node, load.as_mut(), cfg, cap, stop)? {
            points.push(p);
        }
        anyhow::Ok(())
    });
    let stopped = stop.load(Ordering::SeqCst);
    let stopped_load = load.stop();
    let why = match (&outcome, stopped) {
        (Err(_), _) => "bench power-sweep: failed, cap restored",
        (Ok(()), true) => "bench power-sweep: stopped, cap restored",
        (Ok(()), false) => "bench power-sweep: done, cap restored",
    };
    let restored = node.set_cap(&[cfg.gpu], original, why).map_err(|e| {
        anyhow::anyhow!(
            "GPU {}'s cap could not be put back to {original:.0} W ({e}): run `gpupilot power cap \
             {original:.0} --gpu {}`",
            cfg.gpu,
            cfg.gpu
        )
    });
    outcome?;
    restored?;
    stopped_load?;
    let knee = knee(&points);
    let best = best_perf_per_w(&points);
    Ok(SweepResult {
        schema: SCHEMA.into(),
        label,
        gpu: cfg.gpu,
        gpu_name: first.name.clone(),
        workload: cfg.workload,
        unit: cfg.workload.unit(),
        warmup_s: cfg.warmup_s,
        window_s: cfg.window_s,
        original_cap_w: original,
        stopped,
        points,
        knee,
        best_perf_per_w_cap_w: best,
    })
}

/// Hold `cap` for the warm-up, then measure a window; `None` when stopped before its end.
fn measure(
    node: &mut dyn BenchNode,
    load: &mut dyn Load,
    cfg: &SweepConfig,
    cap: f64,
    stop: &AtomicBool,
) -> anyhow::Result<Option<SweepPoint>> {
    if !hold(node, load, cfg, cfg.warmup_s, stop, &mut |_| {})? {
        return Ok(None);
    }
    let start = poll(node, load, cfg.gpu)?;
    let w0 = load.work();
    let mut powers = Vec::new();
    let mut clocks = Vec::new();
    let mut throttle = 0;
    let mut last = start.clone();
    let whole = hold(node, load, cfg, cfg.window_s, stop, &mut |s| {
        powers.extend(s.power_w);
        clocks.extend(s.sm_clock_mhz.map(f64::from));
        throttle |= s.throttle_reasons.unwrap_or(0);
        last = s.clone();
    })?;
    if !whole {
        return Ok(None);
    }
    let w1 = load.work();
    let seconds = w1.seconds - w0.seconds;
    if seconds <= 0.0 {
        anyhow::bail!("the load reported no time passing at {cap:.0} W");
    }
    let throughput = (w1.units - w0.units) / seconds;
    let power = match (start.energy_j, last.energy_j) {
        (Some(e0), Some(e1)) if last.time_s > start.time_s && e1 >= e0 => {
            (e1 - e0) / (last.time_s - start.time_s)
        }
        _ => mean(&powers).ok_or_else(|| {
            anyhow::anyhow!(
                "GPU {} reports neither an energy counter nor its power",
                cfg.gpu
            )
        })?,
    };
    Ok(Some(SweepPoint {
        cap_w: cap,
        throughput_per_s: throughput,
        power_w: power,
        energy_per_unit_j: if throughput > 0.0 {
            power / throughput
        } else {
            f64::INFINITY
        },
        perf_per_w: if power > 0.0 { throughput / power } else { 0.0 },
        sm_clock_mhz: mean(&clocks),
        temperature_c: last.temperature_c,
        throttle_reasons: throttle,
    }))
}

/// Let `seconds` pass in polls, each sample to `each`; false when `stop` turned true first.
fn hold(
    node: &mut dyn BenchNode,
    load: &mut dyn Load,
    cfg: &SweepConfig,
    seconds: f64,
    stop: &AtomicBool,
    each: &mut dyn FnMut(&GpuSample),
) -> anyhow::Result<bool> {
    let end = node.now_s() + seconds;
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let left = end - node.now_s();
        if left <= 1e-9 {
            return Ok(true);
        }
        node.wait(left.min(cfg.poll_s));
        let s = poll(node, load, cfg.gpu)?;
        each(&s);
    }
}

/// Read the GPU and show the load its sample.
pub(super) fn poll(
    node: &mut dyn BenchNode,
    load: &mut dyn Load,
    gpu: u32,
) -> anyhow::Result<GpuSample> {
    let samples = node.samples()?;
    let s = sample_of(&samples, gpu)?.clone();
    load.observe(node.now_s(), &s);
    Ok(s)
}

pub(super) fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The knee of `points` (see the module doc); `None` without points.
pub fn knee(points: &[SweepPoint]) -> Option<Knee> {
    let best = points
        .iter()
        .map(|p| p.throughput_per_s)
        .fold(0.0, f64::max);
    let mut by_cap: Vec<&SweepPoint> = points.iter().collect();
    by_cap.sort_by(|a, b| b.cap_w.total_cmp(&a.cap_w));
    let on_plateau = |p: &SweepPoint| p.throughput_per_s >= (1.0 - KNEE_DROP) * best;
    // A top cap below the plateau (a hot start) does not end it before it began.
    let from = by_cap.iter().position(|p| on_plateau(p))?;
    let mut knee = by_cap[from];
    for p in &by_cap[from + 1..] {
        if !on_plateau(p) {
            return Some(Knee {
                cap_w: knee.cap_w,
                falloff_at_w: Some(p.cap_w),
            });
        }
        knee = p;
    }
    Some(Knee {
        cap_w: knee.cap_w,
        falloff_at_w: None,
    })
}

/// The cap of the most work per joule (the higher throughput on a tie).
pub fn best_perf_per_w(points: &[SweepPoint]) -> Option<f64> {
    points
        .iter()
        .max_by(|a, b| {
            a.perf_per_w
                .total_cmp(&b.perf_per_w)
                .then(a.throughput_per_s.total_cmp(&b.throughput_per_s))
        })
        .map(|p| p.cap_w)
}
