//! The event loop: terminal input, the feed's updates and the clock, on one tokio task.
//!
//! It redraws only when something changed (new data, an action, a resize, staleness or a
//! status expiring), after draining every queued event, and never more often than the frame
//! cap, through a [`Screen`] that sends the terminal only the cells that changed (and, on the
//! overview, draws only the GPU blocks that changed). Between those it sleeps: the clock wakes it only when the source may have turned
//! stale or the footer message may have expired ([`Data::next_change_s`]). ratatui diffs each frame against the last, so only changed cells reach the terminal;
//! the whole screen is cleared and redrawn only when the user asks (`Ctrl-L`).
//!
//! Requests the app makes (stop a run, tail another one) are handed to `send` as soon as the
//! action or update that made them is applied.
//!
//! The loop is generic over the backend, the input stream, the updates and the clock so that
//! tests drive it with `TestBackend`, channels and paused tokio time.

use super::app::App;
#[cfg(doc)]
use super::data::Data;
use super::feed::{Request, Update};
use super::screen::Screen;
use crossterm::event::Event;
use futures::{Stream, StreamExt, future::poll_immediate};
use ratatui::backend::Backend;
use ratatui::layout::Rect;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

/// The shortest time between two frames (20 per second): holding a key down redraws at most
/// this often, however fast the terminal repeats it.
pub const FRAME_CAP: Duration = Duration::from_millis(50);

/// How long a frame caused by data other than a snapshot waits for more data: the answers to
/// the console's polls arrive a few milliseconds apart, and the feed sends them just before
/// the snapshot they go with; one frame for all of them costs half as much as one each. A
/// snapshot is drawn at once (with whatever came before it), as is input.
pub const DATA_SETTLE: Duration = Duration::from_millis(100);

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The user quit.
    Quit,
    /// The terminal input closed (the terminal went away).
    InputClosed,
}

/// Handle one terminal event; true when the screen must be redrawn.
pub fn handle_event(app: &mut App, ev: &Event) -> bool {
    let action = match ev {
        Event::Key(k) => app.action_for_key(k),
        Event::Mouse(m) => app.action_for_mouse(m),
        Event::Resize(w, h) => {
            app.size = Rect::new(0, 0, *w, *h);
            return true;
        }
        Event::FocusGained => return true,
        _ => None,
    };
    match action {
        Some(a) => {
            app.apply(a);
            true
        }
        None => false,
    }
}

/// Run until the user quits or the input closes. `updates` are the feed's (snapshots, runs,
/// logs, …); `clock` gives the time of each frame (seconds since the epoch); `tick` is how
/// often the header's count of seconds moves while the source is stale; `send` takes the
/// app's requests.
pub async fn run<B, S, U>(
    terminal: &mut Screen<B>,
    app: &mut App,
    mut updates: mpsc::Receiver<U>,
    mut events: S,
    clock: impl Fn() -> f64,
    tick: Duration,
    mut send: impl FnMut(Request),
) -> anyhow::Result<Exit>
where
    B: Backend,
    B::Error: Send + Sync + 'static,
    S: Stream<Item = std::io::Result<Event>> + Unpin,
    U: Into<Update>,
{
    let tick_s = tick.max(Duration::from_millis(100)).as_secs_f64();
    let mut dirty = true;
    // When the only reason to draw is data, the time the first of it came.
    let mut data_since: Option<Instant> = None;
    let mut last_frame: Option<Instant> = None;
    let mut updates_open = true;
    loop {
        for r in app.take_requests() {
            send(r);
        }
        if app.quit {
            return Ok(Exit::Quit);
        }
        let capped = last_frame.map_or_else(Instant::now, |t| t + FRAME_CAP);
        let due = data_since.map_or(capped, |t| capped.max(t + DATA_SETTLE));
        if dirty && Instant::now() >= due {
            app.data.now = clock();
            if std::mem::take(&mut app.full_redraw) {
                terminal.clear().map_err(anyhow::Error::new)?;
            }
            // The frame's area is the terminal's size (the screen resizes before drawing):
            // keep it for mouse hit-testing without asking the terminal again.
            app.size = terminal.draw(app).map_err(anyhow::Error::new)?;
            dirty = false;
            data_since = None;
            last_frame = Some(Instant::now());
        }
        let frame_timer = async {
            if dirty {
                sleep_until(due).await
            } else {
                std::future::pending().await
            }
        };
        let check_at = app.data.next_change_s(tick_s).map(|at| {
            // An hour at most: a clock set back meanwhile costs one needless check.
            Instant::now() + Duration::from_secs_f64((at - clock()).clamp(0.0, 3600.0))
        });
        let clock_timer = async {
            match check_at {
                Some(t) => sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = events.next() => {
                let Some(ev) = ev else { return Ok(Exit::InputClosed) };
                if handle_event(app, &ev?) {
                    dirty = true;
                    data_since = None;
                }
                // Drain what is already queued, so a burst (a held key, a paste, wheel
                // spinning) costs one frame.
                while !app.quit {
                    let Some(next) = poll_immediate(events.next()).await else { break };
                    let Some(ev) = next else { return Ok(Exit::InputClosed) };
                    if handle_event(app, &ev?) {
                        dirty = true;
                        data_since = None;
                    }
                }
            }
            u = updates.recv(), if updates_open => match u {
                Some(u) => {
                    // The first data is drawn at once: it is what the user waits for.
                    let mut settle = app.data.snapshot.is_some();
                    app.data.now = clock();
                    let mut take = |u: Update| {
                        settle &= !matches!(u, Update::Snapshot(_));
                        app.on_update(u);
                    };
                    take(u.into());
                    while let Ok(u) = updates.try_recv() {
                        take(u.into());
                    }
                    if !settle {
                        data_since = None;
                    } else if !dirty {
                        data_since = Some(Instant::now());
                    }
                    dirty = true;
                }
                None => updates_open = false,
            },
            _ = clock_timer => {
                let before = (app.data.source_stale(), app.data.visible_status().cloned());
                app.data.now = clock();
                let after = (app.data.source_stale(), app.data.visible_status().cloned());
                // While stale, the header counts the seconds since the last data.
                dirty |= after.0 || before != after;
            }
            _ = frame_timer => {}
        }
    }
}
