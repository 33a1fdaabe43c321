//! Power-cap request → NVML call, over N requests (BENCHMARKS.md, "power caps").
//!
//! A daemon on the fake NVML library (8 × H100, `crates/fake-nvml/scenarios/8xh100.toml`) in a
//! temporary home; N `power_cap` requests (POWER_CHANGES, default 1000) on GPU 1, alternating
//! 300 W and 650 W. The daemon answers once the NVML setter has returned, so the request's
//! round trip bounds "request → NVML call"; the fake library's setter log confirms every call
//! arrived, in milliwatts.
//!
//! `cargo build --release -p gpupilot -p fake-nvml && cargo bench --bench power_rtt`

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use gpupilot::client::Client;
use gpupilot::config::Paths;
use gpupilot::protocol::{Request, Response, TargetGpus};

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let exe = root.join("target/release/gpupilot");
    let lib = root.join("target/release/libnvidia_ml.so");
    anyhow::ensure!(
        exe.exists() && lib.exists(),
        "build first: cargo build --release -p gpupilot -p fake-nvml"
    );
    let n: usize = std::env::var("POWER_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let home = tempfile::tempdir()?;
    let paths = Paths {
        config: home.path().join("config"),
        state: home.path().join("state"),
        runtime: home.path().join("run"),
    };
    let setlog = home.path().join("setters.jsonl");
    let status = Command::new(&exe)
        .env("GPUPILOT_HOME", home.path())
        .env(
            "FAKE_NVML_SCENARIO",
            root.join("crates/fake-nvml/scenarios/8xh100.toml"),
        )
        .env("FAKE_NVML_STATE", home.path().join("node"))
        .env("FAKE_NVML_LOG", &setlog)
        .args(["--source", "nvml", "--nvml-lib"])
        .arg(&lib)
        .args(["daemon", "--detach"])
        .stdout(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "the daemon did not start");
    let client = Client::connect(&paths)?;
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
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
    let calls = std::fs::read_to_string(&setlog)?
        .lines()
        .filter(|l| l.contains("SetPowerManagementLimit"))
        .count();
    let pid = client.status()?.daemon.pid;
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "power_cap request → answer (after the NVML call), {n} requests, {calls} NVML setter calls logged"
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
