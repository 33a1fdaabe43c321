//! The Events view in words: a power cap, a tuner step, an alert, the governor and a knob
//! change, each shown whole at 80×24, 120×40 and 200×50 (insta snapshots), and Enter opening
//! an event's detail with the command that undoes it.

use crate::support::tui::{app_with_runs, render, text};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use gpupilot::control::alerts::{Alert, AlertKind};
use gpupilot::protocol::{KnobName, KnobVia, NodeEvent, NodeEventRecord};
use gpupilot::tui::feed::Update;
use gpupilot::tui::{Action, App, ViewId};
use insta::assert_snapshot;

const SIZES: [(u16, u16); 3] = [(80, 24), (120, 40), (200, 50)];
const ROOT: &str = "root (uid 0) via gpupilot (pid 5120)";

/// What a node says after `gpupilot power cap 300 --gpu 1`, an energy search, a hot GPU and a
/// knob change: oldest first.
fn changes() -> Vec<NodeEventRecord> {
    let events = vec![
        NodeEvent::GpuChanged {
            gpu: 1,
            what: "power_limit".into(),
            old: Some("700 W".into()),
            new: Some("300 W".into()),
            by: ROOT.into(),
            why: None,
        },
        NodeEvent::Tune {
            job: "tune-20231114-220820-train".into(),
            run: "20231114-220820-train".into(),
            change: "cap".into(),
            gpus: vec![1],
            old_w: Some(700.0),
            cap_w: Some(600.0),
            cost: None,
            why: None,
        },
        NodeEvent::Governor {
            gpu: 2,
            change: "cap".into(),
            target_c: Some(80.0),
            temperature_c: Some(84.0),
            old_w: Some(700.0),
            new_w: Some(650.0),
            by: "thermal governor".into(),
            why: "4 °C above target: cap down 50 W".into(),
        },
        NodeEvent::Alert {
            change: "raised".into(),
            alert: Alert {
                key: "temperature:gpu1".into(),
                kind: AlertKind::Temperature,
                gpu: Some(1),
                run: None,
                value: Some(91.0),
                threshold: Some(90.0),
                message: "GPU 1 at 91 °C (alert at 90 °C)".into(),
                since_s: 1_700_000_000.0,
            },
        },
        NodeEvent::KnobChanged {
            run: "20231114-220820-train".into(),
            change: 3,
            knob: KnobName::BatchSize,
            old: Some(256),
            new: 512,
            via: KnobVia::Trainer,
            by: "alice (uid 1000) via gpupilot (pid 4242)".into(),
            why: Some("memory headroom: 41 GiB free at batch 256".into()),
        },
    ];
    events
        .into_iter()
        .enumerate()
        .map(|(i, event)| NodeEventRecord {
            seq: 100 + i as u64,
            time: format!("2023-11-14T22:30:{:02}.000Z", i * 7),
            event,
        })
        .collect()
}

fn app() -> App {
    let mut a = app_with_runs();
    a.on_update(Update::Events {
        events: changes(),
        reset: true,
    });
    a.apply(Action::ShowView(ViewId::Events));
    a
}

fn press(a: &mut App, code: KeyCode) {
    if let Some(act) = a.action_for_key(&KeyEvent::new(code, KeyModifiers::NONE)) {
        a.apply(act);
    }
}

/// The screen's text with each line's right border and padding gone, and the lines joined:
/// a wrapped change reads as one string again when the row is read cell by cell.
fn rows(screen: &str) -> Vec<String> {
    screen
        .lines()
        .map(|l| l.trim_end_matches([' ', '│']).to_string())
        .collect()
}

/// The lines of the table row that holds `marker`: its first line and those that go on it
/// (no time in their first column), joined.
fn row_of(lines: &[String], marker: &str) -> String {
    let first = lines
        .iter()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("{marker:?} missing"));
    let mut row = lines[first].clone();
    for l in &lines[first + 1..] {
        let goes_on = l.strip_prefix('│').is_some_and(|r| r.starts_with(' '));
        if !goes_on || l.trim_matches(['│', ' ']).is_empty() {
            break;
        }
        row.push(' ');
        row.push_str(l);
    }
    row
}

#[test]
fn every_change_reads_whole_in_words_at_every_size() {
    let mut a = app();
    for (w, h) in SIZES {
        let term = render(&mut a, w, h);
        assert_snapshot!(format!("events_words_{w}x{h}"), term.backend());
        let screen = text(&term);
        // The words, never key=value or JSON.
        assert!(
            !screen.contains("cap_w=") && !screen.contains("{\"") && !screen.contains("alert="),
            "{w}x{h}:\n{screen}"
        );
        let lines = rows(&screen);
        let has = |s: &str| lines.iter().any(|l| l.contains(s));
        assert!(has("power limit 700 W → 300 W"), "{w}x{h}:\n{screen}");
        assert!(has("temperature 91 °C ≥ 90 °C"), "{w}x{h}:\n{screen}");
        assert!(has("batch size 256 → 512"), "{w}x{h}:\n{screen}");
        assert!(has("cap 700 W → 650 W"), "{w}x{h}:\n{screen}");
        // The tuner's row: whole, on one line where the terminal is wide enough, else
        // wrapped within its row: every word of it there, in order.
        let tuner = "cap 700 W → 600 W (job tune-20231114-220820-train, searching)";
        if w >= 200 {
            assert!(has(tuner), "{w}x{h}:\n{screen}");
        }
        let row = row_of(&lines, "energy tuner");
        let mut at = 0;
        for word in tuner.split(' ') {
            let found = row[at..].find(word);
            assert!(
                found.is_some(),
                "{word:?} of the tuner's row missing at {w}x{h}:\n{row}"
            );
            at += found.unwrap() + word.len();
        }
        assert!(has("energy tuner"), "{w}x{h}:\n{screen}");
        assert!(has("alert") && has("GPU 1"), "{w}x{h}:\n{screen}");
    }
}

#[test]
fn enter_opens_the_selected_event_with_the_command_that_undoes_it() {
    let mut a = app();
    // The newest first: the knob change, the alert, the governor, the tuner, the cap.
    for _ in 0..4 {
        press(&mut a, KeyCode::Char('j'));
    }
    press(&mut a, KeyCode::Enter);
    let term = render(&mut a, 120, 40);
    assert_snapshot!("events_detail_power_cap_120x40", term.backend());
    let screen = text(&term);
    for s in [
        "Event 100",
        ROOT,
        "(a user)",
        "GPU 1 power limit 700 W → 300 W",
        "not recorded",
        "gpupilot power cap 700 --gpu 1",
        "Esc closes",
    ] {
        assert!(screen.contains(s), "{s:?} missing:\n{screen}");
    }
    press(&mut a, KeyCode::Esc);
    let closed = text(&render(&mut a, 120, 40));
    assert!(!closed.contains("Esc closes"), "{closed}");
    assert_eq!(a.view, ViewId::Events, "Esc closed the detail only");

    // The knob change: its undo sets the old batch size back; the tuner's stops the job.
    press(&mut a, KeyCode::Char('g'));
    press(&mut a, KeyCode::Enter);
    let knob = text(&render(&mut a, 80, 24));
    assert!(
        knob.contains("gpupilot set 20231114-220820-train batch-size 256"),
        "{knob}"
    );
    assert!(knob.contains("memory headroom"), "the why: {knob}");
    press(&mut a, KeyCode::Esc);
    for _ in 0..3 {
        press(&mut a, KeyCode::Char('j'));
    }
    press(&mut a, KeyCode::Enter);
    let tuner = text(&render(&mut a, 200, 50));
    for s in [
        "Who     energy tuner",
        "gpupilot tune stop tune-20231114-220820-train",
        "cap",
        "600 W",
    ] {
        assert!(tuner.contains(s), "{s:?} missing:\n{tuner}");
    }
}

#[test]
fn the_detail_of_an_event_without_an_undo_says_so() {
    let mut a = app();
    press(&mut a, KeyCode::Char('j'));
    press(&mut a, KeyCode::Enter);
    let screen = text(&render(&mut a, 200, 50));
    assert!(screen.contains("Who     alert"), "{screen}");
    assert!(screen.contains("nothing to undo"), "{screen}");
    assert!(
        screen.contains("GPU 1 at 91 °C (alert at 90 °C)"),
        "the why: {screen}"
    );
}

#[test]
fn an_open_event_that_leaves_the_list_says_so_until_esc() {
    let mut a = app();
    press(&mut a, KeyCode::Enter);
    // The daemon came back with another log: the event is not in it.
    a.on_update(Update::Events {
        events: changes()[..3].to_vec(),
        reset: true,
    });
    let screen = text(&render(&mut a, 120, 40));
    assert!(
        screen.contains("Event 104 is no longer in the daemon's list."),
        "{screen}"
    );
    press(&mut a, KeyCode::Esc);
    let screen = text(&render(&mut a, 120, 40));
    assert!(!screen.contains("no longer"), "{screen}");
    assert_eq!(a.events.open, None);
}

#[test]
fn a_tiny_terminal_does_not_panic_with_the_detail_open() {
    let mut a = app();
    press(&mut a, KeyCode::Enter);
    for (w, h) in [(20, 6), (40, 10), (1, 1)] {
        render(&mut a, w, h);
    }
}

/// End to end: the console in a 200×50 tmux pane on a daemon of the simulator, a power cap set
/// from a shell while it runs, read whole in the Events view at 200 and at 80 columns, and
/// Enter showing how to undo it.
#[test]
fn a_cap_set_from_a_shell_reads_whole_in_the_console() {
    use crate::support::home::Home;
    use crate::support::tmux::{PROMPT, Tmux};

    let home = Home::new();
    let _d = home.daemon(&[]);
    let tmux = Tmux::start(&home.root());
    tmux.wait_text(PROMPT);
    let bin = env!("CARGO_BIN_EXE_gpupilot");
    tmux.type_line(&format!("'{bin}' --source sim --gpus 2"));
    tmux.wait_text("2 GPUs");
    tmux.keys(&["4"]);
    tmux.wait_text("Events (");
    home.ok(&["power", "cap", "300", "--gpu", "1"]);
    let wide = tmux.wait_screen("the cap in the Events view", |s| {
        s.contains("GPU 1") && s.contains("power limit 700 W → 300 W")
    });
    assert!(wide.contains("root (uid 0) via gpupilot"), "{wide}");
    // Narrow: still whole.
    tmux.resize(80, 24);
    tmux.wait_screen("the cap at 80 columns", |s| {
        s.lines().count() <= 24 && s.contains("power limit 700 W → 300 W")
    });
    tmux.resize(200, 50);
    // The newest event is the cap: Enter opens it, with the command that undoes it.
    tmux.keys(&["g", "Enter"]);
    tmux.wait_screen("the cap's detail", |s| {
        s.contains("gpupilot power cap 700 --gpu 1") && s.contains("Esc closes")
    });
    tmux.keys(&["Escape"]);
    tmux.wait_screen("the detail closed", |s| {
        !s.contains("Esc closes") && s.contains("power limit 700 W → 300 W")
    });
    tmux.keys(&["q"]);
    tmux.wait_prompt();
}
