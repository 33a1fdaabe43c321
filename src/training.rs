//! What a run's training side says and is asked: the knobs a trainer may change, its metrics
//! reports, its ranks and the job's figures (see "The trainer channel" in docs/protocol.md).
//!
//! Domain values, below the protocol: the daemon's rank tables, the tuner's job scoring and
//! the advisor read them; `protocol` carries them on the wire (and re-exports them).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod job;

pub use job::{JobSeries, JobTally, STALE_RANK_S, job_points};

/// A knob a trainer may be asked to change while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KnobName {
    BatchSize,
    Prefetch,
}

impl KnobName {
    pub const ALL: [KnobName; 2] = [KnobName::BatchSize, KnobName::Prefetch];

    /// The wire and profile name: `batch_size`, `prefetch`.
    pub fn as_str(self) -> &'static str {
        match self {
            KnobName::BatchSize => "batch_size",
            KnobName::Prefetch => "prefetch",
        }
    }

    /// The command-line spelling: `batch-size`, `prefetch`.
    pub fn cli_name(self) -> &'static str {
        match self {
            KnobName::BatchSize => "batch-size",
            KnobName::Prefetch => "prefetch",
        }
    }

    pub fn parse(s: &str) -> Option<KnobName> {
        match s {
            "batch_size" | "batch-size" | "batch" => Some(KnobName::BatchSize),
            "prefetch" | "prefetch_factor" | "prefetch-depth" => Some(KnobName::Prefetch),
            _ => None,
        }
    }
}

impl std::fmt::Display for KnobName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An inclusive range a trainer declares for a knob the profile does not bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnobRange {
    pub min: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<i64>,
}

impl KnobRange {
    pub fn allows(&self, v: i64) -> bool {
        v >= self.min && self.max.is_none_or(|m| v <= m)
    }
}

impl std::fmt::Display for KnobRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.max {
            Some(max) => write!(f, "{}..={max}", self.min),
            None => write!(f, "{}.. (no upper bound)", self.min),
        }
    }
}

/// One metrics report from a trainer (every field optional), as sent and as kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsReport {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_time_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_wait_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<i64>,
    /// Samples trained so far, counted by the trainer (its own, or the job's where `scope` is
    /// `job`). Where it is given it is the count; otherwise steps times the batch size, or
    /// samples/s over time, are counted (see [`JobTally`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Whose figures these are: this rank's own (absent, `rank`) or already the whole job's
    /// (`job`: a framework that logs global throughput on rank 0). Job figures are never
    /// summed over ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<ReportScope>,
    /// How many steps past the next one the trainer's data pipeline has formed its batches
    /// already (a loader that fetches ahead): a change to several ranks is proposed for a step
    /// beyond them, since a formed batch keeps its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lead_steps: Option<u64>,
    /// Any other named scalars (learning rate, accuracy, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, f64>,
}

/// Whose figures a report gives: see [`MetricsReport::scope`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportScope {
    /// The sending rank's own figures: the job's are the sum over ranks.
    #[default]
    Rank,
    /// Already the whole job's figures.
    Job,
}

impl MetricsReport {
    /// The report gives the whole job's figures.
    pub fn is_job_wide(&self) -> bool {
        self.scope == Some(ReportScope::Job)
    }

    /// Nothing in it (a parsed line that matched no pattern).
    pub fn is_empty(&self) -> bool {
        *self == MetricsReport::default()
    }
}

/// A report as the daemon keeps it: stamped with the daemon's time and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsPoint {
    /// Index in the run's `metrics.jsonl` (0-based); ask `run_metrics` with `since` = last + 1.
    pub n: u64,
    /// Unix seconds when the daemon received it.
    pub t: f64,
    /// `trainer` (the SDK) or `stdout` (parsed from the run's output).
    pub from: String,
    /// The rank that sent it, where the trainer said which rank it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(flatten)]
    pub report: MetricsReport,
}

/// The longest line of a `metrics.jsonl` that readers keep. A report reaches the daemon in one
/// request frame of at most 1 MiB (`protocol::MAX_REQUEST_FRAME`), so a line the daemon wrote
/// is no longer; a longer one was written by something else and is passed over.
pub const MAX_METRICS_LINE: usize = 1 << 20;

/// How a knob change reaches the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KnobVia {
    /// Pushed to the attached trainer, which acknowledges it.
    Trainer,
    /// The run is restarted with the new value in its command line.
    Restart,
}

/// Where one knob of a run stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KnobState {
    pub knob: KnobName,
    /// The value the run uses now, as far as the daemon knows.
    pub value: Option<i64>,
    /// A change asked and not yet acknowledged.
    pub pending: Option<i64>,
    /// The allowed range (the profile's, else the trainer's), if any.
    pub range: Option<KnobRange>,
    /// The last change's round trip, milliseconds (asked → acknowledged).
    pub last_rtt_ms: Option<f64>,
    /// The last change's outcome in words: `applied`, `rejected: …`, `restarted`.
    pub last_outcome: Option<String>,
}

/// Who a trainer connection is within its run: the rank of a distributed (data-parallel) job,
/// as `trainer_attach` says it. A script that says nothing is rank 0 of a world of 1.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankSpec {
    /// The global rank (`RANK`), 0-based.
    pub rank: u32,
    /// How many ranks the job has (`WORLD_SIZE`).
    pub world_size: u32,
    /// The rank on its node (`LOCAL_RANK`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    /// The host it runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The physical index of the GPU it trains on (as NVML numbers it, not as
    /// `CUDA_VISIBLE_DEVICES` renumbers it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
}

/// One rank of a run as the daemon knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankInfo {
    #[serde(flatten)]
    pub spec: RankSpec,
    /// Connected over the trainer channel now.
    pub attached: bool,
    #[serde(default)]
    pub pid: Option<u32>,
    /// This rank's newest report.
    #[serde(default)]
    pub last: Option<MetricsPoint>,
    /// Its steps per second over its last reports, when it reported at least two steps.
    #[serde(default)]
    pub steps_per_s: Option<f64>,
}

/// The job's figures over its ranks' newest reports: what a data-parallel job does as a whole.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobFigures {
    /// Ranks with a report.
    pub reporting: u32,
    /// The lowest step any rank reported last (the job is as far as its slowest rank).
    pub step: Option<u64>,
    /// Samples per second, summed over the ranks.
    pub samples_per_s: Option<f64>,
    /// The slowest rank's step time (every rank waits for it at the gradient sync).
    pub step_time_s: Option<f64>,
    /// The slowest rank's, and which rank that is.
    pub slowest_rank: Option<u32>,
    /// The longest data wait of any rank.
    pub data_wait_s: Option<f64>,
    /// Rank 0's loss (every rank of a data-parallel job trains the same model); the lowest
    /// reporting rank's while rank 0 has none.
    pub loss: Option<f64>,
    /// Tokens per second (a report's `tokens_per_s`), summed over the ranks like samples/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
}

impl JobFigures {
    /// The job's figures from each rank's newest report (`rank`, report): samples/s and
    /// tokens/s summed over the ranks, unless a report gives the whole job's (its `scope` is
    /// `job`): then that one is the job's and nothing is added to it; the lowest step; the
    /// slowest rank's step time; the longest data wait; rank 0's loss. This is the one place
    /// a job's live figures are made: `ps`, the console, `/metrics`, the tuner and the advisor
    /// read them from here.
    pub fn of<'a>(
        reports: impl IntoIterator<Item = (u32, &'a MetricsReport)>,
    ) -> Option<JobFigures> {
        let mut reports: Vec<(u32, &MetricsReport)> = reports.into_iter().collect();
        if reports.is_empty() {
            return None;
        }
        reports.sort_by_key(|(n, _)| *n);
        let total = |f: &dyn Fn(&MetricsReport) -> Option<f64>| {
            let wide = reports
                .iter()
                .filter(|(_, r)| r.is_job_wide())
                .filter_map(|(_, r)| f(r))
                .reduce(f64::max);
            wide.or_else(|| {
                let v: Vec<f64> = reports.iter().filter_map(|(_, r)| f(r)).collect();
                (!v.is_empty()).then(|| v.iter().sum())
            })
        };
        let slowest = reports
            .iter()
            .filter_map(|(n, r)| Some((*n, r.step_time_s?)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        Some(JobFigures {
            reporting: reports.len() as u32,
            step: reports.iter().filter_map(|(_, r)| r.step).min(),
            samples_per_s: total(&|r| r.samples_per_s),
            step_time_s: slowest.map(|s| s.1),
            slowest_rank: slowest.map(|s| s.0),
            data_wait_s: reports
                .iter()
                .filter_map(|(_, r)| r.data_wait_s)
                .max_by(f64::total_cmp),
            loss: reports.iter().find_map(|(_, r)| r.loss),
            tokens_per_s: total(&|r| r.extra.get("tokens_per_s").copied()),
        })
    }

    /// One report taken as the whole run's figures (a run of one process, or a script whose
    /// output is read for metrics).
    pub fn of_one(report: &MetricsReport) -> JobFigures {
        let mut f = JobFigures::of([(0, report)]).unwrap_or_default();
        f.slowest_rank = None;
        f
    }
}

/// A knob change to a run of several ranks, in flight: proposed for `apply_step`, voted on by
/// every rank, then committed or called off (docs/protocol.md, "Distributed runs").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagedChange {
    pub seq: u64,
    pub knob: KnobName,
    pub value: i64,
    pub apply_step: u64,
    /// The ranks it was proposed to.
    pub ranks: Vec<u32>,
    /// The ranks that agreed so far.
    pub ready: Vec<u32>,
    /// `None` while votes are outstanding; then committed (`true`) or called off.
    pub committed: Option<bool>,
    /// The ranks that applied it at `apply_step` so far.
    pub applied: Vec<u32>,
}

/// A run's trainer side as `runs` and the console show it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerInfo {
    /// A trainer is attached over the channel now (any rank).
    pub attached: bool,
    /// Rank 0's process (the only one of a single-process run).
    pub pid: Option<u32>,
    /// The newest report (of any rank).
    pub last: Option<MetricsPoint>,
    pub knobs: Vec<KnobState>,
    /// The job's world size, once a rank said it (1 for a single-process script).
    #[serde(default)]
    pub world_size: Option<u32>,
    /// Every rank that attached, by rank.
    #[serde(default)]
    pub ranks: Vec<RankInfo>,
    /// The job's figures over its ranks.
    #[serde(default)]
    pub job: Option<JobFigures>,
    /// A change to several ranks in flight.
    #[serde(default)]
    pub staged: Option<StagedChange>,
    /// The training framework whose log lines the run's output is read as (`transformers`,
    /// `lightning`, `torchtitan`), once a line was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_preset: Option<String>,
}

impl TrainerInfo {
    /// The run's figures as every output shows them: the job's over its ranks, else its
    /// newest report's (a run of one process, or one whose output is read for metrics).
    pub fn figures(&self) -> Option<JobFigures> {
        self.job
            .clone()
            .or_else(|| self.last.as_ref().map(|p| JobFigures::of_one(&p.report)))
    }
}
