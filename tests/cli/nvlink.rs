//! NVLink and topology through the fake NVML library's HGX H100 board (GPU 3's link 5 down,
//! GPU 7 idle): `status --json` and its table, `doctor`'s verdict, a node without NVLink (absent,
//! never zero), and a cross-check with nvitop's NVLink API and pynvml reading the same node.

use std::process::Command;

use serde_json::Value;

use crate::support::nvml::FakeNode;
use crate::support::peers::peer;

const HGX: &str = include_str!("../../crates/fake-nvml/scenarios/8xh100-nvlink.toml");

fn status(node: &FakeNode, json: bool) -> String {
    let mut args = vec!["status"];
    if json {
        args.push("--json");
    }
    let out = node.gpupilot(&args).output().expect("running gpupilot");
    assert!(
        out.status.success(),
        "status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn status_json(node: &FakeNode) -> Value {
    serde_json::from_str(&status(node, true)).expect("valid JSON")
}

#[test]
fn links_topology_and_traffic_in_status() {
    let node = FakeNode::new(HGX);
    let v = status_json(&node);
    let topo = &v["node"]["topology"];
    let row = |i: usize| -> Vec<String> {
        topo["matrix"][i]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_string())
            .collect()
    };
    // Every pair through NVSwitch; pairs with GPU 3 lose the down link.
    assert_eq!(
        row(0),
        ["X", "NV18", "NV18", "NV17", "NV18", "NV18", "NV18", "NV18"]
    );
    assert_eq!(row(3)[3], "X");
    assert_eq!(row(3)[4], "NV17");
    let g5 = &topo["gpus"][5];
    assert_eq!(g5["cpu_affinity"], "56-111", "{g5}");
    assert_eq!(g5["numa_node"], 1);
    assert_eq!(topo["gpus"][0]["cpu_affinity"], "0-55");
    assert_eq!(g5["nvlinks"], 18);
    assert_eq!(g5["nvlink_version"], "4.0");
    let peers: Vec<usize> = g5["peers"]
        .as_array()
        .unwrap()
        .iter()
        .inspect(|p| assert_eq!(p["peer"]["kind"], "nv_switch", "{p}"))
        .map(|p| p["links"].as_array().unwrap().len())
        .collect();
    assert_eq!(peers, [5, 4, 5, 4], "four NVSwitches");
    assert_eq!(topo["gpus"][3]["down_at_start"], serde_json::json!([5]));

    let gpus = v["gpus"].as_array().unwrap();
    let nv = |i: usize| &gpus[i]["nvlink"];
    assert_eq!(
        (nv(0)["links"].as_u64(), nv(0)["links_up"].as_u64()),
        (Some(18), Some(18))
    );
    assert_eq!(nv(3)["links_up"], 17);
    assert_eq!(nv(3)["per_link"][5]["up"], false);
    assert_eq!(nv(3)["per_link"][5]["tx_bytes_s"], 0.0);
    // BERT-large's gradients all-reduced across seven training GPUs: a few GB/s each way.
    let tx = nv(0)["tx_bytes_s"]
        .as_f64()
        .expect("a rate on a one-shot read");
    assert!((5e8..5e10).contains(&tx), "{tx}");
    assert_eq!(nv(0)["rx_bytes_s"], nv(0)["tx_bytes_s"]);
    let per_link = nv(0)["per_link"][0]["tx_bytes_s"].as_f64().unwrap();
    assert!((per_link * 18.0 / tx - 1.0).abs() < 0.02, "{per_link} {tx}");
    // GPU 3 carries its share over 17 links; GPU 7 idles.
    let l3 = nv(3)["per_link"][0]["tx_bytes_s"].as_f64().unwrap();
    assert!(l3 > per_link * 1.03, "{l3} {per_link}");
    assert_eq!(nv(7)["tx_bytes_s"], 0.0);

    let table = status(&node, false);
    assert!(table.contains("TX / RX  NVLINK"), "{table}");
    let line3 = table
        .lines()
        .find(|l| l.starts_with("  3  17/18"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(line3.ends_with("link 5 down"), "{line3}");
}

#[test]
fn doctor_fails_on_the_down_link_and_says_what_to_do() {
    let node = FakeNode::new(HGX);
    let out = node
        .gpupilot(&["doctor", "--json"])
        .env("GPUPILOT_PYTHON", "/nonexistent/python3")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let checks = v["checks"].as_array().expect("checks");
    let nvlink = checks
        .iter()
        .find(|c| c["name"] == "nvlink")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(nvlink["status"], "fail", "{nvlink}");
    let detail = nvlink["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("GPU 3: NVLink link 5 down (17 of 18 up)"),
        "{detail}"
    );
    assert!(detail.contains("nvidia-smi nvlink -s -i 3"), "{detail}");
    assert_ne!(out.status.code(), Some(0), "a failed check fails doctor");
}

#[test]
fn a_node_without_nvlink_has_none_absent_not_zero() {
    let node = FakeNode::new("count = 2\nmodel = \"h100-sxm\"\n[training]\nmodel = \"resnet50\"\n");
    let v = status_json(&node);
    assert!(v["node"].get("topology").is_none(), "{}", v["node"]);
    for g in v["gpus"].as_array().unwrap() {
        assert!(g.get("nvlink").is_none(), "{g}");
    }
    assert!(!status(&node, false).contains("NVLINK"));
}

/// nvitop's `Device.nvlink_link_count()` and `nvlink_throughput()` (field values, like ours),
/// and pynvml's link state and remote PCI info, against `status --json` on the same node.
#[test]
fn nvitop_and_pynvml_agree_on_links_and_throughput() {
    let Some(python) = peer("python3") else {
        return;
    };
    let node = FakeNode::new(HGX);
    let ours = status_json(&node);
    let script = r#"
import json
import pynvml
from nvitop import Device
out = []
for d in Device.all():
    n = d.nvlink_link_count()
    tp = d.nvlink_throughput(interval=1.0)
    h = pynvml.nvmlDeviceGetHandleByIndex(d.index)
    remote0 = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, 0).busId
    out.append({
        "links": n,
        "tx": [t.tx if isinstance(t.tx, int) else None for t in tp],
        "rx": [t.rx if isinstance(t.rx, int) else None for t in tp],
        "state": [pynvml.nvmlDeviceGetNvLinkState(h, l) for l in range(n)],
        "remote0": remote0.decode() if isinstance(remote0, bytes) else remote0,
    })
print(json.dumps(out))
"#;
    let venv_python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python3");
    let python = if venv_python.exists() {
        venv_python
    } else {
        python
    };
    let mut cmd = Command::new(&python);
    cmd.arg("-c").arg(script);
    node.apply(&mut cmd);
    let out = cmd.output().expect("running python");
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("No module named 'nvitop'") {
            crate::support::peers::missing("nvitop is not installed");
            return;
        }
        panic!("nvitop failed: {err}");
    }
    let theirs: Value = serde_json::from_slice(&out.stdout).expect("JSON from the script");
    let theirs = theirs.as_array().unwrap();
    assert_eq!(theirs.len(), 8);
    for (i, t) in theirs.iter().enumerate() {
        let nv = &ours["gpus"][i]["nvlink"];
        let place = &ours["node"]["topology"]["gpus"][i];
        assert_eq!(t["links"], nv["links"], "GPU {i}");
        let state: Vec<bool> = t["state"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s == 1)
            .collect();
        let up: Vec<bool> = nv["per_link"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["up"] == true)
            .collect();
        assert_eq!(state, up, "GPU {i}");
        assert_eq!(
            place["peers"][0]["peer"]["pci_bus_id"], t["remote0"],
            "GPU {i}"
        );
        // nvitop's KiB/s over its 1 s window against ours (bytes/s): the same steady load.
        let kib_s: Vec<f64> = t["tx"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().expect("nvitop has a rate for every link"))
            .collect();
        for (l, link) in nv["per_link"].as_array().unwrap().iter().enumerate() {
            let ours_b = link["tx_bytes_s"].as_f64().unwrap();
            let theirs_b = kib_s[l] * 1024.0;
            if ours_b == 0.0 {
                assert_eq!(theirs_b, 0.0, "GPU {i} link {l}: idle or down");
            } else {
                assert!(
                    (theirs_b / ours_b - 1.0).abs() < 0.1,
                    "GPU {i} link {l}: nvitop {theirs_b} B/s, gpupilot {ours_b} B/s"
                );
            }
        }
        assert_eq!(t["rx"], t["tx"], "GPU {i}: the all-reduce is symmetric");
    }
}
