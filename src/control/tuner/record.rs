//! A search as a job of the daemon ([`TuneJob`]): what it tunes, the caps to put back, how far
//! it got. The daemon keeps one per run under `$STATE/tune/`, rewritten at every step, so a
//! daemon that restarts (even after SIGKILL) finds the caps to restore and the caps already
//! measured; clients see the same record in `tune_status`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CapPoint, Progress, TuneResult, TuneSettings};

/// The most a job's record may weigh on disk: a curve of a few dozen caps is a few KiB.
pub const MAX_RECORD_BYTES: u64 = 256 * 1024;

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Preparing or searching.
    Running,
    /// The daemon stopped while it searched; the starting caps were put back, and the next
    /// daemon resumes it if the run still trains.
    Suspended,
    /// Finished: the best cap is set.
    Done,
    /// Stopped before the end (`tune stop`, the run ended, a refused cap); the starting caps
    /// are back unless `restored` says otherwise.
    Cancelled,
    /// It could not start (nothing was changed).
    Failed,
}

impl JobState {
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Done | JobState::Cancelled | JobState::Failed
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Suspended => "suspended",
            JobState::Done => "done",
            JobState::Cancelled => "cancelled",
            JobState::Failed => "failed",
        }
    }
}

/// A tuning job of the daemon. See the module doc.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneJob {
    /// `tune-<run id>`: one job per run at a time.
    pub id: String,
    pub run: String,
    /// The run's profile name: a later search on a run of the same profile starts from this
    /// one's result.
    #[serde(default)]
    pub name: String,
    /// What is tuned, for people (`run r1 on GPU 0,1`, or a job's ranks together).
    #[serde(default)]
    pub what: String,
    /// The GPUs whose caps move together.
    #[serde(default)]
    pub gpus: Vec<u32>,
    /// Each GPU's cap before the search, (GPU, watts): what a stop puts back. A list, not a
    /// map: a map's integer keys do not survive the protocol's tagged frames.
    #[serde(default)]
    pub start_w: Vec<(u32, f64)>,
    pub settings: TuneSettings,
    pub state: JobState,
    /// When it started (RFC 3339).
    pub started: String,
    /// Where the search stands (the caps measured so far are in its curve).
    #[serde(default)]
    pub progress: Option<Progress>,
    /// The result, once done.
    #[serde(default)]
    pub result: Option<TuneResult>,
    /// Why it ended or was suspended, in words.
    #[serde(default)]
    pub why: Option<String>,
    /// Whether the starting caps came back after a stop (`Err`: why not).
    #[serde(default)]
    pub restored: Option<Result<(), String>>,
    /// How many times a daemon resumed it after a restart.
    #[serde(default)]
    pub resumed: u32,
    /// Where the result was written (the run's `tune-energy.json`), or why it was not.
    #[serde(default)]
    pub saved: Option<Result<String, String>>,
}

impl TuneJob {
    /// The job id of a search on run `run`.
    pub fn id_for(run: &str) -> String {
        format!("tune-{run}")
    }

    /// Each GPU's cap before the search, by GPU.
    pub fn start_caps(&self) -> BTreeMap<u32, f64> {
        self.start_w.iter().copied().collect()
    }

    /// The caps measured so far.
    pub fn measured(&self) -> &[CapPoint] {
        self.progress.as_ref().map_or(&[], |p| p.curve.as_slice())
    }
}
