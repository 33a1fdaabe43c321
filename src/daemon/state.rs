//! [`Daemon`]: who the daemon is (pid, user, node, socket, read-only), the node's event log,
//! and its three parts, each in a module of its own with its own locks and their order:
//! [`Telemetry`] (the newest snapshot, the history), [`Runs`] (the run table and the trainer
//! channels) and [`Control`] (GPU settings, the control loops, the runs' power caps).
//!
//! What crosses parts is done here: a snapshot goes into history, then through the control
//! loops (which read the runs), then out to subscribers; a run's start sets its power cap, then
//! starts it; [`Daemon::answer`] sends each request to its part. Everything here is synchronous
//! and takes the caller's identity ([`Peer`]) explicitly, so tests drive it without a socket;
//! the server calls it from blocking tasks.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime};

use tokio::sync::watch;

use super::base::RequestError;
use super::control::Control;
use super::events::NodeLog;
use super::requests::classify;
use super::runs::Runs;
use super::runs::ops::recheck;
use super::runs::trainers::Attach;
use super::telemetry::Telemetry;
use super::tune::Tuning;
use super::{DaemonError, io_err};
use crate::config::Paths;
use crate::control::status::ControlStatus;
use crate::ipc::Peer;
use crate::profile::Profile;
use crate::protocol::{
    self, DaemonInfo, ErrorCode, NodeEvent, Request, Response, RunCounts, StatusReply,
    TelemetryInfo,
};
use crate::supervisor::{Caller, KnobValues, LaunchOptions};
use crate::telemetry::Snapshot;
use crate::time::rfc3339;
use crate::training::{MetricsReport, TrainerInfo};

const READONLY: &str = "this daemon is read-only (started with --readonly): it does not start, \
                        stop or signal runs, or change GPU settings; restart it without \
                        --readonly to allow changes";

/// The daemon's state, shared by every task. See the module doc.
pub struct Daemon {
    paths: Paths,
    socket: PathBuf,
    readonly: bool,
    pid: u32,
    uid: u32,
    node: String,
    started_at: SystemTime,
    started: Instant,
    /// The runs and their trainer channels (see `runs`, where their locks' order is).
    runs: Runs,
    /// The newest snapshot, the history and the source (see `telemetry`).
    telemetry: Telemetry,
    /// The node's event log, which the parts record to as well.
    events: Arc<NodeLog>,
    clients: AtomicUsize,
    next_conn: std::sync::atomic::AtomicU64,
    /// The GPU settings, the control loops and the runs' caps (see `control`, where their
    /// locks' order is).
    control: Control,
    /// The energy-tuning jobs (see `tune`).
    tuning: Tuning,
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
    #[cfg(test)]
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

    /// `trainer_attach` on connection `conn` (see `runs::trainers`): the run's id, the rank
    /// the trainer said it is, the answer, and the knob pushes to send after it.
    pub fn trainer_attach(
        &self,
        conn: u64,
        tx: tokio::sync::mpsc::Sender<String>,
        ask: Attach,
    ) -> Result<(String, Option<u32>, Response, Vec<String>), RequestError> {
        self.runs.trainer_attach(conn, tx, ask)
    }

    /// The trainer connection `conn` closed.
    pub fn trainer_detached(&self, conn: u64) {
        self.runs.trainer_detached(conn)
    }

    /// A metrics report from `run`'s trainer.
    pub fn trainer_metrics(&self, run: &str, rank: Option<u32>, report: MetricsReport) -> Response {
        self.runs.trainer_metrics(run, rank, report)
    }

    /// `knob_ack` from `run`'s trainer (rank `rank` of a run of several).
    pub fn knob_ack(
        &self,
        run: &str,
        rank: Option<u32>,
        seq: u64,
        applied: bool,
        reason: Option<String>,
        step: Option<u64>,
    ) -> Response {
        self.runs.knob_ack(run, rank, seq, applied, reason, step)
    }

    /// `knob_vote` from rank `rank` of `run`.
    pub fn knob_vote(
        &self,
        run: &str,
        rank: Option<u32>,
        seq: u64,
        ready: bool,
        reason: Option<String>,
        step: Option<u64>,
    ) -> Response {
        self.runs.knob_vote(run, rank, seq, ready, reason, step)
    }

    /// `trainer_error` from `run`'s trainer.
    pub fn trainer_error(&self, run: &str, kind: String, message: Option<String>) -> Response {
        self.runs.trainer_error(run, kind, message)
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

    /// Answer one request from `peer` (every request but `hello` and `subscribe`, which belong
    /// to the connection). Blocking: call it off the async workers.
    pub fn answer(&self, peer: &Peer, request: Request) -> Response {
        if classify(&request).changes && self.readonly {
            return RequestError::new(ErrorCode::Readonly, READONLY).into_response();
        }
        let result = match request {
            Request::Status {} => Ok(Response::Status(Box::new(self.status()))),
            Request::History {
                gpu,
                metric,
                from,
                to,
                max_points,
            } => {
                let max = max_points.min(protocol::MAX_HISTORY_POINTS) as usize;
                let points = self.telemetry.window(gpu as usize, metric, from, to, max);
                Ok(Response::History {
                    gpu,
                    metric,
                    points,
                })
            }
            Request::Runs { run: None, live } => Ok(Response::Runs {
                runs: if live {
                    self.runs.list_live()
                } else {
                    self.runs.list()
                },
            }),
            Request::Runs {
                run: Some(spec), ..
            } => self
                .runs
                .info(&spec)
                .map(|info| Response::Runs { runs: vec![info] }),
            Request::RunStart {
                profile,
                caller,
                knobs,
                why,
            } => self
                .start_run(peer, &profile, &caller, knobs, why)
                .map(|run| Response::RunStarted { run }),
            Request::RunStop {
                run,
                kill,
                grace_s,
                why,
            } => self
                .runs
                .stop_run(peer, &run, kill, grace_s, why)
                .map(|run| Response::RunChanged { run }),
            Request::RunSignal { run, signal, why } => self
                .runs
                .signal_run(peer, &run, signal, why)
                .map(|run| Response::RunChanged { run }),
            Request::Logs {
                run,
                stream,
                offset,
                max_bytes,
            } => self.runs.logs(&run, stream, offset, max_bytes),
            Request::Events { since, max } => {
                let max = max
                    .unwrap_or(protocol::MAX_EVENTS)
                    .min(protocol::MAX_EVENTS);
                let (events, next) = self.events.since(since, max as usize);
                Ok(Response::Events { events, next })
            }
            Request::RunEvents { run, since, max } => self.runs.run_events(&run, since, max),
            r @ (Request::Power {}
            | Request::PowerCap { .. }
            | Request::PowerReset { .. }
            | Request::ClocksLock { .. }
            | Request::ClocksReset { .. }
            | Request::GpuMaxTemp { .. }
            | Request::GpuMaxTempReset { .. }) => self.control.answer_settings(peer, r),
            Request::KnobSet {
                run,
                knob,
                value,
                restart,
                why,
            } => self.runs.knob_set(peer, &run, knob, value, restart, why),
            Request::RunMetrics { run, since, max } => self.runs.run_metrics(&run, since, max),
            Request::TrainerAttach { .. }
            | Request::Metrics(_)
            | Request::KnobAck { .. }
            | Request::KnobVote { .. }
            | Request::TrainerError { .. } => Err(RequestError::new(
                ErrorCode::BadRequest,
                "trainer requests belong to a trainer's connection",
            )),
            r @ (Request::Thermal {}
            | Request::ThermalSet { .. }
            | Request::ThermalOff { .. }
            | Request::PowerBudget { .. }) => self.control.answer_thermal(peer, r, &self.telemetry),
            Request::TuneStart { run, settings } => self
                .tuning
                .start(&run, settings)
                .map(|job| Response::TuneJobs { jobs: vec![job] }),
            Request::TuneStatus { job } => self
                .tuning
                .status(job.as_deref())
                .map(|jobs| Response::TuneJobs { jobs }),
            Request::TuneStop { job } => self
                .tuning
                .stop(&job)
                .map(|job| Response::TuneJobs { jobs: vec![job] }),
            Request::Hello { .. } | Request::Subscribe { .. } => Err(RequestError::new(
                ErrorCode::BadRequest,
                "hello and subscribe belong to a connection",
            )),
        };
        result.unwrap_or_else(RequestError::into_response)
    }

    /// `run_start`: the run's power cap (`control::run_power`) set before its process starts,
    /// then the run started and in the table.
    fn start_run(
        &self,
        peer: &Peer,
        profile: &Profile,
        caller: &Caller,
        knobs: KnobValues,
        why: Option<String>,
    ) -> Result<protocol::RunInfo, RequestError> {
        let profile = recheck(profile)?;
        // `[power] cap_w`: checked and set before the process starts (see `run_power`).
        let cap = self.control.run_cap_before_start(&profile, caller)?;
        // Started without the table locked: spawning waits (briefly) for the new session. Its
        // trainer may attach before the run is in the table: `launching` tells it to wait.
        let launching = self.runs.launching();
        let options = LaunchOptions {
            socket: Some(self.socket().to_path_buf()),
            node: Some(self.node().to_string()),
            knobs,
            // Each attempt under a monitor (this binary): its exit status survives us.
            monitor: crate::supervisor::launch::monitor_program(),
        };
        let run = match self.runs.spawn(&profile, caller, &options) {
            Ok(run) => run,
            Err(e) => {
                self.control.run_cap_undo(cap);
                return Err(e.into());
            }
        };
        self.control.run_cap_started(&run, cap);
        self.record_environment(&run);
        Ok(self.runs.started(run, launching, peer, why))
    }

    /// `environment.json` into a new run's directory (host, driver, CUDA, GPU models, the
    /// daemon's version) for its report; a failure is logged, never fatal.
    fn record_environment(&self, run: &crate::supervisor::Run) {
        let dir = run.dir();
        let gpus = crate::report::model::run_gpus(dir, None);
        let snap = self.telemetry.newest();
        let env = crate::report::Environment::from_snapshot(
            snap.as_deref(),
            gpus.as_deref(),
            std::time::SystemTime::now(),
        );
        if let Err(e) = crate::report::environment::write(dir.path(), &env) {
            tracing::warn!("run {}: environment not recorded: {e}", run.id());
        }
    }

    fn status(&self) -> StatusReply {
        let (live, total) = self.runs.counts();
        StatusReply {
            daemon: DaemonInfo {
                pid: self.pid,
                version: env!("CARGO_PKG_VERSION").into(),
                protocol: protocol::VERSION,
                node: self.node.clone(),
                started_at: rfc3339(self.started_at),
                uptime_s: self.started.elapsed().as_secs_f64(),
                readonly: self.readonly,
                uid: self.uid,
                state_dir: self.paths.state.clone(),
                socket: self.socket.clone(),
                clients: self.clients.load(Ordering::Relaxed),
            },
            telemetry: self.telemetry.info().clone(),
            snapshot: self.telemetry.newest().as_deref().cloned(),
            runs: RunCounts { live, total },
            control: Some(self.control.status()),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;
    use crate::protocol::{LogStream, RunSignal};
    use crate::supervisor::Caller;
    use std::time::Duration;

    fn daemon(dir: &std::path::Path, readonly: bool) -> Daemon {
        let paths = Paths {
            config: dir.join("config"),
            state: dir.join("state"),
            runtime: dir.join("run"),
        };
        std::fs::create_dir_all(&paths.state).unwrap();
        let socket = paths.runtime.join("daemon.sock");
        Daemon::new(
            paths,
            socket,
            readonly,
            1.0,
            None,
            None,
            Some("none here".into()),
        )
        .unwrap()
    }

    fn me() -> Peer {
        Peer {
            uid: rustix::process::getuid().as_raw(),
            gid: 0,
            pid: Some(std::process::id()),
        }
    }

    fn start(d: &Daemon, profile: Profile) -> Response {
        let mut caller = Caller::current().unwrap();
        caller.cwd = std::env::temp_dir();
        d.answer(
            &me(),
            Request::RunStart {
                profile: Box::new(profile),
                caller,
                knobs: Default::default(),
                why: Some("unit test".into()),
            },
        )
    }

    fn code(r: &Response) -> Option<ErrorCode> {
        match r {
            Response::Error { code, .. } => Some(*code),
            _ => None,
        }
    }

    #[test]
    fn a_trainer_that_attaches_before_its_run_joins_the_table_waits_for_it() {
        let tmp = tempfile::tempdir().unwrap();
        let d = Arc::new(daemon(tmp.path(), false));
        // Nothing being started: a run nobody knows is refused at once.
        let t = Instant::now();
        let e = d.runs.resolve_starting("late").map(|_| ()).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnknownRun);
        assert!(t.elapsed() < Duration::from_secs(1));

        // A run being started (its process spawned, not yet in the table): the lookup waits
        // for it to join, then finds it.
        let launching = d.runs.launching();
        let waiter = {
            let d = Arc::clone(&d);
            std::thread::spawn(move || d.runs.resolve_starting("late").map(|(_, id)| id))
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished(), "it did not wait");
        let mut late = Profile::from_command(vec!["true".into()]);
        late.name = "late".into();
        let Response::RunStarted { run: info } = start(&d, late) else {
            panic!("not started")
        };
        assert_eq!(waiter.join().unwrap().unwrap(), info.id);
        drop(launching);
    }

    #[test]
    fn readonly_refuses_changes_but_answers_questions() {
        let tmp = tempfile::tempdir().unwrap();
        let d = daemon(tmp.path(), true);
        let r = start(&d, Profile::from_command(vec!["true".into()]));
        assert_eq!(code(&r), Some(ErrorCode::Readonly));
        let r = d.answer(
            &me(),
            Request::RunSignal {
                run: "last".into(),
                signal: RunSignal::Pause,
                why: None,
            },
        );
        assert_eq!(code(&r), Some(ErrorCode::Readonly));
        assert_eq!(
            d.answer(
                &me(),
                Request::Runs {
                    run: None,
                    live: false
                }
            ),
            Response::Runs { runs: vec![] }
        );
        let Response::Status(s) = d.answer(&me(), Request::Status {}) else {
            panic!("no status")
        };
        assert!(s.daemon.readonly && s.snapshot.is_none());
        assert_eq!(s.telemetry.error.as_deref(), Some("none here"));
    }

    #[test]
    fn a_profile_from_the_socket_is_checked_again() {
        let tmp = tempfile::tempdir().unwrap();
        let d = daemon(tmp.path(), false);
        let mut p = Profile::from_command(vec!["true".into()]);
        p.name = "../escape".into();
        let r = start(&d, p);
        assert_eq!(code(&r), Some(ErrorCode::BadRequest), "{r:?}");
        assert!(!tmp.path().join("state/escape").exists());
        let r = start(
            &d,
            Profile::from_command(vec!["no-such-program-xyz".into()]),
        );
        assert_eq!(code(&r), Some(ErrorCode::LaunchFailed), "{r:?}");
    }

    #[test]
    fn a_run_start_to_end_without_a_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let d = daemon(tmp.path(), false);
        let r = start(
            &d,
            Profile::from_command(vec!["sh".into(), "-c".into(), "echo hi".into()]),
        );
        let Response::RunStarted { run } = r else {
            panic!("{r:?}")
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !d.runs.table().get(&run.id).unwrap().run.is_finished() {
            assert!(Instant::now() < deadline, "the run did not end");
            d.poll_runs();
            std::thread::sleep(Duration::from_millis(10));
        }
        let logs = d.answer(
            &me(),
            Request::Logs {
                run: "last".into(),
                stream: LogStream::Stdout,
                offset: 0,
                max_bytes: None,
            },
        );
        let Response::Logs { data, finished, .. } = logs else {
            panic!("{logs:?}")
        };
        assert_eq!((data.as_str(), finished), ("hi\n", true));
        let Response::Events { events, .. } = d.answer(
            &me(),
            Request::Events {
                since: 0,
                max: None,
            },
        ) else {
            panic!("no events")
        };
        let kinds: Vec<String> = events
            .iter()
            .map(|e| serde_json::to_value(e).unwrap()["event"].to_string())
            .collect();
        assert_eq!(
            kinds,
            ["\"daemon_started\"", "\"run_started\"", "\"run_status\""]
        );
        let r = d.answer(
            &me(),
            Request::RunStop {
                run: run.id.clone(),
                kill: false,
                grace_s: None,
                why: None,
            },
        );
        assert_eq!(code(&r), Some(ErrorCode::BadState), "an ended run");
    }
}
