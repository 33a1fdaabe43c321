//! The joint search of batch size and cap (`tune energy RUN --with batch-size`) on a trainer
//! that uses the real Python SDK: one that reconnects to a daemon started after the last was
//! killed with SIGKILL mid-search, and one that runs out of memory above a batch size.

use std::path::Path;
use std::time::Duration;

use super::tune_energy::{
    JOB_POLL, TWO_H100, batch_of, job, joint_args, kill_mid_joint_search, last_limits,
    run_detached, succeeded, tune_changes,
};
use crate::support::home::{Home, power_caps as caps};
use crate::support::nvml_daemon::NvmlDaemon;
use crate::support::wait::wait_for;
use crate::wait_every;

/// A training loop on the SDK: each step takes a fixed overhead and a time per sample, so a
/// larger batch trains more samples a second (and per joule). A batch of `OOM_AT` or more runs
/// out of memory as `examples/train_simple.py` reports a CUDA one: `gp.error("oom", …)`, the
/// PyTorch line on stderr, exit status 3. With `REFUSE_AT`, a batch that large is refused
/// before it is used (an `on_change` callback that knows it would not fit). `STARTUP_S` is the
/// time it takes to start before it attaches (a PyTorch script's imports take seconds).
const TRAINER: &str = r#"import os, sys, time
time.sleep(float(os.environ.get("STARTUP_S") or 0))  # what `import torch` takes
import gpupilot

oom_at = int(os.environ.get("OOM_AT") or 0)
refuse_at = int(os.environ.get("REFUSE_AT") or 0)
gp = gpupilot.connect(knobs={"batch_size": 64}, ranges={"batch_size": (1, 4096)})

@gp.on_change("batch_size")
def fits(new, old):
    if refuse_at and new >= refuse_at:
        raise ValueError("batch size %d would not fit in GPU memory" % new)

print("start at batch %d" % gp.knob("batch_size"), flush=True)
step = 0
while True:
    batch = gp.knob("batch_size")
    if oom_at and batch >= oom_at:
        msg = "CUDA out of memory. Tried to allocate 2.00 GiB (batch size %d)" % batch
        gp.error("oom", msg, batch_size=batch, step=step)
        gp.close(timeout=2.0)
        print("torch.cuda.OutOfMemoryError: " + msg, file=sys.stderr, flush=True)
        sys.exit(3)
    started = time.perf_counter()
    time.sleep(0.04 + 0.0001 * batch)
    took = time.perf_counter() - started
    step += 1
    gp.report(step=step, samples_per_s=batch / took, step_time_s=took, batch_size=batch)
"#;

/// Start [`TRAINER`] as a run in `home`, its batch from 64 within 32..=256, with `env` (TOML
/// key = value pairs) and `extra` (more of the profile); its id once it reports.
fn start_sdk_trainer(home: &Home, env: &str, extra: &str) -> String {
    let script = home.dir.path().join("train.py");
    std::fs::write(&script, TRAINER).unwrap();
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    let profile = home.dir.path().join("sdk.toml");
    std::fs::write(
        &profile,
        format!(
            r#"name = "sdk"
[run]
command = ["python3", "{}"]
env = {{ PYTHONPATH = "{}", PYTHONUNBUFFERED = "1"{env} }}
{extra}
[knobs.batch_size]
initial = 64
min = 32
max = 256
"#,
            script.display(),
            sdk.display()
        ),
    )
    .unwrap();
    let run = run_detached(home, &profile);
    let c = home.client();
    wait_for("the SDK trainer to report", Duration::from_secs(30), || {
        c.run_metrics(&run, 0)
            .is_ok_and(|m| m.trainer.attached && !m.points.is_empty())
    });
    run
}

/// The batch size of the trainer's newest report (what it trains at).
fn reported_batch(c: &gpupilot::client::Client, run: &str) -> Option<i64> {
    c.run_metrics(run, 0).ok()?.trainer.last?.report.batch_size
}

/// The node's knob changes to `run` asked with `why`.
fn asked_with(home: &Home, why: &str) -> Vec<serde_json::Value> {
    home.events_named("knob_changed")
        .into_iter()
        .filter(|e| e["why"] == why)
        .collect()
}

/// A joint search on [`TRAINER`] on two fake H100s, its daemon killed with SIGKILL once the
/// search has moved the batch off 64, and the next daemon's job resumed through the trainer
/// that reconnected: the batch back at 64 first, then off it again.
fn resumed_after_sigkill() -> (NvmlDaemon, String) {
    let mut nv = NvmlDaemon::new(TWO_H100, &[]);
    let run = start_sdk_trainer(&nv.home, "", "");
    let mut args = joint_args(&run);
    args.push("--detach");
    nv.ok(&args);
    let c = nv.home.client();
    wait_for(
        "the search to try another batch",
        Duration::from_secs(90),
        || reported_batch(&c, &run).is_some_and(|b| b != 64),
    );
    let pid = c.run(&run).unwrap().pid;
    kill_mid_joint_search(&mut nv, &run, 64);
    nv.restart(&[]);
    let c = nv.home.client();
    assert_eq!(c.run(&run).unwrap().pid, pid, "the same trainer, adopted");
    wait_for("the job to resume", Duration::from_secs(90), || {
        tune_changes(&nv.home).iter().any(|c| c == "resumed")
    });
    let j = job(&nv.home, &run);
    assert_eq!(
        (j["state"].as_str(), j["resumed"].as_i64()),
        (Some("running"), Some(1)),
        "{j}"
    );
    // The reconnected trainer took the starting batch back before the search went on.
    let restored = asked_with(
        &nv.home,
        "energy tuner: search interrupted, batch size restored",
    );
    assert_eq!(restored.len(), 1, "{restored:?}");
    assert_eq!(restored[0]["new"], 64, "{restored:?}");
    // It goes on: the batch moves off the start again, through the new daemon.
    wait_for(
        "the resumed search to try another batch",
        Duration::from_secs(90),
        || reported_batch(&c, &run).is_some_and(|b| b != 64),
    );
    (nv, run)
}

#[test]
fn a_daemon_killed_mid_joint_search_resumes_it_once_the_sdk_trainer_reconnects() {
    let (nv, run) = resumed_after_sigkill();
    let c = nv.home.client();
    let out = nv.ok(&["tune", "stop", &run]);
    assert!(out.contains("cancelled"), "{out}");
    let j = job(&nv.home, &run);
    assert_eq!(j["state"], "cancelled", "{j}");
    assert_eq!(j["restored"], serde_json::json!({"Ok": null}), "{j}");
    assert_eq!(
        last_limits(&nv).values().copied().collect::<Vec<_>>(),
        [700.0, 700.0]
    );
    assert_eq!(caps(&c), [700.0, 700.0]);
    wait_for(
        "the trainer back at batch 64",
        Duration::from_secs(10),
        || reported_batch(&c, &run) == Some(64),
    );
    assert_eq!(batch_of(&c, &run), Some(64));
    let changes = tune_changes(&nv.home);
    assert_eq!(
        changes.last().map(String::as_str),
        Some("cancelled"),
        "{changes:?}"
    );
    nv.ok(&["stop", &run]);
}

/// A joint search on [`TRAINER`] that finishes, its result checked against what the run ended
/// at (caps, batch) and the events it left; `oom_at` is the smallest batch that did not fit.
fn finished_below(home: &Home, run: &str, oom_at: i64) {
    let (_, stderr) = succeeded(home, &joint_args(run), 300);
    assert!(
        stderr.contains("batch sizes to search: 32, 64, 128, 256"),
        "{stderr}"
    );
    let j = job(home, run);
    assert_eq!(j["state"], "done", "{j}");
    let r = j["result"].clone();
    assert_eq!(r["batch"]["oom"].as_i64(), Some(oom_at), "{r}");
    let best = r["batch"]["best"].as_i64().unwrap();
    assert!(best < oom_at, "{r}");
    assert!(
        r["curve"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["batch"].as_i64().unwrap() < oom_at),
        "nothing measured at a batch that does not fit: {r}"
    );
    let best_w = r["best"]["cap_w"].as_f64().unwrap();
    let c = home.client();
    assert_eq!(caps(&c), [best_w, best_w]);
    wait_for(
        "the trainer at the best batch",
        Duration::from_secs(20),
        || reported_batch(&c, run) == Some(best),
    );
    let oom = home
        .events_named("tune")
        .into_iter()
        .find(|e| e["change"] == "oom")
        .unwrap_or_else(|| panic!("no oom event: {:?}", tune_changes(home)));
    assert!(
        oom["why"]
            .as_str()
            .unwrap()
            .contains(&format!("batch size {oom_at} ran out of memory")),
        "{oom}"
    );
    // The search went on after the out-of-memory, and never asked for that batch again.
    let tried: Vec<i64> = home
        .events_named("knob_changed")
        .iter()
        .filter(|e| e["why"] == "energy tuner: trying a batch size")
        .filter_map(|e| e["new"].as_i64())
        .collect();
    assert_eq!(
        tried.iter().filter(|b| **b >= oom_at).count(),
        1,
        "{tried:?}"
    );
}

#[test]
fn a_joint_search_whose_sdk_trainer_runs_out_of_memory_finishes_below_that_batch() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_sdk_trainer(
        &home,
        ", OOM_AT = \"256\", STARTUP_S = \"2\"",
        "[run.restart]\non_oom = \"halve_batch\"\nmax_restarts = 3\n",
    );
    finished_below(&home, &run, 256);
    // The trainer said so, ended, and was started again at half the batch.
    let events = restarted_once(&home, &run);
    assert!(
        events.iter().any(|e| e["event"] == "changed"
            && e["what"] == "batch_size"
            && e["new"] == "128"
            && e["by"] == "daemon"),
        "{events:?}"
    );
    home.ok(&["stop", &run]);
}

/// `run`'s events, once it trains in its second attempt, started at batch 128 after the first
/// said it ran out of memory.
fn restarted_once(home: &Home, run: &str) -> Vec<serde_json::Value> {
    let c = home.client();
    let stdout = home.run_dir(run).path().join("stdout.log");
    wait_for(
        "the second attempt to train",
        Duration::from_secs(30),
        || {
            let starts = std::fs::read_to_string(&stdout).unwrap_or_default();
            starts.lines().count() == 2 && c.run_metrics(run, 0).is_ok_and(|m| m.trainer.attached)
        },
    );
    assert_eq!(
        std::fs::read_to_string(&stdout).unwrap(),
        "start at batch 64\nstart at batch 128\n"
    );
    let info = c.run(run).unwrap();
    assert_eq!(
        (info.attempt, info.restarts, info.status.as_str()),
        (1, 1, "running"),
        "{info:?}"
    );
    let events = std::fs::read_to_string(home.run_dir(run).path().join("events.jsonl")).unwrap();
    let events: Vec<serde_json::Value> = events
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "trainer_error" && e["kind"] == "oom"),
        "{events:?}"
    );
    events
}

#[test]
fn a_joint_search_whose_sdk_trainer_dies_of_out_of_memory_under_a_restart_policy_finishes_below_it()
{
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    // As profiles/base.toml has it: restarted on failure after a backoff, on_oom left alone.
    let run = start_sdk_trainer(
        &home,
        ", OOM_AT = \"256\", STARTUP_S = \"2\"",
        "[run.restart]\npolicy = \"on-failure\"\nmax_restarts = 3\nbackoff_s = 2\n",
    );
    finished_below(&home, &run, 256);
    // The attempt after the out-of-memory started at the batch the search asked for while the
    // run waited to restart, not at the batch it had taken live, which would fail again.
    let events = restarted_once(&home, &run);
    // Where each last happened (the search asked for 128 once before, going up).
    let at = |what: &dyn Fn(&serde_json::Value) -> bool| {
        events
            .iter()
            .rposition(what)
            .unwrap_or_else(|| panic!("{events:?}"))
    };
    let scheduled = at(&|e| e["event"] == "restart_scheduled");
    let asked = at(&|e| {
        e["event"] == "changed"
            && e["what"] == "batch_size"
            && e["new"] == "128"
            && e["why"] == "energy tuner: trying a batch size"
    });
    let restarted = at(&|e| e["event"] == "restarted");
    assert!(scheduled < asked && asked < restarted, "{events:?}");
    home.ok(&["stop", &run]);
}

#[test]
fn a_joint_search_whose_sdk_trainer_refuses_a_batch_too_large_finishes_below_it() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = start_sdk_trainer(&home, ", REFUSE_AT = \"256\"", "");
    finished_below(&home, &run, 256);
    let info = home.client().run(&run).unwrap();
    assert_eq!(info.attempt, 0, "refused, not restarted: {info:?}");
    let rejected = home.events_named("knob_rejected");
    assert!(
        rejected.iter().any(|e| e["value"] == 256
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("would not fit"))),
        "{rejected:?}"
    );
    home.ok(&["stop", &run]);
}

#[test]
fn a_joint_search_resumed_through_a_reconnected_sdk_trainer_runs_to_its_end() {
    let (nv, run) = resumed_after_sigkill();
    wait_every("the job to end", Duration::from_secs(240), JOB_POLL, || {
        job(&nv.home, &run)["state"] != "running"
    });
    let j = job(&nv.home, &run);
    assert_eq!(
        (j["state"].as_str(), j["resumed"].as_i64()),
        (Some("done"), Some(1)),
        "{j}"
    );
    let r = &j["result"];
    // The default cap measured at the starting batch before the kill is still the reference.
    assert_eq!(
        (
            r["default"]["batch"].as_i64(),
            r["default"]["cap_w"].as_f64()
        ),
        (Some(64), Some(700.0)),
        "{r}"
    );
    assert!(r["energy_saving_pct"].as_f64().is_some(), "{r}");
    let best_w = r["best"]["cap_w"].as_f64().unwrap();
    let best = r["batch"]["best"].as_i64().unwrap();
    assert_eq!(
        last_limits(&nv).values().copied().collect::<Vec<_>>(),
        [best_w, best_w]
    );
    let c = nv.home.client();
    assert_eq!(caps(&c), [best_w, best_w]);
    wait_for(
        "the trainer at the best batch",
        Duration::from_secs(20),
        || reported_batch(&c, &run) == Some(best),
    );
    assert_eq!(
        tune_changes(&nv.home).last().map(String::as_str),
        Some("done")
    );
    nv.ok(&["stop", &run]);
}

/// What the search relies on under a restart policy: a run waiting for its next attempt takes a
/// batch size for that attempt (here from `gpupilot set`), without a question or a restart of
/// its own.
#[test]
fn a_run_waiting_for_its_next_attempt_takes_a_batch_size_for_it() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let profile = home.dir.path().join("fails.toml");
    std::fs::write(
        &profile,
        "name = \"fails\"\n[run]\ncommand = [\"sh\", \"-c\", \"echo start $GPUPILOT_BATCH_SIZE; \
         exit 1\"]\n[run.restart]\npolicy = \"on-failure\"\nmax_restarts = 1\nbackoff_s = 3\n\
         [knobs.batch_size]\ninitial = 64\nmin = 8\nmax = 256\n",
    )
    .unwrap();
    let run = run_detached(&home, &profile);
    let c = home.client();
    wait_for(
        "the run to wait for a restart",
        Duration::from_secs(20),
        || {
            c.run(&run)
                .is_ok_and(|r| r.status.as_str() == "backoff" && r.attempt == 0)
        },
    );
    let out = home.ok(&["set", &run, "batch-size", "32"]);
    assert!(out.contains("64 → 32"), "{out}");
    assert_eq!(
        c.run(&run).unwrap().status.as_str(),
        "backoff",
        "no restart of its own"
    );
    wait_for("the run to end", Duration::from_secs(20), || {
        c.run(&run).is_ok_and(|r| r.is_final())
    });
    let stdout = std::fs::read_to_string(home.run_dir(&run).path().join("stdout.log")).unwrap();
    assert_eq!(stdout, "start 64\nstart 32\n");
}
