//! The NVML source read through the fake NVML library: every metric, and every injected fault.
//!
//! Each test runs the real `gpupilot status --json` in its own process with its own scenario and
//! shared-state file, because a process loads one NVML library with one node.

use crate::support::nvml::FakeNode;
use serde_json::Value;
use std::time::{Duration, Instant};

pub(crate) fn status_json(node: &FakeNode, extra: &[&str]) -> (Value, Duration) {
    let mut args = vec!["status", "--json"];
    args.extend_from_slice(extra);
    let t0 = Instant::now();
    let out = node.gpupilot(&args).output().expect("running gpupilot");
    let took = t0.elapsed();
    assert!(
        out.status.success(),
        "status failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    (
        serde_json::from_slice(&out.stdout).expect("valid JSON"),
        took,
    )
}

const TWO_H100: &str = r#"
count = 2
model = "h100-sxm"
[training]
model = "resnet50"
batch_size = 256
prefetch_depth = 2
workers = 8
"#;

#[test]
fn every_metric_reads_through_nvml() {
    let node = FakeNode::new(TWO_H100);
    let (v, _) = status_json(&node, &[]);
    assert_eq!(v["node"]["source"], "nvml");
    assert_eq!(v["node"]["driver_version"], "550.54.15");
    assert_eq!(v["node"]["cuda_driver_version"], "12.4");
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    for g in gpus {
        assert_eq!(g["name"], "NVIDIA H100 80GB HBM3");
        assert!(g["uuid"].as_str().unwrap().starts_with("GPU-"));
        assert!(g["pci_bus_id"].as_str().is_some());
        assert_eq!(g["lost"], false);
        assert_eq!(g["stale"], false);
        let util = g["util_gpu_pct"].as_f64().unwrap();
        assert!(
            (1.0..=100.0).contains(&util),
            "a training GPU is busy: {util}"
        );
        let total = g["memory_total_bytes"].as_u64().unwrap();
        // nvidia-smi shows 81559 MiB on an H100 80GB: a little under 80 GiB.
        assert!(total > 79 * (1 << 30) && total <= 80 * (1 << 30), "{total}");
        assert!(g["memory_used_bytes"].as_u64().unwrap() > 1 << 30);
        let t = g["temperature_c"].as_f64().unwrap();
        assert!((15.0..90.0).contains(&t), "{t}");
        assert!(g["temp_slowdown_c"].as_f64().unwrap() > t);
        assert!(g["temp_shutdown_c"].as_f64().unwrap() > g["temp_slowdown_c"].as_f64().unwrap());
        // Milliwatts in NVML, watts here.
        assert_eq!(g["power_limit_w"].as_f64().unwrap(), 700.0);
        assert_eq!(g["power_default_w"].as_f64().unwrap(), 700.0);
        assert_eq!(g["power_min_w"].as_f64().unwrap(), 200.0);
        let p = g["power_w"].as_f64().unwrap();
        assert!(p > 100.0 && p <= 720.0, "{p}");
        assert!(g["energy_j"].as_f64().is_some());
        let sm = g["sm_clock_mhz"].as_u64().unwrap();
        assert!(sm > 0 && sm <= g["sm_clock_max_mhz"].as_u64().unwrap());
        assert!(g["mem_clock_mhz"].as_u64().unwrap() > 0);
        assert!(g["throttle_reasons"].as_u64().is_some());
        assert!(g["pstate"].as_u64().is_some());
        assert!(
            g["fan_pct"].is_null(),
            "SXM parts have no fan: absent, not zero"
        );
        let procs = g["processes"].as_array().expect("process list");
        assert_eq!(procs.len(), 1);
        assert!(procs[0]["used_memory_bytes"].as_u64().unwrap() > 0);
    }
}

#[test]
fn lost_gpu_is_marked_and_others_still_sampled() {
    let node = FakeNode::new(&format!(
        "{TWO_H100}\n[[faults]]\nkind = \"gpu_lost\"\ngpu = 1\nat_s = 0.0\n"
    ));
    let (v, _) = status_json(&node, &[]);
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus[1]["lost"], true);
    assert!(gpus[1]["power_w"].is_null() && gpus[1]["temperature_c"].is_null());
    assert_eq!(gpus[0]["lost"], false);
    assert!(gpus[0]["power_w"].as_f64().unwrap() > 0.0);

    let table = node.gpupilot(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    let row1 = text
        .lines()
        .find(|l| l.trim_start().starts_with("1 "))
        .unwrap();
    assert!(row1.contains("LOST"), "{text}");
}

#[test]
fn not_supported_is_absent_not_zero() {
    let node = FakeNode::new(&format!(
        "{TWO_H100}\n[[faults]]\nkind = \"not_supported\"\nfunctions = [\"nvmlDeviceGetPowerUsage\", \"nvmlDeviceGetTotalEnergyConsumption\"]\ngpu = 0\n"
    ));
    let (v, _) = status_json(&node, &[]);
    let gpus = v["gpus"].as_array().unwrap();
    assert!(gpus[0]["power_w"].is_null());
    assert!(gpus[0]["energy_j"].is_null());
    assert!(
        gpus[0]["temperature_c"].as_f64().is_some(),
        "other fields still read"
    );
    assert!(
        gpus[1]["power_w"].as_f64().unwrap() > 0.0,
        "the fault names GPU 0 only"
    );

    let table = node.gpupilot(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    let row0 = text
        .lines()
        .find(|l| l.trim_start().starts_with("0 "))
        .unwrap();
    assert!(row0.contains("N/A / 700 W"), "{row0}");
}

#[test]
fn fan_speed_reads_through_the_older_call_where_v2_is_not_supported() {
    const TWO_4090: &str = "count = 2\nmodel = \"rtx-4090\"\n";
    let fans = |faults: &str| {
        let node = FakeNode::new(&format!("{TWO_4090}{faults}"));
        let (v, _) = status_json(&node, &[]);
        let gpus = v["gpus"].as_array().unwrap().clone();
        gpus.iter()
            .map(|g| g["fan_pct"].as_f64())
            .collect::<Vec<_>>()
    };
    let fault = |functions: &str| {
        format!("[[faults]]\nkind = \"not_supported\"\nfunctions = [{functions}]\ngpu = 0\n")
    };
    // In the fake both calls read the same fan; each case is a fresh node.
    let baseline = fans("");
    assert!(
        baseline
            .iter()
            .all(|f| f.is_some_and(|p| p > 0.0 && p <= 100.0)),
        "{baseline:?}"
    );
    // A library that answers nvmlDeviceGetFanSpeed but not its _v2: the fan is still shown.
    let old_library = fans(&fault("\"nvmlDeviceGetFanSpeed_v2\""));
    let fan0 = old_library[0].expect("GPU 0's fan through nvmlDeviceGetFanSpeed");
    assert!(fan0 > 0.0 && fan0 <= 100.0, "{old_library:?}");
    assert!(old_library[1].is_some(), "{old_library:?}");
    // Neither call answers: absent, never zero.
    let neither = fans(&fault("\"nvmlDeviceGetFanSpeed\""));
    assert_eq!(neither[0], None, "{neither:?}");
    assert!(
        neither[1].is_some(),
        "the fault names GPU 0 only: {neither:?}"
    );
}

#[test]
fn slow_call_leaves_that_gpu_stale_and_stalls_nothing() {
    let node = FakeNode::new(&format!(
        "{TWO_H100}\n[[faults]]\nkind = \"slow\"\nfunctions = [\"nvmlDeviceGetPowerUsage\"]\ngpu = 1\ndelay_ms = 8000\n"
    ));
    let (v, took) = status_json(&node, &["--timeout", "1"]);
    assert!(
        took < Duration::from_secs(5),
        "a hung call must not stall status: {took:?}"
    );
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus[1]["stale"], true, "{}", gpus[1]);
    assert_eq!(gpus[0]["stale"], false);
    assert!(gpus[0]["power_w"].as_f64().unwrap() > 0.0);
}

#[test]
fn zero_power_limit_is_unknown_not_zero() {
    let node = FakeNode::new(&format!(
        "{TWO_H100}\n[[faults]]\nkind = \"power_limit_zero\"\ngpu = 1\n"
    ));
    let (v, _) = status_json(&node, &[]);
    let gpus = v["gpus"].as_array().unwrap();
    assert!(gpus[1]["power_limit_w"].is_null(), "{}", gpus[1]);
    assert_eq!(gpus[0]["power_limit_w"].as_f64().unwrap(), 700.0);
}

#[test]
fn bad_scenario_fails_with_a_clear_message() {
    let node = FakeNode::new("count = 2\nmodle = \"h100\"\n");
    let out = node.gpupilot(&["status"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("scenario.toml:2:1"),
        "the library names file:line:col: {err}"
    );
}

#[test]
fn memory_and_link_health_read_through_nvml() {
    // GPU 1 has rows remapped (one waiting for a reset), a link trained at Gen4 x8 and a
    // climbing replay counter; GPU 2 is a V100 (no row remapping); GPU 3 a GeForce board.
    let node = FakeNode::new(
        r#"
gpus = ["h100-sxm", "h100-sxm", "v100-sxm2", "rtx-4090"]
[training]
model = "resnet50"
[[per_gpu]]
gpu = 1
remapped_correctable = 3
remapped_uncorrectable = 1
remap_pending = true
pcie_link_gen = 4
pcie_link_width = 8
pcie_replays_per_min = 600.0
ecc_corrected = 5
"#,
    );
    let (v, _) = status_json(&node, &[]);
    let gpus = v["gpus"].as_array().unwrap();
    let healthy = &gpus[0];
    assert_eq!(healthy["remapped_rows"]["correctable"], 0, "{healthy}");
    assert_eq!(healthy["remapped_rows"]["pending"], false);
    assert_eq!(healthy["pcie_gen_max"], 5);
    assert_eq!(healthy["pcie_width_max"], 16);
    assert_eq!(healthy["pcie_replays"], 0);
    assert_eq!(healthy["ecc_uncorrected_total"], 0);
    assert!(healthy["memory_temp_c"].as_f64().is_some_and(|t| t > 20.0));
    assert!(healthy["enc_util_pct"].as_f64().is_some());
    let sick = &gpus[1];
    assert_eq!(
        sick["remapped_rows"],
        serde_json::json!({"correctable": 3, "uncorrectable": 1, "pending": true, "failure": false})
    );
    assert_eq!(
        (sick["pcie_gen"].as_u64(), sick["pcie_width"].as_u64()),
        (Some(4), Some(8))
    );
    assert!(sick["pcie_replays"].as_u64().is_some(), "{sick}");
    assert_eq!(sick["ecc_corrected_total"], 5);
    // Not supported there: absent, never zero.
    assert!(gpus[2]["remapped_rows"].is_null(), "{}", gpus[2]);
    assert!(
        gpus[2]["memory_temp_c"].as_f64().is_some(),
        "HBM2 reports it"
    );
    assert!(gpus[3]["remapped_rows"].is_null());
    assert!(gpus[3]["memory_temp_c"].is_null());
    assert!(gpus[3]["ecc_corrected_total"].is_null());
}
