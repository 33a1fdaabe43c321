//! Every request the daemon knows, in families, each a module with its requests'
//! classification and their handler, as a command module of a small server does:
//!
//! - `connection`: `hello`, `subscribe` — what the connection itself is (the server keeps the
//!   subscription's pushes; the checks and the welcome are here).
//! - `node`: `status`, `history` — the daemon, its telemetry and every GPU's history.
//! - `events`: `events` — the node's event log.
//! - `runs`: `runs`, `run_start`, `run_stop`, `run_signal`, `logs`, `run_events`,
//!   `run_metrics` — the supervised runs.
//! - `trainer`: `knob_set` and the trainer channel (`trainer_attach`, `metrics`, `knob_ack`,
//!   `knob_vote`, `trainer_error`) — what a run's trainer says, and the knobs changed through it.
//! - `control`: power caps, clock locks, the target temperature, the thermal governor, the node
//!   power budget.
//! - `tuning`: `tune_start`, `tune_status`, `tune_stop` — energy-tuning jobs.
//!
//! A request's way: the server (`super::server`) reads a frame, checks who may make it
//! ([`classify`], through `auth`), and hands it to its family: a connection request to the
//! server's own code with `connection`'s checks, a trainer's to [`trainer::Channel`] (the
//! connection's trainer side), any other to [`Daemon::answer`] (here), which refuses changes on a read-only
//! daemon and calls the family's `answer`.
//!
//! [`family`] has no wildcard arm: a new request type does not compile until it has a family;
//! the family's `class` then classifies it, and the tests below fail until it does and until
//! the table in docs/protocol.md ("Who sends what, who may, what changes") has its row.
//! Authorization, the read-only check and that table all read [`classify`].

mod connection;
mod control;
mod events;
mod node;
mod runs;
pub mod trainer;
mod tuning;

use super::auth::Access;
use super::base::RequestError;
use super::state::Daemon;
use crate::ipc::Peer;
use crate::protocol::{ErrorCode, Request, Response};

pub use connection::{Hello, hello, subscribe_check};
pub use node::answered_inline;

/// Who sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// The connection itself (`hello`, `subscribe`): answered by the server, never by
    /// [`Daemon::answer`].
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

impl Class {
    const fn new(sender: Sender, access: Access, changes: bool) -> Class {
        Class {
            sender,
            access,
            changes,
        }
    }
}

/// The family a request belongs to: the module that classifies and answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Connection,
    Node,
    Events,
    Runs,
    Trainer,
    Control,
    Tuning,
}

/// `request`'s family. No wildcard arm: see the module doc.
pub fn family(request: &Request) -> Family {
    use Family::*;
    match request {
        Request::Hello { .. } | Request::Subscribe { .. } => Connection,
        Request::Status {} | Request::History { .. } => Node,
        Request::Events { .. } => Events,
        Request::Runs { .. }
        | Request::RunStart { .. }
        | Request::RunStop { .. }
        | Request::RunSignal { .. }
        | Request::Logs { .. }
        | Request::RunEvents { .. }
        | Request::RunMetrics { .. } => Runs,
        Request::KnobSet { .. }
        | Request::TrainerAttach { .. }
        | Request::Metrics(_)
        | Request::KnobAck { .. }
        | Request::KnobVote { .. }
        | Request::TrainerError { .. } => Trainer,
        Request::Power {}
        | Request::PowerCap { .. }
        | Request::PowerReset { .. }
        | Request::ClocksLock { .. }
        | Request::ClocksReset { .. }
        | Request::GpuMaxTemp { .. }
        | Request::GpuMaxTempReset { .. }
        | Request::Thermal {}
        | Request::ThermalSet { .. }
        | Request::ThermalOff { .. }
        | Request::PowerBudget { .. } => Control,
        Request::TuneStart { .. } | Request::TuneStatus { .. } | Request::TuneStop { .. } => Tuning,
    }
}

/// What a request its family does not classify is taken for: the most guarded class (a
/// client's change to GPU settings). The tests below keep every request classified by its
/// family, so this is a fence, never an answer.
const UNCLASSIFIED: Class = Class::new(Sender::Client, Access::GpuSettings, true);

/// The class of `request`, from its family. See the module doc.
pub fn classify(request: &Request) -> Class {
    let class = match family(request) {
        Family::Connection => connection::class(request),
        Family::Node => node::class(request),
        Family::Events => events::class(request),
        Family::Runs => runs::class(request),
        Family::Trainer => trainer::class(request),
        Family::Control => control::class(request),
        Family::Tuning => tuning::class(request),
    };
    class.unwrap_or(UNCLASSIFIED)
}

const READONLY: &str = "this daemon is read-only (started with --readonly): it does not start, \
                        stop or signal runs, or change GPU settings; restart it without \
                        --readonly to allow changes";

impl Daemon {
    /// Answer one request from `peer` (a client's: every request but the connection's and the
    /// trainer channel's): refused on a read-only daemon if it changes something, else
    /// answered by its family. Blocking: call it off the async workers. Tests call it without
    /// a socket.
    pub fn answer(&self, peer: &Peer, request: Request) -> Response {
        if classify(&request).changes && self.readonly() {
            return RequestError::new(ErrorCode::Readonly, READONLY).into_response();
        }
        let result = match family(&request) {
            Family::Connection => Err(RequestError::new(
                ErrorCode::BadRequest,
                "hello and subscribe belong to a connection",
            )),
            Family::Node => node::answer(self, request),
            Family::Events => events::answer(self, request),
            Family::Runs => runs::answer(self, peer, request),
            Family::Trainer => trainer::answer(self, peer, request),
            Family::Control => control::answer(self, peer, request),
            Family::Tuning => tuning::answer(self, request),
        };
        result.unwrap_or_else(RequestError::into_response)
    }
}

/// The answer to a request handed to a family it is not of (never, while [`family`] and the
/// dispatch agree; the tests below hold them so).
fn not_of(family: &str, request: &Request) -> RequestError {
    RequestError::new(
        ErrorCode::Internal,
        format!("{} is not a {family} request", request.kind()),
    )
}

#[cfg(test)]
mod answer_tests;

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
    fn each_request_is_classified_by_its_family_alone() {
        type ClassOf = fn(&Request) -> Option<Class>;
        let families: [(Family, ClassOf); 7] = [
            (Family::Connection, connection::class),
            (Family::Node, node::class),
            (Family::Events, events::class),
            (Family::Runs, runs::class),
            (Family::Trainer, trainer::class),
            (Family::Control, control::class),
            (Family::Tuning, tuning::class),
        ];
        for r in one_of_each() {
            let by: Vec<Family> = families
                .iter()
                .filter(|(_, class)| class(&r).is_some())
                .map(|(f, _)| *f)
                .collect();
            assert_eq!(by, [family(&r)], "{} is classified by", r.kind());
        }
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
