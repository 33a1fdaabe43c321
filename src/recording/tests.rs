use super::codec::{build, leaves};
use super::*;
use crate::telemetry::{GpuSample, HostSample, NodeInfo};
use serde_json::json;

const T0: f64 = 1_800_000_000.0;

fn header() -> Header {
    Header {
        node: "gpu-node-07".into(),
        started_s: T0,
        rate_hz: 1.0,
    }
}

/// Two GPUs at second `i`: power, temperature and energy move, the rest stays.
fn snapshot(i: u32) -> Snapshot {
    let gpu = |g: u32| GpuSample {
        index: g,
        name: Some("NVIDIA H100 80GB HBM3".into()),
        uuid: Some(format!("GPU-{g}")),
        time_s: T0 + f64::from(i),
        util_gpu_pct: Some(90.0 + f64::from(i % 7)),
        temperature_c: Some(60.0 + f64::from(i) * 0.37),
        power_w: Some(512.25 + f64::from(i * 13 % 17) * 1.5),
        power_limit_w: Some(700.0),
        energy_j: Some(1.0e6 + f64::from(i) * 600.0),
        memory_used_bytes: Some(40 << 30),
        memory_total_bytes: Some(80 << 30),
        sm_clock_mhz: Some(1980 - i % 3),
        processes: Some(if i % 2 == 0 {
            // Through JSON: the fields a process has beyond these are optional.
            vec![
                serde_json::from_value(json!({
                    "pid": 4242, "name": "python3", "used_memory_bytes": 39u64 << 30
                }))
                .unwrap(),
            ]
        } else {
            Vec::new()
        }),
        ..Default::default()
    };
    Snapshot {
        time_s: T0 + f64::from(i),
        node: NodeInfo {
            hostname: "gpu-node-07".into(),
            source: "sim".into(),
            ..Default::default()
        },
        gpus: vec![gpu(0), gpu(1)],
        host: Some(HostSample {
            cpu_pct: Some(12.5),
            ..Default::default()
        }),
    }
}

fn run_info(uptime: f64) -> RunInfo {
    serde_json::from_value(json!({
        "id": "20270115-080000-train", "name": "train", "status": "running", "pid": 51234,
        "attempt": 0, "restarts": 0, "started_at": "2027-01-15T08:00:00.000Z", "ended_at": null,
        "uptime_s": uptime, "exit_code": null, "signal_name": null, "description": null,
        "command": ["python3", "train.py"], "cwd": "/tmp", "gpus": "all", "adopted": false,
        "dir": "/tmp/runs/x"
    }))
    .unwrap()
}

fn event() -> NodeEventRecord {
    serde_json::from_value(json!({
        "seq": 7, "time": "2027-01-15T08:00:30.000Z", "event": "knob_applied",
        "run": "20270115-080000-train", "change": 1, "knob": "batch_size", "value": 512,
        "rtt_ms": 7.5
    }))
    .unwrap()
}

fn point(n: u64) -> MetricsPoint {
    serde_json::from_value(json!({"n": n, "t": T0 + n as f64, "from": "trainer",
        "step": n * 10, "loss": 2.0 / (n as f64 + 1.0), "batch_size": 256}))
    .unwrap()
}

/// A minute of a node: snapshots every second, the run list, a knob change and its reports.
fn items() -> Vec<(f64, Item)> {
    let mut out = Vec::new();
    for i in 0..60 {
        let t = T0 + f64::from(i);
        out.push((t, Item::Snapshot(Box::new(snapshot(i)))));
        if i % 5 == 0 {
            out.push((t + 0.2, Item::Runs(vec![run_info(f64::from(i))])));
            out.push((
                t + 0.3,
                Item::Metrics {
                    run: "20270115-080000-train".into(),
                    points: vec![point(u64::from(i)), point(u64::from(i) + 1)],
                },
            ));
        }
        if i == 30 {
            out.push((t + 0.5, Item::Event(Box::new(event()))));
            out.push((
                t + 0.6,
                Item::Trainer {
                    run: "20270115-080000-train".into(),
                    trainer: Box::new(TrainerInfo {
                        attached: true,
                        pid: Some(5120),
                        ..Default::default()
                    }),
                },
            ));
            out.push((t + 0.7, Item::Control(Box::default())));
        }
    }
    out
}

fn record(items: &[(f64, Item)], finish: bool) -> Vec<u8> {
    let mut w = Writer::new(Vec::new(), &header()).unwrap();
    for (t, item) in items {
        w.write(*t, item).unwrap();
    }
    if finish {
        w.finish(T0 + 60.0).unwrap()
    } else {
        // What a killed recorder leaves: what its flushes handed down.
        w.flush().unwrap();
        w.get_ref().clone()
    }
}

fn read_all(bytes: &[u8]) -> (Vec<(f64, Item)>, Option<Ending>) {
    let mut r = Reader::new(bytes, "test.gprec").unwrap();
    let mut out = Vec::new();
    while let Some(x) = r.next_item() {
        out.push(x);
    }
    (out, r.ending().cloned())
}

#[test]
fn what_is_written_reads_back_the_same() {
    let items = items();
    let bytes = record(&items, true);
    let r = Reader::new(bytes.as_slice(), "test.gprec").unwrap();
    assert_eq!(r.header(), &header());
    assert_eq!(r.origin().format, FORMAT);
    assert_eq!(r.origin().version, env!("CARGO_PKG_VERSION"));
    let (back, ending) = read_all(&bytes);
    assert_eq!(ending, Some(Ending::Complete));
    assert_eq!(back.len(), items.len());
    for ((t0, a), (t1, b)) in items.iter().zip(&back) {
        assert!((t0 - t1).abs() < 0.001, "{t0} vs {t1}");
        assert_eq!(a, b);
    }
}

#[test]
fn the_delta_encoding_pays() {
    let items = items();
    let bytes = record(&items, true);
    let json: usize = items
        .iter()
        .map(|(_, i)| match i {
            Item::Snapshot(s) => serde_json::to_vec(s).unwrap().len(),
            _ => 0,
        })
        .sum();
    // A minute of two GPUs: far below the JSON the daemon sends for the same snapshots.
    assert!(
        bytes.len() * 10 < json,
        "{} bytes recorded for {json} bytes of snapshot JSON",
        bytes.len()
    );
}

#[test]
fn a_file_cut_off_plays_to_its_last_flush_and_says_so() {
    let items = items();
    let whole = record(&items, true);
    // Cut at every point past the header: never a panic, always a prefix of what was written,
    // and "cut off" unless the cut is past the end mark.
    let at = MAGIC.len() + 3 + env!("CARGO_PKG_VERSION").len();
    let head = u32::from_le_bytes(whole[at..at + 4].try_into().unwrap()) as usize;
    let start = at + 4 + head;
    let mut longest = 0;
    for cut in (start..whole.len()).step_by(7) {
        let (back, ending) = read_all(&whole[..cut]);
        assert!(
            matches!(ending, Some(Ending::CutOff { .. })),
            "cut at {cut}: {ending:?}"
        );
        assert!(back.len() <= items.len());
        for ((_, a), (_, b)) in items.iter().zip(&back) {
            assert_eq!(a, b, "cut at {cut}");
        }
        longest = longest.max(back.len());
    }
    assert!(
        longest > items.len() / 2,
        "most of it reads back: {longest}"
    );

    // A recorder that stopped without closing: everything up to its last flush reads.
    let open = record(&items, false);
    let (back, ending) = read_all(&open);
    assert_eq!(back.len(), items.len());
    let Some(Ending::CutOff { why }) = ending else {
        panic!("{ending:?}")
    };
    assert!(why.contains("without the end mark"), "{why}");
}

#[test]
fn a_newer_format_names_both_versions() {
    let mut bytes = record(&items()[..3], true);
    bytes[8..10].copy_from_slice(&(FORMAT + 1).to_le_bytes());
    let e = Reader::new(bytes.as_slice(), "new.gprec").err().unwrap();
    let text = e.to_string();
    assert!(matches!(e, RecordingError::Newer { .. }), "{text}");
    assert!(
        text.contains(&format!("recording format {}", FORMAT + 1))
            && text.contains(&format!("formats up to {FORMAT}"))
            && text.contains(env!("CARGO_PKG_VERSION")),
        "{text}"
    );
}

#[test]
fn garbage_is_not_a_recording() {
    for bytes in [
        &b""[..],
        b"hello",
        b"{\"seq\": 1}\n{\"seq\": 2}\n",
        b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
    ] {
        let e = Reader::new(bytes, "x.txt").err().unwrap();
        assert!(
            matches!(e, RecordingError::NotARecording { .. }),
            "{bytes:?}: {e}"
        );
        assert_eq!(
            e.to_string(),
            "x.txt is not a gpupilot recording (it does not start as one)"
        );
    }
    // The right start, then damage: the header says so; damage in the stream ends the replay
    // there, without a panic.
    let mut bytes = record(&items()[..10], true);
    let at = MAGIC.len() + 3 + env!("CARGO_PKG_VERSION").len();
    bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = Reader::new(bytes.as_slice(), "x").err().unwrap();
    assert!(matches!(e, RecordingError::BadHeader { .. }), "{e}");
    let mut bytes = record(&items()[..40], true);
    let n = bytes.len();
    for b in &mut bytes[n / 2..n / 2 + 40] {
        *b ^= 0x5a;
    }
    let (back, ending) = read_all(&bytes);
    assert!(back.len() < 40);
    assert!(matches!(ending, Some(Ending::CutOff { .. })), "{ending:?}");
}

#[test]
fn leaves_put_any_value_together_again() {
    for v in [
        json!(null),
        json!(3),
        json!({"a": [1, {"b": null, "c": []}, {}], "d": "x", "e": 1.5, "f": u64::MAX}),
        json!([[], [[]], [null, true, -7]]),
    ] {
        let l = leaves(&v);
        let back = build(l.iter().map(|(p, x)| (p.as_slice(), x))).unwrap();
        assert_eq!(back, v);
    }
}
