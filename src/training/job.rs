//! A job's figures over time, from its ranks' reports: the samples it trained ([`JobTally`])
//! and its throughput as a series ([`job_points`]). With [`super::JobFigures::of`] (the live
//! figures) this is the one place a run's figures are made from its ranks: the energy
//! accounting (`summary.json`, `ps`, `/metrics`), the report, the console's charts and the
//! energy tuner read them from here.
//!
//! The rules (docs/protocol.md, "A job's figures"):
//! - every rank counts its own samples, and the job's are their sum;
//! - a report whose `scope` is `job` already gives the whole job's figures: while any does,
//!   those are the job's, and the ranks' own are not added to them;
//! - reports that name no rank (a script's output read for metrics) count only while no
//!   rank reports: a job's ranks count every sample themselves.
//!
//! Pure: callers feed it reports in the order they were received.

use std::collections::BTreeMap;

use super::{JobFigures, MetricsPoint, MetricsReport};

/// Longest gap between two reports of one rank over which its samples/s is integrated: a
/// longer silence (a pause, a daemon that was down) is not guessed at.
const MAX_RATE_GAP_S: f64 = 600.0;

/// A rank whose newest report is older than this, at a later report of another rank, has
/// left the job's throughput (it ended, or stopped reporting).
pub const STALE_RANK_S: f64 = 60.0;

/// Whose count a report adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Counter {
    /// Reports with `scope = "job"`: the whole job's.
    Job,
    /// One rank's own (`None`: reports that name no rank).
    Rank(Option<u32>),
}

/// One counter's state.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Count {
    samples: f64,
    last_step: Option<u64>,
    last_t: Option<f64>,
    /// The newest cumulative `samples` the reports gave.
    last_samples: Option<u64>,
    /// A report said something of samples: a count, a rate, or a step with its batch size.
    said: bool,
}

impl Count {
    /// Add what report `r`, received at `t`, says was trained since the counter's last one:
    /// the growth of a cumulative `samples`; else the steps done times the batch size (a
    /// report is of the step just done: a first report, or a step that went back — the
    /// script started over — counts its own batch where `first_batch`); else samples/s times
    /// the time since the last report.
    fn add(&mut self, t: f64, r: &MetricsReport, first_batch: bool) {
        let batch = r.batch_size.filter(|b| *b > 0).map(|b| b as f64);
        self.said |=
            r.samples.is_some() || r.samples_per_s.is_some() || r.step.is_some() && batch.is_some();
        if let Some(n) = r.samples {
            match self.last_samples {
                Some(prev) if n >= prev => self.samples += (n - prev) as f64,
                // Counting again from zero: a restart.
                Some(_) => self.samples += n as f64,
                // The trainer's own count of the whole run replaces what was estimated.
                None if first_batch => self.samples = n as f64,
                None => {}
            }
            self.last_samples = Some(n);
        } else {
            match (r.step, self.last_step, batch) {
                (Some(s), Some(prev), Some(b)) if s >= prev => {
                    self.samples += (s - prev) as f64 * b
                }
                (Some(_), _, Some(b)) if first_batch => self.samples += b,
                _ => {
                    if let (Some(rate), Some(t0)) = (r.samples_per_s, self.last_t) {
                        let dt = t - t0;
                        if dt > 0.0 && dt <= MAX_RATE_GAP_S && rate.is_finite() && rate > 0.0 {
                            self.samples += rate * dt;
                        }
                    }
                }
            }
        }
        if r.step.is_some() {
            self.last_step = r.step;
        }
        self.last_t = Some(t);
    }
}

/// The samples a run (or a job: every rank) has trained, and its step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobTally {
    /// A first report counts its own batch (the whole run is counted). A tally that starts
    /// on a live run (the tuner's) counts from each rank's first report instead.
    first_batch: bool,
    counts: BTreeMap<Counter, Count>,
    /// Each rank's newest step (`None`: reports that name no rank).
    steps: BTreeMap<Option<u32>, u64>,
    first_t: Option<f64>,
    last_t: Option<f64>,
}

impl JobTally {
    /// A tally of a whole run, from its first report on.
    pub fn whole_run() -> JobTally {
        JobTally {
            first_batch: true,
            ..JobTally::default()
        }
    }

    /// A tally that starts counting at each rank's first report from now on (what was
    /// trained before it is not counted): for measuring a window of a live run.
    pub fn from_now() -> JobTally {
        JobTally::default()
    }

    /// Take one report, in the order they came.
    pub fn absorb(&mut self, p: &MetricsPoint) {
        let counter = if p.report.is_job_wide() {
            Counter::Job
        } else {
            Counter::Rank(p.rank)
        };
        self.counts
            .entry(counter)
            .or_default()
            .add(p.t, &p.report, self.first_batch);
        if let Some(s) = p.report.step {
            self.steps.insert(p.rank, s);
        }
        self.first_t = Some(self.first_t.map_or(p.t, |t| t.min(p.t)));
        self.last_t = Some(self.last_t.map_or(p.t, |t| t.max(p.t)));
    }

    /// Take reports, in the order they came.
    pub fn absorb_all<'a>(&mut self, points: impl IntoIterator<Item = &'a MetricsPoint>) {
        for p in points {
            self.absorb(p);
        }
    }

    /// The counters whose samples are the job's (see the module doc).
    fn counting(&self) -> impl Iterator<Item = &Count> {
        let job = self.counts.contains_key(&Counter::Job);
        let ranked = self
            .counts
            .keys()
            .any(|c| matches!(c, Counter::Rank(Some(_))));
        self.counts
            .iter()
            .filter(move |(c, _)| match c {
                Counter::Job => true,
                Counter::Rank(Some(_)) => !job,
                Counter::Rank(None) => !job && !ranked,
            })
            .map(|(_, n)| n)
    }

    /// Samples counted so far (every rank's), 0 before any.
    pub fn samples(&self) -> f64 {
        self.counting().map(|c| c.samples).sum::<f64>() + 0.0
    }

    /// Samples counted so far, whole; `None` while no report said anything about samples
    /// (a run that reports no throughput has no count, which is not a count of 0).
    pub fn count(&self) -> Option<u64> {
        let said = self.counting().any(|c| c.said);
        said.then(|| self.samples().round() as u64)
    }

    /// The job's step: the slowest rank's newest (every rank waits for it at the sync).
    pub fn step(&self) -> Option<u64> {
        let ranked = self.steps.keys().any(Option::is_some);
        self.steps
            .iter()
            .filter(|(r, _)| r.is_some() || !ranked)
            .map(|(_, s)| *s)
            .min()
    }

    /// The newest report's time (the clock the reports were stamped with, seconds).
    pub fn last_t(&self) -> Option<f64> {
        self.last_t
    }

    /// Samples per second over the whole span counted: the samples over the time from the
    /// first report to the last (None before two reports apart in time).
    pub fn mean_samples_per_s(&self) -> Option<f64> {
        let span = self.last_t? - self.first_t?;
        let n = self.count()?;
        (span > 0.0).then(|| n as f64 / span)
    }
}

/// A run's reports as the job's series ([`JobSeries`] over all of them).
pub fn job_points(points: &[MetricsPoint]) -> Vec<MetricsPoint> {
    let mut series = JobSeries::default();
    points.iter().filter_map(|p| series.push(p)).collect()
}

/// A run's reports turned into the job's series as they come: at each report of a rank, the
/// job's figures over every rank's newest report then ([`JobFigures::of`]; a rank silent for
/// [`STALE_RANK_S`] is left out), stamped with that report's time and number and naming no
/// rank. Reports that name no rank (a script of one process, or its output read for metrics)
/// are the run's already and pass as they are, until a rank reports: then they are its output
/// read again, and left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobSeries {
    newest: BTreeMap<u32, MetricsPoint>,
}

impl JobSeries {
    /// The job's point at report `p`, if it makes one.
    pub fn push(&mut self, p: &MetricsPoint) -> Option<MetricsPoint> {
        let Some(rank) = p.rank else {
            return self.newest.is_empty().then(|| p.clone());
        };
        self.newest.insert(rank, p.clone());
        let live = self
            .newest
            .iter()
            .filter(|(_, q)| p.t - q.t <= STALE_RANK_S)
            .map(|(n, q)| (*n, &q.report));
        let job = JobFigures::of(live)?;
        // The knobs the job agreed on, as its lowest rank reports them (every rank applies a
        // change at one step; the lowest one's view does not flap between ranks around it).
        let first = self.newest.values().next().map(|q| &q.report);
        let mut report = MetricsReport {
            step: job.step,
            epoch: p.report.epoch,
            loss: job.loss,
            samples_per_s: job.samples_per_s,
            step_time_s: job.step_time_s,
            data_wait_s: job.data_wait_s,
            batch_size: first.and_then(|r| r.batch_size),
            prefetch: first.and_then(|r| r.prefetch),
            ..MetricsReport::default()
        };
        if let Some(tokens) = job.tokens_per_s {
            report.extra.insert("tokens_per_s".into(), tokens);
        }
        Some(MetricsPoint {
            n: p.n,
            t: p.t,
            from: "job".into(),
            rank: None,
            report,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::training::ReportScope;

    fn point(n: u64, t: f64, rank: Option<u32>, step: Option<u64>, rate: f64) -> MetricsPoint {
        MetricsPoint {
            n,
            t,
            from: "trainer".into(),
            rank,
            report: MetricsReport {
                step,
                batch_size: Some(32),
                samples_per_s: Some(rate),
                ..MetricsReport::default()
            },
        }
    }

    #[test]
    fn each_rank_counts_its_own_samples_and_the_slowest_gives_the_step() {
        let mut t = JobTally::from_now();
        t.absorb_all(&[
            point(0, 10.0, Some(0), Some(100), 320.0),
            point(1, 10.0, Some(1), Some(99), 320.0),
            // The run's parsed output names no rank: not counted while ranks report.
            point(2, 10.5, None, Some(100), 320.0),
            point(3, 11.0, Some(1), Some(109), 320.0),
            point(4, 11.1, Some(0), Some(110), 320.0),
        ]);
        assert_eq!(t.samples(), (10.0 + 10.0) * 32.0);
        assert_eq!(t.step(), Some(109));
        assert_eq!(t.last_t(), Some(11.1));
        // Rank 1 restarted (its step went back): its rate counts for that report.
        t.absorb(&point(5, 12.0, Some(1), Some(0), 100.0));
        assert_eq!(t.samples(), 640.0 + 100.0);
        assert_eq!(t.step(), Some(0));
        // Ranks without steps: each rank's samples/s integrated between its own reports,
        // which sums to the job's samples/s.
        let mut t = JobTally::from_now();
        t.absorb_all(&[
            point(0, 0.0, Some(0), None, 100.0),
            point(1, 0.5, Some(1), None, 120.0),
            point(2, 2.0, Some(0), None, 100.0),
            point(3, 2.5, Some(1), None, 120.0),
        ]);
        assert_eq!(t.samples(), 200.0 + 240.0);
        assert_eq!(t.step(), None);
    }

    /// Four ranks, 150 steps of 32 each, interleaved as a job's reports arrive: the whole
    /// run counts 19,200 samples, and the mean is that over the span.
    #[test]
    fn a_whole_job_counts_every_ranks_every_batch() {
        let mut pts = Vec::new();
        for step in 0..150u64 {
            for rank in [2, 0, 3, 1] {
                let t = 100.0 + step as f64 * 0.1 + rank as f64 * 0.001;
                pts.push(point(pts.len() as u64, t, Some(rank), Some(step), 320.0));
            }
        }
        let mut t = JobTally::whole_run();
        t.absorb_all(&pts);
        assert_eq!(t.count(), Some(19_200));
        assert_eq!(t.step(), Some(149));
        let ts = pts.iter().map(|p| p.t);
        let span = ts.clone().fold(f64::MIN, f64::max) - ts.fold(f64::MAX, f64::min);
        let mean = t.mean_samples_per_s().unwrap();
        assert!((mean - 19_200.0 / span).abs() < 1e-6, "{mean}");
        // One rank's count alone, as a tally that mixed the ranks into one would get.
        assert!(mean > 4.0 * 300.0, "{mean}");
    }

    #[test]
    fn cumulative_samples_and_job_wide_reports_are_not_summed_twice() {
        let with = |n: u64, t: f64, rank: u32, samples: u64, job: bool| {
            let mut p = point(n, t, Some(rank), Some(n), 1000.0);
            p.report.samples = Some(samples);
            p.report.scope = job.then_some(ReportScope::Job);
            p
        };
        // Each rank counts its own cumulative samples.
        let mut t = JobTally::whole_run();
        t.absorb_all(&[
            with(0, 1.0, 0, 64, false),
            with(1, 1.0, 1, 64, false),
            with(2, 2.0, 0, 128, false),
            with(3, 2.0, 1, 128, false),
        ]);
        assert_eq!(t.count(), Some(256));
        // Rank 0 logs the job's global count (a framework's global figures): that is the
        // job's, and the other ranks' own reports are not added to it.
        let mut t = JobTally::whole_run();
        t.absorb_all(&[
            with(0, 1.0, 0, 256, true),
            with(1, 1.0, 1, 64, false),
            with(2, 2.0, 0, 512, true),
            with(3, 2.0, 1, 128, false),
        ]);
        assert_eq!(t.count(), Some(512));
        // Counting again from zero: the script started over, and what it trains since counts.
        t.absorb(&with(4, 3.0, 0, 100, true));
        assert_eq!(t.count(), Some(612));
    }

    #[test]
    fn a_run_that_says_nothing_of_samples_has_no_count() {
        let mut t = JobTally::whole_run();
        assert_eq!(t.count(), None);
        let mut p = point(0, 1.0, None, None, 0.0);
        p.report.samples_per_s = None;
        p.report.loss = Some(0.5);
        t.absorb(&p);
        assert_eq!(t.count(), None);
        assert_eq!(t.samples(), 0.0);
        assert!(t.samples().is_sign_positive());
    }

    #[test]
    fn the_job_series_sums_every_ranks_newest_rate() {
        let pts = vec![
            point(0, 0.0, Some(0), Some(1), 100.0),
            point(1, 0.1, Some(1), Some(1), 120.0),
            point(2, 0.2, None, Some(1), 999.0),
            point(3, 1.0, Some(0), Some(2), 110.0),
            // Rank 1 fell silent: past the stale limit it no longer counts.
            point(4, 1.0 + STALE_RANK_S + 1.0, Some(0), Some(3), 90.0),
        ];
        let job = job_points(&pts);
        let rates: Vec<f64> = job.iter().filter_map(|p| p.report.samples_per_s).collect();
        assert_eq!(rates, vec![100.0, 220.0, 230.0, 90.0]);
        assert!(job.iter().all(|p| p.rank.is_none() && p.from == "job"));
        assert_eq!(job[2].report.step, Some(1));
        // Reports that name no rank are the run's as they are.
        let none: Vec<MetricsPoint> = pts.iter().filter(|p| p.rank.is_none()).cloned().collect();
        assert_eq!(job_points(&none), none);
        // A job-wide report is the job's figure, not one more rank to add.
        let mut wide = pts[..2].to_vec();
        wide[0].report.scope = Some(ReportScope::Job);
        wide[0].report.samples_per_s = Some(400.0);
        let rates: Vec<f64> = job_points(&wide)
            .iter()
            .filter_map(|p| p.report.samples_per_s)
            .collect();
        assert_eq!(rates, vec![400.0, 400.0]);
    }
}
