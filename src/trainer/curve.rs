//! Pacing by a measured power-limit curve (`synthetic-train --curve`): each step takes the
//! model's time at full clock times the curve's slowdown at the GPU's power limit, read through
//! NVML at every step as a trainer on a real GPU would feel it at once, with each step's time
//! off by up to the noise either way. Paired with a fake-NVML GPU that draws the same curve's
//! power (`[[per_gpu]] measured_curve`), the run replays the measurement for the energy tuner.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use gpusim::{MeasuredCurve, SplitMix64};
use nvml_wrapper::Nvml;

/// Most bytes of a curve file read.
const MAX_CURVE_BYTES: u64 = 64 * 1024;

/// What `--curve` asks for.
#[derive(Debug, Clone)]
pub struct CurveSpec {
    pub curve: MeasuredCurve,
    /// Each step's time off by up to this fraction either way.
    pub noise: f64,
    /// The NVML library to read the limit through (`None`: the system's).
    pub nvml_lib: Option<PathBuf>,
}

/// A curve file, read bounded.
pub fn read(path: &Path) -> anyhow::Result<MeasuredCurve> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CURVE_BYTES).read_to_string(&mut text))
        .with_context(|| format!("reading the curve {}", path.display()))?;
    MeasuredCurve::from_csv(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The curve and the NVML handle that reads the GPU's limit.
pub struct CurvePace {
    spec: CurveSpec,
    nvml: Nvml,
    gpu: u32,
    rng: SplitMix64,
    /// The limit read last: a failed read keeps it.
    limit_w: f64,
}

impl CurvePace {
    pub fn open(spec: CurveSpec, gpu: u32, seed: u64) -> anyhow::Result<CurvePace> {
        let nvml = match &spec.nvml_lib {
            Some(lib) => Nvml::builder().lib_path(lib.as_os_str()).init(),
            None => Nvml::init(),
        }
        .context("--curve reads the GPU's power limit through NVML")?;
        let limit_w = spec.curve.range_w().1;
        let mut pace = CurvePace {
            spec,
            nvml,
            gpu,
            rng: SplitMix64::new(seed),
            limit_w,
        };
        pace.read_limit()
            .with_context(|| format!("reading GPU {gpu}'s power limit"))?;
        Ok(pace)
    }

    fn read_limit(&mut self) -> anyhow::Result<f64> {
        let mw = self
            .nvml
            .device_by_index(self.gpu)?
            .enforced_power_limit()?;
        self.limit_w = f64::from(mw) / 1000.0;
        Ok(self.limit_w)
    }

    /// The time of a step that takes `full_clock_s` at the curve's highest limit.
    pub fn step_s(&mut self, full_clock_s: f64) -> f64 {
        let _ = self.read_limit();
        let noise = 1.0 + self.spec.noise * self.rng.next_signed();
        full_clock_s * self.spec.curve.slowdown(self.limit_w) * noise
    }

    /// The power limit the last step ran under, watts.
    pub fn limit_w(&self) -> f64 {
        self.limit_w
    }
}
