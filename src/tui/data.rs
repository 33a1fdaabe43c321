//! What the views draw from: the newest snapshot, the history of every series, the runs, the
//! shown run's log, the node's events, who is on the other end, the time of the frame and the
//! status message. Filled from the feed's updates by the event loop (or by tests, by hand);
//! read by render. Nothing here reads a clock: `now` is set from outside so that frames are
//! reproducible.

use super::feed::{Link, Update};
use super::log::LogBuffer;
use super::metrics::RunMetrics;
use crate::history::{History, HistoryConfig};
use crate::protocol::{LogStream, NodeEventRecord, RunInfo};
use crate::telemetry::{GpuSample, Snapshot};
use std::collections::VecDeque;
use std::time::Duration;

mod trends;
pub use trends::{Grid, Trends};

/// Node events kept (newest).
const EVENTS_KEPT: usize = super::feed::daemon::EVENTS_KEPT;

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
    /// Time of the frame being drawn, seconds since the epoch, on the console's clock.
    pub now: f64,
    /// `now` when the newest snapshot came in. The source's clock may be another machine's
    /// (a daemon over `ssh NODE gpupilot bridge`): how long ago data came is measured on the
    /// console's clock alone, never as `now` less a time the source stamped.
    received_s: f64,
    /// The sampling interval: what "fresh" means, and one sparkline column.
    pub refresh: Duration,
    pub status: Option<Status>,
    /// Time of the first snapshot taken in: the history holds nothing older, so trends do
    /// not reach back past it (where the history would answer from coarse buckets).
    pub since: Option<f64>,
    /// The last name each GPU reported: a lost GPU reports none, but is still "the H100 in
    /// slot 3" to the person looking.
    names: Vec<Option<String>>,
    /// Who is on the other end (the demo's sampler, a daemon, a daemon that went away).
    pub link: Link,
    /// Every run the daemon knows, oldest first; None until the first list came.
    pub runs: Option<Vec<RunInfo>>,
    /// The node's events, oldest first.
    pub events: VecDeque<NodeEventRecord>,
    /// The log of the run being watched.
    pub log: RunLog,
    /// The metrics and knobs of the run being watched.
    pub metrics: RunMetrics,
    /// The daemon's control loops, as last polled.
    pub control: Option<crate::control::status::ControlStatus>,
    /// What the trends drawn last were made of (see [`Trends`]).
    pub trends: Trends,
}

/// The output and exits of the run the console watches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunLog {
    /// The run's full id; None until its first chunk came.
    pub run: Option<String>,
    pub stdout: LogBuffer,
    pub stderr: LogBuffer,
    /// How each attempt ended, oldest first (`exit 1`, `killed by SIGTERM`).
    pub exits: Vec<String>,
}

impl RunLog {
    pub fn stream(&self, s: LogStream) -> &LogBuffer {
        match s {
            LogStream::Stdout => &self.stdout,
            LogStream::Stderr => &self.stderr,
        }
    }

    fn stream_mut(&mut self, s: LogStream) -> &mut LogBuffer {
        match s {
            LogStream::Stdout => &mut self.stdout,
            LogStream::Stderr => &mut self.stderr,
        }
    }

    /// Make this the log of `run` (emptied when it was another run's).
    fn of(&mut self, run: &str) -> &mut RunLog {
        if self.run.as_deref() != Some(run) {
            *self = RunLog {
                run: Some(run.to_string()),
                ..RunLog::default()
            };
        }
        self
    }
}

impl Data {
    pub fn new(refresh: Duration) -> Data {
        Data {
            snapshot: None,
            history: History::new(HistoryConfig::for_period(refresh.as_secs_f64())),
            now: 0.0,
            received_s: 0.0,
            refresh,
            status: None,
            since: None,
            names: Vec::new(),
            link: Link::Unknown,
            runs: None,
            events: VecDeque::new(),
            log: RunLog::default(),
            metrics: RunMetrics::default(),
            control: None,
            trends: Trends::default(),
        }
    }

    /// Take in one update from the feed (snapshots through [`Data::on_snapshot`]).
    pub fn on_update(&mut self, u: Update) {
        match u {
            Update::Snapshot(s) => self.on_snapshot(*s),
            Update::Backfill(series) => {
                self.history.prepend(&series);
                let first = series.iter().filter_map(|s| s.points.first()).map(|p| p.t);
                if let Some(first) = first.reduce(f64::min) {
                    self.since = Some(self.since.map_or(first, |s| s.min(first)));
                }
            }
            Update::Link(link) => {
                if let Link::Daemon { rate_hz, .. } = link {
                    // A daemon sampling slower than the console refreshes sets the pace:
                    // otherwise every snapshot would look late.
                    if rate_hz > 0.0 {
                        self.refresh = self.refresh.max(Duration::from_secs_f64(1.0 / rate_hz));
                        // Snapshots come at the daemon's rate: rings for that rate, without
                        // a tier its raw ring outreaches (written every second, never read).
                        // A history already begun keeps its rings.
                        let config = HistoryConfig::for_period(1.0 / rate_hz);
                        if self.history.is_empty() && *self.history.config() != config {
                            self.history = History::new(config);
                        }
                    }
                }
                self.link = link;
            }
            Update::Runs(runs) => self.runs = Some(runs),
            Update::Events { events, reset } => {
                if reset {
                    self.events.clear();
                }
                self.events.extend(events);
                while self.events.len() > EVENTS_KEPT {
                    self.events.pop_front();
                }
            }
            Update::Log {
                run,
                stream,
                data,
                reset,
                from_start,
            } => {
                let log = self.log.of(&run);
                if reset {
                    *log.stream_mut(stream) = LogBuffer::tail(&data, from_start);
                } else {
                    log.stream_mut(stream).push_str(&data);
                }
            }
            Update::Exits { run, exits } => self.log.of(&run).exits = exits,
            Update::Control(c) => self.control = Some(*c),
            Update::Answer { ok, text } => {
                let level = if ok { Level::Info } else { Level::Error };
                self.set_status(level, text);
            }
            Update::Metrics {
                run,
                points,
                reset,
                trainer,
            } => self.metrics.take(run, points, reset, *trainer),
            // The Run view asks about it (see `views::run::knob_dialog`).
            Update::KnobNeedsRestart { .. } => {}
            // The app's advisor pane and tuner take them (see `app/advisor.rs`, `app/tuner.rs`).
            Update::Advice(_) | Update::Tuner(_) => {}
            Update::Rewind => {
                self.snapshot = None;
                self.history = History::new(self.history.config().clone());
                self.since = None;
                self.runs = None;
                self.events.clear();
                self.metrics = RunMetrics::default();
                self.control = None;
            }
        }
    }

    /// What the GPU views say while there is no snapshot.
    pub fn no_snapshot_text(&self) -> String {
        match &self.link {
            Link::Daemon {
                telemetry_error: Some(e),
                ..
            } => format!(
                "No GPU telemetry: {e}. The daemon supervises runs all the same (3: Run)."
            ),
            Link::Gone { .. } => {
                "The daemon is gone: `gpupilot daemon --detach` starts it again; this console reconnects."
                    .into()
            }
            _ => "Waiting for the first sample…".into(),
        }
    }

    /// The runs, or none before the first list came.
    pub fn run_list(&self) -> &[RunInfo] {
        self.runs.as_deref().unwrap_or(&[])
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
        self.received_s = self.now;
        self.snapshot = Some(snap);
    }

    /// `now` on the source's clock: the newest snapshot's time, plus what the console's clock
    /// has moved since it came. What is placed against the source's times (charts, history
    /// windows) is placed with this, so that two machines' clocks that differ by seconds do
    /// not shift it.
    pub fn source_now(&self) -> f64 {
        match &self.snapshot {
            Some(s) => s.time_s + (self.now - self.received_s),
            None => self.now,
        }
    }

    /// Seconds since the newest snapshot came in (0 before the first).
    pub fn data_age_s(&self) -> f64 {
        self.snapshot
            .as_ref()
            .map_or(0.0, |_| self.now - self.received_s)
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
        if matches!(self.link, Link::Gone { .. }) {
            return self.snapshot.is_some();
        }
        self.snapshot.is_some() && self.data_age_s() > self.stale_after_s()
    }

    /// How old the newest snapshot may be before the source is shown stale.
    fn stale_after_s(&self) -> f64 {
        (3.0 * self.refresh_s()).max(2.0)
    }

    /// When (seconds since the epoch) the screen may next change without new data or input:
    /// when the source turns stale, every `every_s` while it is (the header counts the
    /// seconds), when the footer message expires. None: not before something happens.
    pub fn next_change_s(&self, every_s: f64) -> Option<f64> {
        // Just past each moment, so that the check made then sees the change.
        const PAST: f64 = 0.01;
        let stale = self.snapshot.as_ref().map(|_| {
            if self.source_stale() {
                self.now + every_s
            } else {
                self.received_s + self.stale_after_s() + PAST
            }
        });
        let expiry = self.visible_status().map(|s| {
            s.at + match s.level {
                Level::Info => INFO_TTL_S,
                Level::Error => ERROR_TTL_S,
            } + PAST
        });
        match (stale, expiry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
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
        d.now = 100.0;
        d.on_snapshot(Snapshot {
            time_s: 100.0,
            ..Default::default()
        });
        d.now = 101.0;
        assert!(!d.source_stale());
        assert_eq!(d.next_change_s(1.0), Some(103.01));
        d.now = 104.0;
        assert!(d.source_stale());
        assert_eq!(d.data_age_s(), 4.0);

        d.set_status(Level::Info, "hello");
        d.now = 108.0;
        assert_eq!(d.visible_status().map(|s| s.text.as_str()), Some("hello"));
        d.now = 110.0;
        assert_eq!(d.visible_status(), None);
        d.set_status(Level::Error, "bad theme");
        d.now = 160.0;
        assert!(d.visible_status().is_some());
    }

    /// A daemon on another machine stamps snapshots with its own clock: seconds apart from
    /// the console's, either way, change neither when data is stale nor where the charts
    /// place the source's times.
    #[test]
    fn a_source_whose_clock_differs_is_stale_only_when_its_data_stops() {
        for skew in [-30.0, -5.0, 5.0, 30.0] {
            let mut d = Data::new(Duration::from_secs(1));
            for i in 0..5 {
                d.now = 1000.0 + f64::from(i);
                d.on_snapshot(Snapshot {
                    time_s: d.now + skew,
                    ..Default::default()
                });
                d.now += 0.9;
                assert!(!d.source_stale(), "skew {skew} s: fresh data shown stale");
                assert_eq!(d.source_now(), d.now + skew, "skew {skew} s");
            }
            d.now += 2.5;
            assert!(d.source_stale(), "skew {skew} s: data stopped 3.4 s ago");
            assert!((d.data_age_s() - 3.4).abs() < 1e-9, "skew {skew} s");
        }
    }

    /// The console's rings follow the rate snapshots come at: the daemon's, once it says.
    #[test]
    fn the_history_has_the_rings_of_the_daemons_rate() {
        let daemon = |rate_hz| {
            Update::Link(Link::Daemon {
                pid: 1,
                readonly: false,
                telemetry_error: None,
                rate_hz,
            })
        };
        let mut d = Data::new(Duration::from_secs(1));
        assert_eq!(*d.history.config(), HistoryConfig::for_period(1.0));
        d.on_update(daemon(10.0));
        assert_eq!(*d.history.config(), HistoryConfig::for_period(0.1));
        assert_eq!(d.history.config().tiers.len(), 3, "10 Hz: the 1 s tier too");
        // Begun: a daemon of another rate (a reconnect) leaves it as it is.
        d.on_snapshot(Snapshot {
            time_s: 100.0,
            gpus: vec![GpuSample {
                index: 0,
                time_s: 100.0,
                power_w: Some(300.0),
                ..Default::default()
            }],
            ..Default::default()
        });
        d.on_update(daemon(1.0));
        assert_eq!(*d.history.config(), HistoryConfig::for_period(0.1));
        assert!(d.history.last(0, crate::history::Metric::Power).is_some());
        // A rewind empties it with the same rings.
        d.on_update(Update::Rewind);
        assert!(d.history.is_empty());
        assert_eq!(*d.history.config(), HistoryConfig::for_period(0.1));
    }

    /// The daemon's history comes after the first snapshot (which is drawn without waiting
    /// for it): the charts get the past, and the samples taken in meanwhile stay.
    #[test]
    fn a_backfill_after_the_first_snapshots_goes_in_front_of_them() {
        use crate::history::{Metric, Point, SeriesPoints};
        let snap = |t: f64, w: f64| Snapshot {
            time_s: t,
            gpus: vec![GpuSample {
                index: 0,
                time_s: t,
                power_w: Some(w),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut d = Data::new(Duration::from_secs(1));
        d.on_snapshot(snap(100.0, 300.0));
        d.on_snapshot(snap(101.0, 310.0));
        let id = d.history.id();
        // The daemon's past up to the first snapshot: two points of power, one at the time of
        // the console's first sample (the console's own stands), and one of a series the
        // console has not had yet.
        let point = |t: f64, mean: f64| Point {
            t,
            min: mean,
            max: mean,
            mean,
        };
        d.on_update(Update::Backfill(vec![
            SeriesPoints {
                gpu: 0,
                metric: Metric::Power,
                points: vec![point(97.5, 250.0), point(98.5, 260.0), point(100.0, 1.0)],
            },
            SeriesPoints {
                gpu: 0,
                metric: Metric::Temperature,
                points: vec![point(96.5, 60.0)],
            },
        ]));
        assert_ne!(
            d.history.id(),
            id,
            "a history filled again (kept trends start over)"
        );
        let mut power = Vec::new();
        d.history
            .raw_each(0, Metric::Power, 0.0, 1e9, |t, v| power.push((t, v)));
        assert_eq!(
            power,
            [(97.5, 250.0), (98.5, 260.0), (100.0, 300.0), (101.0, 310.0)],
            "the past first, then what came after it"
        );
        assert_eq!(d.history.last(0, Metric::Temperature), Some((96.5, 60.0)));
        assert_eq!(
            d.since,
            Some(96.5),
            "the charts reach back to the oldest point"
        );
    }
}
