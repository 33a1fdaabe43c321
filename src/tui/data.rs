//! What the views draw from: the newest snapshot, the history of every series, the time of the
//! frame and the status message. Filled by the event loop (or by tests, by hand); read by
//! render. Nothing here reads a clock: `now` is set from outside so that frames are
//! reproducible.

use crate::history::History;
use crate::telemetry::{GpuSample, Snapshot};
use std::time::Duration;

/// How long an info message stays in the footer; errors stay longer, they matter more.
const INFO_TTL_S: f64 = 5.0;
const ERROR_TTL_S: f64 = 60.0;

/// A message for the footer.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub text: String,
    pub level: Level,
    /// When it was posted (seconds since the epoch).
    pub at: f64,
}

/// How loud a status message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Error,
}

/// The data every view reads.
#[derive(Debug, Clone)]
pub struct Data {
    /// The newest snapshot; `None` until the first one arrives.
    pub snapshot: Option<Snapshot>,
    pub history: History,
    /// Time of the frame being drawn, seconds since the epoch.
    pub now: f64,
    /// The sampling interval: what "fresh" means, and one sparkline column.
    pub refresh: Duration,
    pub status: Option<Status>,
    /// Time of the first snapshot taken in: the history holds nothing older, so trends do
    /// not reach back past it (where the history would answer from coarse buckets).
    pub since: Option<f64>,
    /// The last name each GPU reported: a lost GPU reports none, but is still "the H100 in
    /// slot 3" to the person looking.
    names: Vec<Option<String>>,
}

impl Data {
    pub fn new(refresh: Duration) -> Data {
        Data {
            snapshot: None,
            history: History::default(),
            now: 0.0,
            refresh,
            status: None,
            since: None,
            names: Vec::new(),
        }
    }

    /// Take in a new snapshot.
    pub fn on_snapshot(&mut self, snap: Snapshot) {
        self.history.record(&snap);
        if self.since.is_none() {
            let first = snap
                .gpus
                .iter()
                .filter(|g| !g.lost && !g.stale)
                .map(|g| g.time_s);
            self.since = Some(first.fold(snap.time_s, f64::min));
        }
        for (i, g) in snap.gpus.iter().enumerate() {
            if self.names.len() <= i {
                self.names.resize(i + 1, None);
            }
            if g.name.is_some() {
                self.names[i].clone_from(&g.name);
            }
        }
        self.snapshot = Some(snap);
    }

    /// The GPU's name, or the last one it reported.
    pub fn name(&self, i: usize) -> Option<&str> {
        self.gpu(i)
            .and_then(|g| g.name.as_deref())
            .or_else(|| self.names.get(i)?.as_deref())
    }

    pub fn gpus(&self) -> &[GpuSample] {
        self.snapshot.as_ref().map_or(&[], |s| &s.gpus)
    }

    pub fn gpu(&self, i: usize) -> Option<&GpuSample> {
        self.gpus().get(i)
    }

    /// Refresh interval in seconds (at least 10 ms, so divisions stay sane).
    pub fn refresh_s(&self) -> f64 {
        self.refresh.as_secs_f64().max(0.01)
    }

    /// The source has sent nothing for three intervals (at least 2 s): whatever is on screen
    /// is old.
    pub fn source_stale(&self) -> bool {
        match &self.snapshot {
            None => false,
            Some(s) => self.now - s.time_s > (3.0 * self.refresh_s()).max(2.0),
        }
    }

    /// Post a footer message.
    pub fn set_status(&mut self, level: Level, text: impl Into<String>) {
        self.status = Some(Status {
            text: text.into(),
            level,
            at: self.now,
        });
    }

    /// The message to show now, if any has not expired.
    pub fn visible_status(&self) -> Option<&Status> {
        self.status.as_ref().filter(|s| {
            let ttl = match s.level {
                Level::Info => INFO_TTL_S,
                Level::Error => ERROR_TTL_S,
            };
            self.now - s.at < ttl
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staleness_and_status_follow_the_frame_clock() {
        let mut d = Data::new(Duration::from_secs(1));
        assert!(!d.source_stale(), "nothing yet is not stale");
        d.on_snapshot(Snapshot {
            time_s: 100.0,
            ..Default::default()
        });
        d.now = 101.0;
        assert!(!d.source_stale());
        d.now = 104.0;
        assert!(d.source_stale());

        d.set_status(Level::Info, "hello");
        d.now = 108.0;
        assert_eq!(d.visible_status().map(|s| s.text.as_str()), Some("hello"));
        d.now = 110.0;
        assert_eq!(d.visible_status(), None);
        d.set_status(Level::Error, "bad theme");
        d.now = 160.0;
        assert!(d.visible_status().is_some());
    }
}
