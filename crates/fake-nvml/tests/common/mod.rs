//! Shared test harness: every test runs in its own child process (the test binary re-invoked
//! with `--exact NAME`), because NVML's state is per process and the scenario comes from the
//! environment. The parent writes the scenario into a temporary directory, points
//! `FAKE_NVML_SCENARIO`, `FAKE_NVML_STATE` and `FAKE_NVML_LOG` there, runs the child and
//! asserts it passed.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use nvml_wrapper::Nvml;

const CHILD: &str = "FAKE_NVML_TEST_CHILD";
const DIR: &str = "FAKE_NVML_TEST_DIR";

/// Files of one isolated test.
pub struct Paths {
    pub dir: PathBuf,
    pub scenario: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
}

impl Paths {
    fn in_dir(dir: PathBuf) -> Paths {
        Paths {
            scenario: dir.join("scenario.toml"),
            state: dir.join("node.state"),
            log: dir.join("setters.jsonl"),
            dir,
        }
    }

    /// The setter log as parsed JSON lines.
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("log lines are JSON"))
            .collect()
    }

    /// A command that runs test `name` (an `#[ignore]`d helper) of this binary against the
    /// same node.
    pub fn helper(&self, name: &str) -> Command {
        self.command(name, true)
    }

    fn command(&self, name: &str, ignored: bool) -> Command {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", name, "--nocapture", "--test-threads=1", "-q"]);
        if ignored {
            cmd.arg("--ignored");
        }
        cmd.env(CHILD, name)
            .env(DIR, &self.dir)
            .env("FAKE_NVML_SCENARIO", &self.scenario)
            .env("FAKE_NVML_STATE", &self.state)
            .env("FAKE_NVML_LOG", &self.log);
        cmd
    }
}

/// The built cdylib (cargo builds it before integration tests).
pub fn lib() -> PathBuf {
    nvidia_ml::testing::find_cdylib()
        .expect("target/<profile>/libnvidia_ml.so exists: cargo builds it for tests")
}

/// Opens the fake library through nvml-wrapper.
pub fn nvml() -> Nvml {
    let lib = lib();
    Nvml::builder()
        .lib_path(OsStr::new(&lib))
        .init()
        .expect("nvmlInit_v2 succeeds")
}

/// In the parent: runs test `name` in a child process against `scenario`, checks it passed
/// (and runs `check` on its output), returns `None`. In the child: returns its paths.
pub fn isolate_with(name: &str, scenario: &str, check: impl FnOnce(&Output)) -> Option<Paths> {
    if std::env::var(CHILD).as_deref() == Ok(name) {
        return Some(Paths::in_dir(PathBuf::from(
            std::env::var_os(DIR).expect("the parent sets the dir"),
        )));
    }
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::in_dir(dir.path().to_path_buf());
    std::fs::write(&paths.scenario, scenario).unwrap();
    let mut cmd = paths.command(name, false);
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child test {name} failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("1 passed"), "child ran no test: {stdout}");
    check(&out);
    None
}

pub fn isolate(name: &str, scenario: &str) -> Option<Paths> {
    isolate_with(name, scenario, |_| {})
}

/// Polls `f` every 10 ms until it returns `Some`, for at most `secs` seconds.
pub fn eventually<T>(secs: f64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
