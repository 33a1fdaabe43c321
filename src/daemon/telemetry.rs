//! The daemon's telemetry part: the newest snapshot, which subscribers follow (a watch
//! channel: a slow one skips to the newest, never receives old ones), the history of every
//! GPU's metrics (what `history` requests read, and what a run's report copies out when it
//! ends), and what the source is.
//!
//! Fed by the sampler's thread through [`super::Daemon::take_snapshot`]: a snapshot goes into
//! history first, then to the control loops, then out to subscribers. The history's lock is
//! held only for one snapshot's appends or one window's read, and never with another lock.
//!
//! It also tells which XIDs in a snapshot are new, for the node's event log, a storm folded
//! into one event per window ([`xids`]).

mod xids;

use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

use super::base::lock;
use crate::history::{History, HistoryConfig, Metric, Point};
use crate::protocol::{NodeEvent, TelemetryInfo};
use crate::telemetry::Snapshot;

/// Where each new snapshot also goes, on the thread that takes it, before the watch channel:
/// the server's dedicated subscribers (`server::direct`), written without waking the runtime.
pub trait Sink: Send + Sync {
    fn put(&self, snap: &Arc<Snapshot>);
}

/// The newest snapshot, the history and the source. See the module doc.
pub struct Telemetry {
    history: Mutex<History>,
    newest: watch::Sender<Option<Arc<Snapshot>>>,
    /// Weak: the server owns it, and it goes when the server does.
    sink: Mutex<Option<Weak<dyn Sink>>>,
    info: TelemetryInfo,
    /// Which XIDs became node events.
    xids: Mutex<xids::XidLog>,
}

impl Telemetry {
    /// No snapshot yet, an empty history.
    pub fn new(info: TelemetryInfo) -> Telemetry {
        Telemetry {
            history: Mutex::new(History::new(HistoryConfig::for_period(
                1.0 / info.rate_hz.clamp(0.01, 100.0),
            ))),
            newest: watch::channel(None).0,
            sink: Mutex::new(None),
            info,
            xids: Mutex::default(),
        }
    }

    /// What the source is (or why there is none), its rate and its GPUs.
    pub fn info(&self) -> &TelemetryInfo {
        &self.info
    }

    /// A new snapshot into history.
    pub fn record(&self, snap: &Snapshot) {
        lock(&self.history).record(snap);
    }

    /// The node events the XIDs of `snap` make (see [`xids`]).
    pub fn new_xids(&self, snap: &Snapshot) -> Vec<NodeEvent> {
        lock(&self.xids).take(snap)
    }

    /// A new snapshot out to subscribers (the sink's first): it is the newest from now on.
    pub fn publish(&self, snap: Arc<Snapshot>) {
        let sink = lock(&self.sink).as_ref().and_then(Weak::upgrade);
        if let Some(sink) = sink {
            sink.put(&snap);
        }
        self.newest.send_replace(Some(snap));
    }

    /// Hand each new snapshot to `sink` too (in place of any before).
    pub fn set_sink(&self, sink: Weak<dyn Sink>) {
        *lock(&self.sink) = Some(sink);
    }

    /// The newest snapshot, as a watch channel (for telemetry subscriptions).
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Snapshot>>> {
        self.newest.subscribe()
    }

    /// The newest snapshot, if one came.
    pub fn newest(&self) -> Option<Arc<Snapshot>> {
        self.newest.borrow().clone()
    }

    /// At most `max` points of GPU `gpu`'s `metric` over `[from, to)`.
    pub fn window(&self, gpu: usize, metric: Metric, from: f64, to: f64, max: usize) -> Vec<Point> {
        lock(&self.history).window(gpu, metric, from, to, max)
    }

    /// The history itself, for a run's report (it copies the run's span out at once).
    pub fn history(&self) -> &Mutex<History> {
        &self.history
    }
}
