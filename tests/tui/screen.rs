//! The console's terminal (`tui::screen`) draws an overview piece by piece: each row around
//! it and each GPU block only when what it shows changed. What reaches the
//! terminal must be exactly the whole frame, whatever happens between frames: new data, a
//! selection, help and dialogs over the body, other views, a long footer error, resizes, a
//! theme change, Ctrl-L.

use crate::support::tui::{SECONDS, T0, app, snapshot_at, take, terminal};
use gpupilot::telemetry::{Snapshot, throttle};
use gpupilot::tui::data::Level;
use gpupilot::tui::screen::Screen;
use gpupilot::tui::theme;
use gpupilot::tui::{App, ViewId};
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::widgets::Widget;

/// The frame `app` renders whole on `area`.
fn whole(app: &App, area: Rect) -> Buffer {
    let mut b = Buffer::empty(area);
    app.render(area, &mut b);
    b
}

/// Draw a frame and check the terminal shows exactly the whole frame.
fn check(screen: &mut Screen<TestBackend>, app: &mut App, what: &str) {
    app.size = screen.draw(app).unwrap();
    let want = whole(app, app.size);
    assert_eq!(screen.backend().buffer(), &want, "{what}");
}

#[test]
fn frames_drawn_piecewise_are_the_whole_frames() {
    let mut a = app(8);
    let mut screen = Screen::new(TestBackend::new(200, 50));
    let mut piecewise = 0;
    for k in 0..90usize {
        let s = SECONDS + k;
        // Two GPUs gone for two seconds, then back: the blocks move.
        let n = if (80..82).contains(&k) { 6 } else { 8 };
        let mut snap = snapshot_at(n, s);
        // Throttle badges that come and go on a GPU's top edge, as on a node at its caps.
        for (i, g) in snap.gpus.iter_mut().enumerate() {
            if (k + i) % 3 == 0 {
                g.throttle_reasons =
                    Some(throttle::SW_POWER_CAP | ((i as u64 % 2) * throttle::HW_SLOWDOWN));
            }
        }
        take(&mut a, snap);
        a.data.now = T0 + s as f64 + 0.5;
        match k {
            10 => a.selected = 5,
            20 => a.help.open = true,
            22 => a.help.open = false,
            25 => a.advisor.open = true,
            26 => a.advisor.open = false,
            30 => a.view = ViewId::Detail,
            33 => a.view = ViewId::Overview,
            40 => a.data.set_status(
                Level::Error,
                "a long error that wraps onto more than one footer row: ".repeat(6),
            ),
            45 => screen.backend_mut().resize(120, 40),
            50 => screen.backend_mut().resize(80, 24),
            55 => screen.backend_mut().resize(200, 50),
            60 => a.theme = theme::preset("light").unwrap().resolve("light"),
            70 => screen.clear().unwrap(),
            75 => a.selected = 0,
            _ => {}
        }
        check(&mut screen, &mut a, &format!("frame {k}"));
        piecewise += usize::from(!screen.last_frame().whole);
    }
    assert!(
        piecewise >= 60,
        "most frames drawn piece by piece: {piecewise} of 90"
    );
}

/// A snapshot whose values do not change, at second `s`.
fn steady(s: usize) -> Snapshot {
    let mut snap = snapshot_at(8, SECONDS);
    let t = T0 + s as f64;
    snap.time_s = t + 0.01;
    for g in &mut snap.gpus {
        g.time_s = t;
    }
    snap
}

#[test]
fn a_steady_overview_sends_nothing_and_redraws_no_block() {
    let mut a = app(8);
    let mut screen = Screen::new(TestBackend::new(200, 50));
    // Until the fixture's changing minutes have scrolled out of every sparkline.
    for s in SECONDS..SECONDS + 200 {
        take(&mut a, steady(s));
        a.data.now = T0 + s as f64 + 0.5;
        check(&mut screen, &mut a, &format!("second {s}"));
    }
    let last = screen.last_frame();
    assert_eq!(
        (last.whole, last.blocks, last.cells),
        (false, 0, 0),
        "{last:?}"
    );

    // A value that changes what is shown redraws that GPU's block only.
    let s = SECONDS + 200;
    let mut snap = steady(s);
    snap.gpus[4].power_w = Some(600.0);
    take(&mut a, snap);
    a.data.now = T0 + s as f64 + 0.5;
    check(&mut screen, &mut a, "one GPU's power moved");
    let last = screen.last_frame();
    assert_eq!((last.whole, last.blocks), (false, 1), "{last:?}");
    assert!(last.cells > 0);
}

#[test]
fn a_frame_is_sent_in_one_draw() {
    // Each `draw` of a crossterm backend ends by resetting the colours: a frame drawn piece by
    // piece must still cost one.
    let mut a = app(8);
    let (mut screen, counts) = terminal(200, 50);
    for k in 0..30usize {
        let s = SECONDS + k;
        take(&mut a, snapshot_at(8, s));
        a.data.now = T0 + s as f64 + 0.5;
        a.size = screen.draw(&a).unwrap();
    }
    let c = counts.borrow();
    assert_eq!(c.frames, 30);
    assert!(c.draws.iter().all(|&d| d <= 1), "{:?}", c.draws);
    assert!(
        c.cells[1..].iter().all(|&n| n > 0),
        "the fixture changes every second: {:?}",
        c.cells
    );
}

#[test]
fn a_frame_late_in_a_period_changes_nothing() {
    // Readings are taken some time before the snapshot that carries them reaches the console;
    // a frame drawn late in the period (an answer, a key) must not shift every sparkline by a
    // column and back on the next snapshot.
    let mut a = app(8);
    let (mut screen, counts) = terminal(200, 50);
    let last_reading = T0 + (SECONDS - 1) as f64;
    a.data.now = last_reading + 0.5;
    a.size = screen.draw(&a).unwrap();
    a.data.now = last_reading + 1.4;
    a.size = screen.draw(&a).unwrap();
    assert_eq!(
        counts.borrow().cells[1],
        0,
        "nothing moved 1.4 s after the last reading"
    );
    // Once the source is stale, the gap since its last data shows.
    a.data.now = last_reading + 6.0;
    a.size = screen.draw(&a).unwrap();
    let frame = whole(&a, a.size);
    assert_eq!(screen.backend().inner.buffer(), &frame);
    assert!(counts.borrow().cells[2] > 0);
}
