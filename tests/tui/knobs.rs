//! The Run view's training band (charts of loss, samples/s, step time and data wait, with marks
//! where knobs and power caps changed, and the knob panel), the rank table of a run of several
//! ranks, and the knob dialog, on ratatui's TestBackend from hand-built fixtures (see
//! `support::tui`).

use crate::support::tui::{T0, app_with_runs, events, press, render, text};
use crossterm::event::KeyCode;
use gpupilot::protocol::{
    JobFigures, KnobName, KnobRange, KnobState, KnobVia, MetricsPoint, MetricsReport, NodeEvent,
    NodeEventRecord, RankInfo, RankSpec, StagedChange, TrainerInfo,
};
use gpupilot::time::rfc3339;
use gpupilot::tui::feed::{Request, Update};
use gpupilot::tui::{App, ViewId};
use insta::assert_snapshot;
use std::time::{Duration, UNIX_EPOCH};

pub(crate) const RUN: &str = "20231114-220820-train";
/// Reports: one every 0.4 s over the fixture's two minutes.
const REPORTS: u64 = 300;

fn t_of(n: u64) -> f64 {
    T0 + n as f64 * 0.4
}

fn at(t: f64) -> String {
    rfc3339(UNIX_EPOCH + Duration::from_secs_f64(t))
}

/// A run whose batch size went 256 → 512 at report 150 (throughput up, step time up) and
/// whose prefetch went 2 → 4 at report 220 (data wait down); the power cap of GPU 1 went
/// down at report 100.
fn points() -> Vec<MetricsPoint> {
    (0..REPORTS)
        .map(|n| {
            let x = n as f64;
            let big = n >= 150;
            let deep = n >= 220;
            let batch = if big { 512.0 } else { 256.0 };
            let wait = if deep { 0.004 } else { 0.021 } + 0.002 * (x / 7.0).sin();
            let step = if big { 0.142 } else { 0.079 } + wait;
            MetricsPoint {
                n,
                t: t_of(n),
                from: "trainer".into(),
                report: MetricsReport {
                    step: Some(1000 + n),
                    loss: Some(0.4 + 2.1 * (-x / 90.0).exp() + 0.03 * (x / 3.0).sin()),
                    samples_per_s: Some(batch / step),
                    step_time_s: Some(step),
                    data_wait_s: Some(wait),
                    batch_size: Some(batch as i64),
                    prefetch: Some(if deep { 4 } else { 2 }),
                    ..MetricsReport::default()
                },
                rank: None,
            }
        })
        .collect()
}

fn trainer() -> TrainerInfo {
    TrainerInfo {
        attached: true,
        pid: Some(5120),
        last: None,
        knobs: vec![
            KnobState {
                knob: KnobName::BatchSize,
                value: Some(512),
                pending: None,
                range: Some(KnobRange {
                    min: 1,
                    max: Some(1024),
                }),
                last_rtt_ms: Some(7.46),
                last_outcome: Some("applied".into()),
            },
            KnobState {
                knob: KnobName::Prefetch,
                value: Some(4),
                pending: Some(8),
                range: Some(KnobRange {
                    min: 1,
                    max: Some(8),
                }),
                last_rtt_ms: Some(3.1),
                last_outcome: Some("pending".into()),
            },
        ],
        ..TrainerInfo::default()
    }
}

/// The fixture's events, and the knob and power changes of the run above.
fn events_with_changes() -> Vec<NodeEventRecord> {
    let mut all = events();
    let by = "alice (uid 1000) via gpupilot (pid 4242)".to_string();
    let changes = [
        (
            t_of(100),
            NodeEvent::GpuChanged {
                gpu: 1,
                what: "power_limit".into(),
                old: Some("700 W".into()),
                new: Some("450 W".into()),
                by: by.clone(),
                why: None,
            },
        ),
        (
            t_of(150),
            NodeEvent::KnobChanged {
                run: RUN.into(),
                change: 1,
                knob: KnobName::BatchSize,
                old: Some(256),
                new: 512,
                via: KnobVia::Trainer,
                by: by.clone(),
                why: Some("gpupilot console".into()),
            },
        ),
        (
            t_of(150),
            NodeEvent::KnobApplied {
                run: RUN.into(),
                change: 1,
                knob: KnobName::BatchSize,
                value: 512,
                rtt_ms: 7.46,
                ranks: None,
                step: None,
            },
        ),
        (
            t_of(220),
            NodeEvent::KnobApplied {
                run: RUN.into(),
                change: 2,
                knob: KnobName::Prefetch,
                value: 4,
                rtt_ms: 3.1,
                ranks: None,
                step: None,
            },
        ),
    ];
    let seq = all.len() as u64;
    all.extend(
        changes
            .into_iter()
            .enumerate()
            .map(|(i, (t, event))| NodeEventRecord {
                seq: seq + 1 + i as u64,
                time: at(t),
                event,
            }),
    );
    all
}

/// The Run view of the fixture's training run with its metrics, knobs and changes.
pub(crate) fn app() -> App {
    let mut a = app_with_runs();
    a.view = ViewId::Run;
    a.on_update(Update::Events {
        events: events_with_changes(),
        reset: true,
    });
    a.on_update(Update::Metrics {
        run: RUN.into(),
        points: points(),
        reset: true,
        trainer: Box::new(trainer()),
    });
    a.take_requests();
    a
}

#[test]
fn the_run_view_charts_the_run_and_shows_its_knobs() {
    for (w, h) in [(80, 24), (200, 50)] {
        let mut a = app();
        let term = render(&mut a, w, h);
        assert_snapshot!(format!("run_metrics_{w}x{h}"), term.backend());
        let screen = text(&term);
        for s in ["loss", "samples/s", "step time", "data wait"] {
            assert!(screen.contains(s), "{s} at {w}×{h}:\n{screen}");
        }
        assert!(screen.contains("Knobs"), "{screen}");
        assert!(screen.contains("trainer pid 5120"), "{screen}");
        assert!(screen.contains("batch_size 512"), "{screen}");
        assert!(screen.contains("prefetch   4 → 8"), "pending: {screen}");
        assert!(screen.contains("1–1024"), "the range: {screen}");
        assert!(screen.contains("applied in 7.5 ms"), "{screen}");
        assert!(screen.contains("waiting for the trainer"), "{screen}");
        // The newest values in the titles.
        assert!(screen.contains("2.1 ms"), "{screen}");
        // The log is still there.
        assert!(
            screen.contains("checkpoint saved"),
            "the log at {w}×{h}:\n{screen}"
        );
        assert!(
            screen.contains("┊ knob"),
            "the marks' legend at {w}×{h}:\n{screen}"
        );
    }
    // At 200×50 there is room for braille charts.
    let big = text(&render(&mut app(), 200, 50));
    assert!(
        big.chars().any(|c| ('\u{2801}'..='\u{28ff}').contains(&c)),
        "braille charts:\n{big}"
    );
    assert!(big.contains("┊ power"), "{big}");
}

#[test]
fn without_metrics_or_knobs_the_run_view_is_unchanged() {
    let mut plain = app_with_runs();
    plain.view = ViewId::Run;
    let before = text(&render(&mut plain, 80, 24));
    // A trainer with nothing to show adds nothing.
    plain.on_update(Update::Metrics {
        run: RUN.into(),
        points: vec![],
        reset: true,
        trainer: Box::default(),
    });
    assert_eq!(text(&render(&mut plain, 80, 24)), before);
    // Another run's metrics do not show on this one.
    plain.on_update(Update::Metrics {
        run: "20231114-215000-eval".into(),
        points: points(),
        reset: true,
        trainer: Box::new(trainer()),
    });
    assert_eq!(text(&render(&mut plain, 80, 24)), before);
}

#[test]
fn small_terminals_keep_the_log_and_never_panic() {
    for (w, h) in [
        (30, 10),
        (40, 12),
        (60, 16),
        (80, 20),
        (100, 30),
        (120, 40),
        (150, 35),
    ] {
        let mut a = app();
        let screen = text(&render(&mut a, w, h));
        if w >= 40 && h >= 12 {
            assert!(
                screen.contains("stdout"),
                "the log's panel at {w}×{h}:\n{screen}"
            );
        }
        // And with the dialog open.
        press(&mut a, KeyCode::Char('b'));
        render(&mut a, w, h);
    }
}

#[test]
fn the_knob_dialog_checks_the_range_before_sending() {
    let mut a = app();
    press(&mut a, KeyCode::Char('b'));
    assert_snapshot!("knob_dialog_80x24", render(&mut a, 80, 24).backend());
    for c in "2048".chars() {
        press(&mut a, KeyCode::Char(c));
    }
    press(&mut a, KeyCode::Enter);
    let term = render(&mut a, 80, 24);
    assert_snapshot!("knob_dialog_out_of_range_80x24", term.backend());
    let screen = text(&term);
    assert!(
        screen.contains("2048 is outside the allowed range 1–1024"),
        "{screen}"
    );
    assert!(a.take_requests().is_empty(), "nothing sent");

    for _ in 0..4 {
        press(&mut a, KeyCode::Backspace);
    }
    for c in "768".chars() {
        press(&mut a, KeyCode::Char(c));
    }
    press(&mut a, KeyCode::Enter);
    assert_eq!(
        a.take_requests(),
        [Request::SetKnob {
            run: RUN.into(),
            knob: KnobName::BatchSize,
            value: 768,
            restart: false,
        }]
    );
    let screen = text(&render(&mut a, 80, 24));
    assert!(
        screen.contains("asking the daemon: batch_size = 768"),
        "{screen}"
    );

    // The daemon says a restart is needed: the console asks.
    a.on_update(Update::KnobNeedsRestart {
        run: RUN.into(),
        knob: KnobName::BatchSize,
        value: 768,
        text: format!(
            "no trainer is attached to run {RUN}, and its command takes {{batch_size}}: the \
             change needs a restart with the new value (ask again allowing it: `gpupilot set \
             {RUN} batch-size 768 --restart`); nothing changed"
        ),
    });
    let term = render(&mut a, 80, 24);
    assert_snapshot!("knob_dialog_restart_80x24", term.backend());
    assert!(text(&term).contains("Restart run 20231114-220820-train with batch_size = 768? y/n"));
    press(&mut a, KeyCode::Char('y'));
    assert_eq!(
        a.take_requests(),
        [Request::SetKnob {
            run: RUN.into(),
            knob: KnobName::BatchSize,
            value: 768,
            restart: true,
        }]
    );
}

/// The fixture's run as a job of four ranks: ranks 0–2 on this node's GPUs 0–2, rank 3 on
/// another node (no telemetry here). Rank 2 trains on the V100 that sits at its slowdown
/// temperature and is the slowest; a batch size change to 1024 is in flight, agreed by three.
pub(crate) fn ranked_trainer() -> TrainerInfo {
    let rank = |n: u32, host: &str, gpu: u32, step_time: f64, wait: f64| RankInfo {
        spec: RankSpec {
            rank: n,
            world_size: 4,
            local_rank: Some(if n == 3 { 0 } else { n }),
            host: Some(host.into()),
            gpu: Some(gpu),
            gpu_uuid: None,
        },
        attached: true,
        pid: Some(5120 + n),
        last: Some(MetricsPoint {
            n: REPORTS - 4 + n as u64,
            t: t_of(REPORTS - 1),
            from: "trainer".into(),
            rank: Some(n),
            report: MetricsReport {
                step: Some(1296 + u64::from(n != 2)),
                samples_per_s: Some(512.0 / step_time),
                step_time_s: Some(step_time),
                data_wait_s: Some(wait),
                batch_size: Some(512),
                ..MetricsReport::default()
            },
        }),
        steps_per_s: Some(1.0 / step_time),
    };
    let mut t = trainer();
    t.pid = Some(5120);
    t.world_size = Some(4);
    t.ranks = vec![
        rank(0, "gpu-node-07", 0, 0.144, 0.0021),
        rank(1, "gpu-node-07", 1, 0.151, 0.0024),
        rank(2, "gpu-node-07", 2, 0.187, 0.0019),
        rank(3, "gpu-node-08", 0, 0.146, 0.0022),
    ];
    t.job = Some(JobFigures {
        reporting: 4,
        step: Some(1296),
        samples_per_s: Some(13_442.0),
        step_time_s: Some(0.187),
        slowest_rank: Some(2),
        data_wait_s: Some(0.0024),
        loss: Some(0.453),
        tokens_per_s: None,
    });
    t.knobs[0].pending = Some(1024);
    t.staged = Some(StagedChange {
        seq: 3,
        knob: KnobName::BatchSize,
        value: 1024,
        apply_step: 1310,
        ranks: vec![0, 1, 2, 3],
        ready: vec![0, 1, 3],
        committed: None,
        applied: vec![],
    });
    t
}

/// The Run view of the four-rank job: rank 0's reports (as `points`) and, interleaved, the
/// other ranks' with another loss, which the charts leave out.
pub(crate) fn ranked_app() -> App {
    let mut a = app();
    let mut all = Vec::new();
    for p in points() {
        let n = p.n;
        for r in 0..4u32 {
            let mut q = p.clone();
            q.n = n * 4 + u64::from(r);
            q.rank = Some(r);
            if r > 0 {
                q.report.loss = Some(9.0);
            }
            all.push(q);
        }
    }
    a.on_update(Update::Metrics {
        run: RUN.into(),
        points: all,
        reset: true,
        trainer: Box::new(ranked_trainer()),
    });
    a.take_requests();
    a
}

#[test]
fn a_run_of_several_ranks_shows_its_rank_table() {
    for (w, h) in [(80, 24), (200, 50)] {
        let mut a = ranked_app();
        let term = render(&mut a, w, h);
        assert_snapshot!(format!("run_ranks_{w}x{h}"), term.backend());
        let screen = text(&term);
        let row = |rank: &str| {
            screen
                .lines()
                .find(|l| l.starts_with(&format!("│{rank} ")))
                .unwrap_or_else(|| panic!("no row for rank {rank} at {w}×{h}:\n{screen}"))
                .to_string()
        };
        assert!(screen.contains(" 4 ranks "), "{screen}");
        assert!(
            screen.contains("(3/4 ranks agreed)")
                && screen.contains("batch_size → 1024 at step 1310"),
            "the change in flight at {w}×{h}:\n{screen}"
        );
        // The slowest rank is marked, with its GPU's state.
        let slow = row("▸  2");
        assert!(slow.contains("187 ms") && slow.contains("1296"), "{slow}");
        assert!(
            slow.contains("82 °C")
                || slow.contains("83 °C")
                || slow.contains("84 °C")
                || slow.contains("85 °C"),
            "{slow}"
        );
        assert!(slow.contains("hw-therm") || w < 100, "{slow}");
        // GPU 1 is held at its power cap.
        let one = row("   1");
        assert!(one.contains("/450 W") && one.contains("/1980"), "{one}");
        assert!(one.contains("pwr-cap"), "{one}");
        // The job's figures: samples/s summed, the slowest step time, rank 0's loss.
        assert!(
            screen.contains("13.4k samples/s") && screen.contains("loss 0.453"),
            "{screen}"
        );
        // The charts are rank 0's: its loss, not the other ranks' 9.0.
        assert!(!screen.contains(" 9.000 "), "{screen}");
        assert!(screen.contains("stdout"), "the log stays at {w}×{h}");
    }
    let big = text(&render(&mut ranked_app(), 200, 50));
    // Where there is room: the host, a rank on another node without telemetry, the straggler's
    // cause, the band and the knob panel with the votes.
    let remote = big
        .lines()
        .find(|l| l.starts_with("│   3 "))
        .unwrap_or_else(|| panic!("{big}"));
    assert!(
        remote.contains("gpu-node-08") && remote.contains("N/A"),
        "{remote}"
    );
    assert!(big.contains("(slowest: rank 2, thermal slowdown)"), "{big}");
    assert!(big.contains("3/4 ranks agreed, for step 1310"), "{big}");
    assert!(big.contains("4 ranks attached"), "{big}");
    // At 80×24 with three runs listed, the slowest rank is kept and the rest counted.
    let small = text(&render(&mut ranked_app(), 80, 24));
    assert!(small.contains("+1 more rank"), "{small}");
}

#[test]
fn the_slowest_rank_is_highlighted() {
    let mut a = ranked_app();
    let term = render(&mut a, 200, 50);
    let buf = term.backend().buffer();
    let row_of = |mark: &str| {
        (0..buf.area.height)
            .find(|&y| buf[(1, y)].symbol() == mark && buf[(4, y)].symbol() != " ")
            .unwrap_or_else(|| panic!("no row marked {mark:?}"))
    };
    let slow = row_of("▸");
    let warn = a.theme.warn.fg.expect("the theme's warn colour");
    // The rank and step cells (plain text) take the row's highlight.
    assert_eq!(buf[(4, slow)].fg, warn);
    let step_x = (1..buf.area.width)
        .find(|&x| buf[(x, slow)].symbol() == "1" && buf[(x + 3, slow)].symbol() == "6")
        .expect("rank 2's step 1296");
    assert_eq!(buf[(step_x, slow)].fg, warn);
    // Another rank's row is not highlighted.
    let other = slow - 1;
    assert_ne!(buf[(4, other)].fg, warn, "rank 1 is not the slowest");
}

#[test]
fn the_daemons_straggler_alert_shows_under_the_rank_table() {
    use gpupilot::control::alerts::{Alert, AlertKind};
    use gpupilot::control::status::ControlStatus;
    let mut a = ranked_app();
    let mut t = ranked_trainer();
    t.staged = None;
    a.on_update(Update::Metrics {
        run: RUN.into(),
        points: vec![],
        reset: false,
        trainer: Box::new(t),
    });
    let message = "rank 2 is 27 % slower than the others: its GPU 2 is held down by thermal \
                   slowdown (`gpupilot thermal target 76 --gpu 2`)";
    let alert = |run: &str| Alert {
        key: format!("straggler:{run}"),
        kind: AlertKind::Straggler,
        gpu: Some(2),
        run: Some(run.into()),
        value: Some(1.27),
        threshold: Some(1.1),
        message: message.into(),
        since_s: T0,
    };
    a.on_update(Update::Control(Box::new(ControlStatus {
        alerts: vec![alert("20231114-215000-eval")],
        ..ControlStatus::default()
    })));
    let screen = text(&render(&mut a, 200, 50));
    // (The footer shows every alert; the table only its own run's.)
    assert!(
        !screen.contains("└ rank 2 is 27 % slower"),
        "another run's alert: {screen}"
    );
    a.on_update(Update::Control(Box::new(ControlStatus {
        alerts: vec![alert(RUN)],
        ..ControlStatus::default()
    })));
    let screen = text(&render(&mut a, 200, 50));
    assert!(screen.contains(&format!("└ {message} ─")), "{screen}");
    // At 80 columns it is cut, beside the count of the ranks left out.
    let small = text(&render(&mut a, 80, 24));
    let border = small
        .lines()
        .find(|l| l.starts_with("└ rank 2 is 27 % slower"))
        .unwrap_or_else(|| panic!("{small}"));
    assert!(
        border.contains('…') && border.contains("+1 more rank"),
        "{border}"
    );
}

#[test]
fn a_rank_table_fits_small_terminals_and_never_panics() {
    for (w, h) in [(30, 10), (40, 12), (60, 16), (80, 20), (100, 30), (120, 40)] {
        let mut a = ranked_app();
        let screen = text(&render(&mut a, w, h));
        if w >= 40 && h >= 12 {
            assert!(screen.contains("stdout"), "the log at {w}×{h}:\n{screen}");
        }
    }
}
