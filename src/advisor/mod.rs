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
//! - **power-cap throttling**: clocks held down by a cap a person set below the default → back
//!   to the default;
//! - **thermal throttling**: thermal slowdown, or the temperature at its threshold → a thermal
//!   target a few degrees below it;
//! - **idle GPU drawing power**: a GPU a run holds that has done nothing all window → stop the
//!   run;
//! - **throughput drop after a change**: samples/s fell after a knob or cap change → undo it;
//! - **measured cap**: a busy GPU capped well above the cap at which a `bench power-sweep` of
//!   its model did the most work per joule, and that cap does at least 10 % more work per
//!   joule than its own → that cap, or `tune energy` on its run;
//! - **straggler** (a job of several ranks): one rank's own step time well above the median of
//!   the others', named with the cause its GPU shows (thermal slowdown, power cap, a degraded
//!   PCIe link, another process on it) or its own input pipeline, and the command that acts
//!   on it ([`straggler`]);
//! - **tuned cap**: the energy tuner's choice holds a GPU's cap, but the run's throughput or
//!   power moved more than `Thresholds::workload_shift` from what the search measured there
//!   (or another run trains on its GPUs) → search again (`voice`).
//!
//! One voice (docs/operations.md): the input says who holds each GPU's cap
//! ([`crate::control::owner`]). A cap the thermal governor, the node budget, an energy search or
//! the tuner's choice holds is never called a throttle to remove, a change to undo or a sweep to
//! follow; the tuner's choice is questioned only by the tuned-cap hint, which names it and says
//! why it no longer holds. A cap or thermal target proposed for a GPU of a job of several GPUs
//! acts on all of them (a cap on one rank makes it the job's straggler).
//!
//! Pure: no I/O, no clock (the caller passes `now`). [`adapt`] builds the input from what the
//! daemon keeps (history, metrics reports; `client::advise` reads them); [`text`] puts the hints
//! in words, as `gpupilot advise` prints them.

pub mod adapt;
mod rules;
pub mod straggler;
#[cfg(test)]
mod tests;
pub mod text;
mod voice;

use serde::{Deserialize, Serialize};

use crate::control::owner::GpuOwner;
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

/// One GPU's recent points, oldest first, and its newest sample whole (throttle reasons,
/// processes, PCIe link: what history does not keep).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSeries {
    pub index: u32,
    pub points: Vec<GpuPoint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest: Option<GpuSample>,
}

/// One trainer metrics report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepPoint {
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

/// One rank of a job of several: who it is, its GPU, and its own reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankWindow {
    pub rank: u32,
    /// The physical index of the GPU it trains on, where it said.
    pub gpu: Option<u32>,
    pub host: Option<String>,
    pub pid: Option<u32>,
    /// Its reports, oldest first.
    pub metrics: Vec<StepPoint>,
}

/// A run: its GPUs, its metrics and changes, and the ranges its knobs may take.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunWindow {
    pub run: String,
    /// GPU indices the run uses (empty: unknown, every GPU counts).
    pub gpus: Vec<u32>,
    /// Oldest first.
    pub metrics: Vec<StepPoint>,
    pub changes: Vec<KnobChange>,
    /// Inclusive ranges from the profile or the trainer; `None`: unbounded above 1.
    pub batch_range: Option<(u32, u32)>,
    pub prefetch_range: Option<(u32, u32)>,
    /// A job of several ranks: each rank's reports (empty for a single process).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankWindow>,
    /// The job's samples per second now, summed over its ranks (`JobFigures`), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_samples_per_s: Option<f64>,
}

/// Everything the advisor looks at.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AdvisorInput {
    /// Now, seconds since the epoch (the same clock as the points).
    pub now: f64,
    pub gpus: Vec<GpuSeries>,
    pub runs: Vec<RunWindow>,
    /// Power-sweep curves kept for GPU models of the node (`gpupilot bench power-sweep`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub curves: Vec<CapCurve>,
    /// Who holds each GPU's cap ([`crate::control::owner::owners`]); a GPU not listed: unknown,
    /// taken as a person's cap.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owners: Vec<GpuOwner>,
}

/// A GPU model's measured work at each cap: what `bench power-sweep` keeps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CapCurve {
    /// The GPU's name as NVML gives it.
    pub model: String,
    /// `measured` or `simulated`.
    pub label: String,
    /// `(cap W, work per second, power W)`, any order.
    pub points: Vec<(f64, f64, f64)>,
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
    /// Straggler: a rank's own step time at least this many times the median of the others'
    /// ([`straggler::RATIO`])…
    pub straggler_ratio: f64,
    /// …over each rank's newest this many reports in the window ([`straggler::REPORTS`])…
    pub straggler_reports: usize,
    /// …of which every rank compared has at least this many ([`straggler::MIN_REPORTS`]).
    pub straggler_min_reports: usize,
    /// Tuned cap: the run's throughput or power off what the search measured at its cap by
    /// more than this share means the workload changed since.
    pub workload_shift: f64,
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
            straggler_ratio: straggler::RATIO,
            straggler_reports: straggler::REPORTS,
            straggler_min_reports: straggler::MIN_REPORTS,
            workload_shift: 0.15,
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
    /// A measured power sweep of the GPU's model does much more work per joule below its cap.
    MeasuredCap,
    ThroughputDrop,
    /// One rank of a job of several holds the others back.
    Straggler,
    /// The energy tuner's cap no longer fits the workload it was measured on.
    TunedCap,
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
    SetKnob {
        run: String,
        knob: Knob,
        value: f64,
    },
    /// A cap on `gpus`: every GPU of the job where the GPU is one of a job's.
    PowerCap {
        gpus: Vec<u32>,
        watts: f64,
    },
    ThermalTarget {
        gpus: Vec<u32>,
        celsius: f64,
    },
    StopRun {
        run: String,
    },
    /// A new energy search on `run`.
    TuneEnergy {
        run: String,
        eta: f64,
    },
}

/// `0,1,3`, as `--gpu` takes it.
pub fn gpu_list(gpus: &[u32]) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
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
            Suggestion::PowerCap { gpus, watts } => {
                format!("gpupilot power cap {watts:.0} --gpu {}", gpu_list(gpus))
            }
            Suggestion::ThermalTarget { gpus, celsius } => {
                format!(
                    "gpupilot thermal target {celsius:.0} --gpu {}",
                    gpu_list(gpus)
                )
            }
            Suggestion::StopRun { run } => format!("gpupilot stop {run}"),
            Suggestion::TuneEnergy { run, eta } => {
                format!("gpupilot tune energy {run} --eta {eta}")
            }
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

/// Every hint the window supports, runs first, then GPUs in index order. A GPU whose
/// throttling a straggler hint already names (with the job it holds back) gets no throttling
/// hint of its own; a cap the loops or the tuner hold gets none either (see the module doc),
/// and a proposal for a job's GPU acts on the whole job, said once.
pub fn advise(input: &AdvisorInput, th: &Thresholds) -> Vec<Hint> {
    let w = rules::Window::new(input, th);
    let mut hints = Vec::new();
    let mut named: Vec<(u32, HintKind)> = Vec::new();
    for run in &input.runs {
        if let Some(v) = straggler::assess(&w, run) {
            if let (Some(h), Some(c)) = (v.hint, v.cause) {
                if let (Some(g), Some(k)) = (h.gpu, straggler::covers(c)) {
                    named.push((g, k));
                }
                hints.push(h);
            }
        }
        hints.extend(rules::data_stall(&w, run));
        hints.extend(rules::memory_headroom(&w, run));
        hints.extend(rules::throughput_drop(&w, run));
    }
    for gpu in &input.gpus {
        let told = |k: HintKind| named.contains(&(gpu.index, k));
        if !told(HintKind::PowerCapThrottle) {
            hints.extend(rules::power_cap_throttle(&w, gpu));
        }
        if !told(HintKind::ThermalThrottle) {
            hints.extend(rules::thermal_throttle(&w, gpu));
        }
        hints.extend(rules::idle_drawing_power(&w, gpu));
        hints.extend(rules::measured_cap(&w, gpu));
    }
    hints.extend(voice::tuned_caps(&w));
    voice::one_voice(&w, hints)
}

/// The straggler verdict on every run of several ranks in `input` (what the daemon turns into
/// an alert): how far its slowest rank is behind, and the hint when it is a straggler.
pub fn stragglers(input: &AdvisorInput, th: &Thresholds) -> Vec<straggler::Verdict> {
    let w = rules::Window::new(input, th);
    input
        .runs
        .iter()
        .filter(|r| r.ranks.len() >= 2)
        .map(|r| {
            straggler::assess(&w, r).unwrap_or_else(|| straggler::Verdict {
                run: r.run.clone(),
                spread: None,
                cause: None,
                hint: None,
            })
        })
        .collect()
}
