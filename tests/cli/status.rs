//! `gpupilot status` as a user runs it: the real binary, the simulator, bad input.

use std::process::Command;

fn gpupilot(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpupilot"))
        .args(args)
        .env_remove("GPUPILOT_SOURCE")
        .env_remove("GPUPILOT_NVML_LIB")
        .output()
        .expect("running gpupilot")
}

#[test]
fn status_sim_prints_four_gpus() {
    let out = gpupilot(&["status", "--source", "sim"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines().next().unwrap().contains("source sim"),
        "{text}"
    );
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("NVIDIA H100 80GB HBM3"))
        .collect();
    assert_eq!(rows.len(), 4, "{text}");
    for row in rows {
        assert!(
            row.contains('%') && row.contains("GiB") && row.contains(" W") && row.contains("MHz"),
            "{row}"
        );
        assert!(
            !row.contains("N/A"),
            "the simulator reports every field: {row}"
        );
    }
}

#[test]
fn status_sim_json_has_every_gpu_field() {
    let out = gpupilot(&[
        "status", "--source", "sim", "--json", "--gpus", "2", "--model", "a100",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    for g in gpus {
        assert!(g["name"].as_str().unwrap().contains("A100"), "{g}");
        let limit = g["power_limit_w"].as_f64().unwrap();
        let power = g["power_w"].as_f64().unwrap();
        assert!(
            power > 0.0 && power <= limit * 1.05,
            "power {power} vs limit {limit}"
        );
        assert!(
            g["memory_used_bytes"].as_u64().unwrap() <= g["memory_total_bytes"].as_u64().unwrap()
        );
        assert_eq!(g["lost"], false);
        assert_eq!(g["stale"], false);
    }
    assert_eq!(v["node"]["source"], "sim");
}

#[test]
fn status_without_nvml_fails_clearly() {
    let out = gpupilot(&[
        "status",
        "--source",
        "nvml",
        "--nvml-lib",
        "/nonexistent/libnvidia-ml.so.1",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NVML library not found"), "{err}");
    assert!(
        err.contains("--source sim"),
        "the message names the way out: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn unknown_sim_model_lists_known_ones() {
    let out = gpupilot(&["status", "--source", "sim", "--model", "tpu-v5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown GPU model `tpu-v5`") && err.contains("h100-sxm"),
        "{err}"
    );
}
