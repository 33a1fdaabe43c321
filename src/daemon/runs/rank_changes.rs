//! Knob changes to a run's ranks, on the daemon's side, one rank or many: `knob_set` asks a
//! change of the run's channel, which drives it through the one state machine of
//! `knob_changes.rs` (proposal, votes, commit or call-off, acknowledgements) and, for a job of
//! several ranks, brings ranks that ended up on another value back to the job's (the protocol
//! is in docs/protocol.md, "Distributed runs").
//!
//! A single-process script is a job of one rank: its change is the same [`Change`] in
//! [`Mode::NextBatch`] (committed when asked, applied at the trainer's next batch, no vote
//! round, no apply step), the mode [`Channel::ask`] picks from the world size. Where the two
//! modes end differently (a run of one says no step and names no rank; its value becomes the
//! run's when its trainer applied it, a job's when every rank agreed), the mode says so in
//! `Channel::finish`, not a second path.
//!
//! The channel's methods run under the channels lock and only send pushes (a `try_send` on
//! each rank's connection); what must be written elsewhere (node events, the run's events, the
//! run's plan for restarts) comes back as [`Effect`]s that [`Runs::apply_effects`] carries
//! out once that lock is let go (the run table's lock comes first, never after). `knob_set`
//! records its own (the run's `changed` line, the node's `knob_changed`) the same way, with the
//! run table it holds from the start; only a restart it asks for is done in place, since its
//! failure is the request's answer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use super::Runs;
use super::knob_changes::{Change, Mode, Outcome};
use super::ops::append_run_event;
use super::table::RunTable;
use super::trainers::{Channel, knob_push, planned, profile_knob, with_value};
use crate::daemon::base::RequestError;
use crate::ipc::Peer;
use crate::protocol::{self, ErrorCode, KnobName, KnobVia, NodeEvent, Response, ServerFrame};
use crate::supervisor::{Clock, DEFAULT_GRACE, Event, Run, RunStatus};
use crate::telemetry::now_s;

/// A repair that could not be proposed or was called off is not tried again before this.
const REPAIR_BACKOFF: Duration = Duration::from_secs(30);

/// Something to record once the channels lock is let go.
pub(in crate::daemon) enum Effect {
    Node(NodeEvent),
    Run(Event),
    /// The run's knob values for its next start (a restart uses what the job agreed on).
    Plan(KnobName, i64),
}

fn decision(run: &str, seq: u64, commit: bool, reason: Option<String>) -> String {
    protocol::encode(&ServerFrame {
        id: None,
        response: Response::KnobDecision {
            run: run.into(),
            seq,
            commit,
            reason,
        },
    })
}

/// The run's `knob_acked` line: how the change ended on all its ranks.
fn acked(ch: &Change, applied: bool, reason: Option<String>, rtt_ms: f64) -> Effect {
    Effect::Run(Event::KnobAcked {
        seq: ch.seq,
        knob: ch.knob.as_str().into(),
        value: ch.value,
        applied,
        reason,
        rtt_ms,
    })
}

fn list(ranks: impl IntoIterator<Item = u32>) -> String {
    ranks
        .into_iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Channel {
    /// The change in flight at a step, if any (a job of several ranks has one at a time).
    pub(in crate::daemon) fn at_step(&self) -> Option<&Change> {
        self.changes.values().find(|c| c.mode.voted())
    }

    /// The mode a change asked now takes: the trainer's next batch for a run of one rank; for
    /// a job of several, a step ahead of them all. Refused (nothing sent) while another change
    /// is in flight at a step, while a rank of the world is not attached, or while a rank has
    /// not reported a step.
    fn mode(&self, run: &str) -> Result<Mode, RequestError> {
        if !self.ranks.distributed() {
            return Ok(Mode::NextBatch);
        }
        if let Some(st) = self.at_step() {
            return Err(RequestError::new(
                ErrorCode::BadState,
                format!(
                    "change {} ({} → {} at step {}) is still in flight on run {run}; ask again \
                     once it has landed; nothing changed",
                    st.seq,
                    st.knob,
                    st.value,
                    st.mode.apply_step().unwrap_or_default()
                ),
            ));
        }
        let missing = self.ranks.missing();
        if !missing.is_empty() {
            return Err(RequestError::new(
                ErrorCode::BadState,
                format!(
                    "rank {} of run {run}'s {} {} not attached: a change must reach every rank \
                     of the job; nothing changed",
                    list(missing.iter().copied()),
                    self.ranks.world_size().unwrap_or(0),
                    if missing.len() == 1 { "is" } else { "are" }
                ),
            ));
        }
        self.ranks
            .apply_step(now_s())
            .map(Mode::AtStep)
            .map_err(|e| RequestError::new(ErrorCode::BadState, format!("{e}; nothing changed")))
    }

    /// Ask `knob = value` (the request taken at `asked`) of every attached rank, in the mode
    /// the world size calls for (see [`Self::mode`]): the change's number, its mode and the
    /// ranks it was sent to.
    pub(in crate::daemon) fn ask(
        &mut self,
        run: &str,
        knob: KnobName,
        value: i64,
        old: Option<i64>,
        asked: Instant,
    ) -> Result<(u64, Mode, u32), RequestError> {
        let mode = self.mode(run)?;
        let seq = self.next_seq();
        // A change at a step is timed from the request: its vote window starts there. One for
        // the next batch is timed from here, its number written: its round trip is the
        // trainer's.
        let asked = if mode.voted() { asked } else { Instant::now() };
        let ranks: BTreeSet<u32> = self.ranks.links().map(|(r, _)| r).collect();
        let n = ranks.len() as u32;
        self.changes
            .insert(seq, Change::new(seq, knob, value, old, mode, ranks, asked));
        if mode.voted() {
            // Kept in `knobs.json` until decided: a daemon that starts again knows it.
            self.persist();
        } else {
            self.last_outcome.insert(knob, "pending".into());
        }
        let line = knob_push(run, seq, knob, value, mode.apply_step());
        let mut unsent = Vec::new();
        for (r, link) in self.ranks.links() {
            if link.tx.try_send(line.clone()).is_err() {
                unsent.push(r);
            }
        }
        if !unsent.is_empty() {
            // For the next batch, it goes out again when the trainer attaches next. At a step,
            // a rank whose connection does not take the proposal cannot vote: the change is
            // called off at the vote deadline, like any silent rank.
            tracing::warn!(
                "run {run}: change {seq} could not be sent to rank {} now",
                list(unsent)
            );
        }
        Ok((seq, mode, n))
    }

    /// The pushes for a trainer that attaches: the changes for the next batch still in
    /// flight (asked while its connection did not take them, or before it reconnected). A
    /// change at a step is not sent again: its votes had their window.
    pub(in crate::daemon) fn resent_at_attach(&self, run: &str) -> Vec<String> {
        self.changes
            .values()
            .filter(|c| !c.mode.voted())
            .map(|c| knob_push(run, c.seq, c.knob, c.value, None))
            .collect()
    }

    /// A rank voted on change `seq` (only a change at a step is voted on).
    pub(in crate::daemon) fn vote(
        &mut self,
        run: &str,
        rank: u32,
        seq: u64,
        ready: bool,
        reason: Option<String>,
        effects: &mut Vec<Effect>,
    ) {
        let outcome = match self.changes.get_mut(&seq).filter(|c| c.mode.voted()) {
            Some(st) => st.vote(rank, ready, reason, Instant::now()),
            None => Outcome::Stray(format!(
                "voted on change {seq}, which is not in flight (it was decided, or never proposed)"
            )),
        };
        self.settle(run, Some(rank), seq, outcome, effects);
    }

    /// A rank acknowledged change `seq` (applied at `step`, or not). It is read in the mode
    /// the run's world size calls for now: a run of one takes a stray or repeated
    /// acknowledgement as nothing to record, a job of several records it.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::daemon) fn ack(
        &mut self,
        run: &str,
        rank: u32,
        seq: u64,
        applied: bool,
        reason: Option<String>,
        step: Option<u64>,
        effects: &mut Vec<Effect>,
    ) {
        let several = self.ranks.distributed();
        let outcome = match self
            .changes
            .get_mut(&seq)
            .filter(|c| c.mode.voted() == several)
        {
            Some(ch) => ch.ack(rank, applied, step, reason),
            None if !several => {
                tracing::debug!("run {run}: knob_ack for seq {seq}, which is not pending");
                return;
            }
            None if applied => Outcome::Stray(format!(
                "says it applied change {seq}{}, which is not in flight",
                step.map_or(String::new(), |s| format!(" at step {s}"))
            )),
            // A rank that called off a change the daemon no longer knows (it restarted before
            // deciding): nothing changed on that rank, which is what the others did too.
            None => Outcome::Stray(format!(
                "kept its value for change {seq}, which this daemon did not decide: {}",
                reason.unwrap_or_else(|| "no reason given".into())
            )),
        };
        self.settle(run, Some(rank), seq, outcome, effects);
    }

    /// A rank's connection closed: each change in flight goes on without it, or is called off
    /// (a change for the next batch waits for its trainer).
    pub(in crate::daemon) fn rank_left(&mut self, run: &str, rank: u32, effects: &mut Vec<Effect>) {
        let seqs: Vec<u64> = self.changes.keys().copied().collect();
        for seq in seqs {
            if let Some(outcome) = self.changes.get_mut(&seq).map(|c| c.left(rank)) {
                self.settle(run, Some(rank), seq, outcome, effects);
            }
        }
    }

    /// Called off for lack of votes, or acknowledgements overdue.
    pub(in crate::daemon) fn check_overdue(
        &mut self,
        run: &str,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let due: Vec<(u64, Outcome)> = self
            .changes
            .values()
            .filter_map(|c| Some((c.seq, c.overdue(now)?)))
            .collect();
        for (seq, outcome) in due {
            self.settle(run, None, seq, outcome, effects);
        }
    }

    /// Carry out what an outcome says.
    fn settle(
        &mut self,
        run: &str,
        from: Option<u32>,
        seq: u64,
        outcome: Outcome,
        effects: &mut Vec<Effect>,
    ) {
        match outcome {
            Outcome::Waiting => {}
            Outcome::Stray(what) => {
                tracing::warn!(
                    "run {run}: rank {}: {what}",
                    from.map_or("?".into(), |r| r.to_string())
                );
                effects.push(Effect::Node(NodeEvent::KnobStray {
                    run: run.into(),
                    rank: from,
                    change: seq,
                    what,
                }));
            }
            Outcome::Commit => self.commit(run, seq, effects),
            Outcome::Abort { rank, reason } => self.call_off(run, seq, rank, reason, effects),
            Outcome::Done { missed, steps } => self.finish(run, seq, missed, steps, effects),
        }
    }

    /// Every rank voted ready: the job's value is the new one.
    fn commit(&mut self, run: &str, seq: u64, effects: &mut Vec<Effect>) {
        let Some(st) = self.changes.get_mut(&seq) else {
            return;
        };
        let Mode::AtStep(apply_step) = st.mode else {
            return;
        };
        st.committed = Some(true);
        let (knob, value) = (st.knob, st.value);
        let ranks = st.ranks.len() as u32;
        let rtt_ms = st.votes_ms.unwrap_or_default();
        // Written before any rank hears it: a daemon that dies now knows, when it starts
        // again, that the job's value is the new one.
        self.values.insert(knob, value);
        self.persist();
        let line = decision(run, seq, true, None);
        for (_, link) in self.ranks.links() {
            let _ = link.tx.try_send(line.clone());
        }
        self.last_outcome
            .insert(knob, format!("committed for step {apply_step}"));
        effects.push(Effect::Plan(knob, value));
        effects.push(Effect::Node(NodeEvent::KnobStaged {
            run: run.into(),
            change: seq,
            knob,
            value,
            apply_step,
            ranks,
            rtt_ms,
        }));
    }

    fn call_off(
        &mut self,
        run: &str,
        seq: u64,
        rank: Option<u32>,
        reason: String,
        effects: &mut Vec<Effect>,
    ) {
        let Some(st) = self.changes.remove(&seq) else {
            return;
        };
        let line = decision(run, st.seq, false, Some(reason.clone()));
        for (_, link) in self.ranks.links() {
            let _ = link.tx.try_send(line.clone());
        }
        self.persist();
        if st.repair {
            self.repair_after = Some(Instant::now() + REPAIR_BACKOFF);
        }
        let rtt_ms = st.asked.elapsed().as_secs_f64() * 1000.0;
        self.last_rtt_ms.insert(st.knob, rtt_ms);
        self.last_outcome
            .insert(st.knob, format!("called off: {reason}"));
        let kept = self.values.get(&st.knob).copied().or(st.old);
        effects.push(acked(&st, false, Some(reason.clone()), rtt_ms));
        effects.push(Effect::Node(NodeEvent::KnobRejected {
            run: run.into(),
            change: st.seq,
            knob: st.knob,
            value: st.value,
            kept,
            reason: format!("called off on every rank: {reason}"),
            rtt_ms,
            rank,
        }));
    }

    /// Every rank answered after the commit (or the time for it is up).
    fn finish(
        &mut self,
        run: &str,
        seq: u64,
        missed: BTreeMap<u32, String>,
        steps: BTreeMap<u32, u64>,
        effects: &mut Vec<Effect>,
    ) {
        let Some(ch) = self.changes.remove(&seq) else {
            return;
        };
        if let Some(apply_step) = ch.mode.apply_step() {
            // Reports of steps before the last rank's switch may still carry the old value.
            self.last_apply_step = steps.values().copied().max().unwrap_or(apply_step);
            self.persist();
        }
        let rtt_ms = ch.asked.elapsed().as_secs_f64() * 1000.0;
        self.last_rtt_ms.insert(ch.knob, rtt_ms);
        if missed.is_empty() {
            self.applied_everywhere(run, ch, steps, rtt_ms, effects);
        } else {
            self.missed_somewhere(run, ch, missed, rtt_ms, effects);
        }
    }

    /// Every rank applied `ch`.
    fn applied_everywhere(
        &mut self,
        run: &str,
        ch: Change,
        steps: BTreeMap<u32, u64>,
        rtt_ms: f64,
        effects: &mut Vec<Effect>,
    ) {
        let ranks = ch.applied() as u32;
        let (outcome, first) = match ch.mode {
            Mode::NextBatch => {
                // The run's value once its trainer has it (a job's is from its commit).
                self.values.insert(ch.knob, ch.value);
                effects.push(Effect::Plan(ch.knob, ch.value));
                ("applied".to_string(), None)
            }
            Mode::AtStep(apply_step) => {
                let first = steps.values().copied().min().unwrap_or(apply_step);
                self.strays_after_landing(run, &ch, first, &steps, effects);
                (
                    format!("applied on {ranks} ranks at step {first}"),
                    Some(first),
                )
            }
        };
        self.last_outcome.insert(
            ch.knob,
            match &ch.note {
                Some(n) => format!("{outcome}; {n}"),
                None => outcome,
            },
        );
        effects.push(acked(&ch, true, ch.note.clone(), rtt_ms));
        effects.push(Effect::Node(NodeEvent::KnobApplied {
            run: run.into(),
            change: ch.seq,
            knob: ch.knob,
            value: ch.value,
            rtt_ms,
            ranks: ch.mode.voted().then_some(ranks),
            step: first,
        }));
    }

    /// What a job's landed change leaves to say: ranks that took it at different steps, and
    /// ranks that left after the commit.
    fn strays_after_landing(
        &self,
        run: &str,
        ch: &Change,
        first: u64,
        steps: &BTreeMap<u32, u64>,
        effects: &mut Vec<Effect>,
    ) {
        let latest = steps.values().copied().max().unwrap_or(first);
        if first != latest {
            // Every rank has the value, but they took it at different steps: say so (the
            // ranks report steps at different points; see the SDK's `report`).
            effects.push(Effect::Node(NodeEvent::KnobStray {
                run: run.into(),
                rank: None,
                change: ch.seq,
                what: format!(
                    "the ranks applied change {} at different steps ({})",
                    ch.seq,
                    steps
                        .iter()
                        .map(|(r, s)| format!("rank {r}: {s}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }));
        }
        let gone = ch.gone();
        if !gone.is_empty() {
            effects.push(Effect::Node(NodeEvent::KnobStray {
                run: run.into(),
                rank: gone.first().copied(),
                change: ch.seq,
                what: format!(
                    "rank {} left after change {} was committed; it gets {} = {} when it \
                     attaches again",
                    list(gone.iter().copied()),
                    ch.seq,
                    ch.knob,
                    ch.value
                ),
            }));
        }
    }

    /// Some rank did not apply `ch`. A run of one keeps its value. A job's value stays the
    /// new one, and the next poll brings the ranks that did not take it at the step to it (a
    /// new change, at a new step, for every rank).
    fn missed_somewhere(
        &mut self,
        run: &str,
        ch: Change,
        missed: BTreeMap<u32, String>,
        rtt_ms: f64,
        effects: &mut Vec<Effect>,
    ) {
        let (outcome, why, kept, reason, rank) = match ch.mode {
            Mode::NextBatch => {
                let why = missed.into_values().next().unwrap_or_default();
                let kept = self.values.get(&ch.knob).copied();
                (format!("rejected: {why}"), why.clone(), kept, why, None)
            }
            Mode::AtStep(apply_step) => {
                let why = missed
                    .iter()
                    .map(|(r, w)| format!("rank {r}: {w}"))
                    .collect::<Vec<_>>()
                    .join("; ");
                self.repair_after = None;
                let outcome = format!(
                    "applied on {} ranks only; the others are brought to it",
                    ch.applied()
                );
                let reason = format!(
                    "applied at step {apply_step} by {} of {} ranks ({why}); every rank is \
                     brought to {} = {} with a new change",
                    ch.applied(),
                    ch.ranks.len(),
                    ch.knob,
                    ch.value
                );
                (outcome, why, ch.old, reason, missed.keys().next().copied())
            }
        };
        self.last_outcome.insert(ch.knob, outcome);
        effects.push(acked(&ch, false, Some(why), rtt_ms));
        effects.push(Effect::Node(NodeEvent::KnobRejected {
            run: run.into(),
            change: ch.seq,
            knob: ch.knob,
            value: ch.value,
            kept,
            reason,
            rtt_ms,
            rank,
        }));
    }

    /// Ranks whose reports (of steps since the last change took effect) show another value
    /// than the job's: propose the job's value to every rank. At most one change in flight,
    /// and a repair that failed is not tried again before [`REPAIR_BACKOFF`].
    pub(in crate::daemon) fn check_agreement(
        &mut self,
        run: &str,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        if !self.ranks.distributed()
            || self.at_step().is_some()
            || self.repair_after.is_some_and(|t| now < t)
            || !self.ranks.missing().is_empty()
        {
            return;
        }
        for knob in KnobName::ALL {
            let Some(&target) = self.values.get(&knob) else {
                continue;
            };
            let off: Vec<(u32, i64)> = self
                .ranks
                .reported(knob, self.last_apply_step)
                .into_iter()
                .filter(|(_, v)| *v != target)
                .collect();
            let Some(&(first, _)) = off.first() else {
                continue;
            };
            let uses = off
                .iter()
                .map(|(r, v)| format!("rank {r} uses {v}"))
                .collect::<Vec<_>>()
                .join(", ");
            match self.ask(run, knob, target, None, now) {
                Ok((seq, mode, _)) => {
                    if let Some(ch) = self.changes.get_mut(&seq) {
                        ch.repair = true;
                    }
                    let apply_step = mode.apply_step().unwrap_or_default();
                    effects.push(Effect::Node(NodeEvent::KnobStray {
                        run: run.into(),
                        rank: Some(first),
                        change: seq,
                        what: format!(
                            "the ranks disagree on {knob} ({uses}; the job's is {target}): every \
                             rank is brought to {target} at step {apply_step}"
                        ),
                    }));
                }
                Err(e) => {
                    self.repair_after = Some(now + REPAIR_BACKOFF);
                    tracing::warn!(
                        "run {run}: ranks disagree on {knob} ({uses}): {}",
                        e.message
                    );
                }
            }
            return;
        }
    }

    /// A `knob_set` that no trainer can take: the run restarts with `value` (see
    /// [`restart_with`]). Its change number, for the answer and the run's events.
    fn restarted(&mut self, knob: KnobName, value: i64) -> u64 {
        let seq = self.next_seq();
        self.values.insert(knob, value);
        self.last_outcome.insert(knob, "restarted".into());
        seq
    }
}

/// A run that is over or stopping takes no change.
fn refuse_if_ending(run: &Run, id: &str) -> Result<(), RequestError> {
    if !run.is_finished() && run.status() != RunStatus::Stopping {
        return Ok(());
    }
    Err(RequestError::new(
        ErrorCode::BadState,
        format!(
            "run {id} is {}; nothing changed",
            if run.is_finished() {
                "over"
            } else {
                "stopping"
            }
        ),
    ))
}

/// `knob = value` checked against the run's range (its profile's, or what its trainer
/// declared): the value it replaces.
fn checked_old(
    ch: &Channel,
    run: &Run,
    id: &str,
    knob: KnobName,
    value: i64,
) -> Result<Option<i64>, RequestError> {
    let Some(range) = ch.range(knob, profile_knob(run, knob)) else {
        return Err(RequestError::new(
            ErrorCode::BadRequest,
            format!(
                "run {id} has no {knob} knob: give its profile a [knobs.{knob}] section \
                 (initial, min, max), or let its trainer declare a range; nothing changed"
            ),
        ));
    };
    if !range.allows(value) {
        return Err(RequestError::new(
            ErrorCode::BadRequest,
            format!(
                "{knob} = {value} is outside run {id}'s allowed range {range}; nothing changed"
            ),
        ));
    }
    Ok(ch
        .values
        .get(&knob)
        .copied()
        .or_else(|| planned(run.plan().knobs(), knob)))
}

/// How a change reaches the run: through its trainers (any attached, one rank or many), else
/// a restart with the value in its command line: now when allowed (`restart`), or at the
/// next attempt of a run that ended and waits to be restarted (its policy's backoff: no
/// process to disturb). A job of several ranks with none attached (between attempts, or
/// before they connect) is restarted as a single process is.
fn route(
    ch: &Channel,
    run: &Run,
    id: &str,
    knob: KnobName,
    value: i64,
    restart: bool,
) -> Result<KnobVia, RequestError> {
    if ch.ranks.any_attached() {
        return Ok(KnobVia::Trainer);
    }
    if run.status() == RunStatus::Backoff {
        return Ok(KnobVia::Restart);
    }
    if !run.plan().command_uses(knob.as_str()) {
        return Err(RequestError::new(
            ErrorCode::BadState,
            format!(
                "no trainer is attached to run {id} (it does not use the gpupilot SDK, or has \
                 not connected yet) and its command has no {{{knob}}} placeholder, so {knob} \
                 cannot reach it; nothing changed"
            ),
        ));
    }
    if !restart {
        return Err(RequestError::new(
            ErrorCode::RestartNeeded,
            format!(
                "no trainer is attached to run {id}, and its command takes {{{knob}}}: \
                 the change needs a restart with the new value (ask again allowing it: \
                 `gpupilot set {id} {} {value} --restart`); nothing changed",
                knob.cli_name()
            ),
        ));
    }
    Ok(KnobVia::Restart)
}

/// The run's next start takes `knob = value`; it restarts now unless it is between attempts
/// (the policy starts the next one when its backoff is over).
fn restart_with(
    run: &mut Run,
    knob: KnobName,
    value: i64,
    clock: &dyn Clock,
) -> Result<(), RequestError> {
    let between_attempts = run.status() == RunStatus::Backoff;
    run.set_knobs(with_value(run.plan().knobs(), knob, value))?;
    if !between_attempts {
        run.restart_now(DEFAULT_GRACE, clock)?;
    }
    Ok(())
}

impl Runs {
    /// Record what the channel's bookkeeping decided (no channel lock held).
    pub(in crate::daemon) fn apply_effects(&self, run: &str, effects: Vec<Effect>) {
        if effects.is_empty() {
            return;
        }
        self.apply_effects_in(self.table(), run, effects);
    }

    /// [`Self::apply_effects`] with the run table already held (it is let go before the node
    /// events are recorded).
    fn apply_effects_in(
        &self,
        mut table: MutexGuard<'_, RunTable>,
        run: &str,
        effects: Vec<Effect>,
    ) {
        let mut nodes = Vec::new();
        for effect in effects {
            match effect {
                Effect::Node(e) => nodes.push(e),
                Effect::Run(e) => {
                    if let Some(entry) = table.get(run) {
                        append_run_event(&entry.run, e);
                    }
                }
                Effect::Plan(knob, value) => {
                    if let Some(entry) = table.get_mut(run) {
                        let values = with_value(entry.run.plan().knobs(), knob, value);
                        if let Err(e) = entry.run.set_knobs(values) {
                            tracing::warn!("run {run}: {e}");
                        }
                    }
                }
            }
        }
        drop(table);
        for e in nodes {
            self.events.record(e);
        }
    }

    /// `knob_set`: check the value against the run's range, then ask it of the run's ranks
    /// (see [`Channel::ask`]) or restart the run with it.
    pub(in crate::daemon) fn knob_set(
        &self,
        peer: &Peer,
        spec: &str,
        knob: KnobName,
        value: i64,
        restart: bool,
        why: Option<String>,
    ) -> Result<Response, RequestError> {
        let mut table = self.table();
        let id = table.resolve(spec)?;
        let run = &mut table.get_mut(&id).expect("resolved").run;
        refuse_if_ending(run, &id)?;
        let mut channels = self.channels();
        let ch = channels.of(run);
        let old = checked_old(ch, run, &id, knob, value)?;
        let via = route(ch, run, &id, knob, value, restart)?;
        // A run of several ranks: proposed to every rank for a step; the answer says which.
        let (seq, staged) = match via {
            KnobVia::Trainer => {
                let (seq, mode, ranks) = ch.ask(&id, knob, value, old, Instant::now())?;
                (seq, mode.apply_step().map(|step| (step, ranks)))
            }
            KnobVia::Restart => (ch.restarted(knob, value), None),
        };
        drop(channels);
        if via == KnobVia::Restart {
            restart_with(run, knob, value, &self.clock)?;
        }
        let by = peer.describe();
        let changed = Event::Changed {
            by: by.clone(),
            what: knob.as_str().into(),
            old: old.map(|o| o.to_string()),
            new: Some(value.to_string()),
            why: why.clone(),
        };
        let asked = NodeEvent::KnobChanged {
            run: id.clone(),
            change: seq,
            knob,
            old,
            new: value,
            via,
            by,
            why,
        };
        self.apply_effects_in(table, &id, vec![Effect::Run(changed), Effect::Node(asked)]);
        Ok(Response::KnobPending {
            run: id,
            seq,
            knob,
            old,
            value,
            via,
            apply_step: staged.map(|(step, _)| step),
            ranks: staged.map(|(_, ranks)| ranks),
        })
    }

    /// `knob_ack` from rank `rank` of `run` (none: its one trainer).
    pub fn knob_ack(
        &self,
        run: &str,
        rank: Option<u32>,
        seq: u64,
        applied: bool,
        reason: Option<String>,
        step: Option<u64>,
    ) -> Response {
        let mut channels = self.channels();
        let Some(ch) = channels.runs.get_mut(run) else {
            return Response::Ok {};
        };
        let mut effects = Vec::new();
        ch.ack(
            run,
            rank.unwrap_or(0),
            seq,
            applied,
            reason,
            step,
            &mut effects,
        );
        drop(channels);
        self.apply_effects(run, effects);
        Response::Ok {}
    }

    /// `knob_vote` from rank `rank` of `run`.
    pub fn knob_vote(
        &self,
        run: &str,
        rank: Option<u32>,
        seq: u64,
        ready: bool,
        reason: Option<String>,
        _step: Option<u64>,
    ) -> Response {
        let mut channels = self.channels();
        let Some(ch) = channels.runs.get_mut(run) else {
            return Response::Ok {};
        };
        let mut effects = Vec::new();
        ch.vote(run, rank.unwrap_or(0), seq, ready, reason, &mut effects);
        drop(channels);
        self.apply_effects(run, effects);
        Response::Ok {}
    }

    /// From the run poll: changes whose votes or acknowledgements are overdue, and ranks that
    /// disagree with their job.
    pub(in crate::daemon) fn check_rank_changes(&self) {
        let now = Instant::now();
        let mut channels = self.channels();
        let mut all = Vec::new();
        for (id, ch) in channels.runs.iter_mut() {
            if !ch.ranks.distributed() {
                continue;
            }
            let mut effects = Vec::new();
            ch.check_overdue(id, now, &mut effects);
            ch.check_agreement(id, now, &mut effects);
            if !effects.is_empty() {
                all.push((id.clone(), effects));
            }
        }
        drop(channels);
        for (run, effects) in all {
            self.apply_effects(&run, effects);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::runs::ranks::TrainerConn;
    use crate::protocol::{MetricsReport, RankSpec};
    use tokio::sync::mpsc;

    /// A channel in a temporary run directory with ranks `0..world` attached, each having
    /// reported steps 10 to 12 (a step every 20 ms); their push queues.
    fn channel(dir: &std::path::Path, world: u32) -> (Channel, Vec<mpsc::Receiver<String>>) {
        let mut ch = Channel::load(dir);
        let mut queues = Vec::new();
        for r in 0..world {
            let (tx, rx) = mpsc::channel(16);
            let spec = RankSpec {
                rank: r,
                world_size: world,
                ..RankSpec::default()
            };
            let link = TrainerConn {
                conn: u64::from(r),
                tx,
                pid: Some(100 + r),
            };
            assert!(ch.ranks.attach(spec, link).is_ok());
            for step in 10..=12 {
                let report = MetricsReport {
                    step: Some(step),
                    step_time_s: Some(0.02),
                    batch_size: Some(32),
                    ..MetricsReport::default()
                };
                ch.record(report, "trainer", Some(r));
            }
            queues.push(rx);
        }
        ch.values.insert(KnobName::BatchSize, 32);
        (ch, queues)
    }

    fn pushed(rx: &mut mpsc::Receiver<String>) -> serde_json::Value {
        serde_json::from_str(&rx.try_recv().expect("a push")).unwrap()
    }

    fn nodes(effects: &[Effect]) -> Vec<&NodeEvent> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Node(n) => Some(n),
                _ => None,
            })
            .collect()
    }

    /// A run of one rank: the change goes out for the trainer's next batch (no apply step, no
    /// vote), shows as pending, and its acknowledgement makes it the run's value, with the
    /// trainer's note; a repeated acknowledgement records nothing.
    #[test]
    fn a_change_to_one_rank_is_applied_at_its_next_batch_without_a_vote() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut ch, mut rx) = channel(tmp.path(), 1);
        let (seq, mode, ranks) = ch
            .ask("r", KnobName::BatchSize, 64, Some(32), Instant::now())
            .unwrap();
        assert_eq!((seq, mode, ranks), (1, Mode::NextBatch, 1));
        let push = pushed(&mut rx[0]);
        assert_eq!(
            (push["seq"].as_u64(), push["value"].as_i64()),
            (Some(1), Some(64))
        );
        assert!(push.get("apply_step").is_none(), "{push}");
        assert!(ch.at_step().is_none());
        assert_eq!(ch.last_outcome[&KnobName::BatchSize], "pending");
        // A vote on it is stray: nothing is voted on for one rank.
        let mut effects = Vec::new();
        ch.vote("r", 0, seq, true, None, &mut effects);
        assert!(matches!(nodes(&effects)[..], [NodeEvent::KnobStray { .. }]));
        let mut effects = Vec::new();
        ch.ack(
            "r",
            0,
            seq,
            true,
            Some("lr scaled".into()),
            None,
            &mut effects,
        );
        assert!(ch.changes.is_empty());
        assert_eq!(ch.values[&KnobName::BatchSize], 64);
        assert_eq!(ch.last_outcome[&KnobName::BatchSize], "applied; lr scaled");
        assert!(matches!(effects[0], Effect::Plan(KnobName::BatchSize, 64)));
        let Effect::Run(Event::KnobAcked {
            applied: true,
            reason: Some(note),
            ..
        }) = &effects[1]
        else {
            panic!("no knob_acked")
        };
        assert_eq!(note, "lr scaled");
        let [
            NodeEvent::KnobApplied {
                change: 1,
                value: 64,
                ranks: None,
                step: None,
                ..
            },
        ] = nodes(&effects)[..]
        else {
            panic!("no knob_applied")
        };
        let mut again = Vec::new();
        ch.ack("r", 0, seq, true, None, None, &mut again);
        assert!(again.is_empty());
    }

    /// A run of one rank keeps its value when its trainer refuses, and says why (or that it
    /// gave no reason); changes for the next batch may be several in flight, and a trainer
    /// that attaches again is told them.
    #[test]
    fn a_change_one_rank_refuses_keeps_its_value_and_waits_for_a_new_connection() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut ch, _rx) = channel(tmp.path(), 1);
        let now = Instant::now();
        let (one, ..) = ch.ask("r", KnobName::BatchSize, 64, Some(32), now).unwrap();
        let (two, ..) = ch.ask("r", KnobName::Prefetch, 4, None, now).unwrap();
        let mut effects = Vec::new();
        ch.rank_left("r", 0, &mut effects);
        ch.check_overdue("r", now + Duration::from_secs(3600), &mut effects);
        assert!(effects.is_empty());
        assert_eq!(ch.resent_at_attach("r").len(), 2);
        ch.ack("r", 0, one, false, None, None, &mut effects);
        let [
            NodeEvent::KnobRejected {
                kept: Some(32),
                reason,
                rank: None,
                ..
            },
        ] = nodes(&effects)[..]
        else {
            panic!("no knob_rejected")
        };
        assert_eq!(reason, "the trainer gave no reason");
        assert_eq!(
            ch.last_outcome[&KnobName::BatchSize],
            "rejected: the trainer gave no reason"
        );
        assert_eq!(ch.values[&KnobName::BatchSize], 32);
        assert_eq!(ch.changes.keys().copied().collect::<Vec<_>>(), [two]);
    }

    /// A job of two ranks: the same machine at a step, voted on, committed (the job's value
    /// from then, kept in `knobs.json`), applied by both at the step.
    #[test]
    fn a_change_to_two_ranks_is_voted_on_and_applied_at_its_step() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut ch, mut rx) = channel(tmp.path(), 2);
        let (seq, mode, ranks) = ch
            .ask("r", KnobName::BatchSize, 64, Some(32), Instant::now())
            .unwrap();
        let Mode::AtStep(step) = mode else {
            panic!("{mode:?}")
        };
        assert!(step > 12 && ranks == 2, "{step}");
        for q in &mut rx {
            assert_eq!(pushed(q)["apply_step"].as_u64(), Some(step));
        }
        let again = ch.ask("r", KnobName::BatchSize, 16, None, Instant::now());
        assert!(again.unwrap_err().message.contains("is still in flight"));
        let mut effects = Vec::new();
        ch.vote("r", 0, seq, true, None, &mut effects);
        assert!(effects.is_empty());
        ch.vote("r", 1, seq, true, None, &mut effects);
        assert!(matches!(
            nodes(&effects)[..],
            [NodeEvent::KnobStaged { ranks: 2, .. }]
        ));
        assert_eq!(ch.values[&KnobName::BatchSize], 64);
        let kept = std::fs::read_to_string(tmp.path().join("knobs.json")).unwrap();
        assert!(kept.contains("\"committed\":true"), "{kept}");
        let mut effects = Vec::new();
        ch.ack("r", 0, seq, true, None, Some(step), &mut effects);
        ch.ack("r", 1, seq, true, None, Some(step), &mut effects);
        let [
            NodeEvent::KnobApplied {
                ranks, step: at, ..
            },
        ] = nodes(&effects)[..]
        else {
            panic!("no knob_applied")
        };
        assert_eq!((*ranks, *at), (Some(2), Some(step)));
        assert_eq!(
            ch.last_outcome[&KnobName::BatchSize],
            format!("applied on 2 ranks at step {step}")
        );
        assert!(ch.changes.is_empty() && ch.last_apply_step == step);
    }
}
