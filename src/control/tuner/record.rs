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
    /// A joint search (`--with batch-size`): the batch the run trained at before it, which a
    /// stop (or a daemon that finds the job unfinished) puts back with the caps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_batch: Option<u32>,
    /// A clock search (`--knob clocks|both`): the GPUs whose SM clocks were locked before it,
    /// and their locks (the others were unlocked). What a stop puts back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub start_locks: Vec<(u32, [u32; 2])>,
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

/// What the best cap saves against the default one over a million samples: energy, time and,
/// with a price in `control.toml` (`[energy] price_per_kwh`), money.
pub fn saving_line(
    r: &TuneResult,
    price: Option<&crate::control::energy::Price>,
) -> Option<String> {
    let d = r.default?;
    let per_million = 1e6;
    let kwh = (d.energy_per_sample_j - r.best.energy_per_sample_j) * per_million / 3.6e6;
    let hours = (r.best.time_per_sample_s - d.time_per_sample_s) * per_million / 3600.0;
    let (at, instead) = match (&r.batch, r.best.batch, d.batch) {
        (Some(_), Some(b), Some(db)) => (
            format!("{:.0} W and batch {b}", r.best.cap_w),
            format!("{:.0} W and batch {db}", d.cap_w),
        ),
        _ => (r.knob.show(r.best.cap_w), r.knob.show(d.cap_w)),
    };
    let mut s = format!(
        "per million samples at {at} instead of {instead}: {:.2} kWh {}, {:.2} h {}",
        kwh.abs(),
        if kwh >= 0.0 { "less" } else { "more" },
        hours.abs(),
        if hours >= 0.0 { "more" } else { "less" }
    );
    if let Some(p) = price {
        s.push_str(&format!(
            ", {:.2} {} {}",
            (kwh * p.per_kwh).abs(),
            p.currency,
            if kwh >= 0.0 { "saved" } else { "spent" }
        ));
    }
    Some(s)
}

/// The profile lines that start a run where the search ended: `[power] cap_w`, and after a
/// joint search `[knobs.batch_size] initial`.
pub fn suggestion(r: &TuneResult) -> String {
    if r.knob == super::Knob::Clocks {
        return if r.best.cap_w >= r.default_w - 0.5 {
            "the SM clocks are best unlocked: nothing to add".into()
        } else {
            format!(
                "to lock the run's SM clocks there again: `gpupilot clocks lock MIN {:.0} --gpu …`, \
                 MIN the GPUs' lowest clock (`gpupilot power` shows it; profiles set the power cap \
                 only)",
                r.best.cap_w
            )
        };
    }
    let mut s = format!(
        "to start this run's profile at this {}, add:\n\n[power]\ncap_w = {:.0}",
        if r.batch.is_some() {
            "cap and batch size"
        } else {
            "cap"
        },
        r.best.cap_w
    );
    if let Some(b) = &r.batch {
        s.push_str(&format!("\n\n[knobs.batch_size]\ninitial = {}", b.best));
    }
    s
}
