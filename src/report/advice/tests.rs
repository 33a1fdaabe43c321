use std::collections::BTreeMap;

use super::*;
use crate::advisor::{HintKind, Suggestion};
use crate::history::Point;
use crate::profile::Knob;
use crate::protocol::MetricsReport;
use crate::report::environment::{EnvGpu, EnvRank};

const T0: f64 = 1_796_008_500.0;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// Ten minutes: longer than the console's five, so a finding needs the whole span.
const SPAN: f64 = 600.0;

/// A series of buckets every 10 s over the span, each holding `v(i)`.
fn series(v: impl Fn(usize) -> f64) -> Vec<Point> {
    (0..60)
        .map(|i| {
            let x = v(i);
            Point {
                t: T0 + i as f64 * 10.0,
                min: x,
                mean: x,
                max: x,
            }
        })
        .collect()
}

fn gpu(index: u32, thermal_share: f64, temperature: f64, memory_gib: f64) -> GpuSeries {
    GpuSeries {
        gpu: index,
        series: vec![
            (Metric::UtilGpu, series(|_| 97.0)),
            (Metric::MemoryUsed, series(|_| memory_gib * GIB)),
            (Metric::Power, series(|_| 640.0)),
            (Metric::PowerLimit, series(|_| 700.0)),
            (Metric::Temperature, series(|_| temperature)),
            (Metric::SmClock, series(|_| 1500.0)),
            (Metric::PowerLimited, series(|_| 0.0)),
            (Metric::ThermalLimited, series(|_| thermal_share)),
        ],
    }
}

fn environment(gpus: u32, ranks: &[(u32, u32)]) -> Environment {
    Environment {
        gpus: (0..gpus)
            .map(|index| EnvGpu {
                index,
                name: Some("NVIDIA H100 80GB HBM3".into()),
                memory_total_bytes: Some((80.0 * GIB) as u64),
                power_default_w: Some(700.0),
                power_max_w: Some(700.0),
                temp_slowdown_c: Some(87.0),
                sm_clock_max_mhz: Some(1980),
            })
            .collect(),
        ranks: ranks
            .iter()
            .map(|&(rank, gpu)| EnvRank {
                rank,
                host: Some("node-1".into()),
                gpu: Some(gpu),
                software: BTreeMap::new(),
            })
            .collect(),
        ..Environment::default()
    }
}

/// A report every 10 s from each of `ranks` (none: a single process), rank `slow` taking
/// twice as long per step.
fn reports(ranks: Option<u32>, slow: Option<u32>, batch: u64) -> Vec<MetricsPoint> {
    let mut out = Vec::new();
    for i in 0..60u64 {
        for rank in 0..ranks.unwrap_or(1) {
            let step_time = if Some(rank) == slow { 0.2 } else { 0.1 };
            out.push(MetricsPoint {
                n: out.len() as u64,
                t: T0 + i as f64 * 10.0 + 5.0,
                from: "trainer".into(),
                rank: ranks.map(|_| rank),
                report: MetricsReport {
                    step: Some(i * 100),
                    samples_per_s: Some(batch as f64 / step_time),
                    step_time_s: Some(step_time),
                    data_wait_s: Some(0.001),
                    batch_size: Some(batch as i64),
                    ..MetricsReport::default()
                },
            });
        }
    }
    out
}

fn record<'a>(
    history: &'a [GpuSeries],
    env: &'a Environment,
    points: &'a [MetricsPoint],
    knobs: Option<&'a Knobs>,
    gpus: &'a [u32],
) -> RunRecord<'a> {
    RunRecord {
        run: "r1",
        gpus: Some(gpus),
        history: Some(history),
        environment: Some(env),
        points,
        knobs,
        end_s: T0 + SPAN,
        span_s: SPAN,
        tuned: None,
    }
}

#[test]
fn a_gpu_in_thermal_slowdown_most_of_the_run_is_a_finding_with_its_target() {
    let env = environment(1, &[]);
    let points = reports(None, None, 64);
    let hot = [gpu(0, 0.8, 86.0, 60.0)];
    let hints = whole_run(&record(&hot, &env, &points, None, &[0]));
    let h = hints
        .iter()
        .find(|h| h.kind == HintKind::ThermalThrottle)
        .unwrap_or_else(|| panic!("{hints:#?}"));
    assert_eq!(h.gpu, Some(0));
    // Every bucket spent at least half its time in slowdown: all of them count.
    assert_eq!(h.evidence[0].value, 100.0);
    assert_eq!(
        h.action,
        Some(Suggestion::ThermalTarget {
            gpus: vec![0],
            celsius: 82.0
        })
    );
    // A cool GPU, rarely slowed, is no finding.
    let cool = [gpu(0, 0.2, 70.0, 60.0)];
    let hints = whole_run(&record(&cool, &env, &points, None, &[0]));
    assert!(
        hints.iter().all(|h| h.kind != HintKind::ThermalThrottle),
        "{hints:#?}"
    );
}

#[test]
fn memory_headroom_over_the_run_proposes_a_batch_within_the_profiles_range() {
    let env = environment(1, &[]);
    let points = reports(None, None, 64);
    let roomy = [gpu(0, 0.0, 70.0, 16.0)];
    let knobs = |max| Knobs {
        batch_size: Some(Knob {
            initial: 64,
            min: 8,
            max: Some(max),
        }),
        prefetch: None,
    };
    let wide = knobs(512);
    let hints = whole_run(&record(&roomy, &env, &points, Some(&wide), &[0]));
    let h = hints
        .iter()
        .find(|h| h.kind == HintKind::MemoryHeadroom)
        .unwrap_or_else(|| panic!("{hints:#?}"));
    let Some(Suggestion::SetKnob { value, .. }) = h.action else {
        panic!("{h:#?}")
    };
    // 16 GiB at 64, scaled: 256 is predicted to fit in 90 % of 80 GiB, 512 would not.
    assert_eq!(value, 256.0);
    // The profile allows no more than the batch the run had: nothing to propose.
    let narrow = knobs(64);
    let hints = whole_run(&record(&roomy, &env, &points, Some(&narrow), &[0]));
    assert!(
        hints.iter().all(|h| h.kind != HintKind::MemoryHeadroom),
        "{hints:#?}"
    );
}

#[test]
fn a_straggler_over_the_run_is_named_with_its_gpu_from_where_the_ranks_ran() {
    let env = environment(4, &[(0, 0), (1, 1), (2, 3), (3, 2)]);
    let points = reports(Some(4), Some(2), 64);
    // Rank 2 trains on GPU 3, which spent the run in thermal slowdown.
    let history = [
        gpu(0, 0.0, 70.0, 40.0),
        gpu(1, 0.0, 70.0, 40.0),
        gpu(2, 0.0, 70.0, 40.0),
        gpu(3, 1.0, 86.0, 40.0),
    ];
    let hints = whole_run(&record(&history, &env, &points, None, &[0, 1, 2, 3]));
    let h = hints
        .iter()
        .find(|h| h.kind == HintKind::Straggler)
        .unwrap_or_else(|| panic!("{hints:#?}"));
    assert_eq!(h.gpu, Some(3), "{h:#?}");
    assert!(h.summary.contains("rank 2"), "{}", h.summary);
    assert!(h.summary.contains("thermal"), "{}", h.summary);
}

#[test]
fn without_history_or_rated_figures_gpu_rules_say_nothing() {
    let env = Environment::default();
    let points = reports(None, None, 64);
    let hot = [gpu(0, 0.8, 86.0, 16.0)];
    let rec = RunRecord {
        history: None,
        ..record(&hot, &env, &points, None, &[0])
    };
    assert_eq!(whole_run(&rec), Vec::new());
    // History without the rated figures: thermal slowdown still shows (its bit is in the
    // history), memory headroom cannot (no total).
    let hints = whole_run(&record(&hot, &env, &points, None, &[0]));
    let kinds: Vec<HintKind> = hints.iter().map(|h| h.kind).collect();
    assert_eq!(kinds, [HintKind::ThermalThrottle], "{hints:#?}");
}

/// A run whose GPU ended at the cap an energy search on it chose: the report does not tell
/// the operator to raise it to the default (one voice with `advise`); at another cap it does.
#[test]
fn the_tuners_choice_is_not_advised_against_in_the_report() {
    let env = environment(1, &[]);
    let points = reports(None, None, 64);
    let mut capped = gpu(0, 0.0, 70.0, 60.0);
    for (metric, v) in [
        (Metric::PowerLimit, 400.0),
        (Metric::PowerLimited, 0.9),
        (Metric::Power, 398.0),
    ] {
        let i = capped
            .series
            .iter()
            .position(|(m, _)| *m == metric)
            .unwrap();
        capped.series[i].1 = series(|_| v);
    }
    let history = [capped];
    let raise = |hints: &[Hint]| {
        hints
            .iter()
            .any(|h| matches!(h.action, Some(Suggestion::PowerCap { watts, .. }) if watts >= 700.0))
    };
    let hints = whole_run(&record(&history, &env, &points, None, &[0]));
    assert!(
        raise(&hints),
        "without a search, the held clock is a finding: {hints:#?}"
    );
    // A result file as the tuner writes it (`session::save_result`).
    let best = serde_json::json!({
        "cap_w": 400.0, "energy_j": 597.0, "samples": 1000.0, "seconds": 1.5,
        "energy_per_sample_j": 0.597, "time_per_sample_s": 0.0015, "avg_power_w": 398.0,
        "cost": 0.6,
    });
    let file = |knob: Option<&str>| {
        let mut v = serde_json::json!({
            "eta": 1.0, "max_power_w": 700.0,
            "window": {"unit": "steps", "warmup": 10.0, "measure": 40.0},
            "start_w": 700.0, "default_w": 700.0, "best": best, "curve": [best],
            "stopped_early": false, "planned": 8, "duration_s": 90.0,
        });
        if let Some(k) = knob {
            v["knob"] = k.into();
        }
        v.to_string()
    };
    let result = file(None);
    let choice = tuner_choice("r1", &[0], &result, T0 + 100.0).unwrap();
    assert_eq!(
        choice.started,
        crate::time::rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(T0 + 10.0))
    );
    assert_eq!(
        (choice.cap_w, choice.eta, choice.power_w),
        (400.0, 1.0, Some(398.0))
    );
    assert!((choice.samples_per_s.unwrap() - 1000.0 / 1.5).abs() < 1e-9);
    let mut rec = record(&history, &env, &points, None, &[0]);
    rec.tuned = Some(choice.clone());
    let hints = whole_run(&rec);
    assert!(!raise(&hints), "{hints:#?}");
    // A search whose cap the GPU did not end at holds nothing.
    rec.tuned = Some(TunerChoice {
        cap_w: 325.0,
        ..choice
    });
    assert!(raise(&whole_run(&rec)));
    assert!(tuner_choice("r1", &[0], "{}", 0.0).is_none());
    // A search that kept a clock lock chose no cap (its 1410 is MHz).
    assert!(tuner_choice("r1", &[0], &file(Some("clocks")), T0 + 100.0).is_none());
}
