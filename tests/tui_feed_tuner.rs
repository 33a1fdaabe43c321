//! The console's energy tuner and advisor through the feed, against a real daemon on the
//! simulator (a temporary GPUPILOT_HOME) and the synthetic trainer: the tuner reports its
//! start and progress as updates and sets its first cap through the daemon; stopping it, or
//! quitting the console (dropping the feed), puts the starting caps back. The advisor pane's
//! request brings hints, or why there are none.

mod daemon_common;

use std::time::{Duration, Instant};

use daemon_common::{Home, wait_for};
use gpupilot::client::Client;
use gpupilot::protocol::{Request as DaemonRequest, Response};
use gpupilot::tui::feed::{DataSource, Feed, Request, Update};
use gpupilot::tui::tuner::{TunerEnd, TunerEvent};

const BIN: &str = env!("CARGO_BIN_EXE_gpupilot");
const WAIT: Duration = Duration::from_secs(30);

fn start_synthetic(home: &Home) -> String {
    let path = home.dir.path().join("synth.toml");
    let body = format!(
        "name = \"synth\"\n[run]\ncommand = [\"{BIN}\", \"synthetic-train\", \"--speed\", \"4\"]\n"
    );
    std::fs::write(&path, body).unwrap();
    let run = home
        .ok(&["run", "--detach", &path.display().to_string()])
        .trim()
        .to_string();
    let c = home.client();
    wait_for("the trainer to report", Duration::from_secs(20), || {
        c.run_metrics(&run, 0)
            .is_ok_and(|m| m.trainer.attached && !m.points.is_empty())
    });
    run
}

fn caps(c: &Client) -> Vec<f64> {
    let Response::Power { gpus, .. } = c.request(DaemonRequest::Power {}).unwrap() else {
        panic!("power answered otherwise")
    };
    gpus.iter().map(|g| g.power.unwrap().current_w).collect()
}

/// Waits on a feed's updates with a bound.
fn until(
    rt: &tokio::runtime::Runtime,
    feed: &mut Feed,
    what: &str,
    done: impl Fn(&Update) -> bool,
) -> Update {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let got = rt.block_on(async { tokio::time::timeout(left, feed.updates.recv()).await });
        match got {
            Ok(Some(u)) if done(&u) => return u,
            Ok(Some(_)) => {}
            Ok(None) => panic!("the feed ended while waiting for {what}"),
            Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
        }
    }
}

fn tuner_event(u: &Update) -> Option<&TunerEvent> {
    match u {
        Update::Tuner(e) => Some(e),
        _ => None,
    }
}

#[test]
fn quitting_the_console_stops_its_tuner_and_puts_the_caps_back() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_synthetic(&home);
    home.ok(&["power", "cap", "650"]);
    let c = home.client();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut feed = DataSource::Daemon(home.client()).start(Duration::from_millis(200));

    // The advisor: hints on request, or why there are none.
    feed.requests.send(Request::Advise(true)).unwrap();
    let advice = until(&rt, &mut feed, "the advisor's hints", |u| {
        matches!(u, Update::Advice(_))
    });
    let Update::Advice(a) = advice else {
        unreachable!()
    };
    assert!(
        !a.hints.is_empty() || !a.why_none.is_empty(),
        "hints or why none: {a:?}"
    );
    feed.requests.send(Request::Advise(false)).unwrap();

    // The tuner starts on the run and tries the highest cap first.
    feed.requests
        .send(Request::TuneEnergy(run.clone()))
        .unwrap();
    let started = until(&rt, &mut feed, "the tuner to start", |u| {
        matches!(
            tuner_event(u),
            Some(TunerEvent::Started { .. } | TunerEvent::Ended { .. })
        )
    });
    let Some(TunerEvent::Started {
        run: r, plan, gpus, ..
    }) = tuner_event(&started)
    else {
        panic!("the tuner did not start: {started:?}")
    };
    assert_eq!(r, &run);
    assert_eq!(plan.first(), Some(&700.0), "{plan:?}");
    assert_eq!(gpus.len(), 2);
    until(
        &rt,
        &mut feed,
        "the tuner's progress on its first cap",
        |u| matches!(tuner_event(u), Some(TunerEvent::Progress { progress, .. }) if progress.cap_w == Some(700.0)),
    );
    wait_for("the first cap to be set", Duration::from_secs(10), || {
        caps(&c) == [700.0, 700.0]
    });
    // A second search is refused while one runs.
    feed.requests
        .send(Request::TuneEnergy(run.clone()))
        .unwrap();
    let refused = until(&rt, &mut feed, "the refusal", |u| {
        matches!(u, Update::Answer { ok: false, .. })
    });
    assert!(
        format!("{refused:?}").contains("already working on run"),
        "{refused:?}"
    );

    // Quit: dropping the feed stops the search and waits until the caps are back.
    let quit = Instant::now();
    drop(feed);
    assert_eq!(caps(&c), [650.0, 650.0], "back at the starting cap on quit");
    assert!(quit.elapsed() < Duration::from_secs(15));
    assert!(!home.run_dir(&run).path().join("tune-energy.json").exists());
}

#[test]
fn stopping_the_tuner_puts_the_caps_back_and_says_so() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_synthetic(&home);
    home.ok(&["power", "cap", "600"]);
    let c = home.client();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut feed = DataSource::Daemon(home.client()).start(Duration::from_millis(200));
    feed.requests
        .send(Request::TuneEnergy(run.clone()))
        .unwrap();
    wait_for("the first cap to be set", Duration::from_secs(20), || {
        caps(&c) == [700.0, 700.0]
    });
    feed.requests.send(Request::TuneStop).unwrap();
    let ended = until(&rt, &mut feed, "the tuner to end", |u| {
        matches!(tuner_event(u), Some(TunerEvent::Ended { .. }))
    });
    let Some(TunerEvent::Ended { end, .. }) = tuner_event(&ended) else {
        unreachable!()
    };
    assert_eq!(
        end,
        &TunerEnd::Cancelled {
            why: "interrupted".into(),
            restored: Ok(())
        }
    );
    assert_eq!(caps(&c), [600.0, 600.0]);
    // Stopping again: nothing runs, and the footer says so.
    feed.requests.send(Request::TuneStop).unwrap();
    let answer = until(&rt, &mut feed, "the answer", |u| {
        matches!(u, Update::Answer { ok: false, .. })
    });
    assert!(format!("{answer:?}").contains("not running"), "{answer:?}");
}
