//! Control: what gpupilot changes on the GPUs, and the loops that decide it.
//!
//! - `power`: power caps, clock locks and the driver's thermal target, through NVML or the
//!   simulator; the original values are recorded before the first change and restorable.
//! - `governor`: the thermal governor (PI control of the power cap toward a target temperature).
//! - `budget`: the node power budget (the sum of caps never exceeds it; caps follow demand).
//! - `energy`: energy per GPU (NVML's counter, else power integrated) and per run (J, kWh,
//!   J/sample, cost).
//! - `energy_ledger`: a live run's energy and the GPUs' counters in its directory, so a daemon
//!   restart (even kill -9) loses none of it.
//! - `alerts`: thresholds on temperature, power, ECC, lost GPUs and stalled runs.
//! - `jobs`: one cap for all the GPUs of a data-parallel job (the governor's and the budget's
//!   decisions per job, so capping one GPU does not make its rank the straggler).
//! - `node`: the loops of one node per snapshot (governors, budget, energy, alerts), which the
//!   daemon drives; `settings`: the daemon's `control.toml`; `status`: what clients are shown.
//! - `tuner`: the energy-optimal power-cap search (Zeus's cost).
//! - `owner`: who holds each GPU's cap now (governor, budget, tuner, a person), for "one voice".
//! - `bench`: the power sweep and the burn (`gpupilot bench power-sweep|burn`), on a node and a
//!   load behind traits (the daemon and CUDA, or gpusim).

pub mod alerts;
pub mod bench;
pub mod budget;
pub mod energy;
pub mod energy_ledger;
pub mod governor;
pub mod jobs;
pub mod node;
pub mod owner;
pub mod power;
pub mod settings;
pub mod status;
pub mod tuner;

pub use node::ControlEvent;

use serde::{Deserialize, Serialize};

/// One GPU's power-limit figures, watts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PowerLimits {
    /// The management limit set now.
    pub current_w: f64,
    /// The limit the GPU enforces (the lowest of every limiter), where known.
    pub enforced_w: Option<f64>,
    pub default_w: f64,
    pub min_w: f64,
    pub max_w: f64,
}

impl PowerLimits {
    /// Why these figures cannot be acted on (see [`limits_problem`]), or None.
    pub fn problem(&self) -> Option<String> {
        limits_problem(self.current_w, self.min_w, self.max_w)
    }
}

/// Why a GPU whose management limit reads `current_w` within `[min_w, max_w]` must not be
/// controlled, in words, or None when the figures are plausible. A limit of 0 W (a driver
/// oddity, NVML's `power_limit_zero`), a NaN, a range upside down or a limit outside its range
/// is no basis for moving a cap: a controller acting on it drives the GPU to a bound and leaves
/// it there, and nobody knows what to restore.
pub fn limits_problem(current_w: f64, min_w: f64, max_w: f64) -> Option<String> {
    // NVML rounds to milliwatts and drivers to whole watts: a watt of slack on either side.
    const SLACK_W: f64 = 1.0;
    if !(current_w.is_finite() && min_w.is_finite() && max_w.is_finite()) {
        return Some(format!(
            "its power limits do not read as numbers (limit {current_w} W, range {min_w}–{max_w} W)"
        ));
    }
    if min_w <= 0.0 || max_w <= 0.0 {
        return Some(format!(
            "its power-limit range reads {min_w:.0}–{max_w:.0} W"
        ));
    }
    if min_w > max_w {
        return Some(format!(
            "its power-limit range is upside down ({min_w:.0} W above {max_w:.0} W)"
        ));
    }
    if current_w <= 0.0 {
        return Some(format!("its power limit reads {current_w:.0} W"));
    }
    if current_w < min_w - SLACK_W || current_w > max_w + SLACK_W {
        return Some(format!(
            "its power limit reads {current_w:.0} W, outside its range {min_w:.0}–{max_w:.0} W"
        ));
    }
    None
}

/// Why a change was not made. Messages are for people and say what to do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ControlError {
    /// The caller may not change this (NVML_ERROR_NO_PERMISSION).
    #[error("{0}")]
    NoPermission(String),
    /// The value is outside what the GPU allows.
    #[error("{0}")]
    OutOfRange(String),
    /// The GPU or driver cannot do this (NOT_SUPPORTED, a missing symbol).
    #[error("{0}")]
    NotSupported(String),
    /// No such GPU, or it is lost.
    #[error("{0}")]
    NoGpu(String),
    #[error("{0}")]
    Failed(String),
}

/// What the control loops (governor, budget, tuner) need from a node: read the limits and set
/// a cap. Implemented for NVML and the simulator in `power`; tests implement it over gpusim.
pub trait PowerControl: Send + Sync {
    fn gpu_count(&self) -> usize;
    fn power_limits(&self, gpu: usize) -> Result<PowerLimits, ControlError>;
    /// Set GPU `gpu`'s management power limit (NVML takes milliwatts; this is watts).
    fn set_power_limit_w(&self, gpu: usize, watts: f64) -> Result<(), ControlError>;
}
