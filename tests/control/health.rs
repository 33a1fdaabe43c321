//! GPU health through a real daemon on the fake NVML library: an XID from a scenario fault,
//! and who holds each GPU, in `status --json` and its table, `/metrics` (checked by promtool
//! where it is installed), the node's event log,
//! an alert through the hook, and `doctor`'s verdict and exit code.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::net::{free_port, http_get};
use crate::support::nvml_daemon::NvmlDaemon;
use crate::support::peers::peer;
use crate::support::promtool::promtool_accepts;
use crate::support::wait::wait_for;
use serde_json::Value;

/// GPU 0 reports XID 48 every second; GPU 1 has no events; process `pid` holds 1 GiB of GPU 0.
fn scenario(pid: u32) -> String {
    format!(
        r#"
model = "h100-sxm"
count = 2
[[processes]]
gpu = 0
pid = {pid}
name = "python3"
used_memory_mib = 1024
[[faults]]
kind = "xid"
gpu = 0
xid = 48
every_s = 1
[[faults]]
kind = "not_supported"
gpu = 1
functions = ["nvmlDeviceRegisterEvents"]
"#
    )
}

#[test]
fn an_xid_and_the_owner_of_a_process_reach_status_metrics_events_alerts_and_doctor() {
    // A real process for the scenario to put on GPU 0, so its owner can be read from /proc.
    let mut holder = Command::new("sleep")
        .arg("120")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = holder.id();
    let (mut s, hooks) = NvmlDaemon::with_alert_hook(&scenario(pid));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    s.restart(&["--metrics-addr", &addr]);

    let mut st = Value::Null;
    wait_for("the daemon to hear an XID", Duration::from_secs(30), || {
        st = s.status_json();
        st["gpus"][0]["xids"]
            .as_array()
            .is_some_and(|x| !x.is_empty())
    });
    let g0 = &st["gpus"][0];
    let last = g0["xids"].as_array().unwrap().last().unwrap();
    assert_eq!(last["xid"], 48, "{g0}");
    assert_eq!(last["name"], "Double Bit ECC Error");
    assert!(g0["xid_since_s"].as_f64().is_some() && g0["xid_count"].as_u64() >= Some(1));
    assert!(
        st["gpus"][1]["xids"].is_null(),
        "GPU 1 has no events: {}",
        st["gpus"][1]
    );
    // The process's owner, read from /proc.
    let me = rustix::process::getuid().as_raw();
    let owner = &g0["processes"][0]["owner"];
    assert_eq!(g0["processes"][0]["pid"], pid);
    assert_eq!(owner["uid"], me, "{owner}");
    if let Some(name) = gpupilot::ipc::user_name(me) {
        assert_eq!(owner["user"], name.as_str());
    }

    // The table: the XID in words, what to do, and the process's user.
    let table = String::from_utf8(s.run(&["status"]).stdout).unwrap();
    assert!(
        table.contains("XID 48 (Double Bit ECC Error): drain the GPU and reset it"),
        "{table}"
    );
    assert!(
        table.contains("USER") && table.contains(&pid.to_string()),
        "{table}"
    );

    // /metrics as dcgm-exporter: the last XID with its code and message; none for GPU 1.
    let body = http_get(port, "/metrics").1;
    let xid: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_XID_ERRORS{"))
        .collect();
    assert_eq!(xid.len(), 1, "{body}");
    assert!(
        xid[0].starts_with("DCGM_FI_DEV_XID_ERRORS{gpu=\"0\",")
            && xid[0].ends_with(",err_code=\"48\",err_msg=\"Double Bit ECC Error\"} 48"),
        "{}",
        xid[0]
    );
    // promtool: nothing but the lints dcgm-exporter's own page draws (none of them new here).
    if let Some(promtool) = peer("promtool") {
        promtool_accepts(&promtool, &body);
    }
    let proc_line = body
        .lines()
        .find(|l| l.starts_with("gpupilot_gpu_process_memory_bytes{"))
        .unwrap_or_else(|| panic!("{body}"));
    assert!(
        proc_line.contains(&format!("pid=\"{pid}\"")) && proc_line.ends_with(" 1073741824"),
        "{proc_line}"
    );

    // The node's event log and the alert hook.
    let events = s.home.events_named("xid");
    assert!(
        events.iter().any(|e| e["gpu"] == 0 && e["xid"] == 48),
        "{events:?}"
    );
    assert!(events.iter().all(|e| e["gpu"] == 0));
    wait_for("the alert hook to run", Duration::from_secs(20), || {
        std::fs::read_to_string(&hooks).is_ok_and(|t| t.contains("\"key\":\"xid:gpu0:48\""))
    });
    let hook = std::fs::read_to_string(&hooks).unwrap();
    let raised: Value =
        serde_json::from_str(hook.lines().find(|l| l.contains("xid:gpu0:48")).unwrap()).unwrap();
    assert_eq!(raised["change"], "raised");
    assert_eq!(raised["kind"], "xid");
    assert_eq!(raised["value"], 48.0);

    // doctor: a recent double-bit ECC XID is a failure, heard by the daemon.
    let (code, report) = s.doctor_json();
    assert_eq!(code, Some(2), "{report}");
    assert_eq!(report["verdict"], "fail");
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "xid")
        .unwrap();
    assert_eq!(check["status"], "fail", "{check}");
    let detail = check["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("GPU 0: XID 48 (Double Bit ECC Error)")
            && detail.contains("heard by the daemon"),
        "{detail}"
    );
    let _ = holder.kill();
    let _ = holder.wait();
}
