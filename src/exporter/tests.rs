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
         device=\"nvidia0\",model_name=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-\\\"7\\\"\"} 87\n"
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
        snapshot: None,
        runs: &[],
        control: None,
    });
    assert!(!p.contains("DCGM_"));
    assert!(p.contains("gpupilot_gpus{Hostname=\"n\"} 0\n"));
    assert!(p.contains("gpupilot_runs_live{Hostname=\"n\"} 0\n"));
}

#[test]
fn runs_export_throughput_knobs_and_loss() {
    let info: RunInfo = serde_json::from_value(serde_json::json!({
        "id": "20250101-000000-rn50", "name": "rn50", "status": "running", "pid": 1,
        "attempt": 0, "restarts": 0, "started_at": "2025-01-01T00:00:00Z", "ended_at": null,
        "uptime_s": 1.0, "exit_code": null, "signal_name": null, "description": null,
        "command": ["x"], "cwd": "/", "gpus": "0,1", "adopted": false, "dir": "/tmp/x"
    }))
    .unwrap();
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
