//! The straggler rule on hand-built jobs: a trainer side (ranks and their reports) and a
//! telemetry snapshot, through the same adapters the daemon and `gpupilot advise` use.

use super::{Cause, Verdict};
use crate::advisor::*;
use crate::protocol::{MetricsPoint as Report, MetricsReport, RankInfo, RankSpec, TrainerInfo};
use crate::telemetry::{GpuProcess, Snapshot, throttle};

const NOW: f64 = 10_000.0;
const RUN: &str = "r1";

/// A busy H100 at full clock, 65 °C, 600 of 700 W, Gen5 x16, its rank's process on it.
fn gpu(index: u32) -> GpuSample {
    GpuSample {
        index,
        time_s: NOW,
        util_gpu_pct: Some(97.0),
        temperature_c: Some(65.0),
        temp_slowdown_c: Some(87.0),
        power_w: Some(600.0),
        power_limit_w: Some(700.0),
        power_enforced_w: Some(700.0),
        power_default_w: Some(700.0),
        sm_clock_mhz: Some(1980),
        sm_clock_max_mhz: Some(1980),
        throttle_reasons: Some(0),
        pcie_gen: Some(5),
        pcie_width: Some(16),
        processes: Some(vec![GpuProcess {
            pid: 1000 + index,
            name: Some("python train.py".into()),
            used_memory_bytes: Some(60 << 30),
            owner: None,
        }]),
        ..GpuSample::default()
    }
}

/// Four ranks on GPUs 0–3, every rank reporting four times a second for 30 s with its step
/// time and data wait from `step(rank)`.
struct Job {
    ranks: u32,
    reports_per_rank: usize,
    step: fn(u32) -> (f64, f64),
}

impl Job {
    fn new(step: fn(u32) -> (f64, f64)) -> Job {
        Job {
            ranks: 4,
            reports_per_rank: 120,
            step,
        }
    }

    fn trainer(&self) -> TrainerInfo {
        TrainerInfo {
            attached: true,
            world_size: Some(self.ranks),
            ranks: (0..self.ranks)
                .map(|r| RankInfo {
                    spec: RankSpec {
                        rank: r,
                        world_size: self.ranks,
                        local_rank: Some(r),
                        host: Some("node1".into()),
                        gpu: Some(r),
                        gpu_uuid: None,
                    },
                    attached: true,
                    pid: Some(1000 + r),
                    last: None,
                    steps_per_s: None,
                })
                .collect(),
            ..TrainerInfo::default()
        }
    }

    fn reports(&self) -> Vec<Report> {
        let mut out = Vec::new();
        let n = self.reports_per_rank;
        for k in 0..n {
            let t = NOW - 0.25 * (n - 1 - k) as f64;
            for r in 0..self.ranks {
                let (step, wait) = (self.step)(r);
                out.push(Report {
                    n: out.len() as u64,
                    t,
                    from: "trainer".into(),
                    rank: Some(r),
                    report: MetricsReport {
                        step: Some(k as u64 + 1),
                        step_time_s: Some(step),
                        data_wait_s: Some(wait),
                        samples_per_s: Some(256.0 / step),
                        batch_size: Some(256),
                        prefetch: Some(2),
                        ..MetricsReport::default()
                    },
                });
            }
        }
        out
    }

    /// The advisor's input for this job on `snap`.
    fn input(&self, snap: &Snapshot) -> AdvisorInput {
        AdvisorInput {
            now: NOW,
            gpus: snap
                .gpus
                .iter()
                .map(|g| adapt::gpu_series(g, &[]))
                .collect(),
            runs: vec![adapt::run_window(
                RUN,
                Vec::new(),
                &self.reports(),
                &self.trainer(),
                Vec::new(),
            )],
            curves: Vec::new(),
            owners: Vec::new(),
        }
    }
}

fn snapshot(change: impl Fn(&mut GpuSample)) -> Snapshot {
    Snapshot {
        time_s: NOW,
        gpus: (0..4)
            .map(|i| {
                let mut g = gpu(i);
                change(&mut g);
                g
            })
            .collect(),
        ..Snapshot::default()
    }
}

/// Rank 2's own step is 23% longer than the others' 0.2 s.
fn rank2_slow(r: u32) -> (f64, f64) {
    if r == 2 { (0.246, 0.004) } else { (0.2, 0.004) }
}

fn straggler_hints(i: &AdvisorInput) -> Vec<Hint> {
    advise(i, &Thresholds::default())
        .into_iter()
        .filter(|h| h.kind == HintKind::Straggler)
        .collect()
}

fn verdict(i: &AdvisorInput) -> Verdict {
    let mut v = stragglers(i, &Thresholds::default());
    assert_eq!(v.len(), 1);
    v.remove(0)
}

fn evidence(h: &Hint, name: &str) -> f64 {
    h.evidence
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no evidence {name:?} in {:?}", h.evidence))
        .value
}

#[test]
fn a_thermally_throttled_rank_is_named_with_its_gpu_and_the_numbers() {
    let snap = snapshot(|g| {
        if g.index == 2 {
            g.temperature_c = Some(87.0);
            g.sm_clock_mhz = Some(1410);
            g.power_w = Some(420.0);
            g.throttle_reasons = Some(throttle::HW_SLOWDOWN | throttle::HW_THERMAL_SLOWDOWN);
        }
    });
    let input = Job::new(rank2_slow).input(&snap);
    let hints = straggler_hints(&input);
    assert_eq!(hints.len(), 1, "{hints:#?}");
    let h = &hints[0];
    assert_eq!((h.run.as_deref(), h.gpu), (Some(RUN), Some(2)));
    assert_eq!(
        h.summary,
        "rank 2 on GPU 2 is 23% slower than the median rank: thermal slowdown — 87 °C at its \
         87 °C slowdown threshold, SM 1410 MHz against 1980 MHz max while its siblings run at \
         1980 MHz; the job loses 19% of its time"
    );
    assert_eq!(
        h.action.as_ref().map(Suggestion::command).as_deref(),
        Some("gpupilot thermal target 80 --gpu 2")
    );
    assert!((evidence(h, "step time (rank 2)") - 0.246).abs() < 1e-9);
    assert!((evidence(h, "step time (median of the other ranks)") - 0.2).abs() < 1e-9);
    assert!((evidence(h, "job time lost") - 100.0 * 0.046 / 0.246).abs() < 1e-6);
    assert_eq!(evidence(h, "siblings' SM clock (median)"), 1980.0);
    assert_eq!(evidence(h, "ranks compared"), 4.0);
    let v = verdict(&input);
    assert_eq!(v.cause, Some(Cause::ThermalSlowdown));
    let s = v.spread.unwrap();
    assert_eq!((s.rank, s.gpu), (2, Some(2)));
    assert!((s.ratio - 1.23).abs() < 1e-9);
}

#[test]
fn a_straggler_named_for_its_heat_takes_the_place_of_the_gpus_own_thermal_hint() {
    let snap = snapshot(|g| {
        if g.index == 2 {
            g.temperature_c = Some(88.0);
            g.sm_clock_mhz = Some(990);
            g.throttle_reasons = Some(throttle::HW_THERMAL_SLOWDOWN);
        }
    });
    let mut input = Job::new(rank2_slow).input(&snap);
    // A minute of GPU 2's history at its threshold: enough for the per-GPU thermal rule.
    let hot = &mut input.gpus[2];
    let latest = hot.latest.clone().unwrap();
    hot.points = (0..60)
        .map(|k| GpuPoint {
            t: NOW - 60.0 + f64::from(k),
            temperature_c: Some(87.5),
            temp_slowdown_c: Some(87.0),
            sm_clock_mhz: Some(990),
            ..GpuPoint::default()
        })
        .chain(GpuPoint::from_sample(&latest))
        .collect();
    let kinds: Vec<(HintKind, Option<u32>)> = advise(&input, &Thresholds::default())
        .iter()
        .map(|h| (h.kind, h.gpu))
        .collect();
    assert_eq!(kinds, [(HintKind::Straggler, Some(2))]);
    // Without the job the GPU's own hint comes back.
    input.runs.clear();
    let kinds: Vec<HintKind> = advise(&input, &Thresholds::default())
        .iter()
        .map(|h| h.kind)
        .collect();
    assert_eq!(kinds, [HintKind::ThermalThrottle]);
}

#[test]
fn a_capped_gpu_is_named_with_its_cap_and_the_siblings_cap() {
    let snap = snapshot(|g| {
        if g.index == 1 {
            g.power_limit_w = Some(400.0);
            g.power_enforced_w = Some(400.0);
            g.power_w = Some(399.0);
            g.sm_clock_mhz = Some(1500);
            g.throttle_reasons = Some(throttle::SW_POWER_CAP);
        }
    });
    let input = Job::new(|r| if r == 1 { (0.25, 0.004) } else { (0.2, 0.004) }).input(&snap);
    let hints = straggler_hints(&input);
    assert_eq!(hints.len(), 1, "{hints:#?}");
    let h = &hints[0];
    assert_eq!(
        h.summary,
        "rank 1 on GPU 1 is 25% slower than the median rank: power cap — 399 W at its 400 W cap \
         while its siblings may draw 700 W, SM 1500 MHz against their 1980 MHz; the job loses \
         20% of its time"
    );
    assert_eq!(
        h.action.as_ref().map(Suggestion::command).as_deref(),
        Some("gpupilot power cap 700 --gpu 1")
    );
    assert_eq!(verdict(&input).cause, Some(Cause::PowerCap));
}

#[test]
fn a_degraded_link_another_process_and_a_slow_input_pipeline_are_told_apart() {
    let slow3 = |r| if r == 3 { (0.26, 0.004) } else { (0.2, 0.004) };
    // GPU 3 trained down to Gen3 x8.
    let snap = snapshot(|g| {
        if g.index == 3 {
            g.pcie_gen = Some(3);
            g.pcie_width = Some(8);
        }
    });
    let input = Job::new(slow3).input(&snap);
    let h = &straggler_hints(&input)[0];
    assert!(
        h.summary.contains(
            "degraded PCIe link — Gen3 x8 against Gen5 x16 on its siblings (reseat the card"
        ),
        "{}",
        h.summary
    );
    assert_eq!(h.action, None);
    assert_eq!(verdict(&input).cause, Some(Cause::PcieLink));

    // Someone's evaluation job on GPU 3.
    let snap = snapshot(|g| {
        if g.index == 3 {
            g.processes.as_mut().unwrap().push(GpuProcess {
                pid: 4242,
                name: Some("python eval.py".into()),
                used_memory_bytes: Some(3 << 30),
                owner: None,
            });
        }
    });
    let input = Job::new(slow3).input(&snap);
    let h = &straggler_hints(&input)[0];
    assert!(
        h.summary.contains(
            "another process on its GPU — pid 4242 (python eval.py), 3.0 GiB shares GPU 3 with it"
        ),
        "{}",
        h.summary
    );
    assert_eq!(evidence(h, "other process pid"), 4242.0);
    assert_eq!(verdict(&input).cause, Some(Cause::OtherProcess));

    // Every GPU with one process that is not a rank (a simulated node's made-up trainers) is
    // no evidence; nor is a GPU that shows nothing: its data wait is.
    let snap = snapshot(|g| {
        g.processes = Some(vec![GpuProcess {
            pid: 40_000 + g.index,
            name: None,
            used_memory_bytes: None,
            owner: None,
        }])
    });
    let input = Job::new(|r| if r == 3 { (0.26, 0.05) } else { (0.2, 0.004) }).input(&snap);
    let h = &straggler_hints(&input)[0];
    assert!(
        h.summary.contains(
            "its own input pipeline — it waits 50 ms a step for data against 4 ms on the other \
             ranks; raise prefetch 2 → 4"
        ),
        "{}",
        h.summary
    );
    assert_eq!(
        h.action.as_ref().map(Suggestion::command).as_deref(),
        Some("gpupilot set r1 prefetch 4")
    );
    assert_eq!(verdict(&input).cause, Some(Cause::InputPipeline));

    // Nothing at all: named, without a cause or a command.
    let input = Job::new(slow3).input(&snapshot(|_| {}));
    let h = &straggler_hints(&input)[0];
    assert!(
        h.summary.contains("its GPU shows no cause"),
        "{}",
        h.summary
    );
    assert_eq!(h.action, None);
    assert_eq!(verdict(&input).cause, Some(Cause::Unknown));
}

#[test]
fn no_straggler_without_its_evidence() {
    let snap = snapshot(|_| {});
    // 5% slower: within the line, but the spread is still measured (the alert clears on it).
    let input = Job::new(|r| if r == 2 { (0.21, 0.004) } else { (0.2, 0.004) }).input(&snap);
    assert!(straggler_hints(&input).is_empty());
    let v = verdict(&input);
    assert_eq!((v.hint, v.cause), (None, None));
    assert!((v.spread.unwrap().ratio - 1.05).abs() < 1e-9);

    // Too few reports from each rank to say (one slow step is not a straggler).
    let mut job = Job::new(rank2_slow);
    job.reports_per_rank = straggler::MIN_REPORTS - 1;
    let input = job.input(&snap);
    assert!(straggler_hints(&input).is_empty());
    assert_eq!(verdict(&input).spread, None);

    // Reports older than the window.
    let mut input = Job::new(rank2_slow).input(&snap);
    input.now += Thresholds::default().window_s + 31.0;
    assert!(straggler_hints(&input).is_empty());

    // A single process is no job.
    let mut job = Job::new(rank2_slow);
    job.ranks = 1;
    let input = job.input(&snap);
    assert!(input.runs[0].ranks.is_empty());
    assert!(stragglers(&input, &Thresholds::default()).is_empty());
}

/// Rank 2 at 0.3 s a step either in its newest [`straggler::REPORTS`] reports only
/// (`slow_last`) or in all the others; everyone else at 0.2 s.
fn slow_tail(job: &Job, slow_last: bool) -> AdvisorInput {
    let mut input = job.input(&snapshot(|_| {}));
    let rank2 = input.runs[0]
        .ranks
        .iter_mut()
        .find(|r| r.rank == 2)
        .unwrap();
    let n = rank2.metrics.len();
    for (k, m) in rank2.metrics.iter_mut().enumerate() {
        if (k >= n.saturating_sub(straggler::REPORTS)) == slow_last {
            m.step_time_s = Some(0.3);
        }
    }
    input
}

#[test]
fn each_rank_is_judged_on_its_newest_reports() {
    // Slow for most of the window, in step for its newest reports: recovered, not named; and
    // the other way round, named at once.
    let mut job = Job::new(|_| (0.2, 0.004));
    assert!(
        straggler_hints(&slow_tail(&job, false)).is_empty(),
        "recovered"
    );
    let h = &straggler_hints(&slow_tail(&job, true))[0];
    assert!(
        h.summary.starts_with("rank 2 on GPU 2 is 50% slower"),
        "{}",
        h.summary
    );
    job.reports_per_rank = straggler::MIN_REPORTS - 1;
    assert!(
        straggler_hints(&slow_tail(&job, true)).is_empty(),
        "too few reports"
    );
}

#[test]
fn two_ranks_are_enough_and_the_run_level_rules_read_the_job() {
    let mut job = Job::new(|r| if r == 1 { (0.3, 0.004) } else { (0.2, 0.004) });
    job.ranks = 2;
    let input = job.input(&snapshot(|_| {}));
    let run = &input.runs[0];
    assert_eq!(run.ranks.len(), 2);
    // The job's series: a point at every rank's report, its step time the slowest rank's
    // once both have reported (the figures ps, the console and the report give).
    assert_eq!(run.metrics.len(), 240);
    assert_eq!(run.metrics[0].step_time_s, Some(0.2));
    assert!(
        run.metrics[1..].iter().all(|m| m.step_time_s == Some(0.3)),
        "the run-level rules read the job's series"
    );
    // Its throughput is both ranks' (256 samples a step each), not rank 0's alone.
    let rate = run.metrics.last().and_then(|m| m.samples_per_s).unwrap();
    assert!((rate - (256.0 / 0.2 + 256.0 / 0.3)).abs() < 1e-9, "{rate}");
    let h = &straggler_hints(&input)[0];
    assert!(
        h.summary.starts_with("rank 1 on GPU 1 is 50% slower"),
        "{}",
        h.summary
    );
}
