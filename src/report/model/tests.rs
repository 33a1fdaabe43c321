use std::io::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::control::energy::{GpuEnergy, Price};
use crate::protocol::MetricsReport;
use crate::supervisor::{LaunchPlan, RunStatus};

const T0: f64 = 1_796_008_500.0;

fn at(s: f64) -> String {
    rfc3339(UNIX_EPOCH + Duration::from_secs_f64(s))
}

fn summary(dir: &RunDir, status: RunStatus) -> Summary {
    let energy = RunEnergy::new(
        vec![
            GpuEnergy {
                gpu: 0,
                energy_j: 36_000.0,
            },
            GpuEnergy {
                gpu: 1,
                energy_j: 18_000.0,
            },
        ],
        Some(5400),
        Some(&Price {
            per_kwh: 0.5,
            currency: "EUR".into(),
        }),
        None,
    );
    let ended = status.is_final();
    Summary {
        id: dir.id().into(),
        name: "synth".into(),
        status,
        pid: Some(42),
        attempt: 1,
        restarts: 1,
        started_at: at(T0),
        ended_at: ended.then(|| at(T0 + 120.0)),
        duration_s: ended.then_some(120.0),
        exit_code: ended.then_some(0),
        signal: None,
        signal_name: None,
        description: ended.then(|| "exit 0".into()),
        energy_j: Some(energy.energy_j),
        samples: energy.samples,
        energy: Some(energy),
    }
}

/// A run of two ranks over 120 s: a report every 10 s per rank, a knob change at 60 s, a
/// restart at 90 s, a cap change in the node log at 30 s; both `.jsonl` files end mid-line.
fn synthetic(status: RunStatus) -> (tempfile::TempDir, RunDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = RunDir::create(
        tmp.path(),
        "synth",
        UNIX_EPOCH + Duration::from_secs(T0 as u64),
    )
    .unwrap();
    dir.write_summary(&summary(&dir, status)).unwrap();
    dir.write_launch(&LaunchPlan {
        argv: vec!["train".into(), "--fast".into()],
        cwd: "/".into(),
        env: Default::default(),
        template: None,
        slurm: None,
        monitor: None,
    })
    .unwrap();
    let mut metrics = String::new();
    for i in 0..12u64 {
        for rank in 0..2u32 {
            let p = MetricsPoint {
                n: i * 2 + u64::from(rank),
                t: T0 + i as f64 * 10.0,
                from: "trainer".into(),
                rank: Some(rank),
                report: MetricsReport {
                    step: Some(i * 10 + 10),
                    loss: Some(2.0 / (i + 1) as f64),
                    samples_per_s: Some(45.0),
                    step_time_s: Some(0.1),
                    data_wait_s: Some(0.025),
                    ..MetricsReport::default()
                },
            };
            metrics.push_str(&serde_json::to_string(&p).unwrap());
            metrics.push('\n');
        }
    }
    metrics.push_str("{\"n\":99,\"t\":17960");
    std::fs::write(dir.path().join("metrics.jsonl"), metrics).unwrap();
    let ev = |t: f64, event| EventRecord { time: at(t), event };
    for rec in [
        ev(
            T0,
            Event::Started {
                attempt: 0,
                pid: 41,
                start_time: 1,
                own_session: true,
            },
        ),
        ev(
            T0 + 60.0,
            Event::Changed {
                by: "alice".into(),
                what: "batch_size".into(),
                old: Some("256".into()),
                new: Some("512".into()),
                why: None,
            },
        ),
        ev(
            T0 + 90.0,
            Event::Restarted {
                attempt: 1,
                pid: 42,
                start_time: 2,
                own_session: true,
            },
        ),
    ] {
        dir.append_event(&rec).unwrap();
    }
    std::fs::OpenOptions::new()
        .append(true)
        .open(dir.events_path())
        .unwrap()
        .write_all(b"{\"time\":\"2026-")
        .unwrap();
    let node = NodeEventRecord {
        seq: 1,
        time: at(T0 + 30.0),
        event: NodeEvent::GpuChanged {
            gpu: 1,
            what: "power_limit".into(),
            old: Some("300 W".into()),
            new: Some("250 W".into()),
            by: "alice".into(),
            why: None,
        },
    };
    let other_gpu = NodeEventRecord {
        seq: 2,
        time: at(T0 + 40.0),
        event: NodeEvent::GpuChanged {
            gpu: 7,
            what: "power_limit".into(),
            old: None,
            new: Some("100 W".into()),
            by: "bob".into(),
            why: None,
        },
    };
    let governor = NodeEventRecord {
        seq: 3,
        time: at(T0 + 45.0),
        event: NodeEvent::Governor {
            gpu: 0,
            change: "cap".into(),
            target_c: Some(80.0),
            temperature_c: Some(83.0),
            old_w: Some(300.0),
            new_w: Some(280.0),
            by: "daemon".into(),
            why: "hold 80 °C".into(),
        },
    };
    let log = format!(
        "{}\n{}\n{}\n",
        serde_json::to_string(&node).unwrap(),
        serde_json::to_string(&other_gpu).unwrap(),
        serde_json::to_string(&governor).unwrap()
    );
    std::fs::write(tmp.path().join("events.jsonl"), log).unwrap();
    (tmp, dir)
}

fn history() -> Vec<GpuSeries> {
    let pts = |v: f64| -> Vec<Point> {
        (0..12)
            .map(|i| Point {
                t: T0 + i as f64 * 10.0,
                min: v,
                mean: v,
                max: v,
            })
            .collect()
    };
    vec![GpuSeries {
        gpu: 0,
        series: vec![
            (Metric::UtilGpu, pts(90.0)),
            (Metric::PowerLimited, pts(0.25)),
            (Metric::ThermalLimited, pts(0.0)),
        ],
    }]
}

#[test]
fn an_ended_run_has_its_figures_and_says_what_it_skipped() {
    let (tmp, dir) = synthetic(RunStatus::Succeeded);
    let log = tmp.path().join("events.jsonl");
    let r = gather(
        &dir,
        Sources {
            node_log: Some(&log),
            history: Some(Ok(history())),
            now_s: Some(T0 + 500.0),
            ..Sources::default()
        },
    )
    .unwrap();
    assert!(!r.live);
    assert_eq!(r.summary.exit_code, Some(0));
    assert_eq!((r.start_s, r.end_s), (T0, T0 + 120.0));
    assert_eq!(r.command, ["train", "--fast"]);
    assert_eq!(r.gpus.as_deref(), Some(&[0, 1][..]));
    assert_eq!(r.throughput.steps, Some(120));
    assert_eq!(r.throughput.samples, Some(5400));
    assert_eq!(r.throughput.reports, 24);
    assert_eq!(r.ranks.len(), 2);
    assert_eq!(r.ranks[1].rank, Some(1));
    let e = r.energy.as_ref().unwrap();
    assert!((e.kwh - 0.015).abs() < 1e-12);
    assert_eq!(e.j_per_sample, Some(10.0));
    assert_eq!(e.cost, Some(0.0075));
    assert!((r.time_lost.data_wait_share.unwrap() - 0.25).abs() < 1e-9);
    assert_eq!(r.time_lost.throttled.len(), 1);
    assert_eq!(r.time_lost.throttled[0].power_s, Some(30.0));
    assert_eq!(r.time_lost.throttled[0].thermal_s, Some(0.0));
    assert_eq!(
        r.unreadable,
        Unreadable {
            metrics: 1,
            events: 1
        }
    );
    assert!(
        r.missing
            .iter()
            .any(|m| m.contains("metrics.jsonl: 1 line")),
        "{:?}",
        r.missing
    );
    assert!(r.missing.iter().any(|m| m.contains("events.jsonl: 1 line")));
    assert_eq!(r.events.len(), 3);
    let marks: Vec<(f64, MarkerKind)> = r.markers.iter().map(|m| (m.t - T0, m.kind)).collect();
    // GPU 7's cap is not this run's.
    assert_eq!(
        marks,
        [
            (30.0, MarkerKind::Cap),
            (45.0, MarkerKind::Governor),
            (60.0, MarkerKind::Knob),
            (90.0, MarkerKind::Restart)
        ]
    );
    assert_eq!(r.markers[1].label, "GPU 0 governor cap 300 → 280 W");
    assert_eq!(r.markers[2].label, "batch_size 256 → 512");

    // The forms carry the same figures.
    let json: serde_json::Value = serde_json::to_value(&r).unwrap();
    assert_eq!(json["summary"]["exit_code"], 0);
    assert_eq!(json["throughput"]["steps"], 120);
    let md = crate::report::markdown::render(&r);
    for h in [
        "# Run report: ",
        "## Verdict",
        "## Energy",
        "## Time lost",
        "## Events",
    ] {
        assert!(md.contains(h), "{h} in {md}");
    }
    assert!(md.contains("| steps | 120 |"), "{md}");
    let html = crate::report::html::render(&r);
    assert!(
        html.matches("<svg").count() >= 5,
        "training charts and utilization"
    );
    assert!(html.contains("<polyline") || html.contains("<path"));
    assert!(!html.contains("http://") || !html.contains("src=\"http"));
    assert!(!html.contains("<script"));
    assert!(html.contains("batch_size 256 → 512"));
}

#[test]
fn a_live_run_is_a_report_so_far_and_without_history_says_so() {
    let (_tmp, dir) = synthetic(RunStatus::Running);
    let r = gather(
        &dir,
        Sources {
            now_s: Some(T0 + 200.0),
            ..Sources::default()
        },
    )
    .unwrap();
    assert!(r.live);
    assert_eq!(r.end_s, T0 + 200.0);
    assert!(r.gpu_history.is_none());
    assert!(r.missing.iter().any(|m| m.contains("no daemon answered")));
    assert!(crate::report::html::render(&r).contains("report so far"));
    assert!(crate::report::markdown::render(&r).contains("report so far"));
}

#[test]
fn a_directory_without_a_summary_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = RunDir::open(tmp.path()).unwrap();
    let e = gather(&dir, Sources::default()).unwrap_err();
    assert!(e.to_string().contains("no summary.json"), "{e}");
}

#[test]
fn thinning_keeps_the_ends_and_at_most_max() {
    let v: Vec<u32> = (0..1000).collect();
    let t = thin(v, 10);
    assert_eq!(t.len(), 10);
    assert_eq!((t[0], t[9]), (0, 999));
    assert_eq!(thin(vec![1, 2, 3], 10), [1, 2, 3]);
}

#[test]
fn chart_svg_has_data_and_no_external_reference() {
    let lines = vec![crate::report::charts::Line {
        name: "x".into(),
        points: vec![(T0, 1.0), (T0 + 60.0, 3.0), (T0 + 120.0, 2.0)],
    }];
    let svg = crate::report::charts::chart("t", "u", &lines, &[], T0, T0 + 120.0).unwrap();
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.contains("<polyline"), "{svg}");
    assert!(!svg.contains("href"));
    assert!(crate::report::charts::chart("t", "u", &[], &[], T0, T0 + 1.0).is_none());
}
