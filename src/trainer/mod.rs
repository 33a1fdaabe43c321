//! The synthetic trainer: a real supervised process that "trains" against gpusim's model and
//! speaks the trainer channel exactly as the Python SDK does (`gpupilot synthetic-train`, the
//! run `gpupilot demo` starts).
//!
//! Each step takes the time gpusim's workload model gives for the batch size, the prefetch
//! depth and the GPU's SM clock — the clock comes from the daemon's telemetry, so a power cap
//! set on the node slows the steps down. A batch that does not fit in the GPU's memory is an
//! out-of-memory error, reported over the channel and on stderr, and the process exits 1 (the
//! profile's `on_oom = "halve_batch"` restarts it smaller). Knob changes are acknowledged at
//! once and used from the next step on.
//!
//! [`Model`] is the pure part (no I/O, no sleeping) that tests drive; [`run`] adds the clock,
//! the channel and the output.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpusim::workload::{StepTiming, data_time_s, step_timing};
use gpusim::{GpuSpec, ModelSpec, SplitMix64, TrainingConfig};

use crate::client::{Client, Update};
use crate::protocol::{KnobName, MetricsReport, Request, Response};

/// Loader jitter as a fraction of the batch's loading time (gpusim's default).
const JITTER_FRAC: f64 = gpusim::gpu::DEFAULT_DATA_JITTER_FRAC;

/// What the trainer is told to do (`gpupilot synthetic-train --help`).
#[derive(Debug, Clone)]
pub struct Options {
    /// gpusim model id: resnet50, bert-large, gpt-1.3b.
    pub model: String,
    /// gpusim GPU id: h100-sxm, …
    pub gpu_model: String,
    /// Which GPU of the daemon's telemetry gives the SM clock.
    pub gpu: u32,
    /// Stop after this many steps (0: never).
    pub steps: u64,
    pub batch_size: i64,
    pub prefetch: i64,
    pub workers: u32,
    pub seed: u64,
    /// Time runs this many times faster than the wall clock (tests, demos).
    pub speed: f64,
}

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

/// `gpupilot synthetic-train`: train until `steps` (or a signal), reporting over the channel
/// when the environment names one. Returns the process's exit code.
pub fn run(opts: &Options) -> anyhow::Result<i32> {
    let mut model = Model::new(opts)?;
    let channel = Channel::open(&model);
    let speed = opts.speed.clamp(0.01, 1000.0);
    let started = Instant::now();
    let mut clock_mhz = f64::from(model.spec.sm_clock_max_mhz);
    let mut clock_read = Instant::now() - Duration::from_secs(10);
    let mut last_report = Instant::now() - Duration::from_secs(10);
    let (mut window_samples, mut window_time, mut window_wait) = (0.0, 0.0, 0.0);
    println!(
        "{{\"event\":\"start\",\"model\":\"{}\",\"gpu\":\"{}\",\"batch_size\":{},\"prefetch\":{},\"attached\":{}}}",
        model.model.id,
        model.spec.id,
        model.config.batch_size,
        model.config.prefetch_depth,
        channel.is_some()
    );
    loop {
        if let Some(ch) = &channel {
            ch.apply_knobs(&mut model);
            if clock_read.elapsed() >= Duration::from_secs(1) {
                if let Some(c) = ch.sm_clock(opts.gpu) {
                    clock_mhz = c;
                }
                clock_read = Instant::now();
            }
        }
        let timing = match model.step(clock_mhz) {
            Step::Done(t) => t,
            Step::OutOfMemory { needed, total } => {
                let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
                let message = format!(
                    "CUDA out of memory: batch size {} needs {:.1} GiB, the GPU has {:.1} GiB",
                    model.config.batch_size,
                    gib(needed),
                    gib(total)
                );
                eprintln!("{message}");
                if let Some(ch) = &channel {
                    ch.error("oom", &message, model.config.batch_size);
                }
                return Ok(1);
            }
        };
        std::thread::sleep(Duration::from_secs_f64(timing.step_s / speed));
        window_samples += f64::from(model.config.batch_size);
        window_time += timing.step_s;
        window_wait += timing.data_wait_s;
        let done = opts.steps > 0 && model.step >= opts.steps;
        // At most about four reports a second, whatever the step time.
        if last_report.elapsed() >= Duration::from_millis(250) || done {
            let steps_in_window = (window_samples / f64::from(model.config.batch_size)).max(1.0);
            let report = MetricsReport {
                step: Some(model.step),
                epoch: Some((model.samples / 1_281_167.0) as u64),
                loss: Some(model.loss),
                samples_per_s: Some(window_samples / window_time),
                step_time_s: Some(window_time / steps_in_window),
                data_wait_s: Some(window_wait / steps_in_window),
                batch_size: Some(i64::from(model.config.batch_size)),
                prefetch: Some(i64::from(model.config.prefetch_depth)),
                extra: BTreeMap::from([("sm_clock_mhz".to_string(), clock_mhz)]),
            };
            println!(
                "{}",
                serde_json::to_string(&report).expect("a report serializes")
            );
            if let Some(ch) = &channel {
                ch.report(report);
            }
            (window_samples, window_time, window_wait) = (0.0, 0.0, 0.0);
            last_report = Instant::now();
        }
        if done {
            println!(
                "{{\"event\":\"done\",\"steps\":{},\"seconds\":{:.1}}}",
                model.step,
                started.elapsed().as_secs_f64()
            );
            return Ok(0);
        }
    }
}

/// The trainer channel, when the environment names one (`GPUPILOT_SOCKET`, `GPUPILOT_RUN_ID`).
struct Channel {
    client: Client,
}

impl Channel {
    fn open(model: &Model) -> Option<Channel> {
        let socket = std::env::var_os("GPUPILOT_SOCKET")?;
        let run = std::env::var("GPUPILOT_RUN_ID").ok()?;
        let client = match Client::connect_to(
            std::path::Path::new(&socket),
            concat!("gpupilot-synthetic-trainer ", env!("CARGO_PKG_VERSION")),
        ) {
            Ok(c) => c.with_timeout(Duration::from_secs(5)),
            Err(e) => {
                eprintln!("gpupilot: training without the trainer channel: {e}");
                return None;
            }
        };
        let request = Request::TrainerAttach {
            run,
            pid: Some(std::process::id()),
            knobs: BTreeMap::from([
                ("batch_size".into(), i64::from(model.config.batch_size)),
                ("prefetch".into(), i64::from(model.config.prefetch_depth)),
            ]),
            ranges: BTreeMap::new(),
            rank: None,
        };
        match client.request(request) {
            Ok(Response::TrainerAttached { .. }) => {}
            Ok(other) => {
                eprintln!("gpupilot: the daemon refused the trainer: {other:?}");
                return None;
            }
            Err(e) => {
                eprintln!("gpupilot: the daemon refused the trainer: {e}");
                return None;
            }
        }
        Some(Channel { client })
    }

    /// Apply every knob change that has arrived, acknowledging each.
    fn apply_knobs(&self, model: &mut Model) {
        while let Ok(update) = self.client.updates().try_recv() {
            let Update::Knob {
                seq, knob, value, ..
            } = update
            else {
                continue;
            };
            let (applied, reason) = match model.set(knob, value) {
                Ok(()) => (true, None),
                Err(e) => (false, Some(e.to_string())),
            };
            let _ = self.client.request(Request::KnobAck {
                seq,
                applied,
                reason,
                step: None,
            });
        }
    }

    /// The SM clock of GPU `gpu` in the daemon's newest snapshot.
    fn sm_clock(&self, gpu: u32) -> Option<f64> {
        let status = self.client.status().ok()?;
        let snap = status.snapshot?;
        let g = snap.gpus.iter().find(|g| g.index == gpu)?;
        g.sm_clock_mhz.map(f64::from)
    }

    fn report(&self, report: MetricsReport) {
        let _ = self.client.request(Request::Metrics(report));
    }

    fn error(&self, kind: &str, message: &str, batch: u32) {
        let _ = self.client.request(Request::TrainerError {
            kind: kind.into(),
            message: Some(message.into()),
            batch_size: Some(i64::from(batch)),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(batch: i64, prefetch: i64) -> Options {
        Options {
            model: "resnet50".into(),
            gpu_model: "h100-sxm".into(),
            gpu: 0,
            steps: 0,
            batch_size: batch,
            prefetch,
            workers: 8,
            seed: 7,
            speed: 1.0,
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
}
