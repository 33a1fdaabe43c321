//! The console's feed from a recording (`gpupilot replay FILE`), on a thread of its own.
//!
//! It reads the recording in order and hands each item to the console when the replay's
//! [`Clock`] reaches its time: the same updates a daemon's feed sends, so the views, keys and
//! charts are the console's own. The clock is the recording's time moving at `--speed`; the
//! console's frames read it too, so "now", staleness and the charts' windows are the
//! recording's. Space pauses it; a seek (`[` and `]`) reads the file again from the start (a
//! seek back) or on (a seek forward) without waiting, keeping what the console would hold by
//! then (the newest snapshot, the runs, the last events, each run's latest reports, and the
//! GPU history for the charts), then tells the console to forget its data ([`Update::Rewind`])
//! and sends that state.
//!
//! Nothing changes a node from here: every request that would (stop a run, a knob, a power
//! cap, the tuner) is answered with [`REFUSED`]. When the recording ends, the clock stops at
//! its last record and the header says how it ended: complete, or cut off (where and why).

use super::{Feed, Link, Request, Update, channels};
use crate::history::{History, Metric, SeriesPoints};
use crate::protocol::{LogStream, MetricsPoint, NodeEventRecord, RunInfo, TrainerInfo};
use crate::recording::{Ending, Item, Reader, RecordingError};
use crate::telemetry::Snapshot;
use crossbeam_channel::{Receiver, after, select};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What the console says when asked to change something while replaying.
pub const REFUSED: &str =
    "this is a recording: nothing here changes the node (quit, then `gpupilot` for the live one)";

/// What a replay shows in the Run view's log: recordings hold no logs.
const NO_LOGS: &str = "(a recording holds no logs: the run's stdout.log and stderr.log are in \
     its run directory on the node)\n";

/// Reports kept per run (as the console keeps for the run it shows).
const KEPT_POINTS: usize = crate::tui::metrics::KEPT_POINTS;
/// Node events kept (as the console keeps).
const EVENTS_KEPT: usize = super::daemon::EVENTS_KEPT;
/// The GPU history sent after a seek (as a daemon's feed sends it on connect).
const BACKFILL: [(f64, f64, u32); 2] = super::daemon::BACKFILL;
/// The longest the thread sleeps without looking at the clock (a pause or a seek moves it).
const NAP: Duration = Duration::from_millis(250);

/// The recording's time, moving at a speed, paused or not; shared by the feed and the
/// console's frames.
#[derive(Debug, Clone)]
pub struct Clock(Arc<Mutex<ClockState>>);

#[derive(Debug)]
struct ClockState {
    /// Recorded time at `anchor`.
    at: f64,
    anchor: Instant,
    speed: f64,
    paused: bool,
}

impl Clock {
    pub fn new(at: f64, speed: f64) -> Clock {
        Clock(Arc::new(Mutex::new(ClockState {
            at,
            anchor: Instant::now(),
            speed,
            paused: false,
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClockState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The recorded time now, seconds since the epoch.
    pub fn now(&self) -> f64 {
        let s = self.lock();
        if s.paused {
            s.at
        } else {
            s.at + s.anchor.elapsed().as_secs_f64() * s.speed
        }
    }

    pub fn speed(&self) -> f64 {
        self.lock().speed
    }

    pub fn paused(&self) -> bool {
        self.lock().paused
    }

    /// Move to `at` (paused or not as before).
    fn set(&self, at: f64) {
        let mut s = self.lock();
        s.at = at;
        s.anchor = Instant::now();
    }

    fn pause(&self, paused: bool) {
        let now = self.now();
        let mut s = self.lock();
        s.at = now;
        s.anchor = Instant::now();
        s.paused = paused;
    }
}

/// A recording opened for the console.
pub struct Replay {
    path: PathBuf,
    reader: Reader<std::fs::File>,
    /// The replay's clock (the console's frames read it too).
    pub clock: Clock,
}

impl Replay {
    /// Open the recording at `path` (refusing what is not one, or is newer), to play at
    /// `speed` times its pace.
    pub fn open(path: &Path, speed: f64) -> Result<Replay, RecordingError> {
        let reader = Reader::open(path)?;
        let clock = Clock::new(reader.header().started_s, speed);
        Ok(Replay {
            path: path.to_path_buf(),
            reader,
            clock,
        })
    }
}

/// The header's words for a replay at `at` (recorded time): `+1:05`.
pub fn offset(start_s: f64, at: f64) -> String {
    let s = (at - start_s).max(0.0).round() as u64;
    format!("+{}:{:02}", s / 60, s % 60)
}

/// Play `replay` on a thread of its own. The thread ends when the feed is dropped.
pub fn start(replay: Replay) -> Feed {
    let (tx, requests, feed) = channels();
    let start_s = replay.reader.header().started_s;
    let name = replay.path.file_name().map_or_else(
        || replay.path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let mut player = Player {
        path: replay.path,
        reader: replay.reader,
        clock: replay.clock,
        tx,
        name,
        start_s,
        peeked: None,
        state: State::default(),
        end: None,
    };
    std::thread::Builder::new()
        .name("tui-replay-feed".into())
        .spawn(move || {
            let _ = player.run(&requests);
        })
        .expect("spawning the console's replay thread");
    feed
}

/// The console is gone.
struct Done;

/// What the console holds by the time the replay is at a moment (for a seek).
#[derive(Default)]
struct State {
    /// Time of the last item applied.
    at: f64,
    snapshot: Option<Box<Snapshot>>,
    history: History,
    runs: Option<Vec<RunInfo>>,
    control: Option<Box<crate::control::status::ControlStatus>>,
    events: VecDeque<NodeEventRecord>,
    metrics: HashMap<String, VecDeque<MetricsPoint>>,
    trainers: HashMap<String, TrainerInfo>,
    /// The run the console shows.
    watched: Option<String>,
}

impl State {
    /// The trainer of `run` with its newest report, as the daemon answers it.
    fn trainer(&self, run: &str) -> TrainerInfo {
        let mut t = self.trainers.get(run).cloned().unwrap_or_default();
        t.last = self.metrics.get(run).and_then(|m| m.back().cloned());
        t
    }
}

struct Player {
    path: PathBuf,
    reader: Reader<std::fs::File>,
    clock: Clock,
    tx: mpsc::Sender<Update>,
    name: String,
    start_s: f64,
    /// The next item, read but not yet due.
    peeked: Option<(f64, Item)>,
    state: State,
    /// How the recording ended, once it did: the words for the header.
    end: Option<String>,
}

impl Player {
    fn send(&self, u: Update) -> Result<(), Done> {
        self.tx.blocking_send(u).map_err(|_| Done)
    }

    fn link(&self) -> Update {
        Update::Link(Link::Replay {
            file: self.name.clone(),
            start_s: self.start_s,
            speed: self.clock.speed(),
            paused: self.clock.paused(),
            end: self.end.clone(),
        })
    }

    fn run(&mut self, requests: &Receiver<Request>) -> Result<(), Done> {
        self.send(self.link())?;
        if let Some((t, _)) = self.peek() {
            self.clock.set(t);
        }
        loop {
            let Some((t, _)) = self.peek() else {
                self.ended()?;
                match requests.recv() {
                    Ok(r) => self.on_request(r)?,
                    Err(_) => return Ok(()),
                }
                continue;
            };
            let now = self.clock.now();
            if now >= t {
                if let Some((t, item)) = self.peeked.take() {
                    self.apply(t, item, true)?;
                }
                continue;
            }
            let wait = if self.clock.paused() {
                NAP
            } else {
                Duration::from_secs_f64(((t - now) / self.clock.speed()).clamp(0.0, 1.0)).min(NAP)
            };
            select! {
                recv(requests) -> r => match r {
                    Ok(r) => self.on_request(r)?,
                    Err(_) => return Ok(()),
                },
                recv(after(wait)) -> _ => {}
            }
        }
    }

    fn peek(&mut self) -> Option<(f64, &Item)> {
        if self.peeked.is_none() {
            self.peeked = self.reader.next_item();
        }
        self.peeked.as_ref().map(|(t, i)| (*t, i))
    }

    /// The recording has no more: stop the clock at its last record, say how it ended (once).
    fn ended(&mut self) -> Result<(), Done> {
        if self.end.is_some() {
            return Ok(());
        }
        let last = self.reader.last_s().max(self.state.at);
        self.clock.set(last);
        self.clock.pause(true);
        let at = offset(self.start_s, last);
        let (text, ok) = match self.reader.ending() {
            Some(Ending::CutOff { why }) => (format!("cut off at {at}: {why}"), false),
            _ => (format!("ends at {at}"), true),
        };
        self.end = Some(text.clone());
        self.send(self.link())?;
        self.send(Update::Answer {
            ok,
            text: format!("the recording {text}"),
        })
    }

    /// Take in one item; with `send`, pass it on to the console as it would come live.
    fn apply(&mut self, t: f64, item: Item, send: bool) -> Result<(), Done> {
        let s = &mut self.state;
        s.at = s.at.max(t);
        let update = match item {
            Item::Snapshot(snap) => {
                s.history.record(&snap);
                s.snapshot = Some(snap.clone());
                Some(Update::Snapshot(snap))
            }
            Item::Runs(runs) => {
                s.runs = Some(runs.clone());
                Some(Update::Runs(runs))
            }
            Item::Control(c) => {
                s.control = Some(c.clone());
                Some(Update::Control(c))
            }
            Item::Event(e) => {
                s.events.push_back((*e).clone());
                while s.events.len() > EVENTS_KEPT {
                    s.events.pop_front();
                }
                Some(Update::Events {
                    events: vec![*e],
                    reset: false,
                })
            }
            Item::Metrics { run, points } => {
                let kept = s.metrics.entry(run.clone()).or_default();
                let after = kept.back().map(|p| p.n);
                let fresh: Vec<MetricsPoint> = points
                    .into_iter()
                    .filter(|p| after.is_none_or(|n| p.n > n))
                    .collect();
                kept.extend(fresh.iter().cloned());
                while kept.len() > KEPT_POINTS {
                    kept.pop_front();
                }
                (s.watched.as_ref() == Some(&run) && !fresh.is_empty()).then(|| Update::Metrics {
                    trainer: Box::new(s.trainer(&run)),
                    run,
                    points: fresh,
                    reset: false,
                })
            }
            Item::Trainer { run, trainer } => {
                s.trainers.insert(run.clone(), *trainer);
                (s.watched.as_ref() == Some(&run)).then(|| Update::Metrics {
                    trainer: Box::new(s.trainer(&run)),
                    run,
                    points: Vec::new(),
                    reset: false,
                })
            }
        };
        match update {
            Some(u) if send => self.send(u),
            _ => Ok(()),
        }
    }

    fn on_request(&mut self, r: Request) -> Result<(), Done> {
        match r {
            Request::Watch(run) => {
                self.state.watched = Some(run.clone());
                self.send(Update::Log {
                    run: run.clone(),
                    stream: LogStream::Stdout,
                    data: NO_LOGS.into(),
                    reset: true,
                    from_start: true,
                })?;
                self.send_metrics(&run)
            }
            Request::ReplayPause => {
                let paused = !self.clock.paused();
                if self.end.is_some() && !paused {
                    // At the end there is nothing to play: a seek back plays again.
                    return self.send(Update::Answer {
                        ok: true,
                        text: format!("the recording {}", self.end.clone().unwrap_or_default()),
                    });
                }
                self.clock.pause(paused);
                self.send(self.link())
            }
            Request::ReplaySeek(step) => self.seek(self.clock.now() + f64::from(step)),
            // Nothing to compute hints from a recording for: the pane says what it lacks.
            Request::Advise(_) => Ok(()),
            Request::Stop(_)
            | Request::Pause(_)
            | Request::Resume(_)
            | Request::SetKnob { .. }
            | Request::PowerCap { .. }
            | Request::PowerReset { .. }
            | Request::TuneEnergy(_)
            | Request::TuneStop => self.send(Update::Answer {
                ok: false,
                text: REFUSED.into(),
            }),
        }
    }

    fn send_metrics(&self, run: &str) -> Result<(), Done> {
        let Some(points) = self.state.metrics.get(run) else {
            return Ok(());
        };
        self.send(Update::Metrics {
            run: run.to_string(),
            points: points.iter().cloned().collect(),
            reset: true,
            trainer: Box::new(self.state.trainer(run)),
        })
    }

    /// Go to `target` (recorded time): read from the start when it is behind, on when ahead,
    /// then hand the console the state at that moment.
    fn seek(&mut self, target: f64) -> Result<(), Done> {
        let target = target.max(self.start_s);
        let was_ended = self.end.is_some();
        if target < self.state.at {
            match Reader::open(&self.path) {
                Ok(r) => {
                    self.reader = r;
                    let watched = self.state.watched.take();
                    self.state = State {
                        watched,
                        ..State::default()
                    };
                    self.peeked = None;
                    self.end = None;
                }
                Err(e) => {
                    return self.send(Update::Answer {
                        ok: false,
                        text: format!("reading the recording again: {e}"),
                    });
                }
            }
        }
        while let Some((t, _)) = self.peek() {
            if t > target {
                break;
            }
            if let Some((t, item)) = self.peeked.take() {
                self.apply(t, item, false)?;
            }
        }
        let at = if self.peeked.is_none() {
            target.min(self.reader.last_s().max(self.state.at))
        } else {
            target
        };
        self.clock.set(at);
        if was_ended && self.peeked.is_some() {
            // Back from the end: play on.
            self.end = None;
            self.clock.pause(false);
        }
        self.send_state(at)?;
        self.send(self.link())
    }

    /// Everything the console holds at `at`, after it forgot what it had.
    fn send_state(&self, at: f64) -> Result<(), Done> {
        let s = &self.state;
        self.send(Update::Rewind)?;
        if let Some(snap) = &s.snapshot {
            let mut series = Vec::new();
            for g in &snap.gpus {
                for metric in Metric::ALL {
                    let mut points = Vec::new();
                    for (from, to, n) in BACKFILL {
                        points.extend(s.history.window(
                            g.index as usize,
                            metric,
                            at - from,
                            at - to + 0.001,
                            n as usize,
                        ));
                    }
                    if !points.is_empty() {
                        series.push(SeriesPoints {
                            gpu: g.index as usize,
                            metric,
                            points,
                        });
                    }
                }
            }
            if !series.is_empty() {
                self.send(Update::Backfill(series))?;
            }
        }
        if let Some(runs) = &s.runs {
            self.send(Update::Runs(runs.clone()))?;
        }
        if let Some(c) = &s.control {
            self.send(Update::Control(c.clone()))?;
        }
        self.send(Update::Events {
            events: s.events.iter().cloned().collect(),
            reset: true,
        })?;
        if let Some(run) = &s.watched {
            self.send_metrics(run)?;
        }
        if let Some(snap) = &s.snapshot {
            self.send(Update::Snapshot(snap.clone()))?;
        }
        Ok(())
    }
}
