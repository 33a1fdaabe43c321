//! The advisor: hints about a node and its runs, each with the numbers behind it and the action
//! that follows from it.
//!
//! Input is a window of recent telemetry (per-GPU points) and trainer metrics, plus the knob
//! and cap changes made in it ([`AdvisorInput`]); output is a list of [`Hint`]s. Every hint
//! needs evidence from inside the window (`Thresholds::window_s`, five minutes by default):
//! older data, too few points or a window too short says nothing. The rules:
//!
//! - **data stall**: the trainer waits for data a large share of each step and GPU utilization
//!   dips → raise the prefetch depth;
//! - **memory headroom**: the run's GPUs use well under their memory → raise the batch size,
//!   with the memory it is predicted to use (fitted from two batch sizes when the window has
//!   them, else the conservative `used × new/old`);
//! - **power-cap throttling**: clocks held down by a cap set below the default → back to the
//!   default;
//! - **thermal throttling**: thermal slowdown, or the temperature at its threshold → a thermal
//!   target a few degrees below it;
//! - **idle GPU drawing power**: a GPU a run holds that has done nothing all window → stop the
//!   run;
//! - **throughput drop after a change**: samples/s fell after a knob or cap change → undo it.
//!
//! Pure: no I/O, no clock (the caller passes `now`). [`adapt`] builds the input from what the
//! daemon keeps (history, metrics reports); `gpupilot advise` prints the hints.

pub mod adapt;
mod rules;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::telemetry::GpuSample;

/// One GPU at one moment, as the advisor needs it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuPoint {
    pub t: f64,
    pub util_pct: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub power_default_w: Option<f64>,
    pub power_max_w: Option<f64>,
    pub temperature_c: Option<f64>,
    pub temp_slowdown_c: Option<f64>,
    /// NVML clocks-event reason bits ([`crate::telemetry::throttle`]).
    pub throttle_reasons: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
}

impl GpuPoint {
    /// The fields the advisor reads from a telemetry sample; `None` for a lost or stale GPU,
    /// whose values are not current.
    pub fn from_sample(s: &GpuSample) -> Option<GpuPoint> {
        if s.lost || s.stale {
            return None;
        }
        Some(GpuPoint {
            t: s.time_s,
            util_pct: s.util_gpu_pct,
            memory_used_bytes: s.memory_used_bytes,
            memory_total_bytes: s.memory_total_bytes,
            power_w: s.power_w,
            power_limit_w: s.power_limit_w,
            power_default_w: s.power_default_w,
            power_max_w: s.power_max_w,
            temperature_c: s.temperature_c,
            temp_slowdown_c: s.temp_slowdown_c,
            throttle_reasons: s.throttle_reasons,
            sm_clock_mhz: s.sm_clock_mhz,
            sm_clock_max_mhz: s.sm_clock_max_mhz,
        })
    }
}

/// One GPU's recent points, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSeries {
    pub index: u32,
    pub points: Vec<GpuPoint>,
}

/// One trainer metrics report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsPoint {
    pub t: f64,
    pub step: Option<u64>,
    pub samples_per_s: Option<f64>,
    pub step_time_s: Option<f64>,
    pub data_wait_s: Option<f64>,
    pub batch_size: Option<u32>,
    pub prefetch: Option<u32>,
}

/// What a change touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Knob {
    BatchSize,
    Prefetch,
    /// A power cap on one of the run's GPUs, watts.
    PowerCap,
}

impl Knob {
    pub fn name(self) -> &'static str {
        match self {
            Knob::BatchSize => "batch-size",
            Knob::Prefetch => "prefetch",
            Knob::PowerCap => "power cap",
        }
    }
}

/// A change made at `t`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KnobChange {
    pub t: f64,
    pub knob: Knob,
    pub old: f64,
    pub new: f64,
    /// For a power cap: the GPU.
    pub gpu: Option<u32>,
}

/// A run: its GPUs, its metrics and changes, and the ranges its knobs may take.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunWindow {
    pub run: String,
    /// GPU indices the run uses (empty: unknown, every GPU counts).
    pub gpus: Vec<u32>,
    /// Oldest first.
    pub metrics: Vec<MetricsPoint>,
    pub changes: Vec<KnobChange>,
    /// Inclusive ranges from the profile or the trainer; `None`: unbounded above 1.
    pub batch_range: Option<(u32, u32)>,
    pub prefetch_range: Option<(u32, u32)>,
}

/// Everything the advisor looks at.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AdvisorInput {
    /// Now, seconds since the epoch (the same clock as the points).
    pub now: f64,
    pub gpus: Vec<GpuSeries>,
    pub runs: Vec<RunWindow>,
}

/// Where each rule draws its line (the defaults below are what the console uses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    /// Only points this recent count, seconds.
    pub window_s: f64,
    /// Points a rule needs at least (metrics reports or GPU samples).
    pub min_points: usize,
    /// And the time they must span, seconds.
    pub min_span_s: f64,
    /// Data stall: data wait at least this share of the step time…
    pub stall_wait_share: f64,
    /// …and GPU utilization below this mean, percent.
    pub stall_util_pct: f64,
    /// Memory headroom: peak use at most this share of memory…
    pub headroom_used_share: f64,
    /// …and the larger batch predicted to fit in this share.
    pub headroom_fit_share: f64,
    /// Throttling: the reason bit set in at least this share of the samples.
    pub throttle_share: f64,
    /// Power-cap throttling also needs the mean clock below this share of the max.
    pub throttle_clock_share: f64,
    /// Thermal: or the temperature within this many degrees of slowdown.
    pub thermal_margin_c: f64,
    /// Idle: utilization at most this, percent, in every sample…
    pub idle_util_pct: f64,
    /// …over at least this long, seconds…
    pub idle_min_s: f64,
    /// …while drawing at least this much, watts.
    pub idle_power_w: f64,
    /// Throughput drop: the mean after a change below the mean before by this share.
    pub drop_share: f64,
    /// Reports in the first seconds after a change are the run settling, not its new speed.
    pub drop_settle_s: f64,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds {
            window_s: 300.0,
            min_points: 5,
            min_span_s: 20.0,
            stall_wait_share: 0.15,
            stall_util_pct: 90.0,
            headroom_used_share: 0.6,
            headroom_fit_share: 0.9,
            throttle_share: 0.5,
            throttle_clock_share: 0.9,
            thermal_margin_c: 2.0,
            idle_util_pct: 2.0,
            idle_min_s: 120.0,
            idle_power_w: 40.0,
            drop_share: 0.1,
            drop_settle_s: 10.0,
        }
    }
}

/// What a hint is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HintKind {
    DataStall,
    MemoryHeadroom,
    PowerCapThrottle,
    ThermalThrottle,
    IdleDrawingPower,
    ThroughputDrop,
}

/// One number behind a hint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub name: String,
    pub value: f64,
    pub unit: String,
}

impl Evidence {
    fn new(name: &str, value: f64, unit: &str) -> Evidence {
        Evidence {
            name: name.to_string(),
            value,
            unit: unit.to_string(),
        }
    }
}

/// The change a hint proposes: one key away in the console, one command on the CLI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Suggestion {
    SetKnob { run: String, knob: Knob, value: f64 },
    PowerCap { gpu: u32, watts: f64 },
    ThermalTarget { gpu: u32, celsius: f64 },
    StopRun { run: String },
}

impl Suggestion {
    /// The same change as a command line.
    pub fn command(&self) -> String {
        match self {
            Suggestion::SetKnob {
                run,
                knob: Knob::PowerCap,
                value,
            } => format!("gpupilot power cap {value:.0} # run {run}"),
            Suggestion::SetKnob { run, knob, value } => {
                format!("gpupilot set {run} {} {value:.0}", knob.name())
            }
            Suggestion::PowerCap { gpu, watts } => {
                format!("gpupilot power cap {watts:.0} --gpu {gpu}")
            }
            Suggestion::ThermalTarget { gpu, celsius } => {
                format!("gpupilot thermal target {celsius:.0} --gpu {gpu}")
            }
            Suggestion::StopRun { run } => format!("gpupilot stop {run}"),
        }
    }
}

/// One piece of advice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hint {
    pub kind: HintKind,
    pub gpu: Option<u32>,
    pub run: Option<String>,
    /// One line, with the key numbers in it.
    pub summary: String,
    pub evidence: Vec<Evidence>,
    pub action: Option<Suggestion>,
}

/// Every hint the window supports, runs first, then GPUs in index order.
pub fn advise(input: &AdvisorInput, th: &Thresholds) -> Vec<Hint> {
    let w = rules::Window::new(input, th);
    let mut hints = Vec::new();
    for run in &input.runs {
        hints.extend(rules::data_stall(&w, run));
        hints.extend(rules::memory_headroom(&w, run));
        hints.extend(rules::throughput_drop(&w, run));
    }
    for gpu in &input.gpus {
        hints.extend(rules::power_cap_throttle(&w, gpu));
        hints.extend(rules::thermal_throttle(&w, gpu));
        hints.extend(rules::idle_drawing_power(&w, gpu));
    }
    hints
}
