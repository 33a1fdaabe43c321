//! The link alert through a real daemon on the fake NVML library's HGX board
//! (`crates/fake-nvml/scenarios/8xh100-nvlink.toml`: GPU 3's NVLink link 5 did not come up):
//! the hook gets one `link` alert for GPU 3 that names the link and what to do, and none for the
//! GPUs whose links are all up.

use std::time::Duration;

use crate::support::nvml_daemon::NvmlDaemon;
use crate::support::wait::wait_for;
use serde_json::Value;

const HGX: &str = include_str!("../../crates/fake-nvml/scenarios/8xh100-nvlink.toml");

#[test]
fn a_down_nvlink_link_is_a_link_alert_for_its_gpu() {
    let (mut s, hooks) = NvmlDaemon::with_alert_hook(HGX);
    s.restart(&[]);
    wait_for("the link alert", Duration::from_secs(30), || {
        std::fs::read_to_string(&hooks).is_ok_and(|t| t.contains("\"key\":\"link:gpu3\""))
    });
    let hook = std::fs::read_to_string(&hooks).unwrap();
    let raised: Value =
        serde_json::from_str(hook.lines().find(|l| l.contains("link:gpu3")).unwrap()).unwrap();
    assert_eq!(raised["change"], "raised", "{raised}");
    assert_eq!(raised["kind"], "link", "{raised}");
    assert_eq!(raised["gpu"], 3, "{raised}");
    let message = raised["message"].as_str().unwrap();
    assert!(
        message.starts_with("GPU 3: NVLink link 5 down (") && message.contains("reset the GPU"),
        "{message}"
    );
    let others: Vec<&str> = hook
        .lines()
        .filter(|l| l.contains("\"kind\":\"link\"") && !l.contains("link:gpu3"))
        .collect();
    assert!(others.is_empty(), "{others:?}");
}

#[test]
fn a_gpu_working_on_a_narrower_pcie_link_is_a_link_alert() {
    // Two training H100s; GPU 1's link trained at Gen4 x8 (the board can do Gen5 x16).
    let scenario = "model = \"h100-sxm\"\ncount = 2\n[training]\nmodel = \"resnet50\"\n\
                    [[per_gpu]]\ngpu = 1\npcie_link_gen = 4\npcie_link_width = 8\n";
    let (mut s, hooks) = NvmlDaemon::with_alert_hook(scenario);
    s.restart(&[]);
    wait_for("the link alert", Duration::from_secs(30), || {
        std::fs::read_to_string(&hooks).is_ok_and(|t| t.contains("\"key\":\"link:gpu1\""))
    });
    let hook = std::fs::read_to_string(&hooks).unwrap();
    let raised: Value =
        serde_json::from_str(hook.lines().find(|l| l.contains("link:gpu1")).unwrap()).unwrap();
    assert_eq!(
        raised["message"],
        "GPU 1: runs at PCIe Gen4 x8, it can do Gen5 x16 (reseat the GPU or check its riser and \
         slot)",
        "{raised}"
    );
    assert!(!hook.contains("link:gpu0"), "{hook}");
}
