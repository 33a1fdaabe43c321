//! The simulator as a telemetry source: gpusim's node, advanced to wall-clock time on each read.
//!
//! Used by `gpupilot demo`, `--source sim` and tests. It reports every field a real H100 would
//! (fans only where the simulated part has one), so views can be exercised without a GPU.
//!
//! `GPUPILOT_SIM_COOLING_FAULT=GPU:AFTER_S:FACTOR` in the environment of the process that opens
//! the source schedules a cooling fault on the node (gpusim's [`gpusim::CoolingFault`]): GPU
//! `GPU`'s thermal resistance is multiplied by `FACTOR`, `AFTER_S` simulated seconds after the
//! source opens (wall-clock seconds at the usual speed of 1). `gpupilot demo` gives it to its
//! daemon (`2:60:3`: GPU 2 runs hot after a minute and throttles, so the demo's data-parallel
//! job has a straggler to name). A value that does not parse is logged and ignored.
//!
//! A daemon's source keeps its energy counters in the state directory
//! ([`SimSource::with_counters`], see `sim_energy`), so that they go on across its restarts as
//! NVML's do; any other source's count from its own start.

use super::sim_energy::{Counters, SavedGpu};
use super::{GpuProcess, GpuSample, NodeInfo, RemappedRows, RetiredPages, Source, now_s};
use gpusim::{CoolingFault, Node, NodeConfig};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// Driver and CUDA versions the simulated node reports (a current datacenter driver).
pub const SIM_DRIVER_VERSION: &str = "550.54.15";
pub const SIM_CUDA_VERSION: &str = "12.4";

/// A simulated node as a [`Source`].
pub struct SimSource {
    node: Mutex<Node>,
    started: Instant,
    /// Simulated seconds already run before `started` (a warm node looks like a busy one).
    warmup_s: f64,
    /// Simulated seconds per wall-clock second.
    speed: f64,
    /// The energy counters kept across openings, if this source keeps them. After `node`,
    /// never before.
    /// Boxed: most sources keep none, and the source stays small.
    counters: Mutex<Option<Box<Counters>>>,
}

impl SimSource {
    /// A node built from `config`, run for `warmup_s` simulated seconds before the first read
    /// so that temperatures and loads have settled as on a node that has been training.
    pub fn new(config: &NodeConfig, warmup_s: f64) -> Result<SimSource, gpusim::SimError> {
        let mut node = Node::new(config)?;
        node.advance_to(warmup_s);
        if let Some(v) = std::env::var_os(COOLING_FAULT_ENV) {
            let v = v.to_string_lossy();
            match parse_cooling_fault(&v, warmup_s)
                .and_then(|f| node.add_cooling_fault(f).map_err(|e| e.to_string()))
            {
                Ok(()) => tracing::info!("simulator: cooling fault {COOLING_FAULT_ENV}={v}"),
                Err(e) => tracing::warn!("simulator: {COOLING_FAULT_ENV}={v:?} not used: {e}"),
            }
        }
        Ok(SimSource {
            node: Mutex::new(node),
            started: Instant::now(),
            warmup_s,
            speed: 1.0,
            counters: Mutex::new(None),
        })
    }

    /// Keep the energy counters in `path` (the daemon's state directory): they start where a
    /// source on the same file left them, plus what the GPUs drew meanwhile (see
    /// `sim_energy`).
    pub fn with_counters(self, path: &Path) -> Self {
        let gpus: Vec<(String, String, f64)> = self.with_node(|node| {
            let seed = node.config().seed;
            node.gpus()
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let own_j = g.reading().energy_mj as f64 / 1000.0;
                    (sim_uuid(seed, i), g.spec().name.to_string(), own_j)
                })
                .collect()
        });
        *self.counters.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Box::new(Counters::open(path, &gpus, now_s())));
        self
    }

    /// Run simulated time `speed` times faster than the wall clock (demos, tests).
    pub fn with_speed(mut self, speed: f64) -> Self {
        self.speed = speed.max(0.0);
        self
    }

    /// Run `f` on the node advanced to now: the way control code changes simulated settings.
    pub fn with_node<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        let mut node = self.node.lock().unwrap_or_else(|e| e.into_inner());
        node.advance_to(self.sim_now());
        f(&mut node)
    }

    fn sim_now(&self) -> f64 {
        self.warmup_s + self.started.elapsed().as_secs_f64() * self.speed
    }
}

impl Source for SimSource {
    fn node_info(&self) -> NodeInfo {
        NodeInfo {
            hostname: super::host::hostname(),
            source: "sim".into(),
            driver_version: Some(SIM_DRIVER_VERSION.into()),
            cuda_driver_version: Some(SIM_CUDA_VERSION.into()),
            nvml_version: None,
            topology: None,
        }
    }

    fn gpu_count(&self) -> usize {
        self.node
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .gpus()
            .len()
    }

    fn sample_gpu(&self, index: usize) -> GpuSample {
        self.with_node(|node| {
            let Some(gpu) = node.gpu(index) else {
                return GpuSample {
                    index: index as u32,
                    lost: true,
                    time_s: now_s(),
                    ..GpuSample::default()
                };
            };
            let spec = gpu.spec();
            let r = gpu.reading();
            // The node moves in whole steps (0.1 s): its counters are those of its last step,
            // so the sample is stamped with that step's time, not the read's. Stamped with the
            // read's, a window between two reads is off by up to a step at each end: 3% of a
            // 3 s window, whenever the reads fall at different points of their steps.
            let behind_s = if self.speed > 0.0 {
                (self.sim_now() - node.time_s()).max(0.0) / self.speed
            } else {
                0.0
            };
            let time_s = now_s() - behind_s;
            let uuid = sim_uuid(node.config().seed, index);
            let mut energy_j = r.energy_mj as f64 / 1000.0;
            if let Some(c) = self
                .counters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
            {
                energy_j += c.offset_j(index);
                let saved = SavedGpu {
                    uuid: uuid.clone(),
                    name: spec.name.to_string(),
                    energy_j,
                    power_w: r.power_w,
                    at_s: time_s,
                };
                c.read(index, saved, time_s);
            }
            let processes = gpu
                .training()
                .filter(|t| !t.oom)
                .map(|t| GpuProcess {
                    // A made-up but stable pid per GPU: the simulated trainer is not a real process.
                    pid: 40_000 + index as u32,
                    name: Some(format!("python train.py --model {}", t.config.model)),
                    used_memory_bytes: Some(r.memory_used_bytes),
                    owner: None,
                })
                .into_iter()
                .collect();
            GpuSample {
                index: index as u32,
                name: Some(spec.name.to_string()),
                uuid: Some(uuid),
                pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + index * 0x10)),
                lost: false,
                stale: false,
                time_s,
                util_gpu_pct: Some(r.util_gpu_pct),
                util_mem_pct: Some(r.util_mem_pct),
                memory_used_bytes: Some(r.memory_used_bytes),
                memory_total_bytes: Some(r.memory_total_bytes),
                temperature_c: Some(r.temperature_c),
                temp_slowdown_c: Some(spec.slowdown_c),
                temp_shutdown_c: Some(spec.shutdown_c),
                temp_gpu_max_c: Some(spec.gpu_max_operating_c),
                power_w: Some(r.power_w),
                power_limit_w: Some(r.power_limit_w),
                power_enforced_w: Some(r.power_limit_w),
                power_default_w: Some(spec.power_default_w),
                power_min_w: Some(spec.power_min_w),
                power_max_w: Some(spec.power_max_w),
                energy_j: Some(energy_j),
                sm_clock_mhz: Some(r.sm_clock_mhz),
                sm_clock_max_mhz: Some(spec.sm_clock_max_mhz),
                mem_clock_mhz: Some(r.mem_clock_mhz),
                mem_clock_max_mhz: Some(spec.mem_clock_mhz),
                fan_pct: r.fan_pct,
                pstate: Some(r.pstate),
                throttle_reasons: Some(r.throttle_reasons),
                pcie_rx_kbps: Some(r.pcie_rx_kbps),
                pcie_tx_kbps: Some(r.pcie_tx_kbps),
                pcie_gen: Some(spec.pcie_gen),
                pcie_width: Some(spec.pcie_width),
                pcie_gen_max: Some(spec.pcie_gen),
                pcie_width_max: Some(spec.pcie_width),
                pcie_replays: Some(0),
                ecc_corrected: Some(0),
                ecc_uncorrected: Some(0),
                ecc_corrected_total: Some(0),
                ecc_uncorrected_total: Some(0),
                // Data-centre parts from Ampere on remap rows; the simulator's never fail.
                remapped_rows: (!spec.has_fan && spec.architecture != "Volta")
                    .then(RemappedRows::default),
                // Volta's data-centre parts retire pages instead; none retired here.
                retired_pages: (!spec.has_fan && spec.architecture == "Volta")
                    .then(RetiredPages::default),
                // Not modelled: gpusim has no memory thermal model and reserves nothing.
                memory_temp_c: None,
                memory_reserved_bytes: None,
                // Training uses no video engine.
                enc_util_pct: Some(0.0),
                dec_util_pct: Some(0.0),
                persistence: Some(r.persistence),
                // gpusim models whole GPUs: no MIG.
                mig: None,
                processes: Some(processes),
                // gpusim has no XID model: nobody listens, so none are claimed either way.
                xids: None,
                xid_since_s: None,
                xid_count: None,
                // gpusim has no interconnect: no NVLink.
                nvlink: None,
            }
        })
    }
}

/// The environment variable that schedules a cooling fault (see the module doc).
pub const COOLING_FAULT_ENV: &str = "GPUPILOT_SIM_COOLING_FAULT";

/// `GPU:AFTER_S:FACTOR` as a fault starting `AFTER_S` after `warmup_s` of simulated time.
pub fn parse_cooling_fault(v: &str, warmup_s: f64) -> Result<CoolingFault, String> {
    let parts: Vec<&str> = v.split(':').map(str::trim).collect();
    let [gpu, after, factor] = parts.as_slice() else {
        return Err("expected GPU:AFTER_S:FACTOR, e.g. 2:60:3".into());
    };
    let gpu: usize = gpu
        .parse()
        .map_err(|_| format!("`{gpu}` is not a GPU index"))?;
    let after: f64 = after
        .parse()
        .ok()
        .filter(|a: &f64| a.is_finite() && *a >= 0.0)
        .ok_or_else(|| format!("`{after}` is not a number of seconds"))?;
    let factor: f64 = factor
        .parse()
        .map_err(|_| format!("`{factor}` is not a factor"))?;
    Ok(CoolingFault {
        gpu,
        at_s: warmup_s + after,
        thermal_resistance_scale: factor,
    })
}

/// A stable UUID-shaped id for simulated GPU `index` under `seed`.
fn sim_uuid(seed: u64, index: usize) -> String {
    let x = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(index as u64 + 1)
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (x >> 32) as u32,
        (x >> 16) as u16,
        x as u16,
        (index as u16) ^ 0x5151,
        x & 0xFFFF_FFFF_FFFF
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_source_reports_every_core_field() {
        let src = SimSource::new(&NodeConfig::default(), 120.0).unwrap();
        assert_eq!(src.gpu_count(), 4);
        let s = src.sample_gpu(0);
        assert!(!s.lost);
        assert_eq!(s.name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        for v in [s.util_gpu_pct, s.temperature_c, s.power_w, s.power_limit_w] {
            assert!(v.is_some());
        }
        // A busy training node: the GPU is warm and drawing well above idle.
        assert!(s.temperature_c.unwrap() > 35.0, "{s:?}");
        assert!(s.power_w.unwrap() > 200.0, "{s:?}");
        assert_eq!(s.processes.as_ref().map(Vec::len), Some(1));
        // Past the last GPU: a lost placeholder, never a panic.
        assert!(src.sample_gpu(9).lost);
    }

    #[test]
    fn a_cooling_fault_is_read_as_gpu_delay_and_factor() {
        let f = parse_cooling_fault("2:60:3", 600.0).unwrap();
        assert_eq!(
            f,
            CoolingFault {
                gpu: 2,
                at_s: 660.0,
                thermal_resistance_scale: 3.0
            }
        );
        for bad in ["2:60", "x:60:3", "2:-1:3", "2:60:hot", ""] {
            assert!(parse_cooling_fault(bad, 0.0).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_sample_is_stamped_with_the_step_its_counters_are_from() {
        // The node moves in 0.1 s steps; reads 0.35 s apart fall at different points of them.
        // Stamped with the read's time, the energy between two reads (three or four steps)
        // over 0.35 s was off by up to a third; stamped with the step's, the time between two
        // samples is the whole steps their counters are apart.
        let src = SimSource::new(&NodeConfig::default(), 600.0).unwrap();
        let step = NodeConfig::default().step_s;
        for _ in 0..3 {
            let a = src.sample_gpu(0);
            std::thread::sleep(std::time::Duration::from_millis(350));
            let b = src.sample_gpu(0);
            let steps = (b.time_s - a.time_s) / step;
            assert!(
                (steps - steps.round()).abs() < 0.01 && steps.round() >= 3.0,
                "{:.4} s apart: {steps:.3} steps",
                b.time_s - a.time_s
            );
            // And the counter moved by what the node drew over those steps: between its least
            // and its most.
            let power = (b.energy_j.unwrap() - a.energy_j.unwrap()) / (b.time_s - a.time_s);
            assert!((100.0..=800.0).contains(&power), "{power:.1} W");
        }
    }

    #[test]
    fn uuids_are_stable_and_distinct() {
        assert_eq!(sim_uuid(0, 1), sim_uuid(0, 1));
        assert_ne!(sim_uuid(0, 1), sim_uuid(0, 2));
        assert_ne!(sim_uuid(0, 1), sim_uuid(1, 1));
        assert_eq!(sim_uuid(7, 3).len(), 40);
    }
}
