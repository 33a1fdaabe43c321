//! Where a power sweep's curve is kept for later: `$STATE/bench/power-sweep-<gpu>-<workload>.json`,
//! one file per GPU model and workload (the newest sweep replaces the last), so the energy
//! tuner and the advisor can start from a measured curve. `<gpu>` is the GPU's name in lower
//! case with every run of other characters as one `-` (`nvidia-h100-80gb-hbm3`); a simulated
//! sweep's file says `"label": "simulated"`, and one is never taken for the other.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::Workload;
use super::sweep::SweepResult;
use crate::config::safe_fs::{self, DirKind};

/// Largest curve file read back.
const MAX_BYTES: u64 = 1 << 20;

/// The file of GPU model `gpu_name`'s curve under `workload`, in state directory `state`.
pub fn path(state: &Path, gpu_name: &str, workload: Workload) -> PathBuf {
    let mut slug = String::new();
    for c in gpu_name.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.ends_with('-') && !slug.is_empty() {
            slug.push('-');
        }
    }
    let slug = slug.trim_end_matches('-');
    let slug = if slug.is_empty() { "unknown-gpu" } else { slug };
    state
        .join("bench")
        .join(format!("power-sweep-{slug}-{}.json", workload.as_str()))
}

/// Keep `result` as its GPU model's curve; where it went.
pub fn save(state: &Path, result: &SweepResult) -> anyhow::Result<PathBuf> {
    let name = result.gpu_name.as_deref().unwrap_or("");
    let path = path(state, name, result.workload);
    if let Some(dir) = path.parent() {
        safe_fs::own_dir(dir, DirKind::Private)
            .with_context(|| format!("making {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(result)? + "\n";
    safe_fs::write_atomic(&path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The curve kept for `gpu_name` under `workload`, if there is one that reads.
pub fn load(state: &Path, gpu_name: &str, workload: Workload) -> anyhow::Result<SweepResult> {
    let path = path(state, gpu_name, workload);
    let file = safe_fs::open_read(&path).with_context(|| format!("opening {}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_BYTES)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_file_per_model_and_workload() {
        let p = path(Path::new("/s"), "NVIDIA H100 80GB HBM3", Workload::Gemm);
        assert_eq!(
            p,
            Path::new("/s/bench/power-sweep-nvidia-h100-80gb-hbm3-gemm.json")
        );
        let p = path(Path::new("/s"), "../..", Workload::Memory);
        assert_eq!(p, Path::new("/s/bench/power-sweep-unknown-gpu-memory.json"));
    }
}
