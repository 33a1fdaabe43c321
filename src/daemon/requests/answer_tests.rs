//! [`super::answer`] driven without a socket: a run started, its output read, read-only
//! refusals, a trainer that attaches before its run is in the table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Paths;
use crate::daemon::state::Daemon;
use crate::ipc::Peer;
use crate::profile::Profile;
use crate::protocol::{ErrorCode, Request, Response};
use crate::protocol::{LogStream, RunSignal};
use crate::supervisor::Caller;

fn daemon(dir: &std::path::Path, readonly: bool) -> Daemon {
    let paths = Paths {
        config: dir.join("config"),
        state: dir.join("state"),
        runtime: dir.join("run"),
    };
    std::fs::create_dir_all(&paths.state).unwrap();
    let socket = paths.runtime.join("daemon.sock");
    Daemon::new(
        paths,
        socket,
        readonly,
        1.0,
        None,
        None,
        Some("none here".into()),
    )
    .unwrap()
}

fn me() -> Peer {
    Peer {
        uid: rustix::process::getuid().as_raw(),
        gid: 0,
        pid: Some(std::process::id()),
    }
}

fn start(d: &Daemon, profile: Profile) -> Response {
    let mut caller = Caller::current().unwrap();
    caller.cwd = std::env::temp_dir();
    d.answer(
        &me(),
        Request::RunStart {
            profile: Box::new(profile),
            caller,
            knobs: Default::default(),
            why: Some("unit test".into()),
        },
    )
}

fn code(r: &Response) -> Option<ErrorCode> {
    match r {
        Response::Error { code, .. } => Some(*code),
        _ => None,
    }
}

#[test]
fn a_trainer_that_attaches_before_its_run_joins_the_table_waits_for_it() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Arc::new(daemon(tmp.path(), false));
    // Nothing being started: a run nobody knows is refused at once.
    let t = Instant::now();
    let e = d.runs.resolve_starting("late").map(|_| ()).unwrap_err();
    assert_eq!(e.code, ErrorCode::UnknownRun);
    assert!(t.elapsed() < Duration::from_secs(1));

    // A run being started (its process spawned, not yet in the table): the lookup waits
    // for it to join, then finds it.
    let launching = d.runs.launching();
    let waiter = {
        let d = Arc::clone(&d);
        std::thread::spawn(move || d.runs.resolve_starting("late").map(|(_, id)| id))
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(!waiter.is_finished(), "it did not wait");
    let mut late = Profile::from_command(vec!["true".into()]);
    late.name = "late".into();
    let Response::RunStarted { run: info } = start(&d, late) else {
        panic!("not started")
    };
    assert_eq!(waiter.join().unwrap().unwrap(), info.id);
    drop(launching);
}

#[test]
fn readonly_refuses_changes_but_answers_questions() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon(tmp.path(), true);
    let r = start(&d, Profile::from_command(vec!["true".into()]));
    assert_eq!(code(&r), Some(ErrorCode::Readonly));
    let r = d.answer(
        &me(),
        Request::RunSignal {
            run: "last".into(),
            signal: RunSignal::Pause,
            why: None,
        },
    );
    assert_eq!(code(&r), Some(ErrorCode::Readonly));
    assert_eq!(
        d.answer(
            &me(),
            Request::Runs {
                run: None,
                live: false
            }
        ),
        Response::Runs { runs: vec![] }
    );
    let Response::Status(s) = d.answer(&me(), Request::Status {}) else {
        panic!("no status")
    };
    assert!(s.daemon.readonly && s.snapshot.is_none());
    assert_eq!(s.telemetry.error.as_deref(), Some("none here"));
}

#[test]
fn a_profile_from_the_socket_is_checked_again() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon(tmp.path(), false);
    let mut p = Profile::from_command(vec!["true".into()]);
    p.name = "../escape".into();
    let r = start(&d, p);
    assert_eq!(code(&r), Some(ErrorCode::BadRequest), "{r:?}");
    assert!(!tmp.path().join("state/escape").exists());
    let r = start(
        &d,
        Profile::from_command(vec!["no-such-program-xyz".into()]),
    );
    assert_eq!(code(&r), Some(ErrorCode::LaunchFailed), "{r:?}");
}

#[test]
fn a_run_start_to_end_without_a_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon(tmp.path(), false);
    let r = start(
        &d,
        Profile::from_command(vec!["sh".into(), "-c".into(), "echo hi".into()]),
    );
    let Response::RunStarted { run } = r else {
        panic!("{r:?}")
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.runs.table().get(&run.id).unwrap().run.is_finished() {
        assert!(Instant::now() < deadline, "the run did not end");
        d.poll_runs();
        std::thread::sleep(Duration::from_millis(10));
    }
    let logs = d.answer(
        &me(),
        Request::Logs {
            run: "last".into(),
            stream: LogStream::Stdout,
            offset: 0,
            max_bytes: None,
        },
    );
    let Response::Logs { data, finished, .. } = logs else {
        panic!("{logs:?}")
    };
    assert_eq!((data.as_str(), finished), ("hi\n", true));
    let Response::Events { events, .. } = d.answer(
        &me(),
        Request::Events {
            since: 0,
            max: None,
        },
    ) else {
        panic!("no events")
    };
    let kinds: Vec<String> = events
        .iter()
        .map(|e| serde_json::to_value(e).unwrap()["event"].to_string())
        .collect();
    assert_eq!(
        kinds,
        ["\"daemon_started\"", "\"run_started\"", "\"run_status\""]
    );
    let r = d.answer(
        &me(),
        Request::RunStop {
            run: run.id.clone(),
            kill: false,
            grace_s: None,
            why: None,
        },
    );
    assert_eq!(code(&r), Some(ErrorCode::BadState), "an ended run");
}
