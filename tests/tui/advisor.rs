//! The console's advisor pane (hints with their evidence, the action one key away) and the
//! energy tuner's progress in the Run view, on ratatui's TestBackend from hand-built fixtures
//! (see `support::tui`).

use crate::support::tui::{T0, app_with_runs, press, render, text};
use crossterm::event::KeyCode;
use gpupilot::advisor::{Evidence, Hint, HintKind, Knob, Suggestion};
use gpupilot::control::tuner::{CapPoint, Phase, Progress, TuneResult, Unit, Window};
use gpupilot::protocol::{KnobName, KnobRange, KnobState, TrainerInfo};
use gpupilot::tui::feed::daemon::Advice;
use gpupilot::tui::feed::daemon::{TunerEnd, TunerEvent};
use gpupilot::tui::feed::{Request, Update};
use gpupilot::tui::views::power_dialog::PowerDialog;
use gpupilot::tui::views::run::knob_dialog::KnobDialog;
use gpupilot::tui::{Action, App, ViewId};
use insta::assert_snapshot;

const RUN: &str = "20231114-220820-train";

fn ev(name: &str, value: f64, unit: &str) -> Evidence {
    Evidence {
        name: name.into(),
        value,
        unit: unit.into(),
    }
}

/// Hints as the advisor makes them: a data stall and memory headroom on the training run,
/// power-cap throttling on GPU 1, thermal throttling on GPU 2.
fn hints() -> Vec<Hint> {
    vec![
        Hint {
            kind: HintKind::DataStall,
            gpu: None,
            run: Some(RUN.into()),
            summary: "data stalls: 31% of each step waits for data, GPU 62% busy; raise \
                      prefetch 2 → 4"
                .into(),
            evidence: vec![
                ev("data wait share of step", 31.2, "%"),
                ev("data wait per step", 0.0312, "s"),
                ev("step time", 0.1, "s"),
                ev("GPU utilization (mean)", 62.4, "%"),
                ev("GPU utilization (lowest)", 18.0, "%"),
                ev("prefetch depth", 2.0, ""),
            ],
            action: Some(Suggestion::SetKnob {
                run: RUN.into(),
                knob: Knob::Prefetch,
                value: 4.0,
            }),
        },
        Hint {
            kind: HintKind::MemoryHeadroom,
            gpu: None,
            run: Some(RUN.into()),
            summary: "memory headroom: 21.3 of 80.0 GiB used at batch 256; batch 512 is \
                      predicted to use 42.6 GiB (53%)"
                .into(),
            evidence: vec![
                ev("memory used (peak)", 21.3, "GiB"),
                ev("memory total", 80.0, "GiB"),
                ev("batch size", 256.0, ""),
                ev("predicted at batch 512", 42.6, "GiB"),
            ],
            action: Some(Suggestion::SetKnob {
                run: RUN.into(),
                knob: Knob::BatchSize,
                value: 512.0,
            }),
        },
        Hint {
            kind: HintKind::PowerCapThrottle,
            gpu: Some(1),
            run: None,
            summary: "GPU 1: power cap 450 W (default 700 W) holds the clock at 1410 of 1980 \
                      MHz 92% of the time; raise it to the default"
                .into(),
            evidence: vec![
                ev("power cap", 450.0, "W"),
                ev("default cap", 700.0, "W"),
                ev("power-cap throttled share", 92.0, "%"),
                ev("SM clock (mean)", 1410.0, "MHz"),
            ],
            action: Some(Suggestion::PowerCap {
                gpus: vec![1],
                watts: 700.0,
            }),
        },
        Hint {
            kind: HintKind::ThermalThrottle,
            gpu: Some(2),
            run: None,
            summary: "GPU 2: thermal throttling (40% of the time, up to 87 C against a 87 C \
                      slowdown); hold it at 83 C with the thermal governor, or improve cooling"
                .into(),
            evidence: vec![
                ev("thermal throttled share", 40.0, "%"),
                ev("temperature (peak)", 87.0, "C"),
                ev("slowdown temperature", 87.0, "C"),
            ],
            action: Some(Suggestion::ThermalTarget {
                gpus: vec![2],
                celsius: 83.0,
            }),
        },
    ]
}

fn advice(hints: Vec<Hint>, why_none: &str) -> Update {
    Update::Advice(Box::new(Advice {
        at: T0 + 119.0,
        window_s: 300.0,
        hints,
        why_none: why_none.into(),
    }))
}

fn trainer() -> TrainerInfo {
    let knob = |knob, value, max| KnobState {
        knob,
        value: Some(value),
        pending: None,
        range: Some(KnobRange { min: 1, max }),
        last_rtt_ms: None,
        last_outcome: None,
    };
    TrainerInfo {
        attached: true,
        pid: Some(5120),
        last: None,
        knobs: vec![
            knob(KnobName::BatchSize, 256, Some(1024)),
            knob(KnobName::Prefetch, 2, Some(8)),
        ],
        ..TrainerInfo::default()
    }
}

/// The overview with the advisor pane open on [`hints`].
fn advisor_app() -> App {
    let mut a = app_with_runs();
    a.take_requests();
    press(&mut a, KeyCode::Char('a'));
    assert!(a.advisor.open);
    assert_eq!(
        a.take_requests(),
        [Request::Advise(true)],
        "the feed computes"
    );
    a.on_update(advice(hints(), ""));
    a
}

#[test]
fn the_pane_lists_hints_with_their_numbers_and_actions() {
    for (w, h) in [(80, 24), (200, 50)] {
        let mut a = advisor_app();
        let term = render(&mut a, w, h);
        assert_snapshot!(format!("advisor_{w}x{h}"), term.backend());
        let screen = text(&term);
        assert!(screen.contains("Advisor"), "{screen}");
        assert!(screen.contains("▶1 data stall"), "{screen}");
        assert!(screen.contains("data wait share of step 31.2%"), "{screen}");
        assert!(screen.contains("Enter: prefetch → 4"), "{screen}");
    }
    // The big screen holds every hint.
    let mut a = advisor_app();
    let screen = text(&render(&mut a, 200, 50));
    for s in [
        "2 memory headroom",
        "predicted at batch 512 42.6 GiB",
        "3 power-cap throttling · GPU 1",
        "Enter: GPU 1 cap → 700 W",
        "run: gpupilot thermal target 83 --gpu 2",
    ] {
        assert!(screen.contains(s), "{s}:\n{screen}");
    }
}

#[test]
fn selecting_scrolls_the_selected_hint_into_view() {
    let mut a = advisor_app();
    for _ in 0..3 {
        press(&mut a, KeyCode::Char('j'));
    }
    assert_eq!(a.advisor.selected, 3);
    press(&mut a, KeyCode::Char('j'));
    assert_eq!(a.advisor.selected, 3, "stays on the last");
    let screen = text(&render(&mut a, 80, 24));
    assert!(screen.contains("▶4 thermal throttling"), "{screen}");
    press(&mut a, KeyCode::Up);
    assert_eq!(a.advisor.selected, 2);
}

#[test]
fn without_hints_the_pane_says_why() {
    for (w, h) in [(80, 24), (200, 50)] {
        let mut a = app_with_runs();
        press(&mut a, KeyCode::Char('a'));
        let waiting = text(&render(&mut a, w, h));
        assert!(waiting.contains("Gathering the last minutes"), "{waiting}");
        a.on_update(advice(
            Vec::new(),
            "no run reports metrics (the gpupilot SDK, or lines the daemon parses: see \
             docs/profiles.md), so there is no evidence about data stalls, memory or \
             throughput; and the GPUs' last 5m show no throttling and no idle GPU drawing power",
        ));
        let term = render(&mut a, w, h);
        assert_snapshot!(format!("advisor_empty_{w}x{h}"), term.backend());
        let screen = text(&term);
        assert!(screen.contains("Nothing to suggest"), "{screen}");
        assert!(screen.contains("no run reports metrics"), "{screen}");
    }
}

#[test]
fn enter_on_a_prefetch_hint_opens_the_knob_dialog_with_the_suggested_value() {
    let mut a = advisor_app();
    a.on_update(Update::Metrics {
        run: RUN.into(),
        points: Vec::new(),
        reset: true,
        trainer: Box::new(trainer()),
    });
    a.take_requests();
    press(&mut a, KeyCode::Enter);
    assert!(!a.advisor.open, "the pane makes way for the dialog");
    assert_eq!(a.view, ViewId::Run);
    let Some(KnobDialog::Edit {
        run, knob, field, ..
    }) = &a.run.dialog
    else {
        panic!("no knob dialog: {:?}", a.run.dialog)
    };
    assert_eq!((run.as_str(), *knob), (RUN, KnobName::Prefetch));
    assert_eq!(field.text, "4", "the suggested value, typed in");
    assert_eq!(
        a.take_requests(),
        [Request::Advise(false)],
        "nothing sent yet"
    );
    // The user confirms in the dialog: then, and only then, the change goes out.
    press(&mut a, KeyCode::Enter);
    assert_eq!(
        a.take_requests(),
        [Request::SetKnob {
            run: RUN.into(),
            knob: KnobName::Prefetch,
            value: 4,
            restart: false,
        }]
    );
}

#[test]
fn a_knob_hint_waits_for_the_runs_knobs() {
    let mut a = advisor_app();
    // The batch-size hint, by its number, before the run's knobs came.
    press(&mut a, KeyCode::Char('2'));
    assert!(a.run.dialog.is_none());
    assert!(a.advisor.pending.is_some());
    a.on_update(Update::Metrics {
        run: RUN.into(),
        points: Vec::new(),
        reset: true,
        trainer: Box::new(trainer()),
    });
    let Some(KnobDialog::Edit { knob, field, .. }) = &a.run.dialog else {
        panic!("no knob dialog: {:?}", a.run.dialog)
    };
    assert_eq!((*knob, field.text.as_str()), (KnobName::BatchSize, "512"));
    assert!(a.advisor.pending.is_none());
}

#[test]
fn a_power_cap_hint_opens_the_power_dialog_with_the_suggested_watts() {
    let mut a = advisor_app();
    press(&mut a, KeyCode::Char('3'));
    let Some(PowerDialog::Edit { gpu, field, .. }) = &a.power else {
        panic!("no power dialog: {:?}", a.power)
    };
    assert_eq!((*gpu, field.text.as_str()), (1, "700"));
    assert_eq!(a.selected, 1);
    // A thermal target has no console request: the footer names the command.
    let mut a = advisor_app();
    press(&mut a, KeyCode::Char('4'));
    assert!(a.power.is_none() && a.run.dialog.is_none());
    let status = a.data.visible_status().expect("a footer message");
    assert!(
        status.text.contains("gpupilot thermal target 83 --gpu 2"),
        "{}",
        status.text
    );
    // Esc closes the pane and tells the feed to stop computing.
    press(&mut a, KeyCode::Esc);
    assert!(!a.advisor.open);
    assert_eq!(a.take_requests().last(), Some(&Request::Advise(false)));
}

fn point(cap_w: f64, e: f64, ms: f64) -> CapPoint {
    CapPoint {
        cap_w,
        batch: None,
        energy_j: e * 400.0,
        samples: 400.0,
        seconds: ms * 0.4,
        energy_per_sample_j: e,
        time_per_sample_s: ms / 1000.0,
        avg_power_w: e / (ms / 1000.0),
        cost: 0.5 * e + 0.5 * 1400.0 * ms / 1000.0,
        se_pct: None,
    }
}

fn curve() -> Vec<CapPoint> {
    vec![
        point(700.0, 2.90, 2.10),
        point(675.0, 2.78, 2.12),
        point(650.0, 2.66, 2.15),
    ]
}

fn progress(fraction: f64, curve: Vec<CapPoint>) -> Update {
    Update::Tuner(Box::new(TunerEvent::Progress {
        run: RUN.into(),
        progress: Progress {
            phase: Phase::Measure,
            cap_w: Some(625.0),
            index: 3,
            planned: 21,
            fraction,
            curve,
            best_cap_w: Some(650.0),
            batch: None,
            knob: Default::default(),
        },
    }))
}

/// The Run view after `t`, `y` on the training run and the tuner's first reports.
fn tuner_app() -> App {
    let mut a = app_with_runs();
    a.view = ViewId::Run;
    a.take_requests();
    press(&mut a, KeyCode::Char('t'));
    assert!(a.tuner.ask.is_some(), "t asks first");
    press(&mut a, KeyCode::Char('y'));
    assert_eq!(a.take_requests(), [Request::TuneEnergy(RUN.into())]);
    a.on_update(Update::Tuner(Box::new(TunerEvent::Started {
        run: RUN.into(),
        gpus: vec![0, 1],
        plan: (0..21).map(|k| 700.0 - 25.0 * k as f64).collect(),
        window: Window {
            unit: Unit::Steps,
            warmup: 10.0,
            measure: 40.0,
        },
        eta: 0.5,
    })));
    a.on_update(progress(0.45, curve()));
    a
}

#[test]
fn the_tuner_shows_its_progress_over_the_log() {
    for (w, h) in [(80, 24), (200, 50)] {
        let mut a = tuner_app();
        let term = render(&mut a, w, h);
        assert_snapshot!(format!("tuner_progress_{w}x{h}"), term.backend());
        let screen = text(&term);
        assert!(screen.contains("Energy tuner"), "{screen}");
        assert!(screen.contains("625 W [4/21] measuring"), "{screen}");
        assert!(screen.contains(" 45%"), "{screen}");
        assert!(screen.contains("← best"), "{screen}");
    }
}

#[test]
fn tuner_updates_redraw_the_progress_and_end_with_the_result() {
    let mut a = tuner_app();
    let before = text(&render(&mut a, 200, 50));
    assert!(before.contains(" 45%"), "{before}");
    let mut more = curve();
    more.push(point(625.0, 2.60, 2.2));
    a.on_update(progress(0.9, more.clone()));
    let after = text(&render(&mut a, 200, 50));
    assert!(after.contains(" 90%"), "{after}");
    assert!(
        after.contains("   625 "),
        "the new cap in the curve: {after}"
    );
    assert_ne!(before, after);

    // It ends: the best cap and the saving, and the footer says so.
    let best = more[2];
    let result = TuneResult {
        eta: 0.5,
        max_power_w: 1400.0,
        window: Window::DEFAULT_STEPS,
        start_w: 700.0,
        default_w: 700.0,
        best,
        default: Some(more[0]),
        curve: more,
        energy_saving_pct: Some(8.3),
        time_change_pct: Some(2.4),
        cost_saving_pct: Some(3.1),
        stopped_early: true,
        strategy: gpupilot::control::tuner::Strategy::Descend,
        planned: 21,
        duration_s: 412.0,
        batch: None,
        knob: Default::default(),
        other: None,
        confidence: None,
        saving_uncertainty_pct: None,
    };
    a.on_update(Update::Tuner(Box::new(TunerEvent::Ended {
        run: RUN.into(),
        end: TunerEnd::Done {
            result: Box::new(result),
            saved: Ok("/home/alice/.local/state/gpupilot/runs/x/tune-energy.json".into()),
        },
    })));
    let term = render(&mut a, 200, 50);
    assert_snapshot!("tuner_done_200x50", term.backend());
    let done = text(&term);
    assert!(done.contains("best cap 650 W"), "{done}");
    assert!(done.contains("8.3% less energy per sample"), "{done}");
    assert!(done.contains("t: close"), "{done}");
    // t closes the result; the log is whole again.
    press(&mut a, KeyCode::Char('t'));
    assert!(a.tuner.shown.is_none());
    assert!(!text(&render(&mut a, 200, 50)).contains("Energy tuner"));
}

#[test]
fn t_while_tuning_asks_to_stop_and_n_keeps_it_going() {
    let mut a = tuner_app();
    press(&mut a, KeyCode::Char('t'));
    let screen = text(&render(&mut a, 200, 50));
    assert!(screen.contains("Stop the tuner on run"), "{screen}");
    press(&mut a, KeyCode::Char('n'));
    assert!(a.take_requests().is_empty());
    press(&mut a, KeyCode::Char('t'));
    press(&mut a, KeyCode::Char('y'));
    assert_eq!(a.take_requests(), [Request::TuneStop]);
    assert!(a.tuner.shown.as_ref().unwrap().stopping);
    a.on_update(Update::Tuner(Box::new(TunerEvent::Ended {
        run: RUN.into(),
        end: TunerEnd::Cancelled {
            why: "interrupted".into(),
            restored: Ok(()),
        },
    })));
    let screen = text(&render(&mut a, 200, 50));
    assert!(screen.contains("back at its starting cap"), "{screen}");
    // A finished run cannot be tuned: t on it says so and asks nothing.
    let mut a = app_with_runs();
    a.view = ViewId::Run;
    a.apply(Action::RunNext);
    a.apply(Action::RunOpen);
    assert_ne!(a.run.open.as_deref(), Some(RUN));
    press(&mut a, KeyCode::Char('t'));
    assert!(a.tuner.ask.is_none());
}
