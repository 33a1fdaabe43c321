//! The daemon's telemetry part: the newest snapshot, which subscribers follow (a watch
//! channel: a slow one skips to the newest, never receives old ones), the history of every
//! GPU's metrics (what `history` requests read, and what a run's report copies out when it
//! ends), and what the source is.
//!
//! Fed by the sampler's thread through [`super::Daemon::take_snapshot`]: a snapshot goes into
//! history first, then to the control loops, then out to subscribers. The history's lock is
//! held only for one snapshot's appends or one window's read, and never with another lock.
//!
//! It also tells which XIDs in a snapshot are new (each GPU's count of XIDs heard against the
//! count at the last snapshot), for the node's event log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::state::lock;
use crate::history::{History, Metric, Point};
use crate::protocol::{NodeEvent, TelemetryInfo};
use crate::telemetry::Snapshot;
use crate::telemetry::xid::explain;

/// The newest snapshot, the history and the source. See the module doc.
pub struct Telemetry {
    history: Mutex<History>,
    newest: watch::Sender<Option<Arc<Snapshot>>>,
    info: TelemetryInfo,
    /// Per GPU, the count of XIDs heard at the last snapshot.
    xids_seen: Mutex<HashMap<u32, u64>>,
}

impl Telemetry {
    /// No snapshot yet, an empty history.
    pub fn new(info: TelemetryInfo) -> Telemetry {
        Telemetry {
            history: Mutex::new(History::default()),
            newest: watch::channel(None).0,
            info,
            xids_seen: Mutex::default(),
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

    /// The XIDs of `snap` not in an earlier snapshot, as node events, oldest first. More new
    /// ones than a GPU's ring keeps are the ring's (the others were never seen).
    pub fn new_xids(&self, snap: &Snapshot) -> Vec<NodeEvent> {
        let mut seen = lock(&self.xids_seen);
        let mut events = Vec::new();
        for g in &snap.gpus {
            let (Some(xids), Some(count)) = (&g.xids, g.xid_count) else {
                continue;
            };
            let before = seen.insert(g.index, count).unwrap_or(0);
            let new = usize::try_from(count.saturating_sub(before)).unwrap_or(usize::MAX);
            for x in &xids[xids.len().saturating_sub(new)..] {
                events.push(NodeEvent::Xid {
                    gpu: g.index,
                    uuid: g.uuid.clone(),
                    xid: x.xid,
                    name: x.name.clone(),
                    action: explain(x.xid).action.to_string(),
                });
            }
        }
        events
    }

    /// A new snapshot out to subscribers: it is the newest from now on.
    pub fn publish(&self, snap: Snapshot) {
        self.newest.send_replace(Some(Arc::new(snap)));
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
