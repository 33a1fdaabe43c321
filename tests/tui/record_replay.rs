//! End to end: `gpupilot record` takes 60 s of a simulated node (2 GPUs, a daemon at 1 Hz)
//! with a training run whose batch size changes halfway, and `gpupilot replay --speed 10` in a
//! tmux pane shows the same GPUs, the run, and the change at the moment it happened in the
//! recording; a knob key there is refused, because it is a recording. Then the replay's feed
//! on a file written by hand (pause, seeks both ways, a refusal, the end), and the bad cases:
//! a file cut off mid-write, one that is not a recording, one from a newer format, a full disk.
//!
//! A temporary GPUPILOT_HOME and `--source sim` keep it off the machine's GPUs and daemon;
//! every wait is bounded.

use std::time::{Duration, Instant};

use gpupilot::protocol::KnobName;
use gpupilot::recording::{Ending, Item, Reader};

use crate::support::home::Home;
use crate::support::tmux::{PROMPT, Tmux};
use crate::support::wait::{finish, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_gpupilot");
/// How long the node is recorded, and when (seconds into it) the knob changes.
const RECORD_S: u64 = 60;
const CHANGE_AT_S: u64 = 30;

fn profile(home: &Home) -> String {
    let body = format!(
        r#"name = "rec"
[run]
command = ["{BIN}", "synthetic-train", "--speed", "4"]
[knobs.batch_size]
initial = 256
min = 8
max = 4096
"#
    );
    let path = home.dir.path().join("rec.toml");
    std::fs::write(&path, body).unwrap();
    path.display().to_string()
}

/// The replay's position in the header (`+0:42` → 42), and the batch size the Run view's knob
/// panel shows (`batch_size 256`; the value in use, before any `→`).
fn read_screen(s: &str) -> (Option<u64>, Option<i64>) {
    let pos = s.lines().next().and_then(|l| {
        let at = l.find(" +")? + 2;
        let rest = &l[at..];
        let end = rest.find(' ')?;
        let (m, sec) = rest[..end].split_once(':')?;
        Some(m.parse::<u64>().ok()? * 60 + sec.parse::<u64>().ok()?)
    });
    let batch = s.lines().find_map(|l| {
        let at = l.find("b batch_size ")? + "b batch_size ".len();
        let digits: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    });
    (pos, batch)
}

#[test]
fn a_recorded_minute_replays_at_ten_times_with_the_knob_change_in_its_place() {
    let home = Home::new();
    let _daemon = home.daemon(&["--rate", "1"]);
    let run = home
        .ok(&["run", "--detach", &profile(&home)])
        .trim()
        .to_string();
    let c = home.client();
    wait_for("the trainer to report", Duration::from_secs(20), || {
        c.run_metrics(&run, 0)
            .is_ok_and(|m| m.trainer.attached && !m.points.is_empty())
    });

    let file = home.dir.path().join("node.gprec");
    let file_s = file.display().to_string();
    let for_s = format!("{RECORD_S}s");
    let recorder = home
        .gpupilot(&["record", "--out", &file_s, "--for", &for_s])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(CHANGE_AT_S));
    let set = home.ok(&["set", &run, "batch-size", "512"]);
    assert!(set.contains("512"), "{set}");
    let out = finish(
        recorder,
        "gpupilot record",
        Duration::from_secs(RECORD_S + 20),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("recording node") && stderr.contains("recorded 1m"),
        "{stderr}"
    );
    assert!(started.elapsed() >= Duration::from_secs(RECORD_S));

    // What the file holds: a minute, both GPUs, the run, and when the change took hold.
    let mut r = Reader::open(&file).unwrap();
    let start = r.header().started_s;
    let (mut gpus, mut runs_seen, mut applied_at) = (0, false, None);
    while let Some((t, item)) = r.next_item() {
        match item {
            Item::Snapshot(s) => gpus = s.gpus.len(),
            Item::Runs(rs) => runs_seen |= rs.iter().any(|x| x.id == run),
            Item::Trainer { run: x, trainer } if x == run && applied_at.is_none() => {
                let k = trainer.knobs.iter().find(|k| k.knob == KnobName::BatchSize);
                if k.is_some_and(|k| k.value == Some(512)) {
                    applied_at = Some(t - start);
                }
            }
            _ => {}
        }
    }
    assert_eq!(r.ending(), Some(&Ending::Complete));
    assert_eq!(gpus, 2);
    assert!(runs_seen);
    let applied_at = applied_at.expect("the change in the recording");
    assert!(
        (CHANGE_AT_S as f64 - 2.0..CHANGE_AT_S as f64 + 5.0).contains(&applied_at),
        "the change was recorded {applied_at:.1} s in, asked at {CHANGE_AT_S} s"
    );
    let size = std::fs::metadata(&file).unwrap().len();
    assert!(size < 200_000, "a minute of 2 GPUs took {size} bytes");

    // The replay, ten times as fast, in a terminal.
    let tmux = Tmux::start(&home.root());
    tmux.wait_text(PROMPT);
    tmux.type_line(&format!("'{BIN}' replay '{file_s}' --speed 10"));
    tmux.wait_screen("the replay with both GPUs", |s| {
        s.contains("replay node.gprec") && s.contains("2 GPUs") && s.contains("(simulated)")
    });
    tmux.keys(&["3"]);
    // Watch the knob panel as the replay passes the change.
    let mut before = Vec::new();
    let mut first_after = None;
    let deadline = Instant::now() + Duration::from_secs(RECORD_S / 10 + 20);
    while first_after.is_none() && Instant::now() < deadline {
        let screen = tmux.screen();
        if let (Some(pos), Some(batch)) = read_screen(&screen) {
            assert!(screen.contains(&run), "the run in the Run view:\n{screen}");
            match batch {
                256 => before.push(pos),
                512 => first_after = Some((pos, screen)),
                other => panic!("batch size {other} on screen:\n{screen}"),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (pos, screen) = first_after.expect("the knob change on screen");
    assert!(
        before.iter().any(|p| *p + 5 < applied_at as u64),
        "the old value was shown before the change: {before:?}"
    );
    assert!(
        before.iter().all(|p| (*p as f64) <= applied_at + 1.0),
        "the old value only before the change ({applied_at:.1} s): {before:?}"
    );
    assert!(
        (pos as f64) >= applied_at - 1.0 && (pos as f64) <= applied_at + 3.0,
        "the new value appeared at +{pos} s, the change is at {applied_at:.1} s:\n{screen}"
    );

    // Knobs are not for changing here.
    tmux.keys(&["b"]);
    tmux.wait_text("this is a recording");
    // It plays to its end and says so; the Events view has the change.
    tmux.wait_screen("the end of the recording", |s| s.contains("ends at +1:0"));
    tmux.keys(&["4"]);
    tmux.wait_screen("the change and its acknowledgement", |s| {
        s.contains("batch size 256 → 512") && s.contains("batch size = 512 applied")
    });
    tmux.keys(&["q"]);
    tmux.wait_prompt();

    // The same file cut off two thirds in (as a killed recorder or a full disk leaves it):
    // it plays what is there and says where it ends.
    let bytes = std::fs::read(&file).unwrap();
    let cut = home.dir.path().join("cut.gprec");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    tmux.type_line(&format!(
        "clear; '{BIN}' replay '{}' --speed 50",
        cut.display()
    ));
    let end = tmux.wait_screen("the cut-off end", |s| s.contains("cut off at +"));
    let (pos, _) = read_screen(&end);
    assert!(
        pos.is_some_and(|p| (10..RECORD_S - 5).contains(&p)),
        "it ends inside the minute: {pos:?}\n{end}"
    );
    tmux.keys(&["q"]);
    tmux.wait_prompt();
}

/// A writer whose disk fills after `room` bytes.
struct FullDisk {
    room: usize,
}

impl std::io::Write for FullDisk {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() > self.room {
            return Err(std::io::Error::from_raw_os_error(28));
        }
        self.room -= buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_full_disk_stops_the_recorder_and_not_the_daemon() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let c = home.client();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let started = Instant::now();
    let result = gpupilot::client::record::record(
        &c,
        FullDisk { room: 4096 },
        Some(Duration::from_secs(30)),
        &stop,
        |_| {},
    );
    let Err(gpupilot::client::record::RecordError::Write(e)) = result else {
        panic!("{:?}", result.map(|r| r.0))
    };
    assert!(e.to_string().contains("No space left"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "it stopped at once"
    );
    // The daemon goes on.
    assert!(home.client().status().is_ok());
}

#[test]
fn bad_recordings_are_named_before_the_console_starts() {
    let home = Home::new();
    let junk = home.dir.path().join("notes.txt");
    std::fs::write(&junk, "not a recording\n").unwrap();
    let out = home.run(
        &["replay", &junk.display().to_string()],
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("notes.txt is not a gpupilot recording"),
        "{err}"
    );

    // A recording from a later format: both versions named.
    let newer = home.dir.path().join("newer.gprec");
    let mut bytes = gpupilot::recording::MAGIC.to_vec();
    bytes.extend_from_slice(&(gpupilot::recording::FORMAT + 1).to_le_bytes());
    bytes.push(5);
    bytes.extend_from_slice(b"9.9.9");
    std::fs::write(&newer, bytes).unwrap();
    let out = home.run(
        &["replay", &newer.display().to_string()],
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("recorded by gpupilot 9.9.9 in recording format 2")
            && err.contains(&format!("this gpupilot ({})", env!("CARGO_PKG_VERSION"))),
        "{err}"
    );
}

/// A recording of `n` seconds of one GPU whose temperature is its second, written by hand.
fn recording(path: &std::path::Path, n: u32) -> f64 {
    use gpupilot::recording::{Header, Writer};
    use gpupilot::telemetry::{GpuSample, Snapshot};
    let t0 = 1_800_000_000.0;
    let f = std::fs::File::create(path).unwrap();
    let header = Header {
        node: "n1".into(),
        started_s: t0,
        rate_hz: 1.0,
    };
    let mut w = Writer::new(f, &header).unwrap();
    for i in 0..n {
        let t = t0 + f64::from(i);
        let snap = Snapshot {
            time_s: t,
            gpus: vec![GpuSample {
                index: 0,
                time_s: t,
                temperature_c: Some(f64::from(i)),
                ..Default::default()
            }],
            ..Default::default()
        };
        w.write(t, &Item::Snapshot(Box::new(snap))).unwrap();
    }
    w.finish(t0 + f64::from(n)).unwrap();
    t0
}

/// The temperature of the newest snapshot among `updates`: the second the replay is at.
fn second_of(u: &gpupilot::tui::feed::Update) -> Option<f64> {
    match u {
        gpupilot::tui::feed::Update::Snapshot(s) => s.gpus[0].temperature_c,
        _ => None,
    }
}

#[test]
fn a_replay_pauses_seeks_both_ways_refuses_changes_and_stops_at_its_end() {
    use crate::support::feed::Reader as Updates;
    use gpupilot::tui::feed::replay::{REFUSED, Replay};
    use gpupilot::tui::feed::{DataSource, Link, Request, Update};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.gprec");
    recording(&path, 120);
    let replay = Replay::open(&path, 1.0).unwrap();
    let clock = replay.clock.clone();
    let mut r = Updates::new(
        DataSource::Replay(Box::new(replay)).start(Duration::from_secs(1)),
        Duration::from_secs(10),
    );
    r.until("the first snapshot", |u| second_of(u) == Some(0.0));

    // Paused, the clock stands still.
    r.send(Request::ReplayPause);
    r.until("paused", |u| {
        matches!(u, Update::Link(Link::Replay { paused: true, .. }))
    });
    let at = clock.now();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(clock.now(), at);

    // 30 s on: the console forgets, then gets the state 30 s on (the snapshot of that second
    // last, after the history that leads to it).
    r.send(Request::ReplaySeek(30));
    r.until("the rewind", |u| matches!(u, Update::Rewind));
    let on = r.until("the snapshot after the seek", |u| second_of(u).is_some());
    let s = second_of(&on).unwrap();
    assert!((29.0..=31.0).contains(&s), "at second {s}");
    assert!((clock.now() - (1_800_000_000.0 + s)).abs() <= 1.0);

    // 20 s back: read again from the start; the history reaches back to the start.
    r.send(Request::ReplaySeek(-20));
    r.until("the rewind", |u| matches!(u, Update::Rewind));
    let mut oldest = None;
    let back = r.until("the snapshot after the seek back", |u| {
        if let Update::Backfill(series) = u {
            oldest = series
                .iter()
                .filter_map(|s| s.points.first())
                .map(|p| p.t)
                .reduce(f64::min);
        }
        second_of(u).is_some()
    });
    let s = second_of(&back).unwrap();
    assert!((9.0..=11.0).contains(&s), "at second {s}");
    assert!(
        oldest.is_some_and(|t| (t - 1_800_000_000.0).abs() < 1.0),
        "the charts from the start: {oldest:?}"
    );

    // Nothing changes a node from a recording.
    r.send(Request::Stop("x".into()));
    let refused = r.until("the refusal", |u| matches!(u, Update::Answer { .. }));
    assert_eq!(
        refused,
        Update::Answer {
            ok: false,
            text: REFUSED.into()
        }
    );

    // Past the end: it stops there and says so.
    r.send(Request::ReplaySeek(1000));
    r.until(
        "the end",
        |u| matches!(u, Update::Link(Link::Replay { end: Some(e), .. }) if e == "ends at +2:00"),
    );
    let end = clock.now();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(clock.now(), end, "the clock stops at the end");
}
