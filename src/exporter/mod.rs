//! The daemon's Prometheus `/metrics` page: GPU fields under dcgm-exporter's metric names, so
//! dashboards and alerts written for dcgm-exporter work unchanged, plus `gpupilot_*` series for
//! what dcgm-exporter does not know (stale and lost GPUs, runs, knobs, governors, the budget).
//!
//! Rendering is pure: [`render`] takes what the daemon holds and returns the text exposition
//! format 0.0.4; the daemon's HTTP side is `daemon::metrics`, the query side is
//! [`crate::cluster`].
//!
//! Rules:
//! - Units as dcgm-exporter: framebuffer in MiB, power in W, energy in mJ, clocks in MHz,
//!   temperatures in °C, utilization in percent.
//! - An absent field is an absent series, never 0. A lost or stale GPU exports no values (they
//!   are not current), only `gpupilot_gpu_lost` / `gpupilot_gpu_stale` = 1, so that Prometheus
//!   marks its series stale instead of repeating old numbers.
//! - Labels as dcgm-exporter: `gpu`, `UUID`, `pci_bus_id`, `device` (`nvidia0`), `Hostname`,
//!   and the GPU's model as `model_name`: dcgm-exporter spells it `modelName`, which
//!   `promtool check metrics` rejects (label names are snake_case); docs/operations.md shows
//!   the one relabel rule that restores `modelName` for a dashboard that needs it.
//! - dcgm-exporter types the energy counter `counter` without the `_total` suffix the
//!   exposition rules ask of counters; here it keeps its name and is `untyped`, which
//!   `rate()` and `increase()` read the same way.

use std::fmt::Write as _;

use crate::control::status::ControlStatus;
use crate::protocol::{RunInfo, TrainerInfo};
use crate::telemetry::{GpuSample, Snapshot};

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What one `/metrics` page is made of.
pub struct Input<'a> {
    /// The node's name (`Hostname` label).
    pub hostname: &'a str,
    /// The newest snapshot; None while the daemon has no telemetry.
    pub snapshot: Option<&'a Snapshot>,
    /// Live runs and their trainer side.
    pub runs: &'a [(RunInfo, TrainerInfo)],
    /// The control loops (governors, budget).
    pub control: Option<&'a ControlStatus>,
}

const MIB: f64 = 1024.0 * 1024.0;

/// One metric family: name, help, type, and a value per GPU.
struct GpuField {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    value: fn(&GpuSample) -> Option<f64>,
}

/// The GPU fields, dcgm-exporter's names and units.
const GPU_FIELDS: &[GpuField] = &[
    GpuField {
        name: "DCGM_FI_DEV_GPU_UTIL",
        help: "GPU utilization (in %).",
        kind: "gauge",
        value: |g| g.util_gpu_pct,
    },
    GpuField {
        name: "DCGM_FI_DEV_MEM_COPY_UTIL",
        help: "Memory utilization (in %).",
        kind: "gauge",
        value: |g| g.util_mem_pct,
    },
    GpuField {
        name: "DCGM_FI_DEV_FB_USED",
        help: "Framebuffer memory used (in MiB).",
        kind: "gauge",
        value: |g| g.memory_used_bytes.map(|b| (b as f64 / MIB).round()),
    },
    GpuField {
        name: "DCGM_FI_DEV_FB_FREE",
        help: "Framebuffer memory free (in MiB).",
        kind: "gauge",
        value: |g| match (g.memory_total_bytes, g.memory_used_bytes) {
            (Some(t), Some(u)) => Some((t.saturating_sub(u) as f64 / MIB).round()),
            _ => None,
        },
    },
    GpuField {
        name: "DCGM_FI_DEV_FB_TOTAL",
        help: "Framebuffer memory total (in MiB).",
        kind: "gauge",
        value: |g| g.memory_total_bytes.map(|b| (b as f64 / MIB).round()),
    },
    GpuField {
        name: "DCGM_FI_DEV_GPU_TEMP",
        help: "GPU temperature (in C).",
        kind: "gauge",
        value: |g| g.temperature_c,
    },
    GpuField {
        name: "DCGM_FI_DEV_SLOWDOWN_TEMP",
        help: "Slowdown temperature threshold (in C).",
        kind: "gauge",
        value: |g| g.temp_slowdown_c,
    },
    GpuField {
        name: "DCGM_FI_DEV_SHUTDOWN_TEMP",
        help: "Shutdown temperature threshold (in C).",
        kind: "gauge",
        value: |g| g.temp_shutdown_c,
    },
    GpuField {
        name: "DCGM_FI_DEV_POWER_USAGE",
        help: "Power draw (in W).",
        kind: "gauge",
        value: |g| g.power_w,
    },
    GpuField {
        name: "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        help: "Power management limit, the power cap set (in W).",
        kind: "gauge",
        value: |g| g.power_limit_w,
    },
    GpuField {
        name: "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        help: "Power limit the GPU enforces (in W).",
        kind: "gauge",
        value: |g| g.power_enforced_w,
    },
    GpuField {
        name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        help: "Total energy consumption since the driver loaded (in mJ).",
        kind: "untyped",
        value: |g| g.energy_j.map(|j| (j * 1000.0).round()),
    },
    GpuField {
        name: "DCGM_FI_DEV_SM_CLOCK",
        help: "SM clock frequency (in MHz).",
        kind: "gauge",
        value: |g| g.sm_clock_mhz.map(f64::from),
    },
    GpuField {
        name: "DCGM_FI_DEV_MEM_CLOCK",
        help: "Memory clock frequency (in MHz).",
        kind: "gauge",
        value: |g| g.mem_clock_mhz.map(f64::from),
    },
    GpuField {
        name: "DCGM_FI_DEV_FAN_SPEED",
        help: "Fan speed (in %).",
        kind: "gauge",
        value: |g| g.fan_pct,
    },
    GpuField {
        name: "DCGM_FI_DEV_PSTATE",
        help: "Performance state (0 fastest, 15 slowest).",
        kind: "gauge",
        value: |g| g.pstate.map(f64::from),
    },
    GpuField {
        name: "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        help: "Clock throttle reasons (NVML bit mask).",
        kind: "gauge",
        value: |g| g.throttle_reasons.map(|b| b as f64),
    },
    GpuField {
        name: "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        help: "PCIe receive throughput (in KB/s).",
        kind: "gauge",
        value: |g| g.pcie_rx_kbps.map(|v| v as f64),
    },
    GpuField {
        name: "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        help: "PCIe transmit throughput (in KB/s).",
        kind: "gauge",
        value: |g| g.pcie_tx_kbps.map(|v| v as f64),
    },
];

/// Escape a label value: backslash, double quote and newline.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A sample value; non-finite values are not exported (None).
fn number(v: f64) -> Option<String> {
    v.is_finite().then(|| {
        if v.fract() == 0.0 && v.abs() < 1e15 {
            format!("{}", v as i64)
        } else {
            format!("{v}")
        }
    })
}

/// `{k="v",…}` from pairs, values escaped.
fn labels(pairs: &[(&str, &str)]) -> String {
    let mut s = String::from("{");
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{k}=\"{}\"", escape_label(v));
    }
    s.push('}');
    s
}

/// A family with its samples; nothing at all when there is no sample.
fn family(out: &mut String, name: &str, help: &str, kind: &str, samples: &[(String, f64)]) {
    let lines: Vec<String> = samples
        .iter()
        .filter_map(|(l, v)| number(*v).map(|n| format!("{name}{l} {n}\n")))
        .collect();
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for l in lines {
        out.push_str(&l);
    }
}

/// The label set of one GPU, dcgm-exporter's names.
fn gpu_labels(g: &GpuSample, hostname: &str) -> String {
    let gpu = g.index.to_string();
    let device = format!("nvidia{}", g.index);
    labels(&[
        ("gpu", &gpu),
        ("UUID", g.uuid.as_deref().unwrap_or("")),
        ("pci_bus_id", g.pci_bus_id.as_deref().unwrap_or("")),
        ("device", &device),
        ("model_name", g.name.as_deref().unwrap_or("")),
        ("Hostname", hostname),
    ])
}

/// The whole `/metrics` page.
pub fn render(input: &Input<'_>) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let host = input.hostname;
    let gpus: &[GpuSample] = input.snapshot.map_or(&[], |s| &s.gpus);
    let current: Vec<&GpuSample> = gpus.iter().filter(|g| !g.lost && !g.stale).collect();
    for f in GPU_FIELDS {
        let samples: Vec<(String, f64)> = current
            .iter()
            .filter_map(|g| (f.value)(g).map(|v| (gpu_labels(g, host), v)))
            .collect();
        family(&mut out, f.name, f.help, f.kind, &samples);
    }

    let per_gpu = |flag: fn(&GpuSample) -> bool| -> Vec<(String, f64)> {
        gpus.iter()
            .map(|g| (gpu_labels(g, host), if flag(g) { 1.0 } else { 0.0 }))
            .collect()
    };
    family(
        &mut out,
        "gpupilot_gpu_lost",
        "1 when the GPU fell off the bus (its other series are absent).",
        "gauge",
        &per_gpu(|g| g.lost),
    );
    family(
        &mut out,
        "gpupilot_gpu_stale",
        "1 when the daemon has no fresh reading of the GPU (its other series are absent).",
        "gauge",
        &per_gpu(|g| g.stale && !g.lost),
    );
    let host_only = labels(&[("Hostname", host)]);
    family(
        &mut out,
        "gpupilot_gpus",
        "GPUs the daemon samples.",
        "gauge",
        &[(host_only.clone(), gpus.len() as f64)],
    );
    family(
        &mut out,
        "gpupilot_snapshot_timestamp_seconds",
        "When the newest telemetry snapshot was taken (Unix time).",
        "gauge",
        &input
            .snapshot
            .map(|s| vec![(host_only.clone(), s.time_s)])
            .unwrap_or_default(),
    );

    control_families(&mut out, input, gpus);
    run_families(&mut out, input);
    out
}

/// Governor targets and caps, the node budget.
fn control_families(out: &mut String, input: &Input<'_>, gpus: &[GpuSample]) {
    let host = input.hostname;
    let Some(control) = input.control else {
        return;
    };
    let label_of = |gpu: u32| -> String {
        match gpus.iter().find(|g| g.index == gpu) {
            Some(g) => gpu_labels(g, host),
            None => labels(&[("gpu", &gpu.to_string()), ("Hostname", host)]),
        }
    };
    let target: Vec<(String, f64)> = control
        .governors
        .iter()
        .filter_map(|g| g.target_c.map(|t| (label_of(g.gpu), t)))
        .collect();
    family(
        out,
        "gpupilot_governor_target_celsius",
        "The thermal governor's target temperature.",
        "gauge",
        &target,
    );
    let cap: Vec<(String, f64)> = control
        .governors
        .iter()
        .filter_map(|g| g.cap_w.map(|c| (label_of(g.gpu), c)))
        .collect();
    family(
        out,
        "gpupilot_governor_cap_watts",
        "The power cap the thermal governor asks for.",
        "gauge",
        &cap,
    );
    if let Some(b) = &control.budget {
        let l = labels(&[("Hostname", host)]);
        family(
            out,
            "gpupilot_power_budget_watts",
            "The node power budget.",
            "gauge",
            &[(l.clone(), b.budget_w)],
        );
        family(
            out,
            "gpupilot_power_budget_caps_watts",
            "Sum of the power caps the budget set.",
            "gauge",
            &[(l, b.total_w)],
        );
    }
}

/// One series per live run and reported value.
fn run_families(out: &mut String, input: &Input<'_>) {
    let host = input.hostname;
    let run_labels = |r: &RunInfo| -> String {
        labels(&[
            ("run", &r.id),
            ("name", &r.name),
            ("gpus", &r.gpus),
            ("Hostname", host),
        ])
    };
    family(
        out,
        "gpupilot_runs_live",
        "Runs the daemon supervises that have not ended.",
        "gauge",
        &[(labels(&[("Hostname", host)]), input.runs.len() as f64)],
    );
    type Pick = fn(&TrainerInfo) -> Option<f64>;
    let fields: [(&str, &str, Pick); 8] = [
        (
            "gpupilot_run_samples_per_second",
            "Training throughput the run reports (samples per second).",
            |t| t.last.as_ref().and_then(|p| p.report.samples_per_s),
        ),
        (
            "gpupilot_run_loss",
            "The newest loss the run reports.",
            |t| t.last.as_ref().and_then(|p| p.report.loss),
        ),
        (
            "gpupilot_run_step",
            "The newest step the run reports.",
            |t| {
                t.last
                    .as_ref()
                    .and_then(|p| p.report.step.map(|s| s as f64))
            },
        ),
        (
            "gpupilot_run_step_time_seconds",
            "Time of the newest training step.",
            |t| t.last.as_ref().and_then(|p| p.report.step_time_s),
        ),
        (
            "gpupilot_run_data_wait_seconds",
            "Time the newest step waited for data.",
            |t| t.last.as_ref().and_then(|p| p.report.data_wait_s),
        ),
        (
            "gpupilot_run_batch_size",
            "The batch size the run uses, as far as the daemon knows.",
            |t| knob(t, crate::protocol::KnobName::BatchSize),
        ),
        (
            "gpupilot_run_prefetch",
            "The data-prefetch depth the run uses, as far as the daemon knows.",
            |t| knob(t, crate::protocol::KnobName::Prefetch),
        ),
        (
            "gpupilot_run_metrics_timestamp_seconds",
            "When the daemon received the run's newest metrics report (Unix time).",
            |t| t.last.as_ref().map(|p| p.t),
        ),
    ];
    for (name, help, pick) in fields {
        let samples: Vec<(String, f64)> = input
            .runs
            .iter()
            .filter_map(|(r, t)| pick(t).map(|v| (run_labels(r), v)))
            .collect();
        family(out, name, help, "gauge", &samples);
    }
    let attached: Vec<(String, f64)> = input
        .runs
        .iter()
        .map(|(r, t)| (run_labels(r), if t.attached { 1.0 } else { 0.0 }))
        .collect();
    family(
        out,
        "gpupilot_run_trainer_attached",
        "1 when the run's trainer is attached over the trainer channel.",
        "gauge",
        &attached,
    );
}

fn knob(t: &TrainerInfo, name: crate::protocol::KnobName) -> Option<f64> {
    t.knobs
        .iter()
        .find(|k| k.knob == name)
        .and_then(|k| k.value)
        .map(|v| v as f64)
}

#[cfg(test)]
mod tests;
