//! `gpupilot status`: a one-shot snapshot of every GPU, as a table or as JSON. Names in the
//! table (a GPU's, a process's, its user's) are someone else's words: they are shown
//! [`printable`].

use crate::telemetry::nvlink::{NvLinkSample, rate_text};
use crate::telemetry::xid::explain;
use crate::telemetry::{GpuSample, Snapshot, throttle_reason_badges};
use crate::text::printable;
use crate::units::format_duration;
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
        .filter_map(|g| g.name.as_deref().map(|n| printable(n).chars().count()))
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
        for line in mig_rows(g) {
            let _ = writeln!(out, "{line}");
        }
    }
    let procs: Vec<_> = snap
        .gpus
        .iter()
        .flat_map(|g| g.processes.iter().flatten().map(move |p| (g.index, p)))
        .collect();
    if !procs.is_empty() {
        let _ = writeln!(
            out,
            "\n{:>3}  {:>8}  {:>10}  {:<12}  {:<18}  PROCESS",
            "GPU", "PID", "GPU MEM", "USER", "JOB / CONTAINER"
        );
        for (i, p) in procs {
            let owner = p.owner.as_ref();
            let _ = writeln!(
                out,
                "{:>3}  {:>8}  {:>10}  {:<12}  {:<18}  {}",
                i,
                p.pid,
                or_na(p.used_memory_bytes, |b| format!(
                    "{:.1} GiB",
                    b as f64 / GIB
                )),
                owner
                    .and_then(|o| o.user_label())
                    .map_or_else(|| "N/A".into(), |u| printable(&u)),
                owner
                    .and_then(|o| o.place())
                    .map_or_else(|| "-".into(), |p| printable(&p)),
                printable(p.name.as_deref().unwrap_or("N/A"))
            );
        }
    }
    nvlink_lines(&mut out, snap);
    memory_lines(&mut out, snap);
    let xids: Vec<&GpuSample> = snap
        .gpus
        .iter()
        .filter(|g| g.xids.as_ref().is_some_and(|x| !x.is_empty()))
        .collect();
    if !xids.is_empty() {
        let _ = writeln!(out, "\nXID errors (most recent last)");
        for g in xids {
            for x in g.xids.iter().flatten() {
                let info = explain(x.xid);
                let _ = writeln!(
                    out,
                    "{:>3}  {} ago  {}: {}",
                    g.index,
                    format_duration((snap.time_s - x.time_s).max(0.0)),
                    info.title(),
                    info.action
                );
            }
        }
    }
    out
}

/// Each GPU whose memory has rows remapped or pages retired, and what to do.
fn memory_lines(out: &mut String, snap: &Snapshot) {
    use crate::telemetry::memory::{MemoryAdvice, memory_health};
    let lines: Vec<String> = snap
        .gpus
        .iter()
        .filter_map(|g| {
            let m = memory_health(g)?;
            let todo = match m.advice {
                Some(MemoryAdvice::Replace) => ": drain the GPU and have it replaced",
                Some(MemoryAdvice::ResetPending) => {
                    ": waiting for a GPU reset; reset it when idle (nvidia-smi -r -i N)"
                }
                None => "",
            };
            Some(format!("{:>3}  {}{todo}", g.index, m.what))
        })
        .collect();
    if !lines.is_empty() {
        let _ = writeln!(out, "\nMemory health");
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
    }
}

/// Each GPU with NVLink: links up of all, traffic now, and which links are down.
fn nvlink_lines(out: &mut String, snap: &Snapshot) {
    let with: Vec<(u32, &NvLinkSample)> = snap
        .gpus
        .iter()
        .filter_map(|g| g.nvlink.as_ref().map(|n| (g.index, n)))
        .collect();
    if with.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n{:>3}  {:>5}  {:>21}  NVLINK",
        "GPU", "UP", "TX / RX"
    );
    for (i, n) in with {
        let down = n.down();
        let note = match down.as_slice() {
            [] => "-".to_string(),
            [one] => format!("link {one} down"),
            many => format!(
                "links {} down",
                many.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        };
        let _ = writeln!(
            out,
            "{:>3}  {:>5}  {:>21}  {}",
            i,
            format!("{}/{}", n.links_up, n.links),
            format!(
                "{} / {}",
                or_na(n.tx_bytes_s, rate_text),
                or_na(n.rx_bytes_s, rate_text)
            ),
            note
        );
    }
}

fn gpu_row(g: &GpuSample, name_w: usize) -> String {
    let name = printable(g.name.as_deref().unwrap_or("N/A"));
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

/// A GPU's MIG instances under its row (`GPU:GI`, profile, slices, memory, UUID), and a MIG
/// mode change that waits for a reset.
fn mig_rows(g: &GpuSample) -> Vec<String> {
    let Some(mig) = g.mig.as_ref() else {
        return Vec::new();
    };
    let mut rows = Vec::new();
    if mig.change_pending() {
        rows.push(format!(
            "     MIG mode {} after a reset: reset the GPU to apply (nvidia-smi -r -i {})",
            if mig.pending { "on" } else { "off" },
            g.index
        ));
    }
    for m in &mig.instances {
        let mem = format!(
            "{} / {} GiB",
            or_na(m.memory_used_bytes, |b| format!("{:.1}", b as f64 / GIB)),
            or_na(m.memory_total_bytes, |b| format!("{:.1}", b as f64 / GIB))
        );
        rows.push(format!(
            "     └ {:<6} MIG {:<10} {:>2} slices  CI {:<2}  {:>17}  {}  {}",
            m.address(g.index).unwrap_or_else(|| "N/A".into()),
            m.profile.as_deref().unwrap_or("N/A"),
            or_na(m.slices, |s| s.to_string()),
            or_na(m.compute_instance_id, |c| c.to_string()),
            mem,
            m.uuid.as_deref().unwrap_or("N/A"),
            if m.pids.is_empty() {
                "-".to_string()
            } else {
                format!(
                    "pid {}",
                    m.pids
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                )
            }
        ));
    }
    rows
}

/// Take each GPU's XIDs from `daemon`'s snapshot where the daemon has listened longer (it
/// has, unless it started after this one-shot read): a GPU is matched by UUID, else by index.
pub fn merge_xids(local: &mut Snapshot, daemon: &Snapshot) {
    for g in &mut local.gpus {
        let theirs = daemon.gpus.iter().find(|d| match (&d.uuid, &g.uuid) {
            (Some(a), Some(b)) => a == b,
            _ => d.index == g.index,
        });
        let Some(d) = theirs else { continue };
        let longer = match (d.xid_since_s, g.xid_since_s) {
            (Some(a), Some(b)) => a < b,
            (Some(_), None) => true,
            _ => false,
        };
        if longer {
            g.xids = d.xids.clone();
            g.xid_since_s = d.xid_since_s;
            g.xid_count = d.xid_count;
        }
    }
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
                topology: None,
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
                        owner: None,
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
    fn xids_and_owners_in_the_table_and_the_daemons_xids_merged() {
        use crate::telemetry::owner::ProcessOwner;
        use crate::telemetry::xid::XidEvent;
        let mut s = snap();
        s.time_s = 1000.0;
        s.gpus[0].processes.as_mut().unwrap()[0].owner = Some(ProcessOwner {
            uid: Some(1000),
            user: Some("alice".into()),
            slurm_job: Some("4242".into()),
            ..ProcessOwner::default()
        });
        s.gpus[0].xid_since_s = Some(990.0);
        s.gpus[0].xids = Some(vec![]);
        let mut daemon = snap();
        daemon.gpus[0].xid_since_s = Some(10.0);
        daemon.gpus[0].xids = Some(vec![XidEvent::new(79, 880.0)]);
        daemon.gpus[0].xid_count = Some(1);
        merge_xids(&mut s, &daemon);
        assert_eq!(s.gpus[0].xid_count, Some(1), "the daemon listened longer");
        assert_eq!(s.gpus[1].xids, None, "nobody listened on GPU 1");
        let t = render_table(&s);
        assert!(
            t.contains("USER") && t.contains("alice") && t.contains("slurm 4242"),
            "{t}"
        );
        let line = t
            .lines()
            .find(|l| l.contains("XID 79"))
            .expect("an XID line");
        assert_eq!(
            line,
            format!(
                "  0  2m00s ago  XID 79 (GPU has fallen off the bus): {}",
                explain(79).action
            )
        );
    }

    #[test]
    fn another_users_process_name_is_shown_escaped() {
        use crate::telemetry::owner::ProcessOwner;
        let mut s = snap();
        let p = &mut s.gpus[0].processes.as_mut().unwrap()[0];
        p.name = Some("gp\u{1b}[2J\nFAKE".into());
        p.owner = Some(ProcessOwner {
            user: Some("bob\u{202e}".into()),
            ..ProcessOwner::default()
        });
        let t = render_table(&s);
        let line = t.lines().find(|l| l.contains("FAKE")).expect("the process");
        assert_eq!(
            line,
            "  0      4242    54.0 GiB  bob\\u{202e}   -                   gp\\x1b[2J\\nFAKE"
        );
        assert!(!t.contains('\u{1b}') && !t.contains('\u{202e}'), "{t}");
    }

    #[test]
    fn json_keeps_absent_as_null() {
        let v: serde_json::Value = serde_json::from_str(&render_json(&snap())).unwrap();
        assert_eq!(v["gpus"][0]["power_limit_w"], 700.0);
        assert!(v["gpus"][1]["power_w"].is_null());
        assert_eq!(v["gpus"][2]["lost"], true);
        assert_eq!(v["node"]["driver_version"], "550.54.15");
    }

    #[test]
    fn nvlink_section_shows_links_up_traffic_and_the_down_link() {
        use crate::telemetry::nvlink::LinkNow;
        let mut s = snap();
        assert!(
            !render_table(&s).contains("NVLINK"),
            "no NVLink, no section"
        );
        let link = |up| LinkNow {
            up: Some(up),
            tx_bytes_s: Some(if up { 0.55e9 } else { 0.0 }),
            rx_bytes_s: Some(if up { 0.55e9 } else { 0.0 }),
        };
        let mut per_link = vec![link(true); 18];
        per_link[5] = link(false);
        s.gpus[1].nvlink = Some(NvLinkSample {
            links: 18,
            links_up: 17,
            tx_bytes_s: Some(9.35e9),
            rx_bytes_s: Some(9.35e9),
            per_link,
        });
        let t = render_table(&s);
        assert!(
            t.contains("GPU     UP                TX / RX  NVLINK"),
            "{t}"
        );
        assert!(
            t.contains("  1  17/18    9.3 GB/s / 9.3 GB/s  link 5 down"),
            "{t}"
        );
        let v: serde_json::Value = serde_json::from_str(&render_json(&s)).unwrap();
        assert_eq!(v["gpus"][1]["nvlink"]["links_up"], 17);
        assert_eq!(v["gpus"][1]["nvlink"]["per_link"][5]["up"], false);
        assert!(v["gpus"][0].get("nvlink").is_none(), "absent, not zero");
    }
}
