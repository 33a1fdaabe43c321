//! The standing fuzz campaign over every decoder fed by someone else: protocol frames (clients,
//! trainers, other nodes' relays), profiles, the metric patterns read from a run's output, and
//! the Prometheus answer's JSON vector (the HTTP exchange is ureq's). Each is fed arbitrary input and
//! valid input with random edits; none may panic, an error says what is wrong in bounded words,
//! and a frame that decodes encodes back to itself. The last test sends edited frames to a live
//! daemon, which must go on answering.
//!
//! CI runs proptest's default 256 cases per property; a longer campaign by hand:
//! `PROPTEST_CASES=50000 cargo test --release --test fuzz` (see docs/operations.md).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::home::{Home, Raw};
use gpupilot::cluster::query::parse_vector;
use gpupilot::daemon::parse_output_line;
use gpupilot::profile::{self, SHIPPED};
use gpupilot::protocol::{
    ClientFrame, ErrorCode, KnobName, MAX_REPLY_FRAME, MAX_REQUEST_FRAME, MetricsReport, RankSpec,
    Request, Response, ServerFrame, decode, decode_server_frame, encode,
};
use proptest::prelude::*;

/// The longest error message any decoder may give: it names the problem, it does not echo
/// the input back.
const MAX_MESSAGE: usize = 2048;

/// Valid client frames of every kind a peer sends most: the seeds edits start from.
fn client_seeds() -> Vec<String> {
    let frames = [
        Request::Hello {
            version: 1,
            client: "fuzz".into(),
        },
        Request::Status {},
        Request::Subscribe {
            telemetry: true,
            events: true,
            delta: true,
            dedicated: false,
        },
        Request::KnobSet {
            run: "last".into(),
            knob: KnobName::BatchSize,
            value: 64,
            restart: false,
            why: None,
        },
        Request::TrainerAttach {
            run: "20261201-120000-train".into(),
            pid: Some(4242),
            knobs: BTreeMap::from([("batch_size".into(), 32)]),
            ranges: BTreeMap::new(),
            rank: Some(RankSpec {
                rank: 3,
                world_size: 8,
                local_rank: Some(3),
                host: Some("node-7".into()),
                gpu: Some(3),
                gpu_uuid: Some("GPU-0000".into()),
            }),
            software: BTreeMap::from([("torch".into(), "2.4.0".into())]),
        },
        Request::Metrics(MetricsReport {
            step: Some(1200),
            loss: Some(2.5),
            samples_per_s: Some(812.0),
            batch_size: Some(64),
            ..MetricsReport::default()
        }),
        Request::KnobVote {
            seq: 7,
            ready: true,
            reason: None,
            step: Some(1210),
        },
    ];
    frames
        .into_iter()
        .enumerate()
        .map(|(i, request)| {
            encode(&ClientFrame {
                id: i as u64 + 1,
                request,
            })
        })
        .collect()
}

/// Server frames as a console or a relay reads them.
fn server_seeds() -> Vec<String> {
    let mut seeds: Vec<String> = [
        (
            Some(1),
            Response::Welcome {
                version: 1,
                daemon_pid: 7,
                node: "a".into(),
                readonly: false,
            },
        ),
        (
            Some(3),
            Response::Error {
                code: ErrorCode::BadRequest,
                message: "no".into(),
            },
        ),
        (
            None,
            Response::Knob {
                run: "r".into(),
                seq: 4,
                knob: KnobName::BatchSize,
                value: 64,
                apply_step: Some(900),
            },
        ),
    ]
    .into_iter()
    .map(|(id, response)| encode(&ServerFrame { id, response }))
    .collect();
    // The snapshot push, which has a decoder of its own.
    seeds.push(
        "{\"type\":\"telemetry\",\"snapshot\":{\"time_s\":1.5,\"node\":{\"hostname\":\"a\",\
         \"source\":\"sim\"},\"gpus\":[{\"index\":0,\"lost\":false,\"stale\":false,\"time_s\":1.5,\
         \"power_w\":300.5}]}}\n"
            .into(),
    );
    seeds
}

/// A Prometheus answer's body: an instant vector of one series.
fn prometheus_answer() -> String {
    "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":[{\"metric\":\
     {\"gpu\":\"0\",\"Hostname\":\"a\"},\"value\":[1796000000.1,\"71\"]}]}}"
        .to_string()
}

/// `seed` with `edits` applied, each (position, what, byte): 0 replaces, 1 inserts, 2 deletes,
/// 3 duplicates a stretch (a repeated key, a longer number).
fn mutate(seed: &[u8], edits: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for &(at, what, byte) in edits {
        if out.is_empty() {
            out.push(byte);
            continue;
        }
        let at = at % out.len();
        match what % 4 {
            0 => out[at] = byte,
            1 => out.insert(at, byte),
            2 => {
                out.remove(at);
            }
            _ => {
                let end = (at + usize::from(byte % 16) + 1).min(out.len());
                let stretch = out[at..end].to_vec();
                out.splice(at..at, stretch);
            }
        }
    }
    out
}

fn edits() -> impl Strategy<Value = Vec<(usize, u8, u8)>> {
    prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8)
}

/// Bytes that look like JSON and HTTP more often than random bytes do.
fn jsonish() -> impl Strategy<Value = String> {
    proptest::string::string_regex(r#"[{}\[\]":,0-9a-z_.eE+\-\\ \r\n]{0,200}"#).unwrap()
}

fn check_message(what: &str, message: &str) {
    assert!(
        message.len() <= MAX_MESSAGE,
        "{what}: a {}-byte message: {}…",
        message.len(),
        &message[..200.min(message.len())]
    );
}

proptest! {
    #[test]
    fn client_frames_decode_or_refuse(seed in 0..7usize, e in edits(), noise in jsonish()) {
        let seeds = client_seeds();
        let edited = mutate(seeds[seed % seeds.len()].as_bytes(), &e);
        for line in [String::from_utf8_lossy(&edited).into_owned(), noise] {
            match decode::<ClientFrame>(&line, MAX_REQUEST_FRAME) {
                Ok(frame) => {
                    // What decodes encodes back to the same frame.
                    let again: ClientFrame = decode(&encode(&frame), MAX_REQUEST_FRAME).unwrap();
                    prop_assert_eq!(again, frame);
                }
                Err(e) => check_message("a client frame", &e.to_string()),
            }
        }
    }

    #[test]
    fn server_frames_decode_or_refuse(seed in 0..4usize, e in edits(), noise in jsonish()) {
        let seeds = server_seeds();
        let edited = mutate(seeds[seed % seeds.len()].as_bytes(), &e);
        for line in [String::from_utf8_lossy(&edited).into_owned(), noise] {
            match decode_server_frame(&line, MAX_REPLY_FRAME) {
                Ok(frame) => {
                    let again: ServerFrame = decode(&encode(&frame), MAX_REPLY_FRAME).unwrap();
                    prop_assert_eq!(again, frame);
                }
                Err(e) => check_message("a server frame", &e.to_string()),
            }
        }
    }

    #[test]
    fn profiles_load_or_say_why(seed in 0..SHIPPED.len(), e in edits(), pattern in ".{0,40}") {
        let text = mutate(SHIPPED[seed].1.as_bytes(), &e);
        let text = String::from_utf8_lossy(&text);
        if let Err(e) = profile::parse_str("fuzz.toml", &text) {
            check_message("a profile", &e.to_string());
        }
        // A metric pattern is a regular expression from the user: any string is checked.
        let with_pattern = format!(
            "name = \"p\"\n[run]\ncommand = [\"true\"]\n[metrics]\npatterns = [{}]\n",
            toml::Value::String(pattern)
        );
        if let Err(e) = profile::parse_str("pattern.toml", &with_pattern) {
            check_message("a pattern", &e.to_string());
        }
    }

    #[test]
    fn output_lines_read_or_skip(line in ".{0,200}", e in edits()) {
        let patterns = [
            regex::Regex::new(r"step (?P<step>\d+) loss=(?P<loss>[0-9.eE+-]+)").unwrap(),
            regex::Regex::new(r"(?P<samples_per_s>[0-9.]+) samples/s").unwrap(),
        ];
        let json = mutate(br#"{"step": 12, "loss": 1.5, "batch_size": 64, "lr": 0.1}"#, &e);
        for l in [line.as_str(), &String::from_utf8_lossy(&json)] {
            if let Some(r) = parse_output_line(l, true, &patterns) {
                // Whatever is read is a finite number.
                for v in [r.loss, r.samples_per_s, r.step_time_s, r.data_wait_s].into_iter().flatten() {
                    prop_assert!(v.is_finite());
                }
            }
        }
    }

    #[test]
    fn prometheus_answers_parse_or_refuse(e in edits(), noise in prop::collection::vec(any::<u8>(), 0..300)) {
        let edited = mutate(prometheus_answer().as_bytes(), &e);
        for raw in [edited, noise] {
            if let Err(e) = parse_vector(&raw) {
                check_message("a Prometheus body", &e);
            }
        }
    }
}

#[test]
fn the_seeds_are_valid() {
    for s in client_seeds() {
        decode::<ClientFrame>(&s, MAX_REQUEST_FRAME).unwrap();
    }
    for s in server_seeds() {
        decode_server_frame(&s, MAX_REPLY_FRAME).unwrap();
    }
    assert_eq!(
        parse_vector(prometheus_answer().as_bytes()).unwrap().len(),
        1
    );
}

#[test]
fn hostile_shapes_are_refused_without_a_crash() {
    // Nesting deeper than serde_json's recursion limit.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(decode::<ClientFrame>(&deep, MAX_REQUEST_FRAME).is_err());
    assert!(decode_server_frame(&deep, MAX_REPLY_FRAME).is_err());
    // Numbers at the edges of what JSON can say.
    for n in ["1e400", "-1e400", "1e-400", "18446744073709551616", "-0"] {
        let line = format!(
            "{{\"id\":1,\"type\":\"knob_set\",\"run\":\"a\",\"knob\":\"batch_size\",\"value\":{n}}}"
        );
        if let Err(e) = decode::<ClientFrame>(&line, MAX_REQUEST_FRAME) {
            check_message("a number", &e.to_string());
        }
    }
}

/// Edited frames to a live daemon, a connection at a time (the daemon may close one that sent
/// garbage): afterwards it still answers `status`.
#[test]
fn a_live_daemon_survives_edited_frames() {
    let home = Home::new();
    let mut daemon = home.daemon(&[]);
    let seeds = client_seeds();
    let mut rng = proptest::test_runner::TestRng::deterministic_rng(
        proptest::test_runner::RngAlgorithm::ChaCha,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut sent = 0;
    let mut raw = Raw::connect(&home.socket());
    raw.hello();
    while sent < 400 && Instant::now() < deadline {
        let seed = seeds[rand_below(&mut rng, seeds.len())].as_bytes();
        let e: Vec<(usize, u8, u8)> = (0..1 + rand_below(&mut rng, 6))
            .map(|_| {
                (
                    rand_below(&mut rng, 1 << 16),
                    rand_below(&mut rng, 256) as u8,
                    rand_below(&mut rng, 256) as u8,
                )
            })
            .collect();
        let mut frame = mutate(seed, &e);
        frame.retain(|&b| b != b'\n');
        frame.push(b'\n');
        sent += 1;
        if !(raw.send(&frame).is_ok() && answered(&mut raw)) {
            raw = Raw::connect(&home.socket());
            raw.hello();
        }
    }
    assert_eq!(sent, 400, "the daemon answered too slowly");
    let out = home.ok(&["status", "--json"]);
    assert!(out.contains("\"gpus\""), "{out}");
    let (status, _) = daemon.signal_and_wait(rustix::process::Signal::TERM);
    assert!(
        status.success(),
        "the daemon did not end cleanly: {status:?}"
    );
}

fn rand_below(rng: &mut proptest::test_runner::TestRng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// Whether one frame came back (an answer or a push) before the connection's read timeout.
fn answered(raw: &mut Raw) -> bool {
    use std::io::BufRead;
    let mut line = String::new();
    matches!(raw.reader.read_line(&mut line), Ok(n) if n > 0)
}
