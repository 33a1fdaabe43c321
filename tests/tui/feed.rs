//! The console's data source against a real daemon (`--source sim`, a temporary
//! GPUPILOT_HOME) and a real child run, without a terminal: what the feed sends is what the
//! views would draw. Snapshots, history, the run list, node events, the run's log lines and
//! exits, a stop through the request channel, the daemon going away and coming back.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::feed::Reader;
use crate::support::home::Home;
use gpupilot::history::Metric;
use gpupilot::protocol::{LogStream, NodeEvent};
use gpupilot::supervisor::RunStatus;
use gpupilot::tui::feed::{DataSource, Link, Request, Update};
use rustix::process::Signal;

const WAIT: Duration = Duration::from_secs(15);

impl Reader {
    /// All log text received for `run`'s `stream`.
    fn log(&self, run: &str, stream: LogStream) -> String {
        self.seen
            .iter()
            .filter_map(|u| match u {
                Update::Log {
                    run: r,
                    stream: s,
                    data,
                    ..
                } if r == run && *s == stream => Some(data.as_str()),
                _ => None,
            })
            .collect()
    }
}

fn status_of(u: &Update, id: &str) -> Option<RunStatus> {
    match u {
        Update::Runs(runs) => runs.iter().find(|r| r.id == id).map(|r| r.status),
        _ => None,
    }
}

#[test]
fn the_feed_brings_telemetry_runs_logs_and_events_and_survives_the_daemon() {
    let home = Home::new();
    let mut daemon = home.daemon(&[]);
    let script = "for i in 1 2 3; do echo feed-line-$i; done; echo feed-err >&2; sleep 60";
    let id = home
        .ok(&["run", "-d", "--name", "feed", "--", "bash", "-c", script])
        .trim()
        .to_string();
    assert!(id.ends_with("-feed"), "{id}");

    let feed = DataSource::Daemon(home.client()).start(Duration::from_millis(200));
    let mut r = Reader::new(feed, WAIT);

    // Who answers, then the present, then the past (history).
    let link = r.until("the link", |u| matches!(u, Update::Link(_)));
    let Update::Link(Link::Daemon {
        pid,
        rate_hz,
        telemetry_error,
        readonly,
    }) = link
    else {
        panic!("{link:?}")
    };
    assert_eq!(pid, daemon.pid());
    assert_eq!((rate_hz, telemetry_error, readonly), (10.0, None, false));
    let snap = r.until("a snapshot", |u| matches!(u, Update::Snapshot(_)));
    let Update::Snapshot(snap) = snap else {
        unreachable!()
    };
    assert_eq!(snap.gpus.len(), 2, "the simulated node has 2 GPUs");
    assert_eq!(snap.node.source, "sim");
    assert!(snap.gpus.iter().all(|g| g.power_w.is_some_and(|p| p > 0.0)));
    assert!(
        !r.seen.iter().any(|u| matches!(u, Update::Backfill(_))),
        "the first snapshot does not wait for the history"
    );
    let backfill = r.until("the history", |u| matches!(u, Update::Backfill(_)));
    let Update::Backfill(series) = backfill else {
        unreachable!()
    };
    let gpu0 = series
        .iter()
        .find(|s| s.gpu == 0 && s.metric == Metric::Power)
        .map(|s| s.points.len());
    assert!(
        gpu0.is_some_and(|n| n >= 1),
        "the charts are back-filled: {gpu0:?}"
    );
    assert!(
        series
            .iter()
            .flat_map(|s| &s.points)
            .all(|p| p.t < snap.time_s),
        "the past, up to the first snapshot"
    );

    // The node's events so far, and the run list with the run in it.
    r.until("the run list", |u| {
        status_of(u, &id) == Some(RunStatus::Running)
    });
    let started = r.seen.iter().any(|u| match u {
        Update::Events {
            events,
            reset: true,
        } => events
            .iter()
            .any(|e| matches!(&e.event, NodeEvent::RunStarted { run, .. } if *run == id)),
        _ => false,
    });
    assert!(started, "the catch-up holds the run's start");

    // The run's log, both streams, once it is watched.
    r.send(Request::Watch(id.clone()));
    r.until("the run's stdout", |_| true);
    let deadline = Instant::now() + WAIT;
    while !(r.log(&id, LogStream::Stdout).contains("feed-line-3")
        && r.log(&id, LogStream::Stderr).contains("feed-err"))
    {
        assert!(Instant::now() < deadline, "no log lines: {:?}", r.seen);
        r.until("more log", |u| matches!(u, Update::Log { .. }));
    }
    assert_eq!(
        r.log(&id, LogStream::Stdout),
        "feed-line-1\nfeed-line-2\nfeed-line-3\n",
        "every line once, in order"
    );

    // Stop it through the request channel: the answer, then the run's end.
    r.send(Request::Stop(id.clone()));
    let answer = r.until("the answer", |u| matches!(u, Update::Answer { .. }));
    assert!(
        matches!(&answer, Update::Answer { ok: true, text } if text.contains("stopping")),
        "{answer:?}"
    );
    r.until("the run stopped", |u| {
        status_of(u, &id) == Some(RunStatus::Stopped)
    });
    r.until("its exit", |u| {
        matches!(u, Update::Exits { run, exits } if *run == id && exits.iter().any(|e| e.contains("SIGTERM")))
    });
    // Stopping it again is refused with the daemon's words, not a panic.
    r.send(Request::Stop(id.clone()));
    let again = r.until("the refusal", |u| matches!(u, Update::Answer { .. }));
    assert!(
        matches!(&again, Update::Answer { ok: false, .. }),
        "{again:?}"
    );

    // The daemon goes away: said once; it comes back: picked up again.
    let (status, _) = daemon.signal_and_wait(Signal::TERM);
    assert!(status.success(), "{status}");
    let gone = r.until("the daemon gone", |u| {
        matches!(u, Update::Link(Link::Gone { .. }))
    });
    assert!(
        matches!(&gone, Update::Link(Link::Gone { reason }) if reason.contains("stopped")),
        "{gone:?}"
    );
    let again = home.daemon(&[]);
    let back = r.until("the daemon back", |u| {
        matches!(u, Update::Link(Link::Daemon { .. }))
    });
    assert!(
        matches!(back, Update::Link(Link::Daemon { pid, .. }) if pid == again.pid()),
        "the new daemon"
    );
    r.until("the run list again", |u| {
        status_of(u, &id) == Some(RunStatus::Stopped)
    });
}

/// The run list and control status are asked at the refresh rate only while something is
/// live; a quiet node is left alone between its events.
#[test]
fn a_quiet_node_is_not_polled_at_the_refresh_rate() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let feed = DataSource::Daemon(home.client()).start(Duration::from_millis(100));
    let mut r = Reader::new(feed, WAIT);
    r.until("the first run list", |u| matches!(u, Update::Runs(_)));
    let runs = |us: &[Update]| us.iter().filter(|u| matches!(u, Update::Runs(_))).count();

    let quiet = r.during(Duration::from_millis(1500));
    assert_eq!(runs(&quiet), 0, "nothing live: no poll in 15 refreshes");
    assert!(
        quiet.iter().any(|u| matches!(u, Update::Snapshot(_))),
        "snapshots still come: {quiet:?}"
    );

    let id = home
        .ok(&["run", "-d", "--name", "live", "--", "sleep", "60"])
        .trim()
        .to_string();
    r.until("the run in the list", |u| status_of(u, &id).is_some());
    let live = r.during(Duration::from_millis(1500));
    assert!(
        runs(&live) >= 5,
        "a live run is polled at the refresh rate: {} run lists in 1.5 s",
        runs(&live)
    );

    home.ok(&["stop", &id]);
    r.until("the run stopped", |u| {
        status_of(u, &id).is_some_and(|s| s.is_final())
    });
    r.during(Duration::from_millis(800));
    let after = r.during(Duration::from_millis(1500));
    assert_eq!(runs(&after), 0, "quiet again once the run ended");
}

/// The snapshots `r` receives over `d`.
fn snapshot_times(r: &mut Reader, d: Duration) -> Vec<f64> {
    r.during(d)
        .iter()
        .filter_map(|u| match u {
            Update::Snapshot(s) => Some(s.time_s),
            _ => None,
        })
        .collect()
}

/// At most one snapshot per refresh of 500 ms (less a fifth for jitter) in 3 s, against 30
/// sampled, newest first and never an older one after it.
fn check_once_per_refresh(times: &[f64]) {
    assert!(
        (4..=8).contains(&times.len()),
        "{} snapshots in 3 s: {times:?}",
        times.len()
    );
    assert!(times.windows(2).all(|w| w[0] < w[1]), "in order: {times:?}");
}

/// A daemon sampling at 10 Hz does not make a console at a 500 ms refresh redraw ten times a
/// second: snapshots come at most once per refresh (most straight from the client's reader,
/// some held back by the feed), the newest first and never an older one after it.
#[test]
fn snapshots_come_once_per_refresh_and_in_order() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let feed = DataSource::Daemon(home.client()).start(Duration::from_millis(500));
    let mut r = Reader::new(feed, WAIT);
    r.until("a snapshot", |u| matches!(u, Update::Snapshot(_)));
    check_once_per_refresh(&snapshot_times(&mut r, Duration::from_millis(3000)));
}

/// Given the console's runtime, the feed reads a local daemon's snapshots on it, over a
/// connection of their own (its own connection then carries no snapshots): the same snapshots
/// as through the feed's thread, and again after the daemon restarts.
#[test]
fn on_a_runtime_snapshots_come_over_a_connection_of_their_own() {
    let home = Home::new();
    let mut daemon = home.daemon(&[]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let feed = DataSource::Daemon(home.client()).start_on(Duration::from_millis(500), rt.handle());
    let mut r = Reader::new(feed, WAIT);
    r.until("a snapshot", |u| matches!(u, Update::Snapshot(_)));
    check_once_per_refresh(&snapshot_times(&mut r, Duration::from_millis(3000)));
    // The feed's connection, the snapshots' and the one asking.
    let status = home.client().status().unwrap();
    assert_eq!(status.daemon.clients, 3, "{:?}", status.daemon);

    let (status, _) = daemon.signal_and_wait(Signal::TERM);
    assert!(status.success(), "{status}");
    r.until("the daemon gone", |u| {
        matches!(u, Update::Link(Link::Gone { .. }))
    });
    let _again = home.daemon(&[]);
    r.until("the daemon back", |u| {
        matches!(u, Update::Link(Link::Daemon { .. }))
    });
    r.until("a snapshot", |u| matches!(u, Update::Snapshot(_)));
    check_once_per_refresh(&snapshot_times(&mut r, Duration::from_millis(3000)));
}

/// The node's run list is asked for just before a snapshot goes out, so that the console
/// draws both in one frame: with a daemon sampling at the console's refresh (2 Hz and 500 ms,
/// where a late sample would otherwise let the poll go first on its own), every run list comes
/// with a snapshot right behind it.
#[test]
fn polls_go_out_with_the_snapshot_after_them() {
    let home = Home::new();
    let _daemon = home.daemon(&["--rate", "2"]);
    let id = home
        .ok(&["run", "-d", "--name", "busy", "--", "sleep", "60"])
        .trim()
        .to_string();
    let feed = DataSource::Daemon(home.client()).start(Duration::from_millis(500));
    let mut r = Reader::new(feed, WAIT);
    r.until("the run in the list", |u| status_of(u, &id).is_some());
    let got = r.during_timed(Duration::from_millis(5000));
    let polls: Vec<Instant> = got
        .iter()
        .filter(|(_, u)| matches!(u, Update::Runs(_)))
        .map(|(t, _)| *t)
        .collect();
    assert!(
        polls.len() >= 6,
        "a live run is polled each refresh: {polls:?}"
    );
    for t in &polls {
        let next = got
            .iter()
            .find(|(at, u)| at >= t && matches!(u, Update::Snapshot(_)));
        assert!(
            next.is_some_and(|(at, _)| *at - *t < Duration::from_millis(100)),
            "a run list at {:?} without a snapshot right behind it: {:?}",
            t.duration_since(got[0].0),
            got.iter()
                .map(|(at, u)| (at.duration_since(got[0].0), std::mem::discriminant(u)))
                .collect::<Vec<_>>()
        );
    }
}

/// Every request line a client sends to the daemon through this socket, recorded on its way
/// (a proxy on a socket of its own, for as long as the test runs).
fn recording_proxy(home: &Home) -> (std::path::PathBuf, Arc<Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    let path = home.dir.path().join("proxy.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let daemon = home.socket();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    std::thread::spawn(move || {
        for theirs in listener.incoming() {
            let Ok(theirs) = theirs else { return };
            let ours = UnixStream::connect(&daemon).unwrap();
            let (mut back_in, mut back_out) =
                (ours.try_clone().unwrap(), theirs.try_clone().unwrap());
            std::thread::spawn(move || std::io::copy(&mut back_in, &mut back_out));
            let record = Arc::clone(&record);
            std::thread::spawn(move || {
                let mut to = ours;
                for line in BufReader::new(theirs).lines() {
                    let Ok(line) = line else { return };
                    record.lock().unwrap().push(line.clone());
                    if to.write_all(format!("{line}\n").as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (path, seen)
}

/// A node keeps every ended run, and an ended run does not change: while a run is live, the
/// console asks for the live runs only and keeps the ended ones it has, asking for the whole
/// list again when a run starts or ends (also one that started and ended between two polls).
/// What it shows is the whole list all the same.
#[test]
fn between_changes_only_the_live_runs_are_asked_for() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let ended: Vec<String> = (0..3)
        .map(|i| {
            home.ok(&["run", "-d", "--name", &format!("done{i}"), "--", "true"])
                .trim()
                .to_string()
        })
        .collect();
    let live = home
        .ok(&["run", "-d", "--name", "live", "--", "sleep", "60"])
        .trim()
        .to_string();
    let (proxy, requests) = recording_proxy(&home);
    let client = gpupilot::client::Client::connect_to(&proxy, "test").unwrap();
    let feed = DataSource::Daemon(client).start(Duration::from_millis(100));
    let mut r = Reader::new(feed, WAIT);
    for id in &ended {
        r.until("the ended runs, ended", |u| {
            status_of(u, id).is_some_and(|s| s.is_final())
        });
    }
    let uptime = |u: &Update| match u {
        Update::Runs(runs) => runs.iter().find(|r| r.id == live).map(|r| r.uptime_s),
        _ => None,
    };
    let asked = |live: bool| {
        requests
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(r#""type":"runs""#) && l.contains(r#""live":true"#) == live)
            .count()
    };
    // The ended runs' events may come just after a list that shows them ended, and bring a
    // whole list each: let them pass (half a second without one).
    let settled = Instant::now() + WAIT;
    let mut whole = asked(false);
    loop {
        r.during(Duration::from_millis(500));
        let now = asked(false);
        if now == whole || Instant::now() > settled {
            break;
        }
        whole = now;
    }
    let (whole, live_only) = (asked(false), asked(true));
    let lists = r.during(Duration::from_millis(1500));
    let runs: Vec<&Update> = lists
        .iter()
        .filter(|u| matches!(u, Update::Runs(_)))
        .collect();
    assert!(
        runs.len() >= 5,
        "polled at the refresh rate: {}",
        runs.len()
    );
    for u in &runs {
        let Update::Runs(list) = u else {
            unreachable!()
        };
        assert_eq!(list.len(), 4, "the whole list, every time: {list:?}");
    }
    let uptimes: Vec<f64> = runs.iter().filter_map(|u| uptime(u).flatten()).collect();
    assert!(
        uptimes.first() < uptimes.last(),
        "the live run's figures move: {uptimes:?}"
    );
    let (whole_then, live_then) = (asked(false) - whole, asked(true) - live_only);
    assert!(
        live_then >= 5 && whole_then == 0,
        "in 1.5 s with nothing started or ended: {whole_then} whole lists, {live_then} of the \
         live runs"
    );
    let whole = asked(false);

    // The run ends: the list says so, from a whole list asked for then.
    home.ok(&["stop", &live]);
    r.until("the live run stopped", |u| {
        status_of(u, &live).is_some_and(|s| s.is_final())
    });
    assert!(
        asked(false) > whole,
        "the whole list again once a run ended"
    );

    // A run that starts and ends between two polls is in no list of live runs: its events
    // bring the whole list, long before the next one that is due anyway.
    let quick = home
        .ok(&["run", "-d", "--name", "quick", "--", "true"])
        .trim()
        .to_string();
    r.until("the quick run, ended", |u| {
        status_of(u, &quick).is_some_and(|s| s.is_final())
    });
}

/// Events recorded while the console connects come both ways: in the catch-up (every event the
/// daemon keeps) and as pushes of the subscription made just before it. Each is sent to the
/// views once, in order (the Events view showed a rank attached twice in the same second).
#[test]
fn an_event_the_catch_up_brought_is_not_sent_again_by_its_push() {
    use gpupilot::protocol::{Request as Ask, Response, TargetGpus};
    use std::sync::atomic::{AtomicBool, Ordering};

    let home = Home::new();
    let _daemon = home.daemon(&[]);
    // Changes to GPU 0's cap one after the other, each a `gpu_changed` event, from before the
    // feed connects until well after its catch-up.
    let stop = Arc::new(AtomicBool::new(false));
    let changes = {
        let (c, stop) = (home.client(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) && n < 20_000 {
                let watts = if n % 2 == 0 { 600.0 } else { 650.0 };
                let r = c.request(Ask::PowerCap {
                    gpus: TargetGpus::Some(vec![0]),
                    watts,
                    why: Some("events while the console connects".into()),
                });
                assert!(
                    matches!(r, Ok(Response::GpuChanged { .. })),
                    "a cap change: {r:?}"
                );
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let feed = DataSource::Daemon(home.client()).start(Duration::from_millis(100));
    let mut r = Reader::new(feed, WAIT);
    r.until("the history", |u| matches!(u, Update::Backfill(_)));
    r.during(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let made = changes.join().unwrap();
    let mut seqs = Vec::new();
    let mut pushed = 0;
    for u in &r.seen {
        if let Update::Events { events, reset } = u {
            if !reset {
                pushed += events.len();
            }
            seqs.extend(events.iter().map(|e| e.seq));
        }
    }
    assert!(
        made > 20 && pushed > 0,
        "{made} changes, {pushed} events pushed"
    );
    let twice: Vec<_> = seqs.windows(2).filter(|w| w[1] <= w[0]).collect();
    assert!(
        twice.is_empty(),
        "events sent again or out of order: {twice:?}"
    );
}
