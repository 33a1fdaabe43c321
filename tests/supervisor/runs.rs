//! Runs started and watched by one supervisor: environment, sessions, stop, pause, restarts,
//! exit statuses. Real child processes (`sh`, `sleep`, python3); every wait is bounded.

use std::time::Duration;

use crate::support::supervisor::{
    KillGroupOnDrop, caller, event_names, lines, running_in_group, sh_profile,
};
use crate::support::wait::wait_for;
use gpupilot::profile::Profile;
use gpupilot::supervisor::{
    self, Clock, LaunchOptions, ManualClock, Run, RunStatus, SupervisorError, SystemClock, procfs,
};

const LONG: Duration = Duration::from_secs(10);

fn start(state: &std::path::Path, p: &Profile) -> Run {
    start_at(state, p, &SystemClock)
}

/// Start `p` with time from `clock` (a ManualClock steps through backoffs without sleeping).
fn start_at(state: &std::path::Path, p: &Profile, clock: &dyn Clock) -> Run {
    Run::start_new(state, p, &caller(state), &LaunchOptions::default(), clock).unwrap()
}

#[test]
fn environment_cwd_and_gpus_reach_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work dir");
    std::fs::create_dir(&work).unwrap();
    let p = sh_profile(
        "envcheck",
        r#"pwd; echo "cuda=$CUDA_VISIBLE_DEVICES"; echo "own=$OWN"; echo "caller=$FROM_CALLER"; echo "id=$GPUPILOT_RUN_ID"; echo "sock=$GPUPILOT_SOCKET"; echo "dir=$GPUPILOT_RUN_DIR"; echo "$1"; echo oops >&2"#,
        &format!(
            "cwd = {:?}\ngpus = [2, 3]\nenv = {{ OWN = \"profile value\" }}\n",
            work.display().to_string()
        ),
    );
    let mut c = caller(tmp.path());
    c.env.insert("FROM_CALLER".into(), "venv-ish".into());
    c.env.insert("CUDA_VISIBLE_DEVICES".into(), "7".into());
    let opts = LaunchOptions {
        socket: Some("/tmp/g.sock".into()),
        ..Default::default()
    };
    let mut run = Run::start_new(tmp.path(), &p, &c, &opts, &SystemClock).unwrap();
    assert!(run.wait(&SystemClock, LONG).unwrap());

    let id = run.id().to_string();
    assert!(id.ends_with("-envcheck"), "{id}");
    let dir = run.dir().path().display().to_string();
    assert_eq!(
        lines(&run.dir().stdout_path()),
        [
            work.display().to_string(),
            "cuda=2,3".into(),
            "own=profile value".into(),
            "caller=venv-ish".into(),
            format!("id={id}"),
            "sock=/tmp/g.sock".into(),
            format!("dir={dir}"),
            String::new(),
        ]
    );
    assert_eq!(lines(&run.dir().stderr_path()), ["oops"]);
    let s = run.summary();
    assert_eq!(
        (s.status, s.exit_code, s.signal),
        (RunStatus::Succeeded, Some(0), None)
    );
    assert_eq!(s.description.as_deref(), Some("exit 0"));
    assert!(s.duration_s.is_some() && s.ended_at.is_some());
    assert_eq!(
        event_names(run.dir()),
        ["created", "started", "exited", "finished"]
    );
    // run.toml is the resolved profile; launch.json the exact start.
    let again = gpupilot::profile::check(run.dir().profile_path()).unwrap();
    assert_eq!(again.run, p.run);
    assert_eq!(run.dir().read_launch().unwrap(), *run.plan());
}

#[test]
fn a_run_has_its_own_session_and_group() {
    let tmp = tempfile::tempdir().unwrap();
    let p = Profile::from_command(vec!["sleep".into(), "30".into()]);
    let mut run = start(tmp.path(), &p);
    let _guard = KillGroupOnDrop(run.pid().unwrap());
    let pid = run.pid().unwrap();
    let st = procfs::stat(pid).unwrap();
    // /proc/PID/stat fields 5 and 6: setsid ran in place, so the pid did not change.
    assert_eq!((st.pgrp, st.session), (pid as i32, pid as i32));
    let me = procfs::stat(std::process::id()).unwrap();
    assert_ne!(st.session, me.session);
    let rec = run.dir().read_pid().unwrap().unwrap();
    assert_eq!((rec.pid, rec.start_time), (pid, st.start_time));
    assert_eq!(run.status(), RunStatus::Running);

    assert_eq!(
        run.stop_and_wait(Duration::from_secs(5), &SystemClock)
            .unwrap(),
        RunStatus::Stopped
    );
    let s = run.summary();
    assert_eq!(
        (s.exit_code, s.signal, s.signal_name.as_deref()),
        (None, Some(15), Some("SIGTERM"))
    );
    assert_eq!(
        event_names(run.dir()),
        [
            "created",
            "started",
            "stop_requested",
            "exited",
            "stopped",
            "finished"
        ]
    );
    assert!(matches!(
        run.pause(&SystemClock),
        Err(SupervisorError::BadState { .. })
    ));
}

#[test]
fn stop_lets_a_graceful_run_finish_its_handler() {
    let tmp = tempfile::tempdir().unwrap();
    let p = sh_profile(
        "graceful",
        "trap 'echo saving; exit 0' TERM; echo ready; while :; do sleep 0.02; done",
        "",
    );
    let mut run = start(tmp.path(), &p);
    let _guard = KillGroupOnDrop(run.pid().unwrap());
    let out = run.dir().stdout_path();
    wait_for("ready", LONG, || lines(&out).contains(&"ready".to_string()));
    assert_eq!(
        run.stop_and_wait(Duration::from_secs(5), &SystemClock)
            .unwrap(),
        RunStatus::Stopped
    );
    assert_eq!(run.summary().exit_code, Some(0));
    assert!(lines(&out).contains(&"saving".to_string()));
    assert!(!event_names(run.dir()).contains(&"killed".to_string()));
}

#[test]
fn stop_escalates_to_sigkill_when_sigterm_is_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    // The ignored SIGTERM is inherited by the sleeps too: the whole group ignores it.
    let p = sh_profile(
        "stubborn",
        "trap '' TERM; echo ready; while :; do sleep 0.02; done",
        "",
    );
    let mut run = start(tmp.path(), &p);
    let _guard = KillGroupOnDrop(run.pid().unwrap());
    let pid = run.pid().unwrap();
    let out = run.dir().stdout_path();
    wait_for("ready", LONG, || lines(&out).contains(&"ready".to_string()));
    let t0 = std::time::Instant::now();
    assert_eq!(
        run.stop_and_wait(Duration::from_millis(300), &SystemClock)
            .unwrap(),
        RunStatus::Stopped
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "killed before the grace period ended"
    );
    let s = run.summary();
    assert_eq!(
        (s.signal, s.signal_name.as_deref()),
        (Some(9), Some("SIGKILL"))
    );
    assert_eq!(
        s.description.as_deref(),
        Some("stopped: killed by SIGKILL after the grace period")
    );
    assert_eq!(
        event_names(run.dir()),
        [
            "created",
            "started",
            "stop_requested",
            "killed",
            "exited",
            "stopped",
            "finished"
        ]
    );
    wait_for("the group to be gone", LONG, || {
        running_in_group(pid).is_empty()
    });
}

#[test]
fn pause_and_resume_the_whole_group() {
    let tmp = tempfile::tempdir().unwrap();
    let p = sh_profile(
        "ticker",
        "i=0; while :; do i=$((i+1)); echo $i; sleep 0.01; done",
        "",
    );
    let mut run = start(tmp.path(), &p);
    let _guard = KillGroupOnDrop(run.pid().unwrap());
    let pid = run.pid().unwrap();
    let out = run.dir().stdout_path();
    wait_for("output", LONG, || lines(&out).len() >= 3);

    run.pause(&SystemClock).unwrap();
    assert_eq!(run.status(), RunStatus::Paused);
    // Every process of the group stopped ('T'), or waiting on a stopped vfork child ('D': the
    // shell, when SIGSTOP caught it between vfork and exec).
    wait_for("every process stopped", LONG, || {
        running_in_group(pid)
            .iter()
            .filter_map(|&p| procfs::stat(p).ok())
            .all(|st| st.is_stopped() || st.state == 'D')
    });
    let frozen = lines(&out).len();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(lines(&out).len(), frozen, "output grew while paused");
    assert_eq!(run.poll(&SystemClock).unwrap(), RunStatus::Paused);

    run.resume(&SystemClock).unwrap();
    wait_for("output after resume", LONG, || {
        lines(&out).len() > frozen + 3
    });
    assert_eq!(
        run.stop_and_wait(Duration::from_secs(5), &SystemClock)
            .unwrap(),
        RunStatus::Stopped
    );
    let names = event_names(run.dir());
    assert_eq!(names[..4], ["created", "started", "paused", "resumed"]);
}

#[test]
fn stopping_a_paused_run_wakes_it_to_handle_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let p = sh_profile(
        "pausestop",
        "trap 'exit 4' TERM; echo ready; while :; do sleep 0.02; done",
        "",
    );
    let mut run = start(tmp.path(), &p);
    let _guard = KillGroupOnDrop(run.pid().unwrap());
    let out = run.dir().stdout_path();
    wait_for("ready", LONG, || lines(&out).contains(&"ready".to_string()));
    run.pause(&SystemClock).unwrap();
    assert_eq!(
        run.stop_and_wait(Duration::from_secs(5), &SystemClock)
            .unwrap(),
        RunStatus::Stopped
    );
    assert_eq!(run.summary().exit_code, Some(4), "{:?}", run.summary());
}

#[test]
fn on_failure_restarts_with_backoff_then_gives_up() {
    let tmp = tempfile::tempdir().unwrap();
    let p = sh_profile(
        "flaky",
        "echo attempt; exit 3",
        "[run.restart]\npolicy = \"on-failure\"\nmax_restarts = 2\nbackoff_s = 60\nbackoff_factor = 2\n",
    );
    let clock = ManualClock::new();
    let mut run = start_at(tmp.path(), &p, &clock);
    let out = run.dir().stdout_path();
    let mut backoffs = Vec::new();
    for n in 1..=2 {
        wait_for("backoff", LONG, || {
            run.poll(&clock).unwrap() == RunStatus::Backoff
        });
        // The clock has not moved: no restart, however often it is polled.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(run.poll(&clock).unwrap(), RunStatus::Backoff);
        assert_eq!(lines(&out).len(), n);
        let events = run.dir().read_events(0, usize::MAX).unwrap();
        let Some(supervisor::Event::RestartScheduled { after_s, attempt }) =
            events.last().map(|r| r.event.clone())
        else {
            panic!("last event is not restart_scheduled: {events:?}")
        };
        backoffs.push((attempt, after_s));
        clock.advance(Duration::from_secs_f64(after_s - 0.5));
        assert_eq!(run.poll(&clock).unwrap(), RunStatus::Backoff);
        clock.advance(Duration::from_secs(1));
        assert_eq!(run.poll(&clock).unwrap(), RunStatus::Running);
        assert_eq!(run.attempt(), n as u32);
    }
    assert_eq!(backoffs, [(1, 60.0), (2, 120.0)]);
    assert!(run.wait(&clock, LONG).unwrap());
    assert_eq!(lines(&out), ["attempt", "attempt", "attempt"]);
    let s = run.summary();
    assert_eq!(
        (s.status, s.exit_code, s.restarts),
        (RunStatus::Failed, Some(3), 2)
    );
    assert_eq!(
        s.description.as_deref(),
        Some("exit 3; gave up after 2 restarts")
    );
    assert_eq!(
        event_names(run.dir()),
        [
            "created",
            "started",
            "exited",
            "restart_scheduled",
            "restarted",
            "exited",
            "restart_scheduled",
            "restarted",
            "exited",
            "gave_up",
            "finished",
        ]
    );
}

#[test]
fn on_failure_does_not_restart_a_success_and_stop_cancels_a_backoff() {
    let tmp = tempfile::tempdir().unwrap();
    let p = sh_profile("ok", "exit 0", "[run.restart]\npolicy = \"on-failure\"\n");
    let mut run = start(tmp.path(), &p);
    assert!(run.wait(&SystemClock, LONG).unwrap());
    assert_eq!((run.status(), run.attempt()), (RunStatus::Succeeded, 0));

    let p = sh_profile(
        "always",
        "exit 0",
        "[run.restart]\npolicy = \"always\"\nbackoff_s = 3600\n",
    );
    let clock = ManualClock::new();
    let mut run = start_at(tmp.path(), &p, &clock);
    wait_for("backoff", LONG, || {
        run.poll(&clock).unwrap() == RunStatus::Backoff
    });
    run.stop(Duration::from_secs(1), &clock).unwrap();
    assert_eq!(run.status(), RunStatus::Stopped);
    assert_eq!(
        run.summary().description.as_deref(),
        Some("stopped while waiting to restart")
    );
}

#[test]
fn death_by_signal_is_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let p = sh_profile("segv", "kill -SEGV $$", "");
    let mut run = start(tmp.path(), &p);
    assert!(run.wait(&SystemClock, LONG).unwrap());
    let s = run.summary();
    assert_eq!(
        (s.status, s.exit_code, s.signal),
        (RunStatus::Failed, None, Some(11))
    );
    assert_eq!(s.description.as_deref(), Some("killed by SIGSEGV"));
    let on_disk = run.dir().read_summary().unwrap().unwrap();
    assert_eq!(&on_disk, s);
}

#[test]
fn leftovers_of_the_group_are_killed_when_the_main_process_ends() {
    let tmp = tempfile::tempdir().unwrap();
    // A background child that would outlive the shell.
    let p = sh_profile("orphans", "sleep 30 & echo $! > bg.pid; exit 1", "");
    let mut run = start(tmp.path(), &p);
    let _guard = KillGroupOnDrop(run.pid().unwrap());
    let pid = run.pid().unwrap();
    assert!(run.wait(&SystemClock, LONG).unwrap());
    assert_eq!(run.summary().exit_code, Some(1));
    wait_for("the orphan to be killed", LONG, || {
        running_in_group(pid).is_empty()
    });
}

#[test]
fn python_output_and_exit_code() {
    let tmp = tempfile::tempdir().unwrap();
    let p = Profile::from_command(vec![
        "python3".into(),
        "-c".into(),
        "import os, sys; print(os.environ['GPUPILOT_RUN_ID']); print(os.getsid(0) == os.getpid()); sys.exit(5)".into(),
    ]);
    let mut run = start(tmp.path(), &p);
    assert!(run.wait(&SystemClock, LONG).unwrap());
    assert_eq!(
        lines(&run.dir().stdout_path()),
        [run.id().to_string(), "True".into()]
    );
    assert_eq!(run.summary().exit_code, Some(5));
}

#[test]
fn a_missing_program_is_refused_before_anything_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let p = Profile::from_command(vec!["definitely-not-installed-xyz".into()]);
    let err = Run::start_new(
        tmp.path(),
        &p,
        &caller(tmp.path()),
        &LaunchOptions::default(),
        &SystemClock,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("command not found: `definitely-not-installed-xyz`"),
        "{err}"
    );
    let runs = supervisor::RunDir::list(tmp.path()).unwrap();
    assert!(runs.is_empty(), "a run directory was left behind: {runs:?}");
}

#[test]
fn a_run_charged_no_gpu_has_no_energy_figure_but_keeps_its_samples() {
    use gpupilot::control::energy::{GpuEnergy, RunEnergy};
    let tmp = tempfile::tempdir().unwrap();
    let p = sh_profile("cpu", "exit 0", "");
    let mut run = start(tmp.path(), &p);
    assert!(run.wait(&SystemClock, LONG).unwrap());
    // A CPU-only script: the control loop charged it no GPU, and it reported samples.
    run.set_energy(RunEnergy::new(vec![], Some(640), None, None), true)
        .unwrap();
    let on_disk = run.dir().read_summary().unwrap().unwrap();
    assert_eq!(on_disk.samples, Some(640));
    assert_eq!((on_disk.energy_j, on_disk.energy.as_ref()), (None, None));
    let text = std::fs::read_to_string(run.dir().summary_path()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        v["energy_j"].is_null() && v.get("energy").is_none(),
        "{text}"
    );

    let charged = vec![GpuEnergy {
        gpu: 0,
        energy_j: 7200.0,
    }];
    run.set_energy(RunEnergy::new(charged, Some(720), None, None), true)
        .unwrap();
    let on_disk = run.dir().read_summary().unwrap().unwrap();
    assert_eq!(on_disk.energy_j, Some(7200.0));
    assert_eq!(on_disk.energy.map(|e| e.j_per_sample), Some(Some(10.0)));
}
