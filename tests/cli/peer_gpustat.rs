//! Cross-check with a peer nobody here wrote: gpustat reads the same fake NVML node as
//! `gpupilot status --json`, and the two must agree.

use crate::support::nvml::FakeNode;
use crate::support::peers::peer;
use serde_json::Value;
use std::process::Command;

const FOUR_MIXED: &str = r#"
gpus = ["h100-sxm", "a100-sxm-80gb", "rtx-4090", "v100-sxm2"]
[training]
model = "resnet50"
batch_size = 128
prefetch_depth = 2
workers = 8
"#;

#[test]
fn gpustat_agrees_with_status_json() {
    let Some(gpustat) = peer("gpustat") else {
        return;
    };
    let node = FakeNode::new(FOUR_MIXED);
    let status = || -> Value {
        let out = node.gpupilot(&["status", "--json"]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };

    // gpupilot reads before and after gpustat: the node warms up between the reads, so
    // gpustat's temperature must lie between ours.
    let before = status();
    let mut cmd = Command::new(&gpustat);
    cmd.arg("--json");
    node.apply(&mut cmd);
    let out = cmd.output().expect("running gpustat");
    assert!(
        out.status.success(),
        "gpustat failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Value = serde_json::from_slice(&out.stdout).expect("gpustat JSON");

    let ours = status();

    let theirs = theirs["gpus"].as_array().expect("gpustat lists gpus");
    let before = before["gpus"].as_array().unwrap();
    let ours = ours["gpus"].as_array().unwrap();
    assert_eq!(theirs.len(), 4);
    assert_eq!(ours.len(), 4);
    for ((t, o), b) in theirs.iter().zip(ours).zip(before) {
        assert_eq!(t["index"].as_u64(), o["index"].as_u64());
        assert_eq!(
            t["name"].as_str(),
            o["name"].as_str(),
            "name of GPU {}",
            o["index"]
        );
        assert_eq!(t["uuid"].as_str(), o["uuid"].as_str());
        // gpustat reports MiB.
        let total_mib = o["memory_total_bytes"].as_u64().unwrap() / (1 << 20);
        assert_eq!(
            t["memory.total"].as_u64(),
            Some(total_mib),
            "memory of GPU {}",
            o["index"]
        );
        // NVML reports whole degrees; the node warms between the reads.
        let tt = t["temperature.gpu"].as_f64().unwrap();
        let (t0, t1) = (
            b["temperature_c"].as_f64().unwrap(),
            o["temperature_c"].as_f64().unwrap(),
        );
        assert!(
            t0.min(t1) <= tt && tt <= t0.max(t1),
            "temperature of GPU {}: gpustat {tt}, gpupilot {t0} then {t1}",
            o["index"]
        );
        // gpustat's enforced.power.limit is the enforced limit in watts.
        let limit = t["enforced.power.limit"].as_f64().unwrap();
        assert_eq!(
            Some(limit),
            o["power_enforced_w"].as_f64(),
            "power limit of GPU {}",
            o["index"]
        );
        assert_eq!(Some(limit), o["power_limit_w"].as_f64());
    }
    // Distinct parts, distinct limits: the check is not trivially true.
    let limits: Vec<f64> = ours
        .iter()
        .map(|g| g["power_limit_w"].as_f64().unwrap())
        .collect();
    assert_eq!(limits, vec![700.0, 400.0, 450.0, 300.0]);
}
