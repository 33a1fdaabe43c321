//! The figures of a run's report, gathered from its run directory (`summary.json`,
//! `metrics.jsonl`, `events.jsonl`, `launch.json`), the node's event log (cap changes) and,
//! where a daemon answers, its GPU history over the run's span.
//!
//! Gathering reads files and nothing else: the caller fetches the GPU history (the CLI over the
//! daemon's `History` request, the daemon from its own store) and hands it in. What could not be
//! read is said in [`Report::missing`], never silently dropped; a line of a `.jsonl` file that
//! does not parse (cut short by a crash mid-write, or too long) is counted and skipped.

use std::io::{self, BufReader};
use std::ops::ControlFlow;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::environment::{self, Environment};
use crate::config::safe_fs;
use crate::control::energy::RunEnergy;
use crate::history::{Metric, Point};
use crate::protocol::{MetricsPoint, NodeEvent, NodeEventRecord, RunInfo};
use crate::supervisor::{Event, EventRecord, RunDir, Summary};
use crate::time::{parse_rfc3339, rfc3339};
use crate::training::{JobTally, MAX_METRICS_LINE, job_points};

/// Most points kept per chart series (metrics are thinned to this many, evenly).
pub const MAX_POINTS: usize = 600;

/// The GPU series a report asks the history for.
pub const GPU_METRICS: [Metric; 8] = [
    Metric::UtilGpu,
    Metric::MemoryUsed,
    Metric::Power,
    Metric::PowerLimit,
    Metric::Temperature,
    Metric::SmClock,
    Metric::PowerLimited,
    Metric::ThermalLimited,
];

/// A run's report: everything the HTML, Markdown and JSON forms show.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// When the report was made (RFC 3339, UTC).
    pub generated_at: String,
    /// The run was still live: this is a report so far.
    pub live: bool,
    /// `summary.json` as read (energy replaced by the daemon's newer figure for a live run).
    pub summary: Summary,
    /// The run's command line, from `launch.json`.
    pub command: Vec<String>,
    /// The GPUs the run used (indices), where known.
    pub gpus: Option<Vec<u32>>,
    /// Unix seconds of the first start and of the end (now, for a live run).
    pub start_s: f64,
    pub end_s: f64,
    pub throughput: Throughput,
    pub energy: Option<RunEnergy>,
    pub time_lost: TimeLost,
    /// Trainer reports per rank (a run without ranks has one series, rank `None`), thinned to
    /// at most [`MAX_POINTS`] each.
    pub ranks: Vec<RankSeries>,
    /// Per-GPU telemetry over the run's span, when the history was available.
    pub gpu_history: Option<Vec<GpuSeries>>,
    /// Knob changes, cap changes, restarts and stops, in time order.
    pub markers: Vec<Marker>,
    pub events: Vec<EventRecord>,
    /// What the run ran on, as the daemon recorded it at the start (`environment.json`).
    pub environment: Option<Environment>,
    /// The advisor's findings over the whole run ([`super::advice`]).
    #[serde(default)]
    pub advice: Vec<crate::advisor::Hint>,
    /// Lines that could not be read (skipped).
    pub unreadable: Unreadable,
    /// What the report could not show, in words.
    pub missing: Vec<String>,
}

/// Job throughput.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// The highest step any rank reported.
    pub steps: Option<u64>,
    /// Training samples (the energy accounting's count).
    pub samples: Option<u64>,
    /// Samples per second over the run's span (every rank's samples).
    pub mean_samples_per_s: Option<f64>,
    pub mean_step_time_s: Option<f64>,
    /// Trainer reports read.
    pub reports: usize,
}

/// Where the time went.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeLost {
    /// Data wait over step time, over every report that has both (0..1).
    pub data_wait_share: Option<f64>,
    /// Per GPU: seconds clocked down by power and by temperature (from the history).
    pub throttled: Vec<Throttled>,
    /// The wait for the slowest rank, where the run has ranks.
    pub straggler: Option<Straggler>,
}

/// How long a run of several ranks waited for its slowest: at each step that two ranks'
/// reports or more cover with a step time, the slowest rank's time less the median rank's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Straggler {
    /// Seconds waited for the slowest rank, summed over the steps compared.
    pub wait_s: f64,
    /// That wait over the job's time on those steps (the slowest rank's step times) (0..1).
    pub share: f64,
    /// Steps compared.
    pub steps: usize,
    /// Ranks seen.
    pub ranks: usize,
    /// The rank that was slowest most often, and at how many of the steps.
    pub slowest_rank: u32,
    pub slowest_steps: usize,
}

/// One GPU's throttling over the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Throttled {
    pub gpu: u32,
    pub power_s: Option<f64>,
    pub thermal_s: Option<f64>,
}

/// One rank's reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankSeries {
    pub rank: Option<u32>,
    pub points: Vec<MetricsPoint>,
}

/// One GPU's history: `(metric, points)` for each of [`GPU_METRICS`] that has points.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSeries {
    pub gpu: u32,
    pub series: Vec<(Metric, Vec<Point>)>,
}

impl GpuSeries {
    pub fn get(&self, metric: Metric) -> Option<&[Point]> {
        self.series
            .iter()
            .find(|(m, _)| *m == metric)
            .map(|(_, p)| p.as_slice())
    }
}

/// What a chart marks with a vertical line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkerKind {
    Knob,
    Cap,
    /// A step of the thermal governor on one of the run's GPUs' caps.
    Governor,
    Restart,
    Stop,
}

/// Most governor steps drawn as markers (a governor on a hot GPU steps every few seconds);
/// more are thinned evenly, and the report says how many there were.
pub const MAX_GOVERNOR_MARKERS: usize = 40;

/// A change during the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    /// Unix seconds.
    pub t: f64,
    pub kind: MarkerKind,
    pub label: String,
}

/// Lines of each file that did not parse.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unreadable {
    pub metrics: usize,
    pub events: usize,
}

/// Why there is no report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{0}: no summary.json: not a run directory (or the run has not started yet)")]
    NoSummary(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// What a report is made from besides the run directory.
#[derive(Debug, Default)]
pub struct Sources<'a> {
    /// The daemon's view of the run (newer energy for a live run).
    pub info: Option<&'a RunInfo>,
    /// The node's event log (`$STATE/events.jsonl`), for cap changes.
    pub node_log: Option<&'a Path>,
    /// The GPU history over the run's span; `Err(why)` when it could not be had.
    pub history: Option<Result<Vec<GpuSeries>, String>>,
    /// Now (Unix seconds); the system clock when absent.
    pub now_s: Option<f64>,
}

/// Unix seconds of an RFC 3339 time as the run files write it.
pub fn unix_s(time: &str) -> Option<f64> {
    parse_rfc3339(time)?
        .duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs_f64())
}

fn system_now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The run's span `(start, end)` in Unix seconds, from its summary (end: now while it lives).
pub fn span(summary: &Summary, now_s: f64) -> (f64, f64) {
    let start = unix_s(&summary.started_at).unwrap_or(now_s);
    let end = summary
        .ended_at
        .as_deref()
        .and_then(unix_s)
        .unwrap_or(now_s)
        .max(start);
    (start, end)
}

/// The GPUs a run used: its energy's GPUs, else `CUDA_VISIBLE_DEVICES` as started (numeric).
pub fn run_gpus(dir: &RunDir, energy: Option<&RunEnergy>) -> Option<Vec<u32>> {
    if let Some(e) = energy.filter(|e| !e.per_gpu.is_empty()) {
        return Some(e.per_gpu.iter().map(|g| g.gpu).collect());
    }
    let plan = dir.read_launch().ok()?;
    let list = plan.env.get("CUDA_VISIBLE_DEVICES")?;
    list.split(',').map(|s| s.trim().parse().ok()).collect()
}

/// Read the history of `gpus` over `[from, to)` through `window` (the daemon's store or its
/// `History` request); a GPU with no points at all is left out.
pub fn gather_history<E>(
    gpus: &[u32],
    from: f64,
    to: f64,
    mut window: impl FnMut(u32, Metric, f64, f64, u32) -> Result<Vec<Point>, E>,
) -> Result<Vec<GpuSeries>, E> {
    let mut out = Vec::new();
    for &gpu in gpus {
        let mut series = Vec::new();
        for metric in GPU_METRICS {
            let points = window(gpu, metric, from, to, MAX_POINTS as u32)?;
            if !points.is_empty() {
                series.push((metric, points));
            }
        }
        if !series.is_empty() {
            out.push(GpuSeries { gpu, series });
        }
    }
    Ok(out)
}

/// Most records read from one JSON-lines file: a report from each of 8 ranks every second for
/// a week is 4.8 million.
pub const MAX_RECORDS: usize = 5_000_000;

/// What a JSON-lines file held, as far as it was read.
#[derive(Debug)]
pub struct Jsonl<T> {
    /// The lines that parse, in order.
    pub records: Vec<T>,
    /// Lines that did not: not JSON of a record, not text, or longer than
    /// [`MAX_METRICS_LINE`].
    pub unreadable: usize,
    /// Reading stopped at [`MAX_RECORDS`]: what follows was not read.
    pub cut: bool,
}

impl<T> Jsonl<T> {
    /// What `missing` says of the file `name`, if anything.
    fn missing(&self, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.unreadable > 0 {
            out.push(format!(
                "{name}: {} line(s) could not be read and were skipped",
                self.unreadable
            ));
        }
        if self.cut {
            out.push(format!(
                "{name}: only its first {MAX_RECORDS} records were read; the rest is left out"
            ));
        }
        out
    }
}

/// Every line of a JSON-lines file that parses, up to [`MAX_RECORDS`], and how many did not.
/// A missing file is empty. Lines are read bounded, since the run can write these files too.
pub fn read_jsonl<T: DeserializeOwned>(path: &Path) -> io::Result<Jsonl<T>> {
    read_jsonl_where(path, |_| true)
}

/// [`read_jsonl`], keeping only the records `keep` accepts (the others count toward nothing).
pub fn read_jsonl_where<T: DeserializeOwned>(
    path: &Path,
    keep: impl FnMut(&T) -> bool,
) -> io::Result<Jsonl<T>> {
    read_at_most(path, MAX_RECORDS, keep)
}

fn read_at_most<T: DeserializeOwned>(
    path: &Path,
    max: usize,
    mut keep: impl FnMut(&T) -> bool,
) -> io::Result<Jsonl<T>> {
    let mut out = Jsonl {
        records: Vec::new(),
        unreadable: 0,
        cut: false,
    };
    // Never through a link, and no FIFO waited on.
    let f = match safe_fs::open_regular(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    safe_fs::visit_lines(BufReader::new(f), MAX_METRICS_LINE, |line| {
        match line {
            Some(l) if l.iter().all(u8::is_ascii_whitespace) => {}
            Some(l) => match serde_json::from_slice(l) {
                Ok(v) if !keep(&v) => {}
                Ok(_) if out.records.len() == max => {
                    out.cut = true;
                    return ControlFlow::Break(());
                }
                Ok(v) => out.records.push(v),
                Err(_) => out.unreadable += 1,
            },
            None => out.unreadable += 1,
        }
        ControlFlow::Continue(())
    })?;
    Ok(out)
}

/// Gather a run's report.
pub fn gather(dir: &RunDir, src: Sources<'_>) -> Result<Report, ReportError> {
    let now_s = src.now_s.unwrap_or_else(system_now_s);
    let mut summary = dir
        .read_summary()?
        .ok_or_else(|| ReportError::NoSummary(dir.path().display().to_string()))?;
    let live = !summary.status.is_final();
    let mut missing = Vec::new();
    // A live run's summary is written at changes only; the daemon's figure is newer.
    if let Some(e) = src.info.and_then(|i| i.energy.clone()) {
        if live || summary.energy.is_none() {
            summary.energy_j = Some(e.energy_j);
            summary.samples = e.samples;
            summary.energy = Some(e);
        }
    }
    let energy = summary.energy.clone();
    if energy.is_none() {
        missing.push("energy: not measured for this run (no GPU telemetry while it ran)".into());
    }
    let (start_s, end_s) = span(&summary, now_s);
    let command = match dir.read_launch() {
        Ok(plan) => plan.argv,
        Err(_) => {
            missing.push("launch.json: unreadable, the command is not shown".into());
            Vec::new()
        }
    };
    let gpus = run_gpus(dir, energy.as_ref());

    let metrics = read_jsonl::<MetricsPoint>(&dir.path().join("metrics.jsonl"))?;
    let events = read_jsonl::<EventRecord>(&dir.events_path())?;
    let unreadable = Unreadable {
        metrics: metrics.unreadable,
        events: events.unreadable,
    };
    missing.extend(metrics.missing("metrics.jsonl"));
    missing.extend(events.missing("events.jsonl"));
    let (points, events) = (metrics.records, events.records);
    if points.is_empty() {
        missing.push("training metrics: the run reported none (metrics.jsonl is empty)".into());
    }

    let throughput = throughput(&points, &summary);
    let mut time_lost = TimeLost {
        data_wait_share: data_wait_share(&points),
        throttled: Vec::new(),
        straggler: straggler(&points),
    };
    let environment = match environment::read(dir.path()) {
        Ok(Some(env)) => Some(env),
        Ok(None) => {
            missing.push(format!(
                "environment: not recorded for this run (the daemon writes {} when it starts a \
                 run)",
                environment::FILE_NAME
            ));
            None
        }
        Err(e) => {
            missing.push(format!("environment: {}: {e}", environment::FILE_NAME));
            None
        }
    };
    let gpu_history = match src.history {
        Some(Ok(h)) if !h.is_empty() => Some(h),
        Some(Ok(_)) => {
            missing.push("GPU charts: the daemon's history has no samples of the run's GPUs over its span (kept at lower resolution as it ages, and lost when the daemon restarts)".into());
            None
        }
        Some(Err(why)) => {
            missing.push(format!("GPU charts: {why}"));
            None
        }
        None => {
            missing.push(
                "GPU charts: no daemon answered, so there is no GPU history for the run".into(),
            );
            None
        }
    };
    if let Some(h) = &gpu_history {
        time_lost.throttled = throttled(h, end_s - start_s);
    }

    let mut markers = run_markers(&events);
    if let Some(log) = src.node_log {
        // The node's log grows for as long as the node runs: only the run's span is kept.
        let during = |rec: &NodeEventRecord| {
            unix_s(&rec.time).is_some_and(|t| (start_s..=end_s).contains(&t))
        };
        match read_jsonl_where::<NodeEventRecord>(log, during) {
            Ok(node) => {
                // Lines of other kinds of events (a newer daemon's) are no loss here.
                if node.cut {
                    missing.push(format!(
                        "cap changes: {}: more than {MAX_RECORDS} records over the run's span; \
                         the rest is left out",
                        log.display()
                    ));
                }
                let node = node.records;
                let (caps, governor): (Vec<Marker>, Vec<Marker>) =
                    cap_markers(&node, gpus.as_deref(), start_s, end_s)
                        .into_iter()
                        .partition(|m| m.kind != MarkerKind::Governor);
                markers.extend(caps);
                if governor.len() > MAX_GOVERNOR_MARKERS {
                    missing.push(format!(
                        "governor: {} cap steps during the run, {MAX_GOVERNOR_MARKERS} of them \
                         (evenly spread) drawn as markers",
                        governor.len()
                    ));
                }
                markers.extend(thin(governor, MAX_GOVERNOR_MARKERS));
            }
            Err(e) => missing.push(format!("cap changes: {}: {e}", log.display())),
        }
    }
    markers.sort_by(|a, b| a.t.total_cmp(&b.t));

    // A run directory from before profiles were kept has none: its knobs are unbounded.
    let knobs = match crate::profile::Loader::new().load(&dir.profile_path()) {
        Ok(p) => Some(p.knobs),
        Err(_) if !dir.profile_path().exists() => None,
        Err(e) => {
            missing.push(format!(
                "advice: the run's profile could not be read ({e}); knob ranges unknown"
            ));
            None
        }
    };
    let tuned = read_tuner_choice(dir, &summary.id, gpus.as_deref().unwrap_or_default());
    let advice = super::advice::whole_run(&super::advice::RunRecord {
        run: &summary.id,
        gpus: gpus.as_deref(),
        history: gpu_history.as_deref(),
        environment: environment.as_ref(),
        points: &points,
        knobs: knobs.as_ref(),
        end_s,
        span_s: end_s - start_s,
        tuned,
    });

    Ok(Report {
        generated_at: rfc3339(UNIX_EPOCH + std::time::Duration::from_secs_f64(now_s.max(0.0))),
        live,
        command,
        gpus,
        start_s,
        end_s,
        throughput,
        energy,
        time_lost,
        ranks: by_rank(points),
        gpu_history,
        markers,
        events,
        environment,
        advice,
        unreadable,
        missing,
        summary,
    })
}

/// What a finished energy search on the run chose, from its result file in the run's
/// directory (read within a bound, never through a link).
fn read_tuner_choice(
    dir: &RunDir,
    run: &str,
    gpus: &[u32],
) -> Option<crate::control::owner::TunerChoice> {
    let path = dir.path().join(crate::control::tuner::session::RESULT_FILE);
    let f = safe_fs::open_regular(&path).ok()?;
    let written_s = f
        .metadata()
        .ok()?
        .modified()
        .ok()?
        .duration_since(UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    let mut text = String::new();
    io::Read::read_to_string(&mut io::Read::take(f, 1 << 20), &mut text).ok()?;
    super::advice::tuner_choice(run, gpus, &text, written_s)
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values
        .filter(|v| v.is_finite())
        .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// The run's throughput over its span, a job's over all its ranks (`training::JobTally`):
/// the samples the energy accounting counted (the same count, from the same reports), or
/// counted here where it has none; their mean rate over the span of the reports; the mean of
/// the job's step time (its slowest rank's at each report).
fn throughput(points: &[MetricsPoint], summary: &Summary) -> Throughput {
    let mut tally = JobTally::whole_run();
    tally.absorb_all(points);
    let job = job_points(points);
    Throughput {
        steps: points.iter().filter_map(|p| p.report.step).max(),
        samples: summary.samples.or(tally.count()),
        mean_samples_per_s: tally.mean_samples_per_s(),
        mean_step_time_s: mean(job.iter().filter_map(|p| p.report.step_time_s)),
        reports: points.len(),
    }
}

fn data_wait_share(points: &[MetricsPoint]) -> Option<f64> {
    let (wait, step) = points
        .iter()
        .filter_map(|p| Some((p.report.data_wait_s?, p.report.step_time_s?)))
        .fold((0.0, 0.0), |(w, s), (dw, st)| (w + dw, s + st));
    (step > 0.0).then(|| (wait / step).clamp(0.0, 1.0))
}

/// The median of `v` (not empty), sorted in place.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The wait for the slowest rank (see [`Straggler`]); None for a run of one rank, or when no
/// step was covered by two ranks' reports with a step time.
///
/// Ranks report on their own clocks, so two ranks seldom report the same step: a report
/// stands for the steps since the rank's previous one, `(previous, step]`, at its mean step
/// time (a rank's first report for its own step only). Ranks are compared over every range
/// of steps two or more of them cover, weighted by its length. A step reported again (after
/// a restart) counts with the rank's last report of it.
pub fn straggler(points: &[MetricsPoint]) -> Option<Straggler> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut by_rank: BTreeMap<u32, BTreeMap<u64, f64>> = BTreeMap::new();
    for p in points {
        let (Some(rank), Some(step), Some(t)) = (p.rank, p.report.step, p.report.step_time_s)
        else {
            continue;
        };
        if t.is_finite() && t >= 0.0 {
            // One up, so that the step before step 0 is a step too.
            by_rank
                .entry(rank)
                .or_default()
                .insert(step.saturating_add(1), t);
        }
    }
    if by_rank.len() < 2 {
        return None;
    }
    // Every range's upper end is some rank's reported step.
    let ends: BTreeSet<u64> = by_rank.values().flat_map(|s| s.keys().copied()).collect();
    let (mut wait, mut total, mut compared) = (0.0, 0.0, 0u64);
    let mut slowest: BTreeMap<u32, u64> = BTreeMap::new();
    let mut times: Vec<(u32, f64)> = Vec::with_capacity(by_rank.len());
    let mut all: Vec<f64> = Vec::with_capacity(by_rank.len());
    let mut lower: Option<u64> = None;
    for &end in &ends {
        // The range (lower, end]; the first is one step long.
        let width = end - lower.unwrap_or(end - 1);
        lower = Some(end);
        times.clear();
        for (&rank, steps) in &by_rank {
            // The rank's report that covers `end`: its first at or after it, whose range
            // starts below it.
            let Some((&step, &t)) = steps.range(end..).next() else {
                continue;
            };
            let start = match steps.range(..step).next_back() {
                Some((&before, _)) => before,
                None => step - 1,
            };
            if start < end {
                times.push((rank, t));
            }
        }
        if times.len() < 2 {
            continue;
        }
        let &(rank, max) = times
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
            .expect("two ranks or more");
        all.clear();
        all.extend(times.iter().map(|(_, t)| *t));
        let w = width as f64;
        wait += (max - median(&mut all)) * w;
        total += max * w;
        compared += width;
        *slowest.entry(rank).or_default() += width;
    }
    let (&slowest_rank, &slowest_steps) = slowest
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))?;
    Some(Straggler {
        wait_s: wait,
        share: if total > 0.0 {
            (wait / total).clamp(0.0, 1.0)
        } else {
            0.0
        },
        steps: compared as usize,
        ranks: by_rank.len(),
        slowest_rank,
        slowest_steps: slowest_steps as usize,
    })
}

/// A throttle series' points are shares of their span (0..1): their mean over the run, times
/// the run's length, is the time held down.
fn throttled(history: &[GpuSeries], span_s: f64) -> Vec<Throttled> {
    let share = |g: &GpuSeries, m| g.get(m).and_then(|p| mean(p.iter().map(|p| p.mean)));
    history
        .iter()
        .map(|g| Throttled {
            gpu: g.gpu,
            power_s: share(g, Metric::PowerLimited).map(|s| s * span_s),
            thermal_s: share(g, Metric::ThermalLimited).map(|s| s * span_s),
        })
        .filter(|t| t.power_s.is_some() || t.thermal_s.is_some())
        .collect()
}

/// Each rank's points in order, thinned evenly to [`MAX_POINTS`].
fn by_rank(points: Vec<MetricsPoint>) -> Vec<RankSeries> {
    let mut ranks: Vec<RankSeries> = Vec::new();
    for p in points {
        match ranks.iter_mut().find(|r| r.rank == p.rank) {
            Some(r) => r.points.push(p),
            None => ranks.push(RankSeries {
                rank: p.rank,
                points: vec![p],
            }),
        }
    }
    ranks.sort_by_key(|r| r.rank);
    for r in &mut ranks {
        r.points = thin(std::mem::take(&mut r.points), MAX_POINTS);
    }
    ranks
}

/// At most `max` of `items`, evenly spaced, the first and the last kept.
pub fn thin<T>(items: Vec<T>, max: usize) -> Vec<T> {
    let n = items.len();
    if n <= max || max < 2 {
        return items;
    }
    let step = (n - 1) as f64 / (max - 1) as f64;
    let mut keep = (0..max)
        .map(|i| (i as f64 * step).round() as usize)
        .peekable();
    items
        .into_iter()
        .enumerate()
        .filter_map(|(i, v)| {
            (keep.peek() == Some(&i)).then(|| {
                while keep.peek() == Some(&i) {
                    keep.next();
                }
                v
            })
        })
        .collect()
}

fn run_markers(events: &[EventRecord]) -> Vec<Marker> {
    events
        .iter()
        .filter_map(|rec| {
            let t = unix_s(&rec.time)?;
            let (kind, label) = match &rec.event {
                Event::Restarted { attempt, .. } => {
                    (MarkerKind::Restart, format!("restart (attempt {attempt})"))
                }
                // `run … → started`: the start itself, not a change during the run.
                Event::Changed { what, .. } if what == "run" => return None,
                Event::Changed { what, old, new, .. } if what == "status" => (
                    MarkerKind::Stop,
                    format!("{} → {}", or_dash(old), or_dash(new)),
                ),
                Event::Changed { what, old, new, .. } => (
                    MarkerKind::Knob,
                    format!("{what} {} → {}", or_dash(old), or_dash(new)),
                ),
                _ => return None,
            };
            Some(Marker { t, kind, label })
        })
        .collect()
}

fn or_dash(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("–")
}

/// Power-cap changes of the run's GPUs (all GPUs when unknown) within its span.
fn cap_markers(
    node: &[NodeEventRecord],
    gpus: Option<&[u32]>,
    start_s: f64,
    end_s: f64,
) -> Vec<Marker> {
    let ours = |g: &u32| gpus.is_none_or(|list| list.contains(g));
    node.iter()
        .filter_map(|rec| {
            let t = unix_s(&rec.time).filter(|t| (start_s..=end_s).contains(t))?;
            let label = match &rec.event {
                NodeEvent::GpuChanged {
                    gpu,
                    what,
                    old,
                    new,
                    ..
                } if ours(gpu) && what.contains("power") => {
                    format!("GPU {gpu} {what} {} → {}", or_dash(old), or_dash(new))
                }
                NodeEvent::Governor {
                    gpu,
                    change,
                    old_w,
                    new_w,
                    ..
                } if ours(gpu) && change == "cap" => format!(
                    "GPU {gpu} governor cap {} → {} W",
                    old_w.map_or("–".into(), |w| format!("{w:.0}")),
                    new_w.map_or("–".into(), |w| format!("{w:.0}"))
                ),
                NodeEvent::Budget { caps, .. } if !caps.is_empty() => "budget moved caps".into(),
                _ => return None,
            };
            let kind = if matches!(rec.event, NodeEvent::Governor { .. }) {
                MarkerKind::Governor
            } else {
                MarkerKind::Cap
            };
            Some(Marker { t, kind, label })
        })
        .collect()
}

#[cfg(test)]
mod tests;
