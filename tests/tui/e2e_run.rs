//! End to end: `gpupilot run -- …` in a tmux pane opens the console on the new run's Run view
//! (a daemon is started in the background), `q` detaches and the run goes on, `gpupilot
//! attach` shows it again, and `s` then `y` in the console stops it.
//!
//! A temporary GPUPILOT_HOME and `--source sim` keep it off the machine's real GPUs and
//! daemon; the home's guard kills the daemon and any run left when the test ends, the tmux
//! guard the server. Every wait is bounded.

use crate::support::home::Home;
use crate::support::proc::send;
use crate::support::tmux::{PROMPT, Tmux, WAIT};
use crate::support::wait::wait_for;

/// The runs `gpupilot ps --json` lists: (id, status).
fn ps(home: &Home) -> Vec<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(&home.ok(&["ps", "--json"])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                r["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn run_attach_and_stop_from_the_console() {
    let home = Home::new();
    let tmux = Tmux::start(&home.root());
    tmux.wait_text(PROMPT);
    let bin = env!("CARGO_BIN_EXE_gpupilot");
    let script = "for i in 1 2 3; do echo e2e-line-$i; done; exec sleep 600";
    tmux.type_line(&format!(
        "'{bin}' --source sim --gpus 2 run --name e2e -- bash -c '{script}'"
    ));

    // The console, on the run's Run view, with its output and the simulated GPUs' header.
    // (A capture can land in the middle of a frame: wait for the whole of what is expected.)
    let parts = [
        "e2e-line-1",
        "e2e-line-2",
        "e2e-line-3",
        " running ",
        "$ bash -c",
        "following",
        "3 Run",
        "2 GPUs",
    ];
    tmux.wait_screen("the Run view with the log", |s| {
        parts.iter().all(|p| s.contains(p))
    });

    // q detaches: the shell is back, the run goes on.
    tmux.keys(&["q"]);
    let after = tmux.wait_prompt();
    assert!(after.contains("detached; run"), "{after}");
    let runs = ps(&home);
    assert_eq!(runs.len(), 1, "{runs:?}");
    let (id, status) = &runs[0];
    assert!(id.ends_with("-e2e"), "{id}");
    assert_eq!(status, "running", "the run outlives the console");

    // attach shows it again: same run, same output.
    tmux.type_line(&format!("clear; '{bin}' attach"));
    tmux.wait_screen("the Run view again", |s| {
        s.contains("e2e-line-3") && s.contains(&format!("Run {id}")) && s.contains(" running ")
    });

    // s asks, y stops; the view shows the end.
    tmux.keys(&["s"]);
    tmux.wait_text(&format!("Stop run {id}?"));
    tmux.keys(&["y"]);
    // Its status, and how it ended.
    tmux.wait_screen("the run stopped", |s| {
        s.contains(" stopped ") && s.contains("exits: killed by SIGTERM")
    });
    tmux.keys(&["q"]);
    let end = tmux.wait_prompt();
    assert!(end.contains(&format!("run {id} has ended")), "{end}");
    assert_eq!(ps(&home), [(id.clone(), "stopped".to_string())]);
}

/// The gpupilot process running in the pane (a child of the pane's shell).
fn console_pid(tmux: &Tmux) -> Option<u32> {
    let shell: u32 = tmux.flag("pane_pid").trim().parse().ok()?;
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        let comm = &stat[stat.find('(')? + 1..stat.rfind(')')?];
        (ppid == shell && comm == "gpupilot").then_some(pid)
    })
}

/// A run printing numbered lines outlives the console twice — `q`, then a hangup of the
/// console as an SSH drop delivers it — finishes on its own, and its log holds every line
/// exactly once.
#[test]
fn a_run_survives_quit_and_hangup_of_the_console() {
    let home = Home::new();
    let tmux = Tmux::start(&home.root());
    tmux.wait_text(PROMPT);
    let bin = env!("CARGO_BIN_EXE_gpupilot");
    let n = 120;
    let script = format!("for i in $(seq 1 {n}); do echo n-$i; sleep 0.05; done");
    tmux.type_line(&format!(
        "'{bin}' --source sim --gpus 2 run --name count -- bash -c '{script}'"
    ));
    tmux.wait_screen("the Run view", |s| {
        s.contains(" running ") && s.contains("3 Run")
    });

    // (a) quit.
    tmux.keys(&["q"]);
    tmux.wait_prompt();
    assert_eq!(ps(&home)[0].1, "running");

    // (b) hangup: attach again, then SIGHUP to the console process itself.
    tmux.type_line(&format!("clear; '{bin}' attach"));
    let seen = tmux.wait_screen("the Run view again", |s| {
        s.contains(" running ") && s.contains("3 Run") && newest_line(s).is_some()
    });
    // The log continues on screen after attaching.
    let before = newest_line(&seen).unwrap();
    tmux.wait_screen("newer log lines", |s| {
        newest_line(s).is_some_and(|n| n > before)
    });
    let pid = console_pid(&tmux).expect("the console's pid");
    send(pid, rustix::process::Signal::HUP);
    wait_for("the console to end on SIGHUP", WAIT, || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
    });
    assert_eq!(
        ps(&home)[0].1,
        "running",
        "the hangup reached only the console"
    );
    // It ended as quitting does (not killed by the signal): the terminal was given back.
    tmux.wait_prompt();
    assert_eq!(
        tmux.flag("alternate_on"),
        "0",
        "the console left the alternate screen on its way out"
    );

    // The run finishes by itself; every line is there once, in order.
    wait_for("the run to finish", WAIT, || ps(&home)[0].1 == "succeeded");
    let id = ps(&home)[0].0.clone();
    let log = std::fs::read_to_string(home.run_dir(&id).stdout_path()).unwrap();
    let want: Vec<String> = (1..=n).map(|i| format!("n-{i}")).collect();
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        want,
        "every line once, in order"
    );
}

/// The highest `n-N` log line on the screen.
fn newest_line(screen: &str) -> Option<u32> {
    screen
        .split(|c: char| c.is_whitespace() || c == '│')
        .filter_map(|w| w.strip_prefix("n-")?.parse().ok())
        .max()
}
