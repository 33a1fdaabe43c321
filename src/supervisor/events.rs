//! What a run directory records: lifecycle events (`events.jsonl`, one JSON object a line) and
//! the run's summary (`summary.json`). Plain JSON for grep, jq and pandas.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use serde::{Deserialize, Serialize};

use super::signal::signal_name;

/// How one process of the run ended. Both fields absent: the status is unknown (the process
/// was adopted, is not our child, and could not be waited on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExitInfo {
    /// The exit code, when it exited.
    pub code: Option<i32>,
    /// The signal number, when a signal ended it.
    pub signal: Option<i32>,
}

impl ExitInfo {
    pub fn from_status(status: ExitStatus) -> ExitInfo {
        ExitInfo {
            code: status.code(),
            signal: status.signal(),
        }
    }

    pub fn code(code: i32) -> ExitInfo {
        ExitInfo {
            code: Some(code),
            signal: None,
        }
    }

    pub fn unknown() -> ExitInfo {
        ExitInfo::default()
    }

    pub fn is_success(&self) -> bool {
        self.code == Some(0)
    }

    pub fn is_unknown(&self) -> bool {
        self.code.is_none() && self.signal.is_none()
    }

    pub fn signal_name(&self) -> Option<&'static str> {
        self.signal.and_then(signal_name)
    }

    /// `exit 0`, `exit 3`, `killed by SIGTERM`, `unknown status (adopted)`.
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(c), _) => format!("exit {c}"),
            (None, Some(s)) => match signal_name(s) {
                Some(n) => format!("killed by {n}"),
                None => format!("killed by signal {s}"),
            },
            (None, None) => "unknown status (adopted)".into(),
        }
    }
}

/// Where a run stands (`summary.json`'s `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    Running,
    Paused,
    /// SIGTERM sent, waiting for the grace period.
    Stopping,
    /// Ended; waiting to be restarted.
    Backoff,
    /// Ended with exit 0 and will not be restarted.
    Succeeded,
    /// Ended otherwise and will not be restarted.
    Failed,
    /// Ended because a user stopped it.
    Stopped,
    /// Ended while adopted, with no way to learn how.
    Unknown,
}

impl RunStatus {
    /// Ended for good.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Stopped | RunStatus::Unknown
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Paused => "paused",
            RunStatus::Stopping => "stopping",
            RunStatus::Backoff => "backoff",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Stopped => "stopped",
            RunStatus::Unknown => "unknown",
        }
    }
}

/// A lifecycle event. Serialized with its name in `"event"`, e.g.
/// `{"time":"…","event":"exited","attempt":0,"pid":42,"code":1,…}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The run directory was made.
    Created {
        name: String,
        command: Vec<String>,
        cwd: String,
        profile: Option<String>,
    },
    /// The first process started (attempt 0).
    Started {
        attempt: u32,
        pid: u32,
        start_time: u64,
        own_session: bool,
    },
    /// A later attempt started after a restart.
    Restarted {
        attempt: u32,
        pid: u32,
        start_time: u64,
        own_session: bool,
    },
    /// An attempt's main process ended.
    Exited {
        attempt: u32,
        pid: u32,
        code: Option<i32>,
        signal: Option<i32>,
        signal_name: Option<String>,
        description: String,
        duration_s: f64,
    },
    RestartScheduled {
        attempt: u32,
        after_s: f64,
    },
    /// The restart policy says no more.
    GaveUp {
        reason: String,
    },
    StopRequested {
        grace_s: f64,
    },
    /// The grace period ran out (or `stop --kill`): SIGKILL to the group.
    Killed {
        after_s: f64,
    },
    Stopped {},
    Paused {},
    Resumed {},
    /// A supervisor that did not start this process took it over.
    Adopted {
        pid: u32,
        start_time: u64,
    },
    /// A Slurm run's attempt was submitted as job `job_id` (instead of `started` /
    /// `restarted`).
    Submitted {
        attempt: u32,
        job_id: String,
    },
    /// A supervisor that did not submit this Slurm job took it over.
    AdoptedJob {
        job_id: String,
    },
    /// The run is over for good.
    Finished {
        status: RunStatus,
        description: String,
    },
    /// Someone asked for a change (the daemon records who): `what` went from `old` to `new`,
    /// because `why`. E.g. `by` = `alice (uid 1000) via gpupilot (pid 4242)`, `what` =
    /// `status`, `old` = `running`, `new` = `stopping`, `why` = `gpupilot stop`.
    Changed {
        by: String,
        what: String,
        old: Option<String>,
        new: Option<String>,
        why: Option<String>,
    },
    /// The trainer answered knob change `seq`: it uses `value` from its next batch on
    /// (`applied`), or refused it (`reason`). `rtt_ms`: from the request to the answer.
    KnobAcked {
        seq: u64,
        knob: String,
        value: i64,
        applied: bool,
        reason: Option<String>,
        rtt_ms: f64,
    },
    /// The trainer reported an error (`kind` `oom`: out of memory).
    TrainerError {
        kind: String,
        message: Option<String>,
    },
    /// The run's report was written to `path` (the daemon's `report.html`, a few seconds after
    /// the run ended).
    ReportWritten {
        path: String,
    },
}

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    #[serde(flatten)]
    pub event: Event,
}

/// `summary.json`: the run at a glance, rewritten at every change of status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub id: String,
    pub name: String,
    pub status: RunStatus,
    /// The current (or last) attempt's main process.
    pub pid: Option<u32>,
    /// 0 for the first process, then one more per restart.
    pub attempt: u32,
    pub restarts: u32,
    pub started_at: String,
    pub ended_at: Option<String>,
    /// Wall time from the first start to the final end.
    pub duration_s: Option<f64>,
    /// How the last attempt ended.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub signal_name: Option<String>,
    /// In words: `exit 0`, `killed by SIGKILL after the 10 s grace period`, `unknown status
    /// (adopted)`, `gave up after 3 restarts`.
    pub description: Option<String>,
    /// Energy of the run's GPUs, joules, and the training samples it reported; written by
    /// the daemon's control loop while the run lives and when it ends.
    pub energy_j: Option<f64>,
    pub samples: Option<u64>,
    /// The energy in full: per GPU, kWh, J/sample, cost (see `control::energy::RunEnergy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy: Option<crate::control::energy::RunEnergy>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lines_are_flat() {
        let r = EventRecord {
            time: "2026-11-30T03:15:00.000Z".into(),
            event: Event::Exited {
                attempt: 1,
                pid: 42,
                code: None,
                signal: Some(9),
                signal_name: Some("SIGKILL".into()),
                description: "killed by SIGKILL".into(),
                duration_s: 1.5,
            },
        };
        let line = serde_json::to_string(&r).unwrap();
        assert!(
            line.starts_with(r#"{"time":"2026-11-30T03:15:00.000Z","event":"exited","attempt":1,"pid":42,"code":null,"signal":9"#),
            "{line}"
        );
        let back: EventRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(back, r);
        let line = serde_json::to_string(&EventRecord {
            time: "t".into(),
            event: Event::Paused {},
        })
        .unwrap();
        assert_eq!(line, r#"{"time":"t","event":"paused"}"#);
    }

    #[test]
    fn exit_descriptions() {
        assert_eq!(ExitInfo::code(0).describe(), "exit 0");
        assert!(ExitInfo::code(0).is_success());
        let k = ExitInfo {
            code: None,
            signal: Some(15),
        };
        assert_eq!(k.describe(), "killed by SIGTERM");
        assert!(!k.is_success() && !k.is_unknown());
        assert_eq!(ExitInfo::unknown().describe(), "unknown status (adopted)");
    }
}
