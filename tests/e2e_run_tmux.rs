//! End to end: `gpupilot run -- …` in a tmux pane opens the console on the new run's Run view
//! (a daemon is started in the background), `q` detaches and the run goes on, `gpupilot
//! attach` shows it again, and `s` then `y` in the console stops it.
//!
//! A temporary GPUPILOT_HOME and `--source sim` keep it off the machine's real GPUs and
//! daemon; the home's guard kills the daemon and any run left when the test ends, the tmux
//! guard the server. Every wait is bounded.

mod daemon_common;
mod e2e_common;

use daemon_common::Home;
use e2e_common::Tmux;

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
    tmux.wait_text(e2e_common::PROMPT);
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
    tmux.wait_for("the Run view with the log", |s| {
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
    tmux.wait_for("the Run view again", |s| {
        s.contains("e2e-line-3") && s.contains(&format!("Run {id}")) && s.contains(" running ")
    });

    // s asks, y stops; the view shows the end.
    tmux.keys(&["s"]);
    tmux.wait_text(&format!("Stop run {id}?"));
    tmux.keys(&["y"]);
    // Its status, and how it ended.
    tmux.wait_for("the run stopped", |s| {
        s.contains(" stopped ") && s.contains("exits: killed by SIGTERM")
    });
    tmux.keys(&["q"]);
    let end = tmux.wait_prompt();
    assert!(end.contains(&format!("run {id} has ended")), "{end}");
    assert_eq!(ps(&home), [(id.clone(), "stopped".to_string())]);
}
