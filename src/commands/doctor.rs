//! `gpupilot doctor [--json]`: is this node fit to train? Driver and CUDA versions, the
//! installed PyTorch's CUDA build against them, persistence mode, power limits below default,
//! thermal slowdown, ECC errors, row remapping, degraded PCIe links, recent XID errors,
//! whether this user may set power caps, and whether CUDA runs on every GPU ([`cuda`]: the
//! driver's CUDA library, a context, a kernel and a memory round trip per GPU).
//!
//! It reads NVML directly (the GPUs through the sampler's own `NvmlSource`; a running daemon
//! is asked only for the XIDs it heard, which no one-shot read can), asks the Python that runs training about PyTorch
//! (`GPUPILOT_PYTHON`, default `python3`, with a time limit), and changes nothing: the
//! permission probe sets a GPU's power limit to the value it already has. The verdicts live in
//! [`checks`]; the exit status is 0 (nothing to fix), 1 (warnings) or 2 (a failure).

pub mod checks;
pub mod cuda;
pub mod mig;
pub mod nvlink;
pub mod xids;

use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use serde::Serialize;

use crate::cli::{DoctorArgs, GlobalArgs, SourceKind};
use crate::telemetry::Source as _;
use crate::telemetry::nvml::NvmlSource;
use checks::{Check, Facts, GpuFacts, Permission, Status, Torch};
use xids::XidsHeard;

/// The interpreter asked about PyTorch unless `GPUPILOT_PYTHON` names another.
pub const DEFAULT_PYTHON: &str = "python3";

/// What `python -c` prints: one JSON object.
const TORCH_PROBE: &str = r#"
import json
try:
    import torch
except Exception as e:
    print(json.dumps({"torch": None, "error": str(e)}))
else:
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda}))
"#;

/// The report as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `ok`, `warn` or `fail`: the worst line.
    pub verdict: &'static str,
    pub exit_code: u8,
    pub checks: Vec<Check>,
    pub facts: Facts,
}

impl Report {
    pub fn new(facts: Facts) -> Report {
        let checks = checks::evaluate(&facts);
        let exit_code = checks::exit_code(&checks);
        Report {
            verdict: ["ok", "warn", "fail"][usize::from(exit_code)],
            exit_code,
            checks,
            facts,
        }
    }

    /// One line per check, the status first, then a verdict line.
    pub fn render_text(&self) -> String {
        let f = &self.facts;
        let mut out = format!(
            "gpupilot doctor: {} GPU{}, driver {}, NVML {}\n",
            f.gpus.len(),
            if f.gpus.len() == 1 { "" } else { "s" },
            f.driver_version.as_deref().unwrap_or("N/A"),
            f.nvml_version.as_deref().unwrap_or("N/A"),
        );
        for c in &self.checks {
            out.push_str(&format!(
                "  {:<5} {:<21} {}\n",
                c.status.label(),
                title(&c.name),
                c.detail
            ));
        }
        let count = |s| self.checks.iter().filter(|c| c.status == s).count();
        let (fails, warns) = (count(Status::Fail), count(Status::Warn));
        out.push_str(&match (fails, warns) {
            (0, 0) => "verdict: ok, nothing to fix\n".to_string(),
            (0, w) => format!("verdict: {w} warning{}\n", if w == 1 { "" } else { "s" }),
            (p, w) => format!(
                "verdict: {p} problem{}, {w} warning{}\n",
                if p == 1 { "" } else { "s" },
                if w == 1 { "" } else { "s" }
            ),
        });
        out
    }
}

fn title(name: &str) -> &str {
    match name {
        "driver" => "driver",
        "cuda_driver" => "CUDA (driver)",
        "pytorch" => "PyTorch",
        "cuda" => "CUDA (library)",
        "cuda_gpus" => "CUDA on the GPUs",
        "gpus" => "GPUs",
        "persistence" => "persistence mode",
        "power_limits" => "power limits",
        "thermal" => "thermal",
        "ecc" => "ECC",
        "memory" => "memory rows",
        "pcie" => "PCIe link",
        "nvlink" => "NVLink",
        "xid" => "XID errors",
        "power_cap_permission" => "power-cap permission",
        other => other,
    }
}

/// The command.
pub fn doctor(g: &GlobalArgs, args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    if g.source == SourceKind::Sim {
        anyhow::bail!(
            "doctor checks the real driver through NVML; the simulator has none (drop `--source sim`, or use `--nvml-lib PATH`)"
        );
    }
    let python = std::env::var("GPUPILOT_PYTHON").unwrap_or_else(|_| DEFAULT_PYTHON.into());
    let timeout = Duration::from_secs_f64(args.python_timeout.clamp(0.1, 600.0));
    let mut facts = gather(g.nvml_lib.as_deref(), &python, timeout)?;
    if !args.no_cuda {
        facts.cuda = cuda::gather();
    }
    let report = Report::new(facts);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render_text());
    }
    Ok(ExitCode::from(report.exit_code))
}

/// Read every fact: NVML (through the same source the sampler reads), the permission probe,
/// PyTorch.
pub fn gather(lib: Option<&Path>, python: &str, timeout: Duration) -> anyhow::Result<Facts> {
    let source = NvmlSource::open(lib)?;
    let opened = Instant::now();
    // PyTorch first: the source's XID listener hears whatever comes meanwhile.
    let torch = probe_torch(python, timeout);
    let daemon = daemon_snapshot();
    if daemon.is_none() {
        // Without a daemon only doctor's own listener hears XIDs: give it a moment at least.
        std::thread::sleep(MIN_LISTEN.saturating_sub(opened.elapsed()));
    }
    let mut snap = crate::telemetry::Snapshot {
        gpus: (0..source.gpu_count())
            .map(|i| source.sample_gpu(i))
            .collect(),
        ..Default::default()
    };
    let now_s = crate::telemetry::now_s();
    let xids_heard = match &daemon {
        Some(d) => {
            crate::status::merge_xids(&mut snap, d);
            XidsHeard::Daemon { now_s }
        }
        None => XidsHeard::Doctor {
            now_s,
            listened_s: opened.elapsed().as_secs_f64(),
        },
    };
    let gpus: Vec<GpuFacts> = snap.gpus.iter().map(GpuFacts::from).collect();
    let nvml = source.nvml();
    let power_permission = probe_power_permission(nvml, &gpus);
    Ok(Facts {
        driver_version: nvml.sys_driver_version().ok(),
        cuda_driver_version: nvml.sys_cuda_driver_version().ok(),
        nvml_version: nvml.sys_nvml_version().ok(),
        torch,
        gpus,
        is_root: rustix::process::geteuid().is_root(),
        power_permission,
        xids_heard,
        cuda: cuda::CudaFacts::NotChecked,
    })
}

/// How long doctor listens for XIDs itself when no daemon has listened for it.
const MIN_LISTEN: Duration = Duration::from_secs(1);

/// The running daemon's newest snapshot (its XIDs, heard since it started), if one answers
/// and reads NVML (a daemon on the simulator has no XIDs of these GPUs).
fn daemon_snapshot() -> Option<crate::telemetry::Snapshot> {
    super::daemon_snapshot().filter(|s| s.node.source == "nvml")
}

/// Set the first readable GPU's power limit to what it already is: NVML answers as it would
/// for a real change (NO_PERMISSION for users who are not root), and nothing changes.
fn probe_power_permission(nvml: &Nvml, gpus: &[GpuFacts]) -> Permission {
    let Some(g) = gpus.iter().find(|g| !g.lost) else {
        return Permission::Unknown {
            reason: "no GPU answers".into(),
        };
    };
    let mut dev = match nvml.device_by_index(g.index) {
        Ok(d) => d,
        Err(e) => {
            return Permission::Unknown {
                reason: e.to_string(),
            };
        }
    };
    let current = match dev.power_management_limit() {
        Ok(mw) if mw > 0 => mw,
        Ok(_) | Err(NvmlError::NotSupported) => return Permission::NotSupported,
        Err(e) => {
            return Permission::Unknown {
                reason: format!("reading GPU {}'s power limit: {e}", g.index),
            };
        }
    };
    match dev.set_power_management_limit(current) {
        Ok(()) => Permission::Allowed,
        Err(NvmlError::NoPermission) => Permission::Denied,
        Err(NvmlError::NotSupported) => Permission::NotSupported,
        Err(e) => Permission::Unknown {
            reason: e.to_string(),
        },
    }
}

/// Ask `python` which PyTorch it has, within `timeout`.
pub fn probe_torch(python: &str, timeout: Duration) -> Torch {
    let no_python = |error: String| Torch::NoPython {
        python: python.to_string(),
        error,
    };
    let mut child = match Command::new(python)
        .args(["-c", TORCH_PROBE])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return no_python(e.to_string()),
    };
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return no_python(format!("no answer within {:.0} s", timeout.as_secs_f64()));
            }
            Err(e) => return no_python(e.to_string()),
        }
    };
    let mut text = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut text);
    }
    if !status.success() {
        return no_python(format!("it exited with {status}"));
    }
    let Some(v) = text
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    else {
        return no_python(format!("unexpected answer {:?}", text.trim()));
    };
    let python = python.to_string();
    match (v["torch"].as_str(), v["cuda"].as_str()) {
        (None, _) => Torch::NotInstalled { python },
        (Some(version), None) => Torch::CpuOnly {
            python,
            version: version.to_string(),
        },
        (Some(version), Some(cuda)) => Torch::Cuda {
            python,
            version: version.to_string(),
            cuda: cuda.to_string(),
        },
    }
}
