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

/// Where an energy search on this GPU model can start: the cap of the curve with the least
/// cost per unit of work at `eta` (Zeus's `eta·energy + (1−eta)·max_power·time`, per unit;
/// `max_power_w` is the GPU's largest cap), among the measured caps within `[min_w, max_w]`.
/// None when no cap of the curve lies there with work done.
pub fn cheapest_cap(
    result: &SweepResult,
    eta: f64,
    max_power_w: f64,
    min_w: f64,
    max_w: f64,
) -> Option<f64> {
    result
        .points
        .iter()
        .filter(|p| p.cap_w >= min_w - 0.5 && p.cap_w <= max_w + 0.5)
        .filter(|p| p.throughput_per_s > 0.0 && p.energy_per_unit_j.is_finite())
        .map(|p| {
            let cost = eta * p.energy_per_unit_j + (1.0 - eta) * max_power_w / p.throughput_per_s;
            (cost, p.cap_w)
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, cap)| cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::bench::sweep::SweepPoint;

    fn curve(points: &[(f64, f64, f64)]) -> SweepResult {
        SweepResult {
            schema: "test".into(),
            label: super::super::Label::Simulated,
            gpu: 0,
            gpu_name: Some("NVIDIA H100 80GB HBM3".into()),
            workload: Workload::Gemm,
            unit: super::super::WorkUnit::Flop,
            warmup_s: 1.0,
            window_s: 1.0,
            original_cap_w: 700.0,
            stopped: false,
            points: points
                .iter()
                .map(|&(cap_w, throughput_per_s, power_w)| SweepPoint {
                    cap_w,
                    throughput_per_s,
                    power_w,
                    energy_per_unit_j: power_w / throughput_per_s,
                    perf_per_w: throughput_per_s / power_w,
                    sm_clock_mhz: None,
                    temperature_c: None,
                    throttle_reasons: 0,
                })
                .collect(),
            knee: None,
            best_perf_per_w_cap_w: None,
        }
    }

    #[test]
    fn the_cheapest_cap_weighs_energy_and_time_by_eta() {
        // Throughput falls slower than power as the cap drops: energy alone prefers the lowest
        // cap, time alone the highest.
        let c = curve(&[
            (700.0, 100.0, 690.0),
            (500.0, 90.0, 495.0),
            (300.0, 60.0, 298.0),
        ]);
        assert_eq!(cheapest_cap(&c, 1.0, 700.0, 200.0, 700.0), Some(300.0));
        assert_eq!(cheapest_cap(&c, 0.0, 700.0, 200.0, 700.0), Some(700.0));
        // eta 0.5: 700 W costs 3.45 + 3.5, 500 W 2.75 + 3.89, 300 W 2.48 + 5.83 per unit.
        assert_eq!(cheapest_cap(&c, 0.5, 700.0, 200.0, 700.0), Some(500.0));
        // Only caps inside the GPU's range count; none left, no start.
        assert_eq!(cheapest_cap(&c, 1.0, 700.0, 400.0, 700.0), Some(500.0));
        assert_eq!(cheapest_cap(&c, 1.0, 700.0, 710.0, 800.0), None);
    }

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
