//! The setter log: one JSON line per setter call (`FAKE_NVML_LOG`), so tests can assert exactly
//! what NVML was asked — in NVML's own units (milliwatts, MHz) — and what it answered.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// Where setter calls are recorded.
#[derive(Debug, Clone)]
pub struct SetLog {
    path: PathBuf,
}

/// One line of the log.
#[derive(Debug, Serialize)]
pub struct SetRecord<'a> {
    /// Wall clock, Unix seconds.
    pub ts: f64,
    /// Simulated seconds since the node started.
    pub sim_s: f64,
    pub pid: u32,
    /// The exported symbol that was called, e.g. `nvmlDeviceSetPowerManagementLimit`.
    pub function: &'a str,
    pub gpu: usize,
    /// The argument(s) exactly as received: a number, or `[a, b]` for two-argument setters.
    pub value: serde_json::Value,
    /// The nvmlReturn_t answered (0 = success).
    pub result: u32,
}

impl SetLog {
    pub fn new(path: PathBuf) -> SetLog {
        SetLog { path }
    }

    /// Appends one record. Failures are reported on stderr and otherwise ignored: the log must
    /// never change what the caller gets.
    pub fn record(
        &self,
        function: &str,
        gpu: usize,
        value: serde_json::Value,
        sim_s: f64,
        result: u32,
    ) {
        let rec = SetRecord {
            ts: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            sim_s,
            pid: std::process::id(),
            function,
            gpu,
            value,
            result,
        };
        let Ok(mut line) = serde_json::to_vec(&rec) else {
            return;
        };
        line.push(b'\n');
        // O_APPEND and one write per line: lines from concurrent processes do not interleave.
        let written = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| f.write_all(&line));
        if let Err(e) = written {
            eprintln!(
                "fake-nvml: cannot write the setter log {}: {e}",
                self.path.display()
            );
        }
    }
}
