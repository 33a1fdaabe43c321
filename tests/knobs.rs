//! Live knobs end to end: a real daemon, real supervised trainers (the synthetic trainer, which
//! speaks the trainer channel as the SDK does; an unmodified script; the stdlib SDK example),
//! and `gpupilot set` as a user types it.

mod daemon_common;

use std::path::Path;
use std::time::Duration;

use daemon_common::{Home, wait_for};
use gpupilot::client::Client;

const BIN: &str = env!("CARGO_BIN_EXE_gpupilot");

fn write_profile(home: &Home, name: &str, body: &str) -> String {
    let path = home.dir.path().join(format!("{name}.toml"));
    std::fs::write(&path, body).unwrap();
    path.display().to_string()
}

fn synthetic_profile(home: &Home, extra: &str) -> String {
    let body = format!(
        r#"name = "synth"
[run]
command = ["{BIN}", "synthetic-train", "--speed", "4"]
[run.restart]
on_oom = "halve_batch"
max_restarts = 4
backoff_s = 0
[knobs.batch_size]
initial = 256
min = 8
max = 16384
[knobs.prefetch]
initial = 2
min = 0
max = 16
{extra}"#
    );
    write_profile(home, "synth", &body)
}

fn start(home: &Home, profile: &str) -> String {
    home.ok(&["run", "--detach", profile]).trim().to_string()
}

/// Wait until the run's trainer is attached and has reported.
fn wait_attached(c: &Client, run: &str) {
    wait_for(
        "the trainer to attach and report",
        Duration::from_secs(20),
        || {
            c.run_metrics(run, 0)
                .is_ok_and(|m| m.trainer.attached && !m.points.is_empty())
        },
    );
}

/// The newest report's batch size.
fn reported_batch(c: &Client, run: &str) -> Option<i64> {
    c.run_metrics(run, 0).ok()?.trainer.last?.report.batch_size
}

fn events_named(home: &Home, name: &str) -> Vec<serde_json::Value> {
    home.node_events()
        .into_iter()
        .filter(|e| e["event"] == name)
        .collect()
}

#[test]
fn set_batch_size_reaches_the_trainer_and_bad_values_change_nothing() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let profile = synthetic_profile(&home, "");
    let run = start(&home, &profile);
    let c = home.client();
    wait_attached(&c, &run);
    assert_eq!(reported_batch(&c, &run), Some(256));

    let out = home.ok(&["set", &run, "batch-size", "512"]);
    assert!(out.contains("256 → 512 applied by the trainer"), "{out}");
    wait_for(
        "a report with the new batch size",
        Duration::from_secs(10),
        || reported_batch(&c, &run) == Some(512),
    );
    let applied = events_named(&home, "knob_applied");
    assert_eq!(applied.len(), 1, "{applied:?}");
    assert_eq!(applied[0]["value"], 512);
    let rtt = applied[0]["rtt_ms"].as_f64().unwrap();
    assert!(rtt > 0.0 && rtt < 10_000.0, "round trip {rtt} ms");
    let run_events =
        std::fs::read_to_string(home.run_dir(&run).path().join("events.jsonl")).unwrap();
    assert!(
        run_events.contains(r#""event":"knob_acked""#)
            && run_events.contains(r#""what":"batch_size""#),
        "{run_events}"
    );

    for bad in ["0", "-4", "16385"] {
        let out = home.run(&["set", &run, "batch-size", bad], Duration::from_secs(20));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} was taken");
        assert!(
            err.contains(&format!("batch_size = {bad} is outside"))
                && err.contains("8..=16384")
                && err.contains("nothing changed"),
            "{err}"
        );
    }
    let out = home.run(&["set", &run, "prefetch", "17"], Duration::from_secs(20));
    assert!(!out.status.success());
    assert_eq!(
        events_named(&home, "knob_changed").len(),
        1,
        "refusals change nothing"
    );
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(reported_batch(&c, &run), Some(512));

    // Prefetch too, and the daemon's view of the knobs.
    home.ok(&["set", &run, "prefetch", "6"]);
    let m = c.run_metrics(&run, 0).unwrap();
    let prefetch = m
        .trainer
        .knobs
        .iter()
        .find(|k| k.knob.as_str() == "prefetch")
        .unwrap();
    assert_eq!(
        (prefetch.value, prefetch.last_outcome.as_deref()),
        (Some(6), Some("applied"))
    );
    home.ok(&["stop", &run]);
}

#[test]
fn an_out_of_memory_batch_restarts_the_run_with_half() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let profile = synthetic_profile(&home, "");
    let run = start(&home, &profile);
    let c = home.client();
    wait_attached(&c, &run);
    // 4096 does not fit an 80 GB H100 with resnet50 (gpusim: ~190 GiB), 2048 neither, 1024 does.
    home.ok(&["set", &run, "batch-size", "4096"]);
    wait_for(
        "restarts down to a batch that fits",
        Duration::from_secs(30),
        || c.run(&run).is_ok_and(|r| r.restarts >= 2) && reported_batch(&c, &run) == Some(1024),
    );
    let info = c.run(&run).unwrap();
    assert_eq!(info.status.as_str(), "running");
    let stderr = std::fs::read_to_string(home.run_dir(&run).path().join("stderr.log")).unwrap();
    assert!(
        stderr.contains("out of memory: batch size 4096"),
        "{stderr}"
    );
    assert!(
        stderr.contains("out of memory: batch size 2048"),
        "{stderr}"
    );
    let events = std::fs::read_to_string(home.run_dir(&run).path().join("events.jsonl")).unwrap();
    assert!(
        events.contains(r#""new":"2048""#) && events.contains(r#""new":"1024""#),
        "{events}"
    );
    assert_eq!(events_named(&home, "trainer_error").len(), 2);
    // The new process was started with the halved value in its environment.
    let pid = info.pid.unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.contains("GPUPILOT_BATCH_SIZE=1024"), "{environ}");
    home.ok(&["stop", &run]);
}

fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap()
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect()
}

#[test]
fn an_unmodified_script_is_restarted_with_the_new_argument_and_its_output_is_read() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let script = home.dir.path().join("train.sh");
    std::fs::write(
        &script,
        "i=0\nwhile true; do i=$((i+1)); echo \"step $i loss=0.$((100 - i % 50)) bs=$2\"; sleep 0.05; done\n",
    )
    .unwrap();
    let body = format!(
        r#"name = "plain"
[run]
command = ["sh", "{}", "--batch-size", "{{batch_size}}"]
resume_args = ["--resume", "{{run_dir}}/last.ckpt"]
[knobs.batch_size]
initial = 32
min = 1
max = 256
[metrics]
patterns = ['step (?P<step>\d+) loss=(?P<loss>[0-9.]+)']
"#,
        script.display()
    );
    let profile = write_profile(&home, "plain", &body);
    let run = start(&home, &profile);
    let c = home.client();
    let first = c.run(&run).unwrap().pid.unwrap();
    assert_eq!(&cmdline(first)[2..], ["--batch-size", "32"]);

    // Metrics from its output, read by the daemon through the profile's pattern.
    wait_for(
        "metrics parsed from stdout",
        Duration::from_secs(10),
        || c.run_metrics(&run, 0).is_ok_and(|m| m.points.len() >= 3),
    );
    let m = c.run_metrics(&run, 0).unwrap();
    assert!(!m.trainer.attached);
    let p = &m.points[0];
    assert_eq!(p.from, "stdout");
    // From the script's first line on, nothing skipped.
    assert_eq!(p.report.step, Some(1), "{p:?}");
    assert!(p.report.loss.is_some(), "{p:?}");

    // No trainer: the change needs a restart, which must be allowed.
    let out = home.run(&["set", &run, "batch-size", "64"], Duration::from_secs(20));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--restart") && err.contains("nothing changed"),
        "{err}"
    );
    assert_eq!(c.run(&run).unwrap().pid, Some(first), "nothing restarted");

    let out = home.ok(&["set", &run, "batch-size", "64", "--restart"]);
    assert!(
        out.contains("restarting the run with the new value"),
        "{out}"
    );
    wait_for("the restarted process", Duration::from_secs(20), || {
        c.run(&run)
            .is_ok_and(|r| r.pid.is_some_and(|p| p != first) && r.status.as_str() == "running")
    });
    let second = c.run(&run).unwrap().pid.unwrap();
    let dir = home.run_dir(&run).path().to_path_buf();
    assert_eq!(
        &cmdline(second)[2..],
        [
            "--batch-size".to_string(),
            "64".into(),
            "--resume".into(),
            format!("{}/last.ckpt", dir.display()),
        ]
    );
    let info = c.run(&run).unwrap();
    assert_eq!(info.restarts, 1);
    home.ok(&["stop", &run]);
}

/// Start `examples/train_stdlib.py` (the Python SDK) as a run with both knobs; its id.
fn start_stdlib_example(home: &Home) -> String {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/train_stdlib.py");
    assert!(example.exists(), "{} is missing", example.display());
    let body = format!(
        r#"name = "stdlib"
[run]
command = ["python3", "{}", "--steps", "100000"]
env = {{ PYTHONUNBUFFERED = "1" }}
[knobs.batch_size]
initial = 16
min = 1
max = 1024
[knobs.prefetch]
initial = 1
min = 0
max = 8
"#,
        example.display()
    );
    let profile = write_profile(home, "stdlib", &body);
    start(home, &profile)
}

#[test]
fn the_stdlib_sdk_example_takes_a_batch_size_change() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_stdlib_example(&home);
    let c = home.client();
    wait_attached(&c, &run);
    assert_eq!(reported_batch(&c, &run), Some(16));
    let out = home.ok(&["set", &run, "batch-size", "48"]);
    assert!(out.contains("16 → 48 applied by the trainer"), "{out}");
    wait_for("the SDK's next report", Duration::from_secs(10), || {
        reported_batch(&c, &run) == Some(48)
    });
    let applied = events_named(&home, "knob_applied");
    assert_eq!(applied.len(), 1);
    assert!(applied[0]["rtt_ms"].as_f64().unwrap() > 0.0);
    let out = home.run(&["set", &run, "batch-size", "0"], Duration::from_secs(20));
    assert!(!out.status.success());
    home.ok(&["stop", &run]);
}

#[test]
fn a_trainer_outlives_a_daemon_restart_and_takes_changes_from_the_new_one() {
    let home = Home::new();
    let mut daemon = home.daemon(&[]);
    let run = start_stdlib_example(&home);
    wait_attached(&home.client(), &run);
    home.ok(&["set", &run, "batch-size", "20"]);
    let pid = home.client().run(&run).unwrap().pid;
    daemon.signal_and_wait(rustix::process::Signal::KILL);
    // The run goes on without a daemon; a new one adopts it and the SDK attaches again.
    let _daemon = home.daemon(&[]);
    let c = home.client();
    assert_eq!(c.run(&run).unwrap().pid, pid, "the same process, adopted");
    wait_for(
        "the SDK to attach to the new daemon",
        Duration::from_secs(20),
        || c.run_metrics(&run, 0).is_ok_and(|m| m.trainer.attached),
    );
    let out = home.ok(&["set", &run, "batch-size", "40"]);
    assert!(out.contains("20 → 40 applied by the trainer"), "{out}");
    wait_for(
        "a report with the new size",
        Duration::from_secs(10),
        || reported_batch(&c, &run) == Some(40),
    );
    // Change numbers go on from where the first daemon left them.
    let changed = events_named(&home, "knob_changed");
    assert_eq!(changed.last().unwrap()["change"], 2);
    home.ok(&["stop", &run]);
}

#[test]
fn an_out_of_memory_error_on_stderr_halves_a_script_without_the_sdk() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    // Batch 64 "does not fit"; 32 fails for another reason; nothing below is tried.
    let script = home.dir.path().join("train.sh");
    std::fs::write(
        &script,
        "echo \"batch $2\"\n\
         if [ \"$2\" -gt 32 ]; then echo 'torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2; exit 1; fi\n\
         echo 'ValueError: bad data' >&2; exit 2\n",
    )
    .unwrap();
    let body = format!(
        r#"name = "oomscript"
[run]
command = ["sh", "{}", "--batch-size", "{{batch_size}}"]
[run.restart]
on_oom = "halve_batch"
max_restarts = 5
[knobs.batch_size]
initial = 64
min = 4
max = 256
"#,
        script.display()
    );
    let profile = write_profile(&home, "oomscript", &body);
    let run = start(&home, &profile);
    let c = home.client();
    wait_for("the run to end", Duration::from_secs(20), || {
        c.run(&run).is_ok_and(|r| r.is_final())
    });
    let info = c.run(&run).unwrap();
    assert_eq!(info.status.as_str(), "failed");
    assert_eq!(info.exit_code, Some(2), "{info:?}");
    assert_eq!(
        info.restarts, 1,
        "halved once, then the other error ends it"
    );
    let out = std::fs::read_to_string(home.run_dir(&run).path().join("stdout.log")).unwrap();
    assert_eq!(out, "batch 64\nbatch 32\n");
}
