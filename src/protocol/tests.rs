//! Frames round-trip, look the way `docs/protocol.md` shows them, and split anywhere on the
//! wire still decode to the same frames.

use super::*;
use crate::supervisor::{Event, RunStatus};
use proptest::prelude::*;
use std::collections::BTreeMap;
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, LinesCodec};

fn round_trip_client(f: &ClientFrame) -> ClientFrame {
    decode(&encode(f), MAX_REQUEST_FRAME).unwrap()
}

fn round_trip_server(f: &ServerFrame) -> ServerFrame {
    decode(&encode(f), MAX_REPLY_FRAME).unwrap()
}

#[test]
fn examples_look_like_the_docs() {
    let hello = ClientFrame {
        id: 1,
        request: Request::Hello {
            version: 1,
            client: "gpupilot-cli 0.1.0".into(),
        },
    };
    assert_eq!(
        encode(&hello),
        "{\"id\":1,\"type\":\"hello\",\"version\":1,\"client\":\"gpupilot-cli 0.1.0\"}\n"
    );
    let runs = ClientFrame {
        id: 2,
        request: Request::Runs {
            run: None,
            live: false,
        },
    };
    assert_eq!(encode(&runs), "{\"id\":2,\"type\":\"runs\"}\n");
    let welcome = ServerFrame {
        id: Some(1),
        response: Response::Welcome {
            version: 1,
            daemon_pid: 4242,
            node: "gpu-node-07".into(),
            readonly: false,
        },
    };
    assert_eq!(
        encode(&welcome),
        "{\"id\":1,\"type\":\"welcome\",\"version\":1,\"daemon_pid\":4242,\"node\":\"gpu-node-07\",\"readonly\":false}\n"
    );
    let push = ServerFrame {
        id: None,
        response: Response::Lagged { missed: 3 },
    };
    assert_eq!(encode(&push), "{\"type\":\"lagged\",\"missed\":3}\n");
    let err = ServerFrame {
        id: Some(9),
        response: Response::Error {
            code: ErrorCode::UnknownRun,
            message: "no run matches `x`".into(),
        },
    };
    assert_eq!(
        encode(&err),
        "{\"id\":9,\"type\":\"error\",\"code\":\"unknown_run\",\"message\":\"no run matches `x`\"}\n"
    );
}

#[test]
fn defaults_and_unknown_fields() {
    // Optional fields may be left out; unknown ones are ignored (a newer client may send more).
    let f: ClientFrame = decode(
        r#"{"id":5,"type":"logs","run":"last","future_field":true}"#,
        MAX_REQUEST_FRAME,
    )
    .unwrap();
    assert_eq!(
        f.request,
        Request::Logs {
            run: "last".into(),
            stream: LogStream::Stdout,
            offset: 0,
            max_bytes: None,
        }
    );
    let f: ClientFrame = decode(r#"{"id":6,"type":"subscribe","telemetry":true}"#, 1024).unwrap();
    assert_eq!(
        f.request,
        Request::Subscribe {
            telemetry: true,
            events: false,
            delta: false,
            dedicated: false,
        }
    );
    let f: ClientFrame = decode(
        r#"{"id":6,"type":"history","gpu":1,"metric":"power","from":0,"to":10.5,"max_points":80}"#,
        1024,
    )
    .unwrap();
    assert!(matches!(
        f.request,
        Request::History {
            metric: Metric::Power,
            ..
        }
    ));
}

#[test]
fn malformed_frames_are_errors() {
    for bad in [
        "",
        "not json",
        "{\"type\":\"runs\"}",         // no id
        "{\"id\":1,\"type\":\"fly\"}", // unknown type
        "{\"id\":-1,\"type\":\"runs\"}",
        "[1,2]",
    ] {
        assert!(
            matches!(
                decode::<ClientFrame>(bad, MAX_REQUEST_FRAME),
                Err(FrameError::Json(_))
            ),
            "{bad}"
        );
    }
    let long = format!(
        "{{\"id\":1,\"type\":\"runs\",\"pad\":\"{}\"}}",
        "x".repeat(100)
    );
    assert!(matches!(
        decode::<ClientFrame>(&long, 50),
        Err(FrameError::TooLong { max: 50 })
    ));
}

#[test]
fn complex_answers_round_trip() {
    let info = RunInfo {
        id: "20261130-031500-train".into(),
        name: "train".into(),
        status: RunStatus::Running,
        pid: Some(4321),
        attempt: 1,
        restarts: 1,
        started_at: "2026-11-30T03:15:00.000Z".into(),
        ended_at: None,
        uptime_s: Some(12.5),
        exit_code: None,
        signal_name: None,
        description: None,
        command: vec!["python3".into(), "train.py".into()],
        cwd: "/home/a".into(),
        gpus: "0,1".into(),
        adopted: true,
        dir: "/s/runs/20261130-031500-train".into(),
        energy: None,
        slurm: None,
    };
    let frames = [
        ServerFrame {
            id: Some(3),
            response: Response::Runs {
                runs: vec![info.clone()],
            },
        },
        ServerFrame {
            id: None,
            response: Response::Event {
                event: NodeEventRecord {
                    seq: 17,
                    time: "t".into(),
                    event: NodeEvent::RunStatus {
                        run: info.id.clone(),
                        old: RunStatus::Running,
                        new: RunStatus::Stopping,
                        by: "alice (uid 1000)".into(),
                        why: "gpupilot stop".into(),
                    },
                },
            },
        },
        ServerFrame {
            id: Some(4),
            response: Response::RunEvents {
                run: info.id.clone(),
                events: vec![EventRecord {
                    time: "t".into(),
                    event: Event::Changed {
                        by: "b".into(),
                        what: "status".into(),
                        old: Some("running".into()),
                        new: Some("paused".into()),
                        why: None,
                    },
                }],
                next: 1,
            },
        },
        ServerFrame {
            id: Some(5),
            response: Response::Status(Box::new(StatusReply {
                daemon: DaemonInfo {
                    pid: 1,
                    version: "0.1.0".into(),
                    protocol: VERSION,
                    node: "n".into(),
                    started_at: "t".into(),
                    uptime_s: 3.0,
                    readonly: true,
                    uid: 1000,
                    state_dir: "/s".into(),
                    socket: "/r/daemon.sock".into(),
                    clients: 2,
                },
                telemetry: TelemetryInfo {
                    source: None,
                    error: Some("NVML did not load".into()),
                    rate_hz: 1.0,
                    gpus: 0,
                },
                snapshot: Some(Snapshot::default()),
                runs: RunCounts { live: 1, total: 4 },
                control: None,
            })),
        },
    ];
    for f in &frames {
        assert_eq!(&round_trip_server(f), f);
    }
    let start = ClientFrame {
        id: 8,
        request: Request::RunStart {
            profile: Box::new(crate::profile::Profile::from_command(vec![
                "sleep".into(),
                "1".into(),
            ])),
            caller: Caller {
                cwd: "/tmp".into(),
                env: BTreeMap::from([("PATH".into(), "/usr/bin".into())]),
            },
            knobs: KnobValues::default(),
            why: Some("test".into()),
        },
    };
    assert_eq!(round_trip_client(&start), start);
}

fn text() -> impl Strategy<Value = String> {
    // Any Unicode, newlines and quotes included: they must be escaped inside a frame.
    proptest::string::string_regex("(?s).{0,40}").unwrap()
}

/// Floats that survive a trip through decimal text exactly (serde_json parses the shortest
/// representation back to the same value for these).
fn float() -> impl Strategy<Value = f64> {
    (-1_000_000i64..1_000_000).prop_map(|n| n as f64 / 8.0)
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (any::<u32>(), text()).prop_map(|(version, client)| Request::Hello { version, client }),
        Just(Request::Status {}),
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(telemetry, events, delta, dedicated)| Request::Subscribe {
                telemetry,
                events,
                delta,
                dedicated,
            }
        ),
        (
            any::<u32>(),
            0..Metric::ALL.len(),
            float(),
            float(),
            any::<u32>()
        )
            .prop_map(|(gpu, m, from, to, max_points)| Request::History {
                gpu,
                metric: Metric::ALL[m],
                from,
                to,
                max_points,
            }),
        (proptest::option::of(text()), any::<bool>())
            .prop_map(|(run, live)| Request::Runs { run, live }),
        (
            text(),
            any::<bool>(),
            proptest::option::of(float()),
            proptest::option::of(text())
        )
            .prop_map(|(run, kill, grace_s, why)| Request::RunStop {
                run,
                kill,
                grace_s,
                why
            }),
        (text(), any::<bool>()).prop_map(|(run, p)| Request::RunSignal {
            run,
            signal: if p {
                RunSignal::Pause
            } else {
                RunSignal::Resume
            },
            why: None,
        }),
        (
            text(),
            any::<bool>(),
            any::<u64>(),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(run, err, offset, max_bytes)| Request::Logs {
                run,
                stream: if err {
                    LogStream::Stderr
                } else {
                    LogStream::Stdout
                },
                offset,
                max_bytes,
            }),
        (any::<u64>(), proptest::option::of(any::<u32>()))
            .prop_map(|(since, max)| Request::Events { since, max }),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        (any::<u32>(), any::<u32>(), text(), any::<bool>()).prop_map(
            |(version, daemon_pid, node, readonly)| Response::Welcome {
                version,
                daemon_pid,
                node,
                readonly
            }
        ),
        text().prop_map(|message| Response::Error {
            code: ErrorCode::BadRequest,
            message
        }),
        (
            text(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            text(),
            any::<bool>()
        )
            .prop_map(
                |(run, offset, next_offset, size, data, finished)| Response::Logs {
                    run,
                    stream: LogStream::Stdout,
                    offset,
                    next_offset,
                    size,
                    data,
                    finished,
                }
            ),
        (
            any::<u32>(),
            proptest::collection::vec((float(), float()), 0..20)
        )
            .prop_map(|(gpu, pts)| Response::History {
                gpu,
                metric: Metric::Temperature,
                points: pts
                    .into_iter()
                    .map(|(t, v)| Point {
                        t,
                        min: v,
                        mean: v,
                        max: v,
                    })
                    .collect(),
            }),
        any::<u64>().prop_map(|missed| Response::Lagged { missed }),
        text().prop_map(|reason| Response::Shutdown { reason }),
        (any::<u64>(), text()).prop_map(|(seq, why)| Response::Event {
            event: NodeEventRecord {
                seq,
                time: "2026-11-30T03:15:00.000Z".into(),
                event: NodeEvent::RunStatus {
                    run: "r".into(),
                    old: RunStatus::Paused,
                    new: RunStatus::Running,
                    by: "daemon".into(),
                    why,
                },
            },
        }),
    ]
}

proptest! {
    #[test]
    fn client_frames_round_trip(id in any::<u64>(), request in request()) {
        let f = ClientFrame { id, request };
        let line = encode(&f);
        prop_assert_eq!(line.matches('\n').count(), 1, "one line per frame");
        prop_assert_eq!(round_trip_client(&f), f);
    }

    #[test]
    fn server_frames_round_trip(id in proptest::option::of(any::<u64>()), response in response()) {
        let f = ServerFrame { id, response };
        let line = encode(&f);
        prop_assert_eq!(line.matches('\n').count(), 1, "one line per frame");
        prop_assert_eq!(round_trip_server(&f), f);
    }

    /// However the bytes arrive (split anywhere, even inside a UTF-8 character), the codec the
    /// daemon reads with yields the same frames in order.
    #[test]
    fn frames_survive_any_split(
        frames in proptest::collection::vec((any::<u64>(), request()), 1..6),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let frames: Vec<ClientFrame> =
            frames.into_iter().map(|(id, request)| ClientFrame { id, request }).collect();
        let wire: Vec<u8> = frames.iter().flat_map(|f| encode(f).into_bytes()).collect();
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
        cuts.push(wire.len());
        cuts.sort_unstable();
        let mut codec = LinesCodec::new_with_max_length(MAX_REQUEST_FRAME);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut at = 0;
        for cut in cuts {
            buf.extend_from_slice(&wire[at..cut]);
            at = cut;
            while let Some(line) = codec.decode(&mut buf).unwrap() {
                got.push(decode::<ClientFrame>(&line, MAX_REQUEST_FRAME).unwrap());
            }
        }
        prop_assert_eq!(got, frames);
    }
}

#[test]
fn the_codec_refuses_an_oversized_line_before_it_ends() {
    let mut codec = LinesCodec::new_with_max_length(16);
    let mut buf = BytesMut::from(&b"{\"id\":1,\"type\":\"runs\",\"pad\":\"xxxxxxxx"[..]);
    assert!(
        codec.decode(&mut buf).is_err(),
        "no newline needed to refuse"
    );
}

#[test]
fn trainer_channel_events_and_frames_round_trip() {
    use crate::protocol::{KnobName, KnobVia, MetricsReport};
    let events = [
        NodeEvent::Trainer {
            run: "r".into(),
            attached: true,
            pid: Some(7),
            rank: None,
        },
        NodeEvent::KnobChanged {
            run: "r".into(),
            change: 3,
            knob: KnobName::BatchSize,
            old: Some(64),
            new: 128,
            via: KnobVia::Trainer,
            by: "alice".into(),
            why: None,
        },
        NodeEvent::KnobApplied {
            run: "r".into(),
            change: 3,
            knob: KnobName::BatchSize,
            value: 128,
            rtt_ms: 2.5,
            ranks: None,
            step: None,
        },
        NodeEvent::KnobRejected {
            run: "r".into(),
            change: 4,
            knob: KnobName::Prefetch,
            value: 9,
            kept: Some(2),
            reason: "no".into(),
            rtt_ms: 1.0,
            rank: None,
        },
        NodeEvent::TrainerError {
            run: "r".into(),
            kind: "oom".into(),
            message: None,
        },
    ];
    for event in events {
        // The record's own `seq` must not collide with a field of the event.
        let rec = NodeEventRecord {
            seq: 11,
            time: "2026-11-30T04:07:55.652Z".into(),
            event,
        };
        let line = encode(&rec);
        assert_eq!(
            decode::<NodeEventRecord>(&line, MAX_REPLY_FRAME).unwrap(),
            rec,
            "{line}"
        );
    }
    let frame = decode::<ClientFrame>(
        r#"{"id":3,"type":"metrics","step":120,"loss":2.31,"batch_size":64,"extra":{"lr":0.01}}"#,
        MAX_REQUEST_FRAME,
    )
    .unwrap();
    let Request::Metrics(MetricsReport {
        step,
        loss,
        batch_size,
        extra,
        ..
    }) = frame.request
    else {
        panic!("{frame:?}")
    };
    assert_eq!((step, loss, batch_size), (Some(120), Some(2.31), Some(64)));
    assert_eq!(extra["lr"], 0.01);
    let frame = decode::<ClientFrame>(
        r#"{"id":4,"type":"knob_ack","seq":7,"applied":false,"reason":"too big"}"#,
        MAX_REQUEST_FRAME,
    )
    .unwrap();
    assert_eq!(
        frame.request,
        Request::KnobAck {
            seq: 7,
            applied: false,
            reason: Some("too big".into()),
            step: None,
        }
    );
}

/// A snapshot with most fields filled (and some absent), as a push carries it.
fn a_snapshot_push() -> ServerFrame {
    use crate::telemetry::{GpuProcess, GpuSample, HostSample, NodeInfo};
    let gpu = |i: u32| GpuSample {
        index: i,
        name: Some("NVIDIA H100 80GB HBM3".into()),
        uuid: Some(format!("GPU-{i}")),
        time_s: 1_796_008_500.5,
        util_gpu_pct: Some(97.0),
        memory_used_bytes: Some(30 << 30),
        memory_total_bytes: Some(80 << 30),
        temperature_c: Some(71.0),
        power_w: Some(690.291),
        power_limit_w: Some(700.0),
        throttle_reasons: Some(4),
        stale: i == 1,
        processes: Some(vec![GpuProcess {
            pid: 4200 + i,
            name: Some("python3 \"train.py\" é".into()),
            used_memory_bytes: Some(30 << 30),
            owner: None,
        }]),
        ..GpuSample::default()
    };
    ServerFrame {
        id: None,
        response: Response::Telemetry {
            snapshot: Box::new(Snapshot {
                time_s: 1_796_008_500.75,
                node: NodeInfo {
                    hostname: "gpu-node-07".into(),
                    source: "nvml".into(),
                    driver_version: Some("550.54.15".into()),
                    ..NodeInfo::default()
                },
                gpus: (0..3).map(gpu).collect(),
                host: Some(HostSample {
                    cpu_pct: Some(12.5),
                    ..HostSample::default()
                }),
            }),
        },
    }
}

#[test]
fn server_frames_decode_the_same_by_the_short_way_for_snapshots() {
    let push = a_snapshot_push();
    let line = encode(&push);
    assert!(
        line.starts_with(r#"{"type":"telemetry","snapshot":"#),
        "{line}"
    );
    assert!(
        snapshot_push(line.trim_end()).is_some(),
        "read the short way"
    );
    assert_eq!(decode_server_frame(&line, MAX_REPLY_FRAME).unwrap(), push);
    assert_eq!(
        decode_server_frame(&line, MAX_REPLY_FRAME).unwrap(),
        decode::<ServerFrame>(&line, MAX_REPLY_FRAME).unwrap()
    );
    // Answers carrying a snapshot, other pushes and errors go the general way, unchanged.
    let answer = ServerFrame {
        id: Some(7),
        ..push.clone()
    };
    assert_eq!(
        decode_server_frame(&encode(&answer), MAX_REPLY_FRAME).unwrap(),
        answer
    );
    let shutdown = ServerFrame {
        id: None,
        response: Response::Shutdown {
            reason: "bye".into(),
        },
    };
    assert_eq!(
        decode_server_frame(&encode(&shutdown), MAX_REPLY_FRAME).unwrap(),
        shutdown
    );
    // A push with a field this client does not know is still read (the general way ignores it).
    let extra = line.replacen(
        r#"{"type":"telemetry","#,
        r#"{"type":"telemetry","from":"a newer daemon","#,
        1,
    );
    assert_eq!(decode_server_frame(&extra, MAX_REPLY_FRAME).unwrap(), push);
    assert!(snapshot_push(extra.trim_end()).is_none());
    assert!(snapshot_push(encode(&answer).trim_end()).is_none());
    assert!(matches!(
        decode_server_frame(&line, 10),
        Err(FrameError::TooLong { max: 10 })
    ));
    assert!(decode_server_frame("{\"type\":\"telemetry\",}", MAX_REPLY_FRAME).is_err());
}
