//! The daemon over its socket: handshake, status, history, subscriptions, bad frames, one
//! daemon per home, file modes, read-only mode, and a clean SIGTERM.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::support::home::{Home, Raw};
use crate::support::wait::wait_for;
use gpupilot::client::{Client, ClientError, Push};
use gpupilot::history::Metric;
use gpupilot::protocol::{ErrorCode, MAX_REQUEST_FRAME, Request, Response};
use gpupilot::telemetry::now_s;
use rustix::process::Signal;

#[test]
fn handshake_status_and_history() {
    let home = Home::new();
    let d = home.daemon(&[]);
    let client = home.client();
    assert_eq!(client.welcome().daemon_pid, d.pid());
    assert_eq!(client.welcome().version, gpupilot::protocol::VERSION);
    assert!(!client.welcome().readonly);

    let status = client.status().unwrap();
    assert_eq!(status.daemon.pid, d.pid());
    assert_eq!(status.telemetry.source.as_deref(), Some("sim"));
    assert_eq!(status.telemetry.gpus, 2);
    assert_eq!(status.telemetry.rate_hz, 10.0);
    let snap = status.snapshot.expect("a snapshot");
    assert_eq!(snap.gpus.len(), 2);
    assert_eq!(snap.node.source, "sim");
    assert!(snap.gpus.iter().all(|g| g.power_w.is_some_and(|p| p > 0.0)));
    assert_eq!(status.runs.total, 0);
    assert_eq!(status.daemon.socket, home.socket());

    // At 10 Hz, a second gives the history a handful of points.
    wait_for("history points", Duration::from_secs(10), || {
        let pts = client
            .history(1, Metric::Power, now_s() - 60.0, now_s() + 1.0, 100)
            .unwrap();
        pts.len() >= 3
    });
    let pts = client
        .history(1, Metric::Temperature, now_s() - 60.0, now_s() + 1.0, 2)
        .unwrap();
    assert!(!pts.is_empty() && pts.len() <= 2, "{pts:?}");
    assert!(
        pts.iter()
            .all(|p| p.min <= p.mean && p.mean <= p.max && p.mean > 0.0)
    );
    let none = client
        .history(7, Metric::Power, now_s() - 60.0, now_s(), 100)
        .unwrap();
    assert!(none.is_empty(), "no GPU 7: no points, not zeros");

    // Requests sent together are answered in their order, an error in its place.
    let history = |gpu, metric| Request::History {
        gpu,
        metric,
        from: now_s() - 60.0,
        to: now_s() + 1.0,
        max_points: 1,
    };
    let answers = client
        .request_all(vec![
            history(1, Metric::Power),
            Request::Runs {
                run: Some("no-such-run".into()),
                live: false,
            },
            Request::Runs {
                run: None,
                live: false,
            },
            history(0, Metric::Temperature),
        ])
        .unwrap();
    assert_eq!(answers.len(), 4);
    let series = |a: &Result<Response, ClientError>| match a {
        Ok(Response::History {
            gpu,
            metric,
            points,
        }) if points.len() == 1 => Some((*gpu, *metric)),
        _ => None,
    };
    assert_eq!(
        series(&answers[0]),
        Some((1, Metric::Power)),
        "{:?}",
        answers[0]
    );
    assert!(
        matches!(
            &answers[1],
            Err(ClientError::Daemon {
                code: ErrorCode::UnknownRun,
                ..
            })
        ),
        "{:?}",
        answers[1]
    );
    assert!(
        matches!(&answers[2], Ok(Response::Runs { runs }) if runs.is_empty()),
        "{:?}",
        answers[2]
    );
    assert_eq!(
        series(&answers[3]),
        Some((0, Metric::Temperature)),
        "{:?}",
        answers[3]
    );
}

#[test]
fn subscriptions_push_snapshots_and_events() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let client = home.client();
    client.subscribe(true, true).unwrap();
    let mut snapshots = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while snapshots < 3 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match client
            .updates()
            .recv_timeout(left)
            .expect("pushed snapshots")
        {
            Push::Telemetry(s) => {
                assert_eq!(s.gpus.len(), 2);
                snapshots += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // A change made through another connection is pushed as a node event.
    let other = home.client();
    let run = other
        .start_run(
            gpupilot::profile::Profile::from_command(vec!["true".into()]),
            gpupilot::supervisor::Caller::current().unwrap(),
            Default::default(),
            Some("test".into()),
        )
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if let Push::Event(e) = client.updates().recv_timeout(left).expect("an event") {
            let v = serde_json::to_value(&e).unwrap();
            assert_eq!(v["event"], "run_started");
            assert_eq!(v["run"], run.id.as_str());
            assert_eq!(v["why"], "test");
            assert!(v["by"].as_str().unwrap().contains("uid "), "{v}");
            break;
        }
    }
}

/// The next telemetry push on `r` as its line (other frames skipped).
fn next_push(r: &mut Raw) -> String {
    use std::io::BufRead;
    loop {
        let mut line = String::new();
        assert!(
            r.reader.read_line(&mut line).unwrap() > 0,
            "the daemon closed"
        );
        if line.starts_with("{\"type\":\"telemetry") {
            return line;
        }
    }
}

#[test]
fn a_subscriber_that_asks_for_deltas_rebuilds_every_snapshot_a_whole_subscriber_gets() {
    rebuilds_every_snapshot(false);
}

/// The same through a dedicated subscription, which the sampler's thread writes to itself.
#[test]
fn a_dedicated_subscriber_rebuilds_every_snapshot_a_whole_subscriber_gets() {
    rebuilds_every_snapshot(true);
}

fn rebuilds_every_snapshot(dedicated: bool) {
    use gpupilot::protocol::Response;
    use gpupilot::protocol::delta::SnapshotStream;
    use gpupilot::telemetry::Snapshot;
    use std::collections::HashMap;

    let home = Home::new();
    let _d = home.daemon(&[]);
    let subscribe = |delta: bool| {
        let mut r = Raw::connect(&home.socket());
        assert_eq!(r.hello()["type"], "welcome");
        let dedicated = delta && dedicated;
        r.send(
            format!(
                "{{\"id\":2,\"type\":\"subscribe\",\"telemetry\":true,\"delta\":{delta},\
                 \"dedicated\":{dedicated}}}\n"
            )
            .as_bytes(),
        )
        .unwrap();
        r
    };
    // The whole subscriber reads all along, on a thread, until the other has done.
    let mut whole = subscribe(false);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            let mut seen: HashMap<u64, (Snapshot, usize)> = HashMap::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) && seen.len() < 400 {
                let line = next_push(&mut whole);
                let f: gpupilot::protocol::ServerFrame =
                    gpupilot::protocol::decode(&line, usize::MAX).unwrap();
                let Response::Telemetry { snapshot } = f.response else {
                    panic!("{line}")
                };
                seen.insert(snapshot.time_s.to_bits(), (*snapshot, line.len()));
            }
            seen
        })
    };
    let mut changes = subscribe(true);
    let mut stream = SnapshotStream::default();
    let mut rebuilt: Vec<(Snapshot, usize)> = Vec::new();
    let mut kinds = Vec::new();
    let mut read_changes = |r: &mut Raw, n: usize| {
        for _ in 0..n {
            let line = next_push(r);
            kinds.push(line.starts_with("{\"type\":\"telemetry_delta\""));
            match stream.decode(&line, usize::MAX).unwrap().response {
                Response::Telemetry { snapshot } => rebuilt.push((*snapshot, line.len())),
                other => panic!("{other:?}"),
            }
        }
    };
    // 10 Hz: twenty pushes, a pause of two seconds (the daemon skips the snapshots this
    // connection does not read), twenty more.
    read_changes(&mut changes, 20);
    std::thread::sleep(Duration::from_secs(2));
    read_changes(&mut changes, 20);
    assert!(!kinds[0], "the first push is whole");
    assert!(kinds[1..].iter().all(|&d| d), "then changes: {kinds:?}");
    // One more period, so the whole subscriber has the last one too.
    std::thread::sleep(Duration::from_millis(300));
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = reader.join().unwrap();

    let mut matched = 0;
    let (mut delta_bytes, mut whole_bytes) = (0, 0);
    for (i, (s, len)) in rebuilt.iter().enumerate() {
        if let Some((w, wlen)) = seen.get(&s.time_s.to_bits()) {
            assert_eq!(s, w, "push {i} rebuilt differs from the whole snapshot");
            matched += 1;
            if i > 0 {
                delta_bytes += len;
                whole_bytes += wlen;
            }
        }
    }
    assert!(matched >= 30, "only {matched} snapshots seen by both");
    assert!(
        delta_bytes * 2 < whole_bytes,
        "changes took {delta_bytes} bytes against {whole_bytes} whole"
    );
}

#[test]
fn version_mismatch_and_missing_hello_close_the_connection() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let mut raw = Raw::connect(&home.socket());
    raw.send(b"{\"id\":1,\"type\":\"hello\",\"version\":999,\"client\":\"future\"}\n")
        .unwrap();
    let err = raw.recv().expect("an error frame");
    assert_eq!(err["id"], 1);
    assert_eq!(err["type"], "error");
    assert_eq!(err["code"], "version_mismatch");
    let msg = err["message"].as_str().unwrap();
    assert!(
        msg.contains("speaks version 1") && msg.contains("999"),
        "{msg}"
    );
    assert!(raw.recv().is_none(), "closed after the mismatch");

    let mut raw = Raw::connect(&home.socket());
    raw.send(b"{\"id\":4,\"type\":\"runs\"}\n").unwrap();
    let err = raw.recv().unwrap();
    assert_eq!(err["code"], "handshake_required");
    assert_eq!(err["id"], 4);
    assert!(raw.recv().is_none());

    let mut raw = Raw::connect(&home.socket());
    let welcome = raw.hello();
    assert_eq!(welcome["type"], "welcome");
    assert_eq!(welcome["id"], 1);
    assert_eq!(welcome["version"], 1);
}

#[test]
fn malformed_and_oversized_frames_close_only_their_connection() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let bystander = home.client();

    let mut raw = Raw::connect(&home.socket());
    raw.hello();
    raw.send(b"{\"id\":2,\"type\":\"runs\"\n").unwrap(); // not JSON: a brace is missing
    let err = raw.recv().unwrap();
    assert_eq!(err["code"], "bad_frame");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("closing the connection")
    );
    assert!(raw.recv().is_none(), "closed");

    let mut raw = Raw::connect(&home.socket());
    raw.hello();
    raw.send(b"{\"id\":3,\"type\":\"fly\"}\n").unwrap(); // JSON, but no such request
    let err = raw.recv().unwrap();
    assert_eq!(
        (err["code"].as_str(), err["id"].as_u64()),
        (Some("bad_frame"), Some(3))
    );
    assert!(raw.recv().is_none());

    let mut raw = Raw::connect(&home.socket());
    raw.hello();
    // More than a MiB with no newline: refused before the line ends. The daemon may close
    // while we are still writing, so a failed write is expected.
    let big = vec![b'x'; MAX_REQUEST_FRAME + 4096];
    let _ = raw.send(b"{\"id\":5,\"type\":\"runs\",\"pad\":\"");
    let _ = raw.send(&big);
    let err = raw.recv().expect("an error before the close");
    assert_eq!(err["code"], "bad_frame");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("longer than 1048576 bytes"),
        "{err}"
    );
    assert!(raw.recv().is_none());

    // The other client never noticed.
    assert!(bystander.runs().unwrap().is_empty());
    wait_for(
        "the closed connections to be gone",
        Duration::from_secs(5),
        || bystander.status().unwrap().daemon.clients == 1,
    );
    let log = std::fs::read_to_string(home.paths.state.join("daemon.log")).unwrap();
    assert!(log.contains("frame longer than 1048576 bytes"), "{log}");
    assert!(log.contains("closing the connection from"), "{log}");
}

#[test]
fn one_daemon_per_home_and_private_files() {
    let home = Home::new();
    let first = home.daemon(&[]);
    let out = home.run(&["daemon"], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "a gpupilot daemon is already running for GPUPILOT_HOME={} (pid {})",
            home.root().display(),
            first.pid()
        )),
        "{err}"
    );
    // --detach says the same before starting anything.
    let out = home.run(&["daemon", "--detach"], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("(pid {})", first.pid())));

    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&home.paths.runtime), 0o700);
    assert_eq!(mode(&home.socket()), 0o600);
    assert_eq!(mode(&home.paths.state), 0o700);
    // The first one still answers.
    assert_eq!(home.client().welcome().daemon_pid, first.pid());
}

#[test]
fn no_daemon_is_a_clear_message() {
    let home = Home::new();
    match Client::connect(&home.paths) {
        Err(e @ ClientError::NoDaemon { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!(
                    "no gpupilot daemon answers at {}",
                    home.socket().display()
                )) && msg.contains("gpupilot daemon --detach"),
                "{msg}"
            );
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("no daemon was started"),
    }
    let out = home.run(&["ps"], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no gpupilot daemon answers at"));
}

#[test]
fn readonly_refuses_changes_clearly() {
    let home = Home::new();
    let _d = home.daemon(&["--readonly"]);
    assert!(home.client().welcome().readonly);
    let out = home.run(&["run", "--detach", "--", "true"], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("this daemon is read-only (started with --readonly)"),
        "{err}"
    );
    let e = home
        .client()
        .stop_run("last", false, None, None)
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Readonly));
    // Watching still works.
    assert!(home.ok(&["ps"]).starts_with("ID"));
}

#[test]
fn sigterm_is_a_clean_exit_that_leaves_runs_running() {
    let home = Home::new();
    let mut d = home.daemon(&[]);
    let id = home
        .ok(&["run", "-d", "--", "sleep", "60"])
        .trim()
        .to_string();
    let client = home.client();
    client.subscribe(false, false).unwrap();
    let pid = client.run(&id).unwrap().pid.unwrap();
    let (status, _) = d.signal_and_wait(Signal::TERM);
    assert!(status.success(), "{status}");
    assert!(!home.socket().exists(), "socket removed");
    assert_eq!(
        gpupilot::daemon::lock_holder(&home.paths),
        None,
        "lock released"
    );
    // The connected client was told, then the connection closed.
    let mut saw_shutdown = false;
    while let Ok(u) = client.updates().recv_timeout(Duration::from_secs(5)) {
        match u {
            Push::Shutdown(_) => saw_shutdown = true,
            Push::Closed => break,
            _ => {}
        }
    }
    assert!(saw_shutdown);
    let rec = home.run_dir(&id).read_pid().unwrap().unwrap();
    assert_eq!(rec.pid, pid);
    assert!(
        gpupilot::supervisor::is_alive(&rec),
        "the run survives the daemon"
    );
    let last = home.node_events().pop().unwrap();
    assert_eq!(last["event"], "daemon_stopped");
    assert_eq!(last["reason"], "SIGTERM");
}

/// A dedicated subscriber is not read after its subscription (a request gets no answer, the
/// pushes go on), counts as a client until it closes, and is told when the daemon stops.
#[test]
fn a_dedicated_subscriber_is_read_no_more_is_counted_while_open_and_told_at_shutdown() {
    let home = Home::new();
    let mut d = home.daemon(&[]);
    let client = home.client();
    let clients = || client.status().unwrap().daemon.clients;
    let alone = clients();

    // Only for telemetry alone.
    let mut r = Raw::connect(&home.socket());
    assert_eq!(r.hello()["type"], "welcome");
    r.send(b"{\"id\":2,\"type\":\"subscribe\",\"telemetry\":true,\"events\":true,\"dedicated\":true}\n")
        .unwrap();
    let err = r.recv().unwrap();
    assert_eq!(
        (err["id"].as_u64(), err["code"].as_str()),
        (Some(2), Some("bad_request"))
    );
    drop(r);

    let mut r = Raw::connect(&home.socket());
    assert_eq!(r.hello()["type"], "welcome");
    r.send(
        b"{\"id\":2,\"type\":\"subscribe\",\"telemetry\":true,\"delta\":true,\"dedicated\":true}\n",
    )
    .unwrap();
    let mut answered = false;
    let mut pushes = 0;
    while pushes < 3 {
        let f = r.recv().expect("pushes");
        match f["type"].as_str() {
            Some("subscribed") => answered = true,
            Some("telemetry" | "telemetry_delta") => pushes += 1,
            other => panic!("{other:?}: {f}"),
        }
    }
    assert!(answered);
    wait_for("the subscriber counted", Duration::from_secs(5), || {
        clients() == alone + 1
    });
    // Not read: no answer comes, only pushes (10 Hz: a second is ten of them).
    r.send(b"{\"id\":3,\"type\":\"runs\"}\n").unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(1);
    while std::time::Instant::now() < until {
        let f = r.recv().expect("pushes");
        assert!(f["type"].as_str().unwrap().starts_with("telemetry"), "{f}");
    }

    // Closed: counted out at the next push.
    drop(r);
    wait_for("the subscriber counted out", Duration::from_secs(5), || {
        clients() == alone
    });

    // At shutdown it is told, as any client is.
    let mut r = Raw::connect(&home.socket());
    assert_eq!(r.hello()["type"], "welcome");
    r.send(b"{\"id\":2,\"type\":\"subscribe\",\"telemetry\":true,\"dedicated\":true}\n")
        .unwrap();
    assert_eq!(r.recv().unwrap()["type"], "subscribed");
    assert_eq!(r.recv().unwrap()["type"], "telemetry");
    drop(client);
    let (status, _) = d.signal_and_wait(Signal::TERM);
    assert!(status.success(), "{status}");
    let mut last = None;
    while let Some(f) = r.recv() {
        last = Some(f);
    }
    let last = last.expect("frames before the end");
    assert_eq!(last["type"], "shutdown", "{last}");
}
