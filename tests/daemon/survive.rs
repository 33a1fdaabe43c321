//! Runs outlive the daemon: SIGKILL to the daemon loses no run and no output line, and the next
//! daemon re-adopts live runs and finds finished ones finished.

use std::time::Duration;

use crate::support::count_lines;
use crate::support::home::{Home, counted, counter_script};
use crate::support::wait::wait_for;
use rustix::process::Signal;

#[test]
fn kill_9_of_the_daemon_loses_no_run_and_no_line() {
    let home = Home::new();
    let mut d = home.daemon(&[]);
    let id = home
        .ok(&["run", "-d", "--", "sh", "-c", &counter_script(10)])
        .trim()
        .to_string();
    let dir = home.run_dir(&id);
    let pid = home.client().run(&id).unwrap().pid.unwrap();
    wait_for("output", Duration::from_secs(10), || {
        count_lines(&dir.stdout_path()) >= 3
    });

    d.signal_and_wait(Signal::KILL);
    // The socket file is left behind; the lock is not.
    assert!(home.socket().exists());
    assert_eq!(gpupilot::daemon::lock_holder(&home.paths), None);
    let at_kill = count_lines(&dir.stdout_path());
    wait_for(
        "the orphaned run to keep writing",
        Duration::from_secs(10),
        || count_lines(&dir.stdout_path()) > at_kill + 10,
    );

    let _d2 = home.daemon(&[]);
    let c = home.client();
    let run = c.run(&id).unwrap();
    assert_eq!(run.status.as_str(), "running");
    assert_eq!(run.pid, Some(pid));
    assert!(run.adopted);
    let ps = home.ok(&["ps"]);
    assert!(
        ps.lines()
            .any(|l| l.starts_with(&id) && l.contains(" running ")),
        "{ps}"
    );
    let adopted: Vec<serde_json::Value> = home
        .node_events()
        .into_iter()
        .filter(|e| e["event"] == "run_adopted")
        .collect();
    assert_eq!(adopted.len(), 1);
    assert_eq!(adopted[0]["run"], id.as_str());
    assert_eq!(adopted[0]["status"], "running");

    // `logs` through the new daemon sees every line, then stop works on the adopted run.
    let before_stop = home.ok(&["logs", &id]);
    assert!(before_stop.lines().count() > at_kill + 10);
    let out = home.ok(&["stop", &id]);
    assert!(out.contains("stopped"), "{out}");
    let n = counted(&dir.stdout_path());
    assert!(n > at_kill + 10);
    let events = std::fs::read_to_string(dir.events_path()).unwrap();
    assert!(events.contains("\"event\":\"adopted\""), "{events}");
}

#[test]
fn a_run_that_ended_while_no_daemon_ran_is_found_finished() {
    let home = Home::new();
    let mut d = home.daemon(&[]);
    // The run records its own exit code, as the Python SDK does, so the next daemon can tell.
    let script = "echo working; sleep 1; echo 0 > \"$GPUPILOT_RUN_DIR/exit_code\"; exit 0";
    let quick = home
        .ok(&["run", "-d", "--", "sh", "-c", script])
        .trim()
        .to_string();
    let silent = home
        .ok(&["run", "-d", "--", "sh", "-c", "sleep 1; exit 4"])
        .trim()
        .to_string();
    d.signal_and_wait(Signal::KILL);
    let gone = |id: &str| {
        let rec = home.run_dir(id).read_pid().unwrap().unwrap();
        !gpupilot::supervisor::is_alive(&rec)
    };
    wait_for("both runs to end", Duration::from_secs(15), || {
        gone(&quick) && gone(&silent)
    });

    let _d2 = home.daemon(&[]);
    let c = home.client();
    let q = c.run(&quick).unwrap();
    assert_eq!(q.status.as_str(), "succeeded");
    assert_eq!(q.exit_code, Some(0));
    // A run that wrote nothing: its monitor kept its exit status.
    let s = c.run(&silent).unwrap();
    assert_eq!(s.status.as_str(), "failed");
    assert_eq!(s.exit_code, Some(4));
    assert_eq!(s.description.as_deref(), Some("exit 4"));
    assert_eq!(home.ok(&["logs", &quick]), "working\n");
    let ps = home.ok(&["ps"]);
    assert!(
        ps.contains(" succeeded ") && ps.contains(" failed "),
        "{ps}"
    );
}
