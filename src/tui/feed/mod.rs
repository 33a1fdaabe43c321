//! Where the console's data comes from. Two sources feed the same channel of [`Update`]s, so
//! views never know which one they are drawing:
//!
//! - [`local`]: an in-process sampler (`gpupilot demo`): snapshots only, no daemon, no runs;
//! - [`daemon`]: a client of the daemon (everything else): snapshots it pushes, the history it
//!   keeps (back-filled on connect), node events, the run list and the shown run's log, metrics
//!   and knobs, polled at the refresh rate and at once on events;
//! - [`replay`]: a recording (`gpupilot replay FILE`), played on the recording's own clock.
//!
//! Each runs on its own thread and never blocks the event loop. The console asks for what needs
//! the daemon (stop a run, tail another one) with a [`Request`] on the feed's request channel;
//! the answers come back as updates. Dropping the [`Feed`] ends the thread (and, for a daemon,
//! closes the connection: the daemon and its runs go on).

pub mod daemon;
pub mod local;
pub mod replay;

use crate::client::Client;
use crate::history::SeriesPoints;
use crate::protocol::{KnobName, LogStream, MetricsPoint, NodeEventRecord, RunInfo, TrainerInfo};
use crate::telemetry::{Snapshot, Source};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Updates held for the event loop; a source that gets ahead waits (snapshots are dropped).
const QUEUE: usize = 64;

/// Something the console should take in.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    Snapshot(Box<Snapshot>),
    /// The daemon's history of a GPU's series (or of several GPUs'), each oldest first (on
    /// connect, after the first snapshot, which is drawn without waiting for it): the charts
    /// show the past, and what came meanwhile stays (see [`crate::history::History::prepend`]).
    Backfill(Vec<SeriesPoints>),
    /// Who is on the other end.
    Link(Link),
    /// Every run the daemon knows, oldest first.
    Runs(Vec<RunInfo>),
    /// Node events, oldest first; `reset`: these replace what came before.
    Events {
        events: Vec<NodeEventRecord>,
        reset: bool,
    },
    /// More of a run's log. `reset`: a new tail (after choosing a run), replacing what came
    /// before; `from_start`: it starts at the file's first byte (else mid-file).
    Log {
        run: String,
        stream: LogStream,
        data: String,
        reset: bool,
        from_start: bool,
    },
    /// How each attempt of a run ended (`exit 1`, `killed by SIGTERM`), oldest first.
    Exits {
        run: String,
        exits: Vec<String>,
    },
    /// The control loops (governors, budget, alerts), polled with the run list.
    Control(Box<crate::control::status::ControlStatus>),
    /// The answer to a request, for the footer.
    Answer {
        ok: bool,
        text: String,
    },
    /// The watched run's metrics reports, oldest first, and where its knobs and trainer stand.
    /// `reset`: these replace what came before (a newly watched run).
    Metrics {
        run: String,
        points: Vec<MetricsPoint>,
        reset: bool,
        trainer: Box<TrainerInfo>,
    },
    /// A knob change the daemon refused because it needs a restart of the run (no trainer
    /// listens, and the command takes the value): the console asks before asking again.
    KnobNeedsRestart {
        run: String,
        knob: KnobName,
        value: i64,
        /// The daemon's words.
        text: String,
    },
    /// The advisor's hints (while its pane is open; see `daemon::advise`).
    Advice(Box<daemon::Advice>),
    /// The console's energy tuner reports (see `daemon::tune`).
    Tuner(Box<daemon::TunerEvent>),
    /// The source moved in time (a replay's seek): forget the snapshot, the history, the runs,
    /// the events and the metrics; the state at the new time follows.
    Rewind,
}

impl From<Snapshot> for Update {
    fn from(s: Snapshot) -> Update {
        Update::Snapshot(Box::new(s))
    }
}

/// What the console asks of its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Tail this run's logs (and its exits) from now on, instead of the last one.
    Watch(String),
    /// Stop the run (SIGTERM, SIGKILL after the daemon's grace period).
    Stop(String),
    Pause(String),
    Resume(String),
    /// Change a run's knob (`restart`: allow a restart when no trainer listens).
    SetKnob {
        run: String,
        knob: KnobName,
        value: i64,
        restart: bool,
    },
    /// Cap one GPU's power limit (`power_cap`), whole watts (the dialog checked the range).
    PowerCap {
        gpu: u32,
        watts: u32,
    },
    /// Restore one GPU's power limit recorded before gpupilot's first change (`power_reset`).
    PowerReset {
        gpu: u32,
    },
    /// Compute the advisor's hints every few seconds (`true`: its pane opened) or stop.
    Advise(bool),
    /// Start the energy tuner on this run (a full id), with `tune energy`'s defaults.
    TuneEnergy(String),
    /// Stop the energy tuner; the starting caps go back.
    TuneStop,
    /// A replay: pause its clock, or play on.
    ReplayPause,
    /// A replay: go this many seconds of recorded time on (or back, below zero).
    ReplaySeek(i32),
}

/// The other end of the console.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Link {
    /// Nothing heard yet.
    #[default]
    Unknown,
    /// An in-process sampler (the demo): no daemon, so no runs and no events.
    Local,
    /// A daemon answers.
    Daemon {
        pid: u32,
        readonly: bool,
        /// Why the daemon has no GPU telemetry (it supervises runs all the same).
        telemetry_error: Option<String>,
        /// Its samples per second.
        rate_hz: f64,
    },
    /// The daemon went away (its runs go on); the feed tries to reconnect.
    Gone { reason: String },
    /// A recording plays (`gpupilot replay`): nothing here changes a node.
    Replay {
        /// The file's name.
        file: String,
        /// When the recording started (seconds since the epoch).
        start_s: f64,
        speed: f64,
        paused: bool,
        /// How it ended, once the replay got there (`ends at +1:00`, `cut off at +0:42: …`).
        end: Option<String>,
    },
}

/// A running source: updates come in on `updates`; requests go out on `requests`.
pub struct Feed {
    pub updates: mpsc::Receiver<Update>,
    pub requests: crossbeam_channel::Sender<Request>,
    /// The console's energy tuner: dropping the feed stops it and waits for its caps to be
    /// back.
    pub tuner: daemon::TunerGuard,
}

/// What to start a feed from.
// One per console, made once: its size does not matter, and boxing the client would only add
// an indirection to every request.
#[allow(clippy::large_enum_variant)]
pub enum DataSource {
    /// Sample this source in-process (the demo).
    Local(Arc<dyn Source>),
    /// Be a client of this daemon.
    Daemon(Client),
    /// Play this recording.
    Replay(Box<replay::Replay>),
}

impl DataSource {
    /// Start the feed's thread; `refresh` is how often it samples (local) or polls (daemon),
    /// and the most snapshots per second it passes on.
    pub fn start(self, refresh: Duration) -> Feed {
        match self {
            DataSource::Local(s) => local::start(s, refresh),
            DataSource::Daemon(c) => daemon::start(c, refresh, None),
            DataSource::Replay(r) => replay::start(*r),
        }
    }

    /// The time the console's frames go by: the recording's for a replay, else the system's.
    pub fn clock(&self) -> Box<dyn Fn() -> f64 + Send> {
        match self {
            DataSource::Replay(r) => {
                let c = r.clock.clone();
                Box::new(move || c.now())
            }
            _ => Box::new(crate::telemetry::now_s),
        }
    }

    /// [`DataSource::start`] for a console whose event loop runs on `rt` (a current-thread
    /// runtime): a local daemon's snapshots are then read on that thread (see
    /// `daemon::pump`), which saves a thread's wake-up per snapshot.
    pub fn start_on(self, refresh: Duration, rt: &tokio::runtime::Handle) -> Feed {
        match self {
            DataSource::Local(s) => local::start(s, refresh),
            DataSource::Daemon(c) => daemon::start(c, refresh, Some(rt)),
            DataSource::Replay(r) => replay::start(*r),
        }
    }
}

fn channels() -> (
    mpsc::Sender<Update>,
    crossbeam_channel::Receiver<Request>,
    Feed,
) {
    let (tx, updates) = mpsc::channel(QUEUE);
    let (requests, rx) = crossbeam_channel::unbounded();
    let tuner = daemon::TunerGuard::default();
    (
        tx,
        rx,
        Feed {
            updates,
            requests,
            tuner,
        },
    )
}
