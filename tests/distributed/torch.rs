//! A real data-parallel job: four torch.distributed ranks (gloo on CPU) started by the `ranks`
//! launcher, each with a `DistributedSampler` cut into batches by the SDK's `KnobBatchSampler`.
//! A batch-size change in the middle of an epoch must reach every rank at one step, and the
//! job must still end with exit 0 (a rank whose epoch had another length would hang the last
//! collective).
//!
//! Needs a Python with torch (Debian's python3-torch, which `.ci/run` installs); without one the
//! test says so and passes, unless `GPUPILOT_REQUIRE_PEERS=1` (CI) makes it fail.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::frameworks::{python_importing, start_ranks, wait_for_end, wait_for_ranks};
use crate::support::home::Home;
use crate::support::peers::missing;
use serde_json::Value;

/// A Python that imports torch: `GPUPILOT_TORCH_PYTHON`, the `python3` on PATH, or Debian's.
fn torch_python() -> Option<String> {
    let candidates = std::env::var("GPUPILOT_TORCH_PYTHON")
        .ok()
        .into_iter()
        .chain(["python3".to_string(), "/usr/bin/python3".to_string()]);
    python_importing(candidates, "torch.distributed")
}

#[test]
fn four_torch_ranks_change_batch_size_at_one_step_and_finish() {
    let Some(py) = torch_python() else {
        missing("no Python here imports torch (Debian's python3-torch)");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let script = root.join("examples/train_ddp.py").display().to_string();
    let mut argv = vec![py, script];
    argv.extend(
        [
            "--epochs",
            "3",
            "--samples",
            "8192",
            "--step-sleep",
            "0.02",
            "--scale-lr",
        ]
        .map(String::from),
    );
    let run = start_ranks(&home, "ddp", &argv, 4, (32, 1024));
    let c = home.client();
    wait_for_ranks(&c, &run, 4, 5, Duration::from_secs(90));

    let out = home.run(&["set", &run, "batch-size", "64"], Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("applied on 4/4 ranks at step"), "{text}");
    let applied: Vec<Value> = home
        .node_events()
        .into_iter()
        .filter(|e| e["event"] == "knob_applied")
        .collect();
    let at = applied[0]["step"].as_u64().unwrap();

    wait_for_end(&c, &run, Duration::from_secs(120));
    let runs = c.runs().unwrap();
    let info = runs.iter().find(|r| r.id == run).unwrap();
    let stderr =
        std::fs::read_to_string(home.run_dir(&run).path().join("stderr.log")).unwrap_or_default();
    assert_eq!(info.exit_code, Some(0), "the job failed: {stderr}");

    // rank → step → (epoch, batch)
    let stdout = std::fs::read_to_string(home.run_dir(&run).path().join("stdout.log")).unwrap();
    let mut by_rank: BTreeMap<u64, BTreeMap<u64, (u64, u64)>> = BTreeMap::new();
    // Each line whole, with the rank that wrote it (`[rank1]: {…}`).
    for line in stdout.lines().filter(|l| l.contains('{')) {
        let (prefix, line) = line.split_once("]: ").unwrap_or_else(|| panic!("{line}"));
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(prefix, format!("[rank{}", v["rank"]), "{line}");
        by_rank
            .entry(v["rank"].as_u64().unwrap())
            .or_default()
            .insert(
                v["step"].as_u64().unwrap(),
                (v["epoch"].as_u64().unwrap(), v["bs"].as_u64().unwrap()),
            );
    }
    assert_eq!(by_rank.len(), 4, "{stdout}");
    let first = by_rank[&0].clone();
    let (epoch_at, _) = first[&at];
    // The change came in the middle of an epoch: that epoch has steps on both sides of it.
    assert!(
        first.get(&(at - 1)).is_some_and(|(e, _)| *e == epoch_at),
        "the change was not mid-epoch: step {at} {first:?}"
    );
    let summary: Vec<String> = by_rank
        .iter()
        .map(|(rank, steps)| {
            let switched = steps.iter().find(|(_, (_, bs))| *bs == 64).map(|(s, _)| *s);
            let epochs: BTreeMap<u64, usize> =
                steps.values().fold(BTreeMap::new(), |mut m, (e, _)| {
                    *m.entry(*e).or_default() += 1;
                    m
                });
            format!(
                "rank {rank}: {} steps, switched at {switched:?}, steps by epoch {epochs:?}",
                steps.len()
            )
        })
        .collect();
    for (rank, steps) in &by_rank {
        assert_eq!(
            steps.len(),
            first.len(),
            "rank {rank} did another number of steps (apply step {at}): {summary:#?}"
        );
        let switched = steps.iter().find(|(_, (_, bs))| *bs == 64).map(|(s, _)| *s);
        assert_eq!(switched, Some(at), "rank {rank}");
        for (step, (_, bs)) in steps {
            if *step < at {
                assert_eq!(*bs, 32, "rank {rank} step {step}");
            }
        }
    }

    // The job trained 3 epochs of 8,192 samples, whatever its batches were (the last of an
    // epoch is short): each rank counts its own, and the report counts the job's.
    let report = home.report_json(&run);
    assert_eq!(
        report["throughput"]["samples"],
        3 * 8192,
        "{}",
        report["throughput"]
    );
}
