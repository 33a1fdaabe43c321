//! The event loop on a counting TestBackend with paused tokio time: a burst of input costs one
//! frame, frames are capped, only changed cells are sent, Ctrl-L clears once, new data redraws,
//! and quitting or losing the input ends the loop.

use crate::support::tui::{Counting, Counts, SECONDS, T0, app, run_info, snapshot_at, terminal};
use crossterm::event::{
    Event, KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use futures::channel::mpsc::{UnboundedSender, unbounded};
use gpupilot::supervisor::RunStatus;
use gpupilot::tui::event_loop::{self, Exit, FRAME_CAP};
use gpupilot::tui::feed::{Request, Update};
use gpupilot::tui::screen::Screen;
use gpupilot::tui::{App, ViewId};
use ratatui::buffer::Cell;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;
use tokio::sync::mpsc;

fn key(c: char) -> std::io::Result<Event> {
    Ok(Event::Key(KeyEvent::new(
        KeyCode::Char(c),
        KeyModifiers::NONE,
    )))
}

fn ctrl(c: char) -> std::io::Result<Event> {
    Ok(Event::Key(KeyEvent::new(
        KeyCode::Char(c),
        KeyModifiers::CONTROL,
    )))
}

fn screen(term: &Screen<Counting>) -> String {
    let buf = term.backend().inner.buffer();
    buf.content().iter().map(Cell::symbol).collect()
}

fn clock() -> f64 {
    T0 + SECONDS as f64 - 0.5
}

type Input = UnboundedSender<std::io::Result<Event>>;

/// Run the loop on `app` while `drive` sends input; returns the exit, the app and the terminal.
async fn run_with<F, Fut>(
    mut app: App,
    w: u16,
    h: u16,
    drive: F,
) -> (Exit, App, Screen<Counting>, Rc<RefCell<Counts>>)
where
    F: FnOnce(Input, mpsc::Sender<Update>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (mut term, counts) = terminal(w, h);
    let (tx, rx) = unbounded();
    let (snap_tx, snap_rx) = mpsc::channel(4);
    let driver = drive(tx, snap_tx);
    let run = event_loop::run(
        &mut term,
        &mut app,
        snap_rx,
        rx,
        clock,
        Duration::from_secs(1),
        |_| {},
    );
    let (exit, ()) = tokio::join!(run, driver);
    (exit.unwrap(), app, term, counts)
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_keys_costs_one_frame() {
    let (exit, app, term, counts) = run_with(app(4), 200, 50, |tx, _snaps| async move {
        for _ in 0..200 {
            tx.unbounded_send(key('j')).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        tx.unbounded_send(key('q')).unwrap();
    })
    .await;
    assert_eq!(exit, Exit::Quit);
    assert_eq!(app.selected, 3, "200 × j stops at the last GPU");
    let c = counts.borrow();
    assert_eq!(
        c.frames, 2,
        "the first frame, then one for the whole burst: {c:?}"
    );
    assert!(
        c.cells[0] > 200 * 50 / 2,
        "the first frame fills the screen: {c:?}"
    );
    assert!(
        c.cells[1] < c.cells[0] / 10,
        "the second frame sends only changed cells: {c:?}"
    );
    assert_eq!(c.clears, 0, "no clear() per frame");
    assert!(screen(&term).contains("selected: GPU 3"));
}

#[tokio::test(start_paused = true)]
async fn frames_are_capped_and_ctrl_l_clears_once() {
    let start = tokio::time::Instant::now();
    let (exit, _app, _term, counts) = run_with(app(4), 80, 24, |tx, _snaps| async move {
        // One key every 10 ms for a second: at most one frame per FRAME_CAP.
        for i in 0..100 {
            tx.unbounded_send(key(if i % 2 == 0 { 'j' } else { 'k' }))
                .unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tx.unbounded_send(ctrl('l')).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        tx.unbounded_send(key('q')).unwrap();
    })
    .await;
    assert_eq!(exit, Exit::Quit);
    let elapsed = start.elapsed();
    let c = counts.borrow();
    let cap = (elapsed.as_millis() / FRAME_CAP.as_millis()) as usize + 2;
    assert!(
        c.frames <= cap,
        "{} frames in {elapsed:?} (cap {cap})",
        c.frames
    );
    assert!(c.frames >= 10, "input was drawn: {c:?}");
    assert_eq!(c.clears, 1, "Ctrl-L clears exactly once");
}

#[tokio::test(start_paused = true)]
async fn new_data_redraws_and_views_switch() {
    let mut a = app(4);
    a.data.snapshot = None;
    let (exit, app, term, counts) = run_with(a, 200, 50, |tx, snaps| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        snaps
            .send(snapshot_at(4, SECONDS - 1).into())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.unbounded_send(Ok(Event::Key(KeyEvent::new(
            KeyCode::Tab,
            KeyModifiers::NONE,
        ))))
        .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.unbounded_send(key('?')).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A click outside the help does nothing while it is open; Esc closes it.
        tx.unbounded_send(Ok(Event::Mouse(MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column: 5,
            row: 2,
            modifiers: KeyModifiers::NONE,
        })))
        .unwrap();
        tx.unbounded_send(Ok(Event::Key(KeyEvent::new(
            KeyCode::Esc,
            KeyModifiers::NONE,
        ))))
        .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.unbounded_send(Ok(Event::Resize(120, 40))).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.unbounded_send(key('q')).unwrap();
    })
    .await;
    assert_eq!(exit, Exit::Quit);
    assert_eq!(app.view, ViewId::Detail);
    assert!(!app.help.open);
    let c = counts.borrow();
    assert!(
        c.frames >= 5,
        "a frame for the data, the view, the help, its closing, the resize: {c:?}"
    );
    let s = screen(&term);
    assert!(
        s.contains("Utilization") && s.contains("gpu-node-07"),
        "{s}"
    );
}

#[tokio::test(start_paused = true)]
async fn data_arriving_together_costs_one_frame_and_input_does_not_wait() {
    let start = tokio::time::Instant::now();
    // All within the first second, long before the source could turn stale.
    let (exit, _app, _term, counts) = run_with(app(4), 200, 50, |tx, snaps| async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Answers to the console's polls and, a few milliseconds later, the snapshot they go
        // with (the feed sends them in that order): one frame, at the snapshot.
        snaps.send(Update::Runs(vec![])).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        snaps.send(snapshot_at(4, SECONDS).into()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        // A key right after data draws at once (within the frame cap), data and all, not
        // after the settle.
        snaps.send(Update::Runs(vec![])).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.unbounded_send(key('j')).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        tx.unbounded_send(key('q')).unwrap();
    })
    .await;
    assert_eq!(exit, Exit::Quit);
    let c = counts.borrow();
    assert_eq!(
        c.frames, 3,
        "first frame, one for both pieces of data, one for data and key together: {c:?}"
    );
    assert!(start.elapsed() >= Duration::from_millis(600));
}

#[tokio::test(start_paused = true)]
async fn a_snapshot_is_drawn_at_once_and_other_data_settles() {
    let (exit, _app, _term, counts) = run_with(app(4), 200, 50, |tx, snaps| async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        snaps.send(snapshot_at(4, SECONDS).into()).await.unwrap();
        // Quit before the settle would have let the snapshot through.
        tokio::time::sleep(Duration::from_millis(5)).await;
        tx.unbounded_send(key('q')).unwrap();
    })
    .await;
    assert_eq!(exit, Exit::Quit);
    assert_eq!(
        counts.borrow().frames,
        2,
        "the first frame, then the snapshot"
    );

    let (exit, _app, _term, counts) = run_with(app(4), 200, 50, |tx, snaps| async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        snaps.send(Update::Runs(vec![])).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        tx.unbounded_send(key('q')).unwrap();
    })
    .await;
    assert_eq!(exit, Exit::Quit);
    assert_eq!(counts.borrow().frames, 1, "the answers wait for the settle");
}

#[tokio::test(start_paused = true)]
async fn the_first_snapshot_is_drawn_at_once() {
    let mut a = app(4);
    a.data.snapshot = None;
    let (exit, _app, term, counts) = run_with(a, 200, 50, |tx, snaps| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        snaps
            .send(snapshot_at(4, SECONDS - 1).into())
            .await
            .unwrap();
        // Quit well before DATA_SETTLE would have let a data frame through.
        tokio::time::sleep(Duration::from_millis(30)).await;
        tx.unbounded_send(key('q')).unwrap();
    })
    .await;
    assert_eq!(exit, Exit::Quit);
    assert_eq!(counts.borrow().frames, 2, "the empty frame, then the data");
    assert!(screen(&term).contains("gpu-node-07"));
}

#[tokio::test(start_paused = true)]
async fn the_loop_ends_when_the_input_closes() {
    let (exit, _app, _term, counts) = run_with(app(2), 80, 24, |tx, _snaps| async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(tx);
    })
    .await;
    assert_eq!(exit, Exit::InputClosed);
    // Nothing changed in three seconds: one frame, no redraw on the idle ticks.
    assert_eq!(counts.borrow().frames, 1);
}

#[tokio::test(start_paused = true)]
async fn a_source_going_quiet_is_noticed_without_input() {
    let (mut term, counts) = terminal(200, 50);
    let mut a = app(4);
    let (tx, rx) = unbounded::<std::io::Result<Event>>();
    let (_snap_tx, snap_rx) = mpsc::channel::<gpupilot::telemetry::Snapshot>(4);
    let start = tokio::time::Instant::now();
    // The clock runs with tokio's paused time, so the last snapshot ages.
    let clock = move || T0 + SECONDS as f64 - 0.5 + start.elapsed().as_secs_f64();
    let driver = async move {
        tokio::time::sleep(Duration::from_secs(6)).await;
        tx.unbounded_send(key('q')).unwrap();
    };
    let run = event_loop::run(
        &mut term,
        &mut a,
        snap_rx,
        rx,
        clock,
        Duration::from_secs(1),
        |_| {},
    );
    let (exit, ()) = tokio::join!(run, driver);
    assert_eq!(exit.unwrap(), Exit::Quit);
    assert!(
        screen(&term).contains("STALE: no data for"),
        "{}",
        screen(&term)
    );
    assert!(counts.borrow().frames >= 2);
}

#[tokio::test(start_paused = true)]
async fn an_idle_loop_sleeps_until_the_source_could_turn_stale() {
    let (mut term, _counts) = terminal(200, 50);
    let mut a = app(4);
    let (tx, rx) = unbounded::<std::io::Result<Event>>();
    let (_snap_tx, snap_rx) = mpsc::channel::<gpupilot::telemetry::Snapshot>(4);
    let start = tokio::time::Instant::now();
    // Every look at the clock is counted: the loop looks each time it wakes.
    let looks = Rc::new(std::cell::Cell::new(0u32));
    let counted = Rc::clone(&looks);
    let clock = move || {
        counted.set(counted.get() + 1);
        T0 + SECONDS as f64 - 0.5 + start.elapsed().as_secs_f64()
    };
    let driver = async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = looks.get();
        // The last snapshot turns stale 3 s after it was taken, about 2.5 s from the start.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(looks.get(), before, "no wake-up while nothing can change");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(looks.get() > before, "woken when the source turned stale");
        tx.unbounded_send(key('q')).unwrap();
    };
    let run = event_loop::run(
        &mut term,
        &mut a,
        snap_rx,
        rx,
        clock,
        Duration::from_secs(1),
        |_| {},
    );
    let (exit, ()) = tokio::join!(run, driver);
    assert_eq!(exit.unwrap(), Exit::Quit);
    assert!(screen(&term).contains("STALE: no data for"));
}

#[tokio::test(start_paused = true)]
async fn requests_reach_the_feed_and_answers_reach_the_footer() {
    let (mut term, _counts) = terminal(120, 30);
    let mut a = app(4);
    let (tx, rx) = unbounded::<std::io::Result<Event>>();
    let (up_tx, up_rx) = mpsc::channel::<Update>(8);
    let sent = Rc::new(RefCell::new(Vec::new()));
    let id = "20231114-220820-train";
    let driver = async move {
        up_tx
            .send(Update::Runs(vec![run_info(id, RunStatus::Running)]))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        for c in ['3', 's'] {
            tx.unbounded_send(key(c)).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.unbounded_send(key('y')).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        up_tx
            .send(Update::Answer {
                ok: true,
                text: format!("run {id}: stopping"),
            })
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        tx.unbounded_send(key('q')).unwrap();
    };
    let log = Rc::clone(&sent);
    let run = event_loop::run(
        &mut term,
        &mut a,
        up_rx,
        rx,
        clock,
        Duration::from_secs(1),
        move |r| log.borrow_mut().push(r),
    );
    let (exit, ()) = tokio::join!(run, driver);
    assert_eq!(exit.unwrap(), Exit::Quit);
    assert_eq!(
        *sent.borrow(),
        [Request::Watch(id.into()), Request::Stop(id.into())],
        "the run's log was asked for, then the stop after y"
    );
    let s = screen(&term);
    assert!(s.contains("stopping"), "the answer is in the footer: {s}");
}
