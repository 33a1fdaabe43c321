//! Control on bad readings, through a real daemon on the fake NVML library: a GPU whose limit
//! reads 0 W is left alone, a limit changed outside gpupilot is recorded and undone by `power
//! reset`, a run's energy survives a kill -9 of the daemon, a CPU-only run is charged no GPU
//! energy, and a lost GPU keeps its identity in `status` and `/metrics`.

mod common;
mod daemon_common;
mod nvml_daemon;

use std::time::Duration;

use daemon_common::wait_for;
use nvml_daemon::NvmlDaemon;
use serde_json::Value;

/// Two H100 at rest (29 °C or so in a 25 °C room), GPU 0's limit reading 0 mW.
const ZERO_LIMIT: &str = r#"
model = "h100-sxm"
count = 2
[[faults]]
kind = "power_limit_zero"
gpu = 0
"#;

fn governor_events(s: &NvmlDaemon, change: &str) -> Vec<Value> {
    s.home
        .node_events()
        .into_iter()
        .filter(|e| e["event"] == "governor" && e["change"] == change)
        .collect()
}

#[test]
fn a_limit_read_as_zero_is_left_alone_and_the_reason_is_said() {
    let s = NvmlDaemon::new(ZERO_LIMIT, &[]);
    s.ok(&["thermal", "target", "85"]);
    wait_for(
        "the governor to refuse GPU 0",
        Duration::from_secs(20),
        || !governor_events(&s, "refused").is_empty(),
    );
    // Several more decisions: none moves GPU 0's cap.
    std::thread::sleep(Duration::from_secs(2));
    let calls = s.setter_calls();
    assert!(
        calls.iter().all(|c| c["gpu"] != 0),
        "a setter was called on GPU 0: {calls:?}"
    );
    let refused = governor_events(&s, "refused");
    assert_eq!(refused.len(), 1, "said once: {refused:?}");
    assert_eq!(refused[0]["gpu"], 0);
    let why = refused[0]["why"].as_str().unwrap();
    assert!(why.contains("power limit reads 0 W"), "{why}");
    assert!(governor_events(&s, "cap").iter().all(|e| e["gpu"] != 0));
    let thermal = s.ok(&["thermal"]);
    assert!(
        thermal.contains(
            "GPU 0: governor 85 °C: cap ? (not acting: the GPU's power limits are implausible)"
        ) || thermal.contains("not acting: the GPU's power limits are implausible"),
        "{thermal}"
    );
    assert!(thermal.contains("power limit reads 0 W"), "{thermal}");

    // Off: nothing was changed, so nothing is put back and nothing recorded.
    s.ok(&["thermal", "off"]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(s.setter_calls().iter().all(|c| c["gpu"] != 0));
    assert!(governor_events(&s, "restored").is_empty());
    let reset = s.ok(&["power", "reset"]);
    assert!(reset.contains("nothing recorded"), "{reset}");
}
