//! Power caps, clock locks and the driver's target temperature through a real daemon on the
//! fake NVML library: the exact milliwatts NVML receives, refusals that make no NVML call, the
//! NO_PERMISSION message, `reset` restoring the recorded limit, gpustat reading the new limit
//! from the same fake node, and a read-only daemon refusing.

use std::process::Command;

use crate::support::nvml_daemon::NvmlDaemon;
use crate::support::peers::peer;
use serde_json::Value;

const FOUR_H100: &str = r#"
model = "h100-sxm"
count = 4
[training]
model = "resnet50"
"#;

const NO_PERMISSION: &str = r#"
model = "h100-sxm"
count = 2
[[faults]]
kind = "no_permission"
"#;

impl NvmlDaemon {
    fn power_json(&self) -> Value {
        serde_json::from_str(&self.ok(&["power", "--json"])).unwrap()
    }
}

#[test]
fn cap_sends_milliwatts_to_one_gpu_and_reset_restores_the_recorded_limit() {
    let s = NvmlDaemon::new(FOUR_H100, &[]);
    let out = s.ok(&["power", "cap", "250", "--gpu", "1", "--why", "cooler room"]);
    assert_eq!(out, "GPU 1: power limit 700 W → 250 W\n");

    // Exactly one setter call: GPU 1, 250 000 mW, answered NVML_SUCCESS.
    let calls = s.setter_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["function"], "nvmlDeviceSetPowerManagementLimit");
    assert_eq!(calls[0]["gpu"], 1);
    assert_eq!(calls[0]["value"], 250_000);
    assert_eq!(calls[0]["result"], 0);

    // The original was recorded, and the daemon reads the new limit back.
    assert_eq!(s.originals().unwrap()["gpus"]["1"]["power_limit_w"], 700.0);
    let p = s.power_json();
    let limits: Vec<f64> = p["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["power"]["current_w"].as_f64().unwrap())
        .collect();
    assert_eq!(limits, [700.0, 250.0, 700.0, 700.0]);
    assert_eq!(p["gpus"][1]["original"]["power_limit_w"], 700.0);

    // A second cap keeps the first original.
    s.ok(&["power", "cap", "300", "--gpu", "1"]);
    assert_eq!(s.originals().unwrap()["gpus"]["1"]["power_limit_w"], 700.0);

    // The change is in the node's events: who, old → new, why.
    let events = s.home.node_events();
    let changed: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "gpu_changed")
        .collect();
    assert_eq!(changed.len(), 2);
    assert_eq!(changed[0]["gpu"], 1);
    assert_eq!(changed[0]["what"], "power_limit");
    assert_eq!(changed[0]["old"], "700 W");
    assert_eq!(changed[0]["new"], "250 W");
    assert_eq!(changed[0]["why"], "cooler room");
    assert!(changed[0]["by"].as_str().unwrap().contains("uid"));

    // reset: back to 700 W on GPU 1 only, and the record is gone.
    let out = s.ok(&["power", "reset"]);
    assert_eq!(out, "GPU 1: power limit 300 W → 700 W\n");
    let calls = s.setter_calls();
    let last = calls.last().unwrap();
    assert_eq!(
        (last["gpu"].as_u64(), last["value"].as_u64()),
        (Some(1), Some(700_000))
    );
    assert_eq!(calls.len(), 3);
    assert!(s.originals().is_none(), "the record is cleared by reset");
    assert_eq!(s.power_json()["gpus"][1]["power"]["current_w"], 700.0);
    // Nothing left to restore.
    let out = s.ok(&["power", "reset", "--gpu", "1"]);
    assert!(out.contains("GPU 1: no power limit recorded"), "{out}");
    assert_eq!(s.setter_calls().len(), 3);
}

#[test]
fn out_of_range_is_refused_with_the_range_and_no_nvml_call() {
    let s = NvmlDaemon::new(FOUR_H100, &[]);
    let err = s.fails(&["power", "cap", "150", "--gpu", "1"]);
    assert!(
        err.contains("150 W is outside GPU 1's range 200–700 W"),
        "{err}"
    );
    let err = s.fails(&["power", "cap", "701"]);
    assert!(
        err.contains("701 W is outside GPU 0's range 200–700 W"),
        "{err}"
    );
    let err = s.fails(&["power", "cap", "250", "--gpu", "7"]);
    assert!(err.contains("no GPU 7: this node has GPUs 0–3"), "{err}");
    let err = s.fails(&["clocks", "lock", "100", "1500", "--gpu", "0"]);
    assert!(
        err.contains("100 MHz is outside GPU 0's SM clock range 345–1980 MHz"),
        "{err}"
    );
    let err = s.fails(&["power", "gpu-max", "95", "--gpu", "0"]);
    assert!(err.contains("outside GPU 0's target range 40–"), "{err}");
    assert!(s.setter_calls().is_empty(), "{:?}", s.setter_calls());
    assert!(s.originals().is_none(), "nothing was recorded");
    assert!(
        !s.home
            .node_events()
            .iter()
            .any(|e| e["event"] == "gpu_changed")
    );
}

#[test]
fn no_permission_names_the_root_daemon_and_changes_nothing() {
    let s = NvmlDaemon::new(NO_PERMISSION, &[]);
    let err = s.fails(&["power", "cap", "250", "--gpu", "1"]);
    assert!(err.contains("needs root"), "{err}");
    assert!(err.contains("sudo gpupilot daemon --system"), "{err}");
    // NVML was asked (and refused): logged with NVML_ERROR_NO_PERMISSION (4).
    let calls = s.setter_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["value"], 250_000);
    assert_eq!(calls[0]["result"], 4);
    // Nothing recorded, nothing changed, and the daemon still answers everything else.
    assert!(s.originals().is_none());
    assert_eq!(s.power_json()["gpus"][1]["power"]["current_w"], 700.0);
    let err = s.fails(&["clocks", "lock", "1000", "1500"]);
    assert!(err.contains("sudo gpupilot daemon --system"), "{err}");
    assert!(s.originals().is_none(), "a refused lock leaves no record");
    s.ok(&["ps"]);
}

#[test]
fn clocks_and_target_temperature_are_recorded_and_restored() {
    let s = NvmlDaemon::new(FOUR_H100, &[]);
    let out = s.ok(&["clocks", "lock", "1000", "1500", "--gpu", "2"]);
    assert_eq!(out, "GPU 2: SM clocks unlocked → 1000–1500 MHz\n");
    let out = s.ok(&["power", "gpu-max", "80", "--gpu", "0,3"]);
    assert_eq!(
        out,
        "GPU 0: target temperature 87 °C → 80 °C\nGPU 3: target temperature 87 °C → 80 °C\n"
    );
    let p = s.power_json();
    assert_eq!(
        p["gpus"][2]["locked_clocks_mhz"],
        serde_json::json!([1000, 1500])
    );
    assert_eq!(p["gpus"][0]["gpu_max"]["current_c"], 80.0);
    assert_eq!(p["gpus"][0]["original"]["gpu_max_c"], 87.0);
    s.ok(&["clocks", "reset"]);
    s.ok(&["power", "gpu-max", "reset"]);
    let calls: Vec<(String, Value, Value)> = s
        .setter_calls()
        .iter()
        .map(|c| {
            (
                c["function"].as_str().unwrap().to_string(),
                c["gpu"].clone(),
                c["value"].clone(),
            )
        })
        .collect();
    use serde_json::json;
    assert_eq!(
        calls,
        [
            (
                "nvmlDeviceSetGpuLockedClocks".into(),
                json!(2),
                json!([1000, 1500])
            ),
            (
                "nvmlDeviceSetTemperatureThreshold".into(),
                json!(0),
                json!([3, 80])
            ),
            (
                "nvmlDeviceSetTemperatureThreshold".into(),
                json!(3),
                json!([3, 80])
            ),
            (
                "nvmlDeviceResetGpuLockedClocks".into(),
                json!(2),
                json!(null)
            ),
            (
                "nvmlDeviceSetTemperatureThreshold".into(),
                json!(0),
                json!([3, 87])
            ),
            (
                "nvmlDeviceSetTemperatureThreshold".into(),
                json!(3),
                json!([3, 87])
            ),
        ]
    );
    assert!(s.originals().is_none());
}

#[test]
fn restore_on_exit_puts_the_limits_back_when_the_daemon_stops() {
    let mut s = NvmlDaemon::new(FOUR_H100, &["--restore-on-exit"]);
    s.ok(&["power", "cap", "400", "--gpu", "0,2"]);
    let mut d = s.daemon.take().unwrap();
    let (status, _) = d.signal_and_wait(rustix::process::Signal::TERM);
    assert!(status.success());
    let calls = s.setter_calls();
    let tail: Vec<(u64, u64)> = calls[2..]
        .iter()
        .map(|c| (c["gpu"].as_u64().unwrap(), c["value"].as_u64().unwrap()))
        .collect();
    assert_eq!(tail, [(0, 700_000), (2, 700_000)]);
    assert!(s.originals().is_none());
    let events = s.home.node_events();
    let last_change = events
        .iter()
        .rfind(|e| e["event"] == "gpu_changed")
        .unwrap();
    assert_eq!(last_change["by"], "daemon");
}

#[test]
fn a_readonly_daemon_refuses_every_change() {
    let s = NvmlDaemon::new(FOUR_H100, &["--readonly"]);
    for args in [
        &["power", "cap", "250", "--gpu", "1"][..],
        &["power", "reset"],
        &["clocks", "lock", "1000", "1500"],
        &["clocks", "reset"],
        &["power", "gpu-max", "80"],
    ] {
        let err = s.fails(args);
        assert!(err.contains("read-only"), "{args:?}: {err}");
    }
    assert!(s.setter_calls().is_empty());
    // Watching still works.
    assert_eq!(s.power_json()["gpus"].as_array().unwrap().len(), 4);
}

#[test]
fn gpustat_reads_the_new_limit_from_the_same_node() {
    let Some(gpustat) = peer("gpustat") else {
        return;
    };
    let s = NvmlDaemon::new(FOUR_H100, &[]);
    s.ok(&["power", "cap", "250", "--gpu", "1"]);
    let mut cmd = Command::new(&gpustat);
    cmd.arg("--json");
    s.node.apply(&mut cmd);
    let out = cmd.output().expect("running gpustat");
    assert!(
        out.status.success(),
        "gpustat failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let limits: Vec<f64> = theirs["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["enforced.power.limit"].as_f64().unwrap())
        .collect();
    assert_eq!(limits, [700.0, 250.0, 700.0, 700.0]);
}
