//! The console's feed from the daemon, on a thread of its own.
//!
//! On connect it says who answers ([`Link::Daemon`]), passes the newest snapshot on, subscribes
//! to snapshots and events, back-fills the charts from the daemon's history (after the first
//! frame, not before it), catches up on node events, and lists the runs.
//! Then it polls the run list, the control status (governors, budget, alerts) and the watched
//! run's logs, exits, metrics and knobs (the last two in `daemon/knobs.rs`, with knob changes):
//! at once after any event, at the refresh rate while anything is live (a run that has not
//! ended, a governor, a budget, an alert, the advisor pane, or an event in the last few
//! refreshes), and otherwise only every [`IDLE_POLL_EVERY`]: on a quiet node everything that
//! changes those answers is an event, and events are pushed. Snapshots are passed on at most
//! once per refresh (the newest wins), so a daemon sampling at 10 Hz does not make a 1 s
//! console redraw ten times a second. The thread sleeps until the next of these is due. A
//! snapshot that needs nothing of this thread (no poll due with it, a refresh passed since the
//! last) goes straight to the console ([`pass`]): read on the console's own thread over a
//! connection of its own from a local daemon ([`pump`]), or else from the client's reader
//! thread. A poll waits up to half a refresh for the snapshot it goes with.
//!
//! When the daemon goes away it says so ([`Link::Gone`]) and tries to connect again every two
//! seconds: a daemon restarted with `gpupilot daemon --detach` is picked up, and the runs
//! (which never depended on it) are shown again. Nothing here panics on what the daemon sends.

use super::{Feed, Link, Request, Update, channels};
use crate::client::{Client, ClientError};
use crate::history::{Metric, SeriesPoints};
use crate::protocol::{
    ErrorCode, LogStream, MAX_LOG_CHUNK, NodeEvent, Request as ProtoRequest, Response, RunInfo,
    RunSignal, TrainerInfo,
};
use crate::supervisor::Event as RunEvent;
use crate::telemetry::Snapshot;
use crossbeam_channel::{Receiver, after, select};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

mod advise;
mod knobs;
mod pass;
mod power;
mod pump;
mod tune;

use pass::{Offer, Pass, Via};

pub use advise::{ADVISE_EVERY, Advice};
pub use tune::{TunerEnd, TunerEvent, TunerGuard};

/// How long a request may take before the feed gives up on it (the console stays live
/// meanwhile: this is the feed's thread, not the event loop's).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a gone daemon is looked for again.
const RECONNECT_EVERY: Duration = Duration::from_secs(2);
/// How much of a log a newly watched run shows.
const TAIL_BYTES: u64 = 64 * 1024;
/// Log chunks read per poll and stream: a run that prints faster than this is caught up over
/// several polls instead of stalling the feed.
const CHUNKS_PER_POLL: usize = 8;
/// The most node events the console keeps.
pub const EVENTS_KEPT: usize = 1000;
/// How often a quiet node (nothing live, no recent event) is polled anyway.
pub const IDLE_POLL_EVERY: Duration = Duration::from_secs(10);
/// After an event, the node is polled at the refresh rate for this many refreshes (a run's
/// last log lines may land just after the event that says it ended).
const BUSY_AFTER_EVENT: u32 = 3;
/// History back-filled on connect: the last hour, at 10 s, then the last ten minutes at 1 s.
pub const BACKFILL: [(f64, f64, u32); 2] = [(3600.0, 600.0, 300), (600.0, 0.0, 600)];

/// Start the feed from `client`'s daemon. See the module doc. With `rt` (the console's
/// runtime), snapshots from a local daemon are read on that runtime's thread ([`pump`]).
pub fn start(client: Client, refresh: Duration, rt: Option<&tokio::runtime::Handle>) -> Feed {
    let (tx, requests, feed) = channels();
    let origin = client.origin().clone();
    let pass = Pass::new(tx.clone(), refresh);
    let pump = match (rt, &origin) {
        (Some(rt), crate::client::Origin::Socket(_)) => {
            Some(pump::Pump::start(rt, std::sync::Arc::clone(&pass)))
        }
        _ => None,
    };
    let mut worker = Worker {
        client: None,
        origin,
        pass,
        pump,
        tx,
        refresh,
        watch: None,
        last_seq: None,
        pending: None,
        last_poll: None,
        live: false,
        event_at: None,
        advise: advise::AdviseFeed::default(),
        tuner: feed.tuner.share(),
        runs: RunList::default(),
    };
    std::thread::Builder::new()
        .name("tui-daemon-feed".into())
        .spawn(move || {
            if worker.connected(client).is_ok() {
                worker.run(&requests);
            }
        })
        .expect("spawning the console's daemon thread");
    feed
}

/// The whole run list is asked for at least this often; between, only the live runs are
/// ([`RunList`]).
const RUNS_WHOLE_EVERY: Duration = Duration::from_secs(30);

/// The run list as the console last had it. A node keeps every ended run, and an ended run
/// does not change: a poll asks only for the live runs (a few hundred bytes, where a node of
/// a few hundred ended runs answers the whole list in a hundred kilobytes, once a refresh and
/// over `ssh` too) and puts them in their places. The whole list is asked for again when the
/// live runs are not the ones it had (one started or ended), after an event of a run (one that
/// started and ended between two polls is in no live list), after events were missed, at a
/// reconnect, and every [`RUNS_WHOLE_EVERY`].
#[derive(Default)]
struct RunList {
    runs: Vec<RunInfo>,
    /// When `runs` was last answered whole.
    whole_at: Option<Instant>,
}

impl RunList {
    /// The next poll asks for the whole list.
    fn stale(&mut self) {
        self.whole_at = None;
    }

    fn poll(&mut self, client: &Client) -> Result<Vec<RunInfo>, ClientError> {
        if self
            .whole_at
            .is_some_and(|t| t.elapsed() < RUNS_WHOLE_EVERY)
        {
            let live = client.live_runs()?;
            // An older daemon answers every run: only the live ones are compared.
            let ids = |runs: &[RunInfo]| -> Vec<String> {
                runs.iter()
                    .filter(|r| !r.is_final())
                    .map(|r| r.id.clone())
                    .collect()
            };
            if ids(&live) == ids(&self.runs) {
                for run in live {
                    if let Some(slot) = self.runs.iter_mut().find(|r| r.id == run.id) {
                        *slot = run;
                    }
                }
                return Ok(self.runs.clone());
            }
        }
        self.runs = client.runs()?;
        self.whole_at = Some(Instant::now());
        Ok(self.runs.clone())
    }
}

/// The run whose logs are tailed.
struct Watch {
    run: String,
    /// Next byte to read, per stream (stdout, stderr); None until the tail was read.
    offsets: [Option<u64>; 2],
    /// Next line of the run's events.jsonl.
    events_next: u64,
    exits: Vec<String>,
    /// Next metrics report to ask for; None until the first were read.
    metrics_next: Option<u64>,
    /// The trainer as last passed on (a change is passed on even without new reports).
    trainer: Option<TrainerInfo>,
}

/// The event loop is gone: stop.
struct Done;

struct Worker {
    client: Option<Client>,
    /// How to connect again (a local socket, or `ssh NODE gpupilot bridge`).
    origin: crate::client::Origin,
    tx: mpsc::Sender<Update>,
    /// Passes snapshots on, from this thread or the client's reader.
    pass: std::sync::Arc<Pass>,
    /// Reads snapshots on the console's thread, when it has a runtime and the daemon is local.
    pump: Option<pump::Pump>,
    refresh: Duration,
    watch: Option<Watch>,
    /// The newest node event seen (to catch up after a lag or a reconnect).
    last_seq: Option<u64>,
    /// A snapshot held back until a refresh has passed since the last one passed on.
    pending: Option<Box<Snapshot>>,
    /// When the node was last polled.
    last_poll: Option<Instant>,
    /// The last poll found something live: a run that has not ended, a governor, a budget or
    /// an alert.
    live: bool,
    /// When the last event came.
    event_at: Option<Instant>,
    /// The advisor pane's hints (see `daemon/advise.rs`).
    advise: advise::AdviseFeed,
    /// The console's energy tuner (see `daemon/tune.rs`).
    tuner: TunerGuard,
    runs: RunList,
}

impl Worker {
    fn send(&self, u: Update) -> Result<(), Done> {
        self.tx.blocking_send(u).map_err(|_| Done)
    }

    fn run(&mut self, requests: &Receiver<Request>) {
        loop {
            let step = match &self.client {
                Some(c) => {
                    let updates = c.updates().clone();
                    let pumped = self
                        .pump
                        .as_ref()
                        .map_or_else(crossbeam_channel::never, |p| p.to_feed.clone());
                    self.pass.set_poll_due(self.poll_due());
                    let wait = self.next_due().saturating_duration_since(Instant::now());
                    select! {
                        recv(updates) -> u => self.on_push(u.unwrap_or(crate::client::Push::Closed)),
                        recv(pumped) -> s => match s {
                            Ok(s) => self.on_push(crate::client::Push::Telemetry(s)),
                            Err(_) => return,
                        },
                        recv(requests) -> r => match r {
                            Ok(r) => self.on_request(r),
                            Err(_) => return,
                        },
                        recv(after(wait)) -> _ => self.on_due(),
                    }
                }
                None => select! {
                    recv(requests) -> r => match r {
                        Ok(r) => self.on_request(r),
                        Err(_) => return,
                    },
                    recv(after(RECONNECT_EVERY)) -> _ => self.reconnect(),
                },
            };
            if step.is_err() {
                return;
            }
        }
    }

    /// Whether the node is polled at the refresh rate (see the module doc).
    fn busy(&self) -> bool {
        self.live
            || self.advise.on
            || self
                .event_at
                .is_some_and(|t| t.elapsed() < self.refresh * BUSY_AFTER_EVENT)
    }

    /// When the next poll is due.
    fn poll_due(&self) -> Instant {
        let every = if self.busy() {
            self.refresh
        } else {
            IDLE_POLL_EVERY.max(self.refresh)
        };
        self.last_poll.map_or_else(Instant::now, |t| t + every)
    }

    /// When the thread must wake next: a poll, or a held-back snapshot. A poll waits up to
    /// half a refresh past its time for a snapshot to go with (see `pass`): one comes every
    /// refresh, and when it takes the poll along the console draws one frame for both.
    fn next_due(&self) -> Instant {
        let poll = self.poll_due() + self.refresh / 2;
        match (&self.pending, self.pass.last_sent()) {
            (Some(_), Some(t)) => poll.min(t + self.refresh.mul_f64(0.8)),
            (Some(_), None) => Instant::now(),
            (None, _) => poll,
        }
    }

    /// Something fell due: a poll (which passes a held-back snapshot on too), or a snapshot.
    fn on_due(&mut self) -> Result<(), Done> {
        if self.poll_due() <= Instant::now() {
            return self.poll();
        }
        match self.pending.take() {
            Some(s) => self.forward(s),
            None => Ok(()),
        }
    }

    /// Take in a new connection: who answers, the past, the present.
    fn connected(&mut self, client: Client) -> Result<(), Done> {
        let client = client.with_timeout(REQUEST_TIMEOUT);
        // Perhaps another daemon: its runs are asked for whole.
        self.runs = RunList::default();
        let status = match client.status() {
            Ok(s) => s,
            Err(e) => return self.gone(&e.to_string()),
        };
        self.send(Update::Link(Link::Daemon {
            pid: status.daemon.pid,
            readonly: status.daemon.readonly,
            telemetry_error: status.telemetry.error.clone(),
            rate_hz: status.telemetry.rate_hz,
        }))?;
        // The present first: the first frame does not wait for the past (see `backfill`).
        let past = match status.snapshot {
            Some(snap) => {
                let gpus: Vec<u32> = snap.gpus.iter().map(|g| g.index).collect();
                let now = snap.time_s;
                self.forward(Box::new(snap))?;
                Some((now, gpus))
            }
            None => None,
        };
        // Snapshots that need nothing of this thread go straight to the console: read on its
        // own thread over a connection of their own, or else from the client's reader.
        self.pass.set_poll_due(Instant::now());
        let pumped = self.pump_connect();
        if !pumped {
            let pass = std::sync::Arc::clone(&self.pass);
            client.tap_snapshots(Box::new(move |s| match pass.offer(s, Via::Reader) {
                Offer::ToFeed(s) => Some(s),
                _ => None,
            }));
        }
        if let Err(e) = client.subscribe(!pumped, true) {
            return self.gone(&e.to_string());
        }
        if let Some((now, gpus)) = past {
            self.backfill(&client, now, &gpus)?;
        }
        self.client = Some(client);
        self.catch_up_events()?;
        self.poll()
    }

    /// Give the pump a connection of its own to read snapshots from; false when there is no
    /// pump or the connection failed (the feed's own connection carries them then).
    fn pump_connect(&self) -> bool {
        let (Some(pump), crate::client::Origin::Socket(socket)) = (&self.pump, &self.origin) else {
            return false;
        };
        let name = format!("gpupilot-console {} (telemetry)", env!("CARGO_PKG_VERSION"));
        match crate::client::telemetry_stream(socket, &name) {
            Ok(conn) => pump.conns.send(conn).is_ok(),
            Err(e) => {
                tracing::debug!("a connection for snapshots: {e}");
                false
            }
        }
    }

    fn reconnect(&mut self) -> Result<(), Done> {
        let name = format!("gpupilot-console {}", env!("CARGO_PKG_VERSION"));
        match self.origin.connect(&name) {
            Ok(c) => self.connected(c),
            Err(_) => Ok(()),
        }
    }

    /// The daemon is unreachable: say so once, drop the connection, look for it again later.
    fn gone(&mut self, reason: &str) -> Result<(), Done> {
        self.client = None;
        self.pending = None;
        self.pass.reset();
        self.send(Update::Link(Link::Gone {
            reason: reason.to_string(),
        }))
    }

    /// A request failed: a closed connection means the daemon is gone, anything else is an
    /// answer for the footer.
    fn failed(&mut self, e: ClientError) -> Result<(), Done> {
        match e {
            ClientError::Closed { .. } | ClientError::Io(_) => self.gone(&e.to_string()),
            e => self.send(Update::Answer {
                ok: false,
                text: e.to_string(),
            }),
        }
    }

    /// The daemon's history of `gpus` up to `now` ([`BACKFILL`]), passed on GPU by GPU. Each
    /// GPU's series are asked for all at once: one round trip per GPU, not one per series and
    /// span (a console on another node, through `ssh`, would wait seconds for those), and no
    /// more of the history in memory at once than one GPU's. History is a nicety: the charts
    /// fill from live data without it, so whatever fails ends it there.
    fn backfill(&self, client: &Client, now: f64, gpus: &[u32]) -> Result<(), Done> {
        for &gpu in gpus {
            let requests = Metric::ALL
                .iter()
                .flat_map(|&metric| {
                    BACKFILL.map(|(from, to, n)| ProtoRequest::History {
                        gpu,
                        metric,
                        from: now - from,
                        to: now - to,
                        max_points: n,
                    })
                })
                .collect();
            let Ok(answers) = client.request_all(requests) else {
                return Ok(());
            };
            let mut answers = answers.into_iter();
            let mut series = Vec::new();
            for metric in Metric::ALL {
                let mut points = Vec::new();
                for _ in BACKFILL {
                    match answers.next() {
                        Some(Ok(Response::History { points: p, .. })) => points.extend(p),
                        _ => return Ok(()),
                    }
                }
                if !points.is_empty() {
                    series.push(SeriesPoints {
                        gpu: gpu as usize,
                        metric,
                        points,
                    });
                }
            }
            if !series.is_empty() {
                self.send(Update::Backfill(series))?;
            }
        }
        Ok(())
    }

    /// Pass a snapshot on, or hold it until a refresh has passed since the last one.
    fn forward(&mut self, snap: Box<Snapshot>) -> Result<(), Done> {
        self.pending = None;
        match self.pass.offer(snap, Via::Feed) {
            Offer::Held(s) | Offer::ToFeed(s) => {
                self.pending = Some(s);
                Ok(())
            }
            Offer::Closed => Err(Done),
            Offer::Sent | Offer::Stale => Ok(()),
        }
    }

    fn on_push(&mut self, u: crate::client::Push) -> Result<(), Done> {
        use crate::client::Push as U;
        match u {
            // A poll due within half a refresh goes first, so that its answers reach the
            // console just before the snapshot they go with: one frame for both. (A snapshot
            // comes this way only when the reader left it here: see `pass`.)
            U::Telemetry(s) if self.poll_due() <= Instant::now() + self.refresh / 2 => {
                self.pending = Some(s);
                self.poll()
            }
            U::Telemetry(s) => self.forward(s),
            // The subscription is made before the catch-up, so an event recorded between the
            // two comes both ways: the catch-up's copy went to the views already.
            U::Event(e) if self.last_seq.is_some_and(|seen| e.seq <= seen) => Ok(()),
            U::Event(e) => {
                if matches!(
                    e.event,
                    NodeEvent::RunStarted { .. }
                        | NodeEvent::RunAdopted { .. }
                        | NodeEvent::RunStatus { .. }
                ) {
                    self.runs.stale();
                }
                self.last_seq = Some(e.seq);
                self.event_at = Some(Instant::now());
                self.send(Update::Events {
                    events: vec![e],
                    reset: false,
                })?;
                self.poll()
            }
            U::Lagged(_) => {
                self.runs.stale();
                self.catch_up_events()
            }
            U::Shutdown(reason) => self.gone(&format!("the daemon stopped ({reason})")),
            U::Error { message, .. } => self.gone(&message),
            U::Closed => self.gone("the connection closed"),
            // Knob changes go to trainers, never to a console.
            U::Knob { .. } | U::KnobDecision { .. } => Ok(()),
        }
    }

    /// Events after the last one seen (all the daemon keeps, on the first connect).
    fn catch_up_events(&mut self) -> Result<(), Done> {
        let Some(client) = &self.client else {
            return Ok(());
        };
        let first = self.last_seq.is_none();
        let mut since = self.last_seq.unwrap_or(0);
        let mut events = Vec::new();
        loop {
            match client.events(since) {
                Ok((batch, next)) if !batch.is_empty() && next > since => {
                    since = next;
                    events.extend(batch);
                    if events.len() > 2 * EVENTS_KEPT {
                        events.drain(..events.len() - EVENTS_KEPT);
                    }
                }
                Ok(_) => break,
                Err(e) => return self.failed(e),
            }
        }
        if events.len() > EVENTS_KEPT {
            events.drain(..events.len() - EVENTS_KEPT);
        }
        if let Some(e) = events.last() {
            self.last_seq = Some(e.seq);
        } else if first {
            self.last_seq = Some(since);
        }
        if first || !events.is_empty() {
            self.send(Update::Events {
                events,
                reset: first,
            })?;
        }
        Ok(())
    }

    fn on_request(&mut self, r: Request) -> Result<(), Done> {
        let (run, act) = match r {
            Request::Watch(run) => return self.watch(run),
            Request::SetKnob {
                run,
                knob,
                value,
                restart,
            } => return self.set_knob(run, knob, value, restart),
            Request::PowerCap { gpu, watts } => return self.power_cap(gpu, Some(watts)),
            Request::PowerReset { gpu } => return self.power_cap(gpu, None),
            Request::Advise(on) => return self.set_advise(on),
            Request::TuneEnergy(run) => return self.tune(run),
            Request::TuneStop => return self.tune_stop(),
            // A live node has no replay clock (the console sends these only to a replay).
            Request::ReplayPause | Request::ReplaySeek(_) => return Ok(()),
            Request::Stop(run) => (run, None),
            Request::Pause(run) => (run, Some(RunSignal::Pause)),
            Request::Resume(run) => (run, Some(RunSignal::Resume)),
        };
        let Some(client) = &self.client else {
            return self.send(Update::Answer {
                ok: false,
                text: "the daemon is gone: start it again with `gpupilot daemon --detach`".into(),
            });
        };
        let why = Some("gpupilot console".to_string());
        let (result, done) = match act {
            None => (
                client.stop_run(&run, false, None, why),
                "stopping: SIGTERM now, SIGKILL if it has not ended within 10 s",
            ),
            Some(RunSignal::Pause) => (client.signal_run(&run, RunSignal::Pause, why), "paused"),
            Some(RunSignal::Resume) => (client.signal_run(&run, RunSignal::Resume, why), "resumed"),
        };
        match result {
            Ok(info) => {
                self.send(Update::Answer {
                    ok: true,
                    text: format!("run {}: {done}", info.id),
                })?;
                self.poll()
            }
            Err(e) => self.failed(e),
        }
    }

    /// Tail `run` from now on (a new tail unless it is the run already tailed).
    fn watch(&mut self, run: String) -> Result<(), Done> {
        if self.watch.as_ref().is_none_or(|w| w.run != run) {
            self.watch = Some(Watch {
                run,
                offsets: [None, None],
                events_next: 0,
                exits: Vec::new(),
                metrics_next: None,
                trainer: None,
            });
        }
        self.poll()
    }

    /// The run list, the control status, the watched run's new log bytes and exits, then a
    /// held-back snapshot (last: the console draws a snapshot at once, with what came before).
    fn poll(&mut self) -> Result<(), Done> {
        self.poll_node()?;
        match self.pending.take() {
            Some(s) => self.forward(s),
            None => Ok(()),
        }
    }

    fn poll_node(&mut self) -> Result<(), Done> {
        self.last_poll = Some(Instant::now());
        self.advise_if_due()?;
        let Some(client) = &self.client else {
            return Ok(());
        };
        let runs = match self.runs.poll(client) {
            Ok(r) => r,
            Err(e) => return self.failed(e),
        };
        let mut live = runs.iter().any(|r| !r.is_final());
        self.send(Update::Runs(runs))?;
        // An older daemon does not know `thermal`: the console goes without.
        if let Ok(Response::Control(c)) = client.request(crate::protocol::Request::Thermal {}) {
            live |= !c.governors.is_empty() || c.budget.is_some() || !c.alerts.is_empty();
            self.send(Update::Control(c))?;
        }
        self.live = live;
        let Some(mut w) = self.watch.take() else {
            return Ok(());
        };
        let result = self.poll_watch(&mut w);
        match result {
            // The run is no more (its directory went): stop asking.
            Ok(Err(e)) if e.code() == Some(ErrorCode::UnknownRun) => Ok(()),
            Ok(Err(e)) => {
                self.watch.get_or_insert(w);
                self.failed(e)
            }
            Ok(Ok(())) => {
                self.watch.get_or_insert(w);
                Ok(())
            }
            Err(Done) => Err(Done),
        }
    }

    fn poll_watch(&self, w: &mut Watch) -> Result<Result<(), ClientError>, Done> {
        let Some(client) = &self.client else {
            return Ok(Ok(()));
        };
        for (i, stream) in [LogStream::Stdout, LogStream::Stderr]
            .into_iter()
            .enumerate()
        {
            let reset = w.offsets[i].is_none();
            let mut offset = match w.offsets[i] {
                Some(o) => o,
                None => match client.logs(&w.run, stream, 0, 0) {
                    Ok(c) => c.size.saturating_sub(TAIL_BYTES),
                    Err(e) => return Ok(Err(e)),
                },
            };
            let from_start = offset == 0;
            let mut data = String::new();
            for _ in 0..CHUNKS_PER_POLL {
                let chunk = match client.logs(&w.run, stream, offset, MAX_LOG_CHUNK) {
                    Ok(c) => c,
                    Err(e) => return Ok(Err(e)),
                };
                let more = chunk.next_offset < chunk.size;
                let advanced = chunk.next_offset > offset;
                offset = chunk.next_offset;
                data.push_str(&chunk.data);
                if !more || !advanced {
                    break;
                }
            }
            w.offsets[i] = Some(offset);
            if reset || !data.is_empty() {
                self.send(Update::Log {
                    run: w.run.clone(),
                    stream,
                    data,
                    reset,
                    from_start,
                })?;
            }
        }
        let (events, next) = match client.run_events(&w.run, w.events_next) {
            Ok(e) => e,
            Err(e) => return Ok(Err(e)),
        };
        let fresh = w.events_next == 0;
        w.events_next = next;
        let before = w.exits.len();
        w.exits
            .extend(events.into_iter().filter_map(|e| match e.event {
                RunEvent::Exited { description, .. } => Some(description),
                _ => None,
            }));
        if fresh || w.exits.len() != before {
            self.send(Update::Exits {
                run: w.run.clone(),
                exits: w.exits.clone(),
            })?;
        }
        self.poll_metrics(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backfill_covers_the_last_hour_without_overlap() {
        assert_eq!(BACKFILL[0].1, BACKFILL[1].0, "the windows meet");
        assert_eq!(BACKFILL[1].1, 0.0, "and reach now");
    }

    #[test]
    fn the_daemons_blocking_threads_outlast_a_quiet_consoles_polls() {
        // Each poll's answers run on the daemon's blocking pool: a thread that exited between
        // two polls is made again for every one (see `daemon::BLOCKING_KEEP_ALIVE`).
        let longest = IDLE_POLL_EVERY.max(ADVISE_EVERY);
        assert!(
            crate::daemon::BLOCKING_KEEP_ALIVE >= 2 * longest,
            "{:?} keep-alive against polls every {longest:?}",
            crate::daemon::BLOCKING_KEEP_ALIVE
        );
    }
}
