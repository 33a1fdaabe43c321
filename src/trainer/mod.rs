//! The synthetic trainer: a real supervised process that "trains" against gpusim's model and
//! speaks the trainer channel exactly as the Python SDK does (`gpupilot synthetic-train`, the
//! run `gpupilot demo` starts).
//!
//! Each step takes the time gpusim's workload model gives for the batch size, the prefetch
//! depth and the GPU's SM clock — the clock comes from the daemon's telemetry, so a power cap
//! set on the node slows the steps down. A batch that does not fit in the GPU's memory is an
//! out-of-memory error, reported over the channel and on stderr, and the process exits 1 (the
//! profile's `on_oom = "halve_batch"` restarts it smaller).
//!
//! A single process (no `WORLD_SIZE`, or 1) acknowledges knob changes at once and uses them
//! from the next step on. A rank of a data-parallel job ([`rank`]) attaches with its rank, is
//! paced by the slowest of the job's GPUs, reports its own step time and its wait for the
//! others (`sync_wait_s`), and takes knob changes through the vote and the apply step of the
//! distributed change protocol ([`staging`]).
//!
//! [`Model`], [`rank`] and [`staging`] are the pure parts (no I/O, no sleeping) that tests
//! drive; [`run`] adds the clock, the channel and the output.

mod channel;
pub mod curve;
mod model;
pub mod rank;
pub mod staging;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use curve::CurveSpec;
pub use model::{Model, Step};
pub use rank::{RankFlags, RankPlan};

use channel::Channel;
use staging::Staging;

use crate::protocol::MetricsReport;

/// What the trainer is told to do (`gpupilot synthetic-train --help`).
#[derive(Debug, Clone)]
pub struct Options {
    /// gpusim model id: resnet50, bert-large, gpt-1.3b.
    pub model: String,
    /// gpusim GPU id: h100-sxm, …
    pub gpu_model: String,
    /// The rank and GPU flags (each overrides torchrun's environment; see [`rank`]).
    pub ranks: RankFlags,
    /// Stop after this many steps (0: never).
    pub steps: u64,
    pub batch_size: i64,
    pub prefetch: i64,
    pub workers: u32,
    pub seed: u64,
    /// Time runs this many times faster than the wall clock (tests, demos).
    pub speed: f64,
    /// Steps paced by a measured power-limit curve instead of the clock ([`curve`]).
    pub curve: Option<CurveSpec>,
}

impl Default for Options {
    /// ResNet-50 on an H100, batch 256, prefetch 2, 8 workers, forever, at wall-clock speed.
    fn default() -> Options {
        Options {
            model: "resnet50".into(),
            gpu_model: "h100-sxm".into(),
            ranks: RankFlags::default(),
            steps: 0,
            batch_size: 256,
            prefetch: 2,
            workers: 8,
            seed: 7,
            speed: 1.0,
            curve: None,
        }
    }
}

/// Reports are sent at most this often, whatever the step time.
const REPORT_EVERY: Duration = Duration::from_millis(250);
/// The job's GPU clocks are read from the daemon this often.
const CLOCKS_EVERY: Duration = Duration::from_secs(1);

/// Steps since the last report: what the next report averages.
#[derive(Debug, Default)]
struct Window {
    steps: u32,
    samples: f64,
    /// Wall (simulated) time of the steps: the job's step times.
    time_s: f64,
    /// This rank's own step times (compute and data wait).
    own_s: f64,
    wait_s: f64,
    /// The batch size and prefetch depth of the newest step.
    batch: u32,
    prefetch: u32,
}

/// `gpupilot synthetic-train`: train until `steps` (or a signal), reporting over the channel
/// when the environment names one. Returns the process's exit code.
pub fn run(opts: &Options) -> anyhow::Result<i32> {
    let plan = RankPlan::resolve(&opts.ranks, |k| std::env::var(k).ok())?;
    // Each rank loads its own shard: its own loader jitter (rank 0 keeps the seed as given).
    let seeded = Options {
        seed: opts
            .seed
            .wrapping_add(u64::from(plan.rank).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        ..opts.clone()
    };
    let mut model = Model::new(&seeded)?;
    let gpu = plan.gpu();
    let mut pace = match &opts.curve {
        Some(spec) => Some(curve::CurvePace::open(spec.clone(), gpu, seeded.seed)?),
        None => None,
    };
    let paced_by = if plan.distributed() {
        plan.job_gpus()
    } else {
        vec![gpu]
    };
    let channel = Channel::open(&model, plan.spec(&crate::telemetry::host::hostname(), None));
    let mut staging = Staging::default();
    let speed = opts.speed.clamp(0.01, 1000.0);
    let started = Instant::now();
    let max_clock = f64::from(model.spec.sm_clock_max_mhz);
    let mut clocks: BTreeMap<u32, f64> = paced_by.iter().map(|g| (*g, max_clock)).collect();
    let mut clocks_read = Instant::now() - CLOCKS_EVERY;
    let mut last_report = Instant::now() - REPORT_EVERY;
    let mut window = Window::default();
    let rank_fields = if plan.distributed() {
        format!(
            ",\"rank\":{},\"world_size\":{},\"gpu_index\":{gpu}",
            plan.rank, plan.world_size
        )
    } else {
        String::new()
    };
    println!(
        "{{\"event\":\"start\",\"model\":\"{}\",\"gpu\":\"{}\",\"batch_size\":{},\"prefetch\":{},\"attached\":{}{rank_fields}}}",
        model.model.id,
        model.spec.id,
        model.config.batch_size,
        model.config.prefetch_depth,
        channel.is_some()
    );
    loop {
        let began = Instant::now();
        if let Some(ch) = &channel {
            ch.take_knobs(&mut model, &mut staging);
            ch.ack(staging.before_step(&mut model));
            if clocks_read.elapsed() >= CLOCKS_EVERY {
                if let Some(read) = ch.sm_clocks(&paced_by) {
                    clocks.extend(read);
                }
                clocks_read = Instant::now();
            }
        }
        let own_clock = clocks.get(&gpu).copied().unwrap_or(max_clock);
        let timing = match model.step(own_clock) {
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
        let step_s = if let Some(p) = pace.as_mut() {
            // The curve decides the pace; the model's step at full clock is its unit.
            p.step_s(model.mean_step_s(max_clock))
        } else if plan.distributed() {
            let others = clocks
                .iter()
                .filter(|(g, _)| **g != gpu)
                .map(|(_, c)| model.mean_step_s(*c));
            rank::job_step_s(timing.step_s, others)
        } else {
            timing.step_s
        };
        // What this step ran with (a change taken while it runs is for the next one).
        window.batch = model.config.batch_size;
        window.prefetch = model.config.prefetch_depth;
        let mut wall = Duration::from_secs_f64(step_s / speed);
        if pace.is_some() {
            // A replayed curve's step takes its time in all: the reads and the channel's work
            // since the step began are part of it, not on top (a constant added to every step
            // would flatten the curve's differences).
            wall = wall.saturating_sub(began.elapsed());
        }
        match &channel {
            Some(ch) => ch.wait(wall, &mut model, &mut staging),
            None => std::thread::sleep(wall),
        }
        window.steps += 1;
        window.samples += f64::from(window.batch);
        window.time_s += step_s;
        window.own_s += if pace.is_some() {
            step_s
        } else {
            timing.step_s
        };
        window.wait_s += timing.data_wait_s;
        let done = opts.steps > 0 && model.step >= opts.steps;
        if last_report.elapsed() >= REPORT_EVERY || done {
            let report = report(&model, &window, own_clock, plan.distributed());
            println!(
                "{}",
                serde_json::to_string(&report).expect("a report serializes")
            );
            if let Some(ch) = &channel {
                ch.report(report);
            }
            window = Window::default();
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

/// The report of the steps in `w`: throughput at the job's pace, this rank's own step and data
/// wait, and, for a rank, how long it waited for the others at each step.
fn report(model: &Model, w: &Window, clock_mhz: f64, rank: bool) -> MetricsReport {
    let n = f64::from(w.steps.max(1));
    let mut extra = BTreeMap::from([("sm_clock_mhz".to_string(), clock_mhz)]);
    if rank {
        extra.insert("sync_wait_s".into(), ((w.time_s - w.own_s) / n).max(0.0));
    }
    MetricsReport {
        step: Some(model.step),
        epoch: Some((model.samples / 1_281_167.0) as u64),
        loss: Some(model.loss),
        samples_per_s: Some(w.samples / w.time_s),
        step_time_s: Some(w.own_s / n),
        data_wait_s: Some(w.wait_s / n),
        batch_size: Some(i64::from(w.batch)),
        prefetch: Some(i64::from(w.prefetch)),
        // This process's own count: the job's is the sum over its ranks.
        samples: Some(model.samples as u64),
        scope: None,
        lead_steps: None,
        extra,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_reports_its_own_step_and_its_wait_for_the_others() {
        let mut m = Model::new(&Options::default()).unwrap();
        let mut w = Window::default();
        // Two steps of its own at full clock, paced by a sibling GPU at half clock.
        let slow = m.mean_step_s(990.0);
        for _ in 0..2 {
            let Step::Done(t) = m.step(1980.0) else {
                panic!("fits")
            };
            let job = rank::job_step_s(t.step_s, [slow]);
            w.steps += 1;
            w.samples += 256.0;
            (w.batch, w.prefetch) = (256, 2);
            w.time_s += job;
            w.own_s += t.step_s;
            w.wait_s += t.data_wait_s;
        }
        let r = report(&m, &w, 1980.0, true);
        let own = r.step_time_s.unwrap();
        let wait = r.extra["sync_wait_s"];
        assert!((own + wait - slow).abs() < 1e-9, "{own} + {wait} = {slow}");
        assert!(
            wait > 0.3 * own,
            "it waits for the slow GPU: {wait} against {own}"
        );
        assert!((r.samples_per_s.unwrap() - 256.0 / slow).abs() < 1e-6);
        assert_eq!(
            (r.step, r.batch_size, r.prefetch),
            (Some(2), Some(256), Some(2))
        );
        // A single process reports no wait.
        let r = report(&m, &w, 1980.0, false);
        assert!(!r.extra.contains_key("sync_wait_s"));
    }
}
