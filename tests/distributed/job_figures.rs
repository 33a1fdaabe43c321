//! A job is one thing: four ranks of the Python SDK, each training 150 steps of 32 samples at
//! a throughput of its own (100, 200, 300 and 400 samples/s), started by the `ranks` launcher
//! through a real daemon. Every output that shows the job's figures must give the job's, not
//! one rank's: `ps --json`, `/metrics` and the console's chart while it trains (1,000
//! samples/s; 128,000 tokens/s in `ps --json` and `/metrics`), then `summary.json`, `report
//! --json`, `ps --json` and `export` once it ended (19,200 samples, and J/sample = energy /
//! 19,200). The ranks also print their reports as JSON lines, before and after they detach:
//! none of them is read as a second report.

use std::time::Duration;

use crate::support::home::Home;
use crate::support::net::{free_port, http_get};
use crate::support::ranks::sdk_dir;
use crate::support::wait::wait_for;
use gpupilot::tui::metrics::{RunMetrics, Series};
use serde_json::Value;

const RANKS: u64 = 4;
const STEPS: u64 = 150;
const BATCH: u64 = 32;
/// The job's throughput while every rank reports: 100 + 200 + 300 + 400.
const JOB_RATE: f64 = 1000.0;

/// A rank: its reports through the SDK and the same as JSON lines on stdout; then it holds
/// (its newest report stands) until the test creates `$RELEASE`, and prints one more line
/// after it detached.
const SCRIPT: &str = r#"
import json, os, sys, time
sys.path.insert(0, os.environ["SDK_DIR"])
import gpupilot
rank = int(os.environ["RANK"])
gp = gpupilot.connect(knobs={"batch_size": 32}, gpu=rank % 2)
rate = 100.0 * (rank + 1)
for step in range(150):
    time.sleep(0.01)
    gp.report(step=step, samples_per_s=rate, step_time_s=0.01 * (rank + 1), loss=1.0 / (step + 1),
              tokens_per_s=128 * rate)
    sys.stdout.write(json.dumps({"rank": rank, "step": step, "samples_per_s": rate}) + "\n")
deadline = time.time() + 60
while not os.path.exists(os.environ["RELEASE"]) and time.time() < deadline:
    time.sleep(0.05)
gp.close()
sys.stdout.write(json.dumps({"rank": rank, "step": 149, "samples_per_s": rate}) + "\n")
"#;

fn ps(home: &Home, run: &str) -> Value {
    let all: Value = serde_json::from_str(&home.ok(&["ps", "--json"])).unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == run)
        .cloned()
        .unwrap_or_else(|| panic!("{run} not in ps: {all}"))
}

/// `name{…run="RUN"…} VALUE` in a `/metrics` body.
fn gauge(body: &str, name: &str, run: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| l.contains(&format!("run=\"{run}\"")))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn every_output_counts_all_four_ranks() {
    let home = Home::new();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _daemon = home.daemon(&["--metrics-addr", &addr]);
    let script = home.dir.path().join("rank.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let release = home.dir.path().join("release");
    let profile = home.dir.path().join("job.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"job\"\n[run]\ncommand = [\"python3\", \"{}\"]\nlauncher = \"ranks\"\n\
             env = {{ SDK_DIR = \"{}\", RELEASE = \"{}\", CUDA_VISIBLE_DEVICES = \"0,1\" }}\n[run.ranks]\nnproc = 4\n\
             [knobs.batch_size]\ninitial = 32\nmin = 1\nmax = 1024\n",
            script.display(),
            sdk_dir().display(),
            release.display()
        ),
    )
    .unwrap();
    let run = home
        .ok(&["run", "--detach", &profile.display().to_string()])
        .trim()
        .to_string();
    let c = home.client();

    // While it trains: every rank has reported its last step and holds.
    wait_for(
        "all four ranks to report their last step",
        Duration::from_secs(60),
        || {
            c.run_metrics(&run, 0).is_ok_and(|m| {
                m.trainer.ranks.len() == RANKS as usize
                    && m.trainer.ranks.iter().all(|r| {
                        r.attached && r.last.as_ref().and_then(|p| p.report.step) == Some(STEPS - 1)
                    })
            })
        },
    );
    let live = ps(&home, &run);
    let job = &live["trainer"]["job"];
    assert_eq!(job["reporting"], RANKS, "{live}");
    assert!(
        close(job["samples_per_s"].as_f64().unwrap(), JOB_RATE),
        "{job}"
    );
    assert_eq!(job["step"], STEPS - 1);
    assert!(close(job["step_time_s"].as_f64().unwrap(), 0.04), "{job}");
    assert_eq!(job["slowest_rank"], 3);
    // 128 tokens a sample: the job's tokens/s are every rank's.
    assert!(
        close(job["tokens_per_s"].as_f64().unwrap(), 128.0 * JOB_RATE),
        "{job}"
    );
    let body = http_get(port, "/metrics").1;
    let rate = gauge(&body, "gpupilot_run_samples_per_second", &run);
    assert!(rate.is_some_and(|r| close(r, JOB_RATE)), "{rate:?}\n{body}");
    let tokens = gauge(&body, "gpupilot_run_tokens_per_second", &run);
    assert!(
        tokens.is_some_and(|r| close(r, 128.0 * JOB_RATE)),
        "{tokens:?}"
    );
    let step = gauge(&body, "gpupilot_run_step", &run);
    assert_eq!(step, Some((STEPS - 1) as f64));
    // The console's chart: the job's series from the same reports.
    let m = c.run_metrics(&run, 0).unwrap();
    let mut console = RunMetrics::default();
    console.take(run.clone(), m.points, true, m.trainer);
    let chart = console.series(Series::SamplesPerS);
    let newest = chart.last().map(|(_, v)| *v);
    assert!(newest.is_some_and(|r| close(r, JOB_RATE)), "{chart:?}");

    // The end.
    std::fs::write(&release, "").unwrap();
    wait_for("the job to end", Duration::from_secs(60), || {
        c.run(&run).is_ok_and(|r| r.is_final())
    });
    let dir = home.run_dir(&run);
    let total = RANKS * STEPS * BATCH;
    // Every report once: the SDK's, none read again from the output (before or after the
    // ranks detached).
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let reports: Vec<Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(reports.len() as u64, RANKS * STEPS);
    assert!(
        reports
            .iter()
            .all(|r| r["from"] == "trainer" && r["rank"].is_u64())
    );

    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["samples"], total, "{summary}");
    let energy_j = summary["energy_j"]
        .as_f64()
        .expect("the job's GPUs are charged");
    assert!(energy_j > 0.0, "{summary}");
    let per_sample = energy_j / total as f64;
    assert!(close(
        summary["energy"]["j_per_sample"].as_f64().unwrap(),
        per_sample
    ));

    let report = home.report_json(&run);
    assert_eq!(report["energy"]["samples"], total, "{}", report["energy"]);
    assert!(close(
        report["energy"]["j_per_sample"].as_f64().unwrap(),
        per_sample
    ));
    assert_eq!(report["throughput"]["samples"], total);
    let t: Vec<f64> = reports.iter().map(|r| r["t"].as_f64().unwrap()).collect();
    let span =
        t.iter().cloned().fold(f64::MIN, f64::max) - t.iter().cloned().fold(f64::MAX, f64::min);
    let mean = report["throughput"]["mean_samples_per_s"].as_f64().unwrap();
    assert!(
        close(mean, total as f64 / span),
        "{mean} vs {}",
        total as f64 / span
    );

    let ended = ps(&home, &run);
    assert_eq!(ended["energy"]["samples"], total, "{ended}");
    assert!(close(
        ended["energy"]["j_per_sample"].as_f64().unwrap(),
        per_sample
    ));
    let table = home.ok(&["ps"]);
    let line = table
        .lines()
        .find(|l| l.contains(&run[..15]))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        line.contains(&format!("{per_sample:.2} J/sample")),
        "{line}"
    );

    // The export: one row per report, with its rank.
    let csv = home.ok(&["export", "--run", &run]);
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| head.iter().position(|h| *h == name).unwrap();
    let (rank, source) = (col("rank"), col("source"));
    let mut per_rank = [0u64; RANKS as usize];
    for l in lines {
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(f[source], "trainer", "{l}");
        per_rank[f[rank].parse::<usize>().unwrap()] += 1;
    }
    assert_eq!(per_rank, [STEPS; RANKS as usize]);
}
