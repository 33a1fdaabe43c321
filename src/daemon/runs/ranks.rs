//! The ranks of one run's trainer channel: which connection is which rank, what each reported
//! (its newest report, its pace, the knob values it uses), and the step a change to several
//! ranks is applied at.
//!
//! A data-parallel job is N processes (ranks) that each attach to the run's channel, saying
//! which rank they are (`RankSpec`). A single-process script says nothing and is rank 0 of a
//! world of 1. A knob change goes to every attached rank through the one state machine of
//! `knob_changes.rs`, whatever the world size; the world size picks its mode, and for a job of
//! several ranks [`Ranks::apply_step`] places it: a step ahead of the fastest rank, so that the
//! proposal, every vote and the decision travel before any rank starts it (docs/protocol.md,
//! "Distributed runs").
//!
//! This file is bookkeeping only: no I/O, no locks, and times are given, not read, so tests
//! drive it step by step.

use std::collections::{BTreeMap, VecDeque};

use tokio::sync::mpsc;

use crate::protocol::{JobFigures, KnobName, MetricsPoint, RankInfo, RankSpec};

/// How far ahead of the ranks' newest step a change is proposed, in seconds of their progress:
/// the proposal, every vote and the decision must all travel before the fastest rank starts
/// the apply step.
pub const APPLY_LEAD_S: f64 = 0.5;
/// The fewest steps between the newest reported step and the apply step.
pub const MIN_LEAD_STEPS: u64 = 2;
/// The most steps a rank's data pipeline may say it formed ahead (`lead_steps`) that the apply
/// step makes room for.
pub const MAX_FORMED_AHEAD: u64 = 1024;
/// The largest world a run may have (a bound on what one attach can make the daemon keep or walk).
pub const MAX_WORLD_SIZE: u32 = 65_536;
/// The longest host name or GPU UUID a rank may give.
const MAX_NAME: usize = 255;

/// A rank's pace is measured over its reports of about the last second: not over a burst (the
/// reports a rank queued while it was away arrive together), nor over a long past.
const RATE_WINDOW_S: f64 = 1.0;
/// Step reports kept per rank for its pace (older than a few windows are let go).
const RATE_SAMPLES: usize = 256;
/// A rank's knob value is taken from its reports only when its last this many agree: a script
/// that reports the size of each batch it got reports a short last batch of an epoch once.
const AGREEING_REPORTS: usize = 3;

/// A trainer's connection (one rank's): where to push knob changes.
pub struct TrainerConn {
    pub conn: u64,
    pub tx: mpsc::Sender<String>,
    pub pid: Option<u32>,
}

/// One rank of the run.
pub struct Rank {
    pub spec: RankSpec,
    pub link: Option<TrainerConn>,
    /// Its newest report.
    pub last: Option<MetricsPoint>,
    /// Its recent reports with a step: (step, daemon time), oldest first.
    stepped: VecDeque<(u64, f64)>,
    /// Its last [`AGREEING_REPORTS`] reports: (step, batch size, prefetch), oldest first.
    values: VecDeque<(Option<u64>, Option<i64>, Option<i64>)>,
    /// Steps past the next one whose batches it has formed already (its newest `lead_steps`).
    formed_ahead: u64,
}

impl Rank {
    fn new(spec: RankSpec) -> Rank {
        Rank {
            spec,
            link: None,
            last: None,
            stepped: VecDeque::new(),
            values: VecDeque::new(),
            formed_ahead: 0,
        }
    }

    /// Steps per second: over the last [`RATE_WINDOW_S`] of its reports (from the newest one at
    /// least that much older than its newest), else over all it has if they span a quarter of
    /// that, else from its own step time.
    fn rate(&self) -> Option<f64> {
        let &(s1, t1) = self.stepped.back()?;
        let measured = self
            .stepped
            .iter()
            .rev()
            .find(|(_, t)| *t <= t1 - RATE_WINDOW_S)
            .or_else(|| {
                self.stepped
                    .front()
                    .filter(|(_, t0)| t1 - t0 >= RATE_WINDOW_S / 4.0)
            })
            .filter(|&&(s0, t0)| s1 > s0 && t1 > t0)
            .map(|&(s0, t0)| (s1 - s0) as f64 / (t1 - t0));
        measured.or_else(|| {
            let step_time = self.last.as_ref()?.report.step_time_s?;
            (step_time > 0.0).then(|| 1.0 / step_time)
        })
    }

    fn info(&self) -> RankInfo {
        RankInfo {
            spec: self.spec.clone(),
            attached: self.link.is_some(),
            pid: self.link.as_ref().and_then(|l| l.pid),
            last: self.last.clone(),
            steps_per_s: self.rate(),
        }
    }
}

/// Why an attach was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// Every rank of one run.
#[derive(Default)]
pub struct Ranks {
    world_size: Option<u32>,
    by_rank: BTreeMap<u32, Rank>,
}

impl Ranks {
    /// Take `link` as rank `spec.rank`. A rank already attached on another live connection is
    /// refused unless it is the same process (it reconnected), or the run has one rank (a
    /// script that says nothing reconnects from anywhere): then the new link replaces the old,
    /// which is returned.
    pub fn attach(
        &mut self,
        spec: RankSpec,
        link: TrainerConn,
    ) -> Result<Option<TrainerConn>, Refused> {
        if spec.world_size == 0 || spec.rank >= spec.world_size {
            return Err(Refused(format!(
                "rank {} is outside a world of {} (ranks are 0 to world_size − 1)",
                spec.rank, spec.world_size
            )));
        }
        if spec.world_size > MAX_WORLD_SIZE {
            return Err(Refused(format!(
                "a world of {} ranks is more than the {MAX_WORLD_SIZE} a run may have",
                spec.world_size
            )));
        }
        let long = |s: &Option<String>| s.as_ref().is_some_and(|s| s.len() > MAX_NAME);
        if long(&spec.host) || long(&spec.gpu_uuid) {
            return Err(Refused(format!(
                "rank {}'s host or GPU UUID is longer than {MAX_NAME} bytes",
                spec.rank
            )));
        }
        let others_attached = self
            .by_rank
            .iter()
            .any(|(r, rank)| *r != spec.rank && rank.link.is_some());
        match self.world_size {
            Some(w) if w != spec.world_size && others_attached => {
                return Err(Refused(format!(
                    "rank {} says the world has {} ranks, but the ranks attached say {w}",
                    spec.rank, spec.world_size
                )));
            }
            Some(w) if w != spec.world_size => {
                // A new attempt of the run with another size: the old ranks are history.
                self.by_rank.clear();
            }
            _ => {}
        }
        self.world_size = Some(spec.world_size);
        if let Some(old) = self.by_rank.get(&spec.rank).and_then(|r| r.link.as_ref()) {
            let same_process = old.pid.is_some() && old.pid == link.pid;
            if spec.world_size > 1 && !same_process {
                return Err(Refused(format!(
                    "rank {} is already attached (pid {}, connection {}); two processes cannot be \
                     the same rank",
                    spec.rank,
                    old.pid.map_or("?".into(), |p| p.to_string()),
                    old.conn
                )));
            }
        }
        let rank = self
            .by_rank
            .entry(spec.rank)
            .or_insert_with(|| Rank::new(spec.clone()));
        rank.spec = spec;
        Ok(rank.link.replace(link))
    }

    /// Connection `conn` closed: the rank it was, and its pid.
    pub fn detach(&mut self, conn: u64) -> Option<(u32, Option<u32>)> {
        self.by_rank.iter_mut().find_map(|(r, rank)| {
            if rank.link.as_ref().is_some_and(|l| l.conn == conn) {
                let pid = rank.link.take().and_then(|l| l.pid);
                Some((*r, pid))
            } else {
                None
            }
        })
    }

    pub fn world_size(&self) -> Option<u32> {
        self.world_size
    }

    /// More than one rank: a change is voted on and applied at a step
    /// (`knob_changes::Mode::AtStep`), not at the next batch.
    pub fn distributed(&self) -> bool {
        self.world_size.is_some_and(|w| w > 1)
    }

    pub fn any_attached(&self) -> bool {
        self.by_rank.values().any(|r| r.link.is_some())
    }

    /// The attached ranks' links, by rank.
    pub fn links(&self) -> impl Iterator<Item = (u32, &TrainerConn)> {
        self.by_rank
            .iter()
            .filter_map(|(r, rank)| Some((*r, rank.link.as_ref()?)))
    }

    /// The lowest rank's link (rank 0's, unless it is away).
    pub fn first_link(&self) -> Option<&TrainerConn> {
        self.links().next().map(|(_, l)| l)
    }

    /// Ranks of the world that are not attached now.
    pub fn missing(&self) -> Vec<u32> {
        let world = self.world_size.unwrap_or(1);
        (0..world)
            .filter(|r| self.by_rank.get(r).is_none_or(|rank| rank.link.is_none()))
            .collect()
    }

    /// A new attempt of the run: what the ranks reported belongs to the last one. Until a rank
    /// reports again nothing says where it is, which a change to several ranks needs (and its
    /// old steps and values would place a change, or find a disagreement, that is not there).
    pub fn new_attempt(&mut self) {
        for r in self.by_rank.values_mut() {
            r.last = None;
            r.stepped.clear();
            r.values.clear();
            r.formed_ahead = 0;
        }
    }

    /// Keep `point` as `rank`'s newest report.
    pub fn record(&mut self, rank: u32, point: &MetricsPoint) {
        let Some(r) = self.by_rank.get_mut(&rank) else {
            return;
        };
        if let Some(step) = point.report.step {
            // A step that went back: the script started over (a restart); so does the pace.
            if r.stepped.back().is_some_and(|(s, _)| step < *s) {
                r.stepped.clear();
            }
            while r.stepped.len() >= RATE_SAMPLES
                || r.stepped
                    .front()
                    .is_some_and(|(_, t)| *t < point.t - 4.0 * RATE_WINDOW_S)
            {
                r.stepped.pop_front();
            }
            r.stepped.push_back((step, point.t));
        }
        if let Some(ahead) = point.report.lead_steps {
            r.formed_ahead = ahead.min(MAX_FORMED_AHEAD);
        }
        if r.values.len() == AGREEING_REPORTS {
            r.values.pop_front();
        }
        let report = &point.report;
        r.values
            .push_back((report.step, report.batch_size, report.prefetch));
        r.last = Some(point.clone());
    }

    pub fn info(&self) -> Vec<RankInfo> {
        self.by_rank.values().map(Rank::info).collect()
    }

    /// The job's figures over the attached ranks' newest reports ([`JobFigures::of`]).
    pub fn job(&self) -> Option<JobFigures> {
        JobFigures::of(
            self.by_rank
                .iter()
                .filter(|(_, r)| r.link.is_some())
                .filter_map(|(n, r)| Some((*n, &r.last.as_ref()?.report))),
        )
    }

    /// The step to apply a change at, `now` (daemon seconds) being when it is asked: ahead of
    /// where the fastest rank is now by [`APPLY_LEAD_S`] of its progress, and at least
    /// [`MIN_LEAD_STEPS`] past the newest step reported, and past the batches any rank's data
    /// pipeline has formed ahead (`lead_steps`). An error names a rank that has not reported a
    /// step (nothing tells where it is).
    pub fn apply_step(&self, now: f64) -> Result<u64, String> {
        let mut at = 0.0f64;
        let mut newest = 0u64;
        let mut formed = 0u64;
        for (n, rank) in self.by_rank.iter().filter(|(_, r)| r.link.is_some()) {
            let Some(&(step, t)) = rank.stepped.back() else {
                return Err(format!(
                    "rank {n} has reported no step yet: a change to several ranks is applied at \
                     a step, so every rank must report its step (gp.report(step=…))"
                ));
            };
            newest = newest.max(step);
            formed = formed.max(rank.formed_ahead);
            // Where it is now, and how far it gets while the change is agreed on.
            let rate = rank.rate().unwrap_or(0.0);
            let ahead = rate * ((now - t).max(0.0) + APPLY_LEAD_S);
            at = at.max(step as f64 + ahead);
        }
        // Reported step k means step k is done: the next one is k + 1.
        Ok((at.ceil() as u64 + 1 + formed).max(newest + MIN_LEAD_STEPS + formed))
    }

    /// The value each attached rank uses for `knob` as its reports say: where its last
    /// [`AGREEING_REPORTS`] reports are all of steps from `since` on and give the same value.
    pub fn reported(&self, knob: KnobName, since: u64) -> BTreeMap<u32, i64> {
        self.by_rank
            .iter()
            .filter(|(_, r)| r.link.is_some() && r.values.len() == AGREEING_REPORTS)
            .filter_map(|(n, r)| {
                let mut seen = r.values.iter().map(|(step, bs, prefetch)| {
                    let v = match knob {
                        KnobName::BatchSize => *bs,
                        KnobName::Prefetch => *prefetch,
                    };
                    step.filter(|s| *s >= since).and(v)
                });
                let first = seen.next()??;
                seen.all(|v| v == Some(first)).then_some((*n, first))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::MetricsReport;

    fn spec(rank: u32, world: u32) -> RankSpec {
        RankSpec {
            rank,
            world_size: world,
            ..RankSpec::default()
        }
    }

    fn link(conn: u64, pid: u32) -> TrainerConn {
        let (tx, _rx) = mpsc::channel(1);
        TrainerConn {
            conn,
            tx,
            pid: Some(pid),
        }
    }

    fn point(step: u64, t: f64, step_time: f64) -> MetricsPoint {
        MetricsPoint {
            n: 0,
            t,
            from: "trainer".into(),
            rank: None,
            report: MetricsReport {
                step: Some(step),
                step_time_s: Some(step_time),
                samples_per_s: Some(100.0),
                batch_size: Some(32),
                ..MetricsReport::default()
            },
        }
    }

    #[test]
    fn ranks_outside_the_world_twins_and_other_worlds_are_refused() {
        let mut r = Ranks::default();
        assert!(r.attach(spec(4, 4), link(1, 10)).is_err());
        assert!(r.attach(spec(0, 0), link(1, 10)).is_err());
        assert!(r.attach(spec(0, MAX_WORLD_SIZE + 1), link(1, 10)).is_err());
        let long = RankSpec {
            host: Some("h".repeat(300)),
            ..spec(0, 4)
        };
        assert!(r.attach(long, link(1, 10)).is_err());
        assert!(r.attach(spec(0, 4), link(1, 10)).unwrap().is_none());
        let Err(twin) = r.attach(spec(0, 4), link(2, 11)) else {
            panic!("a twin was taken")
        };
        assert!(twin.0.contains("already attached (pid 10"), "{twin:?}");
        // The same process reconnecting replaces its old link.
        let old = r.attach(spec(0, 4), link(3, 10)).unwrap().unwrap();
        assert_eq!(old.conn, 1);
        let Err(other) = r.attach(spec(1, 8), link(4, 12)) else {
            panic!("another world was taken")
        };
        assert!(other.0.contains("say 4"), "{other:?}");
        assert_eq!(r.missing(), [1, 2, 3]);
        assert_eq!(r.detach(3), Some((0, Some(10))));
        // Nobody attached: a new size is a new attempt.
        assert!(r.attach(spec(1, 8), link(5, 13)).is_ok());
        assert_eq!(r.world_size(), Some(8));
    }

    #[test]
    fn a_single_process_script_reconnecting_replaces_its_link() {
        let mut r = Ranks::default();
        r.attach(spec(0, 1), link(1, 10)).unwrap();
        let old = r.attach(spec(0, 1), link(2, 99)).unwrap();
        assert_eq!(old.map(|l| l.conn), Some(1));
        assert!(!r.distributed());
    }

    #[test]
    fn a_rank_s_value_is_what_its_last_reports_agree_on_past_the_step() {
        let mut r = Ranks::default();
        r.attach(spec(0, 2), link(0, 10)).unwrap();
        let with = |step: u64, bs: i64| MetricsPoint {
            report: MetricsReport {
                batch_size: Some(bs),
                ..point(step, step as f64, 0.1).report
            },
            ..point(step, step as f64, 0.1)
        };
        r.record(0, &with(10, 64));
        r.record(0, &with(11, 64));
        assert!(r.reported(KnobName::BatchSize, 0).is_empty(), "two reports");
        r.record(0, &with(12, 64));
        assert_eq!(
            r.reported(KnobName::BatchSize, 0),
            BTreeMap::from([(0, 64)])
        );
        assert!(
            r.reported(KnobName::BatchSize, 11).is_empty(),
            "a step before 11"
        );
        // A short last batch of an epoch, once: no value until the reports agree again.
        r.record(0, &with(13, 17));
        assert!(r.reported(KnobName::BatchSize, 0).is_empty());
        r.record(0, &with(14, 64));
        r.record(0, &with(15, 64));
        assert!(r.reported(KnobName::BatchSize, 0).is_empty());
        r.record(0, &with(16, 64));
        assert_eq!(
            r.reported(KnobName::BatchSize, 0),
            BTreeMap::from([(0, 64)])
        );
        assert!(
            r.reported(KnobName::Prefetch, 0).is_empty(),
            "no prefetch reported"
        );
    }

    #[test]
    fn job_figures_sum_samples_and_take_the_slowest_step() {
        let mut r = Ranks::default();
        for n in 0..3 {
            r.attach(spec(n, 3), link(u64::from(n), 10 + n)).unwrap();
            r.record(n, &point(10 + u64::from(n), 1.0, 0.1 * f64::from(n + 1)));
        }
        let job = r.job().unwrap();
        assert_eq!(job.reporting, 3);
        assert_eq!(job.step, Some(10));
        assert_eq!(job.samples_per_s, Some(300.0));
        assert_eq!(job.slowest_rank, Some(2));
        assert!((job.step_time_s.unwrap() - 0.3).abs() < 1e-9);
    }

    #[test]
    fn the_apply_step_leads_the_fastest_rank_by_its_progress() {
        let mut r = Ranks::default();
        r.attach(spec(0, 2), link(0, 10)).unwrap();
        r.attach(spec(1, 2), link(1, 11)).unwrap();
        let e = r.apply_step(0.0).unwrap_err();
        assert!(e.contains("rank 0 has reported no step"), "{e}");
        // Rank 0: 10 steps a second, newest step 20 at t = 2; rank 1 at step 19.
        r.record(0, &point(10, 1.0, 0.1));
        r.record(0, &point(20, 2.0, 0.1));
        r.record(1, &point(19, 2.0, 0.1));
        // Asked at t = 2.2: rank 0 is near step 22, and 0.5 s on near 27; the next step is 28.
        assert_eq!(r.apply_step(2.2).unwrap(), 28);
        // A burst of queued reports does not make a rank look fast: 100 steps read at once,
        // then 10 steps a second.
        let mut burst = Ranks::default();
        burst.attach(spec(0, 2), link(0, 10)).unwrap();
        burst.attach(spec(1, 2), link(1, 11)).unwrap();
        for s in 0..100 {
            burst.record(0, &point(s, 10.0 + f64::from(s as u32) * 1e-4, 0.0));
        }
        for s in 100..=115 {
            burst.record(0, &point(s, 10.0 + f64::from(s as u32 - 99) * 0.1, 0.0));
        }
        burst.record(1, &point(115, 11.6, 0.0));
        let rate = burst.by_rank[&0].rate().unwrap();
        assert!((rate - 10.0).abs() < 0.5, "{rate} steps/s");
        // Without a rate the lead is the minimum.
        let mut slow = Ranks::default();
        slow.attach(spec(0, 2), link(0, 10)).unwrap();
        slow.attach(spec(1, 2), link(1, 11)).unwrap();
        slow.record(0, &point(5, 1.0, 0.0));
        slow.record(1, &point(5, 1.0, 0.0));
        assert_eq!(slow.apply_step(1.0).unwrap(), 5 + MIN_LEAD_STEPS);
        // With one report, its own step time gives the pace: 10 steps a second, 5 in 0.5 s.
        slow.record(1, &point(5, 1.0, 0.1));
        assert_eq!(slow.apply_step(1.0).unwrap(), 11);
    }

    /// A rank whose loader has formed the batches of its next steps already moves the apply
    /// step past them: a formed batch keeps its size.
    #[test]
    fn the_apply_step_passes_the_batches_a_rank_formed_ahead() {
        let mut r = Ranks::default();
        r.attach(spec(0, 2), link(0, 10)).unwrap();
        r.attach(spec(1, 2), link(1, 11)).unwrap();
        let ahead = |step: u64, lead: Option<u64>| MetricsPoint {
            report: MetricsReport {
                step_time_s: None,
                lead_steps: lead,
                ..point(step, 1.0, 0.0).report
            },
            ..point(step, 1.0, 0.0)
        };
        r.record(0, &ahead(5, Some(3)));
        r.record(1, &ahead(5, Some(1)));
        assert_eq!(r.apply_step(1.0).unwrap(), 5 + MIN_LEAD_STEPS + 3);
        // A report without it keeps the last said; an absurd one is bounded.
        r.record(0, &ahead(6, None));
        assert_eq!(r.apply_step(1.0).unwrap(), 6 + MIN_LEAD_STEPS + 3);
        r.record(1, &ahead(6, Some(u64::MAX)));
        assert_eq!(
            r.apply_step(1.0).unwrap(),
            6 + MIN_LEAD_STEPS + MAX_FORMED_AHEAD
        );
        r.new_attempt();
        r.record(0, &ahead(0, None));
        r.record(1, &ahead(0, None));
        assert_eq!(r.apply_step(1.0).unwrap(), MIN_LEAD_STEPS);
    }
}
