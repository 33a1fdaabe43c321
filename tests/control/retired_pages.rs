//! Retired pages through a real daemon on the fake NVML library's V100 scenario
//! (`crates/fake-nvml/scenarios/v100-retired-pages.toml`: GPU 1 retired 3 pages for single-bit
//! and 2 for double-bit errors, one more pending): `status --json` and its table, `/metrics`
//! under DCGM's names, the memory alert through the hook, and `doctor`'s warning and exit code.
//! GPU 0 is a healthy V100 (zeros, not absent), and neither has row-remapping series (V100 has
//! none).

use std::time::Duration;

use crate::support::net::{free_port, http_get};
use crate::support::nvml_daemon::NvmlDaemon;
use crate::support::peers::peer;
use crate::support::promtool::promtool_accepts;
use crate::support::wait::wait_for;
use serde_json::Value;

const V100: &str = include_str!("../../crates/fake-nvml/scenarios/v100-retired-pages.toml");

#[test]
fn retired_pages_reach_status_metrics_alerts_and_doctor() {
    let (mut s, hooks) = NvmlDaemon::with_alert_hook(V100);
    let port = free_port();
    s.restart(&["--metrics-addr", &format!("127.0.0.1:{port}")]);

    let mut st = Value::Null;
    wait_for("a snapshot with both GPUs", Duration::from_secs(30), || {
        st = s.status_json();
        st["gpus"].as_array().is_some_and(|g| g.len() == 2)
    });
    assert_eq!(
        st["gpus"][0]["retired_pages"],
        serde_json::json!({"single_bit": 0, "double_bit": 0, "pending": false}),
        "a healthy V100 reports zeros: {}",
        st["gpus"][0]
    );
    assert_eq!(
        st["gpus"][1]["retired_pages"],
        serde_json::json!({"single_bit": 3, "double_bit": 2, "pending": true}),
        "{}",
        st["gpus"][1]
    );
    assert!(
        st["gpus"][1]["remapped_rows"].is_null(),
        "V100 remaps no rows"
    );

    // The table: a line for GPU 1 under "Memory health", none for the healthy GPU 0.
    let table = String::from_utf8(s.run(&["status"]).stdout).unwrap();
    assert!(
        table
            .contains("\nMemory health\n  1  3 sbe + 2 dbe pages retired: waiting for a GPU reset")
            && !table.contains("  0  0 sbe"),
        "{table}"
    );

    // /metrics: DCGM's names and types, the GPU's labels.
    let mut body = String::new();
    wait_for("retired pages on /metrics", Duration::from_secs(10), || {
        body = http_get(port, "/metrics").1;
        body.contains("DCGM_FI_DEV_RETIRED_PENDING{")
    });
    let value = |metric: &str, gpu: u32| -> Option<String> {
        let prefix = format!("{metric}{{gpu=\"{gpu}\",");
        body.lines()
            .find(|l| l.starts_with(&prefix))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    for (metric, healthy, sick) in [
        ("DCGM_FI_DEV_RETIRED_SBE", "0", "3"),
        ("DCGM_FI_DEV_RETIRED_DBE", "0", "2"),
        ("DCGM_FI_DEV_RETIRED_PENDING", "0", "1"),
    ] {
        assert_eq!(
            value(metric, 0).as_deref(),
            Some(healthy),
            "{metric}\n{body}"
        );
        assert_eq!(value(metric, 1).as_deref(), Some(sick), "{metric}\n{body}");
        assert!(
            body.contains(&format!("# TYPE {metric} counter\n")),
            "{metric}"
        );
    }
    assert!(!body.contains("DCGM_FI_DEV_ROW_REMAP_PENDING"), "{body}");
    if let Some(promtool) = peer("promtool") {
        promtool_accepts(&promtool, &body);
    }

    // The memory alert: a retirement waits for a reset on GPU 1.
    wait_for("the alert hook to run", Duration::from_secs(20), || {
        std::fs::read_to_string(&hooks).is_ok_and(|t| t.contains("\"key\":\"memory:gpu1\""))
    });
    let hook = std::fs::read_to_string(&hooks).unwrap();
    let raised: Value =
        serde_json::from_str(hook.lines().find(|l| l.contains("memory:gpu1")).unwrap()).unwrap();
    assert_eq!(raised["change"], "raised");
    assert!(
        raised["message"]
            .as_str()
            .is_some_and(|m| m.contains("page retirement waits for a reset")),
        "{raised}"
    );
    assert!(!hook.contains("memory:gpu0"), "{hook}");

    // doctor: a pending retirement is a warning (exit 1) that says to reset when idle.
    let (code, report) = s.doctor_json();
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "memory")
        .unwrap();
    assert_eq!(check["status"], "warn", "{check}");
    let detail = check["detail"].as_str().unwrap();
    assert!(
        detail.contains("page retirement waits for a GPU reset on GPU 1")
            && detail.contains("reset it when idle"),
        "{detail}"
    );
    assert!(code >= Some(1), "{report}");
}
