//! One simulated GPU: its settings (power limit, locked clocks, persistence), its physical state
//! (temperature, energy, thermal-slowdown latch) and the training job running on it.
//!
//! `step(dt)` is the only thing that moves time; setters take effect at the next step, as on a
//! real GPU where the driver applies a new limit within its control period.

use serde::{Deserialize, Serialize};

use crate::activity::{Activity, ActivityState, Drive};
use crate::catalog::GpuSpec;
use crate::measured::MeasuredCurve;
use crate::power::{board_power_w, cap_clock_mhz, duty_cycle, grid_floor};
use crate::rng::SplitMix64;
use crate::workload::{ModelSpec, StepTiming, Training, data_time_s, step_timing};

pub use crate::error::SimError;

/// NVML clocks-event-reason bit values, identical to nvml.h.
pub mod throttle {
    pub const GPU_IDLE: u64 = 0x1;
    pub const APPLICATIONS_CLOCKS_SETTING: u64 = 0x2;
    pub const SW_POWER_CAP: u64 = 0x4;
    pub const HW_SLOWDOWN: u64 = 0x8;
    pub const SYNC_BOOST: u64 = 0x10;
    pub const SW_THERMAL_SLOWDOWN: u64 = 0x20;
    pub const HW_THERMAL_SLOWDOWN: u64 = 0x40;
    pub const HW_POWER_BRAKE_SLOWDOWN: u64 = 0x80;
}

/// Thermal slowdown releases once the GPU is this far below `slowdown_c`, Celsius.
pub const THERMAL_HYSTERESIS_C: f64 = 5.0;
/// Loader jitter per step is uniform in `[0, 2·frac)` of the batch's loading time; this is the
/// mean `frac` for a GPU made with [`Gpu::new`].
pub const DEFAULT_DATA_JITTER_FRAC: f64 = 0.25;
/// The factors a cooling fault may multiply the thermal resistance by: from slightly better
/// than the board's own cooling to ten times worse (a dead fan on a passively cooled part).
pub const COOLING_SCALE_RANGE: (f64, f64) = (0.5, 10.0);
/// PCIe traffic with nothing running (driver polling, monitoring), KB/s.
const IDLE_PCIE_RX_KBPS: u64 = 48;
const IDLE_PCIE_TX_KBPS: u64 = 24;

/// One instant, every value present (the simulator always knows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReading {
    pub util_gpu_pct: f64,
    pub util_mem_pct: f64,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    pub temperature_c: f64,
    /// Average over the last step, watts.
    pub power_w: f64,
    pub power_limit_w: f64,
    /// Total since the GPU was created, millijoules (NVML's unit).
    pub energy_mj: u64,
    pub sm_clock_mhz: u32,
    pub mem_clock_mhz: u32,
    /// `None` when the part has no fan (SXM modules).
    pub fan_pct: Option<f64>,
    /// 0 busy .. 8 idle.
    pub pstate: u32,
    /// Bits from [`throttle`].
    pub throttle_reasons: u64,
    pub pcie_tx_kbps: u64,
    pub pcie_rx_kbps: u64,
    pub persistence: bool,
    pub locked_clocks_mhz: Option<(u32, u32)>,
}

/// What the last step produced; `reading()` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Output {
    util: f64,
    util_mem: f64,
    power_w: f64,
    clock_mhz: u32,
    throttle: u64,
    pcie_rx_kbps: u64,
    pcie_tx_kbps: u64,
    memory_used_bytes: u64,
}

/// Where the GPU runs for a given load and thermal state.
struct OperatingPoint {
    clock_mhz: u32,
    power_w: f64,
    throttle: u64,
    /// `None` when idle.
    work: Option<(&'static ModelSpec, StepTiming)>,
}

/// One simulated GPU. The spec is stored (and serialized) by id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    #[serde(with = "spec_by_id")]
    spec: &'static GpuSpec,
    power_limit_w: f64,
    locked_clocks_mhz: Option<(u32, u32)>,
    persistence: bool,
    training: Option<Training>,
    temperature_c: f64,
    /// Accumulated as f64 so short steps lose nothing; reported floored to whole mJ.
    energy_mj: f64,
    thermal_slowdown: bool,
    /// This board's thermal resistance (the spec's, staggered per GPU by `Node`), C/W.
    thermal_resistance_c_per_w: f64,
    /// What a cooling fault multiplies the thermal resistance by (1 while cooling works).
    #[serde(default = "no_cooling_fault")]
    cooling_scale: f64,
    data_jitter_frac: f64,
    rng: SplitMix64,
    /// What makes a busy GPU's figures move (`None`: the steady model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    activity: Option<ActivityState>,
    /// A measured curve whose power this GPU draws while it trains (`None`: the model's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    measured: Option<Measured>,
    out: Output,
}

/// A measured curve in force ([`Gpu::set_measured`]) and its noise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Measured {
    curve: MeasuredCurve,
    /// Each second's power is the curve's times `1 ± noise` (uniform).
    noise: f64,
    /// This second's factor, and how much of the second is left.
    factor: f64,
    left_s: f64,
}

/// (De)serialize `&'static GpuSpec` as its id, re-resolved through `find`.
mod spec_by_id {
    use super::GpuSpec;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(spec: &&'static GpuSpec, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(spec.id)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<&'static GpuSpec, D::Error> {
        let id = String::deserialize(d)?;
        crate::catalog::find(&id)
            .ok_or_else(|| D::Error::custom(format!("unknown GPU spec id {id:?}")))
    }
}

impl Gpu {
    /// An idle GPU at ambient temperature with the default power limit.
    pub fn new(spec: &'static GpuSpec, ambient_c: f64) -> Gpu {
        Gpu::with_seed(spec, ambient_c, 0)
    }

    /// As [`Gpu::new`], with the seed of this GPU's noise (loader jitter, loss noise).
    pub fn with_seed(spec: &'static GpuSpec, ambient_c: f64, seed: u64) -> Gpu {
        Gpu {
            spec,
            power_limit_w: spec.power_default_w,
            locked_clocks_mhz: None,
            persistence: false,
            training: None,
            temperature_c: ambient_c,
            energy_mj: 0.0,
            thermal_slowdown: false,
            thermal_resistance_c_per_w: spec.thermal_resistance_c_per_w,
            cooling_scale: 1.0,
            data_jitter_frac: DEFAULT_DATA_JITTER_FRAC,
            rng: SplitMix64::new(seed),
            activity: None,
            measured: None,
            out: Output {
                util: 0.0,
                util_mem: 0.0,
                power_w: spec.idle_w,
                clock_mhz: spec.sm_clock_min_mhz,
                throttle: throttle::GPU_IDLE,
                pcie_rx_kbps: IDLE_PCIE_RX_KBPS,
                pcie_tx_kbps: IDLE_PCIE_TX_KBPS,
                memory_used_bytes: 0,
            },
        }
    }

    /// Make this board differ a little from the spec: scales thermal resistance and loader
    /// jitter (both factors should be near 1).
    pub fn stagger(&mut self, thermal_resistance_scale: f64, data_jitter_scale: f64) {
        self.thermal_resistance_c_per_w =
            self.spec.thermal_resistance_c_per_w * thermal_resistance_scale;
        self.data_jitter_frac = DEFAULT_DATA_JITTER_FRAC * data_jitter_scale;
    }

    pub fn spec(&self) -> &'static GpuSpec {
        self.spec
    }

    /// The thermal resistance in effect, C/W: the board's, times a cooling fault's factor.
    pub fn thermal_resistance_c_per_w(&self) -> f64 {
        self.thermal_resistance_c_per_w * self.cooling_scale
    }

    /// What a cooling fault multiplies the thermal resistance by (1 while cooling works).
    pub fn cooling_scale(&self) -> f64 {
        self.cooling_scale
    }

    /// A cooling fault (a failed fan, a clogged heatsink, hot exhaust drawn back in): from the
    /// next step heat leaves the board `scale` times harder, so it settles at
    /// `ambient + scale·R·P`. 1 is healthy cooling; `scale` must be within
    /// [`COOLING_SCALE_RANGE`].
    pub fn set_cooling_scale(&mut self, scale: f64) -> Result<(), SimError> {
        let (min, max) = COOLING_SCALE_RANGE;
        if !(min..=max).contains(&scale) {
            return Err(SimError::OutOfRange {
                what: "cooling fault factor (thermal resistance ×)",
                value: scale,
                min,
                max,
            });
        }
        self.cooling_scale = scale;
        Ok(())
    }

    /// Let this GPU's load move as a busy node's does (see [`Activity`]); `None` makes it
    /// steady again. A pattern out of range is refused and changes nothing.
    pub fn set_activity(&mut self, activity: Option<Activity>) -> Result<(), SimError> {
        if let Some(a) = &activity {
            a.validate()?;
        }
        self.activity = activity.map(ActivityState::new);
        Ok(())
    }

    /// The activity in effect, if any.
    pub fn activity(&self) -> Option<&Activity> {
        self.activity.as_ref().map(ActivityState::pattern)
    }

    /// Mean loader jitter as a fraction of the batch's loading time.
    pub fn data_jitter_frac(&self) -> f64 {
        self.data_jitter_frac
    }

    /// Whether the thermal slowdown latch is engaged.
    pub fn thermal_slowdown(&self) -> bool {
        self.thermal_slowdown
    }

    pub fn reading(&self) -> GpuReading {
        let s = self.spec;
        let busy = self.out.throttle & throttle::GPU_IDLE == 0;
        GpuReading {
            util_gpu_pct: 100.0 * self.out.util,
            util_mem_pct: 100.0 * self.out.util_mem,
            memory_used_bytes: self.out.memory_used_bytes,
            memory_total_bytes: s.memory_bytes,
            temperature_c: self.temperature_c,
            power_w: self.out.power_w,
            power_limit_w: self.power_limit_w,
            energy_mj: self.energy_mj as u64,
            sm_clock_mhz: self.out.clock_mhz,
            mem_clock_mhz: s.mem_clock_mhz,
            fan_pct: s.has_fan.then(|| fan_pct(self.temperature_c)),
            pstate: if busy { 0 } else { 8 },
            throttle_reasons: self.out.throttle,
            pcie_tx_kbps: self.out.pcie_tx_kbps,
            pcie_rx_kbps: self.out.pcie_rx_kbps,
            persistence: self.persistence,
            locked_clocks_mhz: self.locked_clocks_mhz,
        }
    }

    pub fn power_limit_w(&self) -> f64 {
        self.power_limit_w
    }

    /// Set the power cap, watts; outside `[power_min_w, power_max_w]` is refused.
    pub fn set_power_limit_w(&mut self, watts: f64) -> Result<(), SimError> {
        let s = self.spec;
        if !(s.power_min_w..=s.power_max_w).contains(&watts) {
            return Err(SimError::OutOfRange {
                what: "power limit (W)",
                value: watts,
                min: s.power_min_w,
                max: s.power_max_w,
            });
        }
        self.power_limit_w = watts;
        Ok(())
    }

    /// Lock the SM clock into `[min_mhz, max_mhz]`, both within the part's clock range.
    pub fn set_locked_clocks(&mut self, min_mhz: u32, max_mhz: u32) -> Result<(), SimError> {
        let (lo, hi) = (self.spec.sm_clock_min_mhz, self.spec.sm_clock_max_mhz);
        let out_of = |what, value: u32, min: u32, max: u32| SimError::OutOfRange {
            what,
            value: f64::from(value),
            min: f64::from(min),
            max: f64::from(max),
        };
        if !(lo..=hi).contains(&min_mhz) {
            return Err(out_of("locked clock minimum (MHz)", min_mhz, lo, hi));
        }
        if !(lo..=hi).contains(&max_mhz) {
            return Err(out_of("locked clock maximum (MHz)", max_mhz, lo, hi));
        }
        if min_mhz > max_mhz {
            return Err(out_of("locked clock minimum (MHz)", min_mhz, lo, max_mhz));
        }
        self.locked_clocks_mhz = Some((min_mhz, max_mhz));
        Ok(())
    }

    pub fn reset_locked_clocks(&mut self) {
        self.locked_clocks_mhz = None;
    }

    pub fn set_persistence(&mut self, on: bool) {
        self.persistence = on;
    }

    /// Draw `curve`'s power at the current limit while training, each second's off by up to
    /// `noise` (a fraction, 0..0.5) either way, instead of the model's ([`crate::measured`]).
    /// `None` goes back to the model.
    pub fn set_measured(
        &mut self,
        curve: Option<MeasuredCurve>,
        noise: f64,
    ) -> Result<(), SimError> {
        if !(0.0..0.5).contains(&noise) {
            return Err(SimError::OutOfRange {
                what: "measured curve noise",
                value: noise,
                min: 0.0,
                max: 0.5,
            });
        }
        self.measured = curve.map(|curve| Measured {
            curve,
            noise,
            factor: 1.0,
            left_s: 0.0,
        });
        Ok(())
    }

    /// The measured curve this GPU draws, if any.
    pub fn measured(&self) -> Option<&MeasuredCurve> {
        self.measured.as_ref().map(|m| &m.curve)
    }

    pub fn training(&self) -> Option<&Training> {
        self.training.as_ref()
    }

    pub fn training_mut(&mut self) -> Option<&mut Training> {
        self.training.as_mut()
    }

    pub fn set_training(&mut self, t: Option<Training>) {
        self.training = t;
    }

    /// Advance physics and training by `dt_s` seconds in an ambient of `ambient_c`.
    pub fn step(&mut self, dt_s: f64, ambient_c: f64) {
        if let Some(t) = self.training.as_mut().filter(|t| t.is_running()) {
            let model = t.model().expect("running implies a known model");
            if !model.fits(self.spec, t.config.batch_size) {
                t.oom = true;
            }
        }
        if let Some(t) = self.training.as_mut().filter(|t| !t.is_running()) {
            t.halt();
        }
        // Draw noise only while computing, so an idle GPU's stream is untouched.
        let (jitter_u, loss_noise) = if self.running().is_some() {
            (self.rng.next_f64(), self.rng.next_signed())
        } else {
            (0.5, 0.0)
        };
        let drive = match self.activity.as_mut() {
            Some(a) if self.training.as_ref().is_some_and(Training::is_running) => {
                a.step(dt_s, &mut self.rng)
            }
            _ => Drive::STEADY,
        };
        let mut op = self.operating_point(jitter_u, drive);
        if let (Some(m), true) = (self.measured.as_mut(), op.work.is_some()) {
            if m.left_s <= 0.0 {
                m.factor = 1.0 + m.noise * self.rng.next_signed();
                m.left_s += 1.0;
            }
            m.left_s -= dt_s;
            op.power_w = m.curve.at(self.power_limit_w).1 * m.factor;
        }
        let mut out = Output {
            util: 0.0,
            util_mem: 0.0,
            power_w: op.power_w,
            clock_mhz: op.clock_mhz,
            throttle: op.throttle,
            pcie_rx_kbps: IDLE_PCIE_RX_KBPS,
            pcie_tx_kbps: IDLE_PCIE_TX_KBPS,
            memory_used_bytes: 0,
        };
        if let Some(t) = self.training.as_mut() {
            out.memory_used_bytes = t.model().map_or(0, |m| m.static_memory_bytes);
            if let Some((model, timing)) = op.work {
                t.advance(model, &timing, dt_s, loss_noise);
                let rate = model.relative_rate(self.spec, f64::from(op.clock_mhz));
                // Time share of the memory-bound part at this clock is m·rate; compute kernels
                // still move some data, hence the floor.
                out.util = timing.util;
                out.util_mem = timing.util * (0.2 + 0.8 * model.memory_bound_fraction * rate);
                out.memory_used_bytes = model.memory_needed_bytes(t.config.batch_size);
                let rx = t.samples_per_s * model.input_bytes_per_sample as f64 / 1024.0;
                out.pcie_rx_kbps = IDLE_PCIE_RX_KBPS + rx as u64;
                out.pcie_tx_kbps = IDLE_PCIE_TX_KBPS + (0.02 * rx) as u64; // losses, metrics
            }
        }
        self.out = out;
        self.energy_mj += op.power_w * dt_s * 1e3;
        // Exact solution of dT/dt = (ambient + R·P − T)/tau over dt at constant P: stable for
        // any step size.
        let target = ambient_c + self.thermal_resistance_c_per_w() * op.power_w;
        let decay = (-dt_s / self.spec.thermal_tau_s).exp();
        self.temperature_c = target + (self.temperature_c - target) * decay;
        if self.temperature_c >= self.spec.slowdown_c {
            self.thermal_slowdown = true;
        } else if self.temperature_c < self.spec.slowdown_c - THERMAL_HYSTERESIS_C {
            self.thermal_slowdown = false;
        }
    }

    /// The SM clock the cap, locks and thermal state allow at the current load (mean loader
    /// jitter); the idle clock when nothing runs.
    pub fn steady_clock_mhz(&self) -> u32 {
        self.operating_point(0.5, Drive::STEADY).clock_mhz
    }

    /// Board power at [`Gpu::steady_clock_mhz`], watts.
    pub fn steady_power_w(&self) -> f64 {
        self.operating_point(0.5, Drive::STEADY).power_w
    }

    /// Temperature the GPU settles at under the current load: `ambient + R·P`, Celsius.
    pub fn steady_temperature_c(&self, ambient_c: f64) -> f64 {
        ambient_c + self.thermal_resistance_c_per_w() * self.steady_power_w()
    }

    fn running(&self) -> Option<(&'static ModelSpec, &Training)> {
        let t = self.training.as_ref().filter(|t| t.is_running())?;
        Some((t.model()?, t))
    }

    /// The clock range the locks (or the part) allow, MHz.
    fn clock_bounds(&self) -> (u32, u32) {
        self.locked_clocks_mhz
            .unwrap_or((self.spec.sm_clock_min_mhz, self.spec.sm_clock_max_mhz))
    }

    /// Clock, power and throttle reasons for the current load with loader jitter `jitter_u`
    /// (0..1, 0.5 = mean), the activity's `drive` and the current thermal latch.
    fn operating_point(&self, jitter_u: f64, drive: Drive) -> OperatingPoint {
        let spec = self.spec;
        let (lo, hi) = self.clock_bounds();
        let thermal = if self.thermal_slowdown {
            throttle::HW_SLOWDOWN | throttle::HW_THERMAL_SLOWDOWN
        } else {
            0
        };
        let Some((model, t)) = self.running() else {
            return OperatingPoint {
                clock_mhz: lo,
                power_w: spec.idle_w,
                throttle: throttle::GPU_IDLE | thermal,
                work: None,
            };
        };
        let cfg = &t.config;
        let jitter_s = data_time_s(model, cfg) * self.data_jitter_frac * 2.0 * jitter_u;
        let timing_at = |f: u32| {
            let t = step_timing(model, spec, cfg, f64::from(f), jitter_s);
            if drive.idle <= 0.0 {
                return t;
            }
            // The GPU waits `idle` of the step: the wait grows, the compute does not.
            let step_s = t.step_s / (1.0 - drive.idle);
            StepTiming {
                data_wait_s: step_s - t.compute_s,
                step_s,
                util: t.compute_s / step_s,
                ..t
            }
        };
        let intensity = model.power_intensity * drive.intensity;
        let power_at = |f: u32| {
            let f_mhz = f64::from(f);
            let rate = model.relative_rate(spec, f_mhz);
            board_power_w(spec, f_mhz, timing_at(f).util, intensity, rate)
        };
        // Power and thermal limits protect the board, so they may pull the clock below a
        // locked minimum (as on real parts); only the locked maximum is a hard ceiling.
        let floor = spec.sm_clock_min_mhz;
        let (capped_clock, capped) = cap_clock_mhz(spec, floor, hi, self.power_limit_w, power_at);
        let mut reasons = thermal;
        let clock = if self.thermal_slowdown {
            // HW slowdown cuts the clock by half or more.
            grid_floor(spec, capped_clock / 2).max(floor)
        } else {
            if capped {
                reasons |= throttle::SW_POWER_CAP;
            } else if self.locked_clocks_mhz.is_some() && hi < spec.sm_clock_max_mhz {
                reasons |= throttle::APPLICATIONS_CLOCKS_SETTING;
            }
            capped_clock
        };
        let power_w = power_at(clock);
        let timing = duty_cycle(spec.idle_w, power_w, timing_at(clock), self.power_limit_w);
        OperatingPoint {
            clock_mhz: clock,
            power_w: power_w.min(self.power_limit_w),
            throttle: reasons,
            work: Some((model, timing)),
        }
    }
}

fn no_cooling_fault() -> f64 {
    1.0
}

/// Fan duty for boards with a fan: 30% up to 45 C, rising linearly to 100% at 90 C.
fn fan_pct(temperature_c: f64) -> f64 {
    (30.0 + (temperature_c - 45.0) * 70.0 / 45.0).clamp(30.0, 100.0)
}
