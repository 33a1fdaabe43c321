//! What the daemon benchmarks share: a daemon of the release build in a temporary home on the
//! fake NVML library's busy node, its client, the way it is stopped, and percentiles.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gpupilot::client::Client;
use gpupilot::config::Paths;

/// The `p` quantile (0–1) of sorted figures, nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// The fake NVML scenario the daemon benchmarks run on: eight H100s whose utilization, power,
/// clocks, temperature and PCIe traffic move every second (gpusim's `Activity`), as on a busy
/// node; GPU 7 idles.
pub const BUSY_SCENARIO: &str = "crates/fake-nvml/scenarios/8xh100.toml";

/// The release build's directory: `$CARGO_TARGET_DIR/release` when the bench was built with
/// CARGO_TARGET_DIR set (cargo passes it on to the bench), else `target/release`.
fn release_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir).join("release"),
        None => root.join("target/release"),
    }
}

/// The gpupilot binary under test: GPUPILOT_BENCH_BIN when set, else the release build's.
pub fn gpupilot_exe(root: &Path) -> PathBuf {
    std::env::var_os("GPUPILOT_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| release_dir(root).join("gpupilot"))
}

/// The fake NVML library of the release build.
pub fn fake_nvml_lib(root: &Path) -> PathBuf {
    release_dir(root).join("libnvidia_ml.so")
}

/// A daemon on the busy fake node ([`BUSY_SCENARIO`], `--source nvml` through the fake
/// library), started detached from the release build in a temporary GPUPILOT_HOME; stopped
/// with its run by [`BenchDaemon::stop`]. The fake library logs every setter call to
/// [`BenchDaemon::setter_log`].
pub struct BenchDaemon {
    pub root: PathBuf,
    pub exe: PathBuf,
    pub client: Client,
    pub setter_log: PathBuf,
    _home: tempfile::TempDir,
}

impl BenchDaemon {
    pub fn start() -> anyhow::Result<BenchDaemon> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let exe = gpupilot_exe(&root);
        let lib = fake_nvml_lib(&root);
        anyhow::ensure!(
            exe.exists() && lib.exists(),
            "{} or {} is missing: build first with the bench's CARGO_TARGET_DIR, \
             cargo build --release -p gpupilot -p fake-nvml",
            exe.display(),
            lib.display()
        );
        let home = tempfile::tempdir()?;
        let paths = Paths {
            config: home.path().join("config"),
            state: home.path().join("state"),
            runtime: home.path().join("run"),
        };
        let setter_log = home.path().join("setters.jsonl");
        let status = Command::new(&exe)
            .env("GPUPILOT_HOME", home.path())
            .env("FAKE_NVML_SCENARIO", root.join(BUSY_SCENARIO))
            .env("FAKE_NVML_STATE", home.path().join("node"))
            .env("FAKE_NVML_LOG", &setter_log)
            .args(["--source", "nvml", "--nvml-lib"])
            .arg(&lib)
            .args(["daemon", "--detach"])
            .stdout(Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "the daemon did not start");
        let client = Client::connect(&paths)?;
        Ok(BenchDaemon {
            root,
            exe,
            client,
            setter_log,
            _home: home,
        })
    }

    /// Kill `run` if there is one, then stop the daemon (SIGTERM).
    pub fn stop(&self, run: Option<&str>) -> anyhow::Result<()> {
        if let Some(run) = run {
            let _ = self.client.stop_run(run, true, None, None);
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let pid = self.client.status()?.daemon.pid;
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        Ok(())
    }
}
