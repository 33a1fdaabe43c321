//! Training workloads: what a model costs per sample and how a training job progresses.
//!
//! Pure functions of (model, GPU, config, clock) plus the `Training` state that `Gpu::step`
//! advances. Nothing here knows about power or temperature; `gpu.rs` combines the two.

use serde::{Deserialize, Serialize};

use crate::catalog::GpuSpec;
use crate::error::SimError;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// A training workload's character. Costs are per sample (an image, or a sequence).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    /// Name used in configs: "resnet50", "bert-large", "gpt-1.3b".
    pub id: &'static str,
    /// Forward + backward work per sample, GFLOP (about 3x the forward pass; 6·params·tokens
    /// for transformers).
    pub gflop_per_sample: f64,
    /// Weights, optimizer state, workspace and CUDA context, bytes.
    pub static_memory_bytes: u64,
    /// Activations kept for the backward pass, per sample in the batch, bytes.
    pub memory_per_sample_bytes: u64,
    /// Share of compute time (at max clock) bound by memory bandwidth, which does not speed up
    /// with the SM clock.
    pub memory_bound_fraction: f64,
    /// GPU time every step costs whatever the batch (optimizer update over all parameters,
    /// kernel launches), seconds; memory-bound, so it does not speed up with the SM clock. It
    /// is why a larger batch trains faster per sample.
    pub step_overhead_s: f64,
    /// CPU data-pipeline time (decode, augment, collate) per sample per worker process, seconds.
    pub data_s_per_sample: f64,
    /// Loss falls from `initial_loss` towards `final_loss`, halving the gap every
    /// `loss_halflife_samples` samples.
    pub initial_loss: f64,
    pub final_loss: f64,
    pub loss_halflife_samples: f64,
    /// Fraction of the GPU's dense FP16 peak this model reaches at max clock (model FLOPs
    /// utilization), 0..1.
    pub tensor_efficiency: f64,
    /// How hard the model drives the SMs while busy, scaling dynamic power, 0..1 (1 = the
    /// heaviest training workloads, which make the default power cap bind slightly).
    pub power_intensity: f64,
    /// Bytes copied host-to-device per sample (drives PCIe rx), bytes.
    pub input_bytes_per_sample: u64,
}

/// Models the simulator can train. Figures are estimates in the right range for mixed-precision
/// training, not measurements.
pub const MODELS: &[ModelSpec] = &[
    ModelSpec {
        id: "resnet50",
        gflop_per_sample: 12.3, // 3 x 4.1 GFLOP forward at 224x224
        static_memory_bytes: 3 * GIB / 2,
        memory_per_sample_bytes: 48 * MIB, // batch 256 fits a 16 GB V100 with AMP
        memory_bound_fraction: 0.35,       // batch norm and elementwise layers
        step_overhead_s: 0.004,            // SGD over 25M parameters, ~160 kernel launches
        data_s_per_sample: 0.001,          // fast JPEG decode + crop per core
        initial_loss: 6.9,                 // ln(1000 classes)
        final_loss: 1.2,
        loss_halflife_samples: 3.0e6,
        tensor_efficiency: 0.09,
        power_intensity: 0.9,
        input_bytes_per_sample: 224 * 224 * 3, // decoded uint8 image
    },
    ModelSpec {
        id: "bert-large",
        gflop_per_sample: 1100.0, // 6 x 340M params x 512 tokens, plus attention
        static_memory_bytes: 13 * GIB / 2, // fp32 master weights + Adam state + workspace
        memory_per_sample_bytes: 768 * MIB,
        memory_bound_fraction: 0.3,
        step_overhead_s: 0.012,    // Adam over 340M parameters
        data_s_per_sample: 0.0004, // pre-tokenized shards
        initial_loss: 10.4,        // ln(30522 tokens)
        final_loss: 1.6,
        loss_halflife_samples: 2.0e5,
        tensor_efficiency: 0.35,
        power_intensity: 0.95,
        input_bytes_per_sample: 512 * 3 * 8, // ids, mask, segment ids as int64
    },
    ModelSpec {
        id: "gpt-1.3b",
        gflop_per_sample: 17_000.0, // 6 x 1.3B params x 2048 tokens, plus attention
        static_memory_bytes: 22 * GIB, // 16 bytes/param mixed-precision Adam + workspace
        memory_per_sample_bytes: 3 * GIB, // flash attention, no activation checkpointing
        memory_bound_fraction: 0.2,
        step_overhead_s: 0.03, // Adam over 1.3B parameters
        data_s_per_sample: 0.0002,
        initial_loss: 10.9, // ln(50257 tokens)
        final_loss: 2.8,
        loss_halflife_samples: 5.0e5,
        tensor_efficiency: 0.45,
        power_intensity: 1.0,
        input_bytes_per_sample: 2048 * 8,
    },
];

/// Look a model up by id (case-insensitive).
pub fn find_model(id: &str) -> Option<&'static ModelSpec> {
    MODELS.iter().find(|m| m.id.eq_ignore_ascii_case(id.trim()))
}

impl ModelSpec {
    /// Memory a batch of `batch` samples needs on the GPU, bytes.
    pub fn memory_needed_bytes(&self, batch: u32) -> u64 {
        self.static_memory_bytes + u64::from(batch) * self.memory_per_sample_bytes
    }

    /// Whether a batch of `batch` fits in the GPU's memory.
    pub fn fits(&self, spec: &GpuSpec, batch: u32) -> bool {
        self.memory_needed_bytes(batch) <= spec.memory_bytes
    }

    /// GPU time of one step of `batch` samples at SM clock `clock_mhz`, seconds:
    /// `t = overhead + gflop·B / (TFLOPS·eff·1000) · (m + (1 − m)·f_max/f)`.
    pub fn compute_time_s(&self, spec: &GpuSpec, batch: u32, clock_mhz: f64) -> f64 {
        let at_max_clock = self.gflop_per_sample * f64::from(batch)
            / (spec.fp16_tflops * self.tensor_efficiency * 1e3);
        let m = self.memory_bound_fraction;
        self.step_overhead_s
            + at_max_clock * (m + (1.0 - m) * f64::from(spec.sm_clock_max_mhz) / clock_mhz)
    }

    /// Throughput at `clock_mhz` relative to max clock, 0..=1: `1 / (m + (1 − m)·f_max/f)`.
    /// Memory traffic per second, and so memory power, follows it.
    pub fn relative_rate(&self, spec: &GpuSpec, clock_mhz: f64) -> f64 {
        let m = self.memory_bound_fraction;
        1.0 / (m + (1.0 - m) * f64::from(spec.sm_clock_max_mhz) / clock_mhz)
    }

    /// The loss after `samples` samples, without noise.
    pub fn loss_after(&self, samples: f64) -> f64 {
        let gap = self.initial_loss - self.final_loss;
        self.final_loss + gap * 0.5f64.powf(samples / self.loss_halflife_samples)
    }
}

/// How a job is configured; what a tuner may change between runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingConfig {
    /// A `ModelSpec` id.
    pub model: String,
    pub batch_size: u32,
    /// Batches the loader prepares ahead; 0 loads each batch only when the step asks for it.
    pub prefetch_depth: u32,
    /// Loader worker processes; 0 loads in the training process itself (always serial).
    pub workers: u32,
}

/// Timing of one training step at a given clock, from [`step_timing`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTiming {
    /// GPU busy time per step, seconds.
    pub compute_s: f64,
    /// Time the GPU waits for the data pipeline per step, seconds.
    pub data_wait_s: f64,
    /// `compute_s + data_wait_s`, seconds.
    pub step_s: f64,
    /// Busy fraction `compute / step`, 0..=1.
    pub util: f64,
}

/// CPU time to produce one batch, seconds: `B·data_s_per_sample / workers`.
pub fn data_time_s(model: &ModelSpec, cfg: &TrainingConfig) -> f64 {
    f64::from(cfg.batch_size) * model.data_s_per_sample / f64::from(cfg.workers.max(1))
}

/// Step timing at `clock_mhz` with `jitter_s` of extra loader delay this step.
///
/// Serial loading (prefetch 0 or no workers): the GPU waits for the whole batch plus jitter.
/// With prefetch depth d ≥ 1 loading overlaps compute, so the GPU only waits when the loader is
/// slower than the GPU, and a deeper queue absorbs jitter: `wait = max(0, data − compute) +
/// jitter/(1 + d)`.
pub fn step_timing(
    model: &ModelSpec,
    spec: &GpuSpec,
    cfg: &TrainingConfig,
    clock_mhz: f64,
    jitter_s: f64,
) -> StepTiming {
    let compute_s = model.compute_time_s(spec, cfg.batch_size, clock_mhz);
    let data_s = data_time_s(model, cfg);
    let data_wait_s = if cfg.prefetch_depth == 0 || cfg.workers == 0 {
        data_s + jitter_s
    } else {
        (data_s - compute_s).max(0.0) + jitter_s / (1.0 + f64::from(cfg.prefetch_depth))
    };
    let step_s = compute_s + data_wait_s;
    StepTiming {
        compute_s,
        data_wait_s,
        step_s,
        util: compute_s / step_s,
    }
}

/// Live state of a training job on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Training {
    pub config: TrainingConfig,
    /// Whole steps completed.
    pub step: u64,
    pub samples_seen: f64,
    pub loss: f64,
    /// Duration and data-wait share of the current step, seconds (last computed).
    pub step_time_s: f64,
    pub data_wait_s: f64,
    pub samples_per_s: f64,
    /// The batch does not fit: training stopped, util 0, memory at static.
    pub oom: bool,
    /// Progress through the current step, 0..1 (training advances continuously).
    #[serde(default)]
    pub step_fraction: f64,
}

impl Training {
    /// A job about to start. Errors on an unknown model or a zero batch size.
    pub fn new(config: TrainingConfig) -> Result<Training, SimError> {
        let model = find_model(&config.model)
            .ok_or_else(|| SimError::UnknownModel(config.model.clone()))?;
        if config.batch_size == 0 {
            return Err(SimError::OutOfRange {
                what: "batch size",
                value: 0.0,
                min: 1.0,
                max: f64::from(u32::MAX),
            });
        }
        Ok(Training {
            config,
            step: 0,
            samples_seen: 0.0,
            loss: model.initial_loss,
            step_time_s: 0.0,
            data_wait_s: 0.0,
            samples_per_s: 0.0,
            oom: false,
            step_fraction: 0.0,
        })
    }

    /// The model this job trains; `None` if the config was edited to an unknown id.
    pub fn model(&self) -> Option<&'static ModelSpec> {
        find_model(&self.config.model)
    }

    /// Whether the job is computing (known model, not out of memory).
    pub fn is_running(&self) -> bool {
        !self.oom && self.model().is_some() && self.config.batch_size > 0
    }

    /// Advance by `dt_s` seconds at `timing`; `loss_noise` in [-1, 1) perturbs the reported
    /// loss by up to 1%.
    pub(crate) fn advance(
        &mut self,
        model: &ModelSpec,
        timing: &StepTiming,
        dt_s: f64,
        loss_noise: f64,
    ) {
        let batch = f64::from(self.config.batch_size);
        self.step_time_s = timing.step_s;
        self.data_wait_s = timing.data_wait_s;
        self.samples_per_s = batch / timing.step_s;
        self.samples_seen += self.samples_per_s * dt_s;
        self.step_fraction += dt_s / timing.step_s;
        let whole = self.step_fraction.floor();
        self.step += whole as u64;
        self.step_fraction -= whole;
        self.loss = model.loss_after(self.samples_seen) * (1.0 + 0.01 * loss_noise);
    }

    /// Stop: what a crashed or out-of-memory job shows.
    pub(crate) fn halt(&mut self) {
        self.samples_per_s = 0.0;
        self.data_wait_s = 0.0;
        self.step_time_s = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::find;

    fn cfg(model: &str, batch: u32, prefetch: u32, workers: u32) -> TrainingConfig {
        TrainingConfig {
            model: model.into(),
            batch_size: batch,
            prefetch_depth: prefetch,
            workers,
        }
    }

    #[test]
    fn unknown_model_and_zero_batch_are_refused() {
        assert_eq!(
            Training::new(cfg("alexnet", 8, 1, 1)),
            Err(SimError::UnknownModel("alexnet".into()))
        );
        assert!(matches!(
            Training::new(cfg("resnet50", 0, 1, 1)),
            Err(SimError::OutOfRange {
                what: "batch size",
                ..
            })
        ));
        assert_eq!(find_model("ResNet50").map(|m| m.id), Some("resnet50"));
    }

    #[test]
    fn compute_time_scales_only_with_the_clock_bound_part() {
        let spec = find("h100").unwrap();
        let m = find_model("resnet50").unwrap();
        let full = m.compute_time_s(spec, 256, 1980.0);
        // 4 ms per step + 256 · 12.3 GFLOP / (989.4 TFLOPS · 0.09) = 4 + 35.36 ms
        assert!((full - 0.039_36).abs() < 1e-4, "{full}");
        let half = m.compute_time_s(spec, 256, 990.0);
        // The batch's part takes m + 2(1 − m) = 0.35 + 1.3 = 1.65x, not 2x; the overhead none.
        let batch_part = full - m.step_overhead_s;
        assert!((half - m.step_overhead_s - 1.65 * batch_part).abs() < 1e-12);
        assert!((m.relative_rate(spec, 990.0) - 1.0 / 1.65).abs() < 1e-12);
        // Per sample, a larger batch is cheaper: the overhead is spread thinner.
        let per_sample = |b: u32| m.compute_time_s(spec, b, 1980.0) / f64::from(b);
        assert!(per_sample(32) > 1.2 * per_sample(256));
    }

    #[test]
    fn prefetch_hides_the_loader_and_its_jitter() {
        let spec = find("h100").unwrap();
        let m = find_model("resnet50").unwrap();
        // 4 workers: 256 · 1 ms / 4 = 64 ms of loading per 35 ms of compute: data-bound.
        let jitter = 0.01;
        let serial = step_timing(m, spec, &cfg("resnet50", 256, 0, 4), 1980.0, jitter);
        let d1 = step_timing(m, spec, &cfg("resnet50", 256, 1, 4), 1980.0, jitter);
        let d4 = step_timing(m, spec, &cfg("resnet50", 256, 4, 4), 1980.0, jitter);
        assert!((serial.data_wait_s - 0.074).abs() < 1e-9);
        assert!((d1.data_wait_s - (0.064 - d1.compute_s + 0.005)).abs() < 1e-9);
        assert!((d4.data_wait_s - (0.064 - d4.compute_s + 0.002)).abs() < 1e-9);
        assert!(serial.util < d1.util && d1.util < d4.util);
        // Without workers loading is serial whatever the prefetch depth.
        let main = step_timing(m, spec, &cfg("resnet50", 256, 4, 0), 1980.0, 0.0);
        assert!((main.data_wait_s - 0.256).abs() < 1e-9);
    }

    #[test]
    fn loss_halves_its_gap_every_halflife() {
        let m = find_model("gpt-1.3b").unwrap();
        assert!((m.loss_after(0.0) - 10.9).abs() < 1e-12);
        let gap = |s: f64| m.loss_after(s) - m.final_loss;
        assert!((gap(5.0e5) / gap(0.0) - 0.5).abs() < 1e-12);
        assert!((gap(1.0e6) / gap(0.0) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn memory_grows_with_batch() {
        let m = find_model("resnet50").unwrap();
        assert_eq!(m.memory_needed_bytes(256), 3 * GIB / 2 + 12 * GIB);
        assert!(m.fits(find("v100").unwrap(), 256));
        assert!(!m.fits(find("h100").unwrap(), 4096));
        // GPT-1.3B's Adam state alone does not fit a 24 GB card.
        assert!(
            !find_model("gpt-1.3b")
                .unwrap()
                .fits(find("4090").unwrap(), 1)
        );
    }
}
