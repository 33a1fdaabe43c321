//! One state machine for every knob change, whatever the run's world size: a change is
//! proposed to the ranks, voted on, committed or called off, and acknowledged by each rank.
//! A single-process script is a job of one rank; how a change reaches the ranks is the
//! machine's one parameter, its [`Mode`], chosen from the world size when the change is asked:
//!
//! - [`Mode::NextBatch`], a run of one rank (the fast path): the change is committed when it is
//!   asked and pushed for the trainer's next batch: no vote round, no apply step, no deadline
//!   (a trainer that reconnects is told it again), and several may be in flight;
//! - [`Mode::AtStep`], a job of several ranks: all or nothing, at the same step on every rank,
//!   in two phases (docs/protocol.md, "Distributed runs"):
//!
//! 1. the daemon proposes `value` for an apply step `S` ahead of the newest step any rank
//!    reported, to every rank (`Ranks::apply_step`);
//! 2. each rank votes: ready (it can use the value and has not started step `S`) or not;
//! 3. every rank ready: the change is committed and every rank told; any refusal, a rank that
//!    leaves, or votes that do not all come within [`VOTE_WINDOW_S`]: called off, and every rank
//!    told to keep its value;
//! 4. each rank applies a committed change when it starts step `S` and acknowledges it with the
//!    step. A rank that reaches `S` before it heard the decision does not apply it (the
//!    absence of a decision never changes anything), and says so: the daemon then brings every
//!    rank back to one value with a new change.
//!
//! A change for the next batch starts at step 4: its acknowledgement ends it, applied or not.
//!
//! This file is bookkeeping only: no I/O, no locks, and times are given, not read, so tests
//! drive it step by step. `rank_changes.rs` asks changes of a run's channel, sends what the
//! machine decides and records what it led to.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use crate::protocol::{KnobName, StagedChange};

/// Votes that have not all come this long after the proposal call the change off (a rank that
/// answers nothing cannot be told apart from one that is stuck).
pub const VOTE_WINDOW_S: f64 = 0.25;
/// After commit, how long the daemon waits for every rank to say it applied the change before
/// it looks at the ranks' reports instead (a rank that reports no steps for that long has
/// stopped anyway).
pub const APPLY_WINDOW_S: f64 = 600.0;

/// How a change reaches the ranks: the machine's one parameter, chosen from the world size
/// (`Channel::mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A run of one rank: applied at the trainer's next batch. Committed when asked (one
    /// process has no one to agree with), with no deadline: the change waits for its trainer,
    /// which is told it again when it attaches.
    NextBatch,
    /// A job of several ranks: applied at this step on every rank, once every rank voted ready
    /// within [`VOTE_WINDOW_S`]; acknowledged within [`APPLY_WINDOW_S`] of the request.
    AtStep(u64),
}

impl Mode {
    /// The step the change is applied at, for a job of several ranks.
    pub fn apply_step(self) -> Option<u64> {
        match self {
            Mode::NextBatch => None,
            Mode::AtStep(step) => Some(step),
        }
    }

    /// Whether the ranks vote on it before it is committed.
    pub fn voted(self) -> bool {
        matches!(self, Mode::AtStep(_))
    }

    /// Where a rank that says it applied the change at `step` took it, or why that is not
    /// where it had to: at the apply step or past it (a rank that reports every few steps
    /// says its first report past it); for the next batch, wherever its trainer was.
    fn applied_at(self, step: Option<u64>) -> Result<Option<u64>, String> {
        match (self, step) {
            (Mode::NextBatch, _) => Ok(step),
            (Mode::AtStep(at), Some(s)) if s >= at => Ok(Some(s)),
            (Mode::AtStep(at), Some(s)) => Err(format!(
                "applied it at step {s}, before the apply step {at}"
            )),
            (Mode::AtStep(_), None) => Err("applied it without saying at which step".into()),
        }
    }

    /// Why a rank that kept its value without saying why did, as its change's end says it.
    fn no_reason(self) -> &'static str {
        match self {
            Mode::NextBatch => "the trainer gave no reason",
            Mode::AtStep(_) => "it did not apply it",
        }
    }
}

/// What a vote, an acknowledgement, a departure or the clock led to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Nothing to do yet.
    Waiting,
    /// Every rank is ready: commit.
    Commit,
    /// Call it off, for this reason (naming the rank).
    Abort { rank: Option<u32>, reason: String },
    /// Every rank has answered after the commit: `missed` are the ranks that did not apply it
    /// (with why), empty when all did; `steps` the step each one that did and said so applied
    /// it at (the apply step, or for a rank that reports every few steps, its first report
    /// past it).
    Done {
        missed: BTreeMap<u32, String>,
        steps: BTreeMap<u32, u64>,
    },
    /// Something that does not fit this change: recorded, nothing else.
    Stray(String),
}

/// A knob change in flight, to one rank or to several.
#[derive(Debug, Clone)]
pub struct Change {
    pub seq: u64,
    pub knob: KnobName,
    pub value: i64,
    pub old: Option<i64>,
    pub mode: Mode,
    pub asked: Instant,
    /// Milliseconds from the request to the last vote, once all came.
    pub votes_ms: Option<f64>,
    /// The ranks it was proposed to.
    pub ranks: BTreeSet<u32>,
    ready: BTreeSet<u32>,
    /// Decided: `Some(true)` once committed (at once for the next batch).
    pub committed: Option<bool>,
    /// The ranks that applied it, with the step they said.
    applied: BTreeMap<u32, Option<u64>>,
    missed: BTreeMap<u32, String>,
    /// Ranks that left after the commit (they get the value when they attach again).
    left: BTreeSet<u32>,
    /// What the first rank that applied it said with it (what else it changed with it: a
    /// learning rate scaled with the batch size). Every rank runs the same script, so it
    /// stands for the job's.
    pub note: Option<String>,
    /// Asked by the daemon to bring the ranks back to one value, not by a client.
    pub repair: bool,
}

impl Change {
    pub fn new(
        seq: u64,
        knob: KnobName,
        value: i64,
        old: Option<i64>,
        mode: Mode,
        ranks: BTreeSet<u32>,
        asked: Instant,
    ) -> Change {
        Change {
            seq,
            knob,
            value,
            old,
            mode,
            asked,
            votes_ms: None,
            ranks,
            ready: BTreeSet::new(),
            committed: (!mode.voted()).then_some(true),
            applied: BTreeMap::new(),
            missed: BTreeMap::new(),
            left: BTreeSet::new(),
            note: None,
            repair: false,
        }
    }

    /// The change as a run's trainer view shows it (a change at a step only).
    pub fn view(&self) -> Option<StagedChange> {
        Some(StagedChange {
            seq: self.seq,
            knob: self.knob,
            value: self.value,
            apply_step: self.mode.apply_step()?,
            ranks: self.ranks.iter().copied().collect(),
            ready: self.ready.iter().copied().collect(),
            committed: self.committed,
            applied: self.applied.keys().copied().collect(),
        })
    }

    /// `rank` voted at `now`.
    pub fn vote(
        &mut self,
        rank: u32,
        ready: bool,
        reason: Option<String>,
        now: Instant,
    ) -> Outcome {
        if !self.ranks.contains(&rank) {
            return Outcome::Stray(format!(
                "voted on change {}, which was not proposed to it",
                self.seq
            ));
        }
        if self.committed.is_some() {
            return Outcome::Stray(format!("voted on change {} after it was decided", self.seq));
        }
        if !ready {
            let reason = reason.unwrap_or_else(|| "no reason given".into());
            return Outcome::Abort {
                rank: Some(rank),
                reason: format!("rank {rank} refused: {reason}"),
            };
        }
        self.ready.insert(rank);
        if self.ready == self.ranks {
            self.votes_ms = Some(now.duration_since(self.asked).as_secs_f64() * 1000.0);
            Outcome::Commit
        } else {
            Outcome::Waiting
        }
    }

    /// `rank` says it applied the change at `step` (or did not, and why).
    pub fn ack(
        &mut self,
        rank: u32,
        applied: bool,
        step: Option<u64>,
        reason: Option<String>,
    ) -> Outcome {
        if applied && self.note.is_none() {
            // With an applied change, a reason is a note.
            self.note.clone_from(&reason);
        }
        if !self.ranks.contains(&rank) {
            return Outcome::Stray(format!(
                "acknowledged change {}, which was not proposed to it",
                self.seq
            ));
        }
        if self.committed != Some(true) {
            if applied {
                return Outcome::Stray(format!(
                    "says it applied change {} before it was committed",
                    self.seq
                ));
            }
            // Not applied, and not committed (yet): nothing changes on that rank.
            return Outcome::Waiting;
        }
        if !applied {
            let why = reason.unwrap_or_else(|| self.mode.no_reason().into());
            self.missed.insert(rank, why);
            return self.done();
        }
        match self.mode.applied_at(step) {
            Ok(at) => {
                self.applied.insert(rank, at);
            }
            Err(why) => {
                self.missed.insert(rank, why);
            }
        }
        self.done()
    }

    /// `rank`'s connection closed. A change for the next batch waits for its trainer to
    /// attach again (it is told the change then).
    pub fn left(&mut self, rank: u32) -> Outcome {
        if !self.mode.voted() || !self.ranks.contains(&rank) {
            return Outcome::Waiting;
        }
        match self.committed {
            None => Outcome::Abort {
                rank: Some(rank),
                reason: format!("rank {rank} left before every rank had agreed"),
            },
            Some(true) => {
                if !self.applied.contains_key(&rank) && !self.missed.contains_key(&rank) {
                    self.left.insert(rank);
                }
                self.done()
            }
            Some(false) => Outcome::Waiting,
        }
    }

    /// Votes or acknowledgements overdue at `now`: what that leads to. A change for the next
    /// batch has no deadline.
    pub fn overdue(&self, now: Instant) -> Option<Outcome> {
        if !self.mode.voted() {
            return None;
        }
        let waited = now.duration_since(self.asked).as_secs_f64();
        match self.committed {
            None if waited > VOTE_WINDOW_S => {
                let silent: Vec<String> = self
                    .ranks
                    .difference(&self.ready)
                    .map(|r| r.to_string())
                    .collect();
                Some(Outcome::Abort {
                    rank: None,
                    reason: format!(
                        "rank {} did not answer within {:.0} ms",
                        silent.join(", "),
                        VOTE_WINDOW_S * 1000.0
                    ),
                })
            }
            Some(true) if waited > APPLY_WINDOW_S => {
                let mut missed = self.missed.clone();
                for r in self.ranks.iter() {
                    if !self.applied.contains_key(r) && !self.left.contains(r) {
                        missed
                            .entry(*r)
                            .or_insert_with(|| "never said it applied it".into());
                    }
                }
                Some(Outcome::Done {
                    missed,
                    steps: self.steps(),
                })
            }
            _ => None,
        }
    }

    fn done(&self) -> Outcome {
        let answered = self.applied.len() + self.missed.len() + self.left.len();
        if answered >= self.ranks.len() {
            Outcome::Done {
                missed: self.missed.clone(),
                steps: self.steps(),
            }
        } else {
            Outcome::Waiting
        }
    }

    /// The step each rank that applied it said.
    fn steps(&self) -> BTreeMap<u32, u64> {
        self.applied
            .iter()
            .filter_map(|(r, s)| Some((*r, (*s)?)))
            .collect()
    }

    /// The ranks that applied it.
    pub fn applied(&self) -> usize {
        self.applied.len()
    }

    /// The ranks that left after the commit.
    pub fn gone(&self) -> &BTreeSet<u32> {
        &self.left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(n: u32) -> Change {
        Change::new(
            7,
            KnobName::BatchSize,
            64,
            Some(32),
            Mode::AtStep(100),
            (0..n).collect(),
            Instant::now(),
        )
    }

    #[test]
    fn every_rank_ready_commits_and_one_refusal_calls_it_off() {
        let now = Instant::now();
        let mut s = staged(3);
        assert_eq!(s.vote(0, true, None, now), Outcome::Waiting);
        assert_eq!(s.vote(1, true, None, now), Outcome::Waiting);
        assert_eq!(s.vote(2, true, None, now), Outcome::Commit);
        let mut s = staged(3);
        s.vote(0, true, None, now);
        let Outcome::Abort { rank, reason } = s.vote(1, false, Some("too big".into()), now) else {
            panic!()
        };
        assert_eq!(rank, Some(1));
        assert_eq!(reason, "rank 1 refused: too big");
        assert!(matches!(s.vote(9, true, None, now), Outcome::Stray(_)));
    }

    #[test]
    fn after_the_commit_every_rank_answers_or_leaves() {
        let now = Instant::now();
        let mut s = staged(3);
        for r in 0..3 {
            s.vote(r, true, None, now);
        }
        s.committed = Some(true);
        assert_eq!(s.ack(0, true, Some(100), None), Outcome::Waiting);
        assert_eq!(s.left(1), Outcome::Waiting);
        let Outcome::Done { missed, steps } = s.ack(2, false, Some(100), Some("late".into()))
        else {
            panic!()
        };
        assert_eq!(missed.get(&2).map(String::as_str), Some("late"));
        assert_eq!(steps, BTreeMap::from([(0, 100)]));
        assert_eq!(s.applied(), 1);
        assert!(s.gone().contains(&1));
        let mut s = staged(2);
        s.committed = Some(true);
        s.ack(0, true, Some(99), None);
        let Outcome::Done { missed, steps } = s.ack(1, true, Some(110), None) else {
            panic!()
        };
        assert!(missed[&0].contains("step 99, before the apply step 100"));
        assert_eq!(steps, BTreeMap::from([(1, 110)]));
    }

    #[test]
    fn a_rank_that_leaves_before_the_decision_or_silence_calls_it_off() {
        let now = Instant::now();
        let mut s = staged(2);
        s.vote(0, true, None, now);
        assert!(matches!(s.left(1), Outcome::Abort { rank: Some(1), .. }));
        let s = staged(2);
        assert!(s.overdue(now).is_none());
        let late = now + std::time::Duration::from_secs(1);
        let Some(Outcome::Abort { reason, .. }) = s.overdue(late) else {
            panic!()
        };
        assert!(reason.contains("rank 0, 1 did not answer"), "{reason}");
    }

    #[test]
    fn an_ack_for_an_undecided_change_changes_nothing() {
        let mut s = staged(2);
        assert!(matches!(s.ack(0, true, Some(100), None), Outcome::Stray(_)));
        assert_eq!(s.ack(0, false, Some(100), None), Outcome::Waiting);
    }

    fn next_batch() -> Change {
        Change::new(
            3,
            KnobName::BatchSize,
            64,
            Some(32),
            Mode::NextBatch,
            [0].into(),
            Instant::now(),
        )
    }

    /// A run of one rank: the same machine with no vote round and no apply step. The change is
    /// committed when asked, shows no staged change, and its one acknowledgement ends it, at
    /// whatever step (or none) the trainer says.
    #[test]
    fn a_change_for_the_next_batch_is_committed_when_asked_and_done_at_its_ack() {
        let mut c = next_batch();
        assert_eq!(c.committed, Some(true));
        assert!(c.view().is_none());
        let now = Instant::now();
        assert!(matches!(c.vote(0, true, None, now), Outcome::Stray(_)));
        let Outcome::Done { missed, steps } = c.ack(0, true, None, Some("lr scaled".into())) else {
            panic!()
        };
        assert!(missed.is_empty() && steps.is_empty());
        assert_eq!(c.note.as_deref(), Some("lr scaled"));
        assert_eq!(c.applied(), 1);
        let mut c = next_batch();
        let Outcome::Done { missed, .. } = c.ack(0, false, None, None) else {
            panic!()
        };
        assert_eq!(missed[&0], "the trainer gave no reason");
    }

    /// The trainer of a run of one rank may go away and come back: its change waits for it,
    /// with no deadline.
    #[test]
    fn a_change_for_the_next_batch_outlives_its_trainer_and_the_clock() {
        let mut c = next_batch();
        assert_eq!(c.left(0), Outcome::Waiting);
        let much_later = Instant::now() + std::time::Duration::from_secs(3600);
        assert!(c.overdue(much_later).is_none());
        assert!(matches!(
            c.ack(0, true, Some(5), None),
            Outcome::Done { .. }
        ));
    }
}
