//! The typed requests: one method per request, each returning what its answer carries.

use super::{Client, ClientError, LogChunk};
use crate::history::{Metric, Point};
use crate::profile::Profile;
use crate::protocol::{
    KnobName, KnobVia, LogStream, MetricsPoint, NodeEventRecord, Request, Response, RunInfo,
    RunSignal, StatusReply, TrainerInfo,
};
use crate::supervisor::{Caller, EventRecord, KnobValues};

impl Client {
    pub fn status(&self) -> Result<StatusReply, ClientError> {
        match self.request(Request::Status {})? {
            Response::Status(s) => Ok(*s),
            other => Err(unexpected("status", other)),
        }
    }

    /// Start (or stop) pushes of telemetry snapshots and node events to [`Client::updates`].
    /// Snapshots come as their changes to the one before (smaller on the wire) and reach
    /// [`Client::updates`] whole.
    pub fn subscribe(&self, telemetry: bool, events: bool) -> Result<(), ClientError> {
        match self.request(Request::Subscribe {
            telemetry,
            events,
            delta: true,
            dedicated: false,
        })? {
            Response::Subscribed { .. } => Ok(()),
            other => Err(unexpected("subscribe", other)),
        }
    }

    /// At most `max_points` points of one series over `[from, to)` (Unix seconds).
    pub fn history(
        &self,
        gpu: u32,
        metric: Metric,
        from: f64,
        to: f64,
        max_points: u32,
    ) -> Result<Vec<Point>, ClientError> {
        let request = Request::History {
            gpu,
            metric,
            from,
            to,
            max_points,
        };
        match self.request(request)? {
            Response::History { points, .. } => Ok(points),
            other => Err(unexpected("history", other)),
        }
    }

    /// Every run, oldest first.
    pub fn runs(&self) -> Result<Vec<RunInfo>, ClientError> {
        self.run_list(false)
    }

    /// The runs that have not ended, oldest first. An older daemon answers every run.
    pub fn live_runs(&self) -> Result<Vec<RunInfo>, ClientError> {
        self.run_list(true)
    }

    fn run_list(&self, live: bool) -> Result<Vec<RunInfo>, ClientError> {
        match self.request(Request::Runs { run: None, live })? {
            Response::Runs { runs } => Ok(runs),
            other => Err(unexpected("runs", other)),
        }
    }

    /// The run `spec` names (id, id prefix, name or `last`), as the daemon resolves it.
    pub fn run(&self, spec: &str) -> Result<RunInfo, ClientError> {
        let request = Request::Runs {
            run: Some(spec.into()),
            live: false,
        };
        match self.request(request)? {
            Response::Runs { runs } if runs.len() == 1 => {
                Ok(runs.into_iter().next().expect("one run"))
            }
            other => Err(unexpected("runs", other)),
        }
    }

    pub fn start_run(
        &self,
        profile: Profile,
        caller: Caller,
        knobs: KnobValues,
        why: Option<String>,
    ) -> Result<RunInfo, ClientError> {
        let request = Request::RunStart {
            profile: Box::new(profile),
            caller,
            knobs,
            why,
        };
        match self.request(request)? {
            Response::RunStarted { run } => Ok(run),
            other => Err(unexpected("run_start", other)),
        }
    }

    /// Stop a run (SIGTERM, SIGKILL after `grace_s`; `kill`: SIGKILL now). Returns at once;
    /// the run's status is `stopping` until it has ended.
    pub fn stop_run(
        &self,
        spec: &str,
        kill: bool,
        grace_s: Option<f64>,
        why: Option<String>,
    ) -> Result<RunInfo, ClientError> {
        let request = Request::RunStop {
            run: spec.into(),
            kill,
            grace_s,
            why,
        };
        match self.request(request)? {
            Response::RunChanged { run } => Ok(run),
            other => Err(unexpected("run_stop", other)),
        }
    }

    pub fn signal_run(
        &self,
        spec: &str,
        signal: RunSignal,
        why: Option<String>,
    ) -> Result<RunInfo, ClientError> {
        let request = Request::RunSignal {
            run: spec.into(),
            signal,
            why,
        };
        match self.request(request)? {
            Response::RunChanged { run } => Ok(run),
            other => Err(unexpected("run_signal", other)),
        }
    }

    /// Up to `max_bytes` of a run's log from `offset` (0 bytes: just its size and id).
    pub fn logs(
        &self,
        spec: &str,
        stream: LogStream,
        offset: u64,
        max_bytes: u64,
    ) -> Result<LogChunk, ClientError> {
        let request = Request::Logs {
            run: spec.into(),
            stream,
            offset,
            max_bytes: Some(max_bytes),
        };
        match self.request(request)? {
            Response::Logs {
                run,
                next_offset,
                size,
                data,
                finished,
                ..
            } => Ok(LogChunk {
                run,
                data,
                next_offset,
                size,
                finished,
            }),
            other => Err(unexpected("logs", other)),
        }
    }

    /// Node events after `since`; and the `since` for the next call.
    pub fn events(&self, since: u64) -> Result<(Vec<NodeEventRecord>, u64), ClientError> {
        match self.request(Request::Events { since, max: None })? {
            Response::Events { events, next } => Ok((events, next)),
            other => Err(unexpected("events", other)),
        }
    }

    /// A run's own events from event `since` on; and the `since` for the next call.
    pub fn run_events(
        &self,
        spec: &str,
        since: u64,
    ) -> Result<(Vec<EventRecord>, u64), ClientError> {
        let request = Request::RunEvents {
            run: spec.into(),
            since,
            max: None,
        };
        match self.request(request)? {
            Response::RunEvents { events, next, .. } => Ok((events, next)),
            other => Err(unexpected("run_events", other)),
        }
    }
}

/// What `knob_set` answered: the change is on its way.
#[derive(Debug, Clone, PartialEq)]
pub struct KnobPending {
    pub run: String,
    pub seq: u64,
    pub old: Option<i64>,
    pub via: KnobVia,
    /// A run of several ranks: the step they will all apply it at, once they agree.
    pub apply_step: Option<u64>,
    /// A run of several ranks: how many the change was proposed to.
    pub ranks: Option<u32>,
}

/// What `run_metrics` answered.
#[derive(Debug, Clone, PartialEq)]
pub struct RunMetrics {
    pub run: String,
    pub points: Vec<MetricsPoint>,
    pub next: u64,
    pub trainer: TrainerInfo,
}

impl Client {
    /// Ask for a knob change on a run (`restart`: allow a restart when no trainer listens).
    pub fn knob_set(
        &self,
        spec: &str,
        knob: KnobName,
        value: i64,
        restart: bool,
        why: Option<String>,
    ) -> Result<KnobPending, ClientError> {
        let request = Request::KnobSet {
            run: spec.into(),
            knob,
            value,
            restart,
            why,
        };
        match self.request(request)? {
            Response::KnobPending {
                run,
                seq,
                old,
                via,
                apply_step,
                ranks,
                ..
            } => Ok(KnobPending {
                run,
                seq,
                old,
                via,
                apply_step,
                ranks,
            }),
            other => Err(unexpected("knob_set", other)),
        }
    }

    /// A run's metrics reports from number `since` on, its knobs and its trainer.
    pub fn run_metrics(&self, spec: &str, since: u64) -> Result<RunMetrics, ClientError> {
        let request = Request::RunMetrics {
            run: spec.into(),
            since,
            max: None,
        };
        match self.request(request)? {
            Response::RunMetrics {
                run,
                points,
                next,
                trainer,
            } => Ok(RunMetrics {
                run,
                points,
                next,
                trainer,
            }),
            other => Err(unexpected("run_metrics", other)),
        }
    }
}

fn unexpected(what: &'static str, got: Response) -> ClientError {
    let got = serde_json::to_string(&got).unwrap_or_else(|_| format!("{got:?}"));
    ClientError::Unexpected {
        what,
        got: got.chars().take(200).collect(),
    }
}
