//! Runs outlive their supervisor: a supervisor process (this test binary, re-run as
//! `helper_supervisor`) starts a run and is then killed; the run goes on, loses no output line,
//! and a new supervisor adopts it. Pid files that name a recycled pid are not adopted.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::proc::test_name;
use crate::support::supervisor::{KillGroupOnDrop, caller, event_names, lines, sh_profile};
use crate::support::wait::wait_for;
use gpupilot::profile;
use gpupilot::supervisor::{
    self, Adopted, LaunchOptions, PidRecord, Run, RunDir, RunStatus, SystemClock, procfs,
};

const LONG: Duration = Duration::from_secs(20);

/// Not a test: the supervisor process the other tests start and kill. It starts the profile in
/// `$GPUPILOT_TEST_PROFILE` under `$GPUPILOT_TEST_STATE`, says where with a `ready` file, and
/// supervises until killed (at most a minute).
#[test]
#[ignore = "helper process for the survival tests, started by them"]
fn helper_supervisor() {
    let (Ok(state), Ok(text)) = (
        std::env::var("GPUPILOT_TEST_STATE"),
        std::env::var("GPUPILOT_TEST_PROFILE"),
    ) else {
        return;
    };
    let state = PathBuf::from(state);
    let p = profile::parse_str("helper.toml", &text).unwrap();
    let mut run = Run::start_new(
        &state,
        &p,
        &caller(&state),
        &LaunchOptions::default(),
        &SystemClock,
    )
    .unwrap();
    let tmp = state.join("ready.tmp");
    std::fs::write(&tmp, run.dir().path().display().to_string()).unwrap();
    std::fs::rename(tmp, state.join("ready")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        run.poll(&SystemClock).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Start the helper supervisor on `profile_toml`; returns it and the run's directory.
fn supervisor(state: &Path, profile: &profile::Profile, own_group: bool) -> (Child, RunDir) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        &test_name(module_path!(), "helper_supervisor"),
        "--exact",
        "--ignored",
        "--test-threads=1",
        "--quiet",
    ])
    .env("GPUPILOT_TEST_STATE", state)
    .env("GPUPILOT_TEST_PROFILE", profile.to_toml())
    .stdin(Stdio::null())
    .stdout(Stdio::null());
    if own_group {
        // Like a login shell's job: the group a terminal hangup is sent to.
        cmd.process_group(0);
    }
    let child = cmd.spawn().unwrap();
    let ready = state.join("ready");
    wait_for("the supervisor to start the run", LONG, || ready.exists());
    let dir = RunDir::open(std::fs::read_to_string(ready).unwrap()).unwrap();
    (child, dir)
}

fn live_pid(dir: &RunDir) -> u32 {
    match supervisor::adopt(dir).unwrap() {
        Adopted::Live { pid, .. } => pid,
        other => panic!("the run is not live: {other:?}"),
    }
}

#[test]
fn no_output_line_is_lost_when_the_supervisor_is_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 400;
    let p = sh_profile(
        "chatty",
        &format!(
            r#"i=0; while [ $i -lt {n} ]; do i=$((i+1)); echo "out $i"; echo "err $i" >&2; sleep 0.004; done"#
        ),
        "",
    );
    let (mut sup, dir) = supervisor(tmp.path(), &p, false);
    let pid = dir.read_pid().unwrap().unwrap().pid;
    let _guard = KillGroupOnDrop(pid);
    wait_for("some output", LONG, || {
        lines(&dir.stdout_path()).len() >= 20
    });

    sup.kill().unwrap(); // SIGKILL: no chance to clean up
    assert_eq!(sup.wait().unwrap().signal(), Some(9));
    assert!(
        lines(&dir.stdout_path()).len() < n,
        "the run ended before its supervisor was killed"
    );
    assert_eq!(live_pid(&dir), pid, "the run died with its supervisor");

    let mut run = Run::adopt(dir.clone(), &SystemClock);
    assert!(run.is_adopted());
    assert_eq!((run.pid(), run.status()), (Some(pid), RunStatus::Running));
    assert!(run.wait(&SystemClock, LONG).unwrap());

    let want = |stream: &str| (1..=n).map(|i| format!("{stream} {i}")).collect::<Vec<_>>();
    assert_eq!(lines(&dir.stdout_path()), want("out"));
    assert_eq!(lines(&dir.stderr_path()), want("err"));
    let s = run.summary();
    assert_eq!(s.status, RunStatus::Unknown);
    assert_eq!(s.description.as_deref(), Some("unknown status (adopted)"));
    assert_eq!(
        event_names(&dir),
        ["created", "started", "adopted", "exited", "finished"]
    );
}

#[test]
fn a_dropped_ssh_session_kills_no_run() {
    let tmp = tempfile::tempdir().unwrap();
    let p = sh_profile(
        "survivor",
        "trap 'echo bye; exit 0' TERM HUP; echo ready; while :; do sleep 0.02; done",
        "",
    );
    let (mut sup, dir) = supervisor(tmp.path(), &p, true);
    let pid = dir.read_pid().unwrap().unwrap().pid;
    let _guard = KillGroupOnDrop(pid);
    wait_for("ready", LONG, || {
        lines(&dir.stdout_path()).contains(&"ready".to_string())
    });

    // What the terminal does when the SSH connection drops: SIGHUP to the foreground group.
    // (Through rustix, not `kill -HUP -PGID`: procps kill reads `-1234` as pid -1, everyone.)
    let group = rustix::process::Pid::from_raw(sup.id() as i32)
        .filter(|_| sup.id() > 1)
        .unwrap();
    rustix::process::kill_process_group(group, rustix::process::Signal::HUP).unwrap();
    assert_eq!(
        sup.wait().unwrap().signal(),
        Some(1),
        "the supervisor should die of SIGHUP"
    );
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(live_pid(&dir), pid);
    assert!(
        !lines(&dir.stdout_path()).contains(&"bye".to_string()),
        "the run got the hangup"
    );

    // A new supervisor adopts it and can still stop it gracefully.
    let mut run = Run::adopt(dir.clone(), &SystemClock);
    assert_eq!(
        run.stop_and_wait(Duration::from_secs(5), &SystemClock)
            .unwrap(),
        RunStatus::Stopped
    );
    assert!(lines(&dir.stdout_path()).contains(&"bye".to_string()));
    assert_eq!(
        run.summary().description.as_deref(),
        Some("stopped: unknown status (adopted)")
    );
    assert_eq!(
        event_names(&dir),
        [
            "created",
            "started",
            "adopted",
            "stop_requested",
            "exited",
            "stopped",
            "finished"
        ]
    );
}

#[test]
fn an_adopted_run_that_records_its_exit_code_is_restarted_by_its_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let p = sh_profile(
        "resumable",
        r#"if [ -e marker ]; then echo second; exit 0; fi
           touch marker; echo first
           while [ ! -e go ]; do sleep 0.01; done
           echo 7 > "$GPUPILOT_RUN_DIR/exit_code"; exit 7"#,
        "[run.restart]\npolicy = \"on-failure\"\nmax_restarts = 1\nbackoff_s = 0\n",
    );
    let (mut sup, dir) = supervisor(tmp.path(), &p, false);
    let _guard = KillGroupOnDrop(dir.read_pid().unwrap().unwrap().pid);
    wait_for("first", LONG, || {
        lines(&dir.stdout_path()).contains(&"first".to_string())
    });
    sup.kill().unwrap();
    sup.wait().unwrap();

    let mut run = Run::adopt(dir.clone(), &SystemClock);
    assert!(run.is_adopted());
    std::fs::write(tmp.path().join("go"), "").unwrap();
    assert!(run.wait(&SystemClock, LONG).unwrap());
    assert_eq!(lines(&dir.stdout_path()), ["first", "second"]);
    let s = run.summary();
    assert_eq!(
        (s.status, s.exit_code, s.restarts),
        (RunStatus::Succeeded, Some(0), 1)
    );
    let codes: Vec<Option<i32>> = dir
        .read_events(0, usize::MAX)
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.event {
            supervisor::Event::Exited { code, .. } => Some(code),
            _ => None,
        })
        .collect();
    assert_eq!(codes, [Some(7), Some(0)]);
    assert_eq!(
        event_names(&dir),
        [
            "created",
            "started",
            "adopted",
            "exited",
            "restart_scheduled",
            "restarted",
            "exited",
            "finished"
        ]
    );
}

#[test]
fn a_recycled_pid_is_not_adopted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = RunDir::create(tmp.path(), "recycled", std::time::SystemTime::now()).unwrap();
    // A live process with the right pid but another start time: a recycled pid.
    let mut other = Command::new("sleep").arg("30").spawn().unwrap();
    let me = procfs::stat(other.id()).unwrap();
    let rec = |start_time, boot_id| PidRecord {
        pid: me.pid,
        start_time,
        boot_id,
    };
    dir.write_pid(&rec(me.start_time + 1, procfs::boot_id()))
        .unwrap();
    assert!(matches!(
        supervisor::adopt(&dir).unwrap(),
        Adopted::Gone {
            pid: Some(_),
            summary: None
        }
    ));
    // The same pid and start time, but from an earlier boot.
    dir.write_pid(&rec(
        me.start_time,
        Some("00000000-0000-0000-0000-000000000000".into()),
    ))
    .unwrap();
    assert!(matches!(
        supervisor::adopt(&dir).unwrap(),
        Adopted::Gone { .. }
    ));
    // The control: everything matches.
    dir.write_pid(&rec(me.start_time, procfs::boot_id()))
        .unwrap();
    assert!(matches!(supervisor::adopt(&dir).unwrap(), Adopted::Live { pid, .. } if pid == me.pid));
    other.kill().unwrap();
    other.wait().unwrap();
    assert!(matches!(
        supervisor::adopt(&dir).unwrap(),
        Adopted::Gone { .. }
    ));
}

#[test]
fn run_adopt_treats_a_recycled_pid_as_ended_and_a_finished_run_as_finished() {
    let tmp = tempfile::tempdir().unwrap();
    let p = sh_profile("short", "echo done", "");
    let mut run = Run::start_new(
        tmp.path(),
        &p,
        &caller(tmp.path()),
        &LaunchOptions::default(),
        &SystemClock,
    )
    .unwrap();
    assert!(run.wait(&SystemClock, LONG).unwrap());
    let dir = run.dir().clone();
    let events_before = event_names(&dir);

    let again = Run::adopt(dir.clone(), &SystemClock);
    assert!(again.is_finished());
    assert_eq!(again.status(), RunStatus::Succeeded);
    assert_eq!(
        event_names(&dir),
        events_before,
        "adopting a finished run wrote events"
    );

    // Pretend its supervisor died while it ran, and its pid now belongs to another process.
    let mut s = dir.read_summary().unwrap().unwrap();
    s.status = RunStatus::Running;
    dir.write_summary(&s).unwrap();
    let mut other = Command::new("sleep").arg("30").spawn().unwrap();
    let me = procfs::stat(other.id()).unwrap();
    dir.write_pid(&PidRecord {
        pid: me.pid,
        start_time: me.start_time + 7,
        boot_id: procfs::boot_id(),
    })
    .unwrap();
    let adopted = Run::adopt(dir.clone(), &SystemClock);
    assert!(adopted.is_finished());
    assert_eq!(adopted.status(), RunStatus::Unknown);
    let names = event_names(&dir);
    assert_eq!(names[events_before.len()..], ["exited", "finished"]);
    assert!(!names.contains(&"adopted".to_string()));
    assert!(
        other.try_wait().unwrap().is_none(),
        "the stranger with the recycled pid was signalled"
    );
    other.kill().unwrap();
    other.wait().unwrap();
}

/// A live run whose pid file was removed is still adopted as live: its process is the last
/// start in `events.jsonl`; with that unreadable too (a link), the process is not known, and
/// the run says why rather than vanish.
#[test]
fn run_adopt_finds_a_live_run_whose_pid_file_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let p = sh_profile("live", "sleep 30", "");
    let mut run = Run::start_new(
        tmp.path(),
        &p,
        &caller(tmp.path()),
        &LaunchOptions::default(),
        &SystemClock,
    )
    .unwrap();
    let pid = run.pid().unwrap();
    let dir = run.dir().clone();
    std::fs::remove_file(dir.pid_path()).unwrap();
    let adopted = Run::adopt(dir.clone(), &SystemClock);
    assert!(!adopted.is_finished());
    assert_eq!(
        (adopted.status(), adopted.pid()),
        (RunStatus::Running, Some(pid))
    );
    assert_eq!(adopted.problem(), None);

    std::fs::rename(dir.events_path(), tmp.path().join("events.jsonl")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.events_path()).unwrap();
    let blind = Run::adopt(dir.clone(), &SystemClock);
    assert_eq!(blind.status(), RunStatus::Unknown);
    let problem = blind.problem().unwrap_or_default();
    assert!(problem.starts_with("events.jsonl not read: "), "{problem}");
    assert!(problem.contains("symbolic link"), "{problem}");
    run.kill(&SystemClock).unwrap();
    assert!(run.wait(&SystemClock, LONG).unwrap());
}
