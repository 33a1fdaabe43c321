//! Choosing and opening a telemetry source: NVML, or the simulator. The command line's
//! `--source` and `--gpus/--model/--workload/--seed` come here as a [`SourceKind`] and a
//! [`SimSpec`] (`cli` converts); nothing here knows about argument parsing.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Source;
use super::nvml::{NvmlOpenError, NvmlSource};
use super::sim::SimSource;

/// Which telemetry source to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// NVML when it loads; otherwise its error (never the simulator in its place).
    Auto,
    Nvml,
    Sim,
}

impl SourceKind {
    pub const ALL: [SourceKind; 3] = [SourceKind::Auto, SourceKind::Nvml, SourceKind::Sim];

    /// The name `--source` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Auto => "auto",
            SourceKind::Nvml => "nvml",
            SourceKind::Sim => "sim",
        }
    }

    pub fn parse(s: &str) -> Option<SourceKind> {
        SourceKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The simulated node `--source sim` and `demo` run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimSpec {
    pub gpus: u32,
    /// A gpusim catalog id (`h100-sxm`, …).
    pub model: String,
    /// A gpusim training model id, or `idle`/`none`.
    pub workload: String,
    pub seed: u64,
    /// Where the simulator keeps its energy counters, so that they go on across openings
    /// (the daemon's `$STATE/sim-energy.json`, see `telemetry::sim_energy`); None: they count
    /// from this opening.
    pub counters: Option<PathBuf>,
}

/// Simulated seconds a `--source sim` node has already run when first read, so it looks like
/// a node in the middle of training rather than one just switched on.
pub const SIM_WARMUP_S: f64 = 600.0;

/// Why no source could be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Nvml(#[from] NvmlOpenError),
    #[error("simulator: {0}")]
    Sim(String),
}

/// The node the simulator runs for these arguments.
pub fn sim_config(args: &SimSpec) -> Result<gpusim::NodeConfig, OpenError> {
    let spec = gpusim::find(&args.model).ok_or_else(|| {
        let known: Vec<&str> = gpusim::CATALOG.iter().map(|s| s.id).collect();
        OpenError::Sim(format!(
            "unknown GPU model `{}`; known: {}",
            args.model,
            known.join(", ")
        ))
    })?;
    let training = match args.workload.as_str() {
        "idle" | "none" => None,
        name => {
            let model = gpusim::find_model(name).ok_or_else(|| {
                let known: Vec<&str> = gpusim::MODELS.iter().map(|m| m.id).collect();
                OpenError::Sim(format!(
                    "unknown workload `{name}`; known: idle, {}",
                    known.join(", ")
                ))
            })?;
            // The default node's batch, prefetch and workers, with this model.
            gpusim::NodeConfig::default()
                .training
                .map(|base| gpusim::TrainingConfig {
                    model: model.id.to_string(),
                    ..base
                })
        }
    };
    Ok(gpusim::NodeConfig {
        gpus: vec![spec.id.to_string(); args.gpus as usize],
        seed: args.seed,
        training,
        ..gpusim::NodeConfig::default()
    })
}

/// An opened source, as its own type, for a caller that needs more than [`Source`] (the
/// control loops take the same object as their power control).
pub enum Opened {
    Sim(SimSource),
    /// Boxed: NVML's handle table is some 12 KB.
    Nvml(Box<NvmlSource>),
}

/// Open the source `kind` names. `auto` is NVML when it loads; otherwise the NVML error,
/// which tells the user about `--source sim` (auto never silently shows simulated GPUs as if
/// they were real). The simulator comes warmed up ([`SIM_WARMUP_S`]).
pub fn open(kind: SourceKind, nvml_lib: Option<&Path>, sim: &SimSpec) -> Result<Opened, OpenError> {
    match kind {
        SourceKind::Sim => {
            let config = sim_config(sim)?;
            let mut src =
                SimSource::new(&config, SIM_WARMUP_S).map_err(|e| OpenError::Sim(e.to_string()))?;
            if let Some(path) = &sim.counters {
                src = src.with_counters(path);
            }
            Ok(Opened::Sim(src))
        }
        SourceKind::Nvml | SourceKind::Auto => {
            Ok(Opened::Nvml(Box::new(NvmlSource::open(nvml_lib)?)))
        }
    }
}

/// [`open`], as a telemetry source only.
pub fn open_source(
    kind: SourceKind,
    nvml_lib: Option<&Path>,
    sim: &SimSpec,
) -> Result<Arc<dyn Source>, OpenError> {
    Ok(match open(kind, nvml_lib, sim)? {
        Opened::Sim(s) => Arc::new(s),
        Opened::Nvml(n) => Arc::<NvmlSource>::from(n),
    })
}
