//! The fake NVML library (crates/fake-nvml), built on first use, and a simulated node of it
//! for one test: a scenario file and its own shared-state file and setter log.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The workspace's target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// A directory holding `libnvidia-ml.so.1`, the fake NVML library (built if missing), for
/// LD_LIBRARY_PATH and `--nvml-lib`.
pub fn fake_nvml_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let lib = target_dir().join("debug/libnvidia_ml.so");
        // `cargo test --workspace` builds it; `cargo test -p gpupilot` may not have.
        let status = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "fake-nvml"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo build -p fake-nvml");
        assert!(status.success(), "building the fake NVML library failed");
        assert!(lib.exists(), "{} missing after build", lib.display());
        let dir = target_dir().join("fake-nvml-lib");
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("libnvidia-ml.so.1");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&lib, &link).unwrap();
        dir
    })
}

/// Path of the fake `libnvidia-ml.so.1`.
pub fn fake_nvml_lib() -> PathBuf {
    fake_nvml_dir().join("libnvidia-ml.so.1")
}

/// A scratch directory with a scenario file and its own shared-state file, so tests never see
/// each other's simulated node.
pub struct FakeNode {
    pub dir: tempfile::TempDir,
    pub scenario: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
}

impl FakeNode {
    pub fn new(scenario_toml: &str) -> FakeNode {
        let dir = tempfile::tempdir().unwrap();
        let scenario = dir.path().join("scenario.toml");
        std::fs::write(&scenario, scenario_toml).unwrap();
        FakeNode {
            state: dir.path().join("state"),
            log: dir.path().join("setters.jsonl"),
            scenario,
            dir,
        }
    }

    /// Point a command at this node (the fake library reads these variables).
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("FAKE_NVML_SCENARIO", &self.scenario)
            .env("FAKE_NVML_STATE", &self.state)
            .env("FAKE_NVML_LOG", &self.log)
            .env("LD_LIBRARY_PATH", fake_nvml_dir());
    }

    /// `gpupilot ARGS…` on this node through the fake NVML library.
    pub fn gpupilot(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpupilot"));
        cmd.arg("--source")
            .arg("nvml")
            .arg("--nvml-lib")
            .arg(fake_nvml_lib());
        cmd.args(args);
        self.apply(&mut cmd);
        cmd.env_remove("GPUPILOT_SOURCE")
            .env_remove("GPUPILOT_NVML_LIB")
            .env_remove("GPUPILOT_SYSTEM");
        cmd
    }
}
