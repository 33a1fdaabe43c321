//! Scenario files: the TOML that defines a simulated node (GPUs, load, versions, processes,
//! faults), parsed strictly and resolved into a [`Scenario`].
//!
//! Every error names the file, line and column (unknown keys included). This module only
//! reads text; it starts no simulation and touches no shared state.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use gpusim::{NodeConfig, TrainingConfig};

use crate::faults::Faults;

pub mod mig;
mod resolve;
#[cfg(test)]
mod tests;

use resolve::{RawScenario, resolve};

/// Most GPUs a scenario may define (handles live in a fixed static array).
pub const MAX_GPUS: usize = 64;
/// Driver version reported when the scenario does not set one.
pub const DEFAULT_DRIVER_VERSION: &str = "550.54.15";
/// CUDA driver version (`major * 1000 + minor * 10`) reported when the scenario does not set one.
pub const DEFAULT_CUDA_DRIVER_VERSION: i32 = 12040;
/// Each second's power off by up to this fraction either way on a GPU with a measured curve
/// and no `measured_noise`: the ±2% of a power meter's repeated readings.
pub const DEFAULT_MEASURED_NOISE: f64 = 0.02;
/// First pid of the default processes: above Linux's largest `pid_max` (2^22), so it is
/// never a real process on this machine.
pub const DEFAULT_PID_BASE: u32 = 4_200_000;

/// A resolved scenario: what the simulated node is and how it misbehaves.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// The file it came from; `None` for the built-in default.
    pub source: Option<PathBuf>,
    /// gpusim's node: GPU ids, ambient, seed, step, and the load every GPU starts with.
    pub node: NodeConfig,
    /// The training each GPU starts with (`None`: idle), after per-GPU overrides.
    pub training: Vec<Option<TrainingConfig>>,
    /// Power limit each GPU starts with, in watts (`None`: the GPU's default).
    pub power_limit_w: Vec<Option<f64>>,
    /// A measured power-limit curve each GPU draws while it trains, and its noise
    /// (`[[per_gpu]] measured_curve`; `None`: the model's power).
    pub measured: Vec<Option<(gpusim::MeasuredCurve, f64)>>,
    /// Persistence mode each GPU starts with (`None`: gpusim's default).
    pub persistence: Vec<Option<bool>>,
    /// ECC error counts each GPU reports (zero unless a scenario says otherwise).
    pub ecc_errors: Vec<EccErrors>,
    /// Row remapping and PCIe link health each GPU reports (healthy unless a scenario says
    /// otherwise).
    pub health: Vec<Health>,
    /// `nvmlSystemGetDriverVersion`.
    pub driver_version: String,
    /// `nvmlSystemGetCudaDriverVersion`, e.g. 12040 for CUDA 12.4.
    pub cuda_driver_version: i32,
    /// Processes to report; `None`: one compute process per busy GPU.
    pub processes: Option<Vec<ScenarioProcess>>,
    /// `[[mig]]`: each GPU's MIG mode and instances (`None`: MIG off, nothing pending).
    pub mig: Vec<Option<mig::MigGpu>>,
    /// Injected faults.
    pub faults: Faults,
    /// Cooling faults (`[[faults]] kind = "cooling"`): physics the node simulates, not NVML
    /// errors.
    pub cooling: Vec<gpusim::CoolingFault>,
    /// `[activity]`: how a busy node's figures move every second (`None`: gpusim's steady
    /// model).
    pub activity: Option<gpusim::Activity>,
    /// `[topology]`: NVLink, PCIe switches and NUMA (`None`: those calls answer NOT_SUPPORTED).
    pub topology: Option<crate::topology::Topology>,
    /// Hash of the scenario text (or of "builtin"): a changed scenario starts a new shared node.
    pub hash: u64,
}

/// ECC error counts a GPU reports, volatile and aggregate alike (the simulated board has
/// not been reset since they happened).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EccErrors {
    pub corrected: u64,
    pub uncorrected: u64,
}

/// A GPU's memory and link health (`[[per_gpu]]` `remapped_*`, `remap_*`, `retired_pages_*`,
/// `pcie_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Health {
    /// Rows remapped after correctable and uncorrectable errors (NVML's REMAPPED_COR/UNC
    /// field values; parts with row remapping only: A100 and later data-centre GPUs).
    pub remapped_correctable: u64,
    pub remapped_uncorrectable: u64,
    /// A remap waits for the next GPU reset.
    pub remap_pending: bool,
    /// A remap failed: the GPU needs replacing.
    pub remap_failure: bool,
    /// The link trained below the board's best (a degraded link): generation and width while
    /// the GPU works; `None` is the board's maximum.
    pub pcie_link_gen: Option<u32>,
    pub pcie_link_width: Option<u32>,
    /// PCIe replays per simulated minute: a bad link's counter climbs.
    pub pcie_replays_per_min: f64,
    /// Pages retired after multiple single-bit and after double-bit ECC errors, and whether a
    /// retirement waits for the next reset (`nvmlDeviceGetRetiredPages*`: data-centre parts
    /// before Ampere, which retire pages instead of remapping rows).
    pub retired_pages_sbe: u32,
    pub retired_pages_dbe: u32,
    pub retired_pages_pending: bool,
}

/// A process a scenario puts on a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioProcess {
    pub gpu: usize,
    pub pid: u32,
    /// What `nvmlSystemGetProcessName` answers for this pid.
    pub name: String,
    /// GPU memory it holds; `None`: an even share of the GPU's used memory.
    pub used_memory_bytes: Option<u64>,
    pub kind: ProcessKind,
}

/// Which of NVML's process lists a process appears in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessKind {
    Compute,
    Graphics,
}

/// A scenario that cannot be used, located in its file.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioError {
    pub file: String,
    /// 1-based; 0 when the error has no position (the file could not be read).
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file, self.line, self.column, self.message
            )
        }
    }
}

impl std::error::Error for ScenarioError {}

impl Scenario {
    /// The node used when `FAKE_NVML_SCENARIO` is unset: gpusim's `NodeConfig::default()`.
    pub fn builtin() -> Scenario {
        let node = NodeConfig::default();
        let n = node.gpus.len();
        Scenario {
            source: None,
            training: vec![node.training.clone(); n],
            power_limit_w: vec![None; n],
            measured: vec![None; n],
            persistence: vec![None; n],
            ecc_errors: vec![EccErrors::default(); n],
            health: vec![Health::default(); n],
            node,
            driver_version: DEFAULT_DRIVER_VERSION.to_string(),
            cuda_driver_version: DEFAULT_CUDA_DRIVER_VERSION,
            processes: None,
            mig: vec![None; n],
            faults: Faults::default(),
            cooling: Vec::new(),
            activity: None,
            topology: None,
            hash: fnv1a(b"builtin"),
        }
    }

    /// Reads and resolves a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            file: path.display().to_string(),
            line: 0,
            column: 0,
            message: format!("cannot read the scenario: {e}"),
        })?;
        let mut s = Scenario::parse(&text, &path.display().to_string())?;
        s.source = Some(path.to_path_buf());
        Ok(s)
    }

    /// Parses scenario text; `file` is only used in error messages.
    pub fn parse(text: &str, file: &str) -> Result<Scenario, ScenarioError> {
        let at = |span: Option<Range<usize>>, message: String| {
            let (line, column) = span.map_or((1, 1), |s| line_col(text, s.start));
            ScenarioError {
                file: file.to_string(),
                line,
                column,
                message,
            }
        };
        let raw: RawScenario =
            toml::from_str(text).map_err(|e| at(e.span(), e.message().trim().to_string()))?;
        resolve(raw, text).map_err(|(span, msg)| at(Some(span), msg))
    }
}

/// FNV-1a, 64 bit: a stable hash for file names and scenario identity (std's hasher is
/// randomly keyed per process, which would defeat sharing).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}
