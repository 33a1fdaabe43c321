//! The verdicts of `gpupilot doctor`, from facts already gathered. Pure, so every line of the
//! report is tested on constructed facts.
//!
//! CUDA compatibility follows NVIDIA's CUDA Toolkit release notes ("CUDA Driver" tables):
//! a driver runs every CUDA release up to the version it reports
//! (`nvmlSystemGetCudaDriverVersion`); an application built for a newer *minor* release of the
//! same major one still runs through minor-version compatibility when the driver is at least
//! the minimum below (Linux), except for features that need the newer driver (kernels shipped
//! only as PTX for the newer release, some new APIs); a newer *major* release needs a newer
//! driver.

use serde::{Deserialize, Serialize};

use super::cuda::CudaFacts;
use super::driver::NoNvml;
use super::home::HomeFacts;
pub use super::torch::Torch;
use super::xids::{XidsHeard, xid_check};
use crate::telemetry::xid::XidEvent;
use crate::telemetry::{GpuSample, RemappedRows, RetiredPages};

/// Minimum Linux driver for CUDA minor-version compatibility, per CUDA major release
/// (NVIDIA CUDA Toolkit release notes, "CUDA Toolkit and Minimum Required Driver Version for
/// CUDA Minor Version Compatibility").
pub const MINOR_COMPAT_MIN_DRIVER: &[(u32, &str)] = &[(11, "450.80.02"), (12, "525.60.13")];

/// How a line of the report stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// A fact, neither good nor bad (no PyTorch installed, say).
    Info,
    Warn,
    Fail,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Info => "info",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// Stable id for scripts: `source`, `driver`, `cuda_driver`, `pytorch`, `cuda`, `cuda_gpus`,
    /// `gpus`, `persistence`, `power_limits`, `thermal`, `ecc`, `memory`, `pcie`, `nvlink`,
    /// `mig`, `xid`, `power_cap_permission`, `home`, `daemon`.
    pub name: String,
    pub status: Status,
    pub detail: String,
}

/// One GPU's facts. Absent: the driver does not report it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuFacts {
    pub index: u32,
    pub name: Option<String>,
    pub lost: bool,
    pub persistence: Option<bool>,
    pub power_limit_w: Option<f64>,
    pub power_default_w: Option<f64>,
    pub throttle_reasons: Option<u64>,
    pub temperature_c: Option<f64>,
    pub temp_slowdown_c: Option<f64>,
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    #[serde(default)]
    pub remapped_rows: Option<RemappedRows>,
    /// Page retirement (GPUs before A100, which retire pages instead of remapping rows).
    #[serde(default)]
    pub retired_pages: Option<RetiredPages>,
    /// The PCIe link now and at best, and whether the GPU is working (an idle GPU trains its
    /// link down, which is no fault).
    #[serde(default)]
    pub pcie_gen: Option<u32>,
    #[serde(default)]
    pub pcie_width: Option<u32>,
    #[serde(default)]
    pub pcie_gen_max: Option<u32>,
    #[serde(default)]
    pub pcie_width_max: Option<u32>,
    #[serde(default)]
    pub pcie_replays: Option<u64>,
    #[serde(default)]
    pub busy: bool,
    /// The XIDs heard (most recent last) and since when; absent where nobody listens.
    #[serde(default)]
    pub xids: Option<Vec<XidEvent>>,
    #[serde(default)]
    pub xid_since_s: Option<f64>,
    /// NVLink state now (GPUs with NVLink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<crate::telemetry::nvlink::NvLinkSample>,
    /// MIG mode and instances; absent on a GPU without MIG.
    #[serde(default)]
    pub mig: Option<crate::telemetry::mig::MigState>,
}

impl From<&GpuSample> for GpuFacts {
    fn from(s: &GpuSample) -> GpuFacts {
        if s.lost {
            return GpuFacts {
                index: s.index,
                name: s.name.clone(),
                lost: true,
                // A lost GPU's XIDs say why it went.
                xids: s.xids.clone(),
                xid_since_s: s.xid_since_s,
                ..GpuFacts::default()
            };
        }
        GpuFacts {
            index: s.index,
            name: s.name.clone(),
            lost: false,
            persistence: s.persistence,
            power_limit_w: s.power_limit_w,
            power_default_w: s.power_default_w,
            throttle_reasons: s.throttle_reasons,
            temperature_c: s.temperature_c,
            temp_slowdown_c: s.temp_slowdown_c,
            ecc_corrected: s.ecc_corrected,
            ecc_uncorrected: s.ecc_uncorrected,
            remapped_rows: s.remapped_rows,
            retired_pages: s.retired_pages,
            pcie_gen: s.pcie_gen,
            pcie_width: s.pcie_width,
            pcie_gen_max: s.pcie_gen_max,
            pcie_width_max: s.pcie_width_max,
            pcie_replays: s.pcie_replays,
            // P-states 0–2 are a GPU at work; an idle one sits at P8 with its link at Gen1.
            busy: s.pstate.is_some_and(|p| p <= 2) || s.util_gpu_pct.is_some_and(|u| u > 0.0),
            xids: s.xids.clone(),
            xid_since_s: s.xid_since_s,
            nvlink: s.nvlink.clone(),
            mig: s.mig.clone(),
        }
    }
}

/// Whether this user may change power caps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Permission {
    /// NVML accepted a power-limit change (the current limit set again).
    Allowed,
    Denied,
    NotSupported,
    /// The probe could not be made (no GPU answered, another error).
    Unknown {
        reason: String,
    },
}

/// Everything the report is made from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Facts {
    /// The node is gpupilot's simulator (`--source sim`): no driver to check.
    #[serde(default)]
    pub simulated: bool,
    /// Why NVML could not be used on a real node; absent where it loaded (or on the simulator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_nvml: Option<NoNvml>,
    pub driver_version: Option<String>,
    /// As NVML reports it: `major * 1000 + minor * 10`.
    pub cuda_driver_version: Option<i32>,
    pub nvml_version: Option<String>,
    pub torch: Torch,
    pub gpus: Vec<GpuFacts>,
    pub is_root: bool,
    pub power_permission: Permission,
    /// Who listened for the XIDs in `gpus`, and when the report was made.
    #[serde(default)]
    pub xids_heard: XidsHeard,
    /// The CUDA library and each GPU's context, kernel and memory round trip.
    #[serde(default)]
    pub cuda: CudaFacts,
    /// gpupilot's directories and daemon.
    #[serde(default)]
    pub home: HomeFacts,
}

/// `"550.54.15"` → `[550, 54, 15]`; `None` if any part is not a number.
pub fn parse_version(v: &str) -> Option<Vec<u32>> {
    v.trim().split('.').map(|p| p.parse().ok()).collect()
}

/// `"12.1"` → `(12, 1)`.
pub fn parse_cuda(v: &str) -> Option<(u32, u32)> {
    let mut it = v.trim().split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

/// NVML's integer (12040) → `(12, 4)`.
pub fn cuda_from_nvml(v: i32) -> (u32, u32) {
    let v = v.max(0) as u32;
    (v / 1000, (v % 1000) / 10)
}

/// Can a driver (`driver`, running CUDA up to `driver_cuda`) run code built for `built`?
pub fn cuda_verdict(driver: &str, driver_cuda: (u32, u32), built: (u32, u32)) -> (Status, String) {
    let (dm, dn) = driver_cuda;
    let (bm, bn) = built;
    if built <= driver_cuda {
        return (
            Status::Ok,
            format!("compatible: the driver runs CUDA up to {dm}.{dn}"),
        );
    }
    let min = MINOR_COMPAT_MIN_DRIVER
        .iter()
        .find(|(m, _)| *m == bm)
        .map(|(_, v)| *v);
    let newer = format!("install a driver that supports CUDA {bm}.{bn}");
    if bm > dm {
        let need = min.map_or(String::new(), |v| format!(" (≥ {v} on Linux)"));
        return (
            Status::Fail,
            format!(
                "incompatible: built for CUDA {bm}.{bn}, which needs a CUDA {bm} driver{need}; driver {driver} runs CUDA {dm}.{dn} at most: {newer}, or a build for CUDA {dm}.x"
            ),
        );
    }
    match (min, parse_version(driver), min.and_then(parse_version)) {
        (Some(v), Some(have), Some(need)) if have >= need => (
            Status::Warn,
            format!(
                "works through CUDA minor-version compatibility (built for {bm}.{bn}, the driver runs {dm}.{dn}; {bm}.x needs ≥ {v}): kernels shipped only as PTX for {bm}.{bn} and the newest APIs fail; {newer}"
            ),
        ),
        (Some(v), Some(_), _) => (
            Status::Fail,
            format!(
                "incompatible: built for CUDA {bm}.{bn}; driver {driver} runs CUDA {dm}.{dn} and is below {v}, the minimum for CUDA {bm}.x: {newer}"
            ),
        ),
        (Some(v), None, _) => (
            Status::Warn,
            format!(
                "built for CUDA {bm}.{bn}, newer than the {dm}.{dn} the driver runs; it runs through minor-version compatibility only on a driver ≥ {v}, and driver {driver} cannot be compared: {newer}"
            ),
        ),
        (None, ..) => (
            Status::Warn,
            format!(
                "built for CUDA {bm}.{bn}, newer than the {dm}.{dn} the driver runs, and no minor-version compatibility minimum is known for CUDA {bm}: {newer}"
            ),
        ),
    }
}

fn list(ids: &[u32]) -> String {
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn check(name: &str, status: Status, detail: String) -> Check {
    Check {
        name: name.to_string(),
        status,
        detail,
    }
}

/// What a simulated node cannot have checked, said on its `source` line.
pub const NOT_ON_THE_SIMULATOR: &str = "the driver and its CUDA version, libcuda and a kernel on each GPU, clocks and thermal slowdown, ECC and memory rows, PCIe and NVLink, XIDs, persistence mode and power-cap permission";

/// Every line of the report, in order.
pub fn evaluate(f: &Facts) -> Vec<Check> {
    let mut out = Vec::new();
    if f.simulated {
        out.push(check(
            "source",
            Status::Info,
            format!(
                "a simulated node (--source sim): checked here are PyTorch, gpupilot's directories and its daemon; not {NOT_ON_THE_SIMULATOR}, which need a real GPU (run doctor without --source sim on the GPU node)"
            ),
        ));
        out.push(super::torch::check(
            &f.torch,
            super::torch::Against {
                simulated: true,
                gpus: None,
                driver: None,
                driver_cuda: None,
            },
        ));
        out.extend(super::home::checks(&f.home));
        return out;
    }
    let nvml_cuda = f.cuda_driver_version.map(cuda_from_nvml);
    let gpus = f.no_nvml.is_none().then_some(f.gpus.len());
    match &f.no_nvml {
        Some(n) => out.push(super::driver::check(n)),
        None => {
            out.push(match &f.driver_version {
                Some(v) => check("driver", Status::Ok, format!("NVIDIA driver {v}")),
                None => check(
                    "driver",
                    Status::Warn,
                    "NVML did not report the driver version".into(),
                ),
            });
            out.push(match nvml_cuda {
                Some((m, n)) => check(
                    "cuda_driver",
                    Status::Ok,
                    format!("CUDA {m}.{n}: the newest CUDA this driver runs"),
                ),
                None => check(
                    "cuda_driver",
                    Status::Warn,
                    "NVML did not report the CUDA version the driver supports".into(),
                ),
            });
        }
    }
    // The driver's CUDA as NVML says it, else as libcuda does.
    let libcuda = match &f.cuda {
        CudaFacts::Present { driver_version, .. } => Some(cuda_from_nvml(*driver_version)),
        _ => None,
    };
    out.push(super::torch::check(
        &f.torch,
        super::torch::Against {
            simulated: false,
            gpus,
            driver: f.driver_version.as_deref(),
            driver_cuda: nvml_cuda.or(libcuda),
        },
    ));
    out.extend(super::cuda::checks(&f.cuda, gpus, nvml_cuda));
    if f.no_nvml.is_some() {
        out.push(check(
            "gpus",
            Status::Info,
            "not checked without NVML: the GPUs, persistence mode, power limits, thermal slowdown, ECC, memory rows, PCIe, NVLink, MIG, XIDs and power-cap permission".into(),
        ));
        out.extend(super::home::checks(&f.home));
        return out;
    }

    let live: Vec<&GpuFacts> = f.gpus.iter().filter(|g| !g.lost).collect();
    let lost: Vec<u32> = f.gpus.iter().filter(|g| g.lost).map(|g| g.index).collect();
    out.push(if lost.is_empty() {
        check("gpus", Status::Ok, format!("{} GPUs answer", f.gpus.len()))
    } else {
        check(
            "gpus",
            Status::Fail,
            format!(
                "GPU {} fell off the bus (GPU is lost): check `dmesg` for Xid errors; it needs a reset or a reboot",
                list(&lost)
            ),
        )
    });

    let off: Vec<u32> = live
        .iter()
        .filter(|g| g.persistence == Some(false))
        .map(|g| g.index)
        .collect();
    out.push(if off.is_empty() {
        check(
            "persistence",
            Status::Ok,
            "persistence mode on (or not reported) on every GPU".into(),
        )
    } else {
        check(
            "persistence",
            Status::Warn,
            format!(
                "persistence mode off on GPU {}: the driver tears down between jobs, so each start is slower and settings may be lost; `sudo nvidia-smi -pm 1` (or nvidia-persistenced)",
                list(&off)
            ),
        )
    });

    let low: Vec<String> = live
        .iter()
        .filter_map(|g| {
            let (l, d) = (g.power_limit_w?, g.power_default_w?);
            (l < d - 0.5).then(|| format!("GPU {} at {l:.0} W of {d:.0} W", g.index))
        })
        .collect();
    out.push(if low.is_empty() {
        check(
            "power_limits",
            Status::Ok,
            "no power limit below its default".into(),
        )
    } else {
        check(
            "power_limits",
            Status::Warn,
            format!(
                "power limit below the default: {} (intended? `gpupilot power cap WATTS --gpu I` sets it back)",
                low.join(", ")
            ),
        )
    });

    let thermal_bits = crate::telemetry::throttle::SW_THERMAL_SLOWDOWN
        | crate::telemetry::throttle::HW_THERMAL_SLOWDOWN;
    let hot: Vec<String> = live
        .iter()
        .filter(|g| g.throttle_reasons.is_some_and(|r| r & thermal_bits != 0))
        .map(|g| match (g.temperature_c, g.temp_slowdown_c) {
            (Some(t), Some(s)) => format!("GPU {} at {t:.0} C (slowdown {s:.0} C)", g.index),
            _ => format!("GPU {}", g.index),
        })
        .collect();
    out.push(if hot.is_empty() {
        check(
            "thermal",
            Status::Ok,
            "no GPU in thermal slowdown".into(),
        )
    } else {
        check(
            "thermal",
            Status::Warn,
            format!(
                "thermal slowdown now: {}: check airflow and fans, or hold a target with `gpupilot thermal target`",
                hot.join(", ")
            ),
        )
    });

    let unc: Vec<String> = live
        .iter()
        .filter(|g| g.ecc_uncorrected.is_some_and(|n| n > 0))
        .map(|g| format!("GPU {}: {}", g.index, g.ecc_uncorrected.unwrap_or(0)))
        .collect();
    let cor: Vec<String> = live
        .iter()
        .filter(|g| g.ecc_corrected.is_some_and(|n| n > 0))
        .map(|g| format!("GPU {}: {}", g.index, g.ecc_corrected.unwrap_or(0)))
        .collect();
    let reported = live
        .iter()
        .any(|g| g.ecc_corrected.is_some() || g.ecc_uncorrected.is_some());
    out.push(if !unc.is_empty() {
        check(
            "ecc",
            Status::Fail,
            format!(
                "uncorrected ECC errors since the driver loaded ({}): results on that GPU may be wrong; drain it and check `nvidia-smi -q -d ECC,PAGE_RETIREMENT`",
                unc.join(", ")
            ),
        )
    } else if !cor.is_empty() {
        check(
            "ecc",
            Status::Warn,
            format!(
                "corrected ECC errors ({}): harmless alone, a sign of wear if they grow",
                cor.join(", ")
            ),
        )
    } else if reported {
        check("ecc", Status::Ok, "no ECC errors".into())
    } else {
        check(
            "ecc",
            Status::Info,
            "ECC is not reported (consumer GPUs have none)".into(),
        )
    });

    out.push(memory_check(&live));
    out.push(pcie_check(&live));
    out.extend(super::nvlink::nvlink_check(&live));
    out.extend(super::mig::mig_check(&live));
    out.push(xid_check(&f.gpus, &f.xids_heard));
    out.push(permission_check(&f.power_permission, f.is_root));
    out.extend(super::home::checks(&f.home));
    out
}

/// The indices of the GPUs whose `field` is there and `pick` holds for it.
fn gpus_where<T>(
    live: &[&GpuFacts],
    field: impl Fn(&GpuFacts) -> Option<T>,
    pick: fn(&T) -> bool,
) -> Vec<u32> {
    live.iter()
        .filter(|g| field(g).as_ref().is_some_and(pick))
        .map(|g| g.index)
        .collect()
}

/// Row remapping (A100 on) and page retirement (before A100): a failed remap or a board that
/// retired too many pages means replace, a pending remap or retirement means reset when idle.
fn memory_check(live: &[&GpuFacts]) -> Check {
    // The GPUs whose remapped rows, or retired pages, `pick` holds for.
    let remap = |pick: fn(&RemappedRows) -> bool| gpus_where(live, |g| g.remapped_rows, pick);
    let retire = |pick: fn(&RetiredPages) -> bool| gpus_where(live, |g| g.retired_pages, pick);
    let failed = remap(|r| r.failure);
    let worn = retire(RetiredPages::should_replace);
    let pending = remap(|r| r.pending);
    let retire_pending = retire(|r| r.pending);
    let counts: Vec<String> = live
        .iter()
        .filter_map(|g| {
            if let Some(r) = g
                .remapped_rows
                .filter(|r| r.correctable + r.uncorrectable > 0)
            {
                return Some(format!(
                    "GPU {}: {} + {} rows",
                    g.index, r.correctable, r.uncorrectable
                ));
            }
            let p = g.retired_pages.filter(|p| p.total() > 0)?;
            Some(format!(
                "GPU {}: {} single-bit + {} double-bit pages retired",
                g.index, p.single_bit, p.double_bit
            ))
        })
        .collect();
    let mut fail = Vec::new();
    if !failed.is_empty() {
        fail.push(format!(
            "row remapping failed on GPU {}: its memory has no spare rows left where it needs them",
            list(&failed)
        ));
    }
    if !worn.is_empty() {
        let pages: Vec<String> = live
            .iter()
            .filter(|g| worn.contains(&g.index))
            .filter_map(|g| {
                let p = g.retired_pages?;
                Some(format!(
                    "{} single-bit + {} double-bit",
                    p.single_bit, p.double_bit
                ))
            })
            .collect();
        fail.push(format!(
            "GPU {} retired too many pages of memory ({}; at {} in all or {} double-bit the \
             board is failing)",
            list(&worn),
            pages.join(", "),
            RetiredPages::REPLACE_TOTAL,
            RetiredPages::REPLACE_DBE
        ));
    }
    let mut warn = Vec::new();
    if !pending.is_empty() {
        warn.push(format!(
            "a row remap waits for a GPU reset on GPU {}",
            list(&pending)
        ));
    }
    if !retire_pending.is_empty() {
        warn.push(format!(
            "a page retirement waits for a GPU reset on GPU {}",
            list(&retire_pending)
        ));
    }
    if !fail.is_empty() {
        check(
            "memory",
            Status::Fail,
            format!("{}; drain it and have it replaced", fail.join("; ")),
        )
    } else if !warn.is_empty() {
        check(
            "memory",
            Status::Warn,
            format!(
                "{}: until then the bad memory stays in use; reset it when idle \
                 (`nvidia-smi -r -i N`, or drain and reboot)",
                warn.join("; ")
            ),
        )
    } else if !counts.is_empty() {
        check(
            "memory",
            Status::Ok,
            format!(
                "rows remapped or pages retired ({}): normal in small numbers",
                counts.join(", ")
            ),
        )
    } else if live
        .iter()
        .any(|g| g.remapped_rows.is_some() || g.retired_pages.is_some())
    {
        check(
            "memory",
            Status::Ok,
            "no remapped rows or retired pages".into(),
        )
    } else {
        check(
            "memory",
            Status::Info,
            "row remapping and page retirement are not reported (consumer GPUs have neither)"
                .into(),
        )
    }
}

/// A working GPU whose link runs below its best: a classic cause of a slow rank.
fn pcie_check(live: &[&GpuFacts]) -> Check {
    let degraded: Vec<String> = live
        .iter()
        .filter(|g| g.busy)
        .filter_map(|g| {
            let (now_gen, now_width) = (g.pcie_gen?, g.pcie_width?);
            let (max_gen, max_width) = (g.pcie_gen_max?, g.pcie_width_max?);
            (now_gen < max_gen || now_width < max_width).then(|| {
                format!(
                    "GPU {} runs at Gen{now_gen} x{now_width}, it can do Gen{max_gen} x{max_width}",
                    g.index
                )
            })
        })
        .collect();
    let replays: Vec<String> = live
        .iter()
        .filter(|g| g.pcie_replays.is_some_and(|n| n > 0))
        .map(|g| format!("GPU {}: {}", g.index, g.pcie_replays.unwrap_or(0)))
        .collect();
    let replay_note = if replays.is_empty() {
        String::new()
    } else {
        format!(
            "; PCIe replays since the driver loaded ({}): a count that keeps climbing is a bad link",
            replays.join(", ")
        )
    };
    if !degraded.is_empty() {
        check(
            "pcie",
            Status::Warn,
            format!(
                "{}: reseat the GPU or check its riser and slot{replay_note}",
                degraded.join("; ")
            ),
        )
    } else if live.iter().any(|g| g.pcie_gen_max.is_some()) {
        check(
            "pcie",
            Status::Ok,
            format!("every working GPU's link runs at its best{replay_note}"),
        )
    } else {
        check(
            "pcie",
            Status::Info,
            "PCIe link speed is not reported".into(),
        )
    }
}

fn permission_check(p: &Permission, root: bool) -> Check {
    let who = if root { "root" } else { "this user" };
    match p {
        Permission::Allowed => check(
            "power_cap_permission",
            Status::Ok,
            format!("{who} can set power caps (NVML accepted the current limit set again)"),
        ),
        Permission::Denied => check(
            "power_cap_permission",
            Status::Warn,
            "this user cannot set power caps (NVML's setters need root): start a root daemon, `sudo gpupilot daemon --detach`, and use it for power and thermal control".into(),
        ),
        Permission::NotSupported => check(
            "power_cap_permission",
            Status::Info,
            "these GPUs do not support setting a power cap".into(),
        ),
        Permission::Unknown { reason } => check(
            "power_cap_permission",
            Status::Info,
            format!("could not tell whether {who} can set power caps: {reason}"),
        ),
    }
}

/// 0: nothing to fix; 1: warnings only; 2: at least one failure.
pub fn exit_code(checks: &[Check]) -> u8 {
    match checks.iter().map(|c| c.status).max() {
        Some(Status::Fail) => 2,
        Some(Status::Warn) => 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Facts {
        Facts {
            simulated: false,
            no_nvml: None,
            driver_version: Some("550.54.15".into()),
            cuda_driver_version: Some(12040),
            nvml_version: Some("12.550.54.15".into()),
            torch: Torch::Cuda {
                python: "python3".into(),
                version: "2.3.1".into(),
                cuda: "12.1".into(),
                available: Some(true),
            },
            gpus: (0..2)
                .map(|i| GpuFacts {
                    index: i,
                    name: Some("NVIDIA H100 80GB HBM3".into()),
                    persistence: Some(true),
                    power_limit_w: Some(700.0),
                    power_default_w: Some(700.0),
                    throttle_reasons: Some(0),
                    temperature_c: Some(60.0),
                    temp_slowdown_c: Some(87.0),
                    ecc_corrected: Some(0),
                    ecc_uncorrected: Some(0),
                    remapped_rows: Some(RemappedRows::default()),
                    pcie_gen: Some(5),
                    pcie_width: Some(16),
                    pcie_gen_max: Some(5),
                    pcie_width_max: Some(16),
                    pcie_replays: Some(0),
                    busy: true,
                    xids: Some(vec![]),
                    xid_since_s: Some(10.0),
                    ..GpuFacts::default()
                })
                .collect(),
            is_root: false,
            power_permission: Permission::Allowed,
            xids_heard: XidsHeard::Daemon { now_s: 1000.0 },
            cuda: CudaFacts::Present {
                driver_version: 12040,
                devices: (0..2)
                    .map(|gpu| crate::cuda::DeviceCheck {
                        gpu,
                        name: Some("NVIDIA H100 80GB HBM3".into()),
                        pci_bus_id: None,
                        compute_capability: Some("9.0".into()),
                        context: crate::cuda::Step::Ok,
                        kernel: crate::cuda::Step::Ok,
                        memory_round_trip: crate::cuda::Step::Ok,
                    })
                    .collect(),
            },
            home: HomeFacts {
                dirs: ["config", "state", "runtime"]
                    .into_iter()
                    .map(|role| super::super::home::DirFacts {
                        role: role.into(),
                        path: format!("/home/u/{role}"),
                        found: super::super::home::Found::Fine,
                    })
                    .collect(),
                daemon: Some(super::super::home::DaemonSeen {
                    source: "nvml".into(),
                    gpus: 2,
                }),
            },
        }
    }

    fn status_of(f: &Facts, name: &str) -> (Status, String) {
        let c = evaluate(f).into_iter().find(|c| c.name == name).unwrap();
        (c.status, c.detail)
    }

    #[test]
    fn the_cuda_table_decides_compatibility() {
        // Older or equal: fine.
        assert_eq!(cuda_verdict("550.54.15", (12, 4), (12, 1)).0, Status::Ok);
        assert_eq!(cuda_verdict("550.54.15", (12, 4), (12, 4)).0, Status::Ok);
        assert_eq!(cuda_verdict("550.54.15", (12, 4), (11, 8)).0, Status::Ok);
        // Newer minor, driver above the 12.x minimum: minor-version compatibility.
        let (s, why) = cuda_verdict("535.54.03", (12, 2), (12, 4));
        assert_eq!(s, Status::Warn, "{why}");
        assert!(why.contains("525.60.13"), "{why}");
        // The same for 11.x.
        assert_eq!(cuda_verdict("470.57.02", (11, 4), (11, 8)).0, Status::Warn);
        assert_eq!(cuda_verdict("450.80.01", (11, 0), (11, 1)).0, Status::Fail);
        assert_eq!(cuda_verdict("450.80.02", (11, 0), (11, 1)).0, Status::Warn);
        // Newer major: needs a newer driver.
        let (s, why) = cuda_verdict("470.57.02", (11, 4), (12, 1));
        assert_eq!(s, Status::Fail);
        assert!(why.contains("≥ 525.60.13") && why.contains("11.4"), "{why}");
        // A major with no known minimum: a warning that says so.
        assert_eq!(cuda_verdict("999.1", (13, 0), (13, 2)).0, Status::Warn);
    }

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version("550.54.15"), Some(vec![550, 54, 15]));
        assert_eq!(parse_version("550.x"), None);
        assert_eq!(parse_cuda("12.1"), Some((12, 1)));
        assert_eq!(parse_cuda("12"), Some((12, 0)));
        assert_eq!(parse_cuda("twelve"), None);
        assert_eq!(cuda_from_nvml(12040), (12, 4));
        assert_eq!(cuda_from_nvml(11080), (11, 8));
    }

    #[test]
    fn a_healthy_node_passes_every_check() {
        let checks = evaluate(&healthy());
        assert!(
            checks
                .iter()
                .all(|c| c.status == Status::Ok || c.name == "daemon"),
            "{checks:#?}"
        );
        assert_eq!(exit_code(&checks), 0);
        let names: Vec<&str> = checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "driver",
                "cuda_driver",
                "pytorch",
                "cuda",
                "cuda_gpus",
                "gpus",
                "persistence",
                "power_limits",
                "thermal",
                "ecc",
                "memory",
                "pcie",
                "xid",
                "power_cap_permission",
                "home",
                "daemon"
            ]
        );
    }

    #[test]
    fn each_problem_shows_on_its_line() {
        let mut f = healthy();
        f.gpus[1].persistence = Some(false);
        assert_eq!(status_of(&f, "persistence").0, Status::Warn);
        assert!(status_of(&f, "persistence").1.contains("GPU 1"));

        let mut f = healthy();
        f.gpus[0].power_limit_w = Some(500.0);
        let (s, d) = status_of(&f, "power_limits");
        assert_eq!(s, Status::Warn);
        assert!(d.contains("GPU 0 at 500 W of 700 W"), "{d}");

        let mut f = healthy();
        f.gpus[1].throttle_reasons = Some(crate::telemetry::throttle::HW_THERMAL_SLOWDOWN);
        f.gpus[1].temperature_c = Some(88.0);
        let (s, d) = status_of(&f, "thermal");
        assert_eq!(s, Status::Warn);
        assert!(d.contains("GPU 1 at 88 C (slowdown 87 C)"), "{d}");
        // A power-cap throttle is not thermal.
        let mut f = healthy();
        f.gpus[1].throttle_reasons = Some(crate::telemetry::throttle::SW_POWER_CAP);
        assert_eq!(status_of(&f, "thermal").0, Status::Ok);

        let mut f = healthy();
        f.gpus[0].ecc_corrected = Some(4);
        assert_eq!(status_of(&f, "ecc").0, Status::Warn);
        f.gpus[1].ecc_uncorrected = Some(1);
        let checks = evaluate(&f);
        assert_eq!(status_of(&f, "ecc").0, Status::Fail);
        assert_eq!(exit_code(&checks), 2);
        // Not reported at all (consumer parts).
        let mut f = healthy();
        for g in &mut f.gpus {
            g.ecc_corrected = None;
            g.ecc_uncorrected = None;
        }
        assert_eq!(status_of(&f, "ecc").0, Status::Info);

        let mut f = healthy();
        f.gpus[0].lost = true;
        f.gpus[0].persistence = Some(false);
        assert_eq!(status_of(&f, "gpus").0, Status::Fail);
        assert_eq!(
            status_of(&f, "persistence").0,
            Status::Ok,
            "a lost GPU's other values are not current"
        );

        let mut f = healthy();
        f.power_permission = Permission::Denied;
        let (s, d) = status_of(&f, "power_cap_permission");
        assert_eq!(s, Status::Warn);
        assert!(d.contains("sudo gpupilot daemon"), "{d}");
        assert_eq!(exit_code(&evaluate(&f)), 1);
    }

    #[test]
    fn row_remapping_failure_is_a_problem_and_a_pending_remap_a_warning() {
        let mut f = healthy();
        for g in &mut f.gpus {
            g.remapped_rows = None;
        }
        assert_eq!(status_of(&f, "memory").0, Status::Info, "not reported");
        for g in &mut f.gpus {
            g.remapped_rows = Some(RemappedRows::default());
        }
        assert_eq!(
            status_of(&f, "memory"),
            (Status::Ok, "no remapped rows or retired pages".into())
        );
        f.gpus[0].remapped_rows = Some(RemappedRows {
            correctable: 2,
            ..RemappedRows::default()
        });
        let (s, d) = status_of(&f, "memory");
        assert_eq!(s, Status::Ok);
        assert!(d.contains("GPU 0: 2 + 0 rows"), "{d}");
        f.gpus[1].remapped_rows = Some(RemappedRows {
            pending: true,
            ..RemappedRows::default()
        });
        let (s, d) = status_of(&f, "memory");
        assert_eq!(s, Status::Warn);
        assert!(d.contains("GPU 1") && d.contains("nvidia-smi -r"), "{d}");
        assert_eq!(exit_code(&evaluate(&f)), 1);
        f.gpus[0].remapped_rows = Some(RemappedRows {
            failure: true,
            ..RemappedRows::default()
        });
        let (s, d) = status_of(&f, "memory");
        assert_eq!(s, Status::Fail);
        assert!(d.contains("GPU 0") && d.contains("replaced"), "{d}");
        assert_eq!(exit_code(&evaluate(&f)), 2);
    }

    #[test]
    fn retired_pages_pending_is_a_warning_and_many_double_bit_pages_a_problem() {
        let mut f = healthy();
        for g in &mut f.gpus {
            g.remapped_rows = None;
            g.retired_pages = Some(RetiredPages::default());
        }
        assert_eq!(
            status_of(&f, "memory"),
            (Status::Ok, "no remapped rows or retired pages".into())
        );
        f.gpus[1].retired_pages = Some(RetiredPages {
            single_bit: 3,
            double_bit: 2,
            pending: false,
        });
        let (s, d) = status_of(&f, "memory");
        assert_eq!(s, Status::Ok);
        assert!(
            d.contains("GPU 1: 3 single-bit + 2 double-bit pages retired"),
            "{d}"
        );
        f.gpus[1].retired_pages = Some(RetiredPages {
            single_bit: 3,
            double_bit: 2,
            pending: true,
        });
        let (s, d) = status_of(&f, "memory");
        assert_eq!(s, Status::Warn);
        assert!(
            d.contains("page retirement waits for a GPU reset on GPU 1")
                && d.contains("reset it when idle"),
            "{d}"
        );
        assert_eq!(exit_code(&evaluate(&f)), 1);
        f.gpus[0].retired_pages = Some(RetiredPages {
            single_bit: 0,
            double_bit: RetiredPages::REPLACE_DBE,
            pending: false,
        });
        let (s, d) = status_of(&f, "memory");
        assert_eq!(s, Status::Fail);
        assert!(
            d.contains("GPU 0 retired too many pages") && d.contains("replaced"),
            "{d}"
        );
        assert_eq!(exit_code(&evaluate(&f)), 2);
        // Many single-bit pages alone wear the table out too.
        f.gpus[0].retired_pages = Some(RetiredPages {
            single_bit: RetiredPages::REPLACE_TOTAL,
            double_bit: 0,
            pending: false,
        });
        assert_eq!(status_of(&f, "memory").0, Status::Fail);
    }

    #[test]
    fn a_working_gpu_below_its_best_link_is_a_warning_an_idle_one_is_not() {
        let mut f = healthy();
        for g in &mut f.gpus {
            (g.pcie_gen_max, g.pcie_width_max) = (None, None);
        }
        assert_eq!(status_of(&f, "pcie").0, Status::Info, "not reported");
        let mut f = healthy();
        assert_eq!(status_of(&f, "pcie").0, Status::Ok);
        // Idle: the link trains down to Gen1, which is no fault.
        f.gpus[1].pcie_gen = Some(1);
        f.gpus[1].busy = false;
        assert_eq!(status_of(&f, "pcie").0, Status::Ok);
        f.gpus[1].busy = true;
        f.gpus[1].pcie_gen = Some(4);
        f.gpus[1].pcie_width = Some(8);
        f.gpus[1].pcie_replays = Some(40);
        let (s, d) = status_of(&f, "pcie");
        assert_eq!(s, Status::Warn);
        assert!(
            d.contains("GPU 1 runs at Gen4 x8, it can do Gen5 x16"),
            "{d}"
        );
        assert!(d.contains("GPU 1: 40"), "{d}");
    }

    #[test]
    fn without_nvml_the_rest_is_still_checked() {
        let mut f = healthy();
        f.no_nvml = Some(NoNvml {
            reason: "not_found".into(),
            error: "NVML library not found".into(),
            tried: "libnvidia-ml.so.1".into(),
            found_elsewhere: None,
            nvidia_smi: None,
            kernel_module: None,
            distro: None,
            container: false,
        });
        (f.driver_version, f.cuda_driver_version, f.nvml_version) = (None, None, None);
        f.gpus.clear();
        f.cuda = CudaFacts::Missing {
            what: "libcuda.so.1 could not be loaded: not found".into(),
        };
        let checks = evaluate(&f);
        let names: Vec<&str> = checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["driver", "pytorch", "cuda", "gpus", "home", "daemon"]
        );
        assert_eq!(checks[0].status, Status::Fail);
        assert_eq!(exit_code(&checks), 2);
        // PyTorch says which driver it needs; libcuda's absence is the driver's.
        assert_eq!(checks[1].status, Status::Info, "{}", checks[1].detail);
        assert!(
            checks[1].detail.contains("CUDA 12.1 or newer"),
            "{}",
            checks[1].detail
        );
        assert_eq!(checks[2].status, Status::Info, "{}", checks[2].detail);
        assert!(
            checks[2].detail.contains("comes with the driver"),
            "{}",
            checks[2].detail
        );
    }

    #[test]
    fn a_simulated_node_says_what_it_cannot_check() {
        let mut f = healthy();
        f.simulated = true;
        f.cuda = CudaFacts::NotChecked;
        let checks = evaluate(&f);
        let names: Vec<&str> = checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["source", "pytorch", "home", "daemon"]);
        assert_eq!(exit_code(&checks), 0);
        assert!(
            checks[0].detail.contains(NOT_ON_THE_SIMULATOR),
            "{}",
            checks[0].detail
        );
    }

    #[test]
    fn the_cuda_libcuda_speaks_judges_pytorch_when_nvml_does_not_say() {
        let mut f = healthy();
        f.cuda_driver_version = None;
        f.cuda = CudaFacts::Present {
            driver_version: 11040,
            devices: vec![],
        };
        let (s, d) = status_of(&f, "pytorch");
        assert_eq!(s, Status::Fail, "{d}");
        assert!(d.contains("runs CUDA 11.4"), "{d}");
    }

    #[test]
    fn pytorch_lines() {
        let mut f = healthy();
        f.torch = Torch::NotInstalled {
            python: "python3".into(),
        };
        assert_eq!(status_of(&f, "pytorch").0, Status::Info);
        assert_eq!(exit_code(&evaluate(&f)), 0, "no PyTorch is not a problem");
        f.torch = Torch::CpuOnly {
            python: "python3".into(),
            version: "2.3.1+cpu".into(),
        };
        let (s, d) = status_of(&f, "pytorch");
        assert_eq!(s, Status::Fail, "GPUs that PyTorch cannot use");
        assert!(d.contains("for CUDA 12.4 or older"), "{d}");
        f.torch = Torch::Cuda {
            python: "python3".into(),
            version: "2.5.0".into(),
            cuda: "12.4".into(),
            available: None,
        };
        f.driver_version = Some("470.57.02".into());
        f.cuda_driver_version = Some(11040);
        let (s, d) = status_of(&f, "pytorch");
        assert_eq!(s, Status::Fail);
        assert!(
            d.starts_with("PyTorch 2.5.0 built for CUDA 12.4: incompatible"),
            "{d}"
        );
    }
}
