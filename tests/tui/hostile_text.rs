//! Text a peer chose, drawn by the console: a run's command and who changed it, from a process
//! whose name clears the screen, forges a line and reverses what follows. Each is drawn
//! escaped, so it reads as what it is and reorders nothing.

use crate::support::tui::{app_with_runs, events, render, run_info, runs, text};
use gpupilot::protocol::{NodeEvent, NodeEventRecord};
use gpupilot::supervisor::RunStatus;
use gpupilot::tui::feed::Update;
use gpupilot::tui::{Action, App, ViewId};
use insta::assert_snapshot;

const HOSTILE: &str = "gp\u{1b}[2J\nFAKE\u{202e}txt";
const SHOWN: &str = "gp\\x1b[2J\\nFAKE\\u{202e}txt";

fn app() -> App {
    let mut a = app_with_runs();
    let mut list = runs();
    let mut run = run_info("20231114-230000-gp", RunStatus::Running);
    run.command = vec!["python3".into(), HOSTILE.into()];
    list.push(run);
    a.on_update(Update::Runs(list));
    let mut evs = events();
    evs.push(NodeEventRecord {
        seq: evs.len() as u64 + 1,
        time: "2023-11-14T23:00:00.000Z".into(),
        event: NodeEvent::RunStarted {
            run: "20231114-230000-gp".into(),
            by: format!("alice (uid 1000) via {HOSTILE} (pid 99)"),
            command: vec!["python3".into(), HOSTILE.into()],
            why: Some(HOSTILE.into()),
        },
    });
    a.on_update(Update::Events {
        events: evs,
        reset: true,
    });
    a.take_requests();
    a
}

#[test]
fn a_runs_hostile_command_is_drawn_escaped() {
    let mut a = app();
    a.apply(Action::ShowView(ViewId::Run));
    let term = render(&mut a, 120, 30);
    assert_snapshot!("hostile_run_120x30", term.backend());
    let screen = text(&term);
    assert!(
        screen.contains(&format!("python3 '{SHOWN}'")),
        "the command, escaped:\n{screen}"
    );
    assert!(
        !screen.contains('\u{202e}') && !screen.contains("\u{1b}"),
        "{screen}"
    );
}

#[test]
fn who_started_it_and_why_are_drawn_escaped() {
    let mut a = app();
    a.apply(Action::ShowView(ViewId::Events));
    let term = render(&mut a, 200, 30);
    assert_snapshot!("hostile_events_200x30", term.backend());
    let screen = text(&term);
    // Who (wrapped within its column, whole), the run, the change and why.
    let row = screen
        .lines()
        .find(|l| l.contains("│11-14 23:00:00 alice (uid 1000) via "))
        .unwrap_or_else(|| panic!("the row:\n{screen}"));
    assert!(
        row.contains(" 20231114-230000-gp ") && row.contains(" → running ") && row.contains(SHOWN),
        "the run, the change and why, escaped:\n{screen}"
    );
    assert!(
        screen.contains(&format!(" {SHOWN} (pid 99) ")),
        "who, escaped:\n{screen}"
    );
    assert!(
        !screen.contains('\u{202e}') && !screen.contains("\u{1b}"),
        "{screen}"
    );
}
