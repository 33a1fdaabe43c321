//! A simulated node: several GPUs sharing an ambient temperature and one fixed-step clock.
//!
//! Time is kept as a whole number of steps, so `time_s()` never drifts and two nodes fed the same
//! calls stay bit-identical.
//!
//! A node may carry scheduled [`CoolingFault`]s: from its `at_s`, one GPU's thermal resistance
//! is multiplied by the fault's factor (see [`crate::Gpu::set_cooling_scale`]), so that GPU
//! alone runs hot and, under load, reaches its slowdown temperature and throttles while its
//! siblings do not — a straggler with a physical cause.

use serde::{Deserialize, Serialize};

use crate::catalog::find;
use crate::error::SimError;
use crate::gpu::Gpu;
use crate::rng::SplitMix64;
use crate::workload::{Training, TrainingConfig};

/// Boards differ: thermal resistance varies by up to ±this fraction around the spec.
const THERMAL_RESISTANCE_SPREAD: f64 = 0.04;
/// Loader jitter varies by up to ±this fraction around the default.
const DATA_JITTER_SPREAD: f64 = 0.3;

/// What to simulate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeConfig {
    /// Spec ids (or anything `find` accepts), one per GPU.
    pub gpus: Vec<String>,
    pub ambient_c: f64,
    pub seed: u64,
    /// Fixed simulation step, seconds.
    pub step_s: f64,
    /// Job started on every GPU at creation, if any.
    pub training: Option<TrainingConfig>,
}

impl Default for NodeConfig {
    /// Four H100 SXM at 25 C, each training ResNet-50 (batch 256, prefetch 2, 8 workers).
    fn default() -> NodeConfig {
        NodeConfig {
            gpus: vec!["h100-sxm".to_string(); 4],
            ambient_c: 25.0,
            seed: 0,
            step_s: 0.1,
            training: Some(TrainingConfig {
                model: "resnet50".to_string(),
                batch_size: 256,
                prefetch_depth: 2,
                workers: 8,
            }),
        }
    }
}

/// A fault in one GPU's cooling from a given moment on: a fan that stops, a heatsink clogged
/// with dust, a neighbour's exhaust drawn into the inlet. Heat leaves the board
/// `thermal_resistance_scale` times harder, so under load it settles at `ambient + scale·R·P`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoolingFault {
    /// The GPU's index in the node.
    pub gpu: usize,
    /// Simulated seconds since the node started.
    pub at_s: f64,
    /// What the thermal resistance is multiplied by (within
    /// [`crate::gpu::COOLING_SCALE_RANGE`]).
    pub thermal_resistance_scale: f64,
}

/// The simulated machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    config: NodeConfig,
    steps: u64,
    ambient_c: f64,
    gpus: Vec<Gpu>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    cooling_faults: Vec<CoolingFault>,
}

impl Node {
    /// Build the node; errors on an unknown GPU or model, or a step that is not positive.
    pub fn new(cfg: &NodeConfig) -> Result<Node, SimError> {
        if !(cfg.step_s > 0.0 && cfg.step_s.is_finite()) {
            return Err(SimError::OutOfRange {
                what: "simulation step (s)",
                value: cfg.step_s,
                min: f64::MIN_POSITIVE,
                max: f64::MAX,
            });
        }
        let training = cfg.training.clone().map(Training::new).transpose()?;
        let mut master = SplitMix64::new(cfg.seed);
        let gpus = cfg
            .gpus
            .iter()
            .map(|id| {
                let spec = find(id).ok_or_else(|| SimError::UnknownGpu(id.clone()))?;
                let mut gpu = Gpu::with_seed(spec, cfg.ambient_c, master.next_u64());
                gpu.stagger(
                    1.0 + THERMAL_RESISTANCE_SPREAD * master.next_signed(),
                    1.0 + DATA_JITTER_SPREAD * master.next_signed(),
                );
                gpu.set_training(training.clone());
                Ok(gpu)
            })
            .collect::<Result<Vec<_>, SimError>>()?;
        Ok(Node {
            config: cfg.clone(),
            steps: 0,
            ambient_c: cfg.ambient_c,
            gpus,
            cooling_faults: Vec::new(),
        })
    }

    /// Schedule `fault` (a GPU index past the end, or a factor out of range, is refused). It
    /// takes effect at the first step that starts at or after its `at_s`; several faults on
    /// one GPU multiply.
    pub fn add_cooling_fault(&mut self, fault: CoolingFault) -> Result<(), SimError> {
        let gpu = self
            .gpus
            .get(fault.gpu)
            .ok_or(SimError::NoSuchGpu(fault.gpu))?;
        // Checked by the GPU's own setter, on a copy, so a bad factor changes nothing.
        gpu.clone()
            .set_cooling_scale(fault.thermal_resistance_scale)?;
        if !fault.at_s.is_finite() {
            return Err(SimError::OutOfRange {
                what: "cooling fault start (s)",
                value: fault.at_s,
                min: 0.0,
                max: f64::MAX,
            });
        }
        self.cooling_faults.push(fault);
        Ok(())
    }

    /// Let every GPU's load move as a busy node's does (see [`crate::Activity`]); `None`
    /// makes them steady. A pattern out of range is refused and changes nothing.
    pub fn set_activity(&mut self, activity: Option<crate::Activity>) -> Result<(), SimError> {
        // Every GPU gets the same pattern, so a bad one is refused by the first, unchanged.
        for gpu in &mut self.gpus {
            gpu.set_activity(activity.clone())?;
        }
        Ok(())
    }

    /// The cooling faults scheduled, in effect or not.
    pub fn cooling_faults(&self) -> &[CoolingFault] {
        &self.cooling_faults
    }

    /// The config the node was built from (ambient as at creation).
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Simulated seconds since start.
    pub fn time_s(&self) -> f64 {
        self.steps as f64 * self.config.step_s
    }

    /// Whole steps taken since start.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// One fixed step of `config().step_s`.
    pub fn step(&mut self) {
        if !self.cooling_faults.is_empty() {
            let now = self.time_s();
            for (i, gpu) in self.gpus.iter_mut().enumerate() {
                let mut scale = None;
                for f in self.cooling_faults.iter().filter(|f| f.gpu == i) {
                    let s = if f.at_s <= now {
                        f.thermal_resistance_scale
                    } else {
                        1.0
                    };
                    scale = Some(scale.unwrap_or(1.0) * s);
                }
                if let Some(s) = scale {
                    let (min, max) = crate::gpu::COOLING_SCALE_RANGE;
                    // Checked when added; the product of several is kept within range.
                    let _ = gpu.set_cooling_scale(s.clamp(min, max));
                }
            }
        }
        for gpu in &mut self.gpus {
            gpu.step(self.config.step_s, self.ambient_c);
        }
        self.steps += 1;
    }

    /// Take whole steps while `time + step <= t_s`; never goes backwards. A relative tolerance of
    /// 1e-9 steps absorbs float rounding, so `advance_to(0.3)` with 0.1 s steps takes 3 steps.
    pub fn advance_to(&mut self, t_s: f64) {
        let step = self.config.step_s;
        while ((self.steps + 1) as f64 * step) <= t_s + 1e-9 * step {
            self.step();
        }
    }

    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    pub fn gpu(&self, i: usize) -> Option<&Gpu> {
        self.gpus.get(i)
    }

    pub fn gpu_mut(&mut self, i: usize) -> Option<&mut Gpu> {
        self.gpus.get_mut(i)
    }

    /// As [`Node::gpu_mut`], with an error naming the index for callers that propagate.
    pub fn try_gpu_mut(&mut self, i: usize) -> Result<&mut Gpu, SimError> {
        self.gpus.get_mut(i).ok_or(SimError::NoSuchGpu(i))
    }

    pub fn ambient_c(&self) -> f64 {
        self.ambient_c
    }

    pub fn set_ambient_c(&mut self, c: f64) {
        self.ambient_c = c;
    }
}
