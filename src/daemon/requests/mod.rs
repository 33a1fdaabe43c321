//! Every request the daemon knows, classified in one place: who sends it ([`Sender`]), who may
//! make it ([`Access`], what the system daemon's policy in `auth` decides on), and whether it
//! changes something (a daemon started with `--readonly` refuses those).
//!
//! Authorization (`auth`, and through it the server's per-request check), the read-only check
//! ([`super::Daemon::answer`]) and the table of requests in docs/protocol.md ("Who sends what,
//! who may, what changes") all read [`classify`]. Its match has no wildcard arm: a new request
//! type does not compile until it is classified here, and a test below then fails until the
//! docs' table has its row.

use super::auth::Access;
use crate::protocol::Request;

/// Who sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// The connection itself (`hello`, `subscribe`): answered by the server, never by
    /// [`super::Daemon::answer`].
    Connection,
    /// A client: the console, a command, a script.
    Client,
    /// A run's trainer, on a connection that said `trainer_attach` (its first message).
    Trainer,
}

/// What a request is, as far as who may make it and whether it changes anything go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class {
    pub sender: Sender,
    /// Who may make it on the system daemon (on a user's own daemon, that user and root may
    /// make every request).
    pub access: Access,
    /// It changes something: a run, a knob, a GPU setting or the control loops. Refused by a
    /// read-only daemon.
    pub changes: bool,
}

/// The class of `request`. See the module doc.
pub fn classify(request: &Request) -> Class {
    use Access::{GpuSettings, Runs, Watch};
    use Sender::{Client, Connection, Trainer};
    let (sender, access, changes) = match request {
        Request::Hello { .. } => (Connection, Watch, false),
        Request::Subscribe { .. } => (Connection, Watch, false),
        Request::Status {} => (Client, Watch, false),
        Request::History { .. } => (Client, Watch, false),
        Request::Runs { .. } => (Client, Watch, false),
        Request::Events { .. } => (Client, Watch, false),
        Request::Power {} => (Client, Watch, false),
        Request::Thermal {} => (Client, Watch, false),
        Request::RunStart { .. } => (Client, Runs, true),
        Request::RunStop { .. } => (Client, Runs, true),
        Request::RunSignal { .. } => (Client, Runs, true),
        Request::KnobSet { .. } => (Client, Runs, true),
        Request::Logs { .. } => (Client, Runs, false),
        Request::RunEvents { .. } => (Client, Runs, false),
        Request::RunMetrics { .. } => (Client, Runs, false),
        Request::PowerCap { .. } => (Client, GpuSettings, true),
        Request::PowerReset { .. } => (Client, GpuSettings, true),
        Request::ClocksLock { .. } => (Client, GpuSettings, true),
        Request::ClocksReset { .. } => (Client, GpuSettings, true),
        Request::GpuMaxTemp { .. } => (Client, GpuSettings, true),
        Request::GpuMaxTempReset { .. } => (Client, GpuSettings, true),
        Request::ThermalSet { .. } => (Client, GpuSettings, true),
        Request::ThermalOff { .. } => (Client, GpuSettings, true),
        Request::PowerBudget { .. } => (Client, GpuSettings, true),
        Request::TuneStart { .. } => (Client, GpuSettings, true),
        Request::TuneStatus { .. } => (Client, Watch, false),
        Request::TuneStop { .. } => (Client, GpuSettings, true),
        Request::TrainerAttach { .. } => (Trainer, Runs, false),
        Request::Metrics(_) => (Trainer, Runs, false),
        Request::KnobAck { .. } => (Trainer, Runs, false),
        Request::KnobVote { .. } => (Trainer, Runs, false),
        Request::TrainerError { .. } => (Trainer, Runs, false),
    };
    Class {
        sender,
        access,
        changes,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::history::Metric;
    use crate::profile::Profile;
    use crate::protocol::{KnobName, LogStream, RunSignal, TargetGpus};
    use crate::supervisor::Caller;

    /// One request of every type.
    fn one_of_each() -> Vec<Request> {
        let gpus = TargetGpus::All;
        vec![
            Request::Hello {
                version: 1,
                client: "test".into(),
            },
            Request::Status {},
            Request::Subscribe {
                telemetry: true,
                events: true,
                delta: false,
                dedicated: false,
            },
            Request::History {
                gpu: 0,
                metric: Metric::Power,
                from: 0.0,
                to: 1.0,
                max_points: 1,
            },
            Request::Runs {
                run: None,
                live: false,
            },
            Request::RunStart {
                profile: Box::new(Profile::from_command(vec!["true".into()])),
                caller: Caller {
                    cwd: "/".into(),
                    env: Default::default(),
                },
                knobs: Default::default(),
                why: None,
            },
            Request::RunStop {
                run: "last".into(),
                kill: false,
                grace_s: None,
                why: None,
            },
            Request::RunSignal {
                run: "last".into(),
                signal: RunSignal::Pause,
                why: None,
            },
            Request::Logs {
                run: "last".into(),
                stream: LogStream::Stdout,
                offset: 0,
                max_bytes: None,
            },
            Request::Events {
                since: 0,
                max: None,
            },
            Request::RunEvents {
                run: "last".into(),
                since: 0,
                max: None,
            },
            Request::TrainerAttach {
                run: "r".into(),
                pid: None,
                knobs: Default::default(),
                ranges: Default::default(),
                rank: None,
                software: Default::default(),
            },
            Request::Metrics(Default::default()),
            Request::KnobAck {
                seq: 1,
                applied: true,
                reason: None,
                step: None,
            },
            Request::KnobVote {
                seq: 1,
                ready: true,
                reason: None,
                step: None,
            },
            Request::TrainerError {
                kind: "oom".into(),
                message: None,
                batch_size: None,
            },
            Request::KnobSet {
                run: "last".into(),
                knob: KnobName::BatchSize,
                value: 8,
                restart: false,
                why: None,
            },
            Request::RunMetrics {
                run: "last".into(),
                since: 0,
                max: None,
            },
            Request::Power {},
            Request::PowerCap {
                gpus: gpus.clone(),
                watts: 250.0,
                why: None,
            },
            Request::PowerReset {
                gpus: gpus.clone(),
                why: None,
            },
            Request::ClocksLock {
                gpus: gpus.clone(),
                min_mhz: 1000,
                max_mhz: 1500,
                why: None,
            },
            Request::ClocksReset {
                gpus: gpus.clone(),
                why: None,
            },
            Request::GpuMaxTemp {
                gpus: gpus.clone(),
                celsius: 80.0,
                why: None,
            },
            Request::GpuMaxTempReset {
                gpus: gpus.clone(),
                why: None,
            },
            Request::Thermal {},
            Request::ThermalSet {
                gpus: gpus.clone(),
                target_c: Some(80.0),
                margin_c: None,
                why: None,
            },
            Request::ThermalOff { gpus, why: None },
            Request::PowerBudget {
                budget_w: Some(1000.0),
                why: None,
            },
            Request::TuneStart {
                run: "last".into(),
                settings: Default::default(),
            },
            Request::TuneStatus { job: None },
            Request::TuneStop { job: "last".into() },
        ]
    }

    /// Every request `type` the protocol knows, as serde lists them (an unknown type's error
    /// names them all).
    fn every_type() -> Vec<String> {
        let e = serde_json::from_value::<Request>(serde_json::json!({ "type": "?" }))
            .expect_err("no such type");
        let e = e.to_string();
        let list = e
            .split_once("expected one of ")
            .map(|(_, l)| l)
            .expect("serde names the variants");
        let mut out: Vec<String> = list
            .split(", ")
            .map(|t| t.trim().trim_matches('`').to_string())
            .collect();
        out.sort();
        out
    }

    /// A class in the docs' words: sent by, who may (on the system daemon), changes.
    fn words(c: Class) -> [&'static str; 3] {
        let sender = match c.sender {
            Sender::Connection => "connection",
            Sender::Client => "client",
            Sender::Trainer => "trainer",
        };
        let access = match c.access {
            Access::Connect | Access::Watch => "watch",
            Access::GpuSettings => "GPU settings",
            Access::Runs => "runs",
        };
        [sender, access, if c.changes { "yes" } else { "no" }]
    }

    #[test]
    fn every_request_type_is_in_the_examples() {
        let mut kinds: Vec<String> = one_of_each().iter().map(|r| r.kind().into()).collect();
        kinds.sort();
        assert_eq!(
            kinds,
            every_type(),
            "one example of each request type, once"
        );
    }

    #[test]
    fn the_docs_table_of_requests_is_the_classification() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/protocol.md");
        let text = std::fs::read_to_string(path).unwrap();
        let heading = "### Who sends what, who may, what changes";
        let section = &text[text
            .find(heading)
            .expect("the section is in docs/protocol.md")..];
        let mut docs: BTreeMap<String, Vec<String>> = BTreeMap::new();
        // The table's rows: after its header and the line under it, up to the first line that
        // is not a row.
        let rows = section
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .skip(2)
            .take_while(|l| l.starts_with('|'));
        for line in rows {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let Some(kind) = cells[0].strip_prefix('`').and_then(|k| k.strip_suffix('`')) else {
                continue;
            };
            let row = cells[1..].iter().map(|c| c.to_string()).collect();
            assert!(docs.insert(kind.to_string(), row).is_none(), "{kind} twice");
        }
        let code: BTreeMap<String, Vec<String>> = one_of_each()
            .iter()
            .map(|r| {
                let row = words(classify(r)).iter().map(|w| w.to_string()).collect();
                (r.kind().to_string(), row)
            })
            .collect();
        assert_eq!(docs, code, "docs/protocol.md's table against `classify`");
    }

    #[test]
    fn changes_are_what_a_readonly_daemon_refuses() {
        let changes: Vec<&str> = one_of_each()
            .iter()
            .filter(|r| classify(r).changes)
            .map(Request::kind)
            .collect();
        assert_eq!(
            changes,
            [
                "run_start",
                "run_stop",
                "run_signal",
                "knob_set",
                "power_cap",
                "power_reset",
                "clocks_lock",
                "clocks_reset",
                "gpu_max_temp",
                "gpu_max_temp_reset",
                "thermal_set",
                "thermal_off",
                "power_budget",
                "tune_start",
                "tune_stop"
            ]
        );
    }
}
