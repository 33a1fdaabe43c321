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

/// A series holding `v` in every 10 s bucket of the synthetic run's 120 s.
fn pts(v: f64) -> Vec<Point> {
    (0..12)
        .map(|i| Point {
            t: T0 + i as f64 * 10.0,
            min: v,
            mean: v,
            max: v,
        })
        .collect()
}

fn history() -> Vec<GpuSeries> {
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
    // Two ranks of equal step times: nobody waited.
    let st = r.time_lost.straggler.as_ref().unwrap();
    // Both report every tenth step: the first report stands for its own step alone.
    assert_eq!((st.ranks, st.steps, st.wait_s), (2, 1 + 11 * 10, 0.0));
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

/// The run can write its JSON-lines files: a line too long or not text is counted and passed
/// over, the lines after it are read, and reading stops at the bound on records, saying so.
#[test]
fn json_lines_are_read_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("f.jsonl");
    let mut bytes = b"1\n\"\xff\"\n".to_vec();
    bytes.extend_from_slice(format!("{}\n", "7".repeat(MAX_METRICS_LINE + 1)).as_bytes());
    bytes.extend_from_slice(b"\n2\n3\n4");
    std::fs::write(&path, &bytes).unwrap();

    let all = read_jsonl::<u64>(&path).unwrap();
    assert_eq!(all.records, [1, 2, 3, 4]);
    assert_eq!((all.unreadable, all.cut), (2, false));
    assert_eq!(
        all.missing("f.jsonl"),
        ["f.jsonl: 2 line(s) could not be read and were skipped"]
    );

    let even = read_jsonl_where::<u64>(&path, |v| v % 2 == 0).unwrap();
    assert_eq!(even.records, [2, 4]);

    let first = read_at_most::<u64>(&path, 2, |_| true).unwrap();
    assert_eq!(first.records, [1, 2]);
    assert!(first.cut);
    assert!(first.missing("f.jsonl")[1].contains("only its first"));
    // Exactly the bound is not cut.
    let kept = read_at_most::<u64>(&path, 2, |v| *v > 2).unwrap();
    assert_eq!((kept.records, kept.cut), (vec![3, 4], false));

    let none = read_jsonl::<u64>(&tmp.path().join("absent")).unwrap();
    assert!(none.records.is_empty() && !none.cut);
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

fn rank_point(n: u64, rank: Option<u32>, step: u64, step_time_s: f64) -> MetricsPoint {
    MetricsPoint {
        n,
        t: T0 + n as f64,
        from: "trainer".into(),
        rank,
        report: MetricsReport {
            step: Some(step),
            step_time_s: Some(step_time_s),
            ..MetricsReport::default()
        },
    }
}

/// Four ranks over ten steps: rank 2 takes 0.2 s where the others take 0.1 s at steps 0..6,
/// rank 3 does at steps 6..10; the median is 0.1 s at every step.
fn four_ranks() -> Vec<MetricsPoint> {
    let mut out = Vec::new();
    for step in 0..10u64 {
        for rank in 0..4u32 {
            let slow = (rank == 2 && step < 6) || (rank == 3 && step >= 6);
            let t = if slow { 0.2 } else { 0.1 };
            out.push(rank_point(step * 4 + u64::from(rank), Some(rank), step, t));
        }
    }
    out
}

#[test]
fn the_straggler_share_is_the_wait_for_the_slowest_rank_over_the_jobs_step_time() {
    let s = straggler(&four_ranks()).unwrap();
    assert_eq!((s.steps, s.ranks), (10, 4));
    // Each step: the job takes 0.2 s, of which 0.1 s waiting beyond the median rank.
    assert!((s.wait_s - 1.0).abs() < 1e-9, "{s:?}");
    assert!((s.share - 0.5).abs() < 1e-9, "{s:?}");
    assert_eq!((s.slowest_rank, s.slowest_steps), (2, 6));

    // A step only one rank reported is not compared; nor is a report without a step time.
    let mut partial = four_ranks();
    partial.push(rank_point(100, Some(0), 50, 9.0));
    let mut no_time = rank_point(101, Some(1), 3, 0.0);
    no_time.report.step_time_s = None;
    partial.push(no_time);
    assert_eq!(straggler(&partial).unwrap(), s);

    // A rank's step reported again (after a restart) counts once, with its last time.
    let mut again = four_ranks();
    again.push(rank_point(102, Some(2), 0, 0.1));
    let a = straggler(&again).unwrap();
    assert!((a.wait_s - 0.9).abs() < 1e-9, "{a:?}");
    assert_eq!((a.slowest_rank, a.slowest_steps), (2, 5));
}

/// Ranks that never report the same step, as ranks on their own clocks do: each report stands
/// for the steps since the rank's last, so all four are compared over nearly every step.
#[test]
fn ranks_that_report_at_different_steps_are_compared_over_the_steps_they_cover() {
    let mut points = Vec::new();
    let mut n = 0;
    for round in 0..25u64 {
        for rank in 0..4u32 {
            let t = if rank == 2 { 0.2 } else { 0.1 };
            // Rank r reports steps r+3, r+7, ...: never the same step as another rank.
            points.push(rank_point(
                n,
                Some(rank),
                round * 4 + u64::from(rank) + 3,
                t,
            ));
            n += 1;
        }
    }
    let s = straggler(&points).unwrap();
    assert_eq!(s.ranks, 4);
    assert_eq!(s.slowest_rank, 2, "{s:?}");
    // Of steps 3..=102, the first and the last are one rank's alone.
    assert_eq!(s.steps, 98, "{s:?}");
    // Step 4 is covered by ranks 0 and 1 only (rank 2's first report is step 5).
    assert_eq!(s.slowest_steps, 97, "{s:?}");
    // Where all four ranks compare, the median is 0.1 s and half the job's time is the wait;
    // steps 4, 5 and 101 wait less.
    assert!((s.wait_s - 9.65).abs() < 1e-9, "{s:?}");
    assert!((s.share - 9.65 / 19.5).abs() < 1e-9, "{s:?}");

    // Where only the two quick ranks cover a range, the slower of them is not the straggler
    // of the run: rank 2's slowness over the rest of the steps outweighs it.
    let mut quick_first = points.clone();
    quick_first.push(rank_point(n, Some(1), 0, 0.11));
    quick_first.push(rank_point(n + 1, Some(0), 0, 0.1));
    assert_eq!(straggler(&quick_first).unwrap().slowest_rank, 2);
}

#[test]
fn a_run_of_one_rank_has_no_straggler_share() {
    let one: Vec<MetricsPoint> = (0..10)
        .map(|i| rank_point(i, Some(0), i, 0.1 + i as f64 * 0.01))
        .collect();
    assert_eq!(straggler(&one), None);
    let unranked: Vec<MetricsPoint> = (0..10).map(|i| rank_point(i, None, i, 0.1)).collect();
    assert_eq!(straggler(&unranked), None);
    assert_eq!(straggler(&[]), None);
}

#[test]
fn a_multi_rank_run_shows_its_straggler_share_in_every_form() {
    let (_tmp, dir) = synthetic(RunStatus::Succeeded);
    let mut text = String::new();
    for p in four_ranks() {
        text.push_str(&serde_json::to_string(&p).unwrap());
        text.push('\n');
    }
    std::fs::write(dir.path().join("metrics.jsonl"), text).unwrap();
    let r = gather(
        &dir,
        Sources {
            now_s: Some(T0 + 500.0),
            ..Sources::default()
        },
    )
    .unwrap();
    let s = r.time_lost.straggler.as_ref().unwrap();
    assert!((s.share - 0.5).abs() < 1e-9);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["time_lost"]["straggler"]["slowest_rank"], 2);
    let md = crate::report::markdown::render(&r);
    assert!(
        md.contains("- Waiting for the slowest rank: 50.0% of the job's step time"),
        "{md}"
    );
    assert!(md.contains("rank 2 was the slowest at 6 of them"), "{md}");
    let html = crate::report::html::render(&r);
    assert!(html.contains("<li class=\"straggler\">Waiting for the slowest rank: 50.0%"));
}

fn snapshot() -> crate::telemetry::Snapshot {
    use crate::telemetry::{GpuSample, NodeInfo, Snapshot};
    let gpu = |index: u32, name: &str| GpuSample {
        index,
        name: Some(name.into()),
        ..GpuSample::default()
    };
    Snapshot {
        time_s: T0,
        node: NodeInfo {
            hostname: "node-7".into(),
            source: "nvml".into(),
            driver_version: Some("550.54.15".into()),
            cuda_driver_version: Some("12.4".into()),
            nvml_version: None,
            topology: None,
        },
        gpus: vec![
            gpu(0, "NVIDIA H100 80GB HBM3"),
            gpu(1, "NVIDIA H100 80GB HBM3"),
            gpu(2, "NVIDIA A100-SXM4-40GB"),
        ],
        host: None,
    }
}

#[test]
fn the_environment_is_read_back_and_shown_in_every_form() {
    use crate::report::environment::{self, Environment};
    let (_tmp, dir) = synthetic(RunStatus::Succeeded);
    let now = UNIX_EPOCH + Duration::from_secs(T0 as u64);
    let env = Environment::from_snapshot(Some(&snapshot()), Some(&[0, 1]), now);
    assert_eq!(env.gpus.len(), 2, "only the run's GPUs");
    assert_eq!(
        env.models_text().as_deref(),
        Some("2 × NVIDIA H100 80GB HBM3")
    );
    assert_eq!(
        env.gpupilot_version.as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    environment::write(dir.path(), &env).unwrap();
    assert_eq!(environment::read(dir.path()).unwrap(), Some(env.clone()));

    let r = gather(
        &dir,
        Sources {
            now_s: Some(T0 + 500.0),
            ..Sources::default()
        },
    )
    .unwrap();
    assert_eq!(r.environment.as_ref(), Some(&env));
    assert!(!r.missing.iter().any(|m| m.contains("environment")));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["environment"]["driver_version"], "550.54.15");
    assert_eq!(json["environment"]["hostname"], "node-7");
    let md = crate::report::markdown::render(&r);
    for row in [
        "## Environment",
        "| host | node-7 |",
        "| driver | 550.54.15 |",
        "| CUDA (driver) | 12.4 |",
        "| GPU models | 2 × NVIDIA H100 80GB HBM3 |",
        "| frameworks | not reported",
        "| ranks | one process |",
    ] {
        assert!(md.contains(row), "{row} in {md}");
    }
    let html = crate::report::html::render(&r);
    assert!(html.contains("<h2>Environment</h2>"));
    assert!(
        html.contains("<tr><th>driver</th><td>550.54.15</td></tr>"),
        "{html}"
    );
}

#[test]
fn an_environment_not_known_is_shown_absent_never_guessed() {
    use crate::report::environment::{self, Environment};
    // No telemetry when the run started: only the version is known.
    let env = Environment::from_snapshot(None, None, UNIX_EPOCH);
    assert_eq!(env.driver_version, None);
    assert_eq!(env.hostname, None);
    assert!(env.gpus.is_empty() && env.models_text().is_none());

    let (_tmp, dir) = synthetic(RunStatus::Succeeded);
    let src = || Sources {
        now_s: Some(T0 + 500.0),
        ..Sources::default()
    };
    let r = gather(&dir, src()).unwrap();
    assert_eq!(r.environment, None);
    assert!(
        r.missing
            .iter()
            .any(|m| m.contains("environment: not recorded")),
        "{:?}",
        r.missing
    );
    let md = crate::report::markdown::render(&r);
    assert!(md.contains("| driver | not recorded |"), "{md}");

    // A file too large, or not JSON, is said and skipped.
    let path = environment::path(dir.path());
    std::fs::write(&path, vec![b' '; environment::MAX_BYTES as usize + 1]).unwrap();
    let r = gather(&dir, src()).unwrap();
    assert!(r.environment.is_none());
    assert!(
        r.missing.iter().any(|m| m.contains("larger than")),
        "{:?}",
        r.missing
    );
    // A link planted in its place is not followed.
    std::fs::remove_file(&path).unwrap();
    let elsewhere = dir.path().join("elsewhere.json");
    std::fs::write(&elsewhere, b"{\"recorded_at\":\"x\"}").unwrap();
    std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
    assert!(environment::read(dir.path()).is_err());
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"{\"recorded_at\":").unwrap();
    let r = gather(&dir, src()).unwrap();
    assert!(r.environment.is_none());
    assert!(
        r.missing
            .iter()
            .any(|m| m.starts_with("environment: environment.json"))
    );
}

#[test]
fn what_trainers_said_is_kept_bounded_and_shown_in_every_form() {
    use crate::report::environment::{self, Environment, MAX_SOFTWARE};
    use crate::training::RankSpec;
    use std::collections::BTreeMap;
    let (_tmp, dir) = synthetic(RunStatus::Succeeded);
    let now = UNIX_EPOCH + Duration::from_secs(T0 as u64);
    environment::write(
        dir.path(),
        &Environment::from_snapshot(Some(&snapshot()), Some(&[0, 1]), now),
    )
    .unwrap();
    let said = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let torch = said(&[
        ("python", "3.11.2"),
        ("torch", "2.4.0"),
        ("torch_cuda", "12.1"),
        ("nccl", "2.20.5"),
        // Not a name, not a version: left out.
        ("bad name", "1.0"),
        ("numpy", "1\n2"),
    ]);
    let rank = |r: u32, gpu: u32| RankSpec {
        rank: r,
        world_size: 2,
        host: Some(format!("node-{r}")),
        gpu: Some(gpu),
        ..RankSpec::default()
    };
    environment::record_trainer(dir.path(), Some(&rank(1, 1)), &torch, now).unwrap();
    // Rank 0 runs another PyTorch; it attaches twice (a restart): one entry.
    let other = said(&[("python", "3.11.2"), ("torch", "2.3.1")]);
    environment::record_trainer(dir.path(), Some(&rank(0, 0)), &other, now).unwrap();
    environment::record_trainer(dir.path(), Some(&rank(0, 0)), &other, now).unwrap();
    let env = environment::read(dir.path()).unwrap().unwrap();
    assert_eq!(
        env.gpus.len(),
        2,
        "what the daemon recorded at the start stays"
    );
    assert_eq!(env.software.len(), 4, "{:?}", env.software);
    let ranks: Vec<(u32, Option<u32>, usize)> = env
        .ranks
        .iter()
        .map(|r| (r.rank, r.gpu, r.software.len()))
        .collect();
    assert_eq!(ranks, [(0, Some(0), 2), (1, Some(1), 0)]);

    let r = gather(
        &dir,
        Sources {
            now_s: Some(T0 + 500.0),
            ..Sources::default()
        },
    )
    .unwrap();
    let md = crate::report::markdown::render(&r);
    for row in [
        "| frameworks | Python 3.11.2, PyTorch 2.4.0 (CUDA 12.1, NCCL 2.20.5) |",
        "| ranks | 2 attached on node-0, node-1; rank 0 differs: Python 3.11.2, PyTorch 2.3.1 |",
    ] {
        assert!(md.contains(row), "{row} in {md}");
    }
    let html = crate::report::html::render(&r);
    assert!(
        html.contains("PyTorch 2.4.0 (CUDA 12.1, NCCL 2.20.5)"),
        "{html}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["environment"]["software"]["torch"], "2.4.0");

    // At most MAX_SOFTWARE names are kept from one trainer.
    let many: BTreeMap<String, String> = (0..40)
        .map(|i| (format!("pkg{i:02}"), "1.0".to_string()))
        .collect();
    let (_tmp2, fresh) = synthetic(RunStatus::Succeeded);
    environment::record_trainer(fresh.path(), None, &many, now).unwrap();
    let env = environment::read(fresh.path()).unwrap().unwrap();
    assert_eq!(env.software.len(), MAX_SOFTWARE);
    assert!(env.ranks.is_empty(), "a single process has no ranks");
}

#[test]
fn the_advice_over_the_whole_run_is_in_every_form() {
    use crate::report::environment::{self, Environment};
    let (_tmp, dir) = synthetic(RunStatus::Succeeded);
    let now = UNIX_EPOCH + Duration::from_secs(T0 as u64);
    let mut env = Environment::from_snapshot(Some(&snapshot()), Some(&[0, 1]), now);
    for g in &mut env.gpus {
        g.temp_slowdown_c = Some(87.0);
    }
    environment::write(dir.path(), &env).unwrap();
    let hot = vec![GpuSeries {
        gpu: 0,
        series: vec![
            (Metric::UtilGpu, pts(95.0)),
            (Metric::Temperature, pts(86.0)),
            (Metric::SmClock, pts(1400.0)),
            (Metric::ThermalLimited, pts(0.9)),
        ],
    }];
    let r = gather(
        &dir,
        Sources {
            history: Some(Ok(hot)),
            now_s: Some(T0 + 500.0),
            ..Sources::default()
        },
    )
    .unwrap();
    let kinds: Vec<_> = r.advice.iter().map(|h| h.kind).collect();
    assert!(
        kinds.contains(&crate::advisor::HintKind::ThermalThrottle),
        "{:#?}",
        r.advice
    );
    let md = crate::report::markdown::render(&r);
    assert!(md.contains("## Advice"), "{md}");
    assert!(md.contains("**thermal throttling (GPU 0)**"), "{md}");
    assert!(
        md.contains("action: `gpupilot thermal target 82 --gpu 0,1`"),
        "{md}"
    );
    let html = crate::report::html::render(&r);
    assert!(
        html.contains("<h2>Advice</h2><ul class=\"advice\">"),
        "{html}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["advice"][0]["kind"], "thermal_throttle", "{json}");

    // Without GPU history the report still has the section, and says nothing calls for a
    // change only when nothing does.
    let r = gather(
        &dir,
        Sources {
            now_s: Some(T0 + 500.0),
            ..Sources::default()
        },
    )
    .unwrap();
    assert!(r.advice.iter().all(|h| h.gpu.is_none()), "{:#?}", r.advice);
}
