//! The environment a run ran in: host, gpupilot, driver, CUDA and the GPUs' models, as the
//! daemon saw them when it started the run. Written once into the run's directory
//! (`environment.json`) and read back by the report; a value the daemon did not know is absent,
//! never guessed.

use std::fs::File;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::telemetry::Snapshot;
use crate::time::rfc3339;

/// The file's name in a run directory.
pub const FILE_NAME: &str = "environment.json";

/// Most bytes read back (a larger file is not a file gpupilot wrote).
pub const MAX_BYTES: u64 = 64 * 1024;

/// Most GPUs recorded.
pub const MAX_GPUS: usize = 64;

/// What the run ran on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// When it was recorded (RFC 3339, UTC): the run's start.
    pub recorded_at: String,
    pub hostname: Option<String>,
    /// The daemon's version (`gpupilot --version`).
    pub gpupilot_version: Option<String>,
    /// Where the GPU figures came from: `nvml` or `sim`.
    pub telemetry_source: Option<String>,
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports, as `12.4`.
    pub cuda_driver_version: Option<String>,
    /// The run's GPUs (every GPU of the node when the run's are not known).
    #[serde(default)]
    pub gpus: Vec<EnvGpu>,
}

/// One GPU: its index and model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvGpu {
    pub index: u32,
    pub name: Option<String>,
}

impl Environment {
    /// From the daemon's newest snapshot (`None`: no telemetry, only the version is known),
    /// for the GPUs `gpus` (all of the snapshot's when `None`).
    pub fn from_snapshot(snap: Option<&Snapshot>, gpus: Option<&[u32]>, now: SystemTime) -> Self {
        let mut env = Environment {
            recorded_at: rfc3339(now),
            gpupilot_version: Some(env!("CARGO_PKG_VERSION").to_string()),
            ..Environment::default()
        };
        if let Some(s) = snap {
            let n = &s.node;
            env.hostname = Some(n.hostname.clone()).filter(|h| !h.is_empty());
            env.telemetry_source = Some(n.source.clone()).filter(|h| !h.is_empty());
            env.driver_version = n.driver_version.clone();
            env.cuda_driver_version = n.cuda_driver_version.clone();
            env.gpus = s
                .gpus
                .iter()
                .filter(|g| gpus.is_none_or(|list| list.contains(&g.index)))
                .take(MAX_GPUS)
                .map(|g| EnvGpu {
                    index: g.index,
                    name: g.name.clone(),
                })
                .collect();
        }
        env
    }

    /// The GPU models in words: `2 × NVIDIA H100 80GB HBM3`, several models joined by `, `;
    /// None when no GPU's model is known.
    pub fn models_text(&self) -> Option<String> {
        let mut models: Vec<(String, usize)> = Vec::new();
        for name in self.gpus.iter().filter_map(|g| g.name.as_deref()) {
            match models.iter_mut().find(|(m, _)| m == name) {
                Some((_, n)) => *n += 1,
                None => models.push((name.to_string(), 1)),
            }
        }
        (!models.is_empty()).then(|| {
            models
                .iter()
                .map(|(m, n)| format!("{n} × {m}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
    }
}

/// Where a run directory's environment is.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Write the environment into the run directory (replaced whole, never through a link).
pub fn write(dir: &Path, env: &Environment) -> io::Result<()> {
    let text = serde_json::to_vec_pretty(env).map_err(io::Error::other)?;
    crate::config::safe_fs::write_atomic(&path(dir), &text)
}

/// The run directory's environment; `Ok(None)` when it has none (a run the daemon did not
/// start, or one from before it was recorded).
pub fn read(dir: &Path) -> io::Result<Option<Environment>> {
    let f = match File::open(path(dir)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    f.take(MAX_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_BYTES} bytes"),
        ));
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
