//! XID errors and who holds each GPU, on the `/metrics` page.
//!
//! - `DCGM_FI_DEV_XID_ERRORS`: the GPU's last XID (0 while none was heard), with
//!   dcgm-exporter 3.3+'s `err_code` and `err_msg` labels (the number and its catalog name).
//!   Only for GPUs whose XIDs are listened for: absent, not 0, where nobody listens. Unlike
//!   the other GPU series it stays on a lost GPU: an XID is an event already heard, not a
//!   reading that went stale, and 79 arrives with the GPU that fell off the bus.
//! - `gpupilot_gpu_xid_errors_total`: XIDs heard since listening began.
//! - `gpupilot_gpu_process_memory_bytes`: GPU memory per process, labelled with its GPU's
//!   labels and its `pid`,
//!   `process`, `user`, `slurm_job`, `container` (12 characters) and `pod` (empty where not
//!   known). The series are capped at [`MAX_PROCESS_SERIES`] (the largest holders kept) so a
//!   node running thousands of short processes cannot blow up Prometheus;
//!   `gpupilot_process_series_dropped` says how many were left out.

use super::{Node, family, gpu_labels, labels};
use crate::telemetry::GpuSample;
use crate::telemetry::owner::short;

/// Process series on one page, at most.
pub const MAX_PROCESS_SERIES: usize = 256;
/// Longest process name put in a label.
const MAX_NAME: usize = 64;

/// `{…gpu labels…,err_code="79",err_msg="…"}`: the GPU's labels with two more.
fn with(base: &str, extra: &[(&str, &str)]) -> String {
    let more = labels(extra);
    match (base.strip_suffix('}'), more.strip_prefix('{')) {
        (Some(b), Some(m)) if !m.starts_with('}') => format!("{b},{m}"),
        _ => base.to_string(),
    }
}

/// The XID families.
pub(super) fn xid_families(out: &mut String, gpus: &[GpuSample], node: Node<'_>) {
    let mut last = Vec::new();
    let mut total = Vec::new();
    for g in gpus {
        let Some(xids) = &g.xids else { continue };
        let base = gpu_labels(g, node);
        match xids.last() {
            Some(x) => {
                let code = x.xid.to_string();
                last.push((
                    with(&base, &[("err_code", &code), ("err_msg", &x.name)]),
                    x.xid as f64,
                ));
            }
            None => last.push((base.clone(), 0.0)),
        }
        if let Some(n) = g.xid_count {
            total.push((base, n as f64));
        }
    }
    family(
        out,
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        "gauge",
        &last,
    );
    family(
        out,
        "gpupilot_gpu_xid_errors_total",
        "XID errors heard since the daemon began listening.",
        "counter",
        &total,
    );
}

/// The process families.
pub(super) fn process_families(out: &mut String, gpus: &[&GpuSample], node: Node<'_>) {
    let mut all: Vec<(u64, String)> = Vec::new();
    for g in gpus {
        for p in g.processes.iter().flatten() {
            let Some(bytes) = p.used_memory_bytes else {
                continue;
            };
            let owner = p.owner.clone().unwrap_or_default();
            let name: String = p
                .name
                .as_deref()
                .unwrap_or("")
                .chars()
                .take(MAX_NAME)
                .collect();
            let user = owner.user_label().unwrap_or_default();
            let pid = p.pid.to_string();
            let container = owner
                .container
                .as_deref()
                .map(|c| short(c, 12))
                .unwrap_or("");
            all.push((
                bytes,
                with(
                    &gpu_labels(g, node),
                    &[
                        ("pid", &pid),
                        ("process", &name),
                        ("user", &user),
                        ("slurm_job", owner.slurm_job.as_deref().unwrap_or("")),
                        ("container", container),
                        ("pod", owner.pod.as_deref().unwrap_or("")),
                    ],
                ),
            ));
        }
    }
    // The largest holders first, so the cap drops the small ones.
    all.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let dropped = all.len().saturating_sub(MAX_PROCESS_SERIES);
    all.truncate(MAX_PROCESS_SERIES);
    let samples: Vec<(String, f64)> = all.into_iter().map(|(b, l)| (l, b as f64)).collect();
    family(
        out,
        "gpupilot_gpu_process_memory_bytes",
        "GPU memory a process holds, with its user and its Slurm job, container or pod.",
        "gauge",
        &samples,
    );
    if !gpus.is_empty() {
        family(
            out,
            "gpupilot_process_series_dropped",
            "Process series left off this page past the cap (the smallest holders).",
            "gauge",
            &[(node.only(), dropped as f64)],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::{HostnameLabel, Input, render};
    use super::MAX_PROCESS_SERIES;
    use crate::telemetry::owner::ProcessOwner;
    use crate::telemetry::xid::XidEvent;
    use crate::telemetry::{GpuProcess, GpuSample, Snapshot};

    fn page(gpus: Vec<GpuSample>) -> String {
        let snap = Snapshot {
            gpus,
            ..Default::default()
        };
        render(&Input {
            hostname: "n1",
            hostname_label: HostnameLabel::Hostname,
            snapshot: Some(&snap),
            runs: &[],
            control: None,
        })
    }

    fn lines<'a>(page: &'a str, metric: &str) -> Vec<&'a str> {
        page.lines()
            .filter(|l| l.starts_with(&format!("{metric}{{")))
            .collect()
    }

    #[test]
    fn the_last_xid_with_its_code_and_message_and_none_where_nobody_listens() {
        let heard = GpuSample {
            index: 0,
            uuid: Some("GPU-0".into()),
            lost: true,
            xids: Some(vec![XidEvent::new(94, 10.0), XidEvent::new(79, 20.0)]),
            xid_count: Some(2),
            ..Default::default()
        };
        let quiet = GpuSample {
            index: 1,
            xids: Some(vec![]),
            xid_count: Some(0),
            ..Default::default()
        };
        let deaf = GpuSample {
            index: 2,
            ..Default::default()
        };
        let p = page(vec![heard, quiet, deaf]);
        let xid = lines(&p, "DCGM_FI_DEV_XID_ERRORS");
        assert_eq!(xid.len(), 2, "{p}");
        assert!(
            xid[0].starts_with("DCGM_FI_DEV_XID_ERRORS{gpu=\"0\",UUID=\"GPU-0\",")
                && xid[0].ends_with(",err_code=\"79\",err_msg=\"GPU has fallen off the bus\"} 79"),
            "a lost GPU keeps its XID: {}",
            xid[0]
        );
        assert!(xid[1].starts_with("DCGM_FI_DEV_XID_ERRORS{gpu=\"1\","));
        assert!(xid[1].ends_with("} 0") && !xid[1].contains("err_code"));
        let total = lines(&p, "gpupilot_gpu_xid_errors_total");
        assert_eq!(total.len(), 2);
        assert!(total[0].ends_with(" 2"));
        assert!(p.contains("# TYPE gpupilot_gpu_xid_errors_total counter"));
    }

    fn proc(pid: u32, mib: u64, owner: Option<ProcessOwner>) -> GpuProcess {
        GpuProcess {
            pid,
            name: Some("python3".into()),
            used_memory_bytes: Some(mib << 20),
            owner,
        }
    }

    #[test]
    fn process_series_carry_the_owner_and_are_capped() {
        let owner = ProcessOwner {
            uid: Some(1000),
            user: Some("alice".into()),
            slurm_job: Some("4242".into()),
            container: Some(
                "3f8e9b1c2d4a5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f".into(),
            ),
            pod: None,
        };
        let mut procs = vec![proc(7, 5000, Some(owner)), proc(8, 10, None)];
        let g = GpuSample {
            index: 0,
            uuid: Some("GPU-0".into()),
            processes: Some(procs.clone()),
            ..Default::default()
        };
        let p = page(vec![g.clone()]);
        let series = lines(&p, "gpupilot_gpu_process_memory_bytes");
        assert_eq!(
            series[0],
            "gpupilot_gpu_process_memory_bytes{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"\",device=\"nvidia0\",\
             modelName=\"\",Hostname=\"n1\",pid=\"7\",process=\"python3\",user=\"alice\",slurm_job=\"4242\",\
             container=\"3f8e9b1c2d4a\",pod=\"\"} 5242880000"
        );
        assert!(series[1].contains("pid=\"8\"") && series[1].contains("user=\"\""));
        assert!(p.contains("gpupilot_process_series_dropped{Hostname=\"n1\"} 0"));

        // Past the cap: the largest holders stay, the count of the others is said.
        procs = (0..MAX_PROCESS_SERIES as u32 + 10)
            .map(|i| proc(100 + i, 1 + u64::from(i), None))
            .collect();
        let many = GpuSample {
            processes: Some(procs),
            ..g
        };
        let p = page(vec![many]);
        let series = lines(&p, "gpupilot_gpu_process_memory_bytes");
        assert_eq!(series.len(), MAX_PROCESS_SERIES);
        assert!(!p.contains("pid=\"100\""), "the smallest holder is dropped");
        assert!(p.contains(&format!("pid=\"{}\"", 100 + MAX_PROCESS_SERIES + 9)));
        assert!(p.contains("gpupilot_process_series_dropped{Hostname=\"n1\"} 10"));
    }
}
