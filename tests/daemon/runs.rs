//! Runs through the CLI and a real daemon: run → ps → logs → stop, `stop --kill`, a `run`
//! client that loses its terminal (SIGHUP) or is interrupted (Ctrl-C), a daemon started on
//! demand, and `profile check`.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::home::{Home, counted, counter_script};
use crate::support::json;
use crate::support::proc::send;
use crate::support::wait::wait_for;
use rustix::process::Signal;

#[test]
fn run_ps_logs_stop() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let id = home
        .ok(&[
            "run",
            "--detach",
            "--name",
            "count",
            "--",
            "sh",
            "-c",
            &counter_script(20),
        ])
        .trim()
        .to_string();
    assert!(id.ends_with("-count"), "{id}");

    let ps = json(&home.ok(&["ps", "--json"]));
    let runs = ps.as_array().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["id"], id.as_str());
    assert_eq!(runs[0]["status"], "running");
    assert_eq!(runs[0]["restarts"], 0);
    assert_eq!(runs[0]["adopted"], false);
    assert!(runs[0]["pid"].as_u64().unwrap() > 1);
    let table = home.ok(&["ps"]);
    let mut lines = table.lines();
    assert!(lines.next().unwrap().starts_with("ID"));
    let row = lines.next().unwrap();
    assert!(row.starts_with(&id) && row.contains(" running "), "{row}");
    assert!(
        row.ends_with(&format!("sh -c '{}'", counter_script(20))),
        "{row}"
    );

    let dir = home.run_dir(&id);
    wait_for("some output", Duration::from_secs(10), || {
        std::fs::read_to_string(dir.stdout_path()).is_ok_and(|t| t.lines().count() >= 5)
    });
    let logs = home.ok(&["logs", &id[..12]]); // an id prefix is enough
    assert!(logs.starts_with("1\n2\n3\n4\n5\n"), "{logs}");

    let stopped = home.ok(&["stop", "last"]);
    assert_eq!(stopped.trim(), format!("{id}: stopped: killed by SIGTERM"));
    let run = &json(&home.ok(&["ps", "--json"]))[0];
    assert_eq!(run["status"], "stopped");
    assert_eq!(run["signal_name"], "SIGTERM");
    let n = counted(&dir.stdout_path());
    // `logs` of an ended run prints everything and returns; so does -f.
    let all = home.ok(&["logs", "-f", "count"]);
    assert_eq!(all.lines().count(), n);

    // Who, when, old → new, why: in the run's events and the node's.
    let run_events = std::fs::read_to_string(dir.events_path()).unwrap();
    let changed: Vec<serde_json::Value> = run_events
        .lines()
        .map(json)
        .filter(|e| e["event"] == "changed")
        .collect();
    assert_eq!(changed.len(), 2, "{run_events}");
    assert_eq!(changed[0]["new"], "started");
    assert_eq!(changed[1]["old"], "running");
    assert_eq!(changed[1]["new"], "stopping");
    assert_eq!(changed[1]["why"], "gpupilot stop");
    assert!(
        changed[1]["by"]
            .as_str()
            .unwrap()
            .contains("via gpupilot (pid ")
    );
    assert!(changed[1]["time"].as_str().unwrap().ends_with('Z'));
    let node: Vec<String> = home
        .node_events()
        .iter()
        .filter(|e| e["run"] == id.as_str())
        .map(|e| format!("{}:{}>{}", e["event"].as_str().unwrap(), e["old"], e["new"]))
        .collect();
    assert_eq!(
        node,
        [
            "run_started:null>null",
            "run_status:\"running\">\"stopping\"",
            "run_status:\"stopping\">\"stopped\""
        ]
    );
}

#[test]
fn stop_kill_does_not_wait_for_the_grace_period() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let id = home
        .ok(&[
            "run",
            "-d",
            "--",
            "sh",
            "-c",
            "trap '' TERM; echo ready; sleep 60",
        ])
        .trim()
        .to_string();
    wait_for("the trap", Duration::from_secs(10), || {
        std::fs::read_to_string(home.run_dir(&id).stdout_path()).is_ok_and(|t| t == "ready\n")
    });
    let t0 = Instant::now();
    let out = home.ok(&["stop", &id, "--kill"]);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(out.contains("killed by SIGKILL"), "{out}");
    let run = &json(&home.ok(&["ps", "--json"]))[0];
    assert_eq!(run["status"], "stopped");
    assert_eq!(run["signal_name"], "SIGKILL");
    // Stopping an ended run is refused with the reason.
    let again = home.run(&["stop", &id], Duration::from_secs(20));
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("is stopped: cannot stop it"));
}

#[test]
fn run_follows_output_and_passes_the_exit_code_on() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let out = home.run(
        &[
            "run",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; echo \"$PYTHONUNBUFFERED\"; exit 3",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n1\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("err\n"), "{err}");
    assert!(
        err.contains("started run ") && err.contains("ended: exit 3"),
        "{err}"
    );
}

/// The SSH-drop case: the terminal's hangup kills the `gpupilot run` client, never the run.
#[test]
fn sighup_to_the_run_client_leaves_the_run_running() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    // An SSH drop delivers SIGHUP with its default action. A test run under nohup (or any
    // parent that ignores SIGHUP) would pass the ignore on through exec, so the client is
    // started through coreutils' `env --default-signal=HUP` to get the real disposition back.
    let plain = home.gpupilot(&["run", "--", "sh", "-c", &counter_script(20)]);
    let mut cmd = std::process::Command::new("env");
    cmd.arg("--default-signal=HUP")
        .arg(plain.get_program())
        .args(plain.get_args())
        .current_dir(plain.get_current_dir().unwrap());
    for (k, v) in plain.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut client = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = home.client();
    wait_for("the run", Duration::from_secs(15), || {
        c.runs().is_ok_and(|r| !r.is_empty())
    });
    let id = c.runs().unwrap()[0].id.clone();
    let mut first = [0u8; 2];
    client
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    assert_eq!(&first, b"1\n", "the client follows the output");
    send(client.id(), Signal::HUP);
    let mut status = None;
    wait_for(
        "the client to end on SIGHUP",
        Duration::from_secs(10),
        || {
            status = client.try_wait().unwrap();
            status.is_some()
        },
    );
    let status = status.unwrap();
    assert!(!status.success(), "SIGHUP ended the client: {status}");
    let before = std::fs::read_to_string(home.run_dir(&id).stdout_path())
        .unwrap()
        .lines()
        .count();
    wait_for("the run to keep writing", Duration::from_secs(10), || {
        std::fs::read_to_string(home.run_dir(&id).stdout_path())
            .unwrap()
            .lines()
            .count()
            > before + 5
    });
    assert_eq!(c.run(&id).unwrap().status.as_str(), "running");
    home.ok(&["stop", &id]);
    counted(&home.run_dir(&id).stdout_path());
}

/// Ctrl-C detaches `gpupilot run`, and says so; the run goes on.
#[test]
fn ctrl_c_detaches_the_run_client() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let client = home
        .gpupilot(&["run", "--", "sh", "-c", &counter_script(20)])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = home.client();
    wait_for("the run", Duration::from_secs(15), || {
        c.runs().is_ok_and(|r| !r.is_empty())
    });
    std::thread::sleep(Duration::from_millis(300));
    send(client.id(), Signal::INT);
    let out = client.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", out.status);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("detached; run ") && err.contains("goes on"),
        "{err}"
    );
    let run = &c.runs().unwrap()[0];
    assert_eq!(run.status.as_str(), "running");
    // attach finds it again (the newest live run) and shows its last lines.
    let mut attach = home
        .gpupilot(&["attach"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 64];
    let n = attach.stdout.as_mut().unwrap().read(&mut buf).unwrap();
    assert!(n > 0);
    home.ok(&["stop", &run.id]);
    let out = attach.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + 15), "killed by SIGTERM");
    assert!(String::from_utf8_lossy(&out.stderr).contains("attached to run"));
}

#[test]
fn run_starts_a_daemon_when_none_answers() {
    let home = Home::new();
    let id = home
        .ok(&["run", "-d", "--", "sleep", "30"])
        .trim()
        .to_string();
    let pid = gpupilot::daemon::lock_holder(&home.paths).expect("a daemon holds the lock");
    let c = home.client();
    assert_eq!(c.welcome().daemon_pid, pid);
    // It runs in a session of its own, with the telemetry source it was given.
    let stat = gpupilot::supervisor::procfs::stat(pid).unwrap();
    assert_eq!(stat.session, pid as i32);
    assert_eq!(c.status().unwrap().telemetry.gpus, 2);
    assert_eq!(c.run(&id).unwrap().status.as_str(), "running");
    home.ok(&["stop", &id, "--kill"]);
    send(pid, Signal::TERM);
    wait_for("the daemon to exit", Duration::from_secs(10), || {
        gpupilot::daemon::lock_holder(&home.paths).is_none()
    });
}

#[test]
fn profile_check_good_and_bad() {
    let home = Home::new();
    let good = concat!(env!("CARGO_MANIFEST_DIR"), "/profiles/train-simple.toml");
    let out = home.ok(&["profile", "check", good]);
    assert!(out.starts_with(&format!("{good}: ok\n")), "{out}");
    assert!(out.contains("  name         train-simple\n"), "{out}");
    assert!(
        out.contains("  command      python3 examples/train_simple.py\n"),
        "{out}"
    );
    assert!(out.contains("  gpus         0\n"), "{out}");
    assert!(
        out.contains("  knobs        batch_size 32 (1..=512), prefetch 2 (0..=16)\n"),
        "{out}"
    );

    let bad = home.dir.path().join("bad.toml");
    std::fs::write(&bad, "[run]\ncommand = [\"python3\"]\ncomand = 1\n").unwrap();
    let out = home.run(
        &["profile", "check", bad.to_str().unwrap()],
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(&format!("{}:3:1: unknown field `comand`", bad.display())),
        "{err}"
    );
}

/// `run_events` pages through a run's event log, which the run can write too: every event once
/// and in order, page after page; a line still being written waits for its newline; and a log
/// rewritten under a console that goes on from where it was is read again from its top.
#[test]
fn run_events_page_through_a_log_the_run_writes_to() {
    use gpupilot::protocol::{Request, Response};
    use std::io::Write;

    let home = Home::new();
    let _d = home.daemon(&[]);
    let id = home
        .ok(&["run", "--detach", "--name", "ev", "--", "sleep", "60"])
        .trim()
        .to_string();
    let dir = home.run_dir(&id);
    let client = home.client();
    let page = |since: u64, max: u32| -> (Vec<String>, u64) {
        let answer = client.request(Request::RunEvents {
            run: id.clone(),
            since,
            max: Some(max),
        });
        match answer.unwrap() {
            Response::RunEvents { events, next, .. } => {
                let names = events
                    .iter()
                    .map(|e| serde_json::to_value(&e.event).unwrap()["event"].to_string())
                    .collect();
                (names, next)
            }
            other => panic!("{other:?}"),
        }
    };
    let append = |bytes: &[u8]| {
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.events_path())
            .unwrap()
            .write_all(bytes)
            .unwrap();
    };
    wait_for("the run's first events", Duration::from_secs(10), || {
        dir.read_events(0, 100).is_ok_and(|e| e.len() >= 2)
    });
    let mut lines = String::new();
    for i in 0..40 {
        let event = if i % 2 == 0 { "paused" } else { "resumed" };
        lines.push_str(&format!("{{\"time\":\"t{i}\",\"event\":\"{event}\"}}\n"));
        if i % 7 == 0 {
            lines.push_str("not an event\n");
        }
    }
    append(lines.as_bytes());
    let all: Vec<String> = dir
        .read_events(0, usize::MAX)
        .unwrap()
        .iter()
        .map(|e| serde_json::to_value(&e.event).unwrap()["event"].to_string())
        .collect();
    assert!(all.len() >= 42, "{all:?}");

    // Three at a time, each from the last answer's `next`.
    let (mut got, mut next) = (Vec::new(), 0);
    loop {
        let (names, n) = page(next, 3);
        if names.is_empty() {
            break;
        }
        assert_eq!(n, next + names.len() as u64);
        got.extend(names);
        next = n;
    }
    assert_eq!(got, all);

    // Half a line: not an event until its newline comes.
    append(b"{\"time\":\"late\",\"event\":\"pau");
    assert_eq!(page(next, 3), (vec![], next));
    append(b"sed\"}\n");
    assert_eq!(page(next, 3), (vec!["\"paused\"".to_string()], next + 1));
    next += 1;

    // The log rewritten under the console: where the last answer ended is now inside a line,
    // so the answer counts from the new top rather than read on from the middle of it.
    let len = std::fs::metadata(dir.events_path()).unwrap().len() as usize;
    let mut rewritten = format!("{}\n", "y".repeat(len + 100));
    for i in 0..next + 2 {
        rewritten.push_str(&format!("{{\"time\":\"r{i}\",\"event\":\"resumed\"}}\n"));
    }
    std::fs::write(dir.events_path(), rewritten).unwrap();
    let (names, n) = page(next, 10);
    assert_eq!(names, vec!["\"resumed\"".to_string(); 2]);
    assert_eq!(n, next + 2);
    home.ok(&["stop", &id]);
}

/// `runs` with `live` answers the runs that have not ended, and without it every run.
#[test]
fn runs_asked_live_are_the_ones_not_ended() {
    use gpupilot::protocol::{Request, Response};

    let home = Home::new();
    let _d = home.daemon(&[]);
    let ended = home
        .ok(&["run", "--detach", "--name", "done", "--", "true"])
        .trim()
        .to_string();
    let live = home
        .ok(&["run", "--detach", "--name", "live", "--", "sleep", "60"])
        .trim()
        .to_string();
    let client = home.client();
    let ids = |live: bool| -> Vec<String> {
        match client.request(Request::Runs { run: None, live }).unwrap() {
            Response::Runs { runs } => runs.into_iter().map(|r| r.id).collect(),
            other => panic!("{other:?}"),
        }
    };
    wait_for("the first run to end", Duration::from_secs(10), || {
        ids(true) == [live.clone()]
    });
    assert_eq!(ids(false), [ended, live.clone()]);
    home.ok(&["stop", &live]);
    assert!(ids(true).is_empty());
}
