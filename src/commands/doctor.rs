//! `gpupilot doctor [--json]`: is this node fit to train? Driver and CUDA versions, the
//! installed PyTorch's CUDA build against them, persistence mode, power limits below default,
//! thermal slowdown, ECC errors, row remapping, degraded PCIe links, recent XID errors,
//! whether this user may set power caps, whether CUDA runs on every GPU ([`cuda`]: the
//! driver's CUDA library, a context, a kernel and a memory round trip per GPU), and
//! gpupilot's own directories and daemon ([`home`]).
//!
//! It reads NVML directly (the GPUs through the sampler's own `NvmlSource`; a running daemon
//! is asked only for the XIDs it heard, which no one-shot read can), asks the Python that runs
//! training about PyTorch ([`torch`]: `--python` / `GPUPILOT_PYTHON`, default `python3`, with a
//! time limit), and changes nothing: the permission probe sets a GPU's power limit to the value
//! it already has. A broken node is diagnosed, not refused: without NVML the `driver` line
//! says what was tried and what to install ([`driver`]) and every check that needs no NVML
//! still runs. On the simulator (`--source sim`) it checks what a simulated node has and says
//! what it cannot. The verdicts live in [`checks`]; the exit status is 0 (nothing to fix),
//! 1 (warnings) or 2 (a problem).

pub mod checks;
pub mod cuda;
pub mod driver;
pub mod home;
pub mod mig;
pub mod nvlink;
pub mod torch;
pub mod xids;

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use serde::Serialize;

use crate::cli::{DoctorArgs, GlobalArgs, SourceKind};
use crate::config::paths::Paths;
use crate::telemetry::Source as _;
use crate::telemetry::nvml::NvmlSource;
use checks::{Check, Facts, GpuFacts, Permission, Status};
use xids::XidsHeard;

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
        let mut out = if f.simulated {
            "gpupilot doctor: a simulated node (--source sim)\n".to_string()
        } else if f.no_nvml.is_some() {
            "gpupilot doctor: NVML cannot be loaded, so no GPU can be read\n".to_string()
        } else {
            format!(
                "gpupilot doctor: {} GPU{}, driver {}, NVML {}\n",
                f.gpus.len(),
                if f.gpus.len() == 1 { "" } else { "s" },
                f.driver_version.as_deref().unwrap_or("N/A"),
                f.nvml_version.as_deref().unwrap_or("N/A"),
            )
        };
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
        "source" => "source",
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
        "home" => "gpupilot's dirs",
        "daemon" => "gpupilot daemon",
        other => other,
    }
}

/// The command.
pub fn doctor(g: &GlobalArgs, args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let timeout = Duration::from_secs_f64(args.python_timeout.clamp(0.1, 600.0));
    let facts = if g.source == SourceKind::Sim {
        gather_simulated(&args.python, timeout)
    } else {
        gather(g.nvml_lib.as_deref(), &args.python, timeout, !args.no_cuda)
    };
    let report = Report::new(facts);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render_text());
    }
    Ok(ExitCode::from(report.exit_code))
}

/// The facts of a simulated node: PyTorch, gpupilot's directories and daemon; nothing of a
/// driver.
pub fn gather_simulated(python: &str, timeout: Duration) -> Facts {
    let torch = torch::probe(python, timeout);
    let daemon = super::daemon_snapshot();
    Facts {
        simulated: true,
        home: home::gather(&Paths::from_env(), daemon.as_ref()),
        ..no_gpu_facts(torch, "a simulated node has no power limit to set")
    }
}

/// Facts without a GPU to read.
fn no_gpu_facts(torch: checks::Torch, why: &str) -> Facts {
    Facts {
        simulated: false,
        no_nvml: None,
        driver_version: None,
        cuda_driver_version: None,
        nvml_version: None,
        torch,
        gpus: Vec::new(),
        is_root: rustix::process::geteuid().is_root(),
        power_permission: Permission::Unknown { reason: why.into() },
        xids_heard: XidsHeard::default(),
        cuda: cuda::CudaFacts::NotChecked,
        home: home::HomeFacts::default(),
    }
}

/// Read every fact: NVML (through the same source the sampler reads), the permission probe,
/// PyTorch, CUDA (`with_cuda`), gpupilot's directories and daemon. NVML that cannot be loaded
/// is a fact too: the rest is still read.
pub fn gather(lib: Option<&Path>, python: &str, timeout: Duration, with_cuda: bool) -> Facts {
    let cuda = || {
        if with_cuda {
            cuda::gather()
        } else {
            cuda::CudaFacts::NotChecked
        }
    };
    let source = match NvmlSource::open(lib) {
        Ok(s) => s,
        Err(e) => {
            let torch = torch::probe(python, timeout);
            let daemon = super::daemon_snapshot();
            return Facts {
                no_nvml: Some(driver::NoNvml::gather(&e, lib)),
                cuda: cuda(),
                home: home::gather(&Paths::from_env(), daemon.as_ref()),
                ..no_gpu_facts(torch, "NVML cannot be loaded")
            };
        }
    };
    let opened = Instant::now();
    // PyTorch first: the source's XID listener hears whatever comes meanwhile.
    let torch = torch::probe(python, timeout);
    let daemon = super::daemon_snapshot();
    // Only a daemon that reads NVML heard these GPUs' XIDs.
    let nvml_daemon = daemon.as_ref().filter(|s| s.node.source == "nvml");
    if nvml_daemon.is_none() {
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
    let xids_heard = match nvml_daemon {
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
    Facts {
        simulated: false,
        no_nvml: None,
        driver_version: nvml.sys_driver_version().ok(),
        cuda_driver_version: nvml.sys_cuda_driver_version().ok(),
        nvml_version: nvml.sys_nvml_version().ok(),
        torch,
        gpus,
        is_root: rustix::process::geteuid().is_root(),
        power_permission,
        xids_heard,
        cuda: cuda(),
        home: home::gather(&Paths::from_env(), daemon.as_ref()),
    }
}

/// How long doctor listens for XIDs itself when no daemon has listened for it.
const MIN_LISTEN: Duration = Duration::from_secs(1);

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
