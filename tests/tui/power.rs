//! The power-cap dialog: drawn over the Overview on ratatui's TestBackend from the fixture
//! (GPU 1 capped at 450 W, default 700 W, allowed 200–700 W), and the feed's request against a
//! real daemon on the simulator, read back through `gpupilot power --json`.

use std::time::Duration;

use crate::support::feed::Reader;
use crate::support::home::Home;
use crate::support::tui::{app_with_runs, press, render, text, typed};
use crossterm::event::KeyCode;
use gpupilot::tui::ViewId;
use gpupilot::tui::feed::{DataSource, Request, Update};
use insta::assert_snapshot;

#[test]
fn the_power_dialog_checks_the_range_and_asks_before_sending() {
    let mut a = app_with_runs();
    a.view = ViewId::Overview;
    press(&mut a, KeyCode::Char('j'));
    press(&mut a, KeyCode::Char('c'));
    let term = render(&mut a, 80, 24);
    assert_snapshot!("power_dialog_80x24", term.backend());
    let screen = text(&term);
    assert!(screen.contains("Power cap of GPU 1"), "{screen}");
    assert!(
        screen.contains("now 450 W   default 700 W   allowed 200–700 W"),
        "{screen}"
    );

    typed(&mut a, "900");
    press(&mut a, KeyCode::Enter);
    let term = render(&mut a, 80, 24);
    assert_snapshot!("power_dialog_out_of_range_80x24", term.backend());
    assert!(
        text(&term).contains("900 is outside the allowed range 200–700 W"),
        "{}",
        text(&term)
    );
    assert!(a.take_requests().is_empty(), "nothing sent");

    for _ in 0..3 {
        press(&mut a, KeyCode::Backspace);
    }
    typed(&mut a, "250");
    press(&mut a, KeyCode::Enter);
    let term = render(&mut a, 80, 24);
    assert_snapshot!("power_dialog_confirm_80x24", term.backend());
    assert!(
        text(&term).contains("cap GPU 1 at 250 W (now 450 W)? y/n"),
        "{}",
        text(&term)
    );
    assert!(a.take_requests().is_empty(), "nothing sent before the yes");
    press(&mut a, KeyCode::Char('y'));
    assert_eq!(
        a.take_requests(),
        [Request::PowerCap { gpu: 1, watts: 250 }]
    );
    // The daemon's answer shows in the footer.
    a.on_update(Update::Answer {
        ok: true,
        text: "GPU 1: power limit 450 W → 250 W".into(),
    });
    let screen = text(&render(&mut a, 80, 24));
    assert!(
        screen.contains("GPU 1: power limit 450 W → 250 W"),
        "{screen}"
    );
    assert!(!screen.contains("Power cap of GPU"), "closed: {screen}");
}

#[test]
fn the_dialog_never_panics_on_small_terminals() {
    for (w, h) in [(30, 10), (40, 12), (60, 16), (80, 20), (120, 40)] {
        let mut a = app_with_runs();
        press(&mut a, KeyCode::Char('c'));
        render(&mut a, w, h);
        typed(&mut a, "12345");
        press(&mut a, KeyCode::Enter);
        render(&mut a, w, h);
    }
}

/// The feed's next answer (at most 20 s away).
fn answer(r: &mut Reader) -> (bool, String) {
    match r.until("an answer from the feed", |u| {
        matches!(u, Update::Answer { .. })
    }) {
        Update::Answer { ok, text } => (ok, text),
        _ => unreachable!(),
    }
}

/// A console feed from `home`'s daemon, read with a bound of 20 s on every wait.
fn daemon_feed(home: &Home) -> Reader {
    Reader::new(
        DataSource::Daemon(home.client()).start(Duration::from_millis(200)),
        Duration::from_secs(20),
    )
}

/// GPU `gpu`'s current power limit, as `gpupilot power --json` reads it.
fn cap_of(home: &Home, gpu: usize) -> f64 {
    let v: serde_json::Value = serde_json::from_str(&home.ok(&["power", "--json"])).unwrap();
    v["gpus"][gpu]["power"]["current_w"].as_f64().unwrap()
}

#[test]
fn the_feed_caps_one_gpu_on_a_real_daemon_and_resets_it() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let mut feed = daemon_feed(&home);
    let (before0, before1) = (cap_of(&home, 0), cap_of(&home, 1));
    assert_ne!(before1, 250.0);

    feed.send(Request::PowerCap { gpu: 1, watts: 250 });
    let (ok, text) = answer(&mut feed);
    assert!(ok, "{text}");
    assert_eq!(
        text,
        format!("GPU 1: power limit {before1:.0} W → 250 W"),
        "the answer for the footer"
    );
    assert_eq!(cap_of(&home, 1), 250.0);
    assert_eq!(cap_of(&home, 0), before0, "only the GPU asked for");

    // The daemon refuses what is outside the range (the dialog checks first; a stale
    // snapshot could still let one through), naming the range.
    feed.send(Request::PowerCap { gpu: 1, watts: 5 });
    let (ok, text) = answer(&mut feed);
    assert!(!ok);
    assert!(
        text.contains("power cap is unchanged") && text.contains("outside GPU 1's range"),
        "{text}"
    );
    assert_eq!(cap_of(&home, 1), 250.0);

    feed.send(Request::PowerReset { gpu: 1 });
    let (ok, text) = answer(&mut feed);
    assert!(ok, "{text}");
    assert_eq!(text, format!("GPU 1: power limit 250 W → {before1:.0} W"));
    assert_eq!(cap_of(&home, 1), before1);
}

#[test]
fn a_readonly_daemon_refuses_and_says_why() {
    let home = Home::new();
    let _daemon = home.daemon(&["--readonly"]);
    let mut feed = daemon_feed(&home);
    let before = cap_of(&home, 0);
    feed.send(Request::PowerCap { gpu: 0, watts: 300 });
    let (ok, text) = answer(&mut feed);
    assert!(!ok);
    assert!(text.contains("read-only"), "{text}");
    assert_eq!(cap_of(&home, 0), before);
}
