//! `gpupilot status`: a one-shot snapshot of every GPU, as a table or as JSON.

use crate::telemetry::{GpuSample, Snapshot, throttle_reason_badges};
use std::fmt::Write;

const GIB: f64 = (1u64 << 30) as f64;

/// `value` formatted, or `N/A` when absent.
fn or_na<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "N/A".into())
}

/// The human table: a header line for the node, one line per GPU, then the GPU processes.
pub fn render_table(snap: &Snapshot) -> String {
    let mut out = String::new();
    let n = &snap.node;
    let _ = writeln!(
        out,
        "{} · source {} · driver {} · CUDA {}",
        n.hostname,
        n.source,
        n.driver_version.as_deref().unwrap_or("N/A"),
        n.cuda_driver_version.as_deref().unwrap_or("N/A"),
    );
    let name_w = snap
        .gpus
        .iter()
        .filter_map(|g| g.name.as_ref().map(String::len))
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "{:>3}  {:<name_w$}  {:>5}  {:>17}  {:>9}  {:>13}  {:>8}  THROTTLE",
        "GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER / CAP", "SM CLK"
    );
    for g in &snap.gpus {
        let _ = writeln!(out, "{}", gpu_row(g, name_w));
    }
    let procs: Vec<_> = snap
        .gpus
        .iter()
        .flat_map(|g| g.processes.iter().flatten().map(move |p| (g.index, p)))
        .collect();
    if !procs.is_empty() {
        let _ = writeln!(
            out,
            "\n{:>3}  {:>8}  {:>10}  PROCESS",
            "GPU", "PID", "GPU MEM"
        );
        for (i, p) in procs {
            let _ = writeln!(
                out,
                "{:>3}  {:>8}  {:>10}  {}",
                i,
                p.pid,
                or_na(p.used_memory_bytes, |b| format!(
                    "{:.1} GiB",
                    b as f64 / GIB
                )),
                p.name.as_deref().unwrap_or("N/A")
            );
        }
    }
    out
}

fn gpu_row(g: &GpuSample, name_w: usize) -> String {
    let name = g.name.as_deref().unwrap_or("N/A");
    if g.lost {
        return format!(
            "{:>3}  {:<name_w$}  LOST: the GPU has fallen off the bus",
            g.index, name
        );
    }
    let mem = match (g.memory_used_bytes, g.memory_total_bytes) {
        (None, None) => "N/A".to_string(),
        (u, t) => format!(
            "{} / {} GiB",
            or_na(u, |b| format!("{:.1}", b as f64 / GIB)),
            or_na(t, |b| format!("{:.1}", b as f64 / GIB))
        ),
    };
    let temp = match (g.temperature_c, g.temp_slowdown_c) {
        (t, Some(s)) => format!("{} / {:.0}", or_na(t, |t| format!("{t:.0}°C")), s),
        (t, None) => or_na(t, |t| format!("{t:.0}°C")),
    };
    let power = format!(
        "{} / {} W",
        or_na(g.power_w, |w| format!("{w:.0}")),
        or_na(g.power_limit_w, |w| format!("{w:.0}"))
    );
    let throttle = match g.throttle_reasons {
        None => "N/A".to_string(),
        Some(0) => "-".to_string(),
        Some(bits) => throttle_reason_badges(bits).join(","),
    };
    let mut row = format!(
        "{:>3}  {:<name_w$}  {:>5}  {:>17}  {:>9}  {:>13}  {:>8}  {}",
        g.index,
        name,
        or_na(g.util_gpu_pct, |u| format!("{u:.0}%")),
        mem,
        temp,
        power,
        or_na(g.sm_clock_mhz, |c| format!("{c} MHz")),
        throttle
    );
    if g.stale {
        row.push_str("  (stale: no answer from the driver)");
    }
    row
}

/// The JSON document `status --json` prints: the snapshot as is (absent fields are `null`).
pub fn render_json(snap: &Snapshot) -> String {
    serde_json::to_string_pretty(snap).expect("a snapshot always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{GpuProcess, NodeInfo};

    fn snap() -> Snapshot {
        Snapshot {
            time_s: 1.0,
            node: NodeInfo {
                hostname: "node1".into(),
                source: "sim".into(),
                driver_version: Some("550.54.15".into()),
                cuda_driver_version: Some("12.4".into()),
                nvml_version: None,
            },
            gpus: vec![
                GpuSample {
                    index: 0,
                    name: Some("NVIDIA H100 80GB HBM3".into()),
                    util_gpu_pct: Some(97.0),
                    memory_used_bytes: Some(54 << 30),
                    memory_total_bytes: Some(80 << 30),
                    temperature_c: Some(63.4),
                    temp_slowdown_c: Some(87.0),
                    power_w: Some(612.2),
                    power_limit_w: Some(700.0),
                    sm_clock_mhz: Some(1980),
                    throttle_reasons: Some(crate::telemetry::throttle::SW_POWER_CAP),
                    processes: Some(vec![GpuProcess {
                        pid: 4242,
                        name: Some("python train.py".into()),
                        used_memory_bytes: Some(54 << 30),
                    }]),
                    ..Default::default()
                },
                GpuSample {
                    index: 1,
                    name: Some("NVIDIA H100 80GB HBM3".into()),
                    ..Default::default()
                },
                GpuSample {
                    index: 2,
                    name: Some("NVIDIA H100 80GB HBM3".into()),
                    lost: true,
                    ..Default::default()
                },
            ],
            host: None,
        }
    }

    #[test]
    fn table_shows_values_na_and_lost() {
        let t = render_table(&snap());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "node1 · source sim · driver 550.54.15 · CUDA 12.4"
        );
        assert!(
            lines[2].contains("97%") && lines[2].contains("54.0 / 80.0 GiB"),
            "{}",
            lines[2]
        );
        assert!(lines[2].contains("63°C / 87") && lines[2].contains("612 / 700 W"));
        assert!(lines[2].contains("1980 MHz") && lines[2].ends_with("pwr-cap"));
        // Absent is N/A, never 0.
        assert!(
            lines[3].contains("N/A") && !lines[3].contains(" 0%"),
            "{}",
            lines[3]
        );
        assert!(lines[4].contains("LOST"));
        assert!(t.contains("4242") && t.contains("python train.py"));
    }

    #[test]
    fn json_keeps_absent_as_null() {
        let v: serde_json::Value = serde_json::from_str(&render_json(&snap())).unwrap();
        assert_eq!(v["gpus"][0]["power_limit_w"], 700.0);
        assert!(v["gpus"][1]["power_w"].is_null());
        assert_eq!(v["gpus"][2]["lost"], true);
        assert_eq!(v["node"]["driver_version"], "550.54.15");
    }
}
