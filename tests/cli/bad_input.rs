//! Bad input on the command line, as a user types it: each is refused with a clear message, a
//! non-zero exit, and nothing changed (the daemon's settings stay as they were).

use std::process::Output;
use std::time::Duration;

use crate::support::home::Home;
use crate::support::wait::wait_for;

const T: Duration = Duration::from_secs(30);

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The command failed (exit 1 or 2, never a panic's 101) and said something short and useful.
fn refused(out: &Output, what: &str) -> String {
    let err = stderr(out);
    let code = out.status.code();
    assert!(
        matches!(code, Some(1 | 2)),
        "{what}: exit {:?}, expected a refusal\nstdout: {}\nstderr: {err}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!err.trim().is_empty(), "{what}: refused without a word");
    assert!(
        !err.contains("panicked"),
        "{what}: a panic is no message: {err}"
    );
    // No number printed with dozens of digits.
    let longest_digits = err
        .split(|c: char| !c.is_ascii_digit())
        .map(str::len)
        .max()
        .unwrap_or(0);
    assert!(
        longest_digits <= 20,
        "{what}: a number of {longest_digits} digits: {err}"
    );
    err
}

fn budget_w(home: &Home) -> Option<f64> {
    let out = home.ok(&["budget", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["budget"]["budget_w"].as_f64()
}

fn cap_w(home: &Home, gpu: usize) -> f64 {
    let out = home.ok(&["power", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["gpus"][gpu]["power"]["current_w"].as_f64().unwrap()
}

#[test]
fn non_finite_and_absurd_numbers_are_refused_and_change_nothing() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    home.ok(&["budget", "2000"]);
    home.ok(&["power", "cap", "400"]);
    assert_eq!(budget_w(&home), Some(2000.0));
    for args in [
        &["budget", "nan"][..],
        &["budget", "inf"],
        &["budget", "--", "-inf"],
        &["budget", "NaN"],
        &["budget", "1e308"],
        &["budget", "0"],
        &["budget", "--", "-5"],
    ] {
        let out = home.run(args, T);
        let err = refused(&out, &format!("{args:?}"));
        assert!(
            err.contains("budget") || err.contains("watts"),
            "{args:?}: {err}"
        );
        assert_eq!(budget_w(&home), Some(2000.0), "{args:?} changed the budget");
    }
    for args in [
        &["power", "cap", "nan"][..],
        &["power", "cap", "inf"],
        &["power", "cap", "1e300"],
        &["power", "cap", "--", "-300"],
        &["power", "gpu-max", "nan"],
        &["power", "gpu-max", "1e300"],
        &["thermal", "target", "nan"],
        &["thermal", "target", "1e300"],
        &["thermal", "target", "--margin", "inf"],
        &["stop", "last", "--grace", "nan"],
        &["status", "--timeout", "nan"],
        &["set", "last", "batch-size", "8", "--timeout", "inf"],
        &["tune", "energy", "last", "--step-w", "nan"],
    ] {
        let out = home.run(args, T);
        let err = refused(&out, &format!("{args:?}"));
        assert!(
            !err.contains("frame") && !err.contains("target_c"),
            "{args:?}: a message about the protocol, not the number: {err}"
        );
        assert!(
            err.contains("number") || err.contains("between"),
            "{args:?}: does not say what a good value is: {err}"
        );
    }
    assert_eq!(cap_w(&home, 0), 400.0, "a refused cap moved GPU 0");
    assert_eq!(cap_w(&home, 1), 400.0, "a refused cap moved GPU 1");
    let err = stderr(&home.run(&["budget", "nan"], T));
    assert!(err.contains("`nan`"), "the value as typed: {err}");
}

/// A socket whose reader has gone: every write to it fails with EPIPE, as to `… | head` once
/// head has exited (deterministic, unlike a real head).
fn closed_pipe() -> std::os::unix::net::UnixStream {
    let (w, r) = std::os::unix::net::UnixStream::pair().unwrap();
    drop(r);
    w
}

fn into_stdio(s: &std::os::unix::net::UnixStream) -> std::process::Stdio {
    std::process::Stdio::from(std::os::fd::OwnedFd::from(s.try_clone().unwrap()))
}

#[test]
fn a_reader_that_went_away_is_no_panic() {
    let home = Home::new();
    let good = home.dir.path().join("good.toml");
    std::fs::write(&good, "name = \"g\"\n[run]\ncommand = [\"true\"]\n").unwrap();
    let bad = home.dir.path().join("bad.toml");
    std::fs::write(&bad, "name = \"g\"\n[run]\ncommand = 3\n").unwrap();
    for (args, want) in [
        (vec!["profile", "check", good.to_str().unwrap()], 0),
        (vec!["profile", "check", bad.to_str().unwrap()], 1),
        (vec!["status"], 0),
        (vec!["ps"], 1),
    ] {
        let pipe = closed_pipe();
        let status = home
            .gpupilot(&args)
            .stdout(into_stdio(&pipe))
            .stderr(into_stdio(&pipe))
            .status()
            .unwrap();
        assert_eq!(
            status.code(),
            Some(want),
            "{args:?} into a closed pipe: {status}"
        );
    }
}

/// A run of the synthetic trainer from a profile whose `[run]` ends with `extra`; its id.
fn start_trainer(home: &Home, name: &str, extra: &str) -> String {
    let path = home.dir.path().join(format!("{name}.toml"));
    let bin = env!("CARGO_BIN_EXE_gpupilot");
    let body = format!(
        "name = \"{name}\"\n[run]\ncommand = [\"{bin}\", \"synthetic-train\", \"--speed\", \"4\"]\n{extra}\n"
    );
    std::fs::write(&path, body).unwrap();
    home.ok(&["run", "--detach", &path.display().to_string()])
        .trim()
        .to_string()
}

#[test]
fn a_run_that_sees_no_gpu_is_not_tuned_on_every_gpu() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    for (name, extra) in [
        ("empty", "gpus = []"),
        ("comma", "env = { CUDA_VISIBLE_DEVICES = \",\" }"),
    ] {
        let run = start_trainer(&home, name, extra);
        let out = home.run(
            &[
                "tune",
                "energy",
                &run,
                "--seconds",
                "1",
                "--warmup",
                "1",
                "--step-w",
                "250",
            ],
            Duration::from_secs(60),
        );
        let err = refused(&out, name);
        assert!(err.contains("no GPU"), "{name}: {err}");
        assert_eq!(cap_w(&home, 0), 700.0, "{name}: GPU 0's cap moved");
        assert_eq!(cap_w(&home, 1), 700.0, "{name}: GPU 1's cap moved");
        home.ok(&["stop", &run, "--kill"]);
    }
}

#[test]
fn a_profile_that_is_not_a_regular_file_is_refused_at_once() {
    let home = Home::new();
    let fifo = home.dir.path().join("fifo.toml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let big = home.dir.path().join("big.toml");
    let mut text = String::from("name = \"big\"\n[run]\ncommand = [\"true\"]\n");
    while text.len() < 2 << 20 {
        text.push_str("# padding padding padding padding padding padding padding padding\n");
    }
    std::fs::write(&big, text).unwrap();
    let dir = home.dir.path().join("adir");
    std::fs::create_dir(&dir).unwrap();
    for (path, says) in [
        (&fifo, "not a regular file"),
        (&big, "larger than"),
        (&dir, "directory"),
    ] {
        let p = path.display().to_string();
        for args in [vec!["profile", "check", &p], vec!["run", "--detach", &p]] {
            let out = home.run(&args, Duration::from_secs(10));
            let err = refused(&out, &format!("{args:?}"));
            assert!(err.contains(says), "{args:?}: {err}");
            assert!(
                err.matches("os error").count() <= 1 && err.matches(says).count() == 1,
                "{args:?}: the reason said twice: {err}"
            );
        }
    }
}

#[test]
fn run_names_are_checked_where_the_user_wrote_them() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let long = "x".repeat(300);
    for name in ["a b/c", "../x", "", long.as_str(), "tab\there"] {
        let out = home.run(&["run", "--detach", "--name", name, "--", "true"], T);
        let err = refused(&out, name);
        assert!(
            !err.contains("run.toml") && !err.contains("File name too long"),
            "{name}: {err}"
        );
        assert!(err.contains("--name"), "{name}: {err}");
    }
    let err = stderr(&home.run(&["run", "--detach", "--name", &long, "--", "true"], T));
    assert!(err.contains("64"), "the limit: {err}");
    let file = home.dir.path().join("long.toml");
    std::fs::write(
        &file,
        format!("name = \"{long}\"\n[run]\ncommand = [\"true\"]\n"),
    )
    .unwrap();
    let p = file.display().to_string();
    for args in [vec!["profile", "check", &p], vec!["run", "--detach", &p]] {
        let err = refused(&home.run(&args, T), "a long name in a profile");
        assert!(err.contains("long.toml:1:8") && err.contains("64"), "{err}");
    }
    // A long file name makes a name that fits.
    let file = home.dir.path().join(format!("{}.toml", "y".repeat(200)));
    std::fs::write(&file, "[run]\ncommand = [\"true\"]\n").unwrap();
    let id = home.ok(&["run", "--detach", &file.display().to_string()]);
    assert!(id.trim().len() < 100, "{id}");
    let runs = home.client().runs().unwrap();
    assert_eq!(runs.len(), 1, "only the last run started");
}

#[test]
fn a_knob_restart_that_loses_the_work_says_so_and_changes_nothing() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let path = home.dir.path().join("nosdk.toml");
    std::fs::write(
        &path,
        "name = \"nosdk\"\n[run]\ncommand = [\"sh\", \"-c\", \"echo step 7 loss 1.5; sleep 60\", \"x\", \"{batch_size}\"]\n\
         [knobs.batch_size]\ninitial = 32\nmin = 8\nmax = 512\n\
         [metrics]\npatterns = ['step (?P<step>\\d+) loss (?P<loss>[0-9.]+)']\n",
    )
    .unwrap();
    let run = home
        .ok(&["run", "--detach", &path.display().to_string()])
        .trim()
        .to_string();
    let c = home.client();
    wait_for("the step to be parsed", Duration::from_secs(20), || {
        c.run_metrics(&run, 0)
            .is_ok_and(|m| m.points.iter().any(|p| p.report.step == Some(7)))
    });
    let out = home.run(&["set", &run, "batch-size", "64"], T);
    let err = refused(&out, "a restart without --restart");
    assert!(err.contains("lost"), "says the work is lost: {err}");
    assert!(err.contains("step 7"), "the last step seen: {err}");
    assert!(err.contains("resume_args"), "what would keep it: {err}");
    assert!(err.contains("--restart"), "how to go on: {err}");
    let info = c.run(&run).unwrap();
    assert_eq!(info.restarts, 0, "restarted anyway");
}

#[test]
fn run_dash_dash_declares_its_knobs_and_ps_keeps_one_line_per_run() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    // A placeholder without a declared knob: the message names --knob, not a run.toml.
    let out = home.run(
        &[
            "run",
            "--detach",
            "--",
            "sh",
            "-c",
            "sleep 30",
            "x",
            "{batch_size}",
        ],
        T,
    );
    let err = refused(&out, "an undeclared placeholder");
    assert!(err.contains("--knob") && !err.contains("run.toml"), "{err}");

    // Declared: the command gets its starting value, and the knob its range.
    let id = home
        .ok(&[
            "run",
            "--detach",
            "--knob",
            "batch_size=64:8..512",
            "--",
            "sh",
            "-c",
            "sleep 30",
            "x",
            "{batch_size}",
        ])
        .trim()
        .to_string();
    let c = home.client();
    let info = c.run(&id).unwrap();
    assert_eq!(
        info.command.last().map(String::as_str),
        Some("64"),
        "{info:?}"
    );
    let m = c.run_metrics(&id, 0).unwrap();
    let batch = m
        .trainer
        .knobs
        .iter()
        .find(|k| k.knob == gpupilot::protocol::KnobName::BatchSize)
        .and_then(|k| k.range)
        .map(|r| (r.min, r.max));
    assert_eq!(batch, Some((8, Some(512))));

    // A command with a newline in it is one row of `ps`.
    let other = home.ok(&["run", "--detach", "--", "sh", "-c", "sleep 30\necho broken"]);
    let ps = home.ok(&["ps"]);
    assert_eq!(ps.lines().count(), 3, "a header and two runs:\n{ps}");
    assert!(ps.contains("\\n"), "the newline shown escaped:\n{ps}");
    for run in [id.as_str(), other.trim()] {
        home.ok(&["stop", "--kill", run]);
    }
}
