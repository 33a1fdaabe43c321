//! One voice, on constructed windows: the observed case (a tuned cap called a throttle and a
//! drop to undo), a workload that moved since the search, a governor's cap, a job's GPUs, and
//! the thermal finding against the badge of the same samples.

use crate::advisor::adapt;
use crate::advisor::*;
use crate::control::owner::{CapOwner, ClockChoice, GpuOwner, TunerChoice};
use crate::history::{Metric, Point};
use crate::telemetry::{GpuSample, throttle, throttle_reason_badges};

const NOW: f64 = 10_000.0;
/// The search set its best cap here.
const TUNED_AT: f64 = NOW - 60.0;

/// An H100 (700 W default, 1980 MHz) at 350 W before the tune and at the tuner's 325 W after,
/// held by that cap: reasons `pwr-cap`, SM clock well under its max.
fn capped(t: f64) -> GpuPoint {
    let after = t >= TUNED_AT;
    GpuPoint {
        t,
        util_pct: Some(99.0),
        power_w: Some(if after { 323.0 } else { 348.0 }),
        power_limit_w: Some(if after { 325.0 } else { 350.0 }),
        power_default_w: Some(700.0),
        power_max_w: Some(700.0),
        temperature_c: Some(60.0),
        temp_slowdown_c: Some(87.0),
        throttle_reasons: Some(throttle::SW_POWER_CAP),
        sm_clock_mhz: Some(if after { 1350 } else { 1450 }),
        sm_clock_max_mhz: Some(1980),
        ..GpuPoint::default()
    }
}

/// One point every 2 s over the last two minutes.
fn series(index: u32, f: impl Fn(f64) -> GpuPoint) -> GpuSeries {
    GpuSeries {
        index,
        points: (0..=60).map(|k| f(NOW - 120.0 + 2.0 * k as f64)).collect(),
        latest: None,
    }
}

/// Run `r1` on `gpus`: 4973 samples/s before the tune, `after` since; the cap change
/// 350 → 325 W on each GPU at the tune.
fn run(id: &str, gpus: &[u32], after: f64) -> RunWindow {
    RunWindow {
        run: id.into(),
        gpus: gpus.to_vec(),
        metrics: (0..=60)
            .map(|k| {
                let t = NOW - 120.0 + 2.0 * k as f64;
                StepPoint {
                    t,
                    samples_per_s: Some(if t < TUNED_AT { 4973.0 } else { after }),
                    ..StepPoint::default()
                }
            })
            .collect(),
        changes: gpus
            .iter()
            .map(|g| KnobChange {
                t: TUNED_AT,
                knob: Knob::PowerCap,
                old: 350.0,
                new: 325.0,
                gpu: Some(*g),
            })
            .collect(),
        ..RunWindow::default()
    }
}

/// What `tune energy r1 --eta 1` chose: 325 W, where it measured 4012 samples/s and 323 W
/// per GPU.
fn choice(gpus: &[u32]) -> TunerChoice {
    TunerChoice {
        run: "r1".into(),
        gpus: gpus.to_vec(),
        eta: 1.0,
        cap_w: 325.0,
        started: "2026-12-01T10:00:00Z".into(),
        samples_per_s: Some(4012.0),
        power_w: Some(323.0 * gpus.len() as f64),
    }
}

fn owned(gpus: &[u32], owner: &CapOwner) -> Vec<GpuOwner> {
    gpus.iter()
        .map(|g| GpuOwner {
            gpu: *g,
            cap_w: Some(325.0),
            owner: Some(owner.clone()),
        })
        .collect()
}

fn tuned_node(after: f64) -> AdvisorInput {
    AdvisorInput {
        now: NOW,
        gpus: vec![series(0, capped)],
        runs: vec![run("r1", &[0], after)],
        owners: owned(&[0], &CapOwner::Tuner(choice(&[0]))),
        ..AdvisorInput::default()
    }
}

fn hints(i: &AdvisorInput) -> Vec<Hint> {
    advise(i, &Thresholds::default())
}

fn raises_or_undoes_a_cap(h: &Hint) -> bool {
    matches!(h.action, Some(Suggestion::PowerCap { .. })) || h.kind == HintKind::ThroughputDrop
}

#[test]
fn after_a_tune_advise_neither_undoes_the_cap_nor_raises_it_to_the_default() {
    let tuned = tuned_node(4012.0);
    // The same window without the record of who chose the cap: what `advise` said.
    let blind = AdvisorInput {
        owners: Vec::new(),
        ..tuned.clone()
    };
    let said = hints(&blind);
    let drop = said
        .iter()
        .find(|h| h.kind == HintKind::ThroughputDrop)
        .unwrap_or_else(|| panic!("{said:#?}"));
    assert!(
        drop.summary
            .starts_with("throughput fell 19% (4973 → 4012 samples/s) after power cap 350 → 325"),
        "{}",
        drop.summary
    );
    let raise = said
        .iter()
        .find(|h| h.kind == HintKind::PowerCapThrottle)
        .unwrap_or_else(|| panic!("{said:#?}"));
    assert_eq!(
        raise.action.as_ref().map(Suggestion::command).as_deref(),
        Some("gpupilot power cap 700 --gpu 0")
    );
    // Knowing the tuner chose it, and that it still measures what the search measured: quiet.
    let now = hints(&tuned);
    assert!(!now.iter().any(raises_or_undoes_a_cap), "{now:#?}");
    assert!(
        !now.iter().any(|h| h.kind == HintKind::TunedCap),
        "{now:#?}"
    );
    // Within the stated threshold (15%) the choice still holds: 3500 is 12.8% off.
    assert!(hints(&tuned_node(3500.0)).is_empty());
}

#[test]
fn a_gpu_the_tuner_locked_for_energy_is_not_told_to_raise_or_undo_its_cap() {
    // The same power-held GPU and throughput drop, its clocks locked by a finished clock
    // search (`--knob clocks`): the cap is a person's, but moving it would move what the
    // search measured, as a cap the tuner chose would.
    let locked = AdvisorInput {
        owners: owned(
            &[0],
            &CapOwner::TunedClocks(ClockChoice {
                run: "r1".into(),
                gpus: vec![0],
                eta: 1.0,
                max_mhz: 1410,
                started: "2026-12-01T10:00:00Z".into(),
            }),
        ),
        ..tuned_node(4012.0)
    };
    let h = hints(&locked);
    assert!(
        !h.iter()
            .any(|h| matches!(h.action, Some(Suggestion::PowerCap { .. }))),
        "{h:#?}"
    );
    // Without the lock's owner, the same window is told to raise the cap.
    let blind = AdvisorInput {
        owners: Vec::new(),
        ..locked
    };
    assert!(
        hints(&blind)
            .iter()
            .any(|h| matches!(h.action, Some(Suggestion::PowerCap { .. })))
    );
}

#[test]
fn a_workload_that_moved_since_the_search_names_the_choice_and_why() {
    let h = hints(&tuned_node(3000.0));
    assert!(!h.iter().any(raises_or_undoes_a_cap), "{h:#?}");
    let t = h
        .iter()
        .find(|h| h.kind == HintKind::TunedCap)
        .unwrap_or_else(|| panic!("{h:#?}"));
    assert_eq!(
        t.summary,
        "GPU 0: power cap 325 W is the energy tuner's choice for run r1 (eta 1, search of \
         2026-12-01T10:00:00Z), but the run's throughput is 3000 samples/s against the 4012 \
         samples/s the search measured at that cap (-25%, more than 15%): the workload changed \
         since; search again"
    );
    assert_eq!(
        t.action.as_ref().map(Suggestion::command).as_deref(),
        Some("gpupilot tune energy r1 --eta 1")
    );
    let change = t.evidence.iter().find(|e| e.name == "throughput change");
    assert!((change.unwrap().value - (-25.22)).abs() < 0.01, "{t:#?}");

    // The tuned run ended and another trains on its GPU: its choice was measured on another
    // workload.
    let mut other = tuned_node(4012.0);
    other.runs[0].run = "r2".into();
    let h = hints(&other);
    let t = h.iter().find(|h| h.kind == HintKind::TunedCap).unwrap();
    assert!(
        t.summary
            .contains("measured on run r1, which has ended, and run r2 trains on its GPUs now"),
        "{}",
        t.summary
    );
    assert_eq!(
        t.action,
        Some(Suggestion::TuneEnergy {
            run: "r2".into(),
            eta: 1.0
        })
    );
}

#[test]
fn a_cap_the_governor_or_the_budget_holds_is_no_throttle_to_remove() {
    for owner in [
        CapOwner::Governor {
            by: "alice".into(),
            target_c: Some(78.0),
        },
        CapOwner::Budget {
            by: "bob".into(),
            budget_w: 2800.0,
        },
        CapOwner::Search { run: "r1".into() },
    ] {
        let input = AdvisorInput {
            owners: owned(&[0], &owner),
            ..tuned_node(3000.0)
        };
        let h = hints(&input);
        assert!(h.is_empty(), "{owner:?}: {h:#?}");
    }
    // A hot GPU the governor holds: the thermal finding proposes no second target.
    let hot = AdvisorInput {
        gpus: vec![series(0, |t| GpuPoint {
            temperature_c: Some(86.0),
            throttle_reasons: Some(throttle::SW_POWER_CAP | throttle::SW_THERMAL_SLOWDOWN),
            ..capped(t)
        })],
        owners: owned(
            &[0],
            &CapOwner::Governor {
                by: "alice".into(),
                target_c: Some(78.0),
            },
        ),
        ..tuned_node(4012.0)
    };
    let h = hints(&hot);
    assert_eq!(h.len(), 1, "{h:#?}");
    assert_eq!(h[0].kind, HintKind::ThermalThrottle);
    assert_eq!(h[0].action, None);
    assert!(
        h[0].summary.contains(
            "with the thermal governor (toward 78 °C, turned on by alice) holding its cap"
        ),
        "{}",
        h[0].summary
    );
}

#[test]
fn a_fix_for_one_gpu_of_a_job_acts_on_the_job_once() {
    // A job on four GPUs that a person capped at 325 W: each GPU is held by it.
    let input = AdvisorInput {
        now: NOW,
        gpus: (0..4).map(|i| series(i, capped)).collect(),
        runs: vec![RunWindow {
            changes: Vec::new(),
            ..run("r1", &[0, 1, 2, 3], 4973.0)
        }],
        owners: owned(&[0, 1, 2, 3], &CapOwner::Operator),
        ..AdvisorInput::default()
    };
    let h = hints(&input);
    let caps: Vec<&Hint> = h
        .iter()
        .filter(|h| h.kind == HintKind::PowerCapThrottle)
        .collect();
    assert_eq!(caps.len(), 1, "said once for the job: {h:#?}");
    assert_eq!(
        caps[0].action.as_ref().map(Suggestion::command).as_deref(),
        Some("gpupilot power cap 700 --gpu 0,1,2,3")
    );
    assert!(
        caps[0].summary.ends_with(
            "(on every GPU of its job, 0,1,2,3: a cap on one rank makes it the straggler)"
        ),
        "{}",
        caps[0].summary
    );
    // A GPU of no job keeps its own.
    let alone = AdvisorInput {
        runs: vec![run("r1", &[0], 4973.0)],
        ..input
    };
    let h = hints(&alone);
    let gpu3 = h
        .iter()
        .find(|h| h.kind == HintKind::PowerCapThrottle && h.gpu == Some(3))
        .unwrap();
    assert_eq!(
        gpu3.action.as_ref().map(Suggestion::command).as_deref(),
        Some("gpupilot power cap 700 --gpu 3")
    );
}

fn pt(t: f64, v: f64) -> Point {
    Point {
        t,
        min: v,
        mean: v,
        max: v,
    }
}

#[test]
fn the_thermal_finding_reads_the_samples_the_badge_reads() {
    // A GPU in hardware thermal slowdown for the last 40 s (the console's badge: `hw-therm`).
    let hot = |t: f64| if t >= NOW - 40.0 { 1.0 } else { 0.0 };
    let times: Vec<f64> = (0..=60).map(|k| NOW - 60.0 + k as f64).collect();
    let history = vec![
        (
            Metric::ThermalLimited,
            times.iter().map(|&t| pt(t, hot(t))).collect(),
        ),
        (
            Metric::Temperature,
            times.iter().map(|&t| pt(t, 80.0 + 7.0 * hot(t))).collect(),
        ),
    ];
    let latest = GpuSample {
        index: 2,
        time_s: NOW,
        temperature_c: Some(87.0),
        temp_slowdown_c: Some(87.0),
        throttle_reasons: Some(throttle::HW_THERMAL_SLOWDOWN),
        ..GpuSample::default()
    };
    assert_eq!(
        throttle_reason_badges(latest.throttle_reasons.unwrap()),
        ["hw-therm"]
    );
    let series = adapt::gpu_series(&latest, &history);
    assert_eq!(
        series.points.len(),
        61,
        "the newest sample takes its own second"
    );
    assert_eq!(
        series.points.last().unwrap().throttle_reasons,
        Some(throttle::HW_THERMAL_SLOWDOWN),
        "the newest point carries the badge's reasons"
    );
    let input = AdvisorInput {
        now: NOW,
        gpus: vec![series],
        ..AdvisorInput::default()
    };
    let h = hints(&input);
    let t = h
        .iter()
        .find(|h| h.kind == HintKind::ThermalThrottle)
        .unwrap_or_else(|| panic!("{h:#?}"));
    // 41 of the 61 seconds: the share the badge's reading gives over the same samples.
    let share = 100.0 * 41.0 / 61.0;
    assert!((t.evidence[0].value - share).abs() < 1e-9, "{t:#?}");
    assert!(
        t.summary
            .starts_with("GPU 2: thermal throttling 67% of the time, up to 87 C"),
        "{}",
        t.summary
    );
    // Only near the threshold, never in slowdown: said as such, not as throttling.
    let mut near = input.clone();
    for p in &mut near.gpus[0].points {
        p.throttle_reasons = Some(0);
    }
    let h = hints(&near);
    let t = h
        .iter()
        .find(|h| h.kind == HintKind::ThermalThrottle)
        .unwrap();
    assert!(
        t.summary
            .starts_with("GPU 2: near its thermal slowdown (in it 0% of the time), up to 87 C"),
        "{}",
        t.summary
    );
}
