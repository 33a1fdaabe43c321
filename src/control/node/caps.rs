//! The caps the loops set: each governor's decision, the budget's shares, and setting them
//! on the GPUs (each held job's GPUs at one cap, `job_caps`), lowering before raising so a
//! budget is never exceeded on the way.
//!
//! A governed GPU gets its governor's cap; with a budget, at most its share of the budget (the
//! budget's ceiling for a GPU is its governor's cap, the user's cap and its maximum). The
//! user's cap is the one found when the loops first touched the GPU, or one set since by
//! someone else (a cap that differs from the last one the loops set). When nothing controls a
//! GPU any more, its user's cap is put back. A GPU whose limits make no sense is left alone,
//! and a setter that failed is tried again with a growing backoff.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    BUDGET_EVERY_S, BUDGET_MIN_RAISE_W, BY_BUDGET, BY_GOVERNOR, ControlEvent, NodeControl,
    RETRY_FIRST_S, RETRY_MAX_S, Retry, StepOutput, Touch,
};
use crate::control::budget::{self, BudgetGpu};
use crate::control::governor::stale::Said;
use crate::control::governor::{CapMove, GovernorInput, Mode};
use crate::control::jobs::JobHold;
use crate::control::status::{BudgetStatus, CapChange};
use crate::control::{ControlError, PowerControl, PowerLimits};
use crate::telemetry::{GpuSample, Snapshot, throttle};

impl NodeControl {
    /// Governors, then the budget, then the caps.
    pub(super) fn control<P: PowerControl + ?Sized>(
        &mut self,
        snap: &Snapshot,
        dev: &P,
        now: f64,
        out: &mut StepOutput,
    ) {
        let mut limits: BTreeMap<u32, PowerLimits> = BTreeMap::new();
        let wanted: BTreeSet<u32> = self
            .governors
            .keys()
            .chain(self.touched.keys())
            .copied()
            .chain(
                self.budget
                    .is_some()
                    .then(|| snap.gpus.iter().map(|g| g.index))
                    .into_iter()
                    .flatten(),
            )
            .chain(
                (!self.governors.is_empty() || self.budget.is_some())
                    .then(|| self.jobs.iter().flat_map(|j| j.gpus.iter().copied()))
                    .into_iter()
                    .flatten(),
            )
            .collect();
        let mut bad: BTreeMap<u32, PowerLimits> = BTreeMap::new();
        for g in wanted {
            if let Ok(l) = dev.power_limits(g as usize) {
                match l.problem() {
                    None => {
                        limits.insert(g, l);
                    }
                    Some(_) => {
                        bad.insert(g, l);
                    }
                }
            }
        }
        self.refuse(&bad, out);
        // Someone else set a cap since the loops last did: that is the user's cap now.
        let outside: Vec<(u32, f64)> = self
            .touched
            .iter()
            .filter_map(|(g, t)| {
                let l = limits.get(g)?;
                ((l.current_w - t.expected_w).abs() > 1.0).then_some((*g, l.current_w))
            })
            .collect();
        for (g, w) in outside {
            self.set_user_cap(g, w, Some(w));
        }
        self.governors_step(snap, &limits, &bad, now, out);
        self.budget_step(snap, &limits, &bad, now, out);
        let holds = self.job_holds();
        // A GPU of a held job that nothing else controls is controlled from now on, so that
        // its user's cap comes back when the job is let go.
        for h in &holds {
            for g in &h.gpus {
                if let Some(l) = limits.get(g) {
                    self.touched.entry(*g).or_insert(Touch {
                        user_cap_w: l.current_w,
                        expected_w: l.current_w,
                    });
                }
            }
        }
        self.apply(dev, &limits, &holds, Some(now), out);
    }

    /// GPUs whose limits make no sense are left alone: no cap, no user's cap taken from them,
    /// nothing put back. Said once per GPU until its limits make sense again.
    fn refuse(&mut self, bad: &BTreeMap<u32, PowerLimits>, out: &mut StepOutput) {
        self.refused.retain(|g, _| bad.contains_key(g));
        for (g, l) in bad {
            let problem = l.problem().unwrap_or_default();
            let why = format!(
                "GPU {g}: {problem}: gpupilot does not move its cap until it reports plausible \
                 limits"
            );
            self.notes.push(why.clone());
            if self.refused.contains_key(g) {
                continue;
            }
            self.refused.insert(*g, problem);
            let by = if self.governors.contains_key(g) {
                BY_GOVERNOR
            } else if self.budget.is_some() {
                BY_BUDGET
            } else {
                "daemon"
            };
            out.events.push(ControlEvent::Governor {
                gpu: *g,
                change: "refused".into(),
                target_c: None,
                temperature_c: None,
                old_w: None,
                new_w: None,
                by: by.into(),
                why,
            });
        }
    }

    fn user_cap(&self, g: u32, l: &PowerLimits) -> f64 {
        self.touched.get(&g).map_or(l.current_w, |t| t.user_cap_w)
    }

    /// While the loops control GPU `g`: its user's cap and the cap they hold it at, watts.
    pub fn held(&self, g: u32) -> Option<(f64, f64)> {
        self.touched.get(&g).map(|t| (t.user_cap_w, t.expected_w))
    }

    /// A cap set as the user's from outside the loops (a run's `[power] cap_w`, and putting
    /// the original back when the run ends): from now on the loops keep GPU `g` at or below
    /// `user_w`. `set_w`: the cap just set on the GPU, if one was (so it is not taken for
    /// someone else's change). Nothing to do for a GPU the loops do not control.
    pub fn set_user_cap(&mut self, g: u32, user_w: f64, set_w: Option<f64>) {
        let Some(t) = self.touched.get_mut(&g) else {
            return;
        };
        t.user_cap_w = user_w;
        if let Some(w) = set_w {
            t.expected_w = w;
        }
        // A governor holding (stale telemetry) or a budget share between its steps must not
        // keep (or put back) the GPU above its new ceiling.
        if let Some(cmd) = self.governors.get_mut(&g).and_then(|x| x.cmd_w.as_mut()) {
            *cmd = cmd.min(user_w);
        }
        if let Some(b) = self.budget_caps.get_mut(&g) {
            *b = b.min(user_w);
        }
    }

    fn governors_step(
        &mut self,
        snap: &Snapshot,
        limits: &BTreeMap<u32, PowerLimits>,
        bad: &BTreeMap<u32, PowerLimits>,
        now: f64,
        out: &mut StepOutput,
    ) {
        let gpus: Vec<u32> = self.governors.keys().copied().collect();
        for g in gpus {
            let Some(l) = limits.get(&g).copied() else {
                if let Some(l) = bad.get(&g) {
                    // The governor is shown refusing (it decides nothing from these figures).
                    let sample = snap.gpus.iter().find(|s| s.index == g);
                    let gov = self.governors.get_mut(&g).expect("listed");
                    let input = GovernorInput {
                        user_cap_w: None,
                        ..governor_input(sample, now, l.current_w, l, l.current_w)
                    };
                    gov.last = Some(gov.gov.decide(&input));
                }
                continue;
            };
            let user = self.user_cap(g, &l);
            let sample = snap.gpus.iter().find(|s| s.index == g);
            let gov = self.governors.get_mut(&g).expect("listed");
            let cmd = gov.cmd_w.unwrap_or(l.current_w.min(user));
            let input = governor_input(sample, now, cmd, &l, user);
            let d = gov.gov.decide(&input);
            if let CapMove::Set { from_w, to_w } = d.action {
                gov.cmd_w = Some(to_w);
                out.events.push(ControlEvent::Governor {
                    gpu: g,
                    change: "cap".into(),
                    target_c: d.target_c,
                    temperature_c: d.temperature_c,
                    old_w: Some(from_w),
                    new_w: Some(to_w),
                    by: BY_GOVERNOR.into(),
                    why: d.why.clone(),
                });
            } else if gov.cmd_w.is_none() {
                gov.cmd_w = Some(cmd);
            }
            let said = gov.stale.observe(d.mode == Mode::Stale, now);
            if let Some(said) = said {
                let (change, why) = match said {
                    Said::Stale => ("stale", d.why.clone()),
                    Said::Resumed { spells: 1, .. } => {
                        ("resumed", "telemetry is fresh again".to_string())
                    }
                    Said::Resumed { spells, over_s } => (
                        "resumed",
                        format!(
                            "telemetry is fresh again and has stayed so for {:.0} s, after \
                             {spells} stale spells over {over_s:.0} s",
                            crate::control::governor::stale::SETTLE_S
                        ),
                    ),
                    Said::Flapping { spells, over_s } => (
                        "flapping",
                        format!(
                            "telemetry went stale again {over_s:.0} s after the last stale \
                             spell ({spells} spells): the cap is held at every stale sample; \
                             not said again until it stays fresh for {:.0} s",
                            crate::control::governor::stale::SETTLE_S
                        ),
                    ),
                };
                out.events.push(ControlEvent::Governor {
                    gpu: g,
                    change: change.into(),
                    target_c: d.target_c,
                    temperature_c: d.temperature_c,
                    old_w: None,
                    new_w: None,
                    by: BY_GOVERNOR.into(),
                    why,
                });
            }
            gov.last = Some(d);
            self.touched.entry(g).or_insert(Touch {
                user_cap_w: user,
                expected_w: l.current_w,
            });
        }
    }

    fn budget_step(
        &mut self,
        snap: &Snapshot,
        limits: &BTreeMap<u32, PowerLimits>,
        bad: &BTreeMap<u32, PowerLimits>,
        now: f64,
        out: &mut StepOutput,
    ) {
        let Some(b) = &self.budget else {
            return;
        };
        let budget_w = b.budget_w;
        let counted = |s: &GpuSample| {
            limits
                .get(&s.index)
                .map(|l| l.current_w)
                .unwrap_or_else(|| fixed_w(s, bad.get(&s.index)))
        };
        let current: f64 = snap.gpus.iter().map(counted).sum();
        if now - b.at_s < BUDGET_EVERY_S && current <= budget_w + 0.5 {
            return;
        }
        let gpus: Vec<BudgetGpu> = snap
            .gpus
            .iter()
            .map(|s| {
                let l = limits.get(&s.index);
                let fixed = s.lost || l.is_none();
                let cap = counted(s);
                let (min, max) = l.map_or((cap, cap), |l| (l.min_w, l.max_w));
                let user = l.map_or(cap, |l| self.user_cap(s.index, l));
                let gov = self.governors.get(&s.index).and_then(|g| g.cmd_w);
                let ceiling = gov.map_or(user.min(max), |c| c.min(user).min(max));
                BudgetGpu {
                    index: s.index,
                    cap_w: cap,
                    min_w: min,
                    ceiling_w: ceiling,
                    draw_w: s.power_w.filter(|_| !s.stale),
                    cap_limited: s.throttle_reasons.is_some_and(throttle::power_limited),
                    fixed,
                }
            })
            .collect();
        let groups: Vec<Vec<u32>> = self.jobs.iter().map(|j| j.gpus.clone()).collect();
        let a = budget::allocate_jobs(budget_w, &gpus, &groups, &self.budget_cfg);
        for (g, c) in &a.caps {
            if gpus.iter().any(|x| x.index == *g && !x.fixed) {
                self.budget_caps.insert(*g, *c);
                if let Some(l) = limits.get(g) {
                    let user = self.user_cap(*g, l);
                    self.touched.entry(*g).or_insert(Touch {
                        user_cap_w: user,
                        expected_w: l.current_w,
                    });
                }
            }
        }
        let b = self.budget.as_mut().expect("checked");
        if a.infeasible.is_some() && b.last.as_ref().is_none_or(|l| l.infeasible.is_none()) {
            out.events.push(ControlEvent::Budget {
                budget_w: Some(budget_w),
                total_w: Some(a.total_w),
                caps: vec![],
                by: BY_BUDGET.into(),
                why: a.infeasible.clone().unwrap_or_default(),
            });
        }
        b.at_s = now;
        b.last = Some(BudgetStatus {
            budget_w,
            total_w: a.total_w,
            demand_w: a.demand_w,
            caps: a.caps.clone(),
            infeasible: a.infeasible,
            by: b.owner.describe(),
        });
    }

    /// Set every cap the loops decide (each held job's GPUs at its cap), lowering before
    /// raising so a budget is never exceeded on the way.
    pub(super) fn apply<P: PowerControl + ?Sized>(
        &mut self,
        dev: &P,
        limits: &BTreeMap<u32, PowerLimits>,
        holds: &[JobHold],
        now: Option<f64>,
        out: &mut StepOutput,
    ) {
        let own = self.own_targets();
        let mut held: BTreeMap<u32, (f64, &'static str)> = BTreeMap::new();
        for h in holds {
            let who = own.get(&h.leader).map_or(BY_GOVERNOR, |(_, who)| *who);
            for g in &h.gpus {
                held.insert(*g, (h.cap_w, who));
            }
        }
        let mut plan: Vec<(u32, f64, f64, &'static str)> = Vec::new();
        let mut released = Vec::new();
        for (&g, t) in &self.touched {
            let Some(l) = limits.get(&g) else {
                continue;
            };
            let gov = self.governors.get(&g).and_then(|x| x.cmd_w);
            // A job's cap, never above this GPU's user's cap.
            let job = held
                .get(&g)
                .map(|(w, who)| (w.min(t.user_cap_w), *who))
                .filter(|(w, _)| own.get(&g).is_none_or(|(o, _)| w < o));
            let (to, who) = match job.or(own.get(&g).copied()) {
                Some((x, who)) => (x.clamp(l.min_w, l.max_w), who),
                // Nothing controls it any more: its user's cap goes back.
                None => {
                    released.push(g);
                    (t.user_cap_w.clamp(l.min_w, l.max_w), "")
                }
            };
            let raise = to - l.current_w;
            let small = if who == BY_BUDGET && gov.is_none_or(|a| to < a) {
                raise > 0.0 && raise < BUDGET_MIN_RAISE_W
            } else {
                raise.abs() < 1.0
            };
            if raise.abs() < 0.5 || small {
                continue;
            }
            // A setter that failed waits its turn (`now` None: the daemon is stopping, and
            // every GPU is tried once more).
            if let (Some(now), Some(r)) = (now, self.retry.get(&g)) {
                if now < r.at_s {
                    continue;
                }
            }
            plan.push((g, l.current_w, to, who));
        }
        plan.sort_by(|a, b| (a.2 - a.1).total_cmp(&(b.2 - b.1)));
        let mut budget_changes = Vec::new();
        let mut changed = BTreeSet::new();
        for (g, from, to, who) in plan {
            match dev.set_power_limit_w(g as usize, to) {
                Ok(()) => {
                    changed.insert(g);
                    self.set_errors.remove(&g);
                    self.retry.remove(&g);
                    if let Some(t) = self.touched.get_mut(&g) {
                        t.expected_w = to;
                    }
                    match who {
                        BY_BUDGET => budget_changes.push(CapChange {
                            gpu: g,
                            old_w: from,
                            new_w: to,
                        }),
                        "" => out.events.push(ControlEvent::Governor {
                            gpu: g,
                            change: "restored".into(),
                            target_c: None,
                            temperature_c: None,
                            old_w: Some(from),
                            new_w: Some(to),
                            by: "daemon".into(),
                            why: "nothing controls this GPU's cap any more: the user's cap is back"
                                .into(),
                        }),
                        _ => {}
                    }
                }
                Err(e) => {
                    // The GPU did not follow: the governor goes on from the cap it has.
                    if let Some(gov) = self.governors.get_mut(&g) {
                        gov.cmd_w = Some(from);
                    }
                    let delay_s = self
                        .retry
                        .get(&g)
                        .map_or(RETRY_FIRST_S, |r| (r.delay_s * 2.0).min(RETRY_MAX_S));
                    if let Some(now) = now {
                        self.retry.insert(
                            g,
                            Retry {
                                at_s: now + delay_s,
                                delay_s,
                            },
                        );
                    }
                    self.set_failed(g, who, &e, out)
                }
            }
        }
        for g in released {
            if !self.set_errors.contains_key(&g) {
                self.touched.remove(&g);
                self.budget_caps.remove(&g);
            }
        }
        self.say_job_holds(holds, &held, &changed, out);
        if !budget_changes.is_empty() {
            let (budget_w, total_w) = match &self.budget {
                Some(b) => (Some(b.budget_w), b.last.as_ref().map(|l| l.total_w)),
                None => (None, None),
            };
            let why = super::job_caps::budget_why(&budget_changes, &self.jobs);
            out.events.push(ControlEvent::Budget {
                budget_w,
                total_w,
                caps: budget_changes,
                by: BY_BUDGET.into(),
                why: format!("caps follow demand: {why}"),
            });
        }
    }

    fn set_failed(&mut self, g: u32, who: &str, e: &ControlError, out: &mut StepOutput) {
        let msg = e.to_string();
        if self.set_errors.get(&g) == Some(&msg) {
            return;
        }
        self.set_errors.insert(g, msg.clone());
        let who = if who.is_empty() { "daemon" } else { who };
        out.events.push(ControlEvent::Governor {
            gpu: g,
            change: "failed".into(),
            target_c: None,
            temperature_c: None,
            old_w: None,
            new_w: None,
            by: who.into(),
            why: format!(
                "could not set the power cap: {msg}; tried again in {RETRY_FIRST_S:.0} s, then \
                 less and less often (at most every {:.0} min) until it works",
                RETRY_MAX_S / 60.0
            ),
        });
    }
}

/// What a GPU the budget cannot change counts against it, watts: its limit as the snapshot read
/// it, where that is plausible; else (a limit outside its range, non-finite, or unknown: as
/// good as absent) the most it may draw, its maximum limit; else what it draws; else nothing
/// known, 0. `bad`: its limits as read now, when they make no sense.
fn fixed_w(s: &GpuSample, bad: Option<&PowerLimits>) -> f64 {
    let max = bad
        .map(|l| l.max_w)
        .or(s.power_max_w)
        .filter(|m| m.is_finite() && *m > 0.0 && *m <= crate::control::energy::RATED_MAX_W);
    let min = bad.map(|l| l.min_w).or(s.power_min_w);
    let limit = s.power_limit_w.filter(|w| {
        bad.is_none()
            && match (min, max) {
                (Some(lo), Some(hi)) => crate::control::limits_problem(*w, lo, hi).is_none(),
                _ => w.is_finite() && *w > 0.0 && *w <= crate::control::energy::RATED_MAX_W,
            }
    });
    limit
        .or(max)
        .or(s.power_w.filter(|p| p.is_finite() && *p >= 0.0))
        .unwrap_or(0.0)
}

fn governor_input(
    sample: Option<&GpuSample>,
    now: f64,
    cmd: f64,
    l: &PowerLimits,
    user: f64,
) -> GovernorInput {
    GovernorInput {
        now_s: now,
        sample_time_s: sample.map_or(f64::NEG_INFINITY, |s| s.time_s),
        temperature_c: sample.and_then(|s| s.temperature_c),
        slowdown_c: sample.and_then(|s| s.temp_slowdown_c),
        stale: sample.is_none_or(|s| s.stale || s.lost),
        power_w: sample.and_then(|s| s.power_w),
        cap_w: cmd,
        min_w: l.min_w,
        max_w: l.max_w,
        user_cap_w: Some(user),
    }
}
