//! `App::apply` for the Run and Events views: the run list, the log's scrolling and search,
//! and the requests that reach the feed (stop only after `y`).

use super::*;
use crate::protocol::{LogStream, NodeEvent, NodeEventRecord, RunInfo};
use crate::supervisor::RunStatus;
use crate::tui::data::Level;
use crossterm::event::{KeyCode, KeyModifiers};

pub(crate) fn run_info(id: &str, status: RunStatus) -> RunInfo {
    RunInfo {
        id: id.into(),
        name: id.rsplit('-').next().unwrap_or(id).into(),
        status,
        pid: Some(4242),
        attempt: 0,
        restarts: 0,
        started_at: "2026-11-30T04:07:54.920Z".into(),
        ended_at: None,
        uptime_s: Some(63.0),
        exit_code: None,
        signal_name: None,
        description: None,
        command: vec!["python3".into(), "train.py".into()],
        cwd: "/home/a/exp".into(),
        gpus: "all".into(),
        adopted: false,
        dir: "/tmp/runs".into(),
        energy: None,
        slurm: None,
    }
}

/// An 80×24 app on the Run view with three runs (the newest running) and 100 log lines of
/// the newest, three of which say `ckpt`.
fn app() -> App {
    let mut app = App::new(Keymap::defaults(), Theme::default(), Duration::from_secs(1));
    app.view = ViewId::Run;
    app.on_update(Update::Runs(vec![
        run_info("20261130-010000-prep", RunStatus::Succeeded),
        run_info("20261130-020000-eval", RunStatus::Paused),
        run_info("20261130-030000-train", RunStatus::Running),
    ]));
    assert_eq!(
        app.take_requests(),
        [Request::Watch("20261130-030000-train".into())],
        "the newest live run is shown and its log asked for"
    );
    let log: String = (0..100)
        .map(|i| {
            if [10, 40, 90].contains(&i) {
                format!("step {i} ckpt saved\n")
            } else {
                format!("step {i} loss {:.2}\n", 3.0 - i as f64 / 50.0)
            }
        })
        .collect();
    app.on_update(Update::Log {
        run: "20261130-030000-train".into(),
        stream: LogStream::Stdout,
        data: log,
        reset: true,
        from_start: true,
    });
    app
}

fn press(app: &mut App, code: KeyCode) {
    let ev = KeyEvent::new(code, KeyModifiers::NONE);
    if let Some(a) = app.action_for_key(&ev) {
        app.apply(a);
    }
}

fn type_text(app: &mut App, s: &str) {
    for c in s.chars() {
        press(app, KeyCode::Char(c));
    }
}

fn status(app: &App) -> String {
    app.data
        .visible_status()
        .map(|s| s.text.clone())
        .unwrap_or_default()
}

#[test]
fn search_finds_the_newest_match_then_walks_with_n_and_shift_n() {
    let mut app = app();
    press(&mut app, KeyCode::Char('/'));
    type_text(&mut app, "CKPQ");
    press(&mut app, KeyCode::Backspace);
    press(&mut app, KeyCode::Backspace);
    type_text(&mut app, "pt");
    assert_eq!(app.run.prompt.as_deref(), Some("CKpt"));
    assert!(!app.quit);
    // Smart case: capitals make it exact, so nothing matches; retype in lower case.
    press(&mut app, KeyCode::Enter);
    assert_eq!(app.run.current, None);
    assert!(status(&app).contains("no match"), "{}", status(&app));
    press(&mut app, KeyCode::Char('/'));
    type_text(&mut app, "ckpt");
    press(&mut app, KeyCode::Enter);
    assert_eq!(app.run.prompt, None);
    assert_eq!(
        app.run.current,
        Some(90),
        "the newest match above the bottom"
    );
    assert!(!app.run.follow, "a match holds the view still");

    press(&mut app, KeyCode::Char('n'));
    assert_eq!(app.run.current, Some(10), "n wraps to the oldest");
    assert!(status(&app).contains("wrapped to the top"));
    press(&mut app, KeyCode::Char('n'));
    assert_eq!(app.run.current, Some(40));
    let page = run::Layout::new(app.areas(app.size).body, 3).log_rows() as u64;
    let (first, end) =
        run::state::window(&app.run, app.run.buffer(&app.data).unwrap(), page as usize);
    assert!(
        (first..end).contains(&40),
        "the match is on screen: {first}..{end}"
    );
    press(&mut app, KeyCode::Char('N'));
    assert_eq!(app.run.current, Some(10));
    press(&mut app, KeyCode::Char('N'));
    assert_eq!(app.run.current, Some(90), "N wraps to the newest");
    assert!(status(&app).contains("wrapped to the bottom"));

    press(&mut app, KeyCode::Esc);
    assert!(app.run.query.is_empty() && app.run.current.is_none());
    press(&mut app, KeyCode::Char('n'));
    assert!(status(&app).contains("no search"));
    assert!(
        app.take_requests().is_empty(),
        "searching asks the daemon nothing"
    );
}

#[test]
fn stop_asks_first_and_sends_only_after_y() {
    let mut app = app();
    press(&mut app, KeyCode::Char('s'));
    assert_eq!(
        app.run.confirm,
        Some(run::state::Confirm::Stop("20261130-030000-train".into()))
    );
    assert!(app.take_requests().is_empty(), "nothing sent while asking");
    // Any key but y says no, and does nothing else (q does not quit here).
    press(&mut app, KeyCode::Char('q'));
    assert!(!app.quit && app.run.confirm.is_none());
    assert!(app.take_requests().is_empty());
    assert!(status(&app).contains("left running"));

    press(&mut app, KeyCode::Char('s'));
    press(&mut app, KeyCode::Char('y'));
    assert_eq!(
        app.take_requests(),
        [Request::Stop("20261130-030000-train".into())]
    );
    assert!(app.run.confirm.is_none());

    // An ended run is not asked about.
    app.apply(Action::RunNext);
    app.apply(Action::RunNext);
    app.apply(Action::RunOpen);
    assert_eq!(
        app.take_requests(),
        [Request::Watch("20261130-010000-prep".into())],
        "opening a run tails its log"
    );
    press(&mut app, KeyCode::Char('s'));
    assert!(app.run.confirm.is_none());
    assert!(status(&app).contains("already ended"), "{}", status(&app));
    assert!(app.take_requests().is_empty());
}

#[test]
fn pause_toggles_by_status_and_answers_show_in_the_footer() {
    let mut app = app();
    press(&mut app, KeyCode::Char('p'));
    assert_eq!(
        app.take_requests(),
        [Request::Pause("20261130-030000-train".into())]
    );
    app.apply(Action::RunNext);
    app.apply(Action::RunOpen);
    app.take_requests();
    press(&mut app, KeyCode::Char('p'));
    assert_eq!(
        app.take_requests(),
        [Request::Resume("20261130-020000-eval".into())]
    );
    app.on_update(Update::Answer {
        ok: false,
        text: "the daemon runs with --readonly".into(),
    });
    let s = app.data.visible_status().unwrap();
    assert_eq!(s.level, Level::Error);
    assert!(s.text.contains("readonly"));
}

#[test]
fn the_log_scrolls_follows_and_switches_streams() {
    let mut app = app();
    assert!(app.run.follow);
    press(&mut app, KeyCode::PageUp);
    assert!(!app.run.follow);
    let top = app.run.top;
    assert!(top < 100 && top > 50, "{top}");
    // New output does not move a scrolled view.
    app.on_update(Update::Log {
        run: "20261130-030000-train".into(),
        stream: LogStream::Stdout,
        data: "step 100 loss 1.00\n".into(),
        reset: false,
        from_start: false,
    });
    assert_eq!(app.run.top, top);
    press(&mut app, KeyCode::Char('G'));
    assert!(app.run.follow);
    press(&mut app, KeyCode::Char('f'));
    assert!(!app.run.follow, "f turns following off");
    press(&mut app, KeyCode::Char('g'));
    assert_eq!(app.run.top, 0);
    for _ in 0..30 {
        press(&mut app, KeyCode::PageDown);
    }
    assert!(app.run.follow, "paging to the end follows again");
    press(&mut app, KeyCode::Char('e'));
    assert_eq!(app.run.stream, LogStream::Stderr);
    assert!(app.run.buffer(&app.data).unwrap().is_empty());
}

#[test]
fn the_run_list_selects_and_opens() {
    let mut app = app();
    assert_eq!(app.run.selected, 0, "the list starts on the shown run");
    press(&mut app, KeyCode::Char('k'));
    assert_eq!(app.run.selected, 0);
    for _ in 0..5 {
        press(&mut app, KeyCode::Char('j'));
    }
    assert_eq!(app.run.selected, 2, "j stops at the oldest run");
    assert_eq!(app.selected, 0, "j moves the run list here, not the GPU");
    press(&mut app, KeyCode::Enter);
    assert_eq!(app.run.open.as_deref(), Some("20261130-010000-prep"));
    assert_eq!(
        app.take_requests(),
        [Request::Watch("20261130-010000-prep".into())]
    );
    assert!(
        app.run.buffer(&app.data).is_none(),
        "the other run's log is not shown"
    );
    // A run that disappears from the list falls back to the newest live one.
    app.on_update(Update::Runs(vec![run_info(
        "20261130-030000-train",
        RunStatus::Running,
    )]));
    assert_eq!(app.run.selected, 0);
    assert_eq!(
        app.run.current(&app.data).map(|r| r.id.as_str()),
        Some("20261130-030000-train")
    );
}

#[test]
fn events_scroll_within_bounds() {
    let mut app = app();
    app.view = ViewId::Events;
    let events = (1..=50)
        .map(|seq| NodeEventRecord {
            seq,
            time: "2026-11-30T04:07:55.652Z".into(),
            event: NodeEvent::DaemonStopped {
                pid: 1,
                reason: "SIGTERM".into(),
            },
        })
        .collect();
    app.on_update(Update::Events {
        events,
        reset: true,
    });
    press(&mut app, KeyCode::Char('k'));
    assert_eq!((app.events.selected, app.events.scroll), (0, 0));
    press(&mut app, KeyCode::Char('j'));
    assert_eq!((app.events.selected, app.events.scroll), (1, 0));
    press(&mut app, KeyCode::Char('G'));
    assert_eq!(app.events.selected, 49);
    let last = app.events.scroll;
    assert!(last > 20 && last < 50, "{last}");
    press(&mut app, KeyCode::Char('j'));
    assert_eq!((app.events.selected, app.events.scroll), (49, last));
    press(&mut app, KeyCode::Char('g'));
    assert_eq!((app.events.selected, app.events.scroll), (0, 0));
    assert_eq!(app.selected, 0, "the GPU selection did not move");
    // Enter opens the selected event (the second newest, seq 49); keys go to it until Esc.
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Enter);
    assert_eq!(app.events.open, Some(49));
    press(&mut app, KeyCode::Char('j'));
    assert_eq!(app.events.selected, 1, "the list behind the detail stays");
    press(&mut app, KeyCode::Char('q'));
    assert!(!app.quit, "q closes the detail, not the console");
    assert_eq!(app.events.open, None);
    press(&mut app, KeyCode::Enter);
    press(&mut app, KeyCode::Esc);
    assert_eq!(app.events.open, None);
    assert_eq!(app.view, ViewId::Events);
}
