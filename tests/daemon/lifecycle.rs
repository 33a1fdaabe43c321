//! A daemon's life as a user sees it from the command line: a command that starts one in the
//! background says so once; `gpupilot daemon stop` stops it, leaves its runs running (the next
//! daemon adopts them) and says when none runs; a run is reached by a name that is also a
//! keyword or looks like an id; `top` is the console.

use std::time::Duration;

use crate::support::home::Home;
use crate::support::json;
use crate::support::wait::wait_for;

/// The lines of `text` that tell of a daemon started in the background.
fn start_notices(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.contains("started a gpupilot daemon"))
        .collect()
}

/// A command that starts a daemon says so once, with where and how to stop it; a command that
/// finds one running says nothing of the kind.
#[test]
fn a_daemon_started_in_the_background_is_announced_once() {
    let home = Home::new();
    let first = home.run(&["power"], Duration::from_secs(30));
    assert!(first.status.success());
    let err = String::from_utf8_lossy(&first.stderr);
    let notices = start_notices(&err);
    assert_eq!(notices.len(), 1, "{err}");
    let root = home.root().display().to_string();
    assert!(
        notices[0].contains("(sim source, pid ")
            && notices[0].contains(&format!("in GPUPILOT_HOME={root};"))
            && notices[0].contains("stop it with `gpupilot daemon stop`"),
        "{}",
        notices[0]
    );
    let pid = gpupilot::daemon::lock_holder(&home.paths).expect("a daemon runs");
    assert!(
        notices[0].contains(&format!("pid {pid})")),
        "{}",
        notices[0]
    );
    // Found running: no notice, from `power` or from `run`.
    for args in [&["power"][..], &["run", "--detach", "--", "true"]] {
        let out = home.run(args, Duration::from_secs(30));
        assert!(out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(start_notices(&err).is_empty(), "{args:?}: {err}");
    }
    home.ok(&["daemon", "stop"]);
    // And `run` starting one says so too.
    let out = home.run(&["run", "--detach", "--", "true"], Duration::from_secs(30));
    assert!(out.status.success());
    assert_eq!(
        start_notices(&String::from_utf8_lossy(&out.stderr)).len(),
        1
    );
}

/// `daemon stop` stops the daemon cleanly, and its live run goes on; the next daemon adopts
/// it. With none running it fails and says so.
#[test]
fn daemon_stop_stops_it_and_leaves_its_runs_running() {
    let home = Home::new();
    home.ok(&["daemon", "--detach"]);
    let pid = gpupilot::daemon::lock_holder(&home.paths).expect("a daemon runs");
    let run = home
        .ok(&["run", "--detach", "--name", "nap", "--", "sleep", "60"])
        .trim()
        .to_string();
    let run_pid = home.client().run(&run).unwrap().pid.expect("the run's pid");

    let out = home.run(&["daemon", "stop"], Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("stopped the gpupilot daemon (pid {pid})"))
            && err.contains("its live run goes on, and the next daemon adopts it"),
        "{err}"
    );
    assert_eq!(gpupilot::daemon::lock_holder(&home.paths), None);
    assert!(!home.socket().exists(), "the daemon removed its socket");
    // Gone, or a zombie that init has not reaped yet.
    assert!(
        gpupilot::supervisor::procfs::stat(pid).map_or(true, |s| !s.is_running()),
        "the daemon's process has ended"
    );
    assert!(
        std::path::Path::new(&format!("/proc/{run_pid}")).exists(),
        "the run goes on"
    );

    // None runs now: said, with a failing status.
    let out = home.run(&["daemon", "stop"], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no gpupilot daemon runs for GPUPILOT_HOME="),
        "{err}"
    );

    // The next daemon adopts the run, still running.
    home.ok(&["daemon", "--detach"]);
    wait_for("the run adopted", Duration::from_secs(10), || {
        let ps = json(&home.ok(&["ps", "--json"]));
        ps[0]["id"] == run.as_str() && ps[0]["status"] == "running" && ps[0]["adopted"] == true
    });
    home.ok(&["stop", &run, "--kill"]);
    home.ok(&["daemon", "stop"]);
}

/// A run named `last` or `2026` (a keyword, the start of every id) is reached as `name:last`,
/// `name:2026`; the bare words keep their meaning, and the ambiguous one says how to choose.
#[test]
fn a_run_named_like_a_keyword_or_an_id_is_reached_by_name() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let start = |name: &str| {
        home.ok(&["run", "--detach", "--name", name, "--", "sleep", "60"])
            .trim()
            .to_string()
    };
    let last = start("last");
    let year = start("2026");
    let newest = start("train");
    let id_of = |spec: &str| {
        home.client()
            .run(spec)
            .map(|i| i.id)
            .map_err(|e| e.to_string())
    };
    assert_eq!(id_of("name:last"), Ok(last.clone()));
    assert_eq!(
        id_of("last"),
        Ok(newest.clone()),
        "`last` is the newest run"
    );
    assert_eq!(id_of("name:2026"), Ok(year.clone()));
    let err = id_of("2026").unwrap_err();
    assert!(
        err.contains("`2026` is the name of run")
            && err.contains(&year)
            && err.contains("say `name:2026`"),
        "{err}"
    );
    // Through the commands too: `stop name:last` stops that run, and only it.
    let out = home.run(&["stop", "name:last", "--kill"], Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = home.run(&["stop", "2026"], Duration::from_secs(30));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("name:2026"));
    wait_for("the run named last to end", Duration::from_secs(10), || {
        let ps = json(&home.ok(&["ps", "--json"]));
        ps.as_array()
            .unwrap()
            .iter()
            .all(|r| (r["id"] == last.as_str()) == (r["status"] != "running"))
    });
    for id in [&year, &newest] {
        home.ok(&["stop", id, "--kill"]);
    }
}

/// `gpupilot top`, what nvtop and htop users type, is the console (clap offered `stop` for
/// it, a command that stops runs); a console with no terminal to draw on says so and starts
/// no daemon to show.
#[test]
fn top_is_the_console_and_no_terminal_starts_no_daemon() {
    let home = Home::new();
    for args in [&["top"][..], &[]] {
        let out = home.run(args, Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("the console needs a terminal") && !err.contains("stop"),
            "{args:?}: {err}"
        );
        assert_eq!(gpupilot::daemon::lock_holder(&home.paths), None, "{args:?}");
        assert!(start_notices(&err).is_empty(), "{err}");
    }
    let help = home.ok(&["--help"]);
    assert!(
        help.lines()
            .any(|l| l.trim_start().starts_with("top ") && l.contains("The console")),
        "{help}"
    );
}
