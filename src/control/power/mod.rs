//! Power caps, SM clock locks and the driver's own target temperature ("GPU max"), through NVML
//! or the simulator.
//!
//! - [`GpuControl`]: what the daemon needs beyond [`PowerControl`]: clock locks and the GPU-max
//!   threshold. Implemented for [`NvmlSource`](crate::telemetry::nvml::NvmlSource) in `nvml`
//!   and for [`SimSource`](crate::telemetry::sim::SimSource) in `sim`, so the daemon's control
//!   handle is the very object it samples.
//! - `check`: range checks made before any setter is called, with messages that give the range.
//! - `originals`: the values found before the first change (`$STATE/control/originals.json`),
//!   written before the change so a crash loses nothing, and restored by `reset`.
//!
//! This module changes GPU settings only when asked; deciding when (the governor, the budget)
//! lives elsewhere.

pub mod check;
mod nvml;
pub mod originals;
pub mod sim;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{ControlError, PowerControl};
use crate::telemetry::Source;

pub use check::{check_clocks, check_gpu_max, check_power};
pub use originals::{GpuOriginals, Originals};

/// The lowest GPU-max target gpupilot sets, °C: below it a GPU would slow down at idle.
pub const GPU_MAX_FLOOR_C: f64 = 40.0;

/// The SM clock range a lock may use, MHz.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockRange {
    pub min_mhz: u32,
    pub max_mhz: u32,
}

/// The driver's target temperature ("GPU max operating", what `nvidia-smi -gtt` sets) and the
/// range gpupilot accepts for it, °C.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TempTarget {
    pub current_c: f64,
    pub min_c: f64,
    pub max_c: f64,
}

/// Settings beyond the power cap: locked SM clocks and the GPU-max threshold.
pub trait GpuControl: PowerControl {
    /// The GPU's UUID, to tell after a reboot whether a recorded original still belongs to it.
    fn gpu_uuid(&self, gpu: usize) -> Option<String>;
    /// The SM clocks a lock may name.
    fn clock_range(&self, gpu: usize) -> Result<ClockRange, ControlError>;
    /// Hold the SM clock within `[min_mhz, max_mhz]` (NVML locked clocks).
    fn lock_clocks(&self, gpu: usize, min_mhz: u32, max_mhz: u32) -> Result<(), ControlError>;
    /// Let the driver choose the SM clock again.
    fn reset_clocks(&self, gpu: usize) -> Result<(), ControlError>;
    /// The GPU-max threshold now; `NotSupported` where the GPU has none to set.
    fn gpu_max_temp(&self, gpu: usize) -> Result<TempTarget, ControlError>;
    /// Set the GPU-max threshold, whole °C (NVML takes an integer).
    fn set_gpu_max_temp(&self, gpu: usize, celsius: i32) -> Result<(), ControlError>;
}

/// A telemetry source and the control handle over the same GPUs (one object, two views).
pub struct Node {
    pub source: Arc<dyn Source>,
    pub control: Arc<dyn GpuControl>,
    /// The same object as a [`PowerControl`], for the control loops.
    pub power: Arc<dyn PowerControl>,
}

impl Node {
    /// Both views of one object that samples and controls.
    pub fn of<T: Source + GpuControl + 'static>(x: Arc<T>) -> Node {
        Node {
            source: x.clone(),
            control: x.clone(),
            power: x,
        }
    }
}

/// Open the source `kind` names with its control handle (see `telemetry::open`).
pub fn open_node(
    kind: crate::telemetry::open::SourceKind,
    nvml_lib: Option<&std::path::Path>,
    sim: &crate::telemetry::open::SimSpec,
) -> Result<Node, crate::telemetry::open::OpenError> {
    use crate::telemetry::open::{Opened, open};
    Ok(match open(kind, nvml_lib, sim)? {
        Opened::Sim(s) => Node::of(Arc::new(s)),
        Opened::Nvml(n) => Node::of(Arc::<crate::telemetry::nvml::NvmlSource>::from(n)),
    })
}

/// `250 W`, `212.5 W`.
pub fn watts(w: f64) -> String {
    if (w - w.round()).abs() < 0.05 {
        format!("{:.0} W", w)
    } else {
        format!("{:.1} W", w)
    }
}

/// What a change needs when NVML says NO_PERMISSION: the fix, in words.
pub fn needs_root(what: &str, gpu: usize) -> ControlError {
    ControlError::NoPermission(format!(
        "{what} on GPU {gpu} needs root (NVML answered NO_PERMISSION): start a root daemon with \
         `sudo gpupilot daemon --system` and use it with `gpupilot --system …` (or \
         GPUPILOT_SYSTEM=1), or connect to a daemon that runs as root"
    ))
}
