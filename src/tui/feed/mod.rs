//! Where the console's data comes from. Two sources feed the same channel of [`Update`]s, so
//! views never know which one they are drawing:
//!
//! - [`local`]: an in-process sampler (`gpupilot demo`): snapshots only, no daemon, no runs;
//! - [`daemon`]: a client of the daemon (everything else): snapshots it pushes, the history it
//!   keeps (back-filled on connect), node events, the run list and the shown run's log, polled
//!   at the refresh rate and at once on events.
//!
//! Each runs on its own thread and never blocks the event loop. The console asks for what needs
//! the daemon (stop a run, tail another one) with a [`Request`] on the feed's request channel;
//! the answers come back as updates. Dropping the [`Feed`] ends the thread (and, for a daemon,
//! closes the connection: the daemon and its runs go on).

pub mod daemon;
pub mod local;

use crate::client::Client;
use crate::history::{Metric, Point};
use crate::protocol::{LogStream, NodeEventRecord, RunInfo};
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
    /// The daemon's history of one GPU's series, oldest first (on connect, before the first
    /// snapshot): the charts show the past at once.
    History {
        gpu: usize,
        metric: Metric,
        points: Vec<Point>,
    },
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
    /// The answer to a request, for the footer.
    Answer {
        ok: bool,
        text: String,
    },
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
}

/// A running source: updates come in on `updates`; requests go out on `requests`.
pub struct Feed {
    pub updates: mpsc::Receiver<Update>,
    pub requests: crossbeam_channel::Sender<Request>,
}

/// What to start a feed from.
pub enum DataSource {
    /// Sample this source in-process (the demo).
    Local(Arc<dyn Source>),
    /// Be a client of this daemon.
    Daemon(Client),
}

impl DataSource {
    /// Start the feed's thread; `refresh` is how often it samples (local) or polls (daemon),
    /// and the most snapshots per second it passes on.
    pub fn start(self, refresh: Duration) -> Feed {
        match self {
            DataSource::Local(s) => local::start(s, refresh),
            DataSource::Daemon(c) => daemon::start(c, refresh),
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
    (tx, rx, Feed { updates, requests })
}
