//! [`Daemon`]: who the daemon is (pid, user, node, socket, read-only), the node's event log,
//! and its three parts, each in a module of its own with its own locks and their order:
//! [`Telemetry`] (the newest snapshot, the history), [`Runs`] (the run table and the trainer
//! channels) and [`Control`] (GPU settings, the control loops, the runs' power caps).
//!
//! What crosses parts is done here: a snapshot goes into history, then through the control
//! loops (which read the runs), then out to subscribers. Requests are answered by their
//! families (`super::requests`), which reach the parts through the fields here. Everything here
//! is synchronous, so tests drive it without a socket.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime};

use tokio::sync::watch;

use super::base::{DaemonError, io_err};
use super::control::Control;
use super::events::NodeLog;
use super::runs::Runs;
use super::telemetry::Telemetry;
use super::tune::Tuning;
use crate::config::Paths;
use crate::control::status::ControlStatus;
use crate::protocol::{self, NodeEvent, TelemetryInfo};
use crate::telemetry::Snapshot;
use crate::training::TrainerInfo;

/// The daemon's state, shared by every task. See the module doc.
pub struct Daemon {
    pub(super) paths: Paths,
    pub(super) socket: PathBuf,
    pub(super) readonly: bool,
    pub(super) pid: u32,
    pub(super) uid: u32,
    pub(super) node: String,
    pub(super) started_at: SystemTime,
    pub(super) started: Instant,
    /// The runs and their trainer channels (see `runs`, where their locks' order is).
    pub(super) runs: Runs,
    /// The newest snapshot, the history and the source (see `telemetry`).
    pub(super) telemetry: Telemetry,
    /// The node's event log, which the parts record to as well.
    pub(super) events: Arc<NodeLog>,
    pub(super) clients: AtomicUsize,
    pub(super) next_conn: std::sync::atomic::AtomicU64,
    /// The GPU settings, the control loops and the runs' caps (see `control`, where their
    /// locks' order is).
    pub(super) control: Control,
    /// The energy-tuning jobs (see `tune`).
    pub(super) tuning: Tuning,
}

impl Daemon {
    /// Open the event log and adopt every run directory under `$STATE/runs`.
    pub fn new(
        paths: Paths,
        socket: PathBuf,
        readonly: bool,
        rate_hz: f64,
        gpus: Option<usize>,
        source: Option<String>,
        telemetry_error: Option<String>,
    ) -> Result<Daemon, DaemonError> {
        let events = Arc::new(NodeLog::open(&paths.state).map_err(io_err(format!(
            "reading {}",
            paths.state.join("events.jsonl").display()
        )))?);
        let (runs, adoptions) = Runs::adopt(paths.state.clone(), Arc::clone(&events));
        let pid = std::process::id();
        let telemetry = match (&source, &telemetry_error) {
            (Some(s), _) => {
                let n = gpus.unwrap_or(0);
                let plural = if n == 1 { "" } else { "s" };
                format!("{s}, {n} GPU{plural} at {rate_hz} Hz")
            }
            (None, Some(e)) => format!("none: {e}"),
            (None, None) => "none".into(),
        };
        let adopted = adoptions.iter().filter(|a| !a.status.is_final()).count();
        events.record(NodeEvent::DaemonStarted {
            pid,
            version: env!("CARGO_PKG_VERSION").into(),
            readonly,
            telemetry,
            adopted,
        });
        for a in adoptions.into_iter().filter(|a| a.was_open) {
            events.record(NodeEvent::RunAdopted {
                run: a.id,
                pid: a.pid,
                status: a.status,
            });
        }
        let node = hostname();
        let control = Control::new(paths.clone(), readonly, node.clone(), Arc::clone(&events));
        let tuning = Tuning::new(paths.clone(), Arc::clone(&events));
        Ok(Daemon {
            paths,
            socket,
            readonly,
            pid,
            uid: rustix::process::getuid().as_raw(),
            node,
            started_at: SystemTime::now(),
            started: Instant::now(),
            runs,
            telemetry: Telemetry::new(TelemetryInfo {
                source,
                error: telemetry_error,
                rate_hz,
                gpus: gpus.unwrap_or(0),
            }),
            events,
            clients: AtomicUsize::new(0),
            next_conn: std::sync::atomic::AtomicU64::new(1),
            control,
            tuning,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }
    pub fn uid(&self) -> u32 {
        self.uid
    }
    pub fn node(&self) -> &str {
        &self.node
    }
    /// The socket this daemon serves (runs get it as `GPUPILOT_SOCKET`).
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }
    pub fn readonly(&self) -> bool {
        self.readonly
    }
    pub fn events(&self) -> &NodeLog {
        &self.events
    }
    /// The newest snapshot, as a watch channel (for telemetry subscriptions).
    pub fn telemetry(&self) -> watch::Receiver<Option<Arc<Snapshot>>> {
        self.telemetry.subscribe()
    }
    /// Hand each new snapshot to `sink` too, on the thread that takes it (see
    /// [`super::telemetry::Sink`]).
    pub fn telemetry_sink(&self, sink: std::sync::Weak<dyn super::telemetry::Sink>) {
        self.telemetry.set_sink(sink);
    }
    /// Whether snapshots come (a telemetry source was opened).
    pub fn samples(&self) -> bool {
        self.telemetry.info().source.is_some()
    }
    /// A number for a new connection (to know a trainer's connection when it closes).
    pub fn conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// Clients connected now (as `status` says).
    pub fn clients(&self) -> usize {
        self.clients.load(Ordering::Relaxed)
    }

    /// Count a connection in (true) or out (false).
    pub fn client(&self, connected: bool) {
        if connected {
            self.clients.fetch_add(1, Ordering::Relaxed);
        } else {
            self.clients.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A new snapshot from the sampler: into history, its new XIDs into the node's log, out to
    /// subscribers.
    pub fn take_snapshot(&self, snap: impl Into<Arc<Snapshot>>) {
        let snap = snap.into();
        self.telemetry.record(&snap);
        for xid in self.telemetry.new_xids(&snap) {
            self.events.record(xid);
        }
        self.control.step(&snap, &self.runs);
        self.telemetry.publish(snap);
    }

    /// The runs part, for tests that look at the table.
    #[cfg(test)]
    pub(super) fn runs(&self) -> &Runs {
        &self.runs
    }

    /// Whether a poll of the runs has anything to do: cheap, callable from async code.
    pub fn runs_to_poll(&self) -> bool {
        self.runs.any_live()
    }

    /// Notified when a run joins the table (the run poller sleeps on it while none is live).
    pub fn run_added(&self) -> &tokio::sync::Notify {
        self.runs.added()
    }

    /// Poll every live run; record status changes in the node's log.
    pub fn poll_runs(&self) {
        self.runs.poll(self.telemetry.history());
    }

    /// The daemon is stopping (`reason`: the signal).
    pub fn stopped(&self, reason: &str) {
        self.events.record(NodeEvent::DaemonStopped {
            pid: self.pid,
            reason: reason.into(),
        });
    }

    /// Every live run with its trainer side (the `/metrics` exporter reads it).
    pub(super) fn live_trainers(&self) -> Vec<(protocol::RunInfo, TrainerInfo)> {
        self.runs.live_trainers()
    }

    /// Give the daemon GPUs to control (see `control`); `restore_on_exit`: restore the
    /// recorded originals when it stops. Reads the record a previous daemon left.
    pub fn attach_control(
        &self,
        dev: Arc<dyn crate::control::power::GpuControl>,
        restore_on_exit: bool,
    ) -> Result<(), DaemonError> {
        self.control.attach(dev, restore_on_exit)
    }

    /// The control loops as clients see them (`status`, `thermal`, `/metrics`).
    pub(super) fn control_status(&self) -> ControlStatus {
        self.control.status()
    }

    /// The daemon is stopping: the caps the loops changed go back to the users' caps.
    pub fn control_loop_stopping(&self) {
        self.control.loops_stopping()
    }

    /// The tuning jobs read the GPUs' energy counters from `source` at their windows' edges
    /// (call before [`Daemon::tuning_resume`]).
    pub fn tuning_reads_from(&self, source: Arc<dyn crate::telemetry::Source>) {
        self.tuning.reads_from(source)
    }

    /// Go on with the tuning jobs the last daemon left unfinished (once the socket answers:
    /// a job talks to its daemon through it).
    pub fn tuning_resume(&self) {
        self.tuning.resume()
    }

    /// The daemon is stopping: running tuning jobs put their caps back and are suspended, for
    /// the next daemon to resume. Blocking (bounded).
    pub fn tuning_stopping(&self) {
        self.tuning.stopping()
    }

    /// The daemon is stopping: restore every recorded original when told to
    /// (`--restore-on-exit`).
    pub fn control_stopping(&self) {
        self.control.settings_stopping()
    }
}

/// The node's name: `GPUPILOT_NODE_NAME` where set (tests stand two daemons of one machine for
/// two nodes with it), else `/proc/sys/kernel/hostname`. Other nodes' daemons reach this one
/// under this name for trainer relays (`GPUPILOT_RUN_NODE`, see `relay`).
fn hostname() -> String {
    std::env::var("GPUPILOT_NODE_NAME")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .ok()
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
