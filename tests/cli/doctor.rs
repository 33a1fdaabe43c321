//! `gpupilot doctor` through the fake NVML library: a compatible and an incompatible driver,
//! PyTorch answered by a fake interpreter (GPUPILOT_PYTHON), permission refused.

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
    let status = |name: &str| {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()["status"]
            .clone()
    };
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

#[test]
fn the_simulator_has_no_driver_to_check() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpupilot"))
        .args(["doctor", "--source", "sim"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("through NVML"),
        "{}",
        text(&out)
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
    let memory = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "memory")
        .unwrap();
    assert_eq!(memory["status"], "fail", "{memory}");
    assert_eq!(v["facts"]["gpus"][1]["remapped_rows"]["failure"], true);
}
