//! Training frameworks under gpupilot, for real: Hugging Face `transformers.Trainer` (with
//! Accelerate) training a tiny BERT made from a config on the CPU, no downloads.
//!
//! - Two ranks (gloo, started by the `ranks` launcher) with `GpupilotCallback` take a batch
//!   size and a prefetch change live, each at one step on both ranks, with the learning rate
//!   scaled by the linear rule, and finish.
//! - The same script without the callback (an unmodified Trainer script) has its loss read from
//!   its printed log dicts by the `transformers` preset, found without a profile.
//! - Two Lightning DDP ranks with its callback take a batch size change at one step.
//! - An unmodified Lightning script's progress bar is read by the `lightning` preset, and
//!   torchtitan's step lines on stderr by the `torchtitan` preset.
//!
//! Needs a Python with torch, transformers and accelerate (`.ci/run` installs them into
//! `.venv`), and for Lightning one with torch 2 (`.ci/run`'s venv under
//! /var/cache/gpupilot-ci); without them the tests say so and pass, unless
//! `GPUPILOT_REQUIRE_PEERS=1` (CI).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gpupilot::client::Client;

use crate::support::home::Home;
use crate::support::peers::missing;
use crate::support::wait::wait_for;
use serde_json::Value;

/// The first of `candidates` that runs and imports `modules` (a Python `import` list).
pub(crate) fn python_importing(
    candidates: impl IntoIterator<Item = String>,
    modules: &str,
) -> Option<String> {
    candidates.into_iter().find(|py| {
        Command::new(py)
            .args(["-c", &format!("import {modules}")])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// A Python that imports transformers and accelerate over torch: `GPUPILOT_HF_PYTHON`, the
/// repository's `.venv`, or the `python3` on PATH.
fn hf_python() -> Option<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let candidates = std::env::var("GPUPILOT_HF_PYTHON").ok().into_iter().chain([
        root.join(".venv/bin/python").display().to_string(),
        "python3".to_string(),
    ]);
    python_importing(candidates, "torch.distributed, transformers, accelerate")
}

/// The Python to run the frameworks with, or None after saying why there is none.
fn python_or_skip() -> Option<String> {
    let py = hf_python();
    if py.is_none() {
        missing(
            "no Python here imports torch, transformers and accelerate (.ci/run installs them \
             into .venv)",
        );
    }
    py
}

/// Start `argv` as `nproc` ranks under the `ranks` launcher, with the SDK on the Python path
/// and a batch size knob of (initial, max); the run's id.
pub(crate) fn start_ranks(
    home: &Home,
    name: &str,
    argv: &[String],
    nproc: u32,
    (batch, max): (u32, u32),
) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let command = serde_json::to_string(argv).unwrap();
    let body = format!(
        r#"name = "{name}"
[run]
command = {command}
launcher = "ranks"
env = {{ PYTHONPATH = "{sdk}", OMP_NUM_THREADS = "1", PYTHONUNBUFFERED = "1" }}
[run.ranks]
nproc = {nproc}
[knobs.batch_size]
initial = {batch}
min = 1
max = {max}
"#,
        sdk = root.join("python").display(),
    );
    let profile = home.dir.path().join(format!("{name}.toml"));
    std::fs::write(&profile, body).unwrap();
    home.ok(&["run", "--detach", &profile.display().to_string()])
        .trim()
        .to_string()
}

/// Wait until `n` ranks of `run` are attached and have reported step `step` or later.
pub(crate) fn wait_for_ranks(c: &Client, run: &str, n: usize, step: u64, within: Duration) {
    wait_for(&format!("{n} ranks reporting"), within, || {
        c.run_metrics(run, 0).is_ok_and(|m| {
            m.trainer
                .ranks
                .iter()
                .filter(|r| {
                    r.attached
                        && r.last
                            .as_ref()
                            .and_then(|p| p.report.step)
                            .is_some_and(|s| s >= step)
                })
                .count()
                == n
        })
    });
}

/// Wait until `run` has ended.
pub(crate) fn wait_for_end(c: &Client, run: &str, within: Duration) {
    wait_for("the run to end", within, || {
        c.runs()
            .is_ok_and(|runs| runs.iter().any(|r| r.id == run && r.is_final()))
    });
}

/// One printed training batch: (batch size, the DataLoader iterator's prefetch factor, the
/// batches it had asked its workers for).
type Batch = (u64, Option<u64>, Option<u64>);

/// rank → step → its batches (a step is one batch without gradient accumulation).
fn batches(stdout: &str) -> BTreeMap<u64, BTreeMap<u64, Batch>> {
    let mut by_rank: BTreeMap<u64, BTreeMap<u64, Batch>> = BTreeMap::new();
    for line in stdout.lines().filter(|l| l.contains("\"bs\"")) {
        let (_, json) = line.split_once("]: ").unwrap_or(("", line));
        let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {line}"));
        by_rank
            .entry(v["rank"].as_u64().unwrap())
            .or_default()
            .insert(
                v["step"].as_u64().unwrap(),
                (
                    v["bs"].as_u64().unwrap(),
                    v["prefetch"].as_u64(),
                    v["queued"].as_u64(),
                ),
            );
    }
    by_rank
}

/// `gpupilot set RUN …`, which must be applied on both ranks; the step it was applied at.
fn set(home: &Home, run: &str, knob: &str, value: &str) -> u64 {
    let out = home.run(&["set", run, knob, value], Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, after) = text
        .split_once("applied on 2/2 ranks at step ")
        .unwrap_or_else(|| panic!("not applied on both ranks: {text}"));
    after
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_transformers_trainer_takes_batch_size_and_prefetch_live_on_both_ranks() {
    let Some(py) = python_or_skip() else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let out = home.dir.path().join("hf-out").display().to_string();
    let script = root.join("examples/train_transformers.py");
    let mut argv = vec![py, script.display().to_string()];
    argv.extend(
        [
            "--epochs",
            "3",
            "--samples",
            "1024",
            "--batch-size",
            "4",
            "--workers",
            "1",
            "--prefetch",
            "2",
            "--step-sleep",
            "0.03",
            "--lr-rule",
            "linear",
            "--print-batches",
            "--output-dir",
            &out,
        ]
        .map(String::from),
    );
    let run = start_ranks(&home, "hf", &argv, 2, (4, 64));
    let c = home.client();
    wait_for_ranks(&c, &run, 2, 10, Duration::from_secs(120));
    let batch_at = set(&home, &run, "batch-size", "8");
    let prefetch_at = set(&home, &run, "prefetch", "4");
    // What the acknowledgement said came with the batch change: the learning rate rule.
    let m = c.run_metrics(&run, 0).unwrap();
    let outcome = m
        .trainer
        .knobs
        .iter()
        .find(|k| k.knob == gpupilot::protocol::KnobName::BatchSize)
        .and_then(|k| k.last_outcome.clone())
        .unwrap_or_default();
    assert!(
        outcome.contains("learning rate x2 (linear rule)")
            && outcome.contains("gradient accumulation kept"),
        "{outcome}"
    );

    wait_for_end(&c, &run, Duration::from_secs(240));
    let info = c.runs().unwrap().into_iter().find(|r| r.id == run).unwrap();
    let dir = home.run_dir(&run).path().to_path_buf();
    let stderr = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
    assert_eq!(info.exit_code, Some(0), "the job failed: {stderr}");

    let stdout = std::fs::read_to_string(dir.join("stdout.log")).unwrap();
    let by_rank = batches(&stdout);
    assert_eq!(by_rank.len(), 2, "{stdout}");
    for (rank, steps) in &by_rank {
        for (step, (bs, prefetch, queued)) in steps {
            // Every batch of a step before the change has the old size; from it on the new,
            // but an epoch's last batch, which may be short.
            if *step < batch_at {
                assert_eq!(*bs, 4, "rank {rank} step {step}");
            }
            let expect = if *step < prefetch_at { 2 } else { 4 };
            assert_eq!(*prefetch, Some(expect), "rank {rank} step {step}");
            assert!(
                queued.is_some_and(|q| q <= expect),
                "rank {rank} step {step}: {queued:?} batches asked of 1 worker at depth {expect}"
            );
        }
        assert_eq!(steps.get(&batch_at).map(|b| b.0), Some(8), "rank {rank}");
        let full = steps.range(batch_at..).filter(|(_, b)| b.0 == 8).count();
        let short = steps.range(batch_at..).filter(|(_, b)| b.0 != 8).count();
        assert!(
            full > 10 && short <= 3,
            "rank {rank}: {full} full, {short} short"
        );
        // The deeper queue is used: a worker keeps up with this model.
        let deepest = steps
            .range(prefetch_at..)
            .filter_map(|(_, b)| b.2)
            .max()
            .unwrap_or(0);
        assert!(
            deepest > 2,
            "rank {rank}: at most {deepest} batches asked for"
        );
    }
    assert_eq!(
        by_rank[&0].keys().collect::<Vec<_>>(),
        by_rank[&1].keys().collect::<Vec<_>>(),
        "the ranks did other steps"
    );

    // The learning rate doubled at the change (the linear schedule moves it by a fraction of
    // a percent a step).
    let points = c.run_metrics(&run, 0).unwrap().points;
    let lr = |step: u64| {
        points
            .iter()
            .find(|p| p.rank == Some(0) && p.report.step == Some(step) && p.report.loss.is_none())
            .and_then(|p| p.report.extra.get("lr").copied())
            .unwrap_or_else(|| panic!("no lr reported for step {step}"))
    };
    let ratio = lr(batch_at) / lr(batch_at - 1);
    assert!((ratio - 2.0).abs() < 0.05, "lr x{ratio} at the change");

    // Each rank counts its own samples, and the job's are their sum: 3 epochs of 1,024, but
    // for Accelerate's padding of an epoch's last batches to one per rank.
    let report = home.report_json(&run);
    let samples = report["throughput"]["samples"].as_u64().unwrap();
    assert!(
        (3 * 1024..=3 * 1024 + 3 * 2 * 8).contains(&samples),
        "{}",
        report["throughput"]
    );
    let per_rank: Vec<u64> = (0..2)
        .map(|r| {
            points
                .iter()
                .filter(|p| p.rank == Some(r))
                .filter_map(|p| p.report.samples)
                .max()
                .unwrap()
        })
        .collect();
    assert_eq!(per_rank.iter().sum::<u64>(), samples, "{per_rank:?}");
    let printed: u64 = by_rank
        .values()
        .flat_map(|steps| steps.values().map(|b| b.0))
        .sum();
    assert_eq!(printed, samples, "the samples the ranks trained on");
}

#[test]
fn an_unmodified_trainer_scripts_loss_is_read_from_its_logs() {
    let Some(py) = python_or_skip() else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let script = root.join("examples/train_transformers.py");
    let out = home.dir.path().join("hf-out");
    let run = home
        .ok(&[
            "run",
            "--detach",
            "--",
            &py,
            &script.display().to_string(),
            "--no-gpupilot",
            "--epochs",
            "3",
            "--samples",
            "256",
            "--logging-steps",
            "2",
            "--step-sleep",
            "0.05",
            "--output-dir",
            &out.display().to_string(),
        ])
        .trim()
        .to_string();
    let c = home.client();
    wait_for(
        "a loss read from the output",
        Duration::from_secs(120),
        || {
            c.run_metrics(&run, 0)
                .is_ok_and(|m| m.points.iter().filter(|p| p.report.loss.is_some()).count() >= 2)
        },
    );
    // While it runs, `ps` says how its metrics are read, and shows its loss.
    let ps: Value = serde_json::from_str(&home.ok(&["ps", "--json"])).unwrap();
    let live = ps
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == run.as_str())
        .unwrap();
    assert_eq!(live["trainer"]["metrics_preset"], "transformers", "{live}");
    assert!(
        live["trainer"]["job"]["loss"]
            .as_f64()
            .is_some_and(|l| l > 0.0 && l < 2.0),
        "{live}"
    );
    let table = home.ok(&["ps"]);
    assert!(
        table.lines().next().unwrap().contains("METRICS") && table.contains("transformers"),
        "{table}"
    );
    let found = home.events_named("metrics_preset");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["run"], run.as_str());
    assert_eq!(found[0]["preset"], "transformers");
    assert_eq!(found[0]["from_profile"], false);

    wait_for_end(&c, &run, Duration::from_secs(120));
    let dir = home.run_dir(&run).path().to_path_buf();
    let stdout = std::fs::read_to_string(dir.join("stdout.log")).unwrap();
    // Every loss the Trainer printed is a report, in order, and the report has them.
    let printed: Vec<f64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("{'loss': "))
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert!(printed.len() >= 30, "{stdout}");
    let report = home.report_json(&run);
    let read: Vec<f64> = report["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["points"].as_array().unwrap().iter())
        .filter_map(|p| p["loss"].as_f64())
        .collect();
    assert_eq!(read, printed, "the report's losses");
    // The run's last dict gives the whole job's throughput.
    let last = report["ranks"][0]["points"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|p| p["samples_per_s"].is_number())
        .cloned()
        .unwrap_or_default();
    assert_eq!(last["scope"], "job", "{last}");
}

/// A Python with torch 2 and Lightning: `GPUPILOT_TORCH2_PYTHON`, or the venv `.ci/run` makes
/// once per machine (Lightning does not import with Debian's torch 1.13); None after saying
/// there is none.
fn lightning_python() -> Option<String> {
    let venv = std::env::var("GPUPILOT_TORCH2_VENV")
        .unwrap_or_else(|_| "/var/cache/gpupilot-ci/torch2-venv".into());
    let candidates = std::env::var("GPUPILOT_TORCH2_PYTHON")
        .ok()
        .into_iter()
        .chain([format!("{venv}/bin/python")]);
    let py = python_importing(candidates, "lightning.pytorch");
    if py.is_none() {
        missing("no Python here imports Lightning (.ci/run makes a torch 2 venv for it)");
    }
    py
}

#[test]
fn an_unmodified_lightning_scripts_progress_bar_is_read() {
    let Some(py) = lightning_python() else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let script = root
        .join("examples/train_lightning.py")
        .display()
        .to_string();
    let run = home
        .ok(&[
            "run",
            "--detach",
            "--",
            &py,
            &script,
            "--no-gpupilot",
            "--epochs",
            "3",
            "--samples",
            "1024",
        ])
        .trim()
        .to_string();
    let c = home.client();
    wait_for_end(&c, &run, Duration::from_secs(180));
    let info = c.runs().unwrap().into_iter().find(|r| r.id == run).unwrap();
    let dir = home.run_dir(&run).path().to_path_buf();
    let stderr = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
    assert_eq!(info.exit_code, Some(0), "{stderr}");
    let found = home.events_named("metrics_preset");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["preset"], "lightning");
    // Every redraw of the bar is a report: 32 batches an epoch, 3 epochs; its last one the
    // bar's last step, with the loss it showed.
    let points = c.run_metrics(&run, 0).unwrap().points;
    let steps: Vec<u64> = points.iter().filter_map(|p| p.report.step).collect();
    assert_eq!(steps.last(), Some(&(3 * 32 - 1)), "{steps:?}");
    assert!(steps.windows(2).all(|w| w[0] <= w[1]), "{steps:?}");
    let stdout = std::fs::read_to_string(dir.join("stdout.log")).unwrap();
    let last_bar = stdout
        .rsplit('\r')
        .find(|s| s.contains("train_loss="))
        .unwrap();
    let shown: f64 = last_bar
        .rsplit("train_loss=")
        .next()
        .and_then(|s| s.split(']').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{last_bar}"));
    let last = points.iter().rev().find_map(|p| p.report.loss);
    assert_eq!(last, Some(shown), "{last_bar}");
}

/// Lightning's own DDP, one process per rank started by the `ranks` launcher (Lightning takes
/// the ranks from torchrun's environment), takes a batch size and a prefetch change, each at one
/// step on both ranks.
#[test]
fn lightning_ddp_ranks_take_batch_size_and_prefetch_live_at_one_step() {
    let Some(py) = lightning_python() else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let script = root.join("examples/train_lightning.py");
    let mut argv = vec![py, script.display().to_string()];
    argv.extend(
        [
            "--epochs",
            "3",
            "--samples",
            "2048",
            "--batch-size",
            "8",
            "--step-sleep",
            "0.02",
            "--print-batches",
            "--lr-rule",
            "linear",
            "--workers",
            "1",
            "--prefetch",
            "2",
        ]
        .map(String::from),
    );
    let run = start_ranks(&home, "lt", &argv, 2, (8, 64));
    let c = home.client();
    wait_for_ranks(&c, &run, 2, 10, Duration::from_secs(120));
    let prefetch_at = set(&home, &run, "prefetch", "4");
    let at = set(&home, &run, "batch-size", "16");
    wait_for_end(&c, &run, Duration::from_secs(240));
    let info = c.runs().unwrap().into_iter().find(|r| r.id == run).unwrap();
    let dir = home.run_dir(&run).path().to_path_buf();
    let stderr = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
    assert_eq!(info.exit_code, Some(0), "the job failed: {stderr}");
    let by_rank = batches(&std::fs::read_to_string(dir.join("stdout.log")).unwrap());
    assert_eq!(by_rank.len(), 2);
    for (rank, steps) in &by_rank {
        let switched = steps.iter().find(|(_, b)| b.0 == 16).map(|(s, _)| *s);
        assert_eq!(switched, Some(at), "rank {rank}");
        assert!(
            steps.range(..at).all(|(_, b)| b.0 == 8),
            "rank {rank} before {at}"
        );
        // The running iterator's prefetch: 2 before its step, 4 from it on (a new epoch's
        // iterator included), never more batches asked of the worker than that.
        for (step, b) in steps {
            let expect = if *step < prefetch_at { 2 } else { 4 };
            assert_eq!(b.1, Some(expect), "rank {rank} step {step}");
            assert!(
                b.2.is_some_and(|q| q <= expect),
                "rank {rank} step {step}: {:?} asked at depth {expect}",
                b.2
            );
        }
        // 3 epochs of this rank's 1,024 samples, whatever the batches were.
        assert_eq!(
            steps.values().map(|b| b.0).sum::<u64>(),
            3 * 1024,
            "rank {rank}"
        );
    }
    assert_eq!(
        by_rank[&0].keys().collect::<Vec<_>>(),
        by_rank[&1].keys().collect::<Vec<_>>(),
        "the ranks did other steps"
    );
    let report = home.report_json(&run);
    assert_eq!(
        report["throughput"]["samples"],
        2 * 3 * 1024,
        "{}",
        report["throughput"]
    );
}

/// (rank, step, loss, tokens/s) of a report.
type StepRead = (Option<u32>, Option<u64>, Option<f64>, Option<f64>);

/// torchtitan logs its step lines to stderr (Python's logging), in colour and, under torchrun,
/// with each rank's prefix: they are read from there, each rank's its own.
#[test]
fn torchtitan_step_lines_on_stderr_are_read_per_rank() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let script = r#"for s in 1 2 3; do
  for r in 0 1; do
    printf '[rank%d]:[titan] 2025-01-20 10:00:0%d,123 - root - INFO - \033[36mstep: %2d  \033[32mloss: %7.4f  \033[33mmemory: 12.41GiB(15.66%%)  \033[34mtps: 1,%03d  \033[36mtflops: 52.30  \033[35mmfu: 5.29%%\033[39m\n' $r $s $s "$((10 - s)).5" $((r * 100 + s)) >&2
  done
done
sleep 2"#;
    let run = home
        .ok(&["run", "--detach", "--", "sh", "-c", script])
        .trim()
        .to_string();
    let c = home.client();
    wait_for("six step lines read", Duration::from_secs(30), || {
        c.run_metrics(&run, 0).is_ok_and(|m| m.points.len() >= 6)
    });
    let points = c.run_metrics(&run, 0).unwrap().points;
    let read: Vec<StepRead> = points
        .iter()
        .map(|p| {
            (
                p.rank,
                p.report.step,
                p.report.loss,
                p.report.extra.get("tokens_per_s").copied(),
            )
        })
        .collect();
    assert_eq!(
        read,
        [
            (Some(0), Some(1), Some(9.5), Some(1001.0)),
            (Some(1), Some(1), Some(9.5), Some(1101.0)),
            (Some(0), Some(2), Some(8.5), Some(1002.0)),
            (Some(1), Some(2), Some(8.5), Some(1102.0)),
            (Some(0), Some(3), Some(7.5), Some(1003.0)),
            (Some(1), Some(3), Some(7.5), Some(1103.0)),
        ]
    );
    let found = home.events_named("metrics_preset");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["preset"], "torchtitan");
}
