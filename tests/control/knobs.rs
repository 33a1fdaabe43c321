//! Live knobs end to end: a real daemon, real supervised trainers (the synthetic trainer, which
//! speaks the trainer channel as the SDK does; an unmodified script; the stdlib SDK example),
//! and `gpupilot set` as a user types it.

use std::path::Path;
use std::time::Duration;

use crate::support::home::Home;
use crate::support::wait::wait_for;
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
    let applied = home.events_named("knob_applied");
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
        home.events_named("knob_changed").len(),
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
    assert_eq!(home.events_named("trainer_error").len(), 2);
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

/// The command line of `pid` once it has exec'd `program` (a run's process is the supervisor's
/// child until it does, and a loaded machine may show it in between).
fn exec_cmdline(pid: u32, program: &str) -> Vec<String> {
    wait_for(
        "the process to exec its command",
        Duration::from_secs(10),
        || cmdline(pid).first().is_some_and(|p| p == program),
    );
    cmdline(pid)
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
    assert_eq!(&exec_cmdline(first, "sh")[2..], ["--batch-size", "32"]);

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
        &exec_cmdline(second, "sh")[2..],
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
    let applied = home.events_named("knob_applied");
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
    let changed = home.events_named("knob_changed");
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

/// One rank of a fake data-parallel job on its own trainer connection, as the SDK speaks it:
/// attaches with its rank, reports a step every 10 ms with the batch size it uses, votes on a
/// proposed change at once (or refuses it with `refuse`), and applies a committed one when it
/// starts the apply step. Dropping it closes its connection.
struct FakeRank {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeRank {
    fn start(home: &Home, run: &str, rank: u32, world: u32, refuse: Option<&str>) -> FakeRank {
        use std::io::{BufRead, BufReader, Write};
        use std::sync::atomic::Ordering;
        let stream = std::os::unix::net::UnixStream::connect(home.socket()).unwrap();
        let mut writer = stream.try_clone().unwrap();
        let (tx, frames) = std::sync::mpsc::channel::<serde_json::Value>();
        let reader = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str(&line) else {
                    break;
                };
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let mut send = move |v: serde_json::Value| {
            let mut line = v.to_string();
            line.push('\n');
            let _ = writer.write_all(line.as_bytes());
        };
        send(serde_json::json!({"id": 1, "type": "hello", "version": 1, "client": "fake-rank"}));
        send(serde_json::json!({
            "id": 2, "type": "trainer_attach", "run": run, "pid": 7000 + rank,
            "knobs": {"batch_size": 32},
            "rank": rank, "world_size": world, "local_rank": rank,
            "host": "node-a", "gpu": rank % 2,
        }));
        let attached = frames
            .iter()
            .find(|f| f.get("id") == Some(&2.into()))
            .unwrap();
        assert_eq!(attached["type"], "trainer_attached", "{attached}");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refuse = refuse.map(str::to_string);
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut step, mut batch, mut id) = (0u64, 32i64, 10u64);
            // A committed change: (seq, value, apply step).
            let mut staged: Option<(u64, i64, u64)> = None;
            while !stopping.load(Ordering::Relaxed) {
                while let Ok(f) = frames.try_recv() {
                    id += 1;
                    match f["type"].as_str() {
                        Some("knob") if f.get("apply_step").is_some() => {
                            let mut vote = serde_json::json!({
                                "id": id, "type": "knob_vote", "seq": f["seq"],
                                "ready": refuse.is_none(), "step": step,
                            });
                            if let Some(r) = &refuse {
                                vote["reason"] = r.as_str().into();
                            }
                            send(vote);
                            let v = f["value"].as_i64().unwrap();
                            let at = f["apply_step"].as_u64().unwrap();
                            staged = Some((f["seq"].as_u64().unwrap(), v, at));
                        }
                        Some("knob_decision") if f["commit"] != true => staged = None,
                        _ => {}
                    }
                }
                step += 1;
                if let Some((seq, v, at)) = staged.filter(|s| s.2 <= step) {
                    batch = v;
                    staged = None;
                    id += 1;
                    send(serde_json::json!({
                        "id": id, "type": "knob_ack", "seq": seq, "applied": true, "step": at,
                    }));
                }
                id += 1;
                send(serde_json::json!({
                    "id": id, "type": "metrics", "step": step, "batch_size": batch,
                    "step_time_s": 0.01 + 0.001 * rank as f64, "samples_per_s": 100.0 * batch as f64,
                }));
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = stream.shutdown(std::net::Shutdown::Both);
        });
        FakeRank {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeRank {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A run that trains nothing itself (its ranks are [`FakeRank`]s) with a batch size knob.
fn start_idle_run(home: &Home) -> String {
    let body = r#"name = "job"
[run]
command = ["sleep", "600"]
[knobs.batch_size]
initial = 32
min = 1
max = 1024
"#;
    let profile = write_profile(home, "job", body);
    start(home, &profile)
}

/// Wait until every rank of the job has reported a step to the daemon.
fn wait_ranks_reporting(c: &Client, run: &str, n: usize) {
    wait_for("every rank to report", Duration::from_secs(20), || {
        c.run_metrics(run, 0).is_ok_and(|m| {
            m.trainer.ranks.len() == n
                && m.trainer
                    .ranks
                    .iter()
                    .all(|r| r.attached && r.last.as_ref().is_some_and(|p| p.report.step.is_some()))
        })
    });
}

#[test]
fn set_on_a_job_of_four_ranks_says_when_every_rank_applied_it_and_ps_shows_the_ranks() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_idle_run(&home);
    let c = home.client();
    let mut ranks: Vec<FakeRank> = (0..4)
        .map(|r| FakeRank::start(&home, &run, r, 4, None))
        .collect();
    wait_ranks_reporting(&c, &run, 4);

    let out = home.run(&["set", &run, "batch-size", "64"], Duration::from_secs(30));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Proposed for a step, then applied on every rank at that very step.
    let proposed = format!("{run}: batch_size 32 → 64 proposed to 4 ranks for step ");
    let step: u64 = stderr
        .split(&proposed)
        .nth(1)
        .and_then(|s| s.split(';').next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no proposal in {stderr}"));
    let applied =
        format!("{run}: batch_size 32 → 64 applied on 4/4 ranks at step {step} (all agreed in ");
    assert!(stdout.starts_with(&applied), "{stdout}\n{stderr}");
    assert!(stdout.trim_end().ends_with(" ms)"), "{stdout}");
    let staged = home.events_named("knob_staged");
    assert_eq!(staged.len(), 1, "{staged:?}");
    assert_eq!(staged[0]["apply_step"], step);

    // Without waiting: the step it was proposed for.
    let out = home.ok(&["set", &run, "batch-size", "128", "--no-wait"]);
    assert!(
        out.starts_with(&format!(
            "{run}: batch_size 64 → 128 proposed to 4 ranks for step "
        )) && out.contains(" (change "),
        "{out}"
    );
    wait_for(
        "the second change on every rank",
        Duration::from_secs(10),
        || home.events_named("knob_applied").len() == 2,
    );

    // `ps`: the job's ranks and figures, from one request per live run.
    let ps: serde_json::Value = serde_json::from_str(&home.ok(&["ps", "--json"])).unwrap();
    let t = &ps[0]["trainer"];
    assert_eq!(t["world_size"], 4, "{ps}");
    let listed: Vec<u64> = t["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, [0, 1, 2, 3]);
    let r2 = &t["ranks"][2];
    assert_eq!(
        (&r2["host"], &r2["gpu"], &r2["pid"], &r2["attached"]),
        (&"node-a".into(), &0.into(), &7002.into(), &true.into())
    );
    assert!(r2["step"].as_u64().unwrap() >= step, "{r2}");
    assert!(r2["step_time_s"].as_f64().is_some(), "{r2}");
    assert_eq!(t["job"]["slowest_rank"], 3, "{t}");
    assert_eq!(t["job"]["reporting"], 4, "{t}");
    let table = home.ok(&["ps"]);
    assert!(table.lines().next().unwrap().contains(" RANKS "), "{table}");
    assert!(table.contains(" 4 ranks "), "{table}");

    // A rank leaves: `ps` says how many are attached, and a change is refused for now.
    drop(ranks.pop());
    wait_for("rank 3 to be seen gone", Duration::from_secs(10), || {
        home.ok(&["ps"]).contains(" 3/4 ranks attached ")
    });
    home.ok(&["stop", &run]);
}

#[test]
fn a_rank_that_refuses_calls_the_change_off_on_every_rank() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_idle_run(&home);
    let c = home.client();
    let _ranks: Vec<FakeRank> = (0..4)
        .map(|r| {
            let refuse = (r == 2).then_some("batch 512 does not fit in memory");
            FakeRank::start(&home, &run, r, 4, refuse)
        })
        .collect();
    wait_ranks_reporting(&c, &run, 4);
    let out = home.run(&["set", &run, "batch-size", "512"], Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "gpupilot: {run}: batch_size = 512 called off: rank 2 refused: batch 512 does not \
             fit in memory; every rank keeps 32"
        )),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // No rank changed.
    std::thread::sleep(Duration::from_millis(200));
    let m = c.run_metrics(&run, 0).unwrap();
    assert!(
        m.trainer
            .ranks
            .iter()
            .all(|r| r.last.as_ref().unwrap().report.batch_size == Some(32)),
        "{:?}",
        m.trainer.ranks
    );
    assert!(home.events_named("knob_staged").is_empty());
    home.ok(&["stop", &run]);
}
