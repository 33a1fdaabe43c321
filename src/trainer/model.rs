//! The pure training model of the synthetic trainer: configuration, progress, loss, and each
//! step's timing from gpusim's workload model. No I/O, no sleeping, no clock.

use gpusim::workload::{StepTiming, data_time_s, step_timing};
use gpusim::{GpuSpec, ModelSpec, SplitMix64, TrainingConfig};

use super::Options;
use crate::protocol::KnobName;

/// Loader jitter as a fraction of the batch's loading time (gpusim's default).
const JITTER_FRAC: f64 = gpusim::gpu::DEFAULT_DATA_JITTER_FRAC;

/// One step's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    Done(StepTiming),
    /// The batch does not fit: `needed` bytes against `total`.
    OutOfMemory {
        needed: u64,
        total: u64,
    },
}

/// The pure training model: configuration, progress, loss.
#[derive(Debug, Clone)]
pub struct Model {
    pub model: &'static ModelSpec,
    pub spec: &'static GpuSpec,
    pub config: TrainingConfig,
    /// Steps done (a report of `step = k` means step k is done; the next one is k + 1).
    pub step: u64,
    pub samples: f64,
    pub loss: f64,
    rng: SplitMix64,
}

impl Model {
    pub fn new(opts: &Options) -> anyhow::Result<Model> {
        let model = gpusim::find_model(&opts.model).ok_or_else(|| {
            anyhow::anyhow!(
                "unknown model `{}`: use one of {}",
                opts.model,
                gpusim::MODELS
                    .iter()
                    .map(|m| m.id)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        let spec = gpusim::find(&opts.gpu_model)
            .ok_or_else(|| anyhow::anyhow!("unknown GPU model `{}`", opts.gpu_model))?;
        let mut m = Model {
            model,
            spec,
            config: TrainingConfig {
                model: model.id.to_string(),
                batch_size: 1,
                prefetch_depth: 0,
                workers: opts.workers,
            },
            step: 0,
            samples: 0.0,
            loss: model.initial_loss,
            rng: SplitMix64::new(opts.seed),
        };
        m.set(KnobName::BatchSize, opts.batch_size)?;
        m.set(KnobName::Prefetch, opts.prefetch)?;
        Ok(m)
    }

    /// Use `value` for `knob` from the next step on; an impossible value is refused.
    pub fn set(&mut self, knob: KnobName, value: i64) -> anyhow::Result<()> {
        let v =
            u32::try_from(value).map_err(|_| anyhow::anyhow!("{knob} = {value} is not a size"))?;
        match knob {
            KnobName::BatchSize if v == 0 => anyhow::bail!("batch size 0 trains nothing"),
            KnobName::BatchSize => self.config.batch_size = v,
            KnobName::Prefetch => self.config.prefetch_depth = v,
        }
        Ok(())
    }

    /// Whether every rank could take `value` for `knob`: a valid value, and a batch that fits
    /// in the GPU's memory (a rank of a data-parallel job refuses a batch it knows would run out
    /// of memory rather than fail the whole job at the step it applies it).
    pub fn check(&self, knob: KnobName, value: i64) -> anyhow::Result<()> {
        let mut m = self.clone();
        m.set(knob, value)?;
        let b = m.config.batch_size;
        if !m.model.fits(m.spec, b) {
            let gib = |x: u64| x as f64 / (1u64 << 30) as f64;
            anyhow::bail!(
                "batch size {b} needs {:.1} GiB, the GPU has {:.1} GiB",
                gib(m.model.memory_needed_bytes(b)),
                gib(m.spec.memory_bytes)
            );
        }
        Ok(())
    }

    /// One step at `clock_mhz`: its timing (and the progress it makes), or out of memory.
    pub fn step(&mut self, clock_mhz: f64) -> Step {
        let b = self.config.batch_size;
        if !self.model.fits(self.spec, b) {
            return Step::OutOfMemory {
                needed: self.model.memory_needed_bytes(b),
                total: self.spec.memory_bytes,
            };
        }
        let jitter =
            data_time_s(self.model, &self.config) * JITTER_FRAC * 2.0 * self.rng.next_f64();
        let timing = step_timing(self.model, self.spec, &self.config, clock_mhz, jitter);
        self.step += 1;
        self.samples += f64::from(b);
        self.loss = self.model.loss_after(self.samples) * (1.0 + 0.01 * self.rng.next_signed());
        Step::Done(timing)
    }

    /// A step's time at `clock_mhz` with the loader's mean jitter, seconds: what another rank's
    /// GPU takes for the same batch (no progress made, no noise drawn).
    pub fn mean_step_s(&self, clock_mhz: f64) -> f64 {
        let jitter = data_time_s(self.model, &self.config) * JITTER_FRAC;
        step_timing(self.model, self.spec, &self.config, clock_mhz, jitter).step_s
    }

    /// The mean samples per second at `clock_mhz` over `steps` steps.
    pub fn throughput(&mut self, clock_mhz: f64, steps: u32) -> Option<f64> {
        let (mut samples, mut time) = (0.0, 0.0);
        for _ in 0..steps {
            match self.step(clock_mhz) {
                Step::Done(t) => {
                    samples += f64::from(self.config.batch_size);
                    time += t.step_s;
                }
                Step::OutOfMemory { .. } => return None,
            }
        }
        Some(samples / time)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn opts(batch: i64, prefetch: i64) -> Options {
        Options {
            batch_size: batch,
            prefetch,
            ..Options::default()
        }
    }

    #[test]
    fn throughput_follows_batch_size_prefetch_and_clock() {
        let clock = 1980.0;
        let rate = |b, p, c| Model::new(&opts(b, p)).unwrap().throughput(c, 200).unwrap();
        let small = rate(32, 2, clock);
        let large = rate(256, 2, clock);
        assert!(
            large > small * 1.2,
            "a larger batch amortizes per-step overhead: {small:.0} → {large:.0} samples/s"
        );
        let serial = rate(256, 0, clock);
        let deep = rate(256, 4, clock);
        assert!(
            deep > serial * 1.2,
            "prefetching overlaps loading with compute: {serial:.0} → {deep:.0} samples/s"
        );
        let capped = rate(256, 4, 1200.0);
        assert!(
            capped < deep * 0.9,
            "a lower clock (a power cap) trains slower: {deep:.0} → {capped:.0} samples/s"
        );
    }

    #[test]
    fn too_large_a_batch_is_out_of_memory_and_bad_values_are_refused() {
        let mut m = Model::new(&opts(1 << 20, 2)).unwrap();
        assert!(matches!(m.step(1980.0), Step::OutOfMemory { needed, total } if needed > total));
        let mut m = Model::new(&opts(64, 2)).unwrap();
        assert!(m.set(KnobName::BatchSize, 0).is_err());
        assert!(m.set(KnobName::Prefetch, -1).is_err());
        assert_eq!(m.config.batch_size, 64);
        m.set(KnobName::BatchSize, 128).unwrap();
        assert_eq!(m.config.batch_size, 128);
        let before = m.loss;
        for _ in 0..2000 {
            m.step(1980.0);
        }
        assert!(m.loss < before, "loss falls as samples are seen");
    }

    #[test]
    fn a_check_refuses_what_would_fail_and_changes_nothing() {
        let m = Model::new(&opts(64, 2)).unwrap();
        m.check(KnobName::BatchSize, 128).unwrap();
        let e = m
            .check(KnobName::BatchSize, 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("GiB, the GPU has 79.6 GiB"), "{e}");
        assert!(m.check(KnobName::Prefetch, -2).is_err());
        assert_eq!(
            (m.config.batch_size, m.config.prefetch_depth),
            (64, 2),
            "checking applies nothing"
        );
    }

    #[test]
    fn a_slower_clock_means_a_longer_mean_step() {
        let m = Model::new(&opts(256, 2)).unwrap();
        let full = m.mean_step_s(1980.0);
        let half = m.mean_step_s(990.0);
        assert!(half > 1.3 * full, "{full} → {half}");
        assert_eq!(m.step, 0, "no progress is made");
    }
}
