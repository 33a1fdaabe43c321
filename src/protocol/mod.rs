//! The daemon protocol: what the TUI and the CLI say to `gpupilot daemon` over its Unix socket,
//! and what it answers. Specified for people in `docs/protocol.md`; this module is the truth.
//!
//! Framing is newline-delimited JSON: one object a line, UTF-8. A client sends
//! [`ClientFrame`]s (`{"id":7,"type":"runs"}`), the daemon sends [`ServerFrame`]s: answers carry
//! the id of the request they answer, pushed updates (telemetry, events) carry none, so answers
//! and updates interleave on one connection. The first request must be
//! [`Request::Hello`]; the daemon answers [`Response::Welcome`] or a `version_mismatch` error
//! and closes.
//!
//! A frame from a client longer than [`MAX_REQUEST_FRAME`] bytes, or one that is not valid JSON
//! for a request, closes that connection (after one `bad_frame` error naming why); other
//! clients are not affected. Unknown fields are ignored, so a newer client may send more.
//!
//! This module only defines messages and their encoding; it does no I/O.

pub mod bounds;
mod control;
pub mod delta;
pub mod event_words;
mod types;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::training::{
    JobFigures, KnobName, KnobRange, KnobState, KnobVia, MetricsPoint, MetricsReport, RankInfo,
    RankSpec, StagedChange, TrainerInfo,
};
pub use control::{GpuChange, GpuSettings, TargetGpus};
pub use types::{
    DaemonInfo, LogStream, NodeEvent, NodeEventRecord, RunCounts, RunInfo, RunSignal, StatusReply,
    TelemetryInfo,
};

use crate::history::{Metric, Point};
use crate::profile::Profile;
use crate::supervisor::{Caller, EventRecord, KnobValues};
use crate::telemetry::Snapshot;

/// The protocol version this build speaks. Bumped on any change an older peer would misread.
pub const VERSION: u32 = 1;

/// The longest frame a client may send (bytes, newline excluded): 1 MiB.
pub const MAX_REQUEST_FRAME: usize = 1 << 20;

/// The longest frame a client accepts from the daemon: 16 MiB. The daemon keeps its answers
/// far below it (a run list of thousands of runs, a full snapshot of 64 GPUs).
pub const MAX_REPLY_FRAME: usize = 16 << 20;

/// The most log bytes one `logs` answer carries: even escaped 6× as JSON it stays under a MiB.
pub const MAX_LOG_CHUNK: u64 = 128 * 1024;

/// The most points one `history` answer carries.
pub const MAX_HISTORY_POINTS: u32 = 4096;

/// The most events one `events` or `run_events` answer carries.
pub const MAX_EVENTS: u32 = 1000;

/// One request, with the id its answer will carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientFrame {
    /// Chosen by the client; echoed in the answer. Unique among its requests in flight.
    pub id: u64,
    #[serde(flatten)]
    pub request: Request,
}

/// One frame from the daemon: an answer (with the request's id) or a pushed update (no id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerFrame {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    #[serde(flatten)]
    pub response: Response,
}

/// What a client may ask. Tagged by `"type"`, snake_case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// The handshake, first on every connection.
    Hello {
        version: u32,
        /// Who is asking, for the daemon's log: `gpupilot-cli 0.1.0`.
        client: String,
    },
    /// The daemon, its telemetry and the newest snapshot.
    Status {},
    /// Start (or, with false, stop) pushing telemetry snapshots and node events. With `delta`,
    /// snapshots after the first come as their changes ([`delta`]). With `dedicated` (telemetry
    /// alone), the client sends nothing more on this connection: the daemon may stop reading it
    /// and write each snapshot from the thread that takes it (docs/protocol.md).
    Subscribe {
        #[serde(default)]
        telemetry: bool,
        #[serde(default)]
        events: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        delta: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        dedicated: bool,
    },
    /// At most `max_points` points of one GPU's series over `[from, to)` (Unix seconds).
    History {
        gpu: u32,
        metric: Metric,
        from: f64,
        to: f64,
        max_points: u32,
    },
    /// Every run the daemon knows, oldest first; or, with `run`, just the run it names (an id,
    /// a unique id prefix, a run name, or `last`); with `live`, only the runs that have not
    /// ended (an older daemon ignores it and answers every run).
    Runs {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        live: bool,
    },
    /// Start a run: the profile resolved by the client (`extends` followed, paths absolute),
    /// started with the caller's working directory and environment.
    RunStart {
        profile: Box<Profile>,
        caller: Caller,
        #[serde(default)]
        knobs: KnobValues,
        /// Why, in the caller's words (recorded in the event logs).
        #[serde(default)]
        why: Option<String>,
    },
    /// Stop a run: SIGTERM, then SIGKILL after the grace period (`kill`: SIGKILL now).
    RunStop {
        /// An id, a unique id prefix, or `last`.
        run: String,
        #[serde(default)]
        kill: bool,
        /// Seconds between SIGTERM and SIGKILL; default 10.
        #[serde(default)]
        grace_s: Option<f64>,
        #[serde(default)]
        why: Option<String>,
    },
    /// Pause (SIGSTOP) or resume (SIGCONT) a run's process group.
    RunSignal {
        run: String,
        signal: RunSignal,
        #[serde(default)]
        why: Option<String>,
    },
    /// Up to `max_bytes` of a run's log from byte `offset` on.
    Logs {
        run: String,
        #[serde(default)]
        stream: LogStream,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        max_bytes: Option<u64>,
    },
    /// Node events with a sequence number above `since` (0: from the oldest kept).
    Events {
        #[serde(default)]
        since: u64,
        #[serde(default)]
        max: Option<u32>,
    },
    /// A run's own `events.jsonl`, from event `since` (0-based) on (lines that are not events
    /// are not counted).
    RunEvents {
        run: String,
        #[serde(default)]
        since: u64,
        #[serde(default)]
        max: Option<u32>,
    },
    /// Trainer channel: this connection is the trainer of `run` (from `GPUPILOT_RUN_ID`).
    ///
    /// A trainer on a node other than its run's (`GPUPILOT_RUN_NODE`) sends this to its own
    /// node's daemon with one more field, `"via_node": NODE`; that daemon relays the connection
    /// to NODE's daemon (`daemon::relay`, which reads the field from the frame as sent) and
    /// forwards the attach without it, so the run's daemon sees an ordinary attach.
    TrainerAttach {
        run: String,
        #[serde(default)]
        pid: Option<u32>,
        /// The values the trainer uses now, by knob name (unknown names are ignored).
        #[serde(default)]
        knobs: BTreeMap<String, i64>,
        /// Ranges for knobs the profile does not bound.
        #[serde(default)]
        ranges: BTreeMap<String, KnobRange>,
        /// Which rank of a distributed job this is; absent for a single-process script.
        #[serde(default, flatten)]
        rank: Option<RankSpec>,
        /// The versions of what it trains with (`python`, `torch`, `torch_cuda`, `cudnn`,
        /// `nccl`, …), for the run's report; the daemon keeps a bounded few.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        software: BTreeMap<String, String>,
    },
    /// Trainer channel: one metrics report.
    Metrics(MetricsReport),
    /// Trainer channel: the outcome of the `knob` push numbered `seq`.
    KnobAck {
        seq: u64,
        applied: bool,
        #[serde(default)]
        reason: Option<String>,
        /// The step it was applied at (a change with an `apply_step`).
        #[serde(default)]
        step: Option<u64>,
    },
    /// Trainer channel: a rank's vote on a change proposed for an `apply_step` — ready to apply
    /// it there, or not, and why.
    KnobVote {
        seq: u64,
        ready: bool,
        #[serde(default)]
        reason: Option<String>,
        /// The step the rank was at when it voted.
        #[serde(default)]
        step: Option<u64>,
    },
    /// Trainer channel: the trainer hit an error (`kind`: `oom` or `other`).
    TrainerError {
        kind: String,
        #[serde(default)]
        message: Option<String>,
        #[serde(default)]
        batch_size: Option<i64>,
    },
    /// Ask for a knob change on a run (`gpupilot set`).
    KnobSet {
        run: String,
        knob: KnobName,
        value: i64,
        /// Allow a restart with the new value when no trainer is attached.
        #[serde(default)]
        restart: bool,
        #[serde(default)]
        why: Option<String>,
    },
    /// A run's metrics reports from number `since` on, and its knobs and trainer.
    RunMetrics {
        run: String,
        #[serde(default)]
        since: u64,
        #[serde(default)]
        max: Option<u32>,
    },
    /// Every GPU's power limits, clock range and locks, target temperature, and the recorded
    /// originals.
    Power {},
    /// Set the power cap of `gpus` to `watts`.
    PowerCap {
        #[serde(default)]
        gpus: TargetGpus,
        watts: f64,
        #[serde(default)]
        why: Option<String>,
    },
    /// Restore the power limits recorded before gpupilot's first cap.
    PowerReset {
        #[serde(default)]
        gpus: TargetGpus,
        #[serde(default)]
        why: Option<String>,
    },
    /// Lock the SM clocks of `gpus` within `[min_mhz, max_mhz]`.
    ClocksLock {
        #[serde(default)]
        gpus: TargetGpus,
        min_mhz: u32,
        max_mhz: u32,
        #[serde(default)]
        why: Option<String>,
    },
    /// Unlock the SM clocks gpupilot locked.
    ClocksReset {
        #[serde(default)]
        gpus: TargetGpus,
        #[serde(default)]
        why: Option<String>,
    },
    /// Set the driver's target temperature ("GPU max") of `gpus`, whole °C.
    GpuMaxTemp {
        #[serde(default)]
        gpus: TargetGpus,
        celsius: f64,
        #[serde(default)]
        why: Option<String>,
    },
    /// Restore the target temperatures recorded before gpupilot's first change.
    GpuMaxTempReset {
        #[serde(default)]
        gpus: TargetGpus,
        #[serde(default)]
        why: Option<String>,
    },
    /// The control loops: thermal governors, the node power budget, active alerts, energy
    /// per GPU. Answered with `control`.
    Thermal {},
    /// Hold `gpus` at `target_c`, or `margin_c` below each GPU's slowdown temperature (one of
    /// the two), by moving their power caps. Answered with `control`.
    ThermalSet {
        #[serde(default)]
        gpus: TargetGpus,
        #[serde(default)]
        target_c: Option<f64>,
        #[serde(default)]
        margin_c: Option<f64>,
        #[serde(default)]
        why: Option<String>,
    },
    /// Turn the governor of `gpus` off; their users' caps come back. Answered with `control`.
    ThermalOff {
        #[serde(default)]
        gpus: TargetGpus,
        #[serde(default)]
        why: Option<String>,
    },
    /// Set the node power budget in watts (the sum of all caps stays within it), or clear it
    /// (`null`). Answered with `control`.
    PowerBudget {
        budget_w: Option<f64>,
        #[serde(default)]
        why: Option<String>,
    },
    /// Start an energy-tuning job on `run` in the daemon, searching as `settings` ask.
    /// Answered with `tune_jobs` (the new job) once its starting caps are recorded.
    TuneStart {
        run: String,
        #[serde(default)]
        settings: crate::control::tuner::TuneSettings,
    },
    /// The tuning jobs: all, or the one `job` names (a job id or a run). Answered with
    /// `tune_jobs`.
    TuneStatus {
        #[serde(default)]
        job: Option<String>,
    },
    /// Stop a tuning job (a job id or a run); its GPUs' starting caps come back. Answered with
    /// `tune_jobs` once they are.
    TuneStop { job: String },
}

impl Request {
    /// The `type` name, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "hello",
            Request::Status {} => "status",
            Request::Subscribe { .. } => "subscribe",
            Request::History { .. } => "history",
            Request::Runs { .. } => "runs",
            Request::RunStart { .. } => "run_start",
            Request::RunStop { .. } => "run_stop",
            Request::RunSignal { .. } => "run_signal",
            Request::Logs { .. } => "logs",
            Request::Events { .. } => "events",
            Request::RunEvents { .. } => "run_events",
            Request::TrainerAttach { .. } => "trainer_attach",
            Request::Metrics(_) => "metrics",
            Request::KnobAck { .. } => "knob_ack",
            Request::KnobVote { .. } => "knob_vote",
            Request::TrainerError { .. } => "trainer_error",
            Request::KnobSet { .. } => "knob_set",
            Request::RunMetrics { .. } => "run_metrics",
            Request::Power {} => "power",
            Request::PowerCap { .. } => "power_cap",
            Request::PowerReset { .. } => "power_reset",
            Request::ClocksLock { .. } => "clocks_lock",
            Request::ClocksReset { .. } => "clocks_reset",
            Request::GpuMaxTemp { .. } => "gpu_max_temp",
            Request::GpuMaxTempReset { .. } => "gpu_max_temp_reset",
            Request::Thermal {} => "thermal",
            Request::ThermalSet { .. } => "thermal_set",
            Request::ThermalOff { .. } => "thermal_off",
            Request::PowerBudget { .. } => "power_budget",
            Request::TuneStart { .. } => "tune_start",
            Request::TuneStatus { .. } => "tune_status",
            Request::TuneStop { .. } => "tune_stop",
        }
    }
}

/// What the daemon says: answers and pushed updates. Tagged by `"type"`, snake_case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    /// The handshake succeeded.
    Welcome {
        version: u32,
        daemon_pid: u32,
        /// The node's host name.
        node: String,
        readonly: bool,
    },
    /// The request failed; `code` is for programs, `message` for people.
    Error {
        code: ErrorCode,
        message: String,
    },
    Status(Box<StatusReply>),
    /// What the connection is subscribed to now.
    Subscribed {
        telemetry: bool,
        events: bool,
    },
    History {
        gpu: u32,
        metric: Metric,
        points: Vec<Point>,
    },
    Runs {
        runs: Vec<RunInfo>,
    },
    RunStarted {
        run: RunInfo,
    },
    /// The run after a stop or a signal was applied (a stop may still be in progress:
    /// `status` is `stopping` until the run has ended).
    RunChanged {
        run: RunInfo,
    },
    /// `data` is the bytes `[offset, next_offset)` of the log, as UTF-8 (invalid bytes become
    /// U+FFFD; a character cut by the chunk's end is left for the next chunk).
    Logs {
        run: String,
        stream: LogStream,
        offset: u64,
        next_offset: u64,
        /// The file's size when read.
        size: u64,
        data: String,
        /// The run has ended for good: once `next_offset == size`, nothing more will come.
        finished: bool,
    },
    /// Node events; ask again with `since = next` for newer ones.
    Events {
        events: Vec<NodeEventRecord>,
        next: u64,
    },
    RunEvents {
        run: String,
        events: Vec<EventRecord>,
        next: u64,
    },
    /// Pushed (no id): a new telemetry snapshot.
    Telemetry {
        snapshot: Box<Snapshot>,
    },
    /// Pushed (no id): a new node event.
    Event {
        event: NodeEventRecord,
    },
    /// Pushed (no id): the client was too slow and `missed` events were dropped; ask
    /// `events` with the last `seq` seen to catch up.
    Lagged {
        missed: u64,
    },
    /// Pushed (no id): the daemon is going away and closes the connection.
    Shutdown {
        reason: String,
    },
    /// A request that needs no more answer than that it was taken.
    Ok {},
    /// The connection is now `run`'s trainer; `knobs` are the values the daemon holds.
    TrainerAttached {
        run: String,
        knobs: BTreeMap<String, i64>,
    },
    /// Pushed to a trainer (no id): use `value` for `knob` from the next batch on, then
    /// acknowledge `seq` with `knob_ack`. With `apply_step` (a run of several ranks), it is a
    /// proposal: answer `knob_vote`, and apply it at that step only once `knob_decision`
    /// commits it.
    Knob {
        run: String,
        seq: u64,
        knob: KnobName,
        value: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        apply_step: Option<u64>,
    },
    /// Pushed to every rank (no id): change `seq` is committed (apply it at its step) or called
    /// off (keep the value; `reason` says why).
    KnobDecision {
        run: String,
        seq: u64,
        commit: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A knob change was taken: its outcome arrives as a `knob_applied` / `knob_rejected`
    /// event (`via` trainer) or as the run's restart (`via` restart).
    KnobPending {
        run: String,
        seq: u64,
        knob: KnobName,
        old: Option<i64>,
        value: i64,
        via: KnobVia,
        /// A run of several ranks: the step every rank will apply it at, once all agree.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        apply_step: Option<u64>,
        /// A run of several ranks: how many the change was proposed to.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ranks: Option<u32>,
    },
    RunMetrics {
        run: String,
        points: Vec<MetricsPoint>,
        /// Ask again with `since = next`.
        next: u64,
        trainer: TrainerInfo,
    },
    /// The answer to `power`.
    Power {
        gpus: Vec<GpuSettings>,
        /// The daemon restores the recorded originals when it stops.
        restore_on_exit: bool,
    },
    /// The answer to a GPU-settings change: what changed, and what needed no change.
    GpuChanged {
        changes: Vec<GpuChange>,
        #[serde(default)]
        notes: Vec<String>,
    },
    /// The answer to `thermal`, `thermal_set`, `thermal_off` and `power_budget`: the control
    /// loops as they stand.
    Control(Box<crate::control::status::ControlStatus>),
    /// The answer to `tune_start`, `tune_status` and `tune_stop`: the tuning jobs asked about.
    TuneJobs {
        jobs: Vec<crate::control::tuner::record::TuneJob>,
    },
}

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Not a frame the daemon understands (bad JSON, too long, not UTF-8): the connection closes.
    BadFrame,
    /// The first request was not `hello`: the connection closes.
    HandshakeRequired,
    /// Client and daemon speak different versions: the connection closes.
    VersionMismatch,
    /// The peer is another user: the connection closes. On the system daemon: this peer may
    /// not make this request (GPU settings need the group, runs need root); it stays open.
    PermissionDenied,
    /// The request's values make no sense (an unknown GPU, a bad profile, …).
    BadRequest,
    /// No run matches.
    UnknownRun,
    /// More than one run matches the prefix.
    AmbiguousRun,
    /// The run cannot do that in its state (stop a finished run, resume a running one).
    BadState,
    /// A knob change can reach the run only by restarting it, which the request did not allow
    /// (`knob_set` without `restart`): ask again with it.
    RestartNeeded,
    /// The run could not be started (command not found, no such directory, …).
    LaunchFailed,
    /// The daemon runs with `--readonly`.
    Readonly,
    /// The daemon may not change this GPU setting (NVML's NO_PERMISSION: it is not root).
    NoPermission,
    /// The GPU or its driver cannot do this.
    NotSupported,
    /// Something failed inside the daemon (a file it could not write).
    Internal,
    /// The daemon holds as many connections as it serves, from this user or in all: the
    /// connection closes. Close some and connect again.
    TooManyConnections,
    /// This user asked faster than the daemon answers one user (a burst, then a steady rate):
    /// the request was not done; the connection stays open. Wait a moment and ask again.
    RateLimited,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame longer than {max} bytes")]
    TooLong { max: usize },
    #[error("not a valid frame: {0}")]
    Json(#[from] serde_json::Error),
    /// A `telemetry_delta` push that cannot be applied (see [`delta`]).
    #[error("{0}")]
    Delta(&'static str),
}

/// One frame as a line: JSON and a newline.
pub fn encode<T: Serialize>(frame: &T) -> String {
    let mut line = serde_json::to_string(frame).expect("protocol frames always serialize");
    line.push('\n');
    line
}

/// Parse one line (with or without its newline) as a frame, refusing lines over `max` bytes.
pub fn decode<T: for<'de> Deserialize<'de>>(line: &str, max: usize) -> Result<T, FrameError> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    if line.len() > max {
        return Err(FrameError::TooLong { max });
    }
    Ok(serde_json::from_str(line)?)
}

/// [`decode`] for a frame from the daemon, with a short way for the frame a console reads
/// every second: a pushed snapshot. A [`ServerFrame`] is an id and a flattened, tagged
/// response, which serde reads through a buffered copy of the whole frame (every string and
/// number of eight GPUs allocated twice); a snapshot push is read straight into its
/// [`Snapshot`]. Anything else (or a push with more in it) is read the general way.
pub fn decode_server_frame(line: &str, max: usize) -> Result<ServerFrame, FrameError> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    if line.len() > max {
        return Err(FrameError::TooLong { max });
    }
    if let Some(snapshot) = snapshot_push(line) {
        return Ok(ServerFrame {
            id: None,
            response: Response::Telemetry { snapshot },
        });
    }
    Ok(serde_json::from_str(line)?)
}

/// The snapshot of a line that is `{"type":"telemetry","snapshot":{…}}` and nothing else.
fn snapshot_push(line: &str) -> Option<Box<Snapshot>> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TelemetryPush {
        #[serde(rename = "type")]
        _type: TelemetryTag,
        snapshot: Box<Snapshot>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum TelemetryTag {
        Telemetry,
    }
    // The daemon writes the tag first: any other frame is turned away before it is parsed.
    if !line.starts_with(r#"{"type":"telemetry","#) {
        return None;
    }
    serde_json::from_str::<TelemetryPush>(line)
        .ok()
        .map(|p| p.snapshot)
}

#[cfg(test)]
mod tests;
