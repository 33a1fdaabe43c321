//! The watched run's training metrics and knobs, as the Run view's charts and knob panel read
//! them: the newest reports (at most [`KEPT_POINTS`]), where the trainer and its knobs stand,
//! the four series the charts draw, and the times the charts mark (knob changes that took
//! effect, power-cap and governor changes on the node). Filled from the feed's
//! [`Update::Metrics`](super::feed::Update::Metrics); nothing here reads a clock.

use crate::protocol::{
    KnobName, KnobState, KnobVia, MetricsPoint, NodeEvent, NodeEventRecord, TrainerInfo,
};
use crate::time::parse_rfc3339;
use crate::training::JobSeries;
use std::collections::VecDeque;
use std::time::UNIX_EPOCH;

/// Reports kept for the shown run: enough for hours at one report a second, and the most the
/// daemon hands out in one answer.
pub const KEPT_POINTS: usize = 5000;

/// The metrics and knobs of the run the console watches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunMetrics {
    /// The run's full id; None until its first answer came.
    pub run: Option<String>,
    /// Reports, oldest first.
    pub points: VecDeque<MetricsPoint>,
    /// Its trainer and knobs, as of the last poll.
    pub trainer: Option<TrainerInfo>,
    /// The job's series made from `points` as they came (a job's figures over its ranks, the
    /// same as `ps` and the report give), at most [`KEPT_POINTS`]: what the charts draw.
    pub job: VecDeque<MetricsPoint>,
    series: JobSeries,
}

impl RunMetrics {
    /// Take in an answer for `run`: `reset` (or another run's answer) replaces what was kept.
    pub fn take(&mut self, run: String, points: Vec<MetricsPoint>, reset: bool, t: TrainerInfo) {
        if reset || self.run.as_deref() != Some(run.as_str()) {
            self.points.clear();
            self.job.clear();
            self.series = JobSeries::default();
            self.run = Some(run);
        }
        // A report already kept (a poll that overlapped the last) is not counted twice.
        let after = self.points.back().map(|p| p.n);
        for p in points.into_iter().filter(|p| after.is_none_or(|n| p.n > n)) {
            self.job.extend(self.series.push(&p));
            self.points.push_back(p);
        }
        while self.points.len() > KEPT_POINTS {
            self.points.pop_front();
        }
        while self.job.len() > KEPT_POINTS {
            self.job.pop_front();
        }
        self.trainer = Some(t);
    }

    /// What is kept for `run`, if this is its data.
    pub fn of(&self, run: &str) -> Option<&RunMetrics> {
        (self.run.as_deref() == Some(run)).then_some(self)
    }

    /// Whether the run has anything for the charts or the knob panel.
    pub fn has_any(&self) -> bool {
        !self.points.is_empty() || self.trainer.as_ref().is_some_and(|t| !t.knobs.is_empty())
    }

    /// Where `knob` stands, if the run has it.
    pub fn knob(&self, knob: KnobName) -> Option<&KnobState> {
        self.trainer.as_ref()?.knobs.iter().find(|k| k.knob == knob)
    }

    /// `(t, value)` of the job's series that has `series`, oldest first: a run of several
    /// ranks is charted as the job (samples/s summed over its ranks, the slowest rank's step
    /// time), the figures `ps` and the report give; the rank table shows each rank's own.
    pub fn series(&self, series: Series) -> Vec<(f64, f64)> {
        self.job
            .iter()
            .filter_map(|p| Some((p.t, series.value(p)?)))
            .filter(|(_, v)| v.is_finite())
            .collect()
    }
}

/// The four series the Run view charts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Series {
    Loss,
    SamplesPerS,
    StepTime,
    DataWait,
}

impl Series {
    pub const ALL: [Series; 4] = [
        Series::Loss,
        Series::SamplesPerS,
        Series::StepTime,
        Series::DataWait,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Series::Loss => "loss",
            Series::SamplesPerS => "samples/s",
            Series::StepTime => "step time",
            Series::DataWait => "data wait",
        }
    }

    /// The value a report gives, in the unit [`Series::format`] expects (seconds for times).
    pub fn value(self, p: &MetricsPoint) -> Option<f64> {
        let r = &p.report;
        match self {
            Series::Loss => r.loss,
            Series::SamplesPerS => r.samples_per_s,
            Series::StepTime => r.step_time_s,
            Series::DataWait => r.data_wait_s,
        }
    }

    /// A value as the chart's title and axis say it: `2.314`, `812`, `1.2k`, `79 ms`, `1.4 s`.
    pub fn format(self, v: f64) -> String {
        match self {
            Series::Loss => {
                let a = v.abs();
                if a >= 100.0 {
                    format!("{v:.0}")
                } else if a >= 10.0 {
                    format!("{v:.2}")
                } else {
                    format!("{v:.3}")
                }
            }
            Series::SamplesPerS => {
                if v.abs() >= 10_000.0 {
                    format!("{:.1}k", v / 1000.0)
                } else if v.abs() >= 100.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.1}")
                }
            }
            Series::StepTime | Series::DataWait => {
                if v.abs() >= 1.0 {
                    format!("{v:.2} s")
                } else if v.abs() >= 0.01 {
                    format!("{:.0} ms", v * 1000.0)
                } else {
                    format!("{:.1} ms", v * 1000.0)
                }
            }
        }
    }
}

/// Something a chart marks at its time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Marker {
    /// Seconds since the epoch.
    pub t: f64,
    pub kind: MarkerKind,
}

/// What a marker stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    /// A knob of the run took a new value (the trainer applied it, or the run restarted with it).
    Knob,
    /// A power cap or the governor changed on the node.
    Power,
}

/// What changed when, for `run`'s charts, oldest first: its knob changes that took effect
/// (`knob_applied`, and `knob_changed` by restart), and every power-cap or governor change on
/// the node (events named `power…` or `governor…`, and `gpu_changed` of a power limit).
/// Events whose time does not parse are left out.
pub fn markers<'a>(
    events: impl IntoIterator<Item = &'a NodeEventRecord>,
    run: &str,
) -> Vec<Marker> {
    let mut out: Vec<Marker> = events
        .into_iter()
        .filter_map(|rec| {
            let kind = marker_kind(&rec.event, run)?;
            Some(Marker {
                t: event_time(&rec.time)?,
                kind,
            })
        })
        .collect();
    out.sort_by(|a, b| a.t.total_cmp(&b.t));
    out
}

fn marker_kind(e: &NodeEvent, run: &str) -> Option<MarkerKind> {
    match e {
        NodeEvent::KnobApplied { run: r, .. } if r == run => Some(MarkerKind::Knob),
        NodeEvent::KnobChanged {
            run: r,
            via: KnobVia::Restart,
            ..
        } if r == run => Some(MarkerKind::Knob),
        NodeEvent::KnobApplied { .. }
        | NodeEvent::KnobChanged { .. }
        | NodeEvent::KnobRejected { .. } => None,
        NodeEvent::GpuChanged { what, .. } if what.starts_with("power") => Some(MarkerKind::Power),
        // Power and governor events are matched by name, so new ones are marked without a
        // change here.
        other => kind_by_name(&serde_json::to_value(other).ok()?),
    }
}

/// An event as its JSON (`{"event": "power_cap", …}`): a power marker when its name says so.
fn kind_by_name(v: &serde_json::Value) -> Option<MarkerKind> {
    let name = v["event"].as_str()?;
    (name.starts_with("power") || name.starts_with("governor")).then_some(MarkerKind::Power)
}

/// An event's RFC 3339 time in seconds since the epoch.
fn event_time(s: &str) -> Option<f64> {
    let t = parse_rfc3339(s)?;
    Some(t.duration_since(UNIX_EPOCH).ok()?.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{KnobRange, MetricsReport};

    fn point(n: u64, t: f64, loss: Option<f64>) -> MetricsPoint {
        MetricsPoint {
            n,
            t,
            from: "trainer".into(),
            report: MetricsReport {
                loss,
                samples_per_s: Some(800.0 + n as f64),
                ..MetricsReport::default()
            },
            rank: None,
        }
    }

    fn trainer(knobs: Vec<KnobState>) -> TrainerInfo {
        TrainerInfo {
            attached: true,
            pid: Some(7),
            last: None,
            knobs,
            ..TrainerInfo::default()
        }
    }

    #[test]
    fn a_run_of_several_ranks_is_charted_as_its_job() {
        let mut m = RunMetrics::default();
        let ranked = |n, rank, loss, rate| {
            let mut p = MetricsPoint {
                rank: Some(rank),
                ..point(n, n as f64, Some(loss))
            };
            p.report.samples_per_s = Some(rate);
            p
        };
        m.take(
            "a".into(),
            vec![ranked(0, 0, 2.0, 100.0), ranked(1, 1, 9.0, 120.0)],
            true,
            trainer(vec![]),
        );
        // A later poll goes on from the ranks' newest reports.
        m.take(
            "a".into(),
            vec![ranked(2, 0, 1.5, 110.0)],
            false,
            trainer(vec![]),
        );
        // Rank 0's loss (every rank trains the same model), the ranks' samples/s summed.
        assert_eq!(m.series(Series::Loss), [(0.0, 2.0), (1.0, 2.0), (2.0, 1.5)]);
        assert_eq!(
            m.series(Series::SamplesPerS),
            [(0.0, 100.0), (1.0, 220.0), (2.0, 230.0)]
        );
    }

    #[test]
    fn reports_are_kept_per_run_bounded_and_not_twice() {
        let mut m = RunMetrics::default();
        assert!(!m.has_any());
        m.take(
            "a".into(),
            vec![point(0, 10.0, Some(2.0)), point(1, 11.0, None)],
            true,
            trainer(vec![]),
        );
        assert!(m.has_any());
        // An overlapping answer adds only what is new.
        m.take(
            "a".into(),
            vec![point(1, 11.0, None), point(2, 12.0, Some(1.5))],
            false,
            trainer(vec![]),
        );
        assert_eq!(m.points.iter().map(|p| p.n).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(m.series(Series::Loss), [(10.0, 2.0), (12.0, 1.5)]);
        assert_eq!(m.series(Series::SamplesPerS).len(), 3);
        assert!(m.series(Series::DataWait).is_empty());
        assert!(m.of("a").is_some() && m.of("b").is_none());

        // Another run's answer replaces it, even without `reset`.
        m.take(
            "b".into(),
            vec![point(5, 20.0, Some(1.0))],
            false,
            trainer(vec![]),
        );
        assert_eq!(m.run.as_deref(), Some("b"));
        assert_eq!(m.points.len(), 1);

        let many: Vec<MetricsPoint> = (0..KEPT_POINTS as u64 + 10)
            .map(|n| point(n, n as f64, Some(1.0)))
            .collect();
        m.take("b".into(), many, true, trainer(vec![]));
        assert_eq!(m.points.len(), KEPT_POINTS);
        assert_eq!(m.points.front().map(|p| p.n), Some(10), "the oldest go");
    }

    #[test]
    fn knobs_alone_count_and_are_found_by_name() {
        let mut m = RunMetrics::default();
        m.take(
            "a".into(),
            vec![],
            true,
            trainer(vec![KnobState {
                knob: KnobName::Prefetch,
                value: Some(2),
                pending: None,
                range: Some(KnobRange {
                    min: 1,
                    max: Some(8),
                }),
                last_rtt_ms: None,
                last_outcome: None,
            }]),
        );
        assert!(
            m.has_any(),
            "a run with knobs and no reports yet has a band"
        );
        assert_eq!(m.knob(KnobName::Prefetch).and_then(|k| k.value), Some(2));
        assert!(m.knob(KnobName::BatchSize).is_none());
    }

    fn rec(seq: u64, time: &str, event: NodeEvent) -> NodeEventRecord {
        NodeEventRecord {
            seq,
            time: time.into(),
            event,
        }
    }

    #[test]
    fn markers_are_the_runs_applied_knobs_and_the_nodes_power_changes() {
        let applied = |run: &str| NodeEvent::KnobApplied {
            run: run.into(),
            change: 1,
            knob: KnobName::BatchSize,
            value: 512,
            rtt_ms: 7.5,
            ranks: None,
            step: None,
        };
        let changed = |via| NodeEvent::KnobChanged {
            run: "a".into(),
            change: 2,
            knob: KnobName::Prefetch,
            old: Some(2),
            new: 4,
            via,
            by: "alice".into(),
            why: None,
        };
        let gpu = |what: &str| NodeEvent::GpuChanged {
            gpu: 0,
            what: what.into(),
            old: Some("700 W".into()),
            new: Some("450 W".into()),
            by: "alice".into(),
            why: None,
        };
        let events = vec![
            rec(1, "2023-11-14T22:13:30.000Z", applied("a")),
            rec(2, "2023-11-14T22:13:25.500Z", applied("other run")),
            rec(3, "2023-11-14T22:13:40.000Z", changed(KnobVia::Trainer)),
            rec(4, "2023-11-14T22:13:50.000Z", changed(KnobVia::Restart)),
            rec(5, "2023-11-14T22:13:21.250Z", gpu("power_limit")),
            rec(6, "2023-11-14T22:13:22.000Z", gpu("locked_clocks")),
            rec(7, "not a time", applied("a")),
            rec(
                8,
                "2023-11-14T22:13:23.000Z",
                NodeEvent::KnobRejected {
                    run: "a".into(),
                    change: 3,
                    knob: KnobName::BatchSize,
                    value: 4096,
                    kept: Some(512),
                    reason: "out of memory".into(),
                    rtt_ms: 3.0,
                    rank: None,
                },
            ),
        ];
        let m = markers(&events, "a");
        let t0 = 1_700_000_000.0;
        assert_eq!(
            m,
            [
                Marker {
                    t: t0 + 1.25,
                    kind: MarkerKind::Power
                },
                Marker {
                    t: t0 + 10.0,
                    kind: MarkerKind::Knob
                },
                Marker {
                    t: t0 + 30.0,
                    kind: MarkerKind::Knob
                },
            ],
            "applied and restarted changes of run a, and the power cap; sorted by time"
        );
    }

    #[test]
    fn power_and_governor_events_are_matched_by_name() {
        // Whatever variants the daemon adds for them, the event's name decides.
        for (name, kind) in [
            ("power_cap", Some(MarkerKind::Power)),
            ("power_budget", Some(MarkerKind::Power)),
            ("governor_step", Some(MarkerKind::Power)),
            ("run_started", None),
            ("trainer", None),
        ] {
            let v = serde_json::json!({"event": name, "gpu": 0});
            assert_eq!(kind_by_name(&v), kind, "{name}");
        }
        assert_eq!(kind_by_name(&serde_json::json!({"gpu": 0})), None);
        // An existing event that is neither is not marked.
        let e = NodeEvent::DaemonStopped {
            pid: 1,
            reason: "power went out".into(),
        };
        assert_eq!(marker_kind(&e, "a"), None);
    }

    #[test]
    fn values_read_at_a_glance() {
        assert_eq!(Series::Loss.format(2.31456), "2.315");
        assert_eq!(Series::Loss.format(12.5), "12.50");
        assert_eq!(Series::SamplesPerS.format(812.4), "812");
        assert_eq!(Series::SamplesPerS.format(23_456.0), "23.5k");
        assert_eq!(Series::SamplesPerS.format(7.25), "7.2");
        assert_eq!(Series::StepTime.format(0.079), "79 ms");
        assert_eq!(Series::DataWait.format(0.0042), "4.2 ms");
        assert_eq!(Series::StepTime.format(1.5), "1.50 s");
    }
}
