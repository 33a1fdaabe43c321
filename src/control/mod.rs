//! Control: what gpupilot changes on the GPUs, and the loops that decide it.
//!
//! - `power`: power caps, clock locks and the driver's thermal target, through NVML or the
//!   simulator; the original values are recorded before the first change and restorable.
//! - `governor`: the thermal governor (PI control of the power cap toward a target temperature).
//! - `budget`: the node power budget (the sum of caps never exceeds it; caps follow demand).
//! - `energy`: energy per GPU (NVML's counter, else power integrated) and per run (J, kWh,
//!   J/sample, cost).
//! - `alerts`: thresholds on temperature, power, ECC, lost GPUs and stalled runs.
//! - `jobs`: one cap for all the GPUs of a data-parallel job (the governor's and the budget's
//!   decisions per job, so capping one GPU does not make its rank the straggler).
//! - `node`: the loops of one node per snapshot (governors, budget, energy, alerts), which the
//!   daemon drives; `settings`: the daemon's `control.toml`; `status`: what clients are shown.
//! - `tuner`: the energy-optimal power-cap search (Zeus's cost).

pub mod alerts;
pub mod budget;
pub mod energy;
pub mod governor;
pub mod jobs;
pub mod node;
pub mod power;
pub mod settings;
pub mod status;
pub mod tuner;

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
