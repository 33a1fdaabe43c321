//! [`Daemon`]: what the daemon holds (runs, telemetry, the event log) and
//! how it answers requests. Everything here is synchronous and takes the caller's identity
//! ([`Peer`]) explicitly, so tests drive it without a socket; the server calls it from
//! blocking tasks.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use tokio::sync::watch;

use super::events::NodeLog;
use super::runs::table::{self as runs, RunTable};
use super::telemetry::Telemetry;
use super::{DaemonError, io_err};
use crate::config::Paths;
use crate::ipc::Peer;
use crate::protocol::{
    self, DaemonInfo, ErrorCode, NodeEvent, Request, Response, RunCounts, StatusReply,
    TelemetryInfo,
};
use crate::supervisor::{SupervisorError, SystemClock};
use crate::telemetry::Snapshot;
use crate::time::rfc3339;

/// A request the daemon refuses, with the protocol's error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    pub code: ErrorCode,
    pub message: String,
}

impl RequestError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> RequestError {
        RequestError {
            code,
            message: message.into(),
        }
    }

    pub fn into_response(self) -> Response {
        Response::Error {
            code: self.code,
            message: self.message,
        }
    }
}

impl From<SupervisorError> for RequestError {
    fn from(e: SupervisorError) -> RequestError {
        let code = match &e {
            SupervisorError::BadState { .. } => ErrorCode::BadState,
            SupervisorError::Launch(_) => ErrorCode::LaunchFailed,
            SupervisorError::Profile { .. } => ErrorCode::BadRequest,
            SupervisorError::Io { .. } => ErrorCode::Internal,
        };
        RequestError::new(code, e.to_string())
    }
}

const READONLY: &str = "this daemon is read-only (started with --readonly): it does not start, \
                        stop or signal runs, or change GPU settings; restart it without \
                        --readonly to allow changes";

/// The daemon's state, shared by every task. See the module doc.
pub struct Daemon {
    pub(super) paths: Paths,
    socket: PathBuf,
    readonly: bool,
    pid: u32,
    uid: u32,
    node: String,
    started_at: SystemTime,
    started: Instant,
    pub(super) runs: Mutex<RunTable>,
    /// The newest snapshot, the history and the source (see `telemetry`).
    telemetry: Telemetry,
    pub(super) events: NodeLog,
    clients: AtomicUsize,
    pub(super) clock: SystemClock,
    /// The trainer channel of every run (see `trainers`).
    pub(super) channels: Mutex<super::runs::trainers::Channels>,
    next_conn: std::sync::atomic::AtomicU64,
    pub(super) control: super::control::gpu_settings::ControlSlot,
    /// Governors, budget, energy and alerts (see `control::loops`).
    pub(super) control_loop: super::control::loops::ControlLoop,
    /// Wakes the run poller when a run joins the table (it sleeps while no run is live).
    pub(super) run_added: tokio::sync::Notify,
    /// Runs being started: spawned (their trainer may already attach) but not yet in the
    /// table. `run_joined` (with `runs`) wakes whoever waits for one of them.
    pub(super) launching: AtomicUsize,
    pub(super) run_joined: std::sync::Condvar,
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
        let events = NodeLog::open(&paths.state).map_err(io_err(format!(
            "reading {}",
            paths.state.join("events.jsonl").display()
        )))?;
        let clock = SystemClock;
        let (table, adoptions) = RunTable::adopt_all(&paths.state, &clock);
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
        Ok(Daemon {
            paths,
            socket,
            readonly,
            pid,
            uid: rustix::process::getuid().as_raw(),
            node: hostname(),
            started_at: SystemTime::now(),
            started: Instant::now(),
            runs: Mutex::new(table),
            telemetry: Telemetry::new(TelemetryInfo {
                source,
                error: telemetry_error,
                rate_hz,
                gpus: gpus.unwrap_or(0),
            }),
            events,
            clients: AtomicUsize::new(0),
            clock,
            channels: Mutex::default(),
            next_conn: std::sync::atomic::AtomicU64::new(1),
            control: Default::default(),
            control_loop: Default::default(),
            run_added: tokio::sync::Notify::new(),
            launching: AtomicUsize::new(0),
            run_joined: std::sync::Condvar::new(),
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
    /// A number for a new connection (to know a trainer's connection when it closes).
    pub fn conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// Count a connection in (true) or out (false).
    pub fn client(&self, connected: bool) {
        if connected {
            self.clients.fetch_add(1, Ordering::Relaxed);
        } else {
            self.clients.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A new snapshot from the sampler: into history, out to subscribers.
    pub fn take_snapshot(&self, snap: Snapshot) {
        self.telemetry.record(&snap);
        self.control_step(&snap);
        self.telemetry.publish(snap);
    }

    /// Whether a poll of the runs has anything to do: cheap, callable from async code.
    pub fn runs_to_poll(&self) -> bool {
        lock(&self.runs).any_unfinished()
    }

    /// Poll every live run; record status changes in the node's log.
    pub fn poll_runs(&self) {
        let changes = lock(&self.runs).poll(&self.clock);
        self.parse_outputs();
        self.check_rank_changes();
        for c in changes {
            if c.new.is_final() {
                super::runs::run_report::after_end(
                    &self.paths.state,
                    &c.id,
                    self.telemetry.history(),
                );
            }
            self.events.record(NodeEvent::RunStatus {
                run: c.id,
                old: c.old,
                new: c.new,
                by: "daemon".into(),
                why: c.why,
            });
        }
    }

    /// The daemon is stopping (`reason`: the signal).
    pub fn stopped(&self, reason: &str) {
        self.events.record(NodeEvent::DaemonStopped {
            pid: self.pid,
            reason: reason.into(),
        });
    }

    /// Answer one request from `peer` (every request but `hello` and `subscribe`, which belong
    /// to the connection). Blocking: call it off the async workers.
    pub fn answer(&self, peer: &Peer, request: Request) -> Response {
        if request.is_change() && self.readonly {
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
            Request::Runs { run: None } => Ok(Response::Runs {
                runs: lock(&self.runs).list(SystemTime::now()),
            }),
            Request::Runs { run: Some(spec) } => {
                let table = lock(&self.runs);
                table.resolve(&spec).map(|id| Response::Runs {
                    runs: vec![runs::info(
                        table.get(&id).expect("resolved"),
                        SystemTime::now(),
                    )],
                })
            }
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
                .stop_run(peer, &run, kill, grace_s, why)
                .map(|run| Response::RunChanged { run }),
            Request::RunSignal { run, signal, why } => self
                .signal_run(peer, &run, signal, why)
                .map(|run| Response::RunChanged { run }),
            Request::Logs {
                run,
                stream,
                offset,
                max_bytes,
            } => self.logs(&run, stream, offset, max_bytes),
            Request::Events { since, max } => {
                let max = max
                    .unwrap_or(protocol::MAX_EVENTS)
                    .min(protocol::MAX_EVENTS);
                let (events, next) = self.events.since(since, max as usize);
                Ok(Response::Events { events, next })
            }
            Request::RunEvents { run, since, max } => self.run_events(&run, since, max),
            r @ (Request::Power {}
            | Request::PowerCap { .. }
            | Request::PowerReset { .. }
            | Request::ClocksLock { .. }
            | Request::ClocksReset { .. }
            | Request::GpuMaxTemp { .. }
            | Request::GpuMaxTempReset { .. }) => self.answer_control(peer, r),
            Request::KnobSet {
                run,
                knob,
                value,
                restart,
                why,
            } => self.knob_set(peer, &run, knob, value, restart, why),
            Request::RunMetrics { run, since, max } => self.run_metrics(&run, since, max),
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
            | Request::PowerBudget { .. }) => self.answer_thermal(peer, r),
            Request::Hello { .. } | Request::Subscribe { .. } => Err(RequestError::new(
                ErrorCode::BadRequest,
                "hello and subscribe belong to a connection",
            )),
        };
        result.unwrap_or_else(RequestError::into_response)
    }

    fn status(&self) -> StatusReply {
        let (live, total) = lock(&self.runs).counts();
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
            control: Some(self.control_status()),
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
        let e = d.resolve_run_starting("late").map(|_| ()).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnknownRun);
        assert!(t.elapsed() < Duration::from_secs(1));

        // A run being started (its process spawned, not yet in the table): the lookup waits
        // for it to join, then finds it.
        d.launching.fetch_add(1, Ordering::SeqCst);
        let waiter = {
            let d = Arc::clone(&d);
            std::thread::spawn(move || d.resolve_run_starting("late").map(|(_, id)| id))
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished(), "it did not wait");
        let mut late = Profile::from_command(vec!["true".into()]);
        late.name = "late".into();
        let Response::RunStarted { run: info } = start(&d, late) else {
            panic!("not started")
        };
        assert_eq!(waiter.join().unwrap().unwrap(), info.id);
        d.launching.fetch_sub(1, Ordering::SeqCst);
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
            d.answer(&me(), Request::Runs { run: None }),
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
        while !lock(&d.runs).get(&run.id).unwrap().run.is_finished() {
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
