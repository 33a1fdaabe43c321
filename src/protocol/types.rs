//! The values the protocol's messages carry: runs, the daemon's status, node events.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::supervisor::RunStatus;
use crate::telemetry::Snapshot;

/// One run as `ps` and the TUI show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// `YYYYMMDD-HHMMSS-NAME`, also the run directory's name.
    pub id: String,
    pub name: String,
    pub status: RunStatus,
    /// The current (or last) attempt's main process, which leads the run's process group.
    pub pid: Option<u32>,
    /// 0 for the first process, one more per restart.
    pub attempt: u32,
    pub restarts: u32,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub ended_at: Option<String>,
    /// Seconds since the first start (live runs), or the whole duration (ended runs).
    pub uptime_s: Option<f64>,
    pub exit_code: Option<i32>,
    pub signal_name: Option<String>,
    /// How it ended, in words: `exit 0`, `killed by SIGTERM`, …
    pub description: Option<String>,
    /// The argv started (after `torchrun`/placeholder expansion).
    pub command: Vec<String>,
    pub cwd: PathBuf,
    /// `CUDA_VISIBLE_DEVICES` as started (`0,2`), or `all` when unset.
    pub gpus: String,
    /// This daemon took the run over from an earlier one (its exit status may be unknown).
    pub adopted: bool,
    /// The run directory (`$STATE/runs/<id>`).
    pub dir: PathBuf,
    /// Energy of the run's GPUs while it ran (absent before the first measurement).
    #[serde(default)]
    pub energy: Option<crate::control::energy::RunEnergy>,
    /// A Slurm run's current (or last) job: id, state, nodes (`launcher = "slurm"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<crate::supervisor::slurm::SlurmJob>,
}

impl RunInfo {
    /// Ended for good.
    pub fn is_final(&self) -> bool {
        self.status.is_final()
    }
}

/// Which log file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogStream {
    #[default]
    Stdout,
    Stderr,
}

impl LogStream {
    pub fn as_str(self) -> &'static str {
        match self {
            LogStream::Stdout => "stdout",
            LogStream::Stderr => "stderr",
        }
    }
}

/// What `run_signal` does to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunSignal {
    /// SIGSTOP to the group.
    Pause,
    /// SIGCONT to the group.
    Resume,
}

/// The answer to `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReply {
    pub daemon: DaemonInfo,
    pub telemetry: TelemetryInfo,
    /// The newest snapshot; absent while telemetry is unavailable.
    pub snapshot: Option<Snapshot>,
    pub runs: RunCounts,
    /// The control loops (governors, budget, alerts, energy); absent from older daemons.
    #[serde(default)]
    pub control: Option<crate::control::status::ControlStatus>,
}

/// The daemon itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaemonInfo {
    pub pid: u32,
    /// gpupilot's version.
    pub version: String,
    pub protocol: u32,
    pub node: String,
    pub started_at: String,
    pub uptime_s: f64,
    pub readonly: bool,
    /// The user the daemon runs as.
    pub uid: u32,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    /// Connections open now (this one included).
    pub clients: usize,
}

/// Where the daemon's telemetry comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TelemetryInfo {
    /// `nvml` or `sim`; absent when no source could be opened.
    pub source: Option<String>,
    /// Why there is no telemetry (the daemon supervises runs regardless).
    pub error: Option<String>,
    /// Samples per second.
    pub rate_hz: f64,
    pub gpus: usize,
}

/// How many runs the daemon knows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCounts {
    /// Not ended for good (running, paused, stopping, waiting to restart).
    pub live: usize,
    pub total: usize,
}

/// One line of the node's `$STATE/events.jsonl`, and the `event` push.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeEventRecord {
    /// Increases by one per event across daemon restarts (the file's last `seq` is read back).
    pub seq: u64,
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    #[serde(flatten)]
    pub event: NodeEvent,
}

/// What happened on the node. `by` says who: `alice (uid 1000) via gpupilot (pid 4242)` for a
/// request, `daemon` for what the daemon did by itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum NodeEvent {
    DaemonStarted {
        pid: u32,
        version: String,
        readonly: bool,
        /// The telemetry source, or why there is none.
        telemetry: String,
        /// Runs found live in their directories and taken over.
        adopted: usize,
    },
    DaemonStopped {
        pid: u32,
        reason: String,
    },
    RunStarted {
        run: String,
        by: String,
        command: Vec<String>,
        why: Option<String>,
    },
    /// A run this daemon did not start, found live (or found ended) in its directory.
    RunAdopted {
        run: String,
        pid: Option<u32>,
        status: crate::supervisor::RunStatus,
    },
    /// A run's status changed: `old` → `new`, by whom, why.
    RunStatus {
        run: String,
        old: crate::supervisor::RunStatus,
        new: crate::supervisor::RunStatus,
        by: String,
        why: String,
    },
    /// A connection from another user was refused.
    PeerRefused {
        uid: u32,
        pid: Option<u32>,
        reason: String,
    },
    /// A run's trainer attached over the trainer channel (or went away: `attached` false).
    Trainer {
        run: String,
        attached: bool,
        pid: Option<u32>,
        /// Which rank, for a distributed run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<u32>,
    },
    /// A trainer's attach was refused: a rank outside the world size, a world size that
    /// differs from the other ranks', or a rank already attached on another connection.
    RankRefused {
        run: String,
        rank: u32,
        world_size: u32,
        pid: Option<u32>,
        reason: String,
    },
    /// A trainer on this node attached to a run of another node (`node`, its daemon reached
    /// over SSH): this daemon relays its connection there (see `daemon::relay`).
    RelayOpened {
        run: String,
        node: String,
        pid: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<u32>,
    },
    /// A relay for a trainer on this node could not be opened, or the other node's daemon
    /// refused the attach: `reason` says why (the trainer was told and retries).
    RelayFailed {
        run: String,
        node: String,
        pid: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<u32>,
        reason: String,
    },
    /// A change to a run of several ranks was committed: every rank agreed to apply it at
    /// `apply_step`.
    KnobStaged {
        run: String,
        change: u64,
        knob: crate::protocol::KnobName,
        value: i64,
        apply_step: u64,
        ranks: u32,
        /// Milliseconds from the request to the last rank's vote.
        rtt_ms: f64,
    },
    /// Something a rank said that does not fit the change it names (an ack for a change never
    /// sent to it, a late apply): recorded, and the ranks brought back to one value.
    KnobStray {
        run: String,
        rank: Option<u32>,
        change: u64,
        what: String,
    },
    /// Someone asked for a knob change: `old` → `new`, applied `via` the trainer or a restart.
    KnobChanged {
        run: String,
        /// The change's number (the `seq` of its `knob` push).
        change: u64,
        knob: crate::protocol::KnobName,
        old: Option<i64>,
        new: i64,
        via: crate::protocol::KnobVia,
        by: String,
        why: Option<String>,
    },
    /// The trainer acknowledged change `seq` and uses `value` from its next batch on.
    KnobApplied {
        run: String,
        /// The change's number (the `seq` of its `knob` push).
        change: u64,
        knob: crate::protocol::KnobName,
        value: i64,
        /// Milliseconds from the request to the acknowledgement (the last rank's).
        rtt_ms: f64,
        /// How many ranks applied it (a run of several ranks).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ranks: Option<u32>,
        /// The step every rank applied it at (a run of several ranks).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u64>,
    },
    /// The trainer refused change `seq`; the run keeps `kept`.
    KnobRejected {
        run: String,
        /// The change's number (the `seq` of its `knob` push).
        change: u64,
        knob: crate::protocol::KnobName,
        value: i64,
        kept: Option<i64>,
        reason: String,
        rtt_ms: f64,
        /// The rank that refused or failed it (a run of several ranks).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<u32>,
    },
    /// A run's output was found to be a training framework's log lines (`preset`), read for
    /// metrics from then on; `from_profile` when its profile named that preset.
    MetricsPreset {
        run: String,
        preset: String,
        from_profile: bool,
    },
    /// The trainer reported an error (`kind` `oom`: out of memory).
    TrainerError {
        run: String,
        kind: String,
        message: Option<String>,
    },
    /// A GPU setting changed (power limit, locked clocks, target temperature): `old` → `new`,
    /// by whom, why. `by` is `daemon` for a restore when it stops.
    GpuChanged {
        gpu: u32,
        what: String,
        old: Option<String>,
        new: Option<String>,
        by: String,
        why: Option<String>,
    },
    /// A GPU reported an XID error: its number, the catalog's name, and what to do.
    Xid {
        gpu: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uuid: Option<String>,
        xid: u64,
        name: String,
        action: String,
        /// XIDs of this number on this GPU folded into this event: in a storm each GPU and
        /// number has at most one event per 10 s, with this count.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        repeats: Option<u64>,
    },
    /// A GPU's power limit changed and gpupilot did not change it (pynvml, `nvidia-smi -pl`,
    /// another tool): `old_w` → `new_w`, as read at two snapshots. Recorded once per change;
    /// `old_w` becomes the GPU's recorded original unless one was recorded already, so
    /// `power reset` puts it back.
    PowerChangedOutside {
        gpu: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uuid: Option<String>,
        old_w: f64,
        new_w: f64,
    },
    /// The thermal governor of a GPU. `change`: `on`, `off`, `cap` (it moved the cap
    /// `old_w` → `new_w`), `stale` (telemetry went stale: it holds the cap), `resumed`,
    /// `flapping`, `restored` (nothing controls the cap any more: the user's cap is back),
    /// `failed`, `refused`, `job`. This and the next two are the control loops' events
    /// ([`crate::control::ControlEvent`], converted as the daemon records them).
    Governor {
        gpu: u32,
        change: String,
        #[serde(default)]
        target_c: Option<f64>,
        #[serde(default)]
        temperature_c: Option<f64>,
        #[serde(default)]
        old_w: Option<f64>,
        #[serde(default)]
        new_w: Option<f64>,
        by: String,
        why: String,
    },
    /// The node power budget was set (`budget_w`) or cleared (null), or it moved caps (`caps`).
    Budget {
        budget_w: Option<f64>,
        #[serde(default)]
        total_w: Option<f64>,
        #[serde(default)]
        caps: Vec<crate::control::status::CapChange>,
        by: String,
        why: String,
    },
    /// An alert was raised or cleared (`change`).
    Alert {
        change: String,
        alert: crate::control::alerts::Alert,
    },
    /// A step of an energy-tuning job (`tune energy`): `change` is `started`, `cap` (a cap to
    /// try, `cap_w`), `measured` (a cap's cost, `cap_w` and `cost`), `done` (the best cap set,
    /// `cap_w`), `cancelled`, `failed`, `suspended` (the daemon stopped; the starting caps are
    /// back), `resumed` or `restored` (a daemon that started found the job unfinished and went
    /// on with it, or put the starting caps back), with the reason in `why`.
    Tune {
        job: String,
        run: String,
        change: String,
        /// The GPUs whose caps the job moves together (absent in lines of older daemons).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gpus: Vec<u32>,
        /// With `cap`: the cap before this step, watts.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        old_w: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap_w: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        why: Option<String>,
    },
}

/// The control loops' events are node events, field for field (control names no protocol type;
/// the daemon converts as it records them).
impl From<crate::control::ControlEvent> for NodeEvent {
    fn from(e: crate::control::ControlEvent) -> NodeEvent {
        use crate::control::ControlEvent;
        match e {
            ControlEvent::Governor {
                gpu,
                change,
                target_c,
                temperature_c,
                old_w,
                new_w,
                by,
                why,
            } => NodeEvent::Governor {
                gpu,
                change,
                target_c,
                temperature_c,
                old_w,
                new_w,
                by,
                why,
            },
            ControlEvent::Budget {
                budget_w,
                total_w,
                caps,
                by,
                why,
            } => NodeEvent::Budget {
                budget_w,
                total_w,
                caps,
                by,
                why,
            },
            ControlEvent::Alert { change, alert } => NodeEvent::Alert { change, alert },
        }
    }
}
