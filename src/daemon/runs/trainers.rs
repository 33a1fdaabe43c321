//! The trainer channel on the daemon's side: which connection is which run's trainer, the
//! knob changes asked of each run and their acknowledgements, and each run's metrics (from the
//! SDK, or parsed from the output of a script that does not use it).
//!
//! Per run, the daemon keeps the knob values the run uses as far as it knows, its ranks (one
//! for a single-process script; see `ranks.rs`), the changes in flight (by sequence number: one
//! state machine whatever the world size, `knob_changes.rs`, driven by `rank_changes.rs`), and
//! the newest metrics reports (every report is also in the run's `metrics.jsonl`). The sequence
//! number and a change at a step in flight (a job of several ranks') are kept in the run
//! directory (`knobs.json`), so they outlive the daemon; a change for a single process's next
//! batch is not (its trainer is told it again when it attaches to this daemon).
//!
//! Locks: the run table before the channels, never the other way round.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::Runs;
use super::knob_changes::Change;
use super::ops::append_run_event;
use super::ranks::{Ranks, Refused, TrainerConn};
use super::trainer_output::{OutputParser, OutputRules, read_new_lines};
use crate::daemon::base::RequestError;
use crate::profile::{Knob, MetricsSettings};
use crate::protocol::{
    self, ErrorCode, KnobName, KnobRange, KnobState, MetricsPoint, MetricsReport, NodeEvent,
    RankSpec, Response, ServerFrame, TrainerInfo,
};
use crate::supervisor::{Event, KnobValues, Run};
use crate::telemetry::now_s;
use crate::training::MAX_METRICS_LINE;

/// Metrics reports kept in memory per run (all of them are in `metrics.jsonl`).
pub const KEEP_POINTS: usize = 20_000;
/// Runs whose channel is kept in memory at most (idle ones beyond are read back when needed).
const KEEP_CHANNELS: usize = 64;
/// The most reports one `run_metrics` answer carries.
pub const MAX_METRICS: u32 = 5_000;
/// The end of `metrics.jsonl` read when a daemon first looks at a run (enough for
/// [`KEEP_POINTS`] reports of typical size).
const TAIL_BYTES: u64 = 8 << 20;

/// What `knobs.json` keeps.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Persisted {
    seq: u64,
    /// A change to several ranks in flight when it was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    staged: Option<PersistedStaged>,
}

/// A change to several ranks as `knobs.json` keeps it: a daemon that starts again knows what
/// was decided (a committed value is the run's; an undecided one was never applied).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PersistedStaged {
    seq: u64,
    knob: KnobName,
    value: i64,
    apply_step: u64,
    committed: Option<bool>,
    /// The run's attempt it was asked in (absent in files of older daemons): a committed value
    /// is the run's only while that attempt lasts, since a new one starts from its own plan
    /// (a batch halved after running out of memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
}

/// `from` of a report the SDK sent (`stdout`: read from the run's output).
const FROM_TRAINER: &str = "trainer";

/// One run's side of the channel.
pub(in crate::daemon) struct Channel {
    dir: PathBuf,
    /// Every rank attached (or once attached); a single-process script is rank 0 of 1.
    pub(in crate::daemon) ranks: Ranks,
    /// The values the run uses; for a run of several ranks, the values the job agreed on.
    pub(in crate::daemon) values: BTreeMap<KnobName, i64>,
    /// The run's attempt those values belong to (`None` until the channel is first looked at
    /// with its run).
    attempt: Option<u32>,
    /// The changes in flight, by sequence number: any number for the next batch of a single
    /// process, at most one at a step for a job of several ranks (see `knob_changes.rs`).
    pub(in crate::daemon) changes: BTreeMap<u64, Change>,
    /// The step the last change to several ranks took effect at: reports of earlier steps may
    /// still carry the old value.
    pub(in crate::daemon) last_apply_step: u64,
    /// No new repair before this (one that failed is not retried at the poll rate).
    pub(in crate::daemon) repair_after: Option<Instant>,
    trainer_ranges: BTreeMap<KnobName, KnobRange>,
    pub(in crate::daemon) last_rtt_ms: BTreeMap<KnobName, f64>,
    pub(in crate::daemon) last_outcome: BTreeMap<KnobName, String>,
    points: VecDeque<MetricsPoint>,
    /// A trainer has reported through the SDK (now, or before this daemon read the run): the
    /// run's output is then not read for metrics as well, attached or not, so no report is
    /// counted twice.
    sdk_reported: bool,
    next_n: u64,
    seq: u64,
    metrics_file: Option<File>,
    parser: OutputParser,
    /// stderr, read for a framework's log lines only (a Python logger writes there).
    err_parser: OutputParser,
    /// The framework whose log lines the run's output was found to be (`[metrics] preset`).
    preset: Option<crate::profile::MetricsPreset>,
    /// When the channel was last looked at, in [`Channels`]' count of lookups (the least
    /// recently used idle ones are let go).
    used: u64,
}

impl Channel {
    /// Load what the run directory holds: the sequence number and the newest reports.
    pub(super) fn load(dir: &Path) -> Channel {
        // A sequence number and one change: a bounded read, never through a link.
        let persisted = crate::config::safe_fs::read_capped(&dir.join("knobs.json"), 64 << 10)
            .ok()
            .and_then(|b| serde_json::from_slice::<Persisted>(&b).ok())
            .unwrap_or_default();
        let seq = persisted.seq;
        let mut values = BTreeMap::new();
        let mut last_apply_step = 0;
        let mut attempt = None;
        // A change the last daemon committed is the run's value: ranks that did not apply it
        // are brought to it. One it had not decided was applied by no rank. It belongs to its
        // attempt: a run found at a later one starts from that one's plan instead (see
        // `follow_attempt`).
        if let Some(st) = persisted.staged.filter(|st| st.committed == Some(true)) {
            values.insert(st.knob, st.value);
            last_apply_step = st.apply_step;
            attempt = st.attempt;
        }
        let points = read_tail(&dir.join("metrics.jsonl"));
        // Reports carry their number: the next one follows the newest.
        let next_n = points.back().map_or(0, |p| p.n + 1);
        // A run with reports already was read by an earlier daemon: go on from the output's
        // end (what came while no daemon watched is not guessed at). A run without any is read
        // from its first line.
        let fresh = points.is_empty();
        let offset = |name: &str| {
            if fresh {
                0
            } else {
                std::fs::metadata(dir.join(name)).map_or(0, |m| m.len())
            }
        };
        Channel {
            dir: dir.to_path_buf(),
            ranks: Ranks::default(),
            values,
            attempt,
            changes: BTreeMap::new(),
            last_apply_step,
            repair_after: None,
            trainer_ranges: BTreeMap::new(),
            last_rtt_ms: BTreeMap::new(),
            last_outcome: BTreeMap::new(),
            sdk_reported: points.iter().any(|p| p.from == FROM_TRAINER),
            points,
            next_n,
            seq,
            metrics_file: None,
            parser: OutputParser {
                offset: offset("stdout.log"),
                ..OutputParser::default()
            },
            err_parser: OutputParser {
                offset: offset("stderr.log"),
                ..OutputParser::default()
            },
            preset: None,
            used: 0,
        }
    }

    /// The run is at attempt `attempt`, started with `plan`'s values. A new attempt starts
    /// from its plan: what the last one applied (kept in the plan as it was applied) and what
    /// its restart policy changed, such as a batch halved after running out of memory. What
    /// the last attempt's ranks used is not the run's value any more, and is neither told to
    /// the new ranks nor shown as the value a change replaces; what they reported (steps,
    /// values) does not place the new attempt's changes.
    fn follow_attempt(&mut self, attempt: u32, plan: KnobValues) {
        match self.attempt.replace(attempt) {
            Some(seen) if seen != attempt => {
                for knob in KnobName::ALL {
                    match planned(plan, knob) {
                        Some(v) => self.values.insert(knob, v),
                        None => self.values.remove(&knob),
                    };
                }
                self.ranks.new_attempt();
                // Its steps may start again from 0: reports of any step are its own.
                self.last_apply_step = 0;
            }
            _ => {}
        }
    }

    pub(in crate::daemon) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.persist();
        self.seq
    }

    /// Write `knobs.json`: the sequence number and the change at a step in flight.
    pub(in crate::daemon) fn persist(&self) {
        let staged = self.at_step().and_then(|st| {
            Some(PersistedStaged {
                seq: st.seq,
                knob: st.knob,
                value: st.value,
                apply_step: st.mode.apply_step()?,
                committed: st.committed,
                attempt: self.attempt,
            })
        });
        let body = serde_json::to_vec(&Persisted {
            seq: self.seq,
            staged,
        })
        .expect("serializes");
        let path = self.dir.join("knobs.json");
        if let Err(e) = crate::config::safe_fs::write_atomic(&path, &body) {
            tracing::warn!("writing {}: {e}", path.display());
        }
    }

    /// Stamp, keep and append one report (of `rank`, where the trainer said which it is).
    pub(super) fn record(&mut self, report: MetricsReport, from: &str, rank: Option<u32>) {
        // A job of several ranks has the values it agreed on; one rank's report does not
        // change them.
        if !self.ranks.distributed() {
            for (knob, v) in [
                (KnobName::BatchSize, report.batch_size),
                (KnobName::Prefetch, report.prefetch),
            ] {
                if let Some(v) = v {
                    self.values.insert(knob, v);
                }
            }
        }
        let point = MetricsPoint {
            n: self.next_n,
            t: now_s(),
            from: from.into(),
            rank,
            report,
        };
        if let Some(r) = rank {
            self.ranks.record(r, &point);
        }
        self.sdk_reported |= from == FROM_TRAINER;
        self.next_n += 1;
        if self.metrics_file.is_none() {
            let path = self.dir.join("metrics.jsonl");
            match crate::config::safe_fs::open_append(&path) {
                Ok(f) => self.metrics_file = Some(f),
                Err(e) => tracing::warn!("opening {}: {e}", path.display()),
            }
        }
        if let Some(f) = &mut self.metrics_file {
            let mut line = serde_json::to_string(&point).expect("serializes");
            line.push('\n');
            if let Err(e) = f.write_all(line.as_bytes()) {
                tracing::warn!("writing {}/metrics.jsonl: {e}", self.dir.display());
                self.metrics_file = None;
            }
        }
        if self.points.len() == KEEP_POINTS {
            self.points.pop_front();
        }
        self.points.push_back(point);
    }

    pub(in crate::daemon) fn range(
        &self,
        knob: KnobName,
        profile: Option<Knob>,
    ) -> Option<KnobRange> {
        profile
            .map(|k| KnobRange {
                min: k.min,
                max: k.max,
            })
            .or_else(|| self.trainer_ranges.get(&knob).copied())
    }

    fn info(&self, profile: &crate::profile::Knobs, plan: KnobValues) -> TrainerInfo {
        let knobs = KnobName::ALL
            .into_iter()
            .filter_map(|knob| {
                let (prof, planned) = match knob {
                    KnobName::BatchSize => (profile.batch_size, plan.batch_size),
                    KnobName::Prefetch => (profile.prefetch, plan.prefetch),
                };
                let value = self.values.get(&knob).copied().or(planned);
                let range = self.range(knob, prof);
                let pending = self
                    .changes
                    .values()
                    .rfind(|c| c.knob == knob && c.committed != Some(false))
                    .map(|c| c.value);
                (value.is_some() || range.is_some()).then(|| KnobState {
                    knob,
                    value,
                    pending,
                    range,
                    last_rtt_ms: self.last_rtt_ms.get(&knob).copied(),
                    last_outcome: self.last_outcome.get(&knob).cloned(),
                })
            })
            .collect();
        TrainerInfo {
            attached: self.ranks.any_attached(),
            pid: self.ranks.first_link().and_then(|l| l.pid),
            last: self.points.back().cloned(),
            knobs,
            world_size: self.ranks.world_size(),
            ranks: self.ranks.info(),
            job: self.ranks.job(),
            staged: self.at_step().and_then(Change::view),
            metrics_preset: self.preset.map(|p| p.as_str().to_string()),
        }
    }
}

/// The newest reports of a `metrics.jsonl` (at most [`KEEP_POINTS`]), read from its end so that a
/// long run's file costs no more than what is kept. A line that is not a report (cut short by a
/// crash, not text, longer than [`MAX_METRICS_LINE`]) is passed over, not the end of the file.
fn read_tail(path: &Path) -> VecDeque<MetricsPoint> {
    let mut points = VecDeque::new();
    let Ok(mut f) = crate::config::safe_fs::open_regular(path) else {
        return points;
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let start = len.saturating_sub(TAIL_BYTES);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return points;
    }
    // What it held when opened, not what is written meanwhile.
    let r = BufReader::new(f.take(len - start));
    // From the middle of the file, the first line is most likely cut: it is passed over.
    let mut cut = start > 0;
    let read = crate::config::safe_fs::visit_lines(r, MAX_METRICS_LINE, |line| {
        if std::mem::take(&mut cut) {
            return std::ops::ControlFlow::Continue(());
        }
        if let Some(p) = line.and_then(|l| serde_json::from_slice::<MetricsPoint>(l).ok()) {
            if points.len() == KEEP_POINTS {
                points.pop_front();
            }
            points.push_back(p);
        }
        std::ops::ControlFlow::Continue(())
    });
    if let Err(e) = read {
        tracing::warn!("reading {}: {e}", path.display());
    }
    points
}

/// Every run's channel, by run id.
#[derive(Default)]
pub struct Channels {
    pub(in crate::daemon) runs: HashMap<String, Channel>,
    /// Lookups so far: the clock of `Channel::used`.
    lookups: u64,
}

impl Channels {
    pub(in crate::daemon) fn get(&mut self, id: &str, dir: &Path) -> &mut Channel {
        if !self.runs.contains_key(id) && self.runs.len() >= KEEP_CHANNELS {
            self.let_go_of_one();
        }
        let ch = self
            .runs
            .entry(id.to_string())
            .or_insert_with(|| Channel::load(dir));
        self.lookups += 1;
        ch.used = self.lookups;
        ch
    }

    /// `run`'s channel, its values those of the run's current attempt.
    pub(in crate::daemon) fn of(&mut self, run: &Run) -> &mut Channel {
        let ch = self.get(run.id(), run.dir().path());
        ch.follow_attempt(run.attempt(), run.plan().knobs());
        ch
    }

    /// Drop the least recently used channel that holds nothing the files do not (no trainer
    /// attached, no change in flight): a daemon that lives for months and is shown many runs
    /// keeps a bounded number in memory, and reads the others back from their files.
    fn let_go_of_one(&mut self) {
        let idle = self
            .runs
            .iter()
            .filter(|(_, ch)| !ch.ranks.any_attached() && ch.changes.is_empty())
            .min_by_key(|(_, ch)| ch.used)
            .map(|(id, _)| id.clone());
        if let Some(id) = idle {
            self.runs.remove(&id);
        }
    }
}

/// A `knob` push: apply now, or (with `apply_step`) a proposal to vote on.
pub(in crate::daemon) fn knob_push(
    run: &str,
    seq: u64,
    knob: KnobName,
    value: i64,
    apply_step: Option<u64>,
) -> String {
    protocol::encode(&ServerFrame {
        id: None,
        response: Response::Knob {
            run: run.to_string(),
            seq,
            knob,
            value,
            apply_step,
        },
    })
}

pub(in crate::daemon) fn profile_knob(run: &Run, knob: KnobName) -> Option<Knob> {
    match knob {
        KnobName::BatchSize => run.knob_ranges().batch_size,
        KnobName::Prefetch => run.knob_ranges().prefetch,
    }
}

pub(in crate::daemon) fn planned(values: KnobValues, knob: KnobName) -> Option<i64> {
    match knob {
        KnobName::BatchSize => values.batch_size,
        KnobName::Prefetch => values.prefetch,
    }
}

pub(in crate::daemon) fn with_value(mut values: KnobValues, knob: KnobName, v: i64) -> KnobValues {
    match knob {
        KnobName::BatchSize => values.batch_size = Some(v),
        KnobName::Prefetch => values.prefetch = Some(v),
    }
    values
}

/// What a `trainer_attach` asks.
#[derive(Debug, Clone, Default)]
pub struct Attach {
    /// The run, as the trainer names it (`GPUPILOT_RUN_ID`).
    pub run: String,
    pub pid: Option<u32>,
    /// Which rank of a distributed job; none for a single-process script.
    pub rank: Option<RankSpec>,
    /// The values the trainer uses now, by knob name.
    pub knobs: BTreeMap<String, i64>,
    /// Ranges for knobs the profile does not bound.
    pub ranges: BTreeMap<String, KnobRange>,
    /// The versions it trains with, for the run's `environment.json`.
    pub software: BTreeMap<String, String>,
}

impl Runs {
    /// `trainer_attach` on connection `conn`: the run's id, the rank the trainer said it is,
    /// the answer, and the knob pushes to send after it.
    pub fn trainer_attach(
        &self,
        conn: u64,
        tx: mpsc::Sender<String>,
        ask: Attach,
    ) -> Result<(String, Option<u32>, Response, Vec<String>), RequestError> {
        let Attach {
            run: spec,
            pid,
            rank,
            knobs,
            ranges,
            software,
        } = ask;
        let spec = spec.as_str();
        let said = rank.as_ref().map(|r| r.rank);
        let who = rank.unwrap_or(RankSpec {
            rank: 0,
            world_size: 1,
            ..RankSpec::default()
        });
        let (table, id) = self.resolve_starting(spec)?;
        let entry = table.get(&id).expect("resolved");
        if entry.run.is_finished() {
            return Err(RequestError::new(
                ErrorCode::BadState,
                format!(
                    "run {id} has ended ({}): a trainer cannot attach to it",
                    entry.run.status().as_str()
                ),
            ));
        }
        let mut channels = self.channels();
        let ch = channels.of(&entry.run);
        let dir = entry.run.dir().path().to_path_buf();
        drop(table);
        let (rank_no, world) = (who.rank, who.world_size);
        let spec = said.is_some().then(|| who.clone());
        match ch.ranks.attach(who, TrainerConn { conn, tx, pid }) {
            Ok(Some(old)) => tracing::info!(
                "run {id}: a new trainer connection replaces connection {} (rank {rank_no})",
                old.conn
            ),
            Ok(None) => {}
            Err(Refused(reason)) => {
                drop(channels);
                tracing::warn!("run {id}: trainer attach refused: {reason}");
                self.events.record(NodeEvent::RankRefused {
                    run: id.clone(),
                    rank: rank_no,
                    world_size: world,
                    pid,
                    reason: reason.clone(),
                });
                return Err(RequestError::new(
                    ErrorCode::BadRequest,
                    format!("run {id}: {reason}; this connection is not attached"),
                ));
            }
        }
        // A job of several ranks keeps the values it agreed on: a rank that attaches later
        // is told them (the SDK takes them when it has not started training yet).
        let distributed = ch.ranks.distributed();
        for (name, v) in &knobs {
            if let Some(k) = KnobName::parse(name) {
                if !distributed || !ch.values.contains_key(&k) {
                    ch.values.insert(k, *v);
                }
            }
        }
        for (name, r) in &ranges {
            if let Some(k) = KnobName::parse(name) {
                ch.trainer_ranges.insert(k, *r);
            }
        }
        // Changes for the next batch its connection did not take (or asked of its last
        // connection) go out now.
        let pushes = ch.resent_at_attach(&id);
        let values = ch
            .values
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), *v))
            .collect();
        drop(channels);
        if spec.is_some() || !software.is_empty() {
            let now = std::time::SystemTime::now();
            if let Err(e) =
                crate::report::environment::record_trainer(&dir, spec.as_ref(), &software, now)
            {
                tracing::warn!("run {id}: the trainer's environment not recorded: {e}");
            }
        }
        self.events.record(NodeEvent::Trainer {
            run: id.clone(),
            attached: true,
            pid,
            rank: said,
        });
        Ok((
            id.clone(),
            said,
            Response::TrainerAttached {
                run: id,
                knobs: values,
            },
            pushes,
        ))
    }

    /// Connection `conn` closed: if it was a rank of a run, that rank is away now (and a
    /// change to several ranks it was part of goes on without it, or is called off).
    pub fn trainer_detached(&self, conn: u64) {
        let mut channels = self.channels();
        let mut gone = Vec::new();
        for (id, ch) in channels.runs.iter_mut() {
            let Some((rank, pid)) = ch.ranks.detach(conn) else {
                continue;
            };
            let said = ch.ranks.distributed().then_some(rank);
            let mut effects = Vec::new();
            ch.rank_left(id, rank, &mut effects);
            gone.push((id.clone(), pid, said, effects));
        }
        drop(channels);
        for (run, pid, rank, effects) in gone {
            self.events.record(NodeEvent::Trainer {
                run: run.clone(),
                attached: false,
                pid,
                rank,
            });
            self.apply_effects(&run, effects);
        }
    }

    /// A metrics report from `run`'s trainer.
    pub fn trainer_metrics(&self, run: &str, rank: Option<u32>, report: MetricsReport) -> Response {
        let mut channels = self.channels();
        match channels.runs.get_mut(run) {
            Some(ch) => {
                ch.record(report, FROM_TRAINER, rank);
                Response::Ok {}
            }
            None => RequestError::new(ErrorCode::BadState, "attach first").into_response(),
        }
    }

    /// `trainer_error` from `run`'s trainer: recorded; an out-of-memory marks the attempt.
    pub fn trainer_error(&self, run: &str, kind: String, message: Option<String>) -> Response {
        let mut table = self.table();
        if let Some(entry) = table.get_mut(run) {
            if kind == "oom" {
                entry.run.mark_oom();
            }
            append_run_event(
                &entry.run,
                Event::TrainerError {
                    kind: kind.clone(),
                    message: message.clone(),
                },
            );
        }
        drop(table);
        self.events.record(NodeEvent::TrainerError {
            run: run.into(),
            kind,
            message,
        });
        Response::Ok {}
    }

    /// `run_metrics`: reports from number `since` on, and the run's knobs and trainer.
    pub(in crate::daemon) fn run_metrics(
        &self,
        spec: &str,
        since: u64,
        max: Option<u32>,
    ) -> Result<Response, RequestError> {
        let table = self.table();
        let id = table.resolve(spec)?;
        let run = &table.get(&id).expect("resolved").run;
        let ranges = run.knob_ranges().clone();
        let plan = run.plan().knobs();
        let mut channels = self.channels();
        let ch = channels.of(run);
        drop(table);
        let max = max.unwrap_or(MAX_METRICS).min(MAX_METRICS) as usize;
        // Kept in the order of their numbers: the first one asked for is found by halving.
        let first = ch.points.partition_point(|p| p.n < since);
        let points: Vec<MetricsPoint> = ch.points.range(first..).take(max).cloned().collect();
        let next = points.last().map_or(since.min(ch.next_n), |p| p.n + 1);
        Ok(Response::RunMetrics {
            run: id,
            points,
            next,
            trainer: ch.info(&ranges, plan),
        })
    }

    /// Every live run with its trainer side, read-only (the `/metrics` exporter reads it).
    pub(in crate::daemon) fn live_trainers(&self) -> Vec<(protocol::RunInfo, TrainerInfo)> {
        let table = self.table();
        let mut channels = self.channels();
        // The live runs only: a node keeps every ended run, and this runs at each snapshot.
        table
            .list_live(std::time::SystemTime::now())
            .into_iter()
            .filter_map(|info| {
                let run = &table.get(&info.id)?.run;
                let ch = channels.of(run);
                let trainer = ch.info(run.knob_ranges(), run.plan().knobs());
                Some((info, trainer))
            })
            .collect()
    }

    /// The GPUs of each live run of several ranks, by run id (GPUs that its ranks named), for
    /// power decisions that treat a job's GPUs together.
    pub fn job_gpu_groups(&self) -> Vec<(String, Vec<u32>)> {
        let channels = self.channels();
        channels
            .runs
            .iter()
            .filter(|(_, ch)| ch.ranks.distributed() && ch.ranks.any_attached())
            .filter_map(|(id, ch)| {
                let mut gpus: Vec<u32> = ch
                    .ranks
                    .info()
                    .iter()
                    .filter(|r| r.attached)
                    .filter_map(|r| r.spec.gpu)
                    .collect();
                gpus.sort_unstable();
                gpus.dedup();
                (!gpus.is_empty()).then(|| (id.clone(), gpus))
            })
            .collect()
    }

    /// Read new output of live runs whose trainer is not attached, for metrics (JSON lines
    /// and the profile's patterns). Called from the run poll.
    pub(in crate::daemon) fn parse_outputs(&self) {
        let table = self.table();
        let live: Vec<(String, PathBuf, MetricsSettings)> = table
            .live()
            .map(|r| {
                (
                    r.id().to_string(),
                    r.dir().path().to_path_buf(),
                    r.metrics_settings().clone(),
                )
            })
            .collect();
        let mut channels = self.channels();
        drop(table);
        for (id, dir, settings) in live {
            if !OutputRules::reads_anything(&settings) {
                continue;
            }
            let ch = channels.get(&id, &dir);
            let lines = read_new_lines(&dir.join("stdout.log"), &mut ch.parser);
            let err_lines = if settings.preset == crate::profile::MetricsPreset::None {
                Vec::new()
            } else {
                read_new_lines(&dir.join("stderr.log"), &mut ch.err_parser)
            };
            if ch.ranks.any_attached() || ch.sdk_reported {
                // The SDK reports (or did: a rank's last lines printed after it detached are
                // the same reports again); what the script prints is not read twice.
                continue;
            }
            let patterns = ch.parser.patterns.get_or_insert_with(|| {
                settings
                    .patterns
                    .iter()
                    .filter_map(|p| regex::Regex::new(p).ok())
                    .collect()
            });
            let mut found = ch.preset;
            let mut rules = OutputRules {
                settings: &settings,
                patterns,
                found: &mut found,
            };
            let (mut reports, newly) = rules.reports(&lines, true);
            let (err_reports, newly_err) = rules.reports(&err_lines, false);
            reports.extend(err_reports);
            ch.preset = found;
            for (rank, r) in reports {
                ch.record(r, "stdout", rank);
            }
            if let Some(preset) = newly.or(newly_err) {
                let chosen = settings.preset != crate::profile::MetricsPreset::Auto;
                tracing::info!("run {id}: metrics read as {}'s log lines", preset.as_str());
                self.events.record(NodeEvent::MetricsPreset {
                    run: id.clone(),
                    preset: preset.as_str().to_string(),
                    from_profile: chosen,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::runs::knob_changes::Mode;

    /// A run can write its own directory: links in the place of its metrics and its knobs are
    /// not followed (a link to `/dev/zero` would be read for ever), and the channel starts
    /// empty.
    #[test]
    fn links_in_the_place_of_metrics_and_knobs_are_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        for name in ["metrics.jsonl", "knobs.json"] {
            std::os::unix::fs::symlink("/dev/zero", tmp.path().join(name)).unwrap();
        }
        let ch = Channel::load(tmp.path());
        assert!(ch.points.is_empty() && ch.values.is_empty());
        assert_eq!((ch.seq, ch.next_n), (0, 0));
    }

    #[test]
    fn a_new_daemon_numbers_reports_on_from_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let mut ch = Channel::load(tmp.path());
        for step in 0..3 {
            ch.record(
                MetricsReport {
                    step: Some(step),
                    ..MetricsReport::default()
                },
                "trainer",
                None,
            );
        }
        let again = Channel::load(tmp.path());
        assert_eq!(again.next_n, 3);
        let steps: Vec<_> = again.points.iter().map(|p| p.report.step).collect();
        assert_eq!(steps, [Some(0), Some(1), Some(2)]);
    }

    /// A run can write its `metrics.jsonl` too: a line that is not text, or too long, is passed
    /// over and the reports after it are still read back.
    #[test]
    fn reports_after_a_bad_line_are_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        let line = |n: u64| {
            let p = MetricsPoint {
                n,
                t: 1.0,
                from: "trainer".into(),
                rank: None,
                report: MetricsReport {
                    step: Some(n),
                    ..MetricsReport::default()
                },
            };
            format!("{}\n", serde_json::to_string(&p).unwrap())
        };
        let mut bytes = line(0).into_bytes();
        bytes.extend_from_slice(b"{\"n\": 9, \"from\": \"\xff\"}\n");
        bytes.extend_from_slice(format!("{}\n", "x".repeat(MAX_METRICS_LINE + 1)).as_bytes());
        bytes.extend_from_slice(line(1).as_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let steps = |points: VecDeque<MetricsPoint>| -> Vec<_> {
            points.iter().map(|p| p.report.step.unwrap()).collect()
        };
        assert_eq!(steps(read_tail(&path)), [0, 1]);

        // From the middle of a long file, the line the read starts in is cut: it is passed
        // over, and the whole lines after it are read.
        let mut bytes = "x".repeat(TAIL_BYTES as usize - 10).into_bytes();
        bytes.push(b'\n');
        for n in 0..3 {
            bytes.extend_from_slice(line(n).as_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(steps(read_tail(&path)), [0, 1, 2]);
    }

    #[test]
    fn a_new_attempt_starts_from_its_plan_not_from_what_the_last_one_used() {
        let tmp = tempfile::tempdir().unwrap();
        let mut ch = Channel::load(tmp.path());
        let plan = |batch_size, prefetch| KnobValues {
            batch_size,
            prefetch,
        };
        ch.follow_attempt(0, plan(Some(64), None));
        // The trainer of attempt 0 says what it uses; the same attempt keeps it.
        ch.values.insert(KnobName::BatchSize, 64);
        ch.values.insert(KnobName::Prefetch, 4);
        ch.follow_attempt(0, plan(Some(64), None));
        assert_eq!(ch.values.get(&KnobName::Prefetch), Some(&4));
        // It ran out of memory and the policy halved the batch: attempt 1 starts with 32, and
        // a prefetch the plan never set is not known until a trainer says it.
        ch.follow_attempt(1, plan(Some(32), None));
        assert_eq!(ch.values.get(&KnobName::BatchSize), Some(&32));
        assert_eq!(ch.values.get(&KnobName::Prefetch), None);
        // What a rank of attempt 1 reported does not place a change of attempt 2.
        let (tx, _rx) = mpsc::channel(1);
        let rank = |rank| RankSpec {
            rank,
            world_size: 2,
            ..RankSpec::default()
        };
        for r in 0..2 {
            let link = TrainerConn {
                conn: u64::from(r),
                tx: tx.clone(),
                pid: None,
            };
            assert!(ch.ranks.attach(rank(r), link).is_ok());
            for step in 4998..=5000 {
                ch.record(
                    MetricsReport {
                        step: Some(step),
                        batch_size: Some(64),
                        ..MetricsReport::default()
                    },
                    "trainer",
                    Some(r),
                );
            }
        }
        ch.last_apply_step = 4000;
        assert!(ch.ranks.apply_step(now_s()).is_ok_and(|s| s > 5000));
        assert_eq!(ch.ranks.reported(KnobName::BatchSize, 0).len(), 2);
        ch.follow_attempt(2, plan(Some(32), None));
        let err = ch.ranks.apply_step(now_s()).unwrap_err();
        assert!(err.contains("rank 0 has reported no step yet"), "{err}");
        assert!(ch.ranks.reported(KnobName::BatchSize, 0).is_empty());
        assert_eq!(ch.last_apply_step, 0);
        // A channel first looked at during a later attempt keeps what it loaded.
        let mut later = Channel::load(tmp.path());
        later.values.insert(KnobName::BatchSize, 48);
        later.follow_attempt(3, plan(Some(32), None));
        assert_eq!(later.values.get(&KnobName::BatchSize), Some(&48));
    }

    /// A daemon that died after committing a change (batch 64) but before the run's next
    /// attempt was started with its own plan (the batch halved to 32 after running out of
    /// memory) leaves `knobs.json` with the committed 64: the next daemon keeps it for the
    /// attempt it was made in, and takes the later attempt's plan over it.
    #[test]
    fn a_committed_change_is_the_runs_value_only_in_its_own_attempt() {
        let plan = |batch_size| KnobValues {
            batch_size,
            prefetch: None,
        };
        let tmp = tempfile::tempdir().unwrap();
        let mut ch = Channel::load(tmp.path());
        ch.follow_attempt(0, plan(Some(128)));
        let mut change = Change::new(
            1,
            KnobName::BatchSize,
            64,
            Some(128),
            Mode::AtStep(500),
            [0, 1].into(),
            Instant::now(),
        );
        change.committed = Some(true);
        ch.changes.insert(1, change);
        ch.persist();
        drop(ch);
        // The same attempt: the committed value stands (laggard ranks are brought to it).
        let mut same = Channel::load(tmp.path());
        same.follow_attempt(0, plan(Some(128)));
        assert_eq!(same.values.get(&KnobName::BatchSize), Some(&64));
        assert_eq!(same.last_apply_step, 500);
        // A later attempt: its plan, not the value committed in attempt 0.
        let mut later = Channel::load(tmp.path());
        later.follow_attempt(1, plan(Some(32)));
        assert_eq!(later.values.get(&KnobName::BatchSize), Some(&32));
        assert_eq!(later.last_apply_step, 0);
        // A file of an older daemon does not say its attempt: its value is kept, as before
        // (there is no telling which attempt it was made in).
        std::fs::write(
            tmp.path().join("knobs.json"),
            r#"{"seq":1,"staged":{"seq":1,"knob":"batch_size","value":64,"apply_step":500,"committed":true}}"#,
        )
        .unwrap();
        let mut old = Channel::load(tmp.path());
        old.follow_attempt(1, plan(Some(32)));
        assert_eq!(old.values.get(&KnobName::BatchSize), Some(&64));
    }

    #[test]
    fn idle_channels_beyond_the_limit_are_let_go_of_oldest_first() {
        let tmp = tempfile::tempdir().unwrap();
        let mut chs = Channels::default();
        for i in 0..KEEP_CHANNELS {
            chs.get(&format!("run{i}"), tmp.path());
        }
        // run0 is in use (a trainer attached): run1, the oldest idle one, goes.
        let (tx, _rx) = mpsc::channel(1);
        let one = RankSpec {
            rank: 0,
            world_size: 1,
            ..RankSpec::default()
        };
        let link = TrainerConn {
            conn: 1,
            tx,
            pid: None,
        };
        assert!(chs.get("run0", tmp.path()).ranks.attach(one, link).is_ok());
        chs.get("new", tmp.path());
        assert_eq!(chs.runs.len(), KEEP_CHANNELS);
        assert!(chs.runs.contains_key("run0") && !chs.runs.contains_key("run1"));
    }
}
