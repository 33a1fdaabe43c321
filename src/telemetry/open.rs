//! Choosing and opening a telemetry source from the command line's `--source`.

use super::Source;
use super::nvml::{NvmlOpenError, NvmlSource};
use super::sim::SimSource;
use crate::cli::{SimArgs, SourceKind};
use std::path::Path;
use std::sync::Arc;

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
pub fn sim_config(args: &SimArgs) -> Result<gpusim::NodeConfig, OpenError> {
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
            let base = gpusim::NodeConfig::default().training;
            Some(gpusim::TrainingConfig {
                model: model.id.to_string(),
                ..base.expect("the default node trains")
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

/// Open the source `kind` names. `auto` is NVML when it loads; otherwise the NVML error,
/// which tells the user about `--source sim` (auto never silently shows simulated GPUs as if
/// they were real).
pub fn open_source(
    kind: SourceKind,
    nvml_lib: Option<&Path>,
    sim: &SimArgs,
) -> Result<Arc<dyn Source>, OpenError> {
    match kind {
        SourceKind::Sim => open_sim(sim),
        SourceKind::Nvml | SourceKind::Auto => Ok(Arc::new(NvmlSource::open(nvml_lib)?)),
    }
}

/// The simulator for these arguments, warmed up.
pub fn open_sim(sim: &SimArgs) -> Result<Arc<dyn Source>, OpenError> {
    let config = sim_config(sim)?;
    let src = SimSource::new(&config, SIM_WARMUP_S).map_err(|e| OpenError::Sim(e.to_string()))?;
    Ok(Arc::new(src))
}
