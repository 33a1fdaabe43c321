//! Power-cap request → NVML call, over N requests (BENCHMARKS.md, "power caps").
//!
//! A daemon on the fake NVML library's busy node (8 × H100 whose load moves every second,
//! `crates/fake-nvml/scenarios/8xh100.toml`) in a temporary home; N `power_cap` requests
//! (POWER_CHANGES, default 1000) on GPU 1, alternating 300 W and 650 W, each sent once the last
//! was answered and POWER_PACE_MS (default 0) later: a pace of 10 ms spreads the requests over
//! ten of the daemon's 1 Hz samples of the moving GPUs. The daemon answers once the NVML setter
//! has returned, so the request's round trip bounds "request → NVML call"; the fake library's
//! setter log confirms every call arrived, in milliwatts.
//!
//! `cargo build --release -p gpupilot -p fake-nvml && cargo bench --bench power_rtt` (with the
//! same CARGO_TARGET_DIR, if any; GPUPILOT_BENCH_BIN=PATH measures another gpupilot binary).

use std::time::{Duration, Instant};

use gpupilot::protocol::{Request, Response, TargetGpus};

mod common;
use common::{BenchDaemon, percentile};

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::var("POWER_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let pace = Duration::from_millis(
        std::env::var("POWER_PACE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    let bench = BenchDaemon::start()?;
    let client = &bench.client;
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
        std::thread::sleep(pace);
        let watts = if i % 2 == 0 { 300.0 } else { 650.0 };
        let sent = Instant::now();
        let answer = client.request(Request::PowerCap {
            gpus: TargetGpus::Some(vec![1]),
            watts,
            why: None,
        })?;
        ms.push(sent.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(
            !matches!(answer, Response::Error { .. }),
            "refused: {answer:?}"
        );
    }
    let _ = client.request(Request::PowerReset {
        gpus: TargetGpus::All,
        why: None,
    });
    let calls = std::fs::read_to_string(&bench.setter_log)?
        .lines()
        .filter(|l| l.contains("SetPowerManagementLimit"))
        .count();
    bench.stop(None)?;
    ms.sort_by(f64::total_cmp);
    println!(
        "power_cap request → answer (after the NVML call), {n} requests {} ms apart, {calls} NVML setter calls logged",
        pace.as_millis()
    );
    println!("| p50 ms | p99 ms | max ms |");
    println!("|---:|---:|---:|");
    println!(
        "| {:.2} | {:.2} | {:.2} |",
        percentile(&ms, 0.5),
        percentile(&ms, 0.99),
        ms[ms.len() - 1]
    );
    Ok(())
}
