//! The benchmarks on gpusim: a load whose throughput follows the model at the clock the GPU
//! reports ([`SimLoads`], used with a daemon on `--source sim` and in-process alike), and a node
//! stepped in simulated time ([`SimBench`]) so that the sweep and the burn run in milliseconds in
//! unit tests.
//!
//! The load model (estimates, documented in docs/bench.md):
//!
//! - GEMM: compute-bound, `fp16_tflops · GEMM_EFFICIENCY · x` FLOP/s with `x = f / f_max`.
//! - Copy: memory-bound, `mem_bandwidth · COPY_EFFICIENCY · r(x)` bytes moved (read + write) a
//!   second, with `r(x) = 1 / (m + (1 − m)/x)` and `m = COPY_MEMORY_BOUND`: the same rule gpusim
//!   uses for the memory-bound part of a training step.
//!
//! The power the GPU draws is gpusim's for the work the simulated node runs (its training
//! workload): the load does not change it. A simulated GPU that idles has nothing to measure.

use gpusim::{GpuSpec, Node, NodeConfig};

use super::{BenchNode, Label, Load, Loads, Work, Workload};
use crate::control::PowerLimits;
use crate::control::power::sim::limits_of;
use crate::telemetry::GpuSample;

/// Share of the dense FP16 tensor peak a large GEMM reaches.
pub const GEMM_EFFICIENCY: f64 = 0.75;
/// Share of the memory's peak bandwidth a device-to-device copy reaches.
pub const COPY_EFFICIENCY: f64 = 0.9;
/// Share of a copy's time that does not shrink with the SM clock.
pub const COPY_MEMORY_BOUND: f64 = 0.9;
/// Below this utilization a simulated GPU is taken to be idle.
const BUSY_PCT: f64 = 50.0;

/// Throughput of `workload` on `spec` at SM clock `clock_mhz`, units a second.
pub fn rate_per_s(spec: &GpuSpec, workload: Workload, clock_mhz: f64) -> f64 {
    let x = (clock_mhz / f64::from(spec.sm_clock_max_mhz)).clamp(1e-3, 1.0);
    match workload {
        Workload::Gemm => spec.fp16_tflops * 1e12 * GEMM_EFFICIENCY * x,
        Workload::Memory => {
            let m = COPY_MEMORY_BOUND;
            spec.mem_bandwidth_gbs * 1e9 * COPY_EFFICIENCY / (m + (1.0 - m) / x)
        }
    }
}

/// The gpusim part a sample names (by its NVML name).
pub fn spec_of(sample: &GpuSample) -> anyhow::Result<&'static GpuSpec> {
    let name = sample.name.as_deref().unwrap_or("");
    gpusim::find(name).ok_or_else(|| {
        anyhow::anyhow!(
            "GPU {} (`{name}`) is not a part the simulator knows: a simulated load needs a \
             daemon on `--source sim`",
            sample.index
        )
    })
}

/// Simulated loads: throughput from gpusim's model at each observed clock.
#[derive(Debug, Default)]
pub struct SimLoads;

impl Loads for SimLoads {
    fn label(&self) -> Label {
        Label::Simulated
    }

    fn start(
        &mut self,
        gpu: u32,
        workload: Workload,
        sample: &GpuSample,
    ) -> anyhow::Result<Box<dyn Load>> {
        let spec = spec_of(sample)?;
        if sample.util_gpu_pct.unwrap_or(0.0) < BUSY_PCT {
            anyhow::bail!(
                "simulated GPU {gpu} is idle ({:.0} % busy): the simulated node's training \
                 workload is `idle` or out of memory there; start the daemon with a workload \
                 that fits (`--workload resnet50`, the default)",
                sample.util_gpu_pct.unwrap_or(0.0)
            );
        }
        Ok(Box::new(SimLoad {
            spec,
            workload,
            last: None,
            work: Work::default(),
        }))
    }
}

/// One simulated load.
struct SimLoad {
    spec: &'static GpuSpec,
    workload: Workload,
    /// The previous observation: its time and the rate at its clock (which held until now).
    last: Option<(f64, f64)>,
    work: Work,
}

impl Load for SimLoad {
    fn observe(&mut self, t_s: f64, sample: &GpuSample) {
        let rate = sample
            .sm_clock_mhz
            .map_or(0.0, |f| rate_per_s(self.spec, self.workload, f64::from(f)));
        if let Some((t0, r0)) = self.last {
            let dt = t_s - t0;
            if dt <= 0.0 {
                return;
            }
            self.work.units += r0 * dt;
            self.work.seconds += dt;
        }
        self.last = Some((t_s, rate));
    }

    fn work(&self) -> Work {
        self.work
    }

    fn stop(self: Box<Self>) -> anyhow::Result<Work> {
        Ok(self.work)
    }
}

/// A gpusim node stepped by [`BenchNode::wait`]: simulated time, as fast as the CPU goes.
pub struct SimBench {
    node: Node,
    /// Every cap asked for: (GPUs, watts, why), in order.
    caps: Vec<(Vec<u32>, f64, String)>,
}

impl SimBench {
    /// A node as `config` says, run for `warmup_s` simulated seconds first.
    pub fn new(config: &NodeConfig, warmup_s: f64) -> anyhow::Result<SimBench> {
        let mut node = Node::new(config)?;
        node.advance_to(warmup_s);
        Ok(SimBench {
            node,
            caps: Vec::new(),
        })
    }

    /// The node, to add faults or read the model.
    pub fn node_mut(&mut self) -> &mut Node {
        &mut self.node
    }

    /// Every cap asked for, in order: (GPUs, watts, why).
    pub fn cap_log(&self) -> &[(Vec<u32>, f64, String)] {
        &self.caps
    }
}

impl BenchNode for SimBench {
    fn label(&self) -> Label {
        Label::Simulated
    }

    fn samples(&mut self) -> anyhow::Result<Vec<GpuSample>> {
        let t = self.node.time_s();
        Ok(self
            .node
            .gpus()
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let spec = g.spec();
                let r = g.reading();
                GpuSample {
                    index: i as u32,
                    name: Some(spec.name.to_string()),
                    time_s: t,
                    util_gpu_pct: Some(r.util_gpu_pct),
                    temperature_c: Some(r.temperature_c),
                    temp_slowdown_c: Some(spec.slowdown_c),
                    power_w: Some(r.power_w),
                    power_limit_w: Some(r.power_limit_w),
                    energy_j: Some(r.energy_mj as f64 / 1000.0),
                    sm_clock_mhz: Some(r.sm_clock_mhz),
                    sm_clock_max_mhz: Some(spec.sm_clock_max_mhz),
                    throttle_reasons: Some(r.throttle_reasons),
                    ..GpuSample::default()
                }
            })
            .collect())
    }

    fn limits(&mut self, gpu: u32) -> anyhow::Result<PowerLimits> {
        self.node
            .gpu(gpu as usize)
            .map(limits_of)
            .ok_or_else(|| anyhow::anyhow!("no GPU {gpu} on the simulated node"))
    }

    fn set_cap(&mut self, gpus: &[u32], watts: f64, why: &str) -> anyhow::Result<()> {
        for &i in gpus {
            self.node
                .try_gpu_mut(i as usize)?
                .set_power_limit_w(watts)?;
        }
        self.caps.push((gpus.to_vec(), watts, why.to_string()));
        Ok(())
    }

    fn wait(&mut self, seconds: f64) {
        let to = self.node.time_s() + seconds;
        self.node.advance_to(to);
    }

    fn now_s(&self) -> f64 {
        self.node.time_s()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_follows_the_clock_and_copy_mostly_does_not() {
        let h100 = gpusim::find("h100-sxm").unwrap();
        let top = f64::from(h100.sm_clock_max_mhz);
        let g_top = rate_per_s(h100, Workload::Gemm, top);
        assert!((g_top - h100.fp16_tflops * 1e12 * 0.75).abs() < 1.0);
        assert!((rate_per_s(h100, Workload::Gemm, top / 2.0) / g_top - 0.5).abs() < 1e-9);
        let c_top = rate_per_s(h100, Workload::Memory, top);
        let c_half = rate_per_s(h100, Workload::Memory, top / 2.0);
        // r(0.5) = 1 / (0.9 + 0.1·2) = 0.909…
        assert!(
            (c_half / c_top - 1.0 / 1.1).abs() < 1e-9,
            "{}",
            c_half / c_top
        );
    }

    #[test]
    fn a_simulated_load_integrates_the_rate_at_each_clock() {
        let mut loads = SimLoads;
        let h100 = gpusim::find("h100-sxm").unwrap();
        let sample = |clock: u32| GpuSample {
            name: Some(h100.name.to_string()),
            util_gpu_pct: Some(100.0),
            sm_clock_mhz: Some(clock),
            ..GpuSample::default()
        };
        let mut load = loads.start(0, Workload::Gemm, &sample(1980)).unwrap();
        load.observe(0.0, &sample(1980));
        load.observe(1.0, &sample(990));
        load.observe(3.0, &sample(990));
        let w = load.stop().unwrap();
        let full = rate_per_s(h100, Workload::Gemm, 1980.0);
        assert!((w.units - 2.0 * full).abs() / full < 1e-9, "{w:?}");
        assert_eq!(w.seconds, 3.0);
        let idle = GpuSample {
            util_gpu_pct: Some(0.0),
            ..sample(345)
        };
        let e = loads.start(1, Workload::Gemm, &idle).err().unwrap();
        assert!(e.to_string().contains("idle"), "{e}");
    }
}
