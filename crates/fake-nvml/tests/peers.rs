//! The real peers against the fake library: gpustat, nvitop, pynvml and nvtop must all show the
//! simulated GPUs. A peer that is not installed is skipped with a message, unless
//! `GPUPILOT_REQUIRE_PEERS=1` (CI), where a missing peer fails the test.
//!
//! Python peers are looked for in the workspace's `.venv/bin` first, then on `PATH`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use nvidia_ml::testing::install_soname_link;

const SCENARIO: &str = r#"
gpus = ["h100-sxm", "a100-sxm-80gb"]
seed = 3
[training]
model = "resnet50"
"#;

/// A temporary node the peers share: scenario, state and a `libnvidia-ml.so.1` link.
struct Node {
    _dir: tempfile::TempDir,
    lib_dir: PathBuf,
    scenario: PathBuf,
    state: PathBuf,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let lib_dir = install_soname_link(&common::lib(), &dir.path().join("lib")).unwrap();
        let scenario = dir.path().join("peers.toml");
        std::fs::write(&scenario, SCENARIO).unwrap();
        Node {
            lib_dir,
            scenario,
            state: dir.path().join("node.state"),
            _dir: dir,
        }
    }

    fn env(&self, cmd: &mut Command) {
        cmd.env("LD_LIBRARY_PATH", &self.lib_dir)
            .env("FAKE_NVML_SCENARIO", &self.scenario)
            .env("FAKE_NVML_STATE", &self.state)
            .env_remove("FAKE_NVML_LOG");
    }

    /// Runs `program args` under `timeout`, against this node.
    fn run(&self, program: &Path, args: &[&str]) -> Output {
        let mut cmd = Command::new("timeout");
        cmd.arg("60").arg(program).args(args);
        self.env(&mut cmd);
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{} {args:?} failed: {}\n{}",
            program.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

fn names() -> [&'static str; 2] {
    [
        gpusim::find("h100-sxm").unwrap().name,
        gpusim::find("a100-sxm-80gb").unwrap().name,
    ]
}

/// Finds a peer, or explains why the check is skipped (failing instead when peers are required).
fn find_peer(program: &str) -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.venv/bin")
        .join(program);
    let found = if venv.is_file() {
        Some(venv)
    } else {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
    };
    if found.is_none() {
        let why = format!(
            "{program} is not installed (looked in .venv/bin and PATH); install it to run this check \
             (see docs/fake-nvml.md)"
        );
        assert!(
            std::env::var("GPUPILOT_REQUIRE_PEERS").as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("skipping: {why}");
    }
    found
}

#[test]
fn gpustat_json_shows_the_gpus() {
    let Some(gpustat) = find_peer("gpustat") else {
        return;
    };
    let node = Node::new();
    let out = node.run(&gpustat, &["--json"]);
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("gpustat --json prints JSON");
    assert_eq!(v["driver_version"], "550.54.15");
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    for (g, (name, id)) in gpus
        .iter()
        .zip(names().into_iter().zip(["h100-sxm", "a100-sxm-80gb"]))
    {
        let spec = gpusim::find(id).unwrap();
        assert_eq!(g["name"], name);
        assert_eq!(g["memory.total"], spec.memory_bytes / (1 << 20), "MiB");
        assert_eq!(g["enforced.power.limit"], spec.power_default_w as u64, "W");
        assert!(g["power.draw"].as_u64().unwrap() > 0);
        assert!(g["temperature.gpu"].as_u64().unwrap() >= 20);
        assert!(g["fan.speed"].is_null(), "SXM: no fan");
    }
}

#[test]
fn nvitop_once_shows_the_gpus() {
    let Some(nvitop) = find_peer("nvitop") else {
        return;
    };
    let node = Node::new();
    let out = node.run(&nvitop, &["--once"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Driver Version: 550.54.15"), "{text}");
    assert!(text.contains("CUDA Driver Version: 12.4"), "{text}");
    // nvitop drops the "NVIDIA " prefix.
    for name in names() {
        assert!(
            text.contains(name.trim_start_matches("NVIDIA ")),
            "{name} missing:\n{text}"
        );
    }
    assert!(
        text.contains("00000000:18:00.0") && text.contains("00000000:2A:00.0"),
        "{text}"
    );
    assert!(
        text.contains("/ 700W") && text.contains("/ 400W"),
        "power caps:\n{text}"
    );
    assert!(
        text.contains("4200000"),
        "the default training process:\n{text}"
    );
}

#[test]
fn pynvml_calls_answer() {
    let Some(python) = find_peer("python3") else {
        return;
    };
    let node = Node::new();
    let script = r#"
import pynvml as N
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(1)
print("name", N.nvmlDeviceGetName(h))
print("tempV", N.nvmlDeviceGetTemperatureV(h, N.NVML_TEMPERATURE_GPU))
print("mem_v2", N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2).total)
print("limit", N.nvmlDeviceGetPowerManagementLimit(h))
print("procs", [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(h)])
print("detail", [p.pid for p in N.nvmlDeviceGetRunningProcessDetailList(h, N.nvmlProcessDetailList_v1, N.NVML_PROCESS_MODE_COMPUTE)])
print("cuda", N.nvmlSystemGetCudaDriverVersion_v2())
N.nvmlShutdown()
"#;
    let probe = Command::new(&python)
        .args(["-c", "import pynvml"])
        .output()
        .unwrap();
    if !probe.status.success() {
        assert!(
            std::env::var("GPUPILOT_REQUIRE_PEERS").as_deref() != Ok("1"),
            "pynvml is not installed"
        );
        eprintln!(
            "skipping: pynvml (nvidia-ml-py) is not installed for {}",
            python.display()
        );
        return;
    }
    let out = node.run(&python, &["-c", script]);
    let text = String::from_utf8_lossy(&out.stdout);
    let a100 = gpusim::find("a100-sxm-80gb").unwrap();
    assert!(text.contains(&format!("name {}", a100.name)), "{text}");
    assert!(
        text.contains(&format!("mem_v2 {}", a100.memory_bytes)),
        "{text}"
    );
    assert!(
        text.contains(&format!("limit {}", (a100.power_default_w * 1000.0) as u64)),
        "{text}"
    );
    assert!(
        text.contains("procs [4200001]") && text.contains("detail [4200001]"),
        "{text}"
    );
    assert!(text.contains("cuda 12040"), "{text}");
    let temp: i64 = text
        .lines()
        .find_map(|l| l.strip_prefix("tempV "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(temp >= 20, "{text}");
}

#[test]
fn nvtop_shows_the_gpus() {
    let Some(nvtop) = find_peer("nvtop") else {
        return;
    };
    let Some(tmux) = find_peer("tmux") else {
        return;
    };
    let node = Node::new();
    let session = format!("fake-nvml-nvtop-{}", std::process::id());
    let inner = format!(
        "env LD_LIBRARY_PATH={} FAKE_NVML_SCENARIO={} FAKE_NVML_STATE={} {}",
        node.lib_dir.display(),
        node.scenario.display(),
        node.state.display(),
        nvtop.display()
    );
    let started = Command::new(&tmux)
        .args([
            "new-session",
            "-d",
            "-s",
            &session,
            "-x",
            "200",
            "-y",
            "50",
            &inner,
        ])
        .status()
        .unwrap();
    assert!(started.success());
    let capture = || {
        let out = Command::new(&tmux)
            .args(["capture-pane", "-p", "-t", &session])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Wait for the first full frame (nvtop draws after its first refresh).
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut screen = capture();
    while !(screen.contains("Device 1") && screen.contains("POW")) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        screen = capture();
    }
    let _ = Command::new(&tmux)
        .args(["kill-session", "-t", &session])
        .status();
    for name in names() {
        assert!(
            screen.contains(&format!("[{name}]")),
            "{name} missing:\n{screen}"
        );
    }
    assert!(
        screen.contains("PCIe GEN 5@16x") && screen.contains("PCIe GEN 4@16x"),
        "{screen}"
    );
    assert!(
        screen.contains("/ 700 W") && screen.contains("/ 400 W"),
        "{screen}"
    );
}
