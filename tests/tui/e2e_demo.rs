//! End to end: the real binary (`gpupilot demo`) in a 200×50 tmux pane, driven with
//! send-keys and read with capture-pane, the way a person at a terminal would use it.
//!
//! A shell with a known prompt runs in the pane and the command is typed into it, so the test
//! also sees that quitting hands the terminal back in a usable state. Every wait is bounded;
//! the tmux server is killed at the end whatever happens (a guard's Drop).

use crate::support::tmux::{PROMPT, Tmux};

/// The numbers before `unit` on lines that start (inside a border) with `label`.
fn readings(screen: &str, label: &str, unit: &str) -> Vec<f64> {
    screen
        .lines()
        .filter_map(|l| {
            let rest = l.trim_start_matches(['│', ' ']).strip_prefix(label)?;
            let before = &rest[..rest.find(unit)?];
            before
                .split_whitespace()
                .last()?
                .split('/')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// The demo run's directory, as the Run view shows it; it exists.
fn demo_dir(run_view: &str) -> std::path::PathBuf {
    let dir = run_view
        .split_whitespace()
        .find(|w| w.contains("gpupilot-demo-"))
        .map(|w| std::path::PathBuf::from(w.trim_end_matches(['│', ' '])))
        .expect("the run's directory on screen");
    assert!(dir.is_dir(), "{}", dir.display());
    dir
}

/// The screen below the header and host lines (the CPU figure there changes on its own).
fn body(screen: &str) -> String {
    screen.lines().skip(3).collect::<Vec<_>>().join("\n")
}

#[test]
fn demo_in_tmux() {
    let home = tempfile::tempdir().unwrap();
    let tmux = Tmux::start(home.path());
    tmux.wait_text(PROMPT);
    let bin = env!("CARGO_BIN_EXE_gpupilot");
    // Without GPUPILOT_HOME: a temporary home of the demo's own.
    tmux.keys(&["-l", &format!("env -u GPUPILOT_HOME '{bin}' demo")]);
    tmux.keys(&["Enter"]);

    // The overview: four simulated H100s, with live numbers.
    let first = tmux.wait_screen("four H100 blocks", |s| {
        s.matches("NVIDIA H100 80GB HBM3").count() == 4
    });
    assert_eq!(
        tmux.flag("alternate_on"),
        "1",
        "the console uses the alternate screen"
    );
    assert_eq!(tmux.flag("mouse_any_flag"), "1", "mouse reporting is on");
    assert!(
        first.contains("driver 550.54.15") && first.contains("CUDA 12.4"),
        "{first}"
    );
    let utils = readings(&first, "util", " %");
    assert_eq!(utils.len(), 4, "a utilization per GPU:\n{first}");
    assert!(utils.iter().all(|u| (0.0..=100.0).contains(u)), "{utils:?}");
    let powers = readings(&first, "power", " W");
    assert_eq!(powers.len(), 4, "{first}");
    assert!(
        powers.iter().all(|p| *p > 50.0 && *p <= 700.0),
        "a training H100 draws real power under its 700 W cap: {powers:?}"
    );
    assert!(
        readings(&first, "temp", " °C")
            .iter()
            .all(|t| *t > 25.0 && *t < 100.0)
    );
    // Live: the body of the screen changes as samples arrive (values, sparklines).
    let before = body(&first);
    tmux.wait_screen("the numbers to move", |s| body(s) != before);

    // Views by key.
    tmux.keys(&["Tab"]);
    // A capture can land in the middle of a frame: wait for the whole view.
    tmux.wait_screen("the whole detail view", |detail| {
        [
            "Utilization",
            "Temperature",
            "Power",
            "SM clock",
            "Processes",
            "window 1m",
            "── cap 700 W",
        ]
        .iter()
        .all(|t| detail.contains(t))
    });
    tmux.keys(&["-"]);
    tmux.wait_text("window 10m");
    // The demo supervises a synthetic training run: the Run view shows it training, with its
    // trainer's reports in the log; the Events view shows it starting.
    tmux.keys(&["3"]);
    let run = tmux.wait_screen("the demo's run", |s| {
        s.contains("demo-train") && s.contains("running") && s.contains("samples_per_s")
    });
    let demo_dir = demo_dir(&run);
    tmux.keys(&["4"]);
    tmux.wait_screen("the run's start in the events", |s| {
        s.contains("demo-train") && s.contains("→ running")
    });
    tmux.keys(&["1"]);
    tmux.wait_text("selected: GPU 0");
    tmux.keys(&["j"]);
    tmux.wait_text("selected: GPU 1");

    // Help, generated from the keymap; Esc closes it.
    tmux.keys(&["?"]);
    let help = tmux.wait_text("Show this help");
    assert!(
        help.contains("Quit the console") && help.contains("Next view"),
        "{help}"
    );
    tmux.keys(&["Escape"]);
    tmux.wait_screen("the help to close", |s| !s.contains("Show this help"));

    // Resizes: smaller (compact blocks), too small (says so), and back.
    tmux.resize(80, 24);
    tmux.wait_screen("the 80×24 layout", |s| {
        s.lines().count() <= 24 && s.contains("selected: GPU 1") && s.contains("util")
    });
    tmux.resize(30, 10);
    tmux.wait_text("too small");
    tmux.resize(200, 50);
    tmux.wait_screen("the 200×50 layout again", |s| {
        s.matches("NVIDIA H100 80GB HBM3").count() == 4
    });

    // Ctrl-L redraws everything and the console is still there.
    tmux.keys(&["C-l"]);
    tmux.wait_text("selected: GPU 1");

    // Quit: the shell is back, in a usable state, and the console exited cleanly.
    tmux.keys(&["q"]);
    tmux.wait_screen("the shell prompt", |s| {
        s.lines()
            .rfind(|l| !l.trim().is_empty())
            .is_some_and(|l| l.trim_end() == PROMPT)
    });
    assert_eq!(
        tmux.flag("alternate_on"),
        "0",
        "the alternate screen was left"
    );
    assert_eq!(
        tmux.flag("mouse_any_flag"),
        "0",
        "mouse reporting was turned off"
    );
    tmux.keys(&["-l", "echo rc=$? E2E_$((6*7))"]);
    tmux.keys(&["Enter"]);
    let after = tmux.wait_text("rc=0 E2E_42");
    assert!(
        !after.contains("NVIDIA H100"),
        "the console's screen is gone:\n{after}"
    );
    // The demo's daemon and run are gone with it, and so is their directory.
    assert!(
        !demo_dir.exists(),
        "the demo left {} behind",
        demo_dir.display()
    );
}

/// A terminal that goes away (a dropped SSH session: the pty hangs up under the console) ends
/// the demo as quitting does: its daemon, its run and their directory go with it. The console
/// is the pane's own process, so its stderr is the terminal that has gone: a message written
/// there on the way out must not turn into a panic (which, inside the panic hook, aborts and
/// skips every clean-up).
#[test]
fn a_demo_whose_terminal_goes_away_leaves_nothing_behind() {
    let home = tempfile::tempdir().unwrap();
    let tmux = Tmux::start(home.path());
    tmux.wait_text(PROMPT);
    let bin = env!("CARGO_BIN_EXE_gpupilot");
    tmux.keys(&["-l", &format!("exec env -u GPUPILOT_HOME '{bin}' demo")]);
    tmux.keys(&["Enter"]);
    tmux.keys(&["3"]);
    let run = tmux.wait_screen("the demo's run", |s| {
        s.contains("demo-train") && s.contains("running")
    });
    let demo_dir = demo_dir(&run);

    // The terminal goes: tmux closes the pty, and the console gets SIGHUP.
    tmux.run(&["kill-server"]);
    crate::support::wait::wait_for(
        "the demo to stop its node and remove its directory",
        std::time::Duration::from_secs(20),
        || !demo_dir.exists(),
    );
}

/// `gpupilot ps` (as `bin`) with GPUPILOT_HOME=`home`.
fn ps(home: &std::path::Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gpupilot"))
        .arg("ps")
        .env("GPUPILOT_HOME", home)
        .env_remove("GPUPILOT_SYSTEM")
        .output()
        .unwrap()
}

/// Wait until `gpupilot ps` in `home`, as a second terminal would run it, lists the demo's run.
fn wait_for_demo_run(home: &std::path::Path) {
    crate::support::wait::wait_for(
        &format!(
            "the demo's run in `GPUPILOT_HOME={} gpupilot ps`",
            home.display()
        ),
        std::time::Duration::from_secs(15),
        || {
            let out = ps(home);
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("demo-train")
        },
    );
}

/// The demo says, before the console takes the screen, how a second terminal reaches its
/// daemon; that command answers with the demo's run while the demo runs, and on the way out
/// the demo says what it removed.
#[test]
fn the_demo_says_how_a_second_terminal_reaches_its_daemon() {
    let home = tempfile::tempdir().unwrap();
    let said = home.path().join("demo.stderr");
    let tmux = Tmux::start(home.path());
    tmux.wait_text(PROMPT);
    let bin = env!("CARGO_BIN_EXE_gpupilot");
    tmux.type_line(&format!(
        "env -u GPUPILOT_HOME '{bin}' demo 2>'{}'",
        said.display()
    ));
    tmux.wait_screen("the console", |s| {
        s.matches("NVIDIA H100 80GB HBM3").count() == 4
    });
    let text = std::fs::read_to_string(&said).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("from another terminal"))
        .unwrap_or_else(|| panic!("no line that says how to reach the demo: {text}"));
    let (_, command) = line.split_once("from another terminal: ").unwrap();
    let demo_home = command
        .strip_prefix("GPUPILOT_HOME=")
        .and_then(|c| c.strip_suffix(" gpupilot ps"))
        .unwrap_or_else(|| panic!("{line}"));
    assert!(demo_home.contains("gpupilot-demo-"), "{line}");
    let demo_home = std::path::PathBuf::from(demo_home);
    assert!(demo_home.is_dir(), "{line}");
    // A second terminal, as the line says: the demo's daemon answers with its run.
    wait_for_demo_run(&demo_home);

    tmux.keys(&["q"]);
    tmux.wait_prompt();
    let text = std::fs::read_to_string(&said).unwrap();
    assert!(
        text.contains(&format!(
            "stopped its run and its daemon, and removed {}",
            demo_home.display()
        )),
        "{text}"
    );
    assert!(!demo_home.exists());
    assert!(
        !ps(&demo_home).status.success(),
        "no daemon answers there now"
    );
}

/// With GPUPILOT_HOME set (or --home), the demo's daemon lives there and the run's files stay;
/// a home where a daemon already runs is refused, saying why.
#[test]
fn the_demo_in_a_home_named_keeps_it_and_never_shares_it() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("demo-home");
    let tmux = Tmux::start(&home);
    tmux.wait_text(PROMPT);
    let bin = env!("CARGO_BIN_EXE_gpupilot");
    tmux.type_line(&format!("'{bin}' demo"));
    tmux.wait_screen("the console", |s| {
        s.matches("NVIDIA H100 80GB HBM3").count() == 4
    });
    wait_for_demo_run(&home);
    // A second demo in that home is refused before it starts anything.
    let out = std::process::Command::new(bin)
        .args(["demo", "--home"])
        .arg(&home)
        .env_remove("GPUPILOT_HOME")
        .env_remove("GPUPILOT_SYSTEM")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already runs in") && err.contains(&home.display().to_string()),
        "{err}"
    );
    assert!(err.contains("another --home DIR"), "{err}");

    tmux.keys(&["q"]);
    let screen = tmux.wait_prompt();
    assert!(
        screen.contains("from another terminal") && screen.contains("keeps the run's files"),
        "{screen}"
    );
    assert!(!ps(&home).status.success(), "the demo's daemon has stopped");
    let runs: Vec<_> = std::fs::read_dir(home.join("state/runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        runs.len() == 1 && runs[0].ends_with("demo-train"),
        "the run's files stay: {runs:?}"
    );
}
