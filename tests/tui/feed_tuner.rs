//! The console's energy tuner and advisor through the feed, against a real daemon on the
//! simulator (a temporary GPUPILOT_HOME) and the synthetic trainer: the console starts the
//! daemon's tuning job and reports its start and progress as updates; stopping it puts the
//! starting caps back, and quitting the console (dropping the feed) leaves the job running in
//! the daemon. The advisor pane's request brings hints, or why there are none.

use std::time::{Duration, Instant};

use crate::support::feed::Reader;
use crate::support::home::{Home, power_caps as caps};
use crate::support::wait::wait_for;
use gpupilot::tui::feed::daemon::{TunerEnd, TunerEvent};
use gpupilot::tui::feed::{DataSource, Request, Update};

const WAIT: Duration = Duration::from_secs(30);

fn tuner_event(u: &Update) -> Option<&TunerEvent> {
    match u {
        Update::Tuner(e) => Some(e),
        _ => None,
    }
}

#[test]
fn quitting_the_console_leaves_the_daemons_tuning_job_running() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    home.ok(&["power", "cap", "650"]);
    let c = home.client();
    let mut reader = Reader::new(
        DataSource::Daemon(home.client()).start(Duration::from_millis(200)),
        WAIT,
    );

    // The advisor: hints on request, or why there are none.
    reader.send(Request::Advise(true));
    let advice = reader.until("the advisor's hints", |u| matches!(u, Update::Advice(_)));
    let Update::Advice(a) = advice else {
        unreachable!()
    };
    assert!(
        !a.hints.is_empty() || !a.why_none.is_empty(),
        "hints or why none: {a:?}"
    );
    reader.send(Request::Advise(false));

    // The tuner starts on the run and tries the default cap first.
    reader.send(Request::TuneEnergy(run.clone()));
    let started = reader.until("the tuner to start", |u| {
        matches!(
            tuner_event(u),
            Some(TunerEvent::Started { .. } | TunerEvent::Ended { .. })
        )
    });
    let Some(TunerEvent::Started { run: r, gpus, .. }) = tuner_event(&started) else {
        panic!("the tuner did not start: {started:?}")
    };
    assert_eq!(r, &run);
    assert_eq!(gpus.len(), 2);
    reader.until("the tuner's progress on its first cap",
        |u| matches!(tuner_event(u), Some(TunerEvent::Progress { progress, .. }) if progress.cap_w == Some(700.0)),
    );
    wait_for("the first cap to be set", Duration::from_secs(10), || {
        caps(&c) == [700.0, 700.0]
    });
    // A second search is refused while one runs.
    reader.send(Request::TuneEnergy(run.clone()));
    let refused = reader.until("the refusal", |u| {
        matches!(u, Update::Answer { ok: false, .. })
    });
    assert!(
        format!("{refused:?}").contains("already working on run"),
        "{refused:?}"
    );

    // Quit: dropping the feed ends the following, not the search, which is the daemon's.
    let quit = Instant::now();
    drop(reader);
    assert!(quit.elapsed() < Duration::from_secs(5));
    let status = home.ok(&["tune", "status", &run]);
    assert!(status.contains("running"), "{status}");
    // Stopped from the command line, it puts the starting caps back.
    home.ok(&["tune", "stop", &run]);
    assert_eq!(caps(&c), [650.0, 650.0]);
    assert!(!home.run_dir(&run).path().join("tune-energy.json").exists());
}

#[test]
fn stopping_the_tuner_puts_the_caps_back_and_says_so() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    home.ok(&["power", "cap", "600"]);
    let c = home.client();
    let mut reader = Reader::new(
        DataSource::Daemon(home.client()).start(Duration::from_millis(200)),
        WAIT,
    );
    reader.send(Request::TuneEnergy(run.clone()));
    wait_for("the first cap to be set", Duration::from_secs(20), || {
        caps(&c) == [700.0, 700.0]
    });
    reader.send(Request::TuneStop);
    let ended = reader.until("the tuner to end", |u| {
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
    reader.send(Request::TuneStop);
    let answer = reader.until("the answer", |u| {
        matches!(u, Update::Answer { ok: false, .. })
    });
    assert!(format!("{answer:?}").contains("not running"), "{answer:?}");
}
