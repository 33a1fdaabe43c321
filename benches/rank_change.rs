//! A knob change to a run of 8 ranks (BENCHMARKS.md, "A change to 8 ranks").
//!
//! Starts a daemon on the fake NVML library's busy node (8 × H100 whose load moves every
//! second, `crates/fake-nvml/scenarios/8xh100.toml`) in a temporary GPUPILOT_HOME and a run of
//! RANKS (default 8) processes, each a rank of the Python SDK (stdlib only) that steps every
//! STEP_MS (default 20) milliseconds and reports every step, then asks `knob_set` N times
//! (RANK_CHANGES, default 200), alternating two batch sizes, each once the last has been
//! applied on every rank. Reports, p50 and p99:
//! - request → every rank agreed (the daemon's `rtt_ms` of `knob_staged`, request taken → the
//!   last vote read; and the client's, request sent → the `knob_staged` event);
//! - the lead the daemon chose: apply step − the newest step reported when it was asked, in
//!   steps, and the time from the commit to the last rank's acknowledgement (`knob_applied`);
//! - request → every rank applied it at the step (the client's, → `knob_applied`).
//!
//! `cargo build --release -p gpupilot -p fake-nvml && cargo bench --bench rank_change` (with the
//! same CARGO_TARGET_DIR, if any; GPUPILOT_BENCH_BIN=PATH measures another gpupilot binary).

use std::time::{Duration, Instant};

use gpupilot::client::Push;
use gpupilot::profile::{Knob, Knobs, Profile};
use gpupilot::protocol::{KnobName, NodeEvent};
use gpupilot::supervisor::Caller;

mod common;
use common::{BenchDaemon, percentile};

const RANK_SCRIPT: &str = r#"
import os, sys, time
sys.path.insert(0, os.environ["SDK_DIR"])
import gpupilot
gp = gpupilot.connect(knobs={"batch_size": 64})
step_s = float(os.environ["STEP_MS"]) / 1000.0
step = 0
while True:
    bs = gp.knob("batch_size")
    time.sleep(step_s)
    gp.report(step=step, samples_per_s=bs / step_s, step_time_s=step_s)
    step += 1
"#;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    let n: usize = env_or("RANK_CHANGES", 200);
    let ranks: u32 = env_or("RANKS", 8);
    let step_ms: u32 = env_or("STEP_MS", 20);
    let bench = BenchDaemon::start()?;
    let (root, client) = (&bench.root, &bench.client);
    let home = tempfile::tempdir()?;
    let script = home.path().join("rank.py");
    std::fs::write(&script, RANK_SCRIPT)?;
    let starts: Vec<String> = (0..ranks)
        .map(|r| {
            format!(
                "RANK={r} LOCAL_RANK={r} WORLD_SIZE={ranks} python3 {} &",
                script.display()
            )
        })
        .collect();
    let mut profile = Profile::from_command(vec![
        "sh".into(),
        "-c".into(),
        format!("{} wait", starts.join(" ")),
    ]);
    profile.knobs = Knobs {
        batch_size: Some(Knob {
            initial: 64,
            min: 1,
            max: Some(1024),
        }),
        prefetch: None,
    };
    let mut caller = Caller::current()?;
    caller.cwd = root.clone();
    caller
        .env
        .insert("SDK_DIR".into(), root.join("python").display().to_string());
    caller.env.insert("STEP_MS".into(), step_ms.to_string());
    let run = client
        .start_run(profile, caller, Default::default(), None)?
        .id;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = client.run_metrics(&run, 0)?;
        let reporting = m
            .trainer
            .ranks
            .iter()
            .filter(|r| r.attached && r.steps_per_s.is_some())
            .count();
        if reporting == ranks as usize {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the ranks never all reported");
        std::thread::sleep(Duration::from_millis(50));
    }
    client.subscribe(false, true)?;
    let mut agreed_daemon = Vec::with_capacity(n);
    let mut agreed_client = Vec::with_capacity(n);
    let mut applied_client = Vec::with_capacity(n);
    let mut lead_steps = Vec::with_capacity(n);
    let mut lead_ms = Vec::with_capacity(n);
    for i in 0..n {
        let value = if i % 2 == 0 { 128 } else { 64 };
        let newest = client
            .run_metrics(&run, 0)?
            .trainer
            .ranks
            .iter()
            .filter_map(|r| r.last.as_ref()?.report.step)
            .max()
            .unwrap_or(0);
        let sent = Instant::now();
        let pending = client.knob_set(&run, KnobName::BatchSize, value, false, None)?;
        let apply_step = pending.apply_step.expect("a change to several ranks");
        lead_steps.push(apply_step.saturating_sub(newest) as f64);
        let mut staged_at = None;
        loop {
            match client.updates().recv_timeout(Duration::from_secs(20))? {
                Push::Event(rec) => match rec.event {
                    NodeEvent::KnobStaged { change, rtt_ms, .. } if change == pending.seq => {
                        agreed_client.push(sent.elapsed().as_secs_f64() * 1e3);
                        agreed_daemon.push(rtt_ms);
                        staged_at = Some(Instant::now());
                    }
                    NodeEvent::KnobApplied { change, .. } if change == pending.seq => {
                        applied_client.push(sent.elapsed().as_secs_f64() * 1e3);
                        if let Some(t) = staged_at {
                            lead_ms.push(t.elapsed().as_secs_f64() * 1e3);
                        }
                        break;
                    }
                    NodeEvent::KnobRejected { change, reason, .. } if change == pending.seq => {
                        anyhow::bail!("change {change} rejected: {reason}")
                    }
                    _ => {}
                },
                Push::Closed => anyhow::bail!("the daemon went away"),
                _ => {}
            }
        }
    }
    bench.stop(Some(&run))?;
    for v in [
        &mut agreed_daemon,
        &mut agreed_client,
        &mut applied_client,
        &mut lead_steps,
        &mut lead_ms,
    ] {
        v.sort_by(f64::total_cmp);
    }
    println!("knob change to {ranks} ranks (python SDK, a step every {step_ms} ms), {n} changes");
    println!("| measured | p50 | p99 | max |");
    println!("|---|---:|---:|---:|");
    for (what, v) in [
        (
            "daemon: knob_set taken → last rank's vote read (ms)",
            &agreed_daemon,
        ),
        (
            "client: knob_set sent → knob_staged event (ms)",
            &agreed_client,
        ),
        (
            "lead: apply step − newest reported step (steps)",
            &lead_steps,
        ),
        ("commit → last rank applied it at the step (ms)", &lead_ms),
        (
            "client: knob_set sent → knob_applied event (ms)",
            &applied_client,
        ),
    ] {
        println!(
            "| {what} | {:.2} | {:.2} | {:.2} |",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v[v.len() - 1]
        );
    }
    Ok(())
}
