//! `gpupilot events` against a daemon on the simulator: the console's words with the time,
//! JSON lines with the structured fields and the undo, --since, --gpu and --run, --follow
//! printing a change made while it runs and ending when the daemon goes away, and bad input.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use crate::support::home::{Home, QUICK_SEARCH};
use crate::support::wait::{finish, poll};
use rustix::process::Signal;

/// A daemon on two simulated H100s (default limit 700 W) whose GPU 1 was capped at 300 W.
fn capped() -> (Home, crate::support::home::DaemonProc) {
    let home = Home::new();
    let d = home.daemon(&[]);
    home.ok(&["power", "cap", "300", "--gpu", "1", "--why", "too hot"]);
    (home, d)
}

#[test]
fn events_prints_each_change_whole_with_its_time() {
    let (home, _d) = capped();
    let out = home.ok(&["events"]);
    let line = out
        .lines()
        .find(|l| l.contains("power limit"))
        .unwrap_or_else(|| panic!("no power limit change:\n{out}"));
    // `2026-12-06T05:11:51Z  root (uid 0) via gpupilot (pid N): GPU 1 power limit 700 W → 300 W — too hot`
    let (time, words) = line.split_once("  ").unwrap();
    assert!(
        time.len() == 20 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "{line}"
    );
    assert!(
        words.contains("(uid 0) via gpupilot")
            && words.ends_with(": GPU 1 power limit 700 W → 300 W — too hot"),
        "{line}"
    );
    assert!(
        out.lines().next().unwrap().contains("daemon started"),
        "oldest first:\n{out}"
    );
    assert!(
        !out.contains('{') && !out.contains("=\""),
        "no dumps of fields:\n{out}"
    );
}

#[test]
fn json_lines_carry_the_fields_the_words_and_the_undo() {
    let (home, _d) = capped();
    let out = home.ok(&["events", "--json"]);
    let events: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let cap = events
        .iter()
        .find(|e| e["event"] == "gpu_changed")
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(cap["gpu"], 1);
    assert_eq!(cap["what"], "power_limit");
    assert_eq!(cap["old"], "700 W");
    assert_eq!(cap["new"], "300 W");
    assert_eq!(cap["why"], "too hot");
    assert_eq!(cap["undo"], "gpupilot power cap 700 --gpu 1");
    assert!(
        cap["text"]
            .as_str()
            .unwrap()
            .ends_with("GPU 1 power limit 700 W → 300 W — too hot")
    );
    assert!(cap["seq"].as_u64().unwrap() > 1 && cap["time"].is_string());
    let started = &events[0];
    assert_eq!(started["event"], "daemon_started");
    assert!(started["undo"].is_null());
}

#[test]
fn since_gpu_and_run_pick_the_events() {
    let (home, _d) = capped();
    let all = home.ok(&["events"]);
    assert_eq!(home.ok(&["events", "--since", "1h"]), all);
    assert_eq!(
        home.ok(&["events", "--since", "2999-01-01T00:00:00Z"]),
        "",
        "none from the future"
    );
    let gpu1 = home.ok(&["events", "--gpu", "1"]);
    assert_eq!(gpu1.lines().count(), 1, "{gpu1}");
    assert!(gpu1.contains("GPU 1 power limit 700 W → 300 W"), "{gpu1}");
    assert_eq!(home.ok(&["events", "--gpu", "0"]), "", "nothing on GPU 0");
    // A run's own events: its start, and not the cap.
    let run = home.start_synthetic();
    let mine = poll(
        "the run's start in the events",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || {
            let out = home.ok(&["events", "--run", &run]);
            if out.contains(&run) && out.contains("→ running") {
                Ok(out)
            } else {
                Err(format!("; so far:\n{out}"))
            }
        },
    );
    assert!(!mine.contains("power limit"), "{mine}");
    assert!(mine.lines().all(|l| l.contains(&run)), "{mine}");
}

#[test]
fn follow_prints_new_events_until_the_daemon_goes_away() {
    let (home, mut d) = capped();
    let mut child = home
        .gpupilot(&["events", "--follow", "--since", "10m"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let until = |what: &str, seen: &mut Vec<String>| {
        poll(
            what,
            Duration::from_secs(20),
            Duration::from_millis(10),
            || {
                while let Ok(l) = rx.try_recv() {
                    seen.push(l);
                }
                if seen.iter().any(|l| l.contains(what)) {
                    Ok(())
                } else {
                    Err(format!("; printed:\n{}", seen.join("\n")))
                }
            },
        )
    };
    until("GPU 1 power limit 700 W → 300 W", &mut seen);
    // A change made while it follows.
    home.ok(&["power", "cap", "250", "--gpu", "0"]);
    until("GPU 0 power limit 700 W → 250 W", &mut seen);
    assert_eq!(
        seen.iter()
            .filter(|l| l.contains("GPU 1 power limit"))
            .count(),
        1,
        "each event once:\n{}",
        seen.join("\n")
    );
    // The daemon goes away: the follower says so and ends.
    let (status, _) = d.signal_and_wait(Signal::TERM);
    assert!(status.success());
    let out = finish(child, "events --follow", Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the daemon went away") && err.contains("no more events to follow"),
        "{err}"
    );
}

#[test]
fn bad_input_is_refused_with_what_to_give() {
    let (home, _d) = capped();
    let out = home.run(&["events", "--since", "yesterday"], Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`yesterday` is not a time") && err.contains("15m"),
        "{err}"
    );
    let out = home.run(&["events", "--gpu", "one"], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(2));
    let out = home.run(&["events", "--run", "no-such-run"], Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("no-such-run"), "{err}");
}

#[test]
fn without_a_daemon_it_says_how_to_start_one() {
    let home = Home::new();
    let out = home.run(&["events"], Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("gpupilot daemon"), "{err}");
}

#[test]
fn an_energy_search_reads_as_the_tuner_s_steps_in_words() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let run = home.start_synthetic();
    let mut args = vec!["tune", "energy", &run];
    args.extend(QUICK_SEARCH);
    let out = home.run(&args, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = home.ok(&["events", "--gpu", "0"]);
    let job = format!("tune-{run}");
    for s in [
        format!("energy tuner: GPUs 0,1 cap 700 W → 450 W (job {job}, searching)"),
        format!("energy tuner: GPUs 0,1 search started on run {run} (job {job})"),
        "energy tuner: GPU 0 power limit 700 W → 450 W — trying a cap".to_string(),
    ] {
        assert!(text.contains(&s), "{s:?} missing:\n{text}");
    }
    assert!(
        !text.contains("cap_w=") && !text.contains("change="),
        "no dumps:\n{text}"
    );
    let json = home.ok(&["events", "--json", "--run", &run]);
    let step = json
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"] == "tune" && e["change"] == "cap" && e["cap_w"] == 450.0)
        .unwrap_or_else(|| panic!("{json}"));
    assert_eq!(step["gpus"], serde_json::json!([0, 1]));
    assert_eq!(step["old_w"], 700.0);
    assert_eq!(step["undo"], format!("gpupilot tune stop {job}"));
}
