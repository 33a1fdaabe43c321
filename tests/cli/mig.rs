//! MIG through the fake NVML library (`crates/fake-nvml/scenarios/mig-a100.toml`: an A100 80GB
//! in MIG mode with three 1g.10gb and one 3g.40gb instance, an H100 not in MIG mode): what
//! `status --json` and the `status` table say, cross-checked with nvitop's `MigDevice`; a V100
//! has no MIG and shows none.

use crate::support::nvml::FakeNode;
use crate::support::peers::peer;
use serde_json::Value;
use std::process::Command;

const MIG_A100: &str = include_str!("../../crates/fake-nvml/scenarios/mig-a100.toml");
const MIB: u64 = 1 << 20;

fn status_json(node: &FakeNode) -> Value {
    crate::nvml_fake::status_json(node, &[]).0
}

#[test]
fn status_shows_mig_instances_under_their_gpu() {
    let node = FakeNode::new(MIG_A100);
    let v = status_json(&node);
    let a100 = &v["gpus"][0];
    let mig = &a100["mig"];
    assert_eq!(mig["enabled"], true);
    assert_eq!(mig["pending"], true);
    // In MIG mode the GPU has no utilization of its own: absent, not zero.
    assert!(a100["util_gpu_pct"].is_null(), "{a100}");
    let inst = mig["instances"].as_array().unwrap();
    let got: Vec<(u64, u64, &str, u64, u64, u64)> = inst
        .iter()
        .map(|m| {
            (
                m["gpu_instance_id"].as_u64().unwrap(),
                m["compute_instance_id"].as_u64().unwrap(),
                m["profile"].as_str().unwrap(),
                m["slices"].as_u64().unwrap(),
                m["memory_total_bytes"].as_u64().unwrap() / MIB,
                m["memory_used_bytes"].as_u64().unwrap() / MIB,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (2, 0, "3g.40gb", 3, 40_192, 30_720),
            (7, 0, "1g.10gb", 1, 9_728, 6_144),
            (8, 0, "1g.10gb", 1, 9_728, 0),
            (9, 0, "1g.10gb", 1, 9_728, 0),
        ]
    );
    assert_eq!(inst[0]["pids"], serde_json::json!([4200101]));
    assert_eq!(inst[1]["pids"], serde_json::json!([4200100]));
    assert!(
        inst.iter()
            .all(|m| m["uuid"].as_str().unwrap().starts_with("MIG-"))
    );
    // The parent's memory is its instances'.
    assert_eq!(
        a100["memory_used_bytes"].as_u64().unwrap(),
        (30_720 + 6_144) * MIB
    );
    // The H100 can do MIG but is not in MIG mode; nothing to list.
    let h100 = &v["gpus"][1];
    assert_eq!(h100["mig"]["enabled"], false);
    assert_eq!(h100["mig"]["instances"], serde_json::json!([]));
    assert!(h100["util_gpu_pct"].as_f64().is_some());

    let out = node.gpupilot(&["status"]).output().unwrap();
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    let uuid = inst[0]["uuid"].as_str().unwrap();
    let line = table
        .lines()
        .find(|l| l.contains("0:2"))
        .unwrap_or_else(|| panic!("no 0:2 line:\n{table}"));
    assert!(
        line.contains("MIG 3g.40gb") && line.contains("30.0 / 39.2 GiB") && line.contains(uuid),
        "{line}"
    );
    for gi in ["0:7", "0:8", "0:9"] {
        assert!(table.contains(gi), "{gi} missing:\n{table}");
    }
}

#[test]
fn no_mig_on_a_v100_and_a_pending_change_says_reset() {
    let node = FakeNode::new(
        r#"
gpus = ["v100-sxm2", "a100-sxm-80gb"]
[[mig]]
gpu = 1
enabled = false
pending = true
"#,
    );
    let v = status_json(&node);
    assert!(v["gpus"][0].get("mig").is_none(), "V100: no MIG at all");
    assert_eq!(v["gpus"][1]["mig"]["enabled"], false);
    assert_eq!(v["gpus"][1]["mig"]["pending"], true);
    let out = node.gpupilot(&["status"]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("MIG mode on after a reset: reset the GPU to apply"),
        "{table}"
    );

    // doctor: a change that waits for a reset is a warning that says how to apply it.
    let out = node
        .gpupilot(&["doctor", "--json"])
        .env("GPUPILOT_PYTHON", node.dir.path().join("no-such-python"))
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let mig = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "mig")
        .unwrap_or_else(|| panic!("no mig check: {v}"));
    assert_eq!(mig["status"], "warn", "{mig}");
    assert!(
        mig["detail"]
            .as_str()
            .unwrap()
            .starts_with("GPU 1's MIG mode turns on at its next reset: reset the GPU to apply"),
        "{mig}"
    );
    assert_ne!(out.status.code(), Some(0), "a warning is not a clean bill");
}

/// nvitop (`Device.mig_devices()`, `MigDevice`) and `status --json` read the same node and
/// must agree on the instances: count, GPU/compute instance ids, profile, memory, UUIDs.
#[test]
fn nvitop_agrees_on_mig_devices() {
    let Some(python) = peer("python3") else {
        return;
    };
    let node = FakeNode::new(MIG_A100);
    let script = r#"
import json
from nvitop import Device
out = []
for d in Device.all():
    out.append({
        "mig_enabled": d.is_mig_mode_enabled(),
        "migs": [
            {
                "gi": m.gpu_instance_id(),
                "ci": m.compute_instance_id(),
                "name": m.name(),
                "uuid": m.uuid(),
                "total": m.memory_total(),
                "used": m.memory_used(),
            }
            for m in d.mig_devices()
        ],
    })
print(json.dumps(out))
"#;
    let mut cmd = Command::new(&python);
    cmd.arg("-c").arg(script);
    node.apply(&mut cmd);
    let out = cmd.output().unwrap();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("No module named 'nvitop'") {
            crate::support::peers::missing("nvitop is not installed");
            return;
        }
        panic!("nvitop failed: {err}");
    }
    let theirs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ours = status_json(&node);
    let gpus = theirs.as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    for (t, o) in gpus.iter().zip(ours["gpus"].as_array().unwrap()) {
        assert_eq!(t["mig_enabled"], o["mig"]["enabled"]);
        let (tm, om) = (
            t["migs"].as_array().unwrap(),
            o["mig"]["instances"].as_array().unwrap(),
        );
        assert_eq!(tm.len(), om.len());
        for (a, b) in tm.iter().zip(om) {
            assert_eq!(a["gi"], b["gpu_instance_id"]);
            assert_eq!(a["ci"], b["compute_instance_id"]);
            assert_eq!(a["uuid"], b["uuid"]);
            assert_eq!(a["total"], b["memory_total_bytes"]);
            assert_eq!(a["used"], b["memory_used_bytes"]);
            let profile = b["profile"].as_str().unwrap();
            assert!(
                a["name"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!("MIG {profile}")),
                "{a} / {b}"
            );
        }
    }
    assert_eq!(gpus[0]["migs"].as_array().unwrap().len(), 4);
}

/// `run --gpu 0:7` (GPU 0's GPU instance 7) starts the child with that instance's MIG UUID in
/// CUDA_VISIBLE_DEVICES; names that are no instance, or a GPU in MIG mode as a whole, are
/// usage errors that say what exists.
#[test]
fn a_run_on_a_mig_instance_sees_its_mig_uuid() {
    use crate::support::nvml_daemon::NvmlDaemon;
    use std::time::{Duration, Instant};

    let d = NvmlDaemon::new(MIG_A100, &[]);
    let v: Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
    let gi7 = v["gpus"][0]["mig"]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["gpu_instance_id"] == 7)
        .unwrap()["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let id = d.ok(&[
        "run",
        "--detach",
        "--gpu",
        "0:7",
        "--",
        "sh",
        "-c",
        "echo CVD=$CUDA_VISIBLE_DEVICES",
    ]);
    let id = id.trim();
    let deadline = Instant::now() + Duration::from_secs(30);
    let logs = loop {
        let out = d.run(&["logs", id]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.contains("CVD=") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        logs.lines().any(|l| l == format!("CVD={gi7}")),
        "expected CVD={gi7} in:\n{logs}"
    );
    let ps: Value = serde_json::from_str(&d.ok(&["ps", "--json"])).unwrap();
    let run = ps
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("{id} not in {ps}"));
    assert_eq!(run["gpus"], gi7.as_str(), "{run}");

    for (spec, says) in [
        (
            "0:5",
            "no such MIG instance; its MIG instances are 0:2, 0:7, 0:8, 0:9",
        ),
        ("0", "GPU 0 is in MIG mode"),
        ("0:7,0:8", "one MIG instance at most"),
    ] {
        let out = d.run(&["run", "--detach", "--gpu", spec, "--", "true"]);
        assert_eq!(out.status.code(), Some(2), "--gpu {spec}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "--gpu {spec}: {err}");
    }
}

/// `/metrics` on the MIG node: the A100's framebuffer once per GPU instance with
/// `GPU_I_PROFILE` and `GPU_I_ID` (none for the A100 as a whole), its utilization absent; the
/// H100 whole. promtool accepts the page (but for dcgm-exporter's own lints).
#[test]
fn metrics_label_instances_as_dcgm_exporter() {
    use crate::support::net::{free_port, http_get};
    use crate::support::nvml_daemon::NvmlDaemon;
    use crate::support::promtool::promtool_accepts;
    use crate::support::wait::wait_for;
    use std::time::Duration;

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let d = NvmlDaemon::new(MIG_A100, &["--metrics-addr", &addr]);
    let mut body = String::new();
    wait_for("GPU series on /metrics", Duration::from_secs(30), || {
        body = http_get(port, "/metrics").1;
        body.contains("DCGM_FI_DEV_FB_USED{")
    });
    let used: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_FB_USED{"))
        .collect();
    let a100: Vec<&str> = used
        .iter()
        .copied()
        .filter(|l| l.contains("gpu=\"0\""))
        .collect();
    assert_eq!(a100.len(), 4, "one per instance, none for the GPU:\n{body}");
    assert!(
        a100.iter()
            .any(|l| l.ends_with(",GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"2\"} 30720")),
        "{a100:?}"
    );
    assert!(
        a100.iter()
            .any(|l| l.ends_with(",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"7\"} 6144")),
        "{a100:?}"
    );
    let h100: Vec<&str> = used
        .iter()
        .copied()
        .filter(|l| l.contains("gpu=\"1\""))
        .collect();
    assert_eq!(h100.len(), 1, "{body}");
    assert!(!h100[0].contains("GPU_I_ID"), "{}", h100[0]);
    assert!(
        !body
            .lines()
            .any(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"")),
        "a GPU in MIG mode has no utilization:\n{body}"
    );
    assert!(
        body.lines()
            .any(|l| l.starts_with("DCGM_FI_DEV_POWER_USAGE{gpu=\"0\"") && !l.contains("GPU_I_ID")),
        "power stays whole-GPU:\n{body}"
    );
    if let Some(promtool) = peer("promtool") {
        promtool_accepts(&promtool, &body);
    }
    drop(d);
}
