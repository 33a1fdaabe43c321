//! The recorder (`gpupilot record`): a client of the daemon that writes what the console would
//! see into a recording ([`crate::recording`]).
//!
//! It subscribes to snapshots and node events as the console does, and every [`POLL_EVERY`]
//! asks for the run list, the control status, and the new metrics reports and trainer state of
//! every run that has not ended (one last time for a run that just ended). It starts with the
//! node as it is: the newest snapshot, the runs, the control status, the latest node events and
//! the latest reports of live runs, so that a replay has something to show from its first
//! second. What did not change since the last poll is not written again.
//!
//! Memory is bounded: the recorder holds the last run list, control status and trainer states
//! (to write only changes), one poll's reports, and the writer's state. A write that fails (a
//! full disk) ends the recording with that error: the file is readable up to its last flush,
//! and the daemon, which this never blocks, goes on.

use super::{Client, ClientError, Push};
use crate::control::status::ControlStatus;
use crate::protocol::{Request, Response, RunInfo, TrainerInfo};
use crate::recording::{Header, Item, RecordingError, Writer};
use crate::telemetry::now_s;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often runs, control status and metrics are asked for.
pub const POLL_EVERY: Duration = Duration::from_secs(1);
/// Node events written from before the recording started (the Events view's context).
const EVENTS_BEFORE: usize = 200;
/// A live run's reports written from before the recording started (its charts' context).
const POINTS_BEFORE: u64 = 600;
/// `run_metrics` calls per run and poll (each answer holds at most 5,000 reports).
const METRICS_CALLS: usize = 4;
/// How often the stop flag is looked at while nothing comes.
const STOP_CHECK: Duration = Duration::from_millis(200);

/// Why a recording ended (cleanly: the file has its end mark).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// The `--for` duration passed.
    Duration,
    /// Ctrl-C, SIGTERM or SIGHUP.
    Signal,
    /// The daemon stopped or the connection closed: what it said.
    DaemonGone(String),
}

/// What was recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub stopped: Stopped,
    pub records: u64,
    /// Recorded time, seconds since the epoch: the first and the last record.
    pub from_s: f64,
    pub to_s: f64,
}

/// Why recording failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Daemon(#[from] ClientError),
    /// Writing the file failed (a full disk): the recording stops there.
    #[error("writing the recording failed: {0}")]
    Write(RecordingError),
}

/// Record from `client`'s daemon into `out` until `stop` turns true, `duration` passes, or the
/// daemon goes; `started` is called once the header is written (with the node's name).
pub fn record<W: Write>(
    client: &Client,
    out: W,
    duration: Option<Duration>,
    stop: &AtomicBool,
    started: impl FnOnce(&Header),
) -> Result<(Recorded, W), RecordError> {
    let status = client.status()?;
    let t0 = now_s();
    let header = Header {
        node: client.welcome().node.clone(),
        started_s: t0,
        rate_hz: status.telemetry.rate_hz,
    };
    let mut w = Writer::new(out, &header).map_err(RecordError::Write)?;
    started(&header);
    let mut r = Recorder {
        client,
        runs: None,
        control: None,
        trainers: HashMap::new(),
        next_metrics: HashMap::new(),
        last_seq: None,
        from_s: t0,
        to_s: t0,
    };
    if let Some(s) = status.snapshot {
        r.put(&mut w, s.time_s, Item::Snapshot(Box::new(s)))?;
    }
    client.subscribe(true, true)?;
    r.catch_up_events(&mut w, true)?;
    r.poll(&mut w)?;
    let deadline = duration.map(|d| Instant::now() + d);
    let mut next_poll = Instant::now() + POLL_EVERY;
    let stopped = loop {
        if stop.load(Ordering::SeqCst) {
            break Stopped::Signal;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break Stopped::Duration;
        }
        if now >= next_poll {
            match r.poll(&mut w) {
                // The daemon went between two pushes: the recording ends cleanly.
                Err(RecordError::Daemon(e @ (ClientError::Closed { .. } | ClientError::Io(_)))) => {
                    break Stopped::DaemonGone(e.to_string());
                }
                other => other?,
            }
            next_poll = now + POLL_EVERY;
            continue;
        }
        let mut wait = next_poll.saturating_duration_since(now).min(STOP_CHECK);
        if let Some(d) = deadline {
            wait = wait.min(d.saturating_duration_since(now));
        }
        match client.updates().recv_timeout(wait) {
            Ok(Push::Telemetry(s)) => r.put(&mut w, s.time_s, Item::Snapshot(s))?,
            Ok(Push::Event(e)) => {
                r.last_seq = Some(e.seq);
                r.put(&mut w, now_s(), Item::Event(Box::new(e)))?;
                // What an event announces (a run started, a knob applied) shows in the
                // next answers: ask now.
                next_poll = Instant::now();
            }
            Ok(Push::Lagged(_)) => r.catch_up_events(&mut w, false)?,
            Ok(Push::Shutdown(reason)) => break Stopped::DaemonGone(reason),
            Ok(Push::Error { message, .. }) => break Stopped::DaemonGone(message),
            Ok(Push::Closed) | Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                break Stopped::DaemonGone("the connection closed".into());
            }
            Ok(Push::Knob { .. } | Push::KnobDecision { .. }) => {}
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
        }
    };
    let end = now_s().max(r.to_s);
    let records = w.records;
    let out = w.finish(end).map_err(RecordError::Write)?;
    Ok((
        Recorded {
            stopped,
            records,
            from_s: r.from_s,
            to_s: end,
        },
        out,
    ))
}

struct Recorder<'a> {
    client: &'a Client,
    /// What was last written, to write only changes.
    runs: Option<Vec<RunInfo>>,
    control: Option<ControlStatus>,
    trainers: HashMap<String, TrainerInfo>,
    /// Per run, the next report to ask for.
    next_metrics: HashMap<String, u64>,
    last_seq: Option<u64>,
    from_s: f64,
    to_s: f64,
}

impl Recorder<'_> {
    fn put<W: Write>(&mut self, w: &mut Writer<W>, t: f64, item: Item) -> Result<(), RecordError> {
        w.write(t, &item).map_err(RecordError::Write)?;
        self.from_s = self.from_s.min(t);
        self.to_s = self.to_s.max(t);
        Ok(())
    }

    /// Node events since the last one written (on the first call: the latest few).
    fn catch_up_events<W: Write>(
        &mut self,
        w: &mut Writer<W>,
        first: bool,
    ) -> Result<(), RecordError> {
        let mut since = self.last_seq.unwrap_or(0);
        let mut events = std::collections::VecDeque::new();
        loop {
            let (batch, next) = self.client.events(since)?;
            if batch.is_empty() || next <= since {
                break;
            }
            since = next;
            events.extend(batch);
            while first && events.len() > EVENTS_BEFORE {
                events.pop_front();
            }
        }
        let now = now_s();
        for e in events {
            if self.last_seq.is_some_and(|s| e.seq <= s) {
                continue;
            }
            self.last_seq = Some(e.seq);
            self.put(w, now, Item::Event(Box::new(e)))?;
        }
        if self.last_seq.is_none() {
            self.last_seq = Some(since);
        }
        Ok(())
    }

    /// The run list, the control status, and the live runs' reports and trainers.
    fn poll<W: Write>(&mut self, w: &mut Writer<W>) -> Result<(), RecordError> {
        let runs = self.client.runs()?;
        let now = now_s();
        // Live runs, and runs that ended since the last poll (their last reports).
        let watched: Vec<String> = runs
            .iter()
            .filter(|r| {
                !r.is_final()
                    || self
                        .runs
                        .as_ref()
                        .is_some_and(|old| old.iter().any(|o| o.id == r.id && !o.is_final()))
            })
            .map(|r| r.id.clone())
            .collect();
        if self.runs.as_ref() != Some(&runs) {
            self.put(w, now, Item::Runs(runs.clone()))?;
            self.runs = Some(runs);
        }
        // An older daemon does not know `thermal`: recorded without.
        if let Ok(Response::Control(c)) = self.client.request(Request::Thermal {}) {
            if self.control.as_ref() != Some(&c) {
                self.put(w, now, Item::Control(c.clone()))?;
                self.control = Some(*c);
            }
        }
        for run in watched {
            self.poll_run(w, &run)?;
        }
        Ok(())
    }

    fn poll_run<W: Write>(&mut self, w: &mut Writer<W>, run: &str) -> Result<(), RecordError> {
        let first = !self.next_metrics.contains_key(run);
        let mut since = self.next_metrics.get(run).copied().unwrap_or(0);
        let mut trainer = None;
        for _ in 0..METRICS_CALLS {
            // A run without a trainer or reports, or a daemon that does not answer this:
            // nothing to record for it.
            let Ok(m) = self.client.run_metrics(run, since) else {
                return Ok(());
            };
            let end = m.trainer.last.as_ref().map_or(m.next, |p| p.n + 1);
            if first && since == 0 && end > POINTS_BEFORE {
                since = end - POINTS_BEFORE;
                continue;
            }
            let caught_up = m.points.is_empty() || m.next >= end;
            since = m.next;
            if !m.points.is_empty() {
                let t = m.points.last().map_or_else(now_s, |p| p.t);
                self.put(
                    w,
                    t,
                    Item::Metrics {
                        run: run.to_string(),
                        points: m.points,
                    },
                )?;
            }
            trainer = Some(m.trainer);
            if caught_up {
                break;
            }
        }
        self.next_metrics.insert(run.to_string(), since);
        if let Some(mut t) = trainer {
            // The newest report is the last of the metrics written.
            t.last = None;
            if self.trainers.get(run) != Some(&t) {
                self.trainers.insert(run.to_string(), t.clone());
                self.put(
                    w,
                    now_s(),
                    Item::Trainer {
                        run: run.to_string(),
                        trainer: Box::new(t),
                    },
                )?;
            }
        }
        Ok(())
    }
}
