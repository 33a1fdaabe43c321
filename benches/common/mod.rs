//! What the daemon benchmarks share: a daemon of the release build in a temporary home, its
//! client, the way it is stopped, and percentiles.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

use gpupilot::client::Client;
use gpupilot::config::Paths;

/// The `p` quantile (0–1) of sorted figures, nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// A simulated node's daemon (`--source sim --gpus N`), started detached from the release
/// build in a temporary GPUPILOT_HOME; stopped with its run by [`BenchDaemon::stop`].
pub struct BenchDaemon {
    pub root: PathBuf,
    pub exe: PathBuf,
    pub client: Client,
    _home: tempfile::TempDir,
}

impl BenchDaemon {
    pub fn start(gpus: u32) -> anyhow::Result<BenchDaemon> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let exe = root.join("target/release/gpupilot");
        anyhow::ensure!(exe.exists(), "build it first: cargo build --release");
        let home = tempfile::tempdir()?;
        let paths = Paths {
            config: home.path().join("config"),
            state: home.path().join("state"),
            runtime: home.path().join("run"),
        };
        let status = Command::new(&exe)
            .env("GPUPILOT_HOME", home.path())
            .args([
                "--source",
                "sim",
                "--gpus",
                &gpus.to_string(),
                "daemon",
                "--detach",
            ])
            .stdout(Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "the daemon did not start");
        let client = Client::connect(&paths)?;
        Ok(BenchDaemon {
            root,
            exe,
            client,
            _home: home,
        })
    }

    /// Kill `run`, then stop the daemon (SIGTERM).
    pub fn stop(&self, run: &str) -> anyhow::Result<()> {
        let _ = self.client.stop_run(run, true, None, None);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let pid = self.client.status()?.daemon.pid;
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        Ok(())
    }
}
