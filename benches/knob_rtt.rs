//! Knob change → the trainer's acknowledgement, over N changes (BENCHMARKS.md, "knobs").
//!
//! Starts a daemon on the fake NVML library's busy node (8 × H100 whose load moves every
//! second, `crates/fake-nvml/scenarios/8xh100.toml`) in a temporary GPUPILOT_HOME and a run of
//! a trainer that uses the channel (default: the stdlib SDK example, `python3
//! examples/train_stdlib.py`; set KNOB_TRAINER=synthetic for the built-in synthetic trainer),
//! then asks `knob_set` N times (KNOB_CHANGES, default 1000), alternating two batch sizes, each
//! after the last was answered. Reports the daemon's round trip (request taken → `knob_ack`
//! read, the `rtt_ms` of `knob_applied`) and the client's (request sent → `knob_applied` event
//! received), p50/p99.
//!
//! `cargo build --release -p gpupilot -p fake-nvml && cargo bench --bench knob_rtt` (with the
//! same CARGO_TARGET_DIR, if any; GPUPILOT_BENCH_BIN=PATH measures another gpupilot binary).

use std::time::{Duration, Instant};

use gpupilot::client::Push;
use gpupilot::profile::{Knob, Knobs, Profile};
use gpupilot::protocol::{KnobName, NodeEvent};
use gpupilot::supervisor::Caller;

mod common;
use common::{BenchDaemon, percentile};

fn main() -> anyhow::Result<()> {
    let bench = BenchDaemon::start()?;
    let (root, exe, client) = (&bench.root, &bench.exe, &bench.client);
    let n: usize = std::env::var("KNOB_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let synthetic = std::env::var("KNOB_TRAINER").as_deref() == Ok("synthetic");
    let argv: Vec<String> = if synthetic {
        vec![exe.display().to_string(), "synthetic-train".into()]
    } else {
        vec![
            "python3".into(),
            root.join("examples/train_stdlib.py").display().to_string(),
            "--steps".into(),
            "100000000".into(),
        ]
    };
    let mut profile = Profile::from_command(argv);
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
    let run = client
        .start_run(profile, caller, Default::default(), None)?
        .id;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !client.run_metrics(&run, 0)?.trainer.attached {
        anyhow::ensure!(Instant::now() < deadline, "the trainer never attached");
        std::thread::sleep(Duration::from_millis(50));
    }
    client.subscribe(false, true)?;
    let (mut daemon_ms, mut client_ms) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let value = if i % 2 == 0 { 128 } else { 64 };
        let sent = Instant::now();
        let pending = client.knob_set(&run, KnobName::BatchSize, value, false, None)?;
        loop {
            match client.updates().recv_timeout(Duration::from_secs(10))? {
                Push::Event(rec) => match rec.event {
                    NodeEvent::KnobApplied { change, rtt_ms, .. } if change == pending.seq => {
                        client_ms.push(sent.elapsed().as_secs_f64() * 1e3);
                        daemon_ms.push(rtt_ms);
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
    for v in [&mut daemon_ms, &mut client_ms] {
        v.sort_by(f64::total_cmp);
    }
    let trainer = if synthetic {
        "synthetic trainer"
    } else {
        "python SDK (examples/train_stdlib.py)"
    };
    println!("knob change → acknowledgement, {n} changes, trainer: {trainer}");
    println!("| measured | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|");
    for (what, v) in [
        ("daemon: knob_set taken → knob_ack read", &daemon_ms),
        ("client: knob_set sent → knob_applied event", &client_ms),
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
