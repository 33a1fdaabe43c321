//! The environment a run ran in: host, gpupilot, driver, CUDA and the GPUs' models and rated
//! figures, as the daemon saw them when it started the run; then, as its trainer attaches, the
//! framework versions it reported (Python, PyTorch, CUDA as PyTorch was built, cuDNN, NCCL…)
//! and where each rank ran. Kept in the run's directory (`environment.json`) and read back by
//! the report; a value nobody said is absent, never guessed.

use std::collections::BTreeMap;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::telemetry::Snapshot;
use crate::time::rfc3339;
use crate::training::RankSpec;

/// The file's name in a run directory.
pub const FILE_NAME: &str = "environment.json";

/// Most bytes read back (a larger file is not a file gpupilot wrote).
pub const MAX_BYTES: u64 = 256 * 1024;

/// Most GPUs recorded.
pub const MAX_GPUS: usize = 64;

/// Most ranks recorded (a larger job keeps its first ones).
pub const MAX_RANKS: usize = 1024;

/// Most software versions kept from one trainer, and the longest name and version.
pub const MAX_SOFTWARE: usize = 16;
pub const MAX_SOFTWARE_NAME: usize = 32;
pub const MAX_SOFTWARE_VERSION: usize = 64;

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
    /// The versions the run's trainer reported when it attached, by name (`python`, `torch`,
    /// `torch_cuda`, `cudnn`, `nccl`, …): the first rank's that said any.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub software: BTreeMap<String, String>,
    /// Every rank that attached, by rank (a single-process script has none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<EnvRank>,
}

/// One GPU: its index, model and rated figures (what the whole-run advice compares against).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvGpu {
    pub index: u32,
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_total_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_default_w: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_max_w: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_slowdown_c: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_max_mhz: Option<u32>,
}

/// One rank of the run: where it ran, and its versions where they differ from the run's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvRank {
    pub rank: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The physical index of its GPU, where it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub software: BTreeMap<String, String>,
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
                    memory_total_bytes: g.memory_total_bytes,
                    power_default_w: g.power_default_w,
                    power_max_w: g.power_max_w,
                    temp_slowdown_c: g.temp_slowdown_c,
                    sm_clock_max_mhz: g.sm_clock_max_mhz,
                })
                .collect();
        }
        env
    }

    /// The reported software in words, Python first then PyTorch's parts:
    /// `Python 3.11.2, PyTorch 2.4.0 (CUDA 12.1, cuDNN 90100, NCCL 2.20.5), numpy 1.26.4`;
    /// None when no trainer said any.
    pub fn software_text(&self) -> Option<String> {
        software_words(&self.software)
    }

    /// The ranks in words: how many, on which hosts, and those whose versions differ from the
    /// run's; None for a single process.
    pub fn ranks_text(&self) -> Option<String> {
        if self.ranks.is_empty() {
            return None;
        }
        let mut hosts: Vec<&str> = self
            .ranks
            .iter()
            .filter_map(|r| r.host.as_deref())
            .collect();
        hosts.sort_unstable();
        hosts.dedup();
        let mut text = format!("{} attached", self.ranks.len());
        if !hosts.is_empty() {
            let shown: Vec<&str> = hosts.iter().take(8).copied().collect();
            text.push_str(&format!(" on {}", shown.join(", ")));
            if hosts.len() > shown.len() {
                text.push_str(&format!(" and {} more hosts", hosts.len() - shown.len()));
            }
        }
        for r in self.ranks.iter().filter(|r| !r.software.is_empty()) {
            if let Some(words) = software_words(&r.software) {
                text.push_str(&format!("; rank {} differs: {words}", r.rank));
            }
        }
        Some(text)
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

/// `{name: version}` in words (see [`Environment::software_text`]).
fn software_words(sw: &BTreeMap<String, String>) -> Option<String> {
    if sw.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    if let Some(v) = sw.get("python") {
        parts.push(format!("Python {v}"));
    }
    if let Some(v) = sw.get("torch") {
        let inner: Vec<String> = [("torch_cuda", "CUDA"), ("cudnn", "cuDNN"), ("nccl", "NCCL")]
            .iter()
            .filter_map(|(k, name)| sw.get(*k).map(|v| format!("{name} {v}")))
            .collect();
        if inner.is_empty() {
            parts.push(format!("PyTorch {v}"));
        } else {
            parts.push(format!("PyTorch {v} ({})", inner.join(", ")));
        }
    }
    let shown = ["python", "torch", "torch_cuda", "cudnn", "nccl"];
    for (k, v) in sw.iter().filter(|(k, _)| !shown.contains(&k.as_str())) {
        parts.push(format!("{k} {v}"));
    }
    Some(parts.join(", "))
}

/// What a trainer said of its software, bounded: at most [`MAX_SOFTWARE`] entries whose name is
/// 1–[`MAX_SOFTWARE_NAME`] of `[A-Za-z0-9_.-]` and whose version is 1–[`MAX_SOFTWARE_VERSION`]
/// printable characters; anything else is left out.
pub fn bounded_software(said: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let name_ok = |k: &str| {
        (1..=MAX_SOFTWARE_NAME).contains(&k.len())
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    };
    let version_ok = |v: &str| {
        (1..=MAX_SOFTWARE_VERSION).contains(&v.chars().count())
            && v.chars().all(|c| !c.is_control())
    };
    said.iter()
        .filter(|(k, v)| name_ok(k) && version_ok(v))
        .take(MAX_SOFTWARE)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Attaches land from many connections at once; each read-modify-write of a run's file holds
/// this.
static RECORDING: Mutex<()> = Mutex::new(());

/// Add what a trainer said when it attached: the run's software when none is recorded yet,
/// and its rank (replacing an earlier attach of the same rank), with its own versions where
/// they differ. A run directory without the file gets one with only this.
pub fn record_trainer(
    dir: &Path,
    rank: Option<&RankSpec>,
    software: &BTreeMap<String, String>,
    now: SystemTime,
) -> io::Result<()> {
    let software = bounded_software(software);
    let _held = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
    let mut env = read(dir)?.unwrap_or_else(|| Environment {
        recorded_at: rfc3339(now),
        ..Environment::default()
    });
    if env.software.is_empty() {
        env.software = software.clone();
    }
    if let Some(r) = rank {
        let entry = EnvRank {
            rank: r.rank,
            host: r.host.clone(),
            gpu: r.gpu,
            software: if software == env.software {
                BTreeMap::new()
            } else {
                software
            },
        };
        match env.ranks.binary_search_by_key(&r.rank, |e| e.rank) {
            Ok(i) => env.ranks[i] = entry,
            Err(i) if env.ranks.len() < MAX_RANKS => env.ranks.insert(i, entry),
            Err(_) => {}
        }
    }
    write(dir, &env)
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
    // Never through a link: the daemon reads it back before adding what a trainer said.
    let f = match crate::config::safe_fs::open_read(&path(dir)) {
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
