//! Knob changes to a run of several ranks, on the daemon's side: propose for an apply step,
//! gather the votes, commit or call off, gather the acknowledgements, and bring ranks that
//! ended up on another value back to the job's (the protocol is in `ranks.rs` and in
//! docs/protocol.md, "Distributed runs").
//!
//! The channel's methods run under the channels lock and only send pushes (a `try_send` on
//! each rank's connection); what must be written elsewhere (node events, the run's events, the
//! run's plan for restarts) comes back as [`Effect`]s that [`Runs::apply_effects`] carries
//! out once that lock is let go (the run table's lock comes first, never after).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::Runs;
use super::ops::append_run_event;
use super::ranks::{Outcome, Staged};
use super::trainers::{Channel, knob_push, with_value};
use crate::daemon::base::RequestError;
use crate::protocol::{self, ErrorCode, KnobName, NodeEvent, Response, ServerFrame};
use crate::supervisor::Event;
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

/// The run's `knob_acked` line for a change to several ranks: how it ended on all of them.
fn acked(st: &Staged, applied: bool, reason: Option<String>, rtt_ms: f64) -> Effect {
    Effect::Run(Event::KnobAcked {
        seq: st.seq,
        knob: st.knob.as_str().into(),
        value: st.value,
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
    /// Propose `knob = value` to every rank for a step ahead of them all. Refused (nothing
    /// sent) while another change is in flight, while a rank of the world is not attached,
    /// or while a rank has not reported a step.
    pub(in crate::daemon) fn propose(
        &mut self,
        run: &str,
        knob: KnobName,
        value: i64,
        old: Option<i64>,
        asked: Instant,
    ) -> Result<(u64, u64, u32), RequestError> {
        if let Some(st) = &self.staged {
            return Err(RequestError::new(
                ErrorCode::BadState,
                format!(
                    "change {} ({} → {} at step {}) is still in flight on run {run}; ask again \
                     once it has landed; nothing changed",
                    st.seq, st.knob, st.value, st.apply_step
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
        let apply_step = self
            .ranks
            .apply_step(now_s())
            .map_err(|e| RequestError::new(ErrorCode::BadState, format!("{e}; nothing changed")))?;
        let seq = self.next_seq();
        let ranks: BTreeSet<u32> = self.ranks.links().map(|(r, _)| r).collect();
        let n = ranks.len() as u32;
        self.ack_note = None;
        self.staged = Some(Staged::new(seq, knob, value, old, apply_step, ranks, asked));
        self.persist();
        let line = knob_push(run, seq, knob, value, Some(apply_step));
        let mut unsent = Vec::new();
        for (r, link) in self.ranks.links() {
            if link.tx.try_send(line.clone()).is_err() {
                unsent.push(r);
            }
        }
        if !unsent.is_empty() {
            // A rank whose connection does not take the proposal cannot vote: the change is
            // called off at the vote deadline, like any silent rank.
            tracing::warn!(
                "run {run}: change {seq} could not be sent to rank {}",
                list(unsent)
            );
        }
        Ok((seq, apply_step, n))
    }

    /// A rank voted on change `seq`.
    pub(in crate::daemon) fn rank_vote(
        &mut self,
        run: &str,
        rank: u32,
        seq: u64,
        ready: bool,
        reason: Option<String>,
        effects: &mut Vec<Effect>,
    ) {
        let outcome = match self.staged.as_mut() {
            Some(st) if st.seq == seq => st.vote(rank, ready, reason, Instant::now()),
            _ => Outcome::Stray(format!(
                "voted on change {seq}, which is not in flight (it was decided, or never proposed)"
            )),
        };
        self.settle(run, Some(rank), seq, outcome, effects);
    }

    /// A rank acknowledged change `seq` (applied at `step`, or not).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::daemon) fn rank_ack(
        &mut self,
        run: &str,
        rank: u32,
        seq: u64,
        applied: bool,
        reason: Option<String>,
        step: Option<u64>,
        effects: &mut Vec<Effect>,
    ) {
        let outcome = match self.staged.as_mut() {
            Some(st) if st.seq == seq => {
                if applied && self.ack_note.is_none() {
                    // The first rank's note stands for the job's: every rank runs the same
                    // script (a learning rate scaled by the same rule).
                    self.ack_note.clone_from(&reason);
                }
                st.ack(rank, applied, step, reason)
            }
            _ if applied => Outcome::Stray(format!(
                "says it applied change {seq}{}, which is not in flight",
                step.map_or(String::new(), |s| format!(" at step {s}"))
            )),
            // A rank that called off a change the daemon no longer knows (it restarted before
            // deciding): nothing changed on that rank, which is what the others did too.
            _ => Outcome::Stray(format!(
                "kept its value for change {seq}, which this daemon did not decide: {}",
                reason.unwrap_or_else(|| "no reason given".into())
            )),
        };
        self.settle(run, Some(rank), seq, outcome, effects);
    }

    /// A rank's connection closed.
    pub(in crate::daemon) fn rank_left(&mut self, run: &str, rank: u32, effects: &mut Vec<Effect>) {
        let Some(st) = self.staged.as_mut() else {
            return;
        };
        let seq = st.seq;
        let outcome = st.left(rank);
        self.settle(run, Some(rank), seq, outcome, effects);
    }

    /// Called off for lack of votes, or acknowledgements overdue.
    pub(in crate::daemon) fn check_overdue(
        &mut self,
        run: &str,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let Some(st) = &self.staged else {
            return;
        };
        let seq = st.seq;
        if let Some(outcome) = st.overdue(now) {
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
            Outcome::Commit => self.commit(run, effects),
            Outcome::Abort { rank, reason } => self.call_off(run, rank, reason, effects),
            Outcome::Done { missed, steps } => self.finish(run, missed, steps, effects),
        }
    }

    fn commit(&mut self, run: &str, effects: &mut Vec<Effect>) {
        let Some(st) = self.staged.as_mut() else {
            return;
        };
        st.committed = Some(true);
        let (seq, knob, value, apply_step) = (st.seq, st.knob, st.value, st.apply_step);
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
        rank: Option<u32>,
        reason: String,
        effects: &mut Vec<Effect>,
    ) {
        let Some(st) = self.staged.take() else {
            return;
        };
        let line = decision(run, st.seq, false, Some(reason.clone()));
        for (_, link) in self.ranks.links() {
            let _ = link.tx.try_send(line.clone());
        }
        self.persist();
        if self.staged_repair {
            self.repair_after = Some(Instant::now() + REPAIR_BACKOFF);
        }
        self.staged_repair = false;
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

    fn finish(
        &mut self,
        run: &str,
        missed: BTreeMap<u32, String>,
        steps: BTreeMap<u32, u64>,
        effects: &mut Vec<Effect>,
    ) {
        let Some(st) = self.staged.take() else {
            return;
        };
        self.staged_repair = false;
        // Reports of steps before the last rank's switch may still carry the old value.
        let latest = steps.values().copied().max().unwrap_or(st.apply_step);
        self.last_apply_step = latest;
        let first = steps.values().copied().min().unwrap_or(st.apply_step);
        self.persist();
        let rtt_ms = st.asked.elapsed().as_secs_f64() * 1000.0;
        self.last_rtt_ms.insert(st.knob, rtt_ms);
        let note = self.ack_note.take();
        if missed.is_empty() {
            let ranks = st.applied() as u32;
            let gone = st.gone();
            self.last_outcome.insert(
                st.knob,
                match &note {
                    Some(n) => format!("applied on {ranks} ranks at step {first}; {n}"),
                    None => format!("applied on {ranks} ranks at step {first}"),
                },
            );
            if first != latest {
                // Every rank has the value, but they took it at different steps: say so (the
                // ranks report steps at different points; see the SDK's `report`).
                effects.push(Effect::Node(NodeEvent::KnobStray {
                    run: run.into(),
                    rank: None,
                    change: st.seq,
                    what: format!(
                        "the ranks applied change {} at different steps ({})",
                        st.seq,
                        steps
                            .iter()
                            .map(|(r, s)| format!("rank {r}: {s}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }));
            }
            if !gone.is_empty() {
                effects.push(Effect::Node(NodeEvent::KnobStray {
                    run: run.into(),
                    rank: gone.first().copied(),
                    change: st.seq,
                    what: format!(
                        "rank {} left after change {} was committed; it gets {} = {} when it \
                         attaches again",
                        list(gone.iter().copied()),
                        st.seq,
                        st.knob,
                        st.value
                    ),
                }));
            }
            effects.push(acked(&st, true, note, rtt_ms));
            effects.push(Effect::Node(NodeEvent::KnobApplied {
                run: run.into(),
                change: st.seq,
                knob: st.knob,
                value: st.value,
                rtt_ms,
                ranks: Some(ranks),
                step: Some(first),
            }));
            return;
        }
        // Some ranks did not take it at the step: the job's value stays the new one, and the
        // next poll brings them to it (a new change, at a new step, for every rank).
        let why = missed
            .iter()
            .map(|(r, w)| format!("rank {r}: {w}"))
            .collect::<Vec<_>>()
            .join("; ");
        self.last_outcome.insert(
            st.knob,
            format!(
                "applied on {} ranks only; the others are brought to it",
                st.applied()
            ),
        );
        self.repair_after = None;
        effects.push(acked(&st, false, Some(why.clone()), rtt_ms));
        effects.push(Effect::Node(NodeEvent::KnobRejected {
            run: run.into(),
            change: st.seq,
            knob: st.knob,
            value: st.value,
            kept: st.old,
            reason: format!(
                "applied at step {} by {} of {} ranks ({why}); every rank is brought to {} = {} \
                 with a new change",
                st.apply_step,
                st.applied(),
                st.ranks.len(),
                st.knob,
                st.value
            ),
            rtt_ms,
            rank: missed.keys().next().copied(),
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
            || self.staged.is_some()
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
            match self.propose(run, knob, target, None, now) {
                Ok((seq, apply_step, _)) => {
                    self.staged_repair = true;
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
}

impl Runs {
    /// Record what the channel's bookkeeping decided (no channel lock held).
    pub(in crate::daemon) fn apply_effects(&self, run: &str, effects: Vec<Effect>) {
        if effects.is_empty() {
            return;
        }
        let mut table = self.table();
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
        ch.rank_vote(run, rank.unwrap_or(0), seq, ready, reason, &mut effects);
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
}
