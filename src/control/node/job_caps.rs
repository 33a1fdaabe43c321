//! The loops' decisions for jobs of several ranks: the cap the governor and the budget give
//! each GPU, the jobs held at one cap (`control::jobs`), and how that is said in events.

use std::collections::{BTreeMap, BTreeSet};

use super::{BY_BUDGET, BY_GOVERNOR, ControlEvent, NodeControl, StepOutput};
use crate::control::jobs::{self, JobGroup, JobHold};
use crate::control::status::CapChange;

impl NodeControl {
    /// The cap the governor and the budget give each GPU they control, and which of the two
    /// gives it.
    pub(super) fn own_targets(&self) -> BTreeMap<u32, (f64, &'static str)> {
        self.touched
            .keys()
            .filter_map(|&g| {
                let gov = self.governors.get(&g).and_then(|x| x.cmd_w);
                let bud = self.budget.as_ref().and(self.budget_caps.get(&g).copied());
                let who = |b: Option<f64>| {
                    if b.is_some_and(|b| gov.is_none_or(|a| b < a)) {
                        BY_BUDGET
                    } else {
                        BY_GOVERNOR
                    }
                };
                match (gov, bud) {
                    (Some(a), Some(b)) => Some((g, (a.min(b), who(Some(b))))),
                    (Some(a), None) => Some((g, (a, BY_GOVERNOR))),
                    (None, Some(b)) => Some((g, (b, BY_BUDGET))),
                    (None, None) => None,
                }
            })
            .collect()
    }

    /// The jobs held at one cap now.
    pub(super) fn job_holds(&self) -> Vec<JobHold> {
        let targets = self
            .own_targets()
            .into_iter()
            .map(|(g, (w, _))| (g, w))
            .collect();
        jobs::hold_together(&targets, &self.jobs)
    }

    /// A `governor` event (`job`) for each job a governor holds at a new cap, when the cap of
    /// another of its GPUs changed with it: `GPU 2 is at 87 °C: job r1's GPUs 0-3 held at 300
    /// W together`. (A job the budget holds is said in the budget's event.)
    pub(super) fn say_job_holds(
        &mut self,
        holds: &[JobHold],
        held: &BTreeMap<u32, (f64, &'static str)>,
        changed: &BTreeSet<u32>,
        out: &mut StepOutput,
    ) {
        self.jobs_said
            .retain(|run, _| holds.iter().any(|h| &h.run == run));
        for h in holds {
            if held
                .get(&h.leader)
                .is_none_or(|(_, who)| *who != BY_GOVERNOR)
            {
                self.jobs_said.remove(&h.run);
                continue;
            }
            let moved = h.gpus.iter().any(|g| *g != h.leader && changed.contains(g));
            let old = self.jobs_said.get(&h.run).copied();
            if !moved || old.is_some_and(|o| (o - h.cap_w).abs() < 0.5) {
                continue;
            }
            let last = self.governors.get(&h.leader).and_then(|x| x.last.as_ref());
            let temperature_c = last.and_then(|d| d.temperature_c);
            let hot = match temperature_c {
                Some(t) => format!("GPU {} is at {t:.0} °C", h.leader),
                None => format!("GPU {}'s governor", h.leader),
            };
            out.events.push(ControlEvent::Governor {
                gpu: h.leader,
                change: "job".into(),
                target_c: last.and_then(|d| d.target_c),
                temperature_c,
                old_w: old,
                new_w: Some(h.cap_w),
                by: BY_GOVERNOR.into(),
                why: format!("{hot}: {}", h.describe()),
            });
            self.jobs_said.insert(h.run.clone(), h.cap_w);
        }
    }
}

/// The budget's changes in words: a job's GPUs at one cap as one phrase (`job r1's GPUs 0-3
/// held at 450 W together`), any other GPU as `GPU 4 300 → 350 W`.
pub(super) fn budget_why(changes: &[CapChange], jobs: &[JobGroup]) -> String {
    let mut parts = Vec::new();
    let mut said = BTreeSet::new();
    for j in jobs {
        let mine: Vec<&CapChange> = changes.iter().filter(|c| j.gpus.contains(&c.gpu)).collect();
        let Some(first) = mine.first() else {
            continue;
        };
        if mine.iter().all(|c| c.new_w == first.new_w) {
            let hold = JobHold {
                run: j.run.clone(),
                gpus: j.gpus.clone(),
                cap_w: first.new_w,
                leader: first.gpu,
            };
            parts.push(hold.describe());
            said.extend(mine.iter().map(|c| c.gpu));
        }
    }
    for c in changes.iter().filter(|c| !said.contains(&c.gpu)) {
        parts.push(format!("GPU {} {:.0} → {:.0} W", c.gpu, c.old_w, c.new_w));
    }
    parts.join(", ")
}
