//! A straggler end to end, through the real NVML path: a fake-NVML node whose GPU 2 has failing
//! cooling (it reaches its slowdown threshold and throttles to half its clock), a real daemon
//! on it, and a four-rank data-parallel job of synthetic trainers (torchrun's environment,
//! each paced by its GPU's clock from the daemon's telemetry). The advisor names rank 2, GPU 2
//! and "thermal slowdown" in `gpupilot advise --json`, with the thermal target that acts on
//! it; the daemon raises the straggler alert; the job's figures name rank 2 as the slowest, and
//! the ranks that wait for it report that wait.
//!
//! And the same synthetic ranks speak the distributed change protocol: a change lands on every
//! rank at the step it was agreed for, and a batch that would not fit is refused by the ranks
//! and called off on all of them.

use std::time::Duration;

use crate::support::home::Home;
use crate::support::nvml_daemon::NvmlDaemon;
use crate::support::wait::wait_for;
use gpupilot::client::Client;
use gpupilot::telemetry::throttle;
use serde_json::Value;

/// Four H100 training ResNet-50; from the start GPU 2's heat leaves it three times harder, so
/// it reaches its 89 °C slowdown about 30 s in and stays throttled (see
/// crates/fake-nvml/scenarios/straggler-4xh100.toml).
const HOT_GPU_2: &str = include_str!("../../crates/fake-nvml/scenarios/straggler-4xh100.toml");

/// A job of four ranks on GPUs 0–3 with torchrun's environment, as one supervised run.
fn job_profile(dir: &std::path::Path) -> String {
    let bin = env!("CARGO_BIN_EXE_gpupilot");
    let script = "for r in 0 1 2 3; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 \
                  MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \"$0\" synthetic-train --speed 4 & done; wait";
    let path = dir.join("ddp.toml");
    std::fs::write(
        &path,
        format!("name = \"ddp\"\n[run]\ncommand = [\"sh\", \"-c\", {script:?}, \"{bin}\"]\n"),
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn a_thermally_throttled_gpu_makes_its_rank_the_named_straggler() {
    let s = NvmlDaemon::new(HOT_GPU_2, &[]);
    let c = Client::connect(&s.home.paths).unwrap();
    // Only once GPU 2 throttles does the job start: every report is then from the slow phase.
    wait_for(
        "GPU 2 to reach its slowdown threshold",
        Duration::from_secs(90),
        || {
            c.status()
                .ok()
                .and_then(|st| st.snapshot)
                .and_then(|snap| snap.gpus.into_iter().find(|g| g.index == 2))
                .and_then(|g| g.throttle_reasons)
                .is_some_and(|r| r & throttle::HW_THERMAL_SLOWDOWN != 0)
        },
    );
    let run = s
        .ok(&["run", "--detach", &job_profile(s.home.dir.path())])
        .trim()
        .to_string();

    // Every rank attaches as itself, with its GPU, and reports.
    wait_for("four ranks to report", Duration::from_secs(30), || {
        c.run_metrics(&run, 0).is_ok_and(|m| {
            m.trainer.ranks.len() == 4 && m.trainer.ranks.iter().all(|r| r.last.is_some())
        })
    });
    let m = c.run_metrics(&run, 0).unwrap();
    let gpus: Vec<Option<u32>> = m.trainer.ranks.iter().map(|r| r.spec.gpu).collect();
    assert_eq!(gpus, [Some(0), Some(1), Some(2), Some(3)]);
    assert_eq!(m.trainer.world_size, Some(4));

    // The advisor names it once each rank has enough reports.
    let mut hint = Value::Null;
    wait_for("the straggler hint", Duration::from_secs(40), || {
        let out = s.run(&["advise", "--json"]);
        let hints: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        match hints
            .as_array()
            .and_then(|a| a.iter().find(|h| h["kind"] == "straggler"))
        {
            Some(h) => {
                hint = h.clone();
                true
            }
            None => false,
        }
    });
    assert_eq!(hint["run"], run.as_str());
    assert_eq!(hint["gpu"], 2);
    let summary = hint["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("rank 2 on GPU 2 is ")
            && summary.contains("slower than the median rank: thermal slowdown — "),
        "{summary}"
    );
    assert!(summary.contains("slowdown threshold, SM "), "{summary}");
    assert!(summary.contains("while its siblings run at "), "{summary}");
    assert_eq!(hint["action"]["action"], "thermal_target");
    // A fix for a job acts on the job: a target for one rank's GPU alone would leave the
    // others at their pace, and the advisor sets it for every GPU of the job.
    assert_eq!(hint["action"]["gpus"], serde_json::json!([0, 1, 2, 3]));
    assert_eq!(
        hint["action"]["celsius"], 82.0,
        "7 °C under the H100's 89 °C slowdown"
    );
    let slower = hint["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "slower than the median rank")
        .unwrap()["value"]
        .as_f64()
        .unwrap();
    assert!(
        slower > 30.0,
        "half the clock is far more than 10% slower: {slower}%"
    );

    // The job as a whole: rank 2 is the slowest, and the others wait for it at every step.
    let m = c.run_metrics(&run, 0).unwrap();
    let job = m.trainer.job.clone().unwrap();
    assert_eq!(job.slowest_rank, Some(2), "{job:?}");
    let wait = |rank: u32| {
        m.points
            .iter()
            .rev()
            .find(|p| p.rank == Some(rank))
            .and_then(|p| p.report.extra.get("sync_wait_s").copied())
            .unwrap()
    };
    assert!(
        wait(0) > 0.2 * wait(2) + 0.01,
        "rank 0 waits for rank 2: {} s",
        wait(0)
    );

    // The daemon raised it as an alert: the event log and the active alerts.
    wait_for("the straggler alert", Duration::from_secs(20), || {
        s.home.node_events().iter().any(|e| {
            e["event"] == "alert" && e["change"] == "raised" && e["alert"]["kind"] == "straggler"
        })
    });
    let events = s.home.node_events();
    let alert = &events
        .iter()
        .find(|e| e["event"] == "alert" && e["alert"]["kind"] == "straggler")
        .unwrap()["alert"];
    assert_eq!(alert["key"], format!("straggler:{run}"));
    assert_eq!(alert["gpu"], 2);
    let message = alert["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("run {run}: rank 2 on GPU 2 is "))
            && message.contains("thermal slowdown"),
        "{message}"
    );
    assert!(
        message.ends_with("(`gpupilot thermal target 82 --gpu 2`)"),
        "{message}"
    );
    let thermal = s.ok(&["thermal"]);
    assert!(thermal.contains("rank 2 on GPU 2"), "{thermal}");

    // The run's report so far: the time lost to the slowest rank names rank 2, the advice over
    // the run names its GPU, and the environment has each rank where it ran and what it is.
    let report: Value = serde_json::from_str(&s.ok(&["report", &run, "--json"])).unwrap();
    assert_eq!(report["live"], true);
    let straggler = &report["time_lost"]["straggler"];
    assert_eq!(straggler["slowest_rank"], 2, "{straggler}");
    assert_eq!(straggler["ranks"], 4, "{straggler}");
    assert!(straggler["share"].as_f64().unwrap() > 0.1, "{straggler}");
    let advice = report["advice"].as_array().unwrap();
    let found = advice
        .iter()
        .find(|h| h["kind"] == "straggler")
        .unwrap_or_else(|| panic!("{advice:#?}"));
    assert_eq!(found["gpu"], 2, "{found}");
    let env = &report["environment"];
    let ranks: Vec<(u64, u64)> = env["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["rank"].as_u64().unwrap(), r["gpu"].as_u64().unwrap()))
        .collect();
    assert_eq!(ranks, [(0, 0), (1, 1), (2, 2), (3, 3)]);
    assert_eq!(
        env["software"]["gpupilot_synthetic"],
        env!("CARGO_PKG_VERSION"),
        "{env}"
    );

    s.ok(&["stop", &run, "--kill"]);
}

/// The four synthetic ranks of the demo's job, started by the `ranks` launcher.
fn ranks_profile(dir: &std::path::Path) -> String {
    let bin = env!("CARGO_BIN_EXE_gpupilot");
    let path = dir.join("ranks.toml");
    std::fs::write(
        &path,
        format!(
            r#"name = "ranks"
[run]
command = ["{bin}", "synthetic-train", "--speed", "4"]
launcher = "ranks"
[run.ranks]
nproc = 4
[knobs.batch_size]
initial = 256
min = 8
[knobs.prefetch]
initial = 2
min = 0
max = 16
"#
        ),
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn synthetic_ranks_apply_a_change_at_its_step_and_refuse_a_batch_that_does_not_fit() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let c = home.client();
    let run = home
        .ok(&["run", "--detach", &ranks_profile(home.dir.path())])
        .trim()
        .to_string();
    wait_for("four ranks to report", Duration::from_secs(30), || {
        c.run_metrics(&run, 0).is_ok_and(|m| {
            m.trainer.ranks.len() == 4 && m.trainer.ranks.iter().all(|r| r.last.is_some())
        })
    });

    let out = home.run(&["set", &run, "batch-size", "128"], Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let head = format!("{run}: batch_size 256 → 128 applied on 4/4 ranks at step ");
    let step: u64 = stdout
        .strip_prefix(&head)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    // Every rank's reports: the old batch up to step S − 1, the new one from step S on.
    wait_for("reports past the step", Duration::from_secs(20), || {
        let m = c.run_metrics(&run, 0).unwrap();
        (0..4).all(|r| {
            let after = m
                .points
                .iter()
                .filter(|p| p.rank == Some(r) && p.report.step.is_some_and(|s| s > step))
                .count();
            after >= 3
        })
    });
    let m = c.run_metrics(&run, 0).unwrap();
    for p in m.points.iter().filter(|p| p.rank.is_some()) {
        let (s, b) = (p.report.step.unwrap(), p.report.batch_size.unwrap());
        assert_eq!(
            b == 128,
            s >= step,
            "rank {:?} at step {s} with batch {b}",
            p.rank
        );
    }

    // A batch no rank's GPU holds: refused by the ranks, called off on every one.
    let out = home.run(
        &["set", &run, "batch-size", "4000000"],
        Duration::from_secs(30),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{run}: batch_size = 4000000 called off: rank "))
            && stderr.contains("GiB, the GPU has 79.6 GiB")
            && stderr.contains("every rank keeps 128"),
        "{stderr}"
    );
    home.ok(&["stop", &run]);
}
