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
//! - Labels as dcgm-exporter, in its order: `gpu`, `UUID`, `pci_bus_id`, `device` (`nvidia0`),
//!   `modelName`, `Hostname`, and `DCGM_FI_DRIVER_VERSION` (the driver version from the
//!   snapshot's node facts; absent while it is unknown). dcgm-exporter exports the driver
//!   version as a label on every GPU series, not as a series of its own (its counters file
//!   types the field `label`), and so does this page. The node's label is `Hostname` unless
//!   [`HostnameLabel::Lower`] (`[exporter] hostname_label = "hostname"`) asks for
//!   dcgm-exporter 4.x's `hostname`; every series on the page then carries that spelling.
//! - Types as dcgm-exporter: `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` and the ECC counts are
//!   `counter`s, keeping dcgm-exporter's names without the `_total` suffix.
//! - ECC: `ecc_corrected`/`ecc_uncorrected` (NVML's volatile totals, since the driver
//!   loaded) are `DCGM_FI_DEV_ECC_SBE_VOL_TOTAL`/`_DBE_VOL_TOTAL`, and the aggregate
//!   (lifetime) counts `DCGM_FI_DEV_ECC_SBE_AGG_TOTAL`/`_DBE_AGG_TOTAL`: DCGM reads its
//!   single-/double-bit totals from the same NVML corrected/uncorrected counters. A GPU
//!   without ECC (or without the reading) has no ECC series.
//! - Retired pages (V100 and other GPUs before A100) under DCGM's names and types:
//!   `DCGM_FI_DEV_RETIRED_SBE`/`_DBE` (pages) and `DCGM_FI_DEV_RETIRED_PENDING` (0 or 1, a
//!   counter as dcgm-exporter types it); absent on GPUs that remap rows instead.
//! - Memory and link health as dcgm-exporter's default counters: remapped rows (and
//!   `DCGM_FI_DEV_ROW_REMAP_PENDING`, which DCGM has and its default file leaves out),
//!   memory temperature, reserved framebuffer, encoder/decoder utilization, the PCIe replay
//!   counter, and the PCIe link's generation and width now and at best.
//! - XID errors (`DCGM_FI_DEV_XID_ERRORS` with `err_code`/`err_msg`) and per-process GPU
//!   memory with the process's user, Slurm job, container or pod: see [`health`].
//! - `promtool check metrics` lints two things here that dcgm-exporter's own page draws too:
//!   the camelCase label `modelName` and counters without `_total`. Compatibility with
//!   dcgm-exporter's names wins over that lint; nothing else on the page draws a warning.

mod health;
mod mig;
mod run_energy;

use std::fmt::Write as _;

pub use crate::config::prometheus::HostnameLabel;
use crate::control::status::ControlStatus;
use crate::protocol::{RunInfo, TrainerInfo};
use crate::telemetry::{GpuSample, Snapshot};

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What one `/metrics` page is made of.
pub struct Input<'a> {
    /// The node's name (the `Hostname` or `hostname` label's value).
    pub hostname: &'a str,
    /// Which spelling the node's label has.
    pub hostname_label: HostnameLabel,
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
        kind: "counter",
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
    GpuField {
        name: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        help: "Total number of single-bit volatile ECC errors.",
        kind: "counter",
        value: |g| g.ecc_corrected.map(|v| v as f64),
    },
    GpuField {
        name: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        help: "Total number of double-bit volatile ECC errors.",
        kind: "counter",
        value: |g| g.ecc_uncorrected.map(|v| v as f64),
    },
    GpuField {
        name: "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        help: "Total number of single-bit persistent ECC errors.",
        kind: "counter",
        value: |g| g.ecc_corrected_total.map(|v| v as f64),
    },
    GpuField {
        name: "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        help: "Total number of double-bit persistent ECC errors.",
        kind: "counter",
        value: |g| g.ecc_uncorrected_total.map(|v| v as f64),
    },
    GpuField {
        name: "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        help: "Number of remapped rows for correctable errors.",
        kind: "counter",
        value: |g| g.remapped_rows.map(|r| r.correctable as f64),
    },
    GpuField {
        name: "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        help: "Number of remapped rows for uncorrectable errors.",
        kind: "counter",
        value: |g| g.remapped_rows.map(|r| r.uncorrectable as f64),
    },
    GpuField {
        name: "DCGM_FI_DEV_ROW_REMAP_PENDING",
        help: "Whether remapping of rows is pending (reset the GPU).",
        kind: "gauge",
        value: |g| g.remapped_rows.map(|r| f64::from(u8::from(r.pending))),
    },
    GpuField {
        name: "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        help: "Whether remapping of rows has failed.",
        kind: "gauge",
        value: |g| g.remapped_rows.map(|r| f64::from(u8::from(r.failure))),
    },
    GpuField {
        name: "DCGM_FI_DEV_RETIRED_SBE",
        help: "Total number of retired pages due to single-bit errors.",
        kind: "counter",
        value: |g| g.retired_pages.map(|r| r.single_bit as f64),
    },
    GpuField {
        name: "DCGM_FI_DEV_RETIRED_DBE",
        help: "Total number of retired pages due to double-bit errors.",
        kind: "counter",
        value: |g| g.retired_pages.map(|r| r.double_bit as f64),
    },
    GpuField {
        name: "DCGM_FI_DEV_RETIRED_PENDING",
        help: "Total number of pages pending retirement.",
        kind: "counter",
        value: |g| g.retired_pages.map(|r| f64::from(u8::from(r.pending))),
    },
    GpuField {
        name: "DCGM_FI_DEV_MEMORY_TEMP",
        help: "Memory temperature (in C).",
        kind: "gauge",
        value: |g| g.memory_temp_c,
    },
    GpuField {
        name: "DCGM_FI_DEV_FB_RESERVED",
        help: "Framebuffer memory reserved (in MiB).",
        kind: "gauge",
        value: |g| g.memory_reserved_bytes.map(|b| b as f64 / MIB),
    },
    GpuField {
        name: "DCGM_FI_DEV_ENC_UTIL",
        help: "Encoder utilization (in %).",
        kind: "gauge",
        value: |g| g.enc_util_pct,
    },
    GpuField {
        name: "DCGM_FI_DEV_DEC_UTIL",
        help: "Decoder utilization (in %).",
        kind: "gauge",
        value: |g| g.dec_util_pct,
    },
    GpuField {
        name: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        help: "Total number of PCIe retries.",
        kind: "counter",
        value: |g| g.pcie_replays.map(|v| v as f64),
    },
    // dcgm-exporter's name, type and help (etc/default-counters.csv); DCGM's field 449 is the
    // GPU's NVLink traffic now, both directions, in MB/s, whatever the type says.
    GpuField {
        name: "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        help: "Total number of NVLink bandwidth counters for all lanes",
        kind: "counter",
        value: |g| {
            let n = g.nvlink.as_ref()?;
            Some((n.tx_bytes_s? + n.rx_bytes_s?) / 1e6)
        },
    },
    GpuField {
        name: "DCGM_FI_DEV_PCIE_LINK_GEN",
        help: "PCIe link generation now (it trains down while the GPU idles).",
        kind: "gauge",
        value: |g| g.pcie_gen.map(f64::from),
    },
    GpuField {
        name: "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        help: "PCIe link width now (lanes).",
        kind: "gauge",
        value: |g| g.pcie_width.map(f64::from),
    },
    GpuField {
        name: "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        help: "The best PCIe link generation of the GPU and its slot.",
        kind: "gauge",
        value: |g| g.pcie_gen_max.map(f64::from),
    },
    GpuField {
        name: "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        help: "The widest PCIe link of the GPU and its slot (lanes).",
        kind: "gauge",
        value: |g| g.pcie_width_max.map(f64::from),
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

/// What every series names the node by: the host label and, on GPU series, the driver.
#[derive(Clone, Copy)]
struct Node<'a> {
    /// `Hostname` or `hostname`.
    key: &'static str,
    host: &'a str,
    /// `DCGM_FI_DRIVER_VERSION`, when known.
    driver: Option<&'a str>,
}

impl<'a> Node<'a> {
    fn of(input: &Input<'a>) -> Self {
        Node {
            key: input.hostname_label.name(),
            host: input.hostname,
            driver: input
                .snapshot
                .and_then(|s| s.node.driver_version.as_deref())
                .filter(|d| !d.is_empty()),
        }
    }

    /// `{Hostname="…"}` alone.
    fn only(self) -> String {
        labels(&[(self.key, self.host)])
    }
}

/// The label set of one GPU, dcgm-exporter's names in its order.
fn gpu_labels(g: &GpuSample, node: Node<'_>) -> String {
    let gpu = g.index.to_string();
    let device = format!("nvidia{}", g.index);
    let mut pairs = vec![
        ("gpu", gpu.as_str()),
        ("UUID", g.uuid.as_deref().unwrap_or("")),
        ("pci_bus_id", g.pci_bus_id.as_deref().unwrap_or("")),
        ("device", device.as_str()),
        ("modelName", g.name.as_deref().unwrap_or("")),
        (node.key, node.host),
    ];
    if let Some(d) = node.driver {
        pairs.push(("DCGM_FI_DRIVER_VERSION", d));
    }
    labels(&pairs)
}

/// The whole `/metrics` page.
pub fn render(input: &Input<'_>) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let host = Node::of(input);
    let gpus: &[GpuSample] = input.snapshot.map_or(&[], |s| &s.gpus);
    let current: Vec<&GpuSample> = gpus.iter().filter(|g| !g.lost && !g.stale).collect();
    for f in GPU_FIELDS {
        let samples: Vec<(String, f64)> = current
            .iter()
            .flat_map(|g| {
                let l = gpu_labels(g, host);
                // A GPU in MIG mode: its memory per GPU instance, as dcgm-exporter has it.
                mig::per_instance(f.name, g, &l)
                    .unwrap_or_else(|| (f.value)(g).map(|v| (l, v)).into_iter().collect())
            })
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
    let host_only = host.only();
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

    health::xid_families(&mut out, gpus, host);
    health::process_families(&mut out, &current, host);
    control_families(&mut out, input, gpus);
    run_families(&mut out, input);
    run_energy::families(&mut out, input);
    out
}

/// Governor targets and caps, the node budget.
fn control_families(out: &mut String, input: &Input<'_>, gpus: &[GpuSample]) {
    let host = Node::of(input);
    let Some(control) = input.control else {
        return;
    };
    let label_of = |gpu: u32| -> String {
        match gpus.iter().find(|g| g.index == gpu) {
            Some(g) => gpu_labels(g, host),
            None => labels(&[("gpu", &gpu.to_string()), (host.key, host.host)]),
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
        let l = host.only();
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
    let host = Node::of(input);
    let run_labels = |r: &RunInfo| -> String {
        labels(&[
            ("run", &r.id),
            ("name", &r.name),
            ("gpus", &r.gpus),
            (host.key, host.host),
        ])
    };
    family(
        out,
        "gpupilot_runs_live",
        "Runs the daemon supervises that have not ended.",
        "gauge",
        &[(host.only(), input.runs.len() as f64)],
    );
    type Pick = fn(&TrainerInfo) -> Option<f64>;
    let fields: [(&str, &str, Pick); 9] = [
        (
            "gpupilot_run_samples_per_second",
            "Training throughput of the run (samples per second): a job's, summed over its ranks.",
            |t| t.figures()?.samples_per_s,
        ),
        (
            "gpupilot_run_tokens_per_second",
            "Tokens per second of the run, where it reports them: a job's, summed over its ranks.",
            |t| t.figures()?.tokens_per_s,
        ),
        (
            "gpupilot_run_loss",
            "The newest loss the run reports (a job's rank 0).",
            |t| t.figures()?.loss,
        ),
        (
            "gpupilot_run_step",
            "The newest step the run reports (a job's: its slowest rank's).",
            |t| t.figures()?.step.map(|s| s as f64),
        ),
        (
            "gpupilot_run_step_time_seconds",
            "Time of the newest training step (a job's: its slowest rank's).",
            |t| t.figures()?.step_time_s,
        ),
        (
            "gpupilot_run_data_wait_seconds",
            "Time the newest step waited for data (a job's: its longest wait).",
            |t| t.figures()?.data_wait_s,
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
