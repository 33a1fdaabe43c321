//! Passing snapshots on to the console, from the feed's thread or straight from the client's
//! reader thread.
//!
//! A snapshot that needs nothing of the feed (no poll falls due with it, and a refresh has
//! passed since the last one went) goes from the thread that read it straight to the event
//! loop: one thread woken per snapshot instead of two. Any other goes through the feed as
//! before, which polls first or holds it back. Both paths decide here, under one lock, so a
//! snapshot never overtakes a newer one and the console gets at most one per refresh.

use super::super::Update;
use crate::telemetry::Snapshot;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What became of a snapshot offered to [`Pass::offer`].
pub(super) enum Offer {
    /// Passed on (or dropped because the console is behind: the next one supersedes it).
    Sent,
    /// Not yet: a refresh has not passed since the last one. The feed holds it back; the
    /// reader gives it to the feed to hold.
    Held(Box<Snapshot>),
    /// Older than one already passed on: dropped.
    Stale,
    /// The reader's snapshot goes through the feed (a poll is due with it).
    ToFeed(Box<Snapshot>),
    /// The console is gone.
    Closed,
}

/// Shared by the feed's thread and the client's reader thread (see the module doc).
pub(super) struct Pass {
    tx: mpsc::Sender<Update>,
    refresh: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When a snapshot was last passed on.
    last_sent: Option<Instant>,
    /// The time of the newest snapshot passed on (since the connection).
    newest: Option<f64>,
    /// When the feed polls next (its answers go before the snapshot they come with).
    poll_due: Option<Instant>,
}

/// Which thread offers the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Via {
    Feed,
    Reader,
}

/// What to do with a snapshot of time `time_s` offered by `from` at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Send,
    Hold,
    Stale,
    ToFeed,
}

impl State {
    fn verdict(&self, time_s: f64, from: Via, now: Instant, refresh: Duration) -> Verdict {
        if self.newest.is_some_and(|t| time_s <= t) {
            return Verdict::Stale;
        }
        // A poll due within half a refresh goes first, so that its answers reach the console
        // just before the snapshot they go with: one frame for both.
        if from == Via::Reader && self.poll_due.is_some_and(|t| t <= now + refresh / 2) {
            return Verdict::ToFeed;
        }
        let due = self
            .last_sent
            .is_none_or(|t| now.saturating_duration_since(t) >= refresh.mul_f64(0.8));
        match (due, from) {
            (true, _) => Verdict::Send,
            (false, Via::Feed) => Verdict::Hold,
            (false, Via::Reader) => Verdict::ToFeed,
        }
    }
}

impl Pass {
    pub(super) fn new(tx: mpsc::Sender<Update>, refresh: Duration) -> Arc<Pass> {
        Arc::new(Pass {
            tx,
            refresh,
            state: Mutex::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pass `snap` on now, or say why not.
    pub(super) fn offer(&self, snap: Box<Snapshot>, from: Via) -> Offer {
        let now = Instant::now();
        let mut state = self.state();
        match state.verdict(snap.time_s, from, now, self.refresh) {
            Verdict::Stale => Offer::Stale,
            Verdict::Hold => Offer::Held(snap),
            Verdict::ToFeed => Offer::ToFeed(snap),
            Verdict::Send => {
                state.last_sent = Some(now);
                state.newest = Some(snap.time_s);
                match self.tx.try_send(Update::Snapshot(snap)) {
                    Err(mpsc::error::TrySendError::Closed(_)) => Offer::Closed,
                    // A console that is behind skips a snapshot; the next supersedes it.
                    _ => Offer::Sent,
                }
            }
        }
    }

    /// When the last snapshot was passed on.
    pub(super) fn last_sent(&self) -> Option<Instant> {
        self.state().last_sent
    }

    /// The feed polls next at `at`.
    pub(super) fn set_poll_due(&self, at: Instant) {
        self.state().poll_due = Some(at);
    }

    /// A new connection: its snapshots are not compared with the last one's.
    pub(super) fn reset(&self) {
        let mut state = self.state();
        state.newest = None;
        state.poll_due = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Duration = Duration::from_secs(1);

    #[test]
    fn a_snapshot_goes_straight_on_when_nothing_is_due() {
        let now = Instant::now();
        let s = State {
            last_sent: Some(now - R),
            newest: Some(10.0),
            poll_due: Some(now + 5 * R),
        };
        assert_eq!(s.verdict(11.0, Via::Reader, now, R), Verdict::Send);
        assert_eq!(s.verdict(11.0, Via::Feed, now, R), Verdict::Send);
        assert_eq!(
            State::default().verdict(1.0, Via::Reader, now, R),
            Verdict::Send
        );
    }

    #[test]
    fn the_feed_takes_a_snapshot_that_comes_with_a_poll_or_too_soon() {
        let now = Instant::now();
        let polling = State {
            last_sent: Some(now - R),
            newest: Some(10.0),
            poll_due: Some(now + R / 4),
        };
        assert_eq!(polling.verdict(11.0, Via::Reader, now, R), Verdict::ToFeed);
        // The feed passes it on once it has polled.
        assert_eq!(polling.verdict(11.0, Via::Feed, now, R), Verdict::Send);
        let soon = State {
            last_sent: Some(now - R / 2),
            newest: Some(10.0),
            poll_due: None,
        };
        assert_eq!(soon.verdict(10.5, Via::Reader, now, R), Verdict::ToFeed);
        assert_eq!(soon.verdict(10.5, Via::Feed, now, R), Verdict::Hold);
    }

    #[test]
    fn a_snapshot_never_overtakes_a_newer_one() {
        let now = Instant::now();
        let s = State {
            last_sent: Some(now - 2 * R),
            newest: Some(10.0),
            poll_due: None,
        };
        assert_eq!(s.verdict(10.0, Via::Feed, now, R), Verdict::Stale);
        assert_eq!(s.verdict(9.0, Via::Reader, now, R), Verdict::Stale);
    }

    #[test]
    fn offers_pass_on_and_record_what_went() {
        let (tx, mut rx) = mpsc::channel(4);
        let pass = Pass::new(tx, R);
        let snap = |t: f64| {
            Box::new(Snapshot {
                time_s: t,
                ..Snapshot::default()
            })
        };
        assert!(matches!(pass.offer(snap(1.0), Via::Reader), Offer::Sent));
        assert!(pass.last_sent().is_some());
        assert!(matches!(rx.try_recv(), Ok(Update::Snapshot(s)) if s.time_s == 1.0));
        // Too soon: the reader leaves it to the feed, which holds it.
        assert!(matches!(
            pass.offer(snap(2.0), Via::Reader),
            Offer::ToFeed(_)
        ));
        assert!(matches!(pass.offer(snap(2.0), Via::Feed), Offer::Held(_)));
        assert!(matches!(pass.offer(snap(0.5), Via::Feed), Offer::Stale));
        pass.reset();
        drop(rx);
        let gone = Pass::new(mpsc::channel(1).0, R);
        assert!(matches!(gone.offer(snap(3.0), Via::Feed), Offer::Closed));
    }
}
