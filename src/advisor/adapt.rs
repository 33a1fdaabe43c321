//! From what the daemon keeps to the advisor's input: GPU series from the history (one value
//! per second: util, memory, power, cap, temperature, SM clock) completed with the fixed
//! figures of the newest sample, and a run's window from its metrics reports, where a change of
//! batch size or prefetch between two reports, or of a GPU's cap in its history, is a change.
//! A job of several ranks also gets each rank's own reports, and its run-level rules read rank
//! 0's (every rank of a data-parallel job trains with the same knobs).

use crate::history::{Metric, Point};
use crate::protocol::{KnobName, MetricsPoint as Report, TrainerInfo};
use crate::telemetry::{GpuSample, throttle};
use crate::training::job_points;

use super::{GpuPoint, GpuSeries, Knob, KnobChange, RankWindow, RunWindow, StepPoint};

/// The history series the advisor reads. The power- and thermal-limited shares are the
/// history's reading of the throttle reasons ([`throttle::held`], as the console's badges read
/// them): without them only the newest sample would say why the clock is down.
pub const METRICS: [Metric; 8] = [
    Metric::UtilGpu,
    Metric::MemoryUsed,
    Metric::Power,
    Metric::PowerLimit,
    Metric::Temperature,
    Metric::SmClock,
    Metric::PowerLimited,
    Metric::ThermalLimited,
];

/// What a GPU's history does not keep: its rated figures (from its newest sample, or what a
/// run recorded when it started).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rated {
    pub memory_total_bytes: Option<u64>,
    pub power_default_w: Option<f64>,
    pub power_max_w: Option<f64>,
    pub temp_slowdown_c: Option<f64>,
    pub sm_clock_max_mhz: Option<u32>,
}

impl Rated {
    pub fn of(s: &GpuSample) -> Rated {
        Rated {
            memory_total_bytes: s.memory_total_bytes,
            power_default_w: s.power_default_w,
            power_max_w: s.power_max_w,
            temp_slowdown_c: s.temp_slowdown_c,
            sm_clock_max_mhz: s.sm_clock_max_mhz,
        }
    }
}

/// One GPU's points from its history: `series` holds, for some of [`METRICS`] (and
/// [`Metric::PowerLimited`], [`Metric::ThermalLimited`] where given), its points (means per
/// bucket), one point per time any of them has. A bucket held by the power cap or by thermal
/// slowdown at least half its time gets that reason's bit.
pub fn gpu_points(rated: &Rated, series: &[(Metric, Vec<Point>)]) -> Vec<GpuPoint> {
    let mut times: Vec<f64> = series
        .iter()
        .flat_map(|(_, ps)| ps.iter().map(|p| p.t))
        .collect();
    times.sort_by(f64::total_cmp);
    times.dedup_by(|a, b| (*a - *b).abs() < 1e-6);
    let at = |m: Metric, t: f64| {
        series
            .iter()
            .find(|(k, _)| *k == m)
            .and_then(|(_, ps)| ps.iter().find(|p| (p.t - t).abs() < 1e-6))
            .map(|p| p.mean)
    };
    let reasons = |t: f64| {
        let power = at(Metric::PowerLimited, t);
        let thermal = at(Metric::ThermalLimited, t);
        if power.is_none() && thermal.is_none() {
            return None;
        }
        let bit = |share: Option<f64>, bit: u64| if share? >= 0.5 { Some(bit) } else { None };
        Some(
            bit(power, throttle::SW_POWER_CAP).unwrap_or(0)
                | bit(thermal, throttle::SW_THERMAL_SLOWDOWN).unwrap_or(0),
        )
    };
    times
        .iter()
        .map(|&t| GpuPoint {
            t,
            util_pct: at(Metric::UtilGpu, t),
            memory_used_bytes: at(Metric::MemoryUsed, t).map(|b| b as u64),
            memory_total_bytes: rated.memory_total_bytes,
            power_w: at(Metric::Power, t),
            power_limit_w: at(Metric::PowerLimit, t),
            power_default_w: rated.power_default_w,
            power_max_w: rated.power_max_w,
            temperature_c: at(Metric::Temperature, t),
            temp_slowdown_c: rated.temp_slowdown_c,
            throttle_reasons: reasons(t),
            sm_clock_mhz: at(Metric::SmClock, t).map(|c| c.round() as u32),
            sm_clock_max_mhz: rated.sm_clock_max_mhz,
        })
        .collect()
}

/// One GPU's series: its history's points ([`gpu_points`]) with the rated figures of the
/// newest sample, then that sample itself (with its throttle reasons, what the console's badge
/// shows) where it is newer, or in place of a history point of the same time.
pub fn gpu_series(latest: &GpuSample, series: &[(Metric, Vec<Point>)]) -> GpuSeries {
    let mut points = gpu_points(&Rated::of(latest), series);
    if let Some(p) = GpuPoint::from_sample(latest) {
        match points.last_mut() {
            Some(q) if (q.t - p.t).abs() < 1e-6 => *q = p,
            Some(q) if q.t > p.t => {}
            _ => points.push(p),
        }
    }
    GpuSeries {
        index: latest.index,
        points,
        latest: Some(latest.clone()),
    }
}

/// A GPU's cap changes, from its power-limit points.
pub fn cap_changes(gpu: u32, limits: &[Point]) -> Vec<KnobChange> {
    // A bucket that straddles a change holds neither value: only settled ones count.
    let settled: Vec<&Point> = limits.iter().filter(|p| p.min == p.max).collect();
    settled
        .windows(2)
        .filter(|w| (w[1].mean - w[0].mean).abs() >= 1.0)
        .map(|w| KnobChange {
            t: w[1].t,
            knob: Knob::PowerCap,
            old: w[0].mean,
            new: w[1].mean,
            gpu: Some(gpu),
        })
        .collect()
}

fn point(p: &Report) -> StepPoint {
    let r = &p.report;
    StepPoint {
        t: p.t,
        step: r.step,
        samples_per_s: r.samples_per_s,
        step_time_s: r.step_time_s,
        data_wait_s: r.data_wait_s,
        batch_size: r.batch_size.and_then(|b| u32::try_from(b).ok()),
        prefetch: r.prefetch.and_then(|b| u32::try_from(b).ok()),
    }
}

/// Each rank of a job of several (every rank the trainer side lists, and any other that
/// reported) with its own reports; empty for a single process.
pub fn rank_windows(trainer: &TrainerInfo, reports: &[Report]) -> Vec<RankWindow> {
    let mut ranks: Vec<RankWindow> = trainer
        .ranks
        .iter()
        .map(|r| RankWindow {
            rank: r.spec.rank,
            gpu: r.spec.gpu,
            host: r.spec.host.clone(),
            pid: r.pid,
            metrics: Vec::new(),
        })
        .collect();
    for p in reports {
        let Some(rank) = p.rank else { continue };
        let i = match ranks.iter().position(|r| r.rank == rank) {
            Some(i) => i,
            None => {
                ranks.push(RankWindow {
                    rank,
                    ..RankWindow::default()
                });
                ranks.len() - 1
            }
        };
        ranks[i].metrics.push(point(p));
    }
    ranks.sort_by_key(|r| r.rank);
    if ranks.len() < 2 && trainer.world_size.is_none_or(|w| w <= 1) {
        return Vec::new();
    }
    ranks
}

/// A run's window from its reports (oldest first) and its trainer side (knob ranges, ranks);
/// `caps` are the cap changes of its GPUs.
pub fn run_window(
    run: &str,
    gpus: Vec<u32>,
    reports: &[Report],
    trainer: &TrainerInfo,
    caps: Vec<KnobChange>,
) -> RunWindow {
    let ranks = rank_windows(trainer, reports);
    // A job's run-level rules read the job's series (samples/s summed over its ranks, the
    // slowest rank's step time: the figures every other output gives), a single process its
    // reports.
    let metrics: Vec<StepPoint> = if ranks.is_empty() {
        reports.iter().map(point).collect()
    } else {
        job_points(reports).iter().map(point).collect()
    };
    let mut changes = caps;
    for w in metrics.windows(2) {
        for (knob, old, new) in [
            (Knob::BatchSize, w[0].batch_size, w[1].batch_size),
            (Knob::Prefetch, w[0].prefetch, w[1].prefetch),
        ] {
            if let (Some(a), Some(b)) = (old, new) {
                if a != b {
                    changes.push(KnobChange {
                        t: w[1].t,
                        knob,
                        old: f64::from(a),
                        new: f64::from(b),
                        gpu: None,
                    });
                }
            }
        }
    }
    changes.sort_by(|a, b| a.t.total_cmp(&b.t));
    let range = |name: KnobName| {
        trainer.knobs.iter().find(|k| k.knob == name).and_then(|k| {
            let r = k.range.as_ref()?;
            let lo = u32::try_from(r.min).ok()?;
            let hi = r.max.map_or(Some(u32::MAX), |m| u32::try_from(m).ok())?;
            Some((lo, hi))
        })
    };
    RunWindow {
        run: run.to_string(),
        gpus,
        metrics,
        changes,
        batch_range: range(KnobName::BatchSize),
        prefetch_range: range(KnobName::Prefetch),
        ranks,
        job_samples_per_s: trainer.job.as_ref().and_then(|j| j.samples_per_s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::MetricsReport;

    fn pt(t: f64, v: f64) -> Point {
        Point {
            t,
            min: v,
            mean: v,
            max: v,
        }
    }

    #[test]
    fn history_and_the_newest_sample_make_one_series() {
        let latest = GpuSample {
            index: 2,
            time_s: 103.0,
            util_gpu_pct: Some(50.0),
            memory_total_bytes: Some(80),
            power_default_w: Some(700.0),
            temp_slowdown_c: Some(87.0),
            throttle_reasons: Some(4),
            ..Default::default()
        };
        let series = vec![
            (Metric::UtilGpu, vec![pt(100.0, 90.0), pt(101.0, 80.0)]),
            (Metric::Power, vec![pt(100.0, 600.0), pt(101.0, 610.0)]),
            (Metric::SmClock, vec![pt(101.0, 1979.6)]),
        ];
        let s = gpu_series(&latest, &series);
        assert_eq!(s.index, 2);
        assert_eq!(s.points.len(), 3);
        let p = &s.points[1];
        assert_eq!(
            (p.t, p.util_pct, p.power_w),
            (101.0, Some(80.0), Some(610.0))
        );
        assert_eq!(p.sm_clock_mhz, Some(1980));
        assert_eq!(
            (p.memory_total_bytes, p.temp_slowdown_c),
            (Some(80), Some(87.0))
        );
        assert_eq!(p.throttle_reasons, None, "history keeps no reasons");
        assert_eq!(s.points[2].throttle_reasons, Some(4));
        assert_eq!(s.points[0].sm_clock_mhz, None);
    }

    #[test]
    fn changes_come_from_reports_and_caps() {
        let report = |t: f64, batch: i64| Report {
            n: t as u64,
            t,
            from: "trainer".into(),
            report: MetricsReport {
                batch_size: Some(batch),
                prefetch: Some(2),
                ..Default::default()
            },
            rank: None,
        };
        let reports = [report(1.0, 64), report(2.0, 64), report(3.0, 128)];
        let caps = cap_changes(0, &[pt(0.5, 700.0), pt(1.5, 700.0), pt(2.5, 500.0)]);
        assert_eq!(caps.len(), 1);
        let w = run_window("r", vec![0], &reports, &TrainerInfo::default(), caps);
        assert_eq!(w.metrics.len(), 3);
        let summary: Vec<(f64, Knob, f64, f64)> = w
            .changes
            .iter()
            .map(|c| (c.t, c.knob, c.old, c.new))
            .collect();
        assert_eq!(
            summary,
            [
                (2.5, Knob::PowerCap, 700.0, 500.0),
                (3.0, Knob::BatchSize, 64.0, 128.0)
            ]
        );
        // A bucket that straddles the change holds neither value.
        let straddle = Point {
            t: 2.0,
            min: 500.0,
            mean: 600.0,
            max: 700.0,
        };
        let c = cap_changes(0, &[pt(1.0, 700.0), straddle, pt(3.0, 500.0)]);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].t, c[0].old, c[0].new), (3.0, 700.0, 500.0));
    }
}
