//! `gpupilot doctor` through the fake NVML library: a compatible and an incompatible driver,
//! PyTorch answered by a fake interpreter (GPUPILOT_PYTHON), permission refused; and on broken
//! nodes: no NVML library at all, no libcuda, a CPU-only PyTorch; and on the simulator.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::nvml::FakeNode;

const COMPATIBLE: &str = include_str!("../../crates/fake-nvml/scenarios/doctor-compatible.toml");
const OLD_DRIVER: &str = include_str!("../../crates/fake-nvml/scenarios/doctor-old-driver.toml");

/// A stand-in for python3 that prints what a PyTorch probe would (`line`, one JSON object).
fn fake_python(dir: &Path, line: &str) -> PathBuf {
    let path = dir.join("python3");
    std::fs::write(&path, format!("#!/bin/sh\ncat <<'EOF'\n{line}\nEOF\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// `doctor` without its CUDA lines (the fake node's GPUs have no CUDA library to run on; the
/// CUDA lines' own tests are in bench_cuda.rs).
fn doctor(node: &FakeNode, python: &Path, json: bool) -> Output {
    let mut args = vec!["doctor", "--no-cuda"];
    if json {
        args.push("--json");
    }
    node.gpupilot(&args)
        .env("GPUPILOT_PYTHON", python)
        .env("GPUPILOT_HOME", node.dir.path().join("home"))
        .output()
        .expect("running gpupilot doctor")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The report line of a check, by its title.
fn line<'a>(report: &'a str, title: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.get(8..).is_some_and(|rest| rest.starts_with(title)))
        .unwrap_or_else(|| panic!("no `{title}` line in\n{report}"))
}

/// The check named `name` in `doctor --json`'s answer.
fn check_named<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["checks"]
        .as_array()
        .expect("a list of checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no `{name}` check in {v}"))
}

const TORCH_CU121: &str = r#"{"torch": "2.3.1", "cuda": "12.1"}"#;

#[test]
fn a_compatible_driver_passes() {
    let node = FakeNode::new(COMPATIBLE);
    let py = fake_python(node.dir.path(), TORCH_CU121);
    let out = doctor(&node, &py, false);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(
        report.starts_with("gpupilot doctor: 2 GPUs, driver 550.54.15"),
        "{report}"
    );
    assert!(line(&report, "driver").starts_with("  ok"), "{report}");
    let cuda = line(&report, "CUDA (driver)");
    assert!(cuda.contains("CUDA 12.4"), "{cuda}");
    let torch = line(&report, "PyTorch");
    assert!(torch.starts_with("  ok"), "{torch}");
    assert!(
        torch.contains("PyTorch 2.3.1 built for CUDA 12.1: compatible"),
        "{torch}"
    );
    for title in [
        "persistence mode",
        "power limits",
        "thermal",
        "ECC",
        "power-cap permission",
    ] {
        assert!(line(&report, title).starts_with("  ok"), "{report}");
    }
    assert!(
        report.ends_with("verdict: ok, nothing to fix\n"),
        "{report}"
    );
    // The permission probe set the limit it found, and nothing else.
    let log = std::fs::read_to_string(&node.log).unwrap_or_default();
    let calls: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(calls.len(), 1, "{log}");
    assert_eq!(calls[0]["function"], "nvmlDeviceSetPowerManagementLimit");
    assert_eq!(calls[0]["value"], 700_000, "the default limit, unchanged");
}

#[test]
fn an_incompatible_driver_fails_with_what_to_do() {
    let node = FakeNode::new(OLD_DRIVER);
    let py = fake_python(node.dir.path(), TORCH_CU121);
    let out = doctor(&node, &py, false);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(2), "{report}");
    let torch = line(&report, "PyTorch");
    assert!(torch.starts_with("  FAIL"), "{torch}");
    assert!(
        torch.contains("incompatible") && torch.contains("470.57.02") && torch.contains("11.4"),
        "{torch}"
    );
    assert!(torch.contains("525.60.13"), "{torch}");
    assert!(line(&report, "persistence mode").starts_with("  warn"));
    let limits = line(&report, "power limits");
    assert!(
        limits.starts_with("  warn") && limits.contains("GPU 1 at 250 W of 400 W"),
        "{limits}"
    );
    let ecc = line(&report, "ECC");
    assert!(
        ecc.starts_with("  FAIL") && ecc.contains("GPU 1: 2"),
        "{ecc}"
    );
    assert!(
        report.ends_with("verdict: 2 problems, 2 warnings\n"),
        "{report}"
    );

    // The same as JSON, for scripts.
    let out = doctor(&node, &py, true);
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["verdict"], "fail");
    assert_eq!(v["exit_code"], 2);
    let status = |name: &str| check_named(&v, name)["status"].clone();
    assert_eq!(status("pytorch"), "fail");
    assert_eq!(status("ecc"), "fail");
    assert_eq!(status("persistence"), "warn");
    assert_eq!(status("driver"), "ok");
    assert_eq!(v["facts"]["driver_version"], "470.57.02");
    assert_eq!(v["facts"]["cuda_driver_version"], 11040);
    assert_eq!(v["facts"]["torch"]["cuda"], "12.1");
    assert_eq!(v["facts"]["gpus"][1]["ecc_uncorrected"], 2);
}

#[test]
fn a_newer_minor_release_runs_through_minor_version_compatibility() {
    let scenario = COMPATIBLE
        .replace("\"550.54.15\"", "\"535.54.03\"")
        .replace("12040", "12020");
    let node = FakeNode::new(&scenario);
    let py = fake_python(node.dir.path(), r#"{"torch": "2.4.0", "cuda": "12.4"}"#);
    let out = doctor(&node, &py, false);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let torch = line(&report, "PyTorch");
    assert!(
        torch.starts_with("  warn") && torch.contains("minor-version compatibility"),
        "{torch}"
    );
}

#[test]
fn no_pytorch_is_said_not_judged() {
    let node = FakeNode::new(COMPATIBLE);
    let py = fake_python(
        node.dir.path(),
        r#"{"torch": null, "error": "No module named 'torch'"}"#,
    );
    let out = doctor(&node, &py, false);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    let torch = line(&report, "PyTorch");
    assert!(
        torch.starts_with("  info") && torch.contains("not installed"),
        "{torch}"
    );
    // An interpreter that is not there.
    let out = doctor(&node, &node.dir.path().join("no-such-python"), false);
    let torch = text(&out);
    let torch = line(&torch, "PyTorch");
    assert!(
        torch.starts_with("  info") && torch.contains("GPUPILOT_PYTHON"),
        "{torch}"
    );
}

#[test]
fn a_user_who_may_not_set_caps_is_told_how() {
    let node = FakeNode::new(&format!(
        "{COMPATIBLE}\n[[faults]]\nkind = \"no_permission\"\n"
    ));
    let py = fake_python(node.dir.path(), TORCH_CU121);
    let out = doctor(&node, &py, false);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let perm = line(&report, "power-cap permission");
    assert!(
        perm.starts_with("  warn") && perm.contains("sudo gpupilot daemon"),
        "{perm}"
    );
}

/// `gpupilot doctor ARGS` with no NVML library where one is named (`GPUPILOT_NVML_LIB`, as
/// tests point gpupilot at the fake), `PATH` only `path`, and `python` for PyTorch.
fn doctor_without_nvml(dir: &Path, path: &Path, python: &Path, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gpupilot"))
        .arg("doctor")
        .args(args)
        .env("GPUPILOT_NVML_LIB", dir.join("no-driver/libnvidia-ml.so.1"))
        .env("GPUPILOT_HOME", dir.join("home"))
        .env("GPUPILOT_PYTHON", python)
        .env("PATH", path)
        .env_remove("GPUPILOT_SOURCE")
        .env_remove("GPUPILOT_SYSTEM")
        .output()
        .expect("running gpupilot doctor")
}

#[test]
fn no_nvml_library_is_diagnosed_and_the_rest_still_checked() {
    let tmp = tempfile::tempdir().unwrap();
    // PATH holds neither nvidia-smi nor `cat`: this interpreter answers with a shell builtin.
    let py = tmp.path().join("python3");
    crate::support::write_exec(&py, &format!("#!/bin/sh\necho '{TORCH_CU121}'\n"));
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    // Without the CUDA lines, which would judge a libcuda where the machine has one.
    let out = doctor_without_nvml(tmp.path(), &bin, &py, &["--no-cuda"]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(2), "{report}");
    assert!(!report.contains("panicked"), "{report}");
    assert!(
        report.starts_with("gpupilot doctor: NVML cannot be loaded"),
        "{report}"
    );
    let driver = line(&report, "driver");
    assert!(driver.starts_with("  FAIL"), "{driver}");
    let tried = tmp.path().join("no-driver/libnvidia-ml.so.1");
    assert!(
        driver.contains(&format!(
            "NVML library not found: tried {} (--nvml-lib / GPUPILOT_NVML_LIB",
            tried.display()
        )),
        "{driver}"
    );
    assert!(
        driver.contains("`nvidia-smi` is not on PATH either"),
        "{driver}"
    );
    // What to do: install a driver (or, in a container, have the host's mounted).
    assert!(
        driver.contains("install") || driver.contains("--gpus all"),
        "{driver}"
    );
    // The checks that need no NVML still ran.
    let torch = line(&report, "PyTorch");
    assert!(
        torch.starts_with("  info")
            && torch.contains("needs a driver that runs CUDA 12.1 or newer"),
        "{torch}"
    );
    assert!(line(&report, "GPUs").contains("not checked without NVML"));
    assert!(
        line(&report, "gpupilot's dirs").starts_with("  ok"),
        "{report}"
    );
    assert!(
        line(&report, "gpupilot daemon").starts_with("  info"),
        "{report}"
    );
    assert!(
        report.ends_with("verdict: 1 problem, 0 warnings\n"),
        "{report}"
    );

    // nvidia-smi is there, NVML is not: said, as JSON too.
    crate::support::write_exec(&bin.join("nvidia-smi"), "#!/bin/sh\nexit 9\n");
    let out = doctor_without_nvml(tmp.path(), &bin, &py, &["--json", "--no-cuda"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["verdict"], "fail");
    let no = &v["facts"]["no_nvml"];
    assert_eq!(no["reason"], "not_found");
    assert_eq!(no["tried"], tried.display().to_string());
    assert_eq!(
        no["nvidia_smi"],
        bin.join("nvidia-smi").display().to_string()
    );
    let driver = check_named(&v, "driver");
    assert_eq!(driver["status"], "fail");
    assert!(
        driver["detail"].as_str().unwrap().contains(&format!(
            "`nvidia-smi` is there ({})",
            bin.join("nvidia-smi").display()
        )),
        "{driver}"
    );
}

#[test]
fn a_cpu_only_pytorch_on_a_gpu_node_is_a_problem_with_its_fix() {
    let node = FakeNode::new(COMPATIBLE);
    let py = fake_python(
        node.dir.path(),
        r#"{"torch": "2.3.1+cpu", "cuda": null, "available": false}"#,
    );
    let out = doctor(&node, &py, false);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(2), "{report}");
    let torch = line(&report, "PyTorch");
    assert!(torch.starts_with("  FAIL"), "{torch}");
    assert!(
        torch.contains(
            "PyTorch 2.3.1+cpu is built without CUDA (CPU only): it cannot use the GPUs; install a CUDA build for CUDA 12.4 or older"
        ),
        "{torch}"
    );
    // Everything else is still judged: the node itself is fine.
    assert!(line(&report, "persistence mode").starts_with("  ok"));
    assert!(
        report.ends_with("verdict: 1 problem, 0 warnings\n"),
        "{report}"
    );
}

#[test]
fn the_real_debian_pytorch_if_present_is_asked_and_judged() {
    let python = Path::new("/usr/bin/python3");
    let has_torch = python.exists()
        && std::process::Command::new(python)
            .args(["-c", "import torch"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !has_torch {
        eprintln!("no /usr/bin/python3 with torch here: nothing to ask");
        return;
    }
    let node = FakeNode::new(COMPATIBLE);
    let out = doctor(&node, python, true);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let torch = &v["facts"]["torch"];
    let check = check_named(&v, "pytorch");
    match torch["state"].as_str() {
        // Debian's python3-torch: built without CUDA.
        Some("cpu_only") => {
            assert_eq!(check["status"], "fail", "{check}");
            let detail = check["detail"].as_str().unwrap();
            let version = torch["version"].as_str().unwrap();
            assert!(
                detail.starts_with(&format!(
                    "PyTorch {version} is built without CUDA (CPU only): it cannot use the GPUs; install a CUDA build"
                )),
                "{detail}"
            );
            assert_eq!(out.status.code(), Some(2));
        }
        Some("cuda") => assert!(torch["cuda"].as_str().is_some(), "{torch}"),
        other => panic!("torch imports, yet doctor says {other:?}: {torch}"),
    }
}

#[test]
fn without_libcuda_the_node_is_still_checked_and_pytorch_told_why() {
    let node = FakeNode::new(COMPATIBLE);
    // A libcuda.so.1 the loader refuses, found first: the same on a machine with a driver.
    let lib = node.dir.path().join("lib");
    std::fs::create_dir(&lib).unwrap();
    std::fs::write(lib.join("libcuda.so.1"), b"").unwrap();
    let py = fake_python(
        node.dir.path(),
        r#"{"torch": "2.3.1", "cuda": "12.1", "available": false}"#,
    );
    let out = node
        .gpupilot(&["doctor"])
        .env("GPUPILOT_PYTHON", &py)
        .env("GPUPILOT_HOME", node.dir.path().join("home"))
        .env(
            "LD_LIBRARY_PATH",
            format!(
                "{}:{}",
                lib.display(),
                crate::support::nvml::fake_nvml_dir().display()
            ),
        )
        .output()
        .unwrap();
    let report = text(&out);
    assert_eq!(out.status.code(), Some(2), "{report}");
    let cuda = line(&report, "CUDA (library)");
    assert!(
        cuda.starts_with("  FAIL") && cuda.contains("libcuda.so.1") && cuda.contains("ldconfig"),
        "{cuda}"
    );
    let torch = line(&report, "PyTorch");
    assert!(
        torch.starts_with("  FAIL")
            && torch.contains("compatible")
            && torch.contains("torch.cuda.is_available() is False"),
        "{torch}"
    );
    // The driver and the GPUs were still read and judged.
    assert!(line(&report, "driver").starts_with("  ok"), "{report}");
    assert!(
        line(&report, "CUDA (driver)").contains("CUDA 12.4"),
        "{report}"
    );
    assert!(line(&report, "ECC").starts_with("  ok"), "{report}");
    assert!(
        report.ends_with("verdict: 2 problems, 0 warnings\n"),
        "{report}"
    );
}

#[test]
fn the_simulator_is_checked_for_what_it_has_and_says_what_it_cannot() {
    let tmp = tempfile::tempdir().unwrap();
    let py = fake_python(
        tmp.path(),
        r#"{"torch": "2.3.1", "cuda": "12.1", "available": false}"#,
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpupilot"))
        .args(["doctor", "--source", "sim"])
        .env("GPUPILOT_HOME", tmp.path().join("home"))
        .env("GPUPILOT_PYTHON", &py)
        .env_remove("GPUPILOT_NVML_LIB")
        .output()
        .unwrap();
    let report = text(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(
        report.starts_with("gpupilot doctor: a simulated node (--source sim)\n"),
        "{report}"
    );
    let source = line(&report, "source");
    assert!(
        source.contains("checked here are PyTorch, gpupilot's directories and its daemon")
            && source.contains("not the driver")
            && source.contains("ECC")
            && source.contains("clocks"),
        "{source}"
    );
    let torch = line(&report, "PyTorch");
    assert!(
        torch.starts_with("  info") && torch.contains("PyTorch 2.3.1 built for CUDA 12.1"),
        "{torch}"
    );
    assert!(
        line(&report, "gpupilot's dirs").starts_with("  ok"),
        "{report}"
    );
    for absent in [
        "driver",
        "CUDA (library)",
        "persistence mode",
        "ECC",
        "XID errors",
    ] {
        assert!(
            !report
                .lines()
                .any(|l| l.get(8..).is_some_and(|title| title.starts_with(absent))),
            "a `{absent}` line on a simulated node:\n{report}"
        );
    }
    assert!(
        report.ends_with("verdict: ok, nothing to fix\n"),
        "{report}"
    );
}

#[test]
fn remapped_rows_and_a_degraded_link_are_found_and_explained() {
    // GPU 1 waits for a reset to finish a row remap, and its link trained at Gen4 x8.
    let node = FakeNode::new(&format!(
        "{COMPATIBLE}\nremap_pending = true\nremapped_uncorrectable = 1\npcie_link_gen = 4\npcie_link_width = 8\n"
    ));
    let py = fake_python(node.dir.path(), TORCH_CU121);
    let out = doctor(&node, &py, false);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let memory = line(&report, "memory rows");
    assert!(
        memory.starts_with("  warn")
            && memory.contains("GPU 1")
            && memory.contains("nvidia-smi -r"),
        "{memory}"
    );
    let pcie = line(&report, "PCIe link");
    assert!(
        pcie.starts_with("  warn") && pcie.contains("GPU 1 runs at Gen4 x8, it can do Gen5 x16"),
        "{pcie}"
    );

    // A failed remap is a problem: the GPU needs replacing.
    let node = FakeNode::new(&format!("{COMPATIBLE}\nremap_failure = true\n"));
    let out = doctor(&node, &py, true);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let memory = check_named(&v, "memory");
    assert_eq!(memory["status"], "fail", "{memory}");
    assert_eq!(v["facts"]["gpus"][1]["remapped_rows"]["failure"], true);
}
