//! GPU benchmarks that act on the node: the perf-per-watt sweep over power caps
//! (`gpupilot bench power-sweep`, [`sweep`]) and the sustained burn with its thermal verdict
//! (`gpupilot bench burn`, [`burn`]).
//!
//! Both are written against two narrow traits, so the same logic runs on real GPUs, on a daemon
//! over the simulator, and on an in-process gpusim node in simulated time (unit tests):
//!
//! - [`BenchNode`]: the node as the daemon sees it: its newest GPU samples, power limits, caps
//!   (set through the daemon's control, so each change is audited in the node's events), and a
//!   clock to wait on. `client::bench` implements it over the daemon's socket; [`sim::SimBench`]
//!   over a gpusim node it steps itself.
//! - [`Loads`] / [`Load`]: the work put on a GPU and how much of it is done (FLOPs of a GEMM,
//!   bytes of a device-to-device copy). A CUDA load counts on the device; [`sim::SimLoads`]
//!   integrates the throughput gpusim's model gives at the clock the GPU reports.
//!
//! Every figure carries a [`Label`]: `simulated` when the GPUs or the load are the simulator's.
//! Nothing here parses arguments or prints.

pub mod burn;
pub mod cuda;
pub mod curve;
pub mod sim;
pub mod sweep;

use serde::{Deserialize, Serialize};

use crate::control::PowerLimits;
use crate::telemetry::GpuSample;

/// Where the figures come from. Shown next to every figure, in tables, JSON and the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Label {
    /// Real GPUs under a real load.
    Measured,
    /// gpusim's GPUs and its load model: figures of the model, not of hardware.
    Simulated,
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Measured => "measured",
            Label::Simulated => "simulated",
        }
    }
}

/// The kernel a benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// A large matrix multiply: compute-bound, counted in FLOPs.
    Gemm,
    /// A device-to-device copy: memory-bound, counted in bytes moved.
    Memory,
}

impl Workload {
    pub fn as_str(self) -> &'static str {
        match self {
            Workload::Gemm => "gemm",
            Workload::Memory => "memory",
        }
    }

    /// The unit its work is counted in.
    pub fn unit(self) -> WorkUnit {
        match self {
            Workload::Gemm => WorkUnit::Flop,
            Workload::Memory => WorkUnit::Byte,
        }
    }
}

/// What a unit of work is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkUnit {
    Flop,
    Byte,
}

impl WorkUnit {
    /// A throughput in this unit per second, for people: `512.3 TFLOP/s`, `3.10 TB/s`.
    pub fn rate(self, per_s: f64) -> String {
        let (v, p) = scaled(per_s);
        match self {
            WorkUnit::Flop => format!("{v:.1} {p}FLOP/s"),
            WorkUnit::Byte => format!("{v:.2} {p}B/s"),
        }
    }

    /// Work per watt (per joule), for people: `0.95 TFLOP/J`.
    pub fn per_joule(self, per_j: f64) -> String {
        let (v, p) = scaled(per_j);
        match self {
            WorkUnit::Flop => format!("{v:.2} {p}FLOP/J"),
            WorkUnit::Byte => format!("{v:.2} {p}B/J"),
        }
    }

    /// Energy per unit, for people: `1.35 pJ/FLOP`, `856 fJ/FLOP`, `2.50 nJ/B`.
    pub fn energy(self, j: f64) -> String {
        let unit = match self {
            WorkUnit::Flop => "FLOP",
            WorkUnit::Byte => "B",
        };
        let steps = [
            (1.0, ""),
            (1e-3, "m"),
            (1e-6, "µ"),
            (1e-9, "n"),
            (1e-12, "p"),
        ];
        let (scale, prefix) = steps
            .into_iter()
            .find(|(scale, _)| j.abs() >= *scale)
            .unwrap_or((1e-15, "f"));
        format!("{} {prefix}J/{unit}", three_digits(j / scale))
    }
}

/// `1.35`, `13.5`, `135`: three significant digits for values from 1 to 999.
fn three_digits(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn scaled(v: f64) -> (f64, &'static str) {
    for (scale, prefix) in [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")] {
        if v.abs() >= scale {
            return (v / scale, prefix);
        }
    }
    (v, "")
}

/// Work done so far by a load, cumulative since it started.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Work {
    /// Units done (FLOPs or bytes, per [`Workload::unit`]).
    pub units: f64,
    /// Seconds the load has run.
    pub seconds: f64,
}

/// The node a benchmark acts on.
pub trait BenchNode {
    /// Whether these GPUs are the simulator's.
    fn label(&self) -> Label;
    /// The newest sample of every GPU.
    fn samples(&mut self) -> anyhow::Result<Vec<GpuSample>>;
    /// GPU `gpu`'s power limits.
    fn limits(&mut self, gpu: u32) -> anyhow::Result<PowerLimits>;
    /// Cap `gpus` at `watts`; `why` goes to the node's events.
    fn set_cap(&mut self, gpus: &[u32], watts: f64, why: &str) -> anyhow::Result<()>;
    /// Let `seconds` pass (sleep, or step the simulator).
    fn wait(&mut self, seconds: f64);
    /// Seconds on this node's clock (only differences matter).
    fn now_s(&self) -> f64;
}

/// Starts loads on GPUs.
pub trait Loads {
    /// Whether the load is the simulator's.
    fn label(&self) -> Label;
    /// Start `workload` on GPU `gpu` (whose newest sample is `sample`), running until stopped.
    fn start(
        &mut self,
        gpu: u32,
        workload: Workload,
        sample: &GpuSample,
    ) -> anyhow::Result<Box<dyn Load>>;
}

/// A load running on one GPU.
pub trait Load {
    /// The GPU's newest sample at `t_s` (on the node's clock): a load that models its work from
    /// the clock integrates here; a load that counts on the device ignores it.
    fn observe(&mut self, t_s: f64, sample: &GpuSample);
    /// Work done so far.
    fn work(&self) -> Work;
    /// Stop it; the work it did in all.
    fn stop(self: Box<Self>) -> anyhow::Result<Work>;
}

/// A benchmark asked for what cannot be: a GPU the node does not have, a cap outside a GPU's
/// range. Nothing was changed; the command line makes it exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// The sample of GPU `gpu` in `samples`, or an error naming it.
pub fn sample_of(samples: &[GpuSample], gpu: u32) -> anyhow::Result<&GpuSample> {
    let s = samples
        .iter()
        .find(|s| s.index == gpu)
        .ok_or_else(|| Refused(format!("the daemon reports no GPU {gpu}")))?;
    if s.lost {
        anyhow::bail!("GPU {gpu} is lost (it fell off the bus)");
    }
    Ok(s)
}

/// The label of figures that come from `node` under `loads`: simulated if either is.
pub fn label_of(node: &dyn BenchNode, loads: &dyn Loads) -> Label {
    if node.label() == Label::Simulated || loads.label() == Label::Simulated {
        Label::Simulated
    } else {
        Label::Measured
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_with_si_prefixes() {
        assert_eq!(WorkUnit::Flop.rate(512.34e12), "512.3 TFLOP/s");
        assert_eq!(WorkUnit::Byte.rate(3.1e12), "3.10 TB/s");
        assert_eq!(WorkUnit::Flop.per_joule(9.5e11), "950.00 GFLOP/J");
        assert_eq!(WorkUnit::Byte.rate(12.0), "12.00 B/s");
        assert_eq!(WorkUnit::Flop.energy(1.35e-12), "1.35 pJ/FLOP");
        assert_eq!(WorkUnit::Byte.energy(2.5e-9), "2.50 nJ/B");
        assert_eq!(WorkUnit::Flop.energy(8.5609e-13), "856 fJ/FLOP");
    }
}

#[cfg(test)]
mod sim_tests;
