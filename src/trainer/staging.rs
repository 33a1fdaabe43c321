//! A rank's side of a knob change to a job of several ranks (docs/protocol.md, "Distributed
//! runs"): the daemon proposes `value` for `knob` at `apply_step`; the rank votes (ready if the
//! value is one it can take and it has not yet started that step); the daemon commits or calls
//! it off; a committed change is applied exactly when the rank starts `apply_step` and
//! acknowledged with that step. A change still undecided when its step comes is not applied
//! (presumed abort) and is acknowledged as not applied.
//!
//! Steps are numbered as reports number them: `step = k` in a report means step k is done, so
//! the next step to start is `k + 1`, and a change for step S is in effect for S and later.
//!
//! Pure: the caller sends the votes and acknowledgements this returns.

use super::model::Model;
use crate::protocol::KnobName;

/// A vote to send (`knob_vote`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vote {
    pub seq: u64,
    pub ready: bool,
    pub reason: Option<String>,
    /// Steps done when voting.
    pub step: u64,
}

/// An acknowledgement to send (`knob_ack` with the step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub seq: u64,
    pub applied: bool,
    pub reason: Option<String>,
    pub step: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Staged {
    seq: u64,
    knob: KnobName,
    value: i64,
    apply_step: u64,
    /// `None` until the decision comes.
    committed: Option<bool>,
}

/// The changes a rank has voted for and not yet applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Staging {
    staged: Vec<Staged>,
}

impl Staging {
    /// A proposal: the vote on it. A change the rank is ready for is kept until its decision
    /// or its step, whichever comes first.
    pub fn propose(
        &mut self,
        model: &Model,
        seq: u64,
        knob: KnobName,
        value: i64,
        apply_step: u64,
    ) -> Vote {
        let done = model.step;
        let refuse = if apply_step <= done {
            Some(format!(
                "step {apply_step} has begun here ({done} steps done)"
            ))
        } else {
            model.check(knob, value).err().map(|e| e.to_string())
        };
        if refuse.is_none() {
            self.staged.push(Staged {
                seq,
                knob,
                value,
                apply_step,
                committed: None,
            });
        }
        Vote {
            seq,
            ready: refuse.is_none(),
            reason: refuse,
            step: done,
        }
    }

    /// The daemon's decision on `seq`: a commit waits for its step, a call-off is forgotten.
    /// A decision on a change this rank does not hold (refused, or already past) changes
    /// nothing.
    pub fn decide(&mut self, seq: u64, commit: bool) {
        if commit {
            if let Some(s) = self.staged.iter_mut().find(|s| s.seq == seq) {
                s.committed = Some(true);
            }
        } else {
            self.staged.retain(|s| s.seq != seq);
        }
    }

    /// The rank is about to start its next step (`model.step + 1`): committed changes due at
    /// it are applied now, undecided ones are dropped; the acknowledgements to send, in the
    /// order the changes were proposed.
    pub fn before_step(&mut self, model: &mut Model) -> Vec<Ack> {
        let next = model.step + 1;
        let mut acks = Vec::new();
        let (due, later): (Vec<Staged>, Vec<Staged>) = std::mem::take(&mut self.staged)
            .into_iter()
            .partition(|s| s.apply_step <= next);
        self.staged = later;
        for s in due {
            let ack = match s.committed {
                Some(true) => match model.set(s.knob, s.value) {
                    Ok(()) => Ack {
                        seq: s.seq,
                        applied: true,
                        reason: None,
                        step: next,
                    },
                    Err(e) => Ack {
                        seq: s.seq,
                        applied: false,
                        reason: Some(e.to_string()),
                        step: next,
                    },
                },
                _ => Ack {
                    seq: s.seq,
                    applied: false,
                    reason: Some(format!("no decision before step {}", s.apply_step)),
                    step: next,
                },
            };
            acks.push(ack);
        }
        acks
    }

    /// Changes voted for and not yet applied or dropped.
    pub fn len(&self) -> usize {
        self.staged.len()
    }

    pub fn is_empty(&self) -> bool {
        self.staged.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trainer::Options;

    fn model_at(step: u64) -> Model {
        let mut m = Model::new(&Options {
            batch_size: 64,
            prefetch: 2,
            ..Options::default()
        })
        .unwrap();
        for _ in 0..step {
            m.step(1980.0);
        }
        m
    }

    #[test]
    fn a_committed_change_is_applied_exactly_at_its_step() {
        let mut m = model_at(10);
        let mut st = Staging::default();
        let v = st.propose(&m, 7, KnobName::BatchSize, 128, 13);
        assert_eq!(
            v,
            Vote {
                seq: 7,
                ready: true,
                reason: None,
                step: 10
            }
        );
        st.decide(7, true);
        // Steps 11 and 12 keep the old value.
        for _ in 0..2 {
            assert!(st.before_step(&mut m).is_empty());
            assert_eq!(m.config.batch_size, 64);
            m.step(1980.0);
        }
        // Starting step 13: applied, and acknowledged with that step.
        let acks = st.before_step(&mut m);
        assert_eq!(
            acks,
            [Ack {
                seq: 7,
                applied: true,
                reason: None,
                step: 13
            }]
        );
        assert_eq!(m.config.batch_size, 128);
        m.step(1980.0);
        assert_eq!(m.step, 13, "step 13 ran with the new value");
        assert!(st.is_empty());
    }

    #[test]
    fn undecided_at_its_step_is_not_applied() {
        let mut m = model_at(4);
        let mut st = Staging::default();
        assert!(st.propose(&m, 1, KnobName::Prefetch, 8, 5).ready);
        let acks = st.before_step(&mut m);
        assert_eq!(
            acks,
            [Ack {
                seq: 1,
                applied: false,
                reason: Some("no decision before step 5".into()),
                step: 5
            }]
        );
        assert_eq!(m.config.prefetch_depth, 2, "presumed abort keeps the value");
        // The commit that comes too late changes nothing.
        st.decide(1, true);
        m.step(1980.0);
        assert!(st.before_step(&mut m).is_empty());
        assert_eq!(m.config.prefetch_depth, 2);
    }

    #[test]
    fn a_rank_refuses_a_step_it_has_begun_or_a_value_it_cannot_take() {
        let m = model_at(6);
        let mut st = Staging::default();
        let v = st.propose(&m, 2, KnobName::BatchSize, 128, 6);
        assert!(!v.ready);
        assert_eq!(
            v.reason.as_deref(),
            Some("step 6 has begun here (6 steps done)")
        );
        let v = st.propose(&m, 3, KnobName::BatchSize, 1 << 20, 20);
        assert!(!v.ready);
        assert!(v.reason.unwrap().contains("GiB"));
        let v = st.propose(&m, 4, KnobName::Prefetch, -1, 20);
        assert!(!v.ready);
        assert!(st.is_empty(), "nothing refused is kept");
        // The next step is 7: a change for step 7 is still on time.
        assert!(st.propose(&m, 5, KnobName::Prefetch, 4, 7).ready);
    }

    #[test]
    fn a_called_off_change_is_forgotten() {
        let mut m = model_at(0);
        let mut st = Staging::default();
        assert!(st.propose(&m, 1, KnobName::Prefetch, 8, 3).ready);
        assert!(st.propose(&m, 2, KnobName::BatchSize, 32, 3).ready);
        st.decide(1, false);
        st.decide(2, true);
        assert_eq!(st.len(), 1);
        m.step(1980.0);
        m.step(1980.0);
        let acks = st.before_step(&mut m);
        assert_eq!(acks.len(), 1);
        assert_eq!((acks[0].seq, acks[0].applied), (2, true));
        assert_eq!((m.config.prefetch_depth, m.config.batch_size), (2, 32));
    }
}
