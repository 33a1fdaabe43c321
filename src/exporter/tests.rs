use super::*;
use crate::protocol::{KnobName, KnobState, MetricsPoint, MetricsReport};
use crate::supervisor::RunStatus;

fn gpu(i: u32) -> GpuSample {
    GpuSample {
        index: i,
        name: Some("NVIDIA H100 80GB HBM3".into()),
        uuid: Some(format!("GPU-{i}")),
        pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + i)),
        util_gpu_pct: Some(87.0),
        memory_used_bytes: Some(3 * 1024 * 1024 * 1024),
        memory_total_bytes: Some(80 * 1024 * 1024 * 1024),
        temperature_c: Some(61.5),
        power_w: Some(512.25),
        power_limit_w: Some(700.0),
        energy_j: Some(1234.5678),
        sm_clock_mhz: Some(1980),
        ..Default::default()
    }
}

fn page(snap: &Snapshot, runs: &[(RunInfo, TrainerInfo)]) -> String {
    render(&Input {
        hostname: "node-\"7\"",
        hostname_label: HostnameLabel::Hostname,
        snapshot: Some(snap),
        runs,
        control: None,
    })
}

fn value(page: &str, metric: &str, gpu: u32) -> Option<String> {
    let prefix = format!("{metric}{{gpu=\"{gpu}\",");
    page.lines()
        .find(|l| l.starts_with(&prefix))
        .map(|l| l.rsplit(' ').next().unwrap().to_string())
}

#[test]
fn dcgm_names_units_and_labels() {
    let snap = Snapshot {
        gpus: vec![gpu(0)],
        ..Default::default()
    };
    let p = page(&snap, &[]);
    assert_eq!(value(&p, "DCGM_FI_DEV_GPU_UTIL", 0).as_deref(), Some("87"));
    assert_eq!(value(&p, "DCGM_FI_DEV_FB_USED", 0).as_deref(), Some("3072"));
    assert_eq!(
        value(&p, "DCGM_FI_DEV_FB_FREE", 0).as_deref(),
        Some("78848")
    );
    assert_eq!(
        value(&p, "DCGM_FI_DEV_GPU_TEMP", 0).as_deref(),
        Some("61.5")
    );
    assert_eq!(
        value(&p, "DCGM_FI_DEV_POWER_USAGE", 0).as_deref(),
        Some("512.25")
    );
    // Joules in, millijoules out.
    assert_eq!(
        value(&p, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0).as_deref(),
        Some("1234568")
    );
    assert_eq!(
        value(&p, "DCGM_FI_DEV_SM_CLOCK", 0).as_deref(),
        Some("1980")
    );
    assert!(p.contains(
        "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:18:00.0\",\
         device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-\\\"7\\\"\"} 87\n"
    ));
    assert!(p.contains("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"));
    assert!(p.contains("# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n"));
}

#[test]
fn absent_fields_lost_and_stale_gpus_export_no_values() {
    let mut stale = gpu(1);
    stale.stale = true;
    let lost = GpuSample {
        index: 2,
        lost: true,
        power_w: Some(100.0),
        ..Default::default()
    };
    let mut no_fan = gpu(0);
    no_fan.fan_pct = None;
    no_fan.util_gpu_pct = Some(f64::NAN);
    let snap = Snapshot {
        gpus: vec![no_fan, stale, lost],
        ..Default::default()
    };
    let p = page(&snap, &[]);
    assert!(
        !p.contains("DCGM_FI_DEV_FAN_SPEED"),
        "absent is not 0:\n{p}"
    );
    assert_eq!(value(&p, "DCGM_FI_DEV_GPU_UTIL", 0), None, "NaN is absent");
    assert_eq!(value(&p, "DCGM_FI_DEV_POWER_USAGE", 1), None);
    assert_eq!(value(&p, "DCGM_FI_DEV_POWER_USAGE", 2), None);
    assert_eq!(value(&p, "gpupilot_gpu_stale", 1).as_deref(), Some("1"));
    assert_eq!(value(&p, "gpupilot_gpu_stale", 0).as_deref(), Some("0"));
    assert_eq!(value(&p, "gpupilot_gpu_lost", 2).as_deref(), Some("1"));
    assert!(p.contains("gpupilot_gpus{Hostname=\"node-\\\"7\\\"\"} 3\n"));
}

#[test]
fn no_telemetry_is_a_page_without_gpu_series() {
    let p = render(&Input {
        hostname: "n",
        hostname_label: HostnameLabel::Hostname,
        snapshot: None,
        runs: &[],
        control: None,
    });
    assert!(!p.contains("DCGM_"));
    assert!(p.contains("gpupilot_gpus{Hostname=\"n\"} 0\n"));
    assert!(p.contains("gpupilot_runs_live{Hostname=\"n\"} 0\n"));
}

/// A running run `rn50` with id `id` on `gpus`.
fn run_info(id: &str, gpus: &str) -> RunInfo {
    serde_json::from_value(serde_json::json!({
        "id": id, "name": "rn50", "status": "running", "pid": 1,
        "attempt": 0, "restarts": 0, "started_at": "2025-01-01T00:00:00Z", "ended_at": null,
        "uptime_s": 1.0, "exit_code": null, "signal_name": null, "description": null,
        "command": ["x"], "cwd": "/", "gpus": gpus, "adopted": false, "dir": "/tmp/x"
    }))
    .unwrap()
}

#[test]
fn runs_export_throughput_knobs_and_loss() {
    let info = run_info("20250101-000000-rn50", "0,1");
    assert_eq!(info.status, RunStatus::Running);
    let trainer = TrainerInfo {
        attached: true,
        pid: Some(1),
        last: Some(MetricsPoint {
            n: 3,
            t: 1_700_000_000.5,
            from: "trainer".into(),
            report: MetricsReport {
                loss: Some(0.25),
                samples_per_s: Some(1520.0),
                ..Default::default()
            },
            rank: None,
        }),
        knobs: vec![KnobState {
            knob: KnobName::BatchSize,
            value: Some(256),
            pending: None,
            range: None,
            last_rtt_ms: None,
            last_outcome: None,
        }],
        ..TrainerInfo::default()
    };
    let p = page(&Snapshot::default(), &[(info, trainer)]);
    let l = "{run=\"20250101-000000-rn50\",name=\"rn50\",gpus=\"0,1\",Hostname=\"node-\\\"7\\\"\"}";
    assert!(
        p.contains(&format!("gpupilot_run_samples_per_second{l} 1520\n")),
        "{p}"
    );
    assert!(p.contains(&format!("gpupilot_run_batch_size{l} 256\n")));
    assert!(p.contains(&format!("gpupilot_run_loss{l} 0.25\n")));
    assert!(p.contains(&format!("gpupilot_run_trainer_attached{l} 1\n")));
    assert!(
        !p.contains("gpupilot_run_prefetch"),
        "no prefetch known: no series"
    );
}

#[test]
fn every_family_has_help_and_type_once() {
    let snap = Snapshot {
        gpus: vec![gpu(0), gpu(1)],
        ..Default::default()
    };
    let p = page(&snap, &[]);
    let mut seen = std::collections::HashSet::new();
    for l in p.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = l.split(' ').nth(2).unwrap();
        assert!(seen.insert(name.to_string()), "{name} twice");
        assert!(p.contains(&format!("# HELP {name} ")));
    }
    assert!(seen.len() > 10);
}

fn snap_with(gpus: Vec<GpuSample>, driver: Option<&str>) -> Snapshot {
    Snapshot {
        gpus,
        node: crate::telemetry::NodeInfo {
            driver_version: driver.map(str::to_string),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn hostname_mode_spells_the_node_label_lowercase_everywhere() {
    let info = run_info("r1", "0");
    let snap = snap_with(vec![gpu(0)], Some("550.54.15"));
    let runs = [(info, TrainerInfo::default())];
    let p = render(&Input {
        hostname: "gpu-node-07",
        hostname_label: HostnameLabel::Lower,
        snapshot: Some(&snap),
        runs: &runs,
        control: None,
    });
    assert!(!p.contains("Hostname="), "{p}");
    assert!(p.contains(
        "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:18:00.0\",\
         device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",hostname=\"gpu-node-07\",\
         DCGM_FI_DRIVER_VERSION=\"550.54.15\"} 87\n"
    ));
    assert!(
        p.contains("gpupilot_gpus{hostname=\"gpu-node-07\"} 1\n"),
        "{p}"
    );
    assert!(p.contains("gpupilot_runs_live{hostname=\"gpu-node-07\"} 1\n"));
    assert!(p.contains(
        "gpupilot_run_trainer_attached{run=\"r1\",name=\"rn50\",gpus=\"0\",\
         hostname=\"gpu-node-07\"} 0\n"
    ));
    assert_eq!(HostnameLabel::default().name(), "Hostname");
}

#[test]
fn driver_version_is_a_label_on_every_gpu_series_as_dcgm_exporter_has_it() {
    let p = page(&snap_with(vec![gpu(0), gpu(1)], Some("550.54.15")), &[]);
    let gpu_lines: Vec<&str> = p
        .lines()
        .filter(|l| l.starts_with("DCGM_") || l.starts_with("gpupilot_gpu_"))
        .collect();
    assert!(gpu_lines.len() > 10, "{p}");
    for l in &gpu_lines {
        assert!(
            l.contains(",Hostname=\"node-\\\"7\\\"\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"}"),
            "{l}"
        );
    }
    // A label, as dcgm-exporter's counters file types the field: no series of its own.
    assert!(!p.contains("# TYPE DCGM_FI_DRIVER_VERSION"), "{p}");
    assert!(!p.contains("\nDCGM_FI_DRIVER_VERSION"), "{p}");
    // Node-wide series carry the node's label only.
    assert!(
        p.contains("gpupilot_gpus{Hostname=\"node-\\\"7\\\"\"} 2\n"),
        "{p}"
    );

    // Unknown (or empty) driver version: no label, not an empty one.
    for driver in [None, Some("")] {
        let p = page(&snap_with(vec![gpu(0)], driver), &[]);
        assert!(!p.contains("DCGM_FI_DRIVER_VERSION"), "{p}");
        assert!(p.contains("DCGM_FI_DEV_GPU_UTIL{"));
    }
}

#[test]
fn energy_and_ecc_are_counters_under_dcgm_names() {
    let mut g = gpu(0);
    g.ecc_corrected = Some(12);
    g.ecc_uncorrected = Some(0);
    let p = page(&snap_with(vec![g], None), &[]);
    assert!(
        p.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"),
        "{p}"
    );
    assert!(!p.contains("untyped"));
    assert!(p.contains("# TYPE DCGM_FI_DEV_ECC_SBE_VOL_TOTAL counter\n"));
    assert!(p.contains("# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n"));
    assert_eq!(
        value(&p, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0).as_deref(),
        Some("12")
    );
    // A real 0 is exported: the GPU has ECC and counted none.
    assert_eq!(
        value(&p, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0).as_deref(),
        Some("0")
    );
    // No aggregate counts in this sample: no aggregate series.
    assert!(!p.contains("_AGG_TOTAL"), "{p}");
}

#[test]
fn memory_and_link_health_under_dcgm_names_and_absent_where_unread() {
    let mut sick = gpu(1);
    sick.ecc_corrected_total = Some(40);
    sick.ecc_uncorrected_total = Some(2);
    sick.remapped_rows = Some(crate::telemetry::RemappedRows {
        correctable: 3,
        uncorrectable: 1,
        pending: true,
        failure: false,
    });
    sick.retired_pages = Some(crate::telemetry::RetiredPages {
        single_bit: 3,
        double_bit: 2,
        pending: true,
    });
    sick.memory_temp_c = Some(71.0);
    sick.memory_reserved_bytes = Some(512 * 1024 * 1024);
    sick.enc_util_pct = Some(0.0);
    sick.dec_util_pct = Some(12.0);
    sick.pcie_replays = Some(1234);
    sick.pcie_gen = Some(4);
    sick.pcie_width = Some(8);
    sick.pcie_gen_max = Some(5);
    sick.pcie_width_max = Some(16);
    let p = page(&snap_with(vec![gpu(0), sick], None), &[]);
    for (metric, want, kind) in [
        ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "40", "counter"),
        ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "2", "counter"),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "3", "counter"),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "1", "counter"),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", "1", "gauge"),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0", "gauge"),
        ("DCGM_FI_DEV_RETIRED_SBE", "3", "counter"),
        ("DCGM_FI_DEV_RETIRED_DBE", "2", "counter"),
        ("DCGM_FI_DEV_RETIRED_PENDING", "1", "counter"),
        ("DCGM_FI_DEV_MEMORY_TEMP", "71", "gauge"),
        ("DCGM_FI_DEV_FB_RESERVED", "512", "gauge"),
        ("DCGM_FI_DEV_ENC_UTIL", "0", "gauge"),
        ("DCGM_FI_DEV_DEC_UTIL", "12", "gauge"),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "1234", "counter"),
        ("DCGM_FI_DEV_PCIE_LINK_GEN", "4", "gauge"),
        ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "8", "gauge"),
        ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "5", "gauge"),
        ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "16", "gauge"),
    ] {
        assert_eq!(value(&p, metric, 1).as_deref(), Some(want), "{metric}\n{p}");
        assert!(p.contains(&format!("# TYPE {metric} {kind}\n")), "{metric}");
        // GPU 0 read none of these: absent, never 0.
        assert_eq!(value(&p, metric, 0), None, "{metric}");
    }
}

#[test]
fn nvlink_bandwidth_as_dcgm_exporter_names_it_and_absent_without_nvlink() {
    let mut linked = gpu(1);
    linked.nvlink = Some(crate::telemetry::nvlink::NvLinkSample {
        links: 18,
        links_up: 18,
        tx_bytes_s: Some(9.5e9),
        rx_bytes_s: Some(9.0e9),
        per_link: Vec::new(),
    });
    let p = page(&snap_with(vec![gpu(0), linked], None), &[]);
    let metric = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL";
    assert_eq!(value(&p, metric, 1).as_deref(), Some("18500"), "{p}");
    assert!(
        p.contains(&format!(
            "# TYPE {metric} counter
"
        )),
        "{p}"
    );
    assert!(
        p.contains(&format!(
            "# HELP {metric} Total number of NVLink bandwidth counters for all lanes
"
        )),
        "{p}"
    );
    assert_eq!(
        value(&p, metric, 0),
        None,
        "absent, never 0
{p}"
    );
    let p = page(&snap_with(vec![gpu(0)], None), &[]);
    assert!(!p.contains("NVLINK"), "{p}");
}

#[test]
fn ecc_series_are_absent_when_the_sample_lacks_them() {
    let mut with = gpu(1);
    with.ecc_corrected = Some(3);
    let without = gpu(0);
    assert_eq!(without.ecc_corrected, None);
    let p = page(&snap_with(vec![without, with], None), &[]);
    assert_eq!(value(&p, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0), None, "{p}");
    assert_eq!(
        value(&p, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 1).as_deref(),
        Some("3")
    );
    // No GPU with an uncorrected count: no family at all, never 0.
    assert!(!p.contains("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), "{p}");
    let p = page(&snap_with(vec![gpu(0)], None), &[]);
    assert!(!p.contains("ECC"), "{p}");
}
