//! NVML as a telemetry source, through nvml-wrapper.
//!
//! Each metric is read on its own call: NOT_SUPPORTED, a missing symbol or any other error
//! leaves that one field `None`; GPU_IS_LOST marks the GPU lost and the others go on. Nothing
//! here panics on a driver answer. Handles are looked up per sample (cheap in NVML) so one
//! GPU's worker thread never shares a handle with another's.

use super::nvlink::NvLinkWatch;
use super::nvml_events::XidWatch;
use super::owner::OwnerCache;
use super::{GpuProcess, GpuSample, NodeInfo, RemappedRows, RetiredPages, Source, now_s};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, RetirementCause, TemperatureSensor,
    TemperatureThreshold,
};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why NVML could not be used, in words a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum NvmlOpenError {
    #[error(
        "NVML library not found ({lib}): no NVIDIA driver on this machine? Use `--source sim` for the simulator, or `--nvml-lib PATH` / GPUPILOT_NVML_LIB to name the library"
    )]
    NotFound { lib: String },
    #[error(
        "NVML found ({lib}) but the NVIDIA driver is not loaded: check `nvidia-smi` and the kernel module"
    )]
    DriverNotLoaded { lib: String },
    #[error("NVML ({lib}) failed to initialise: {source}")]
    Init { lib: String, source: NvmlError },
}

/// Real GPUs through NVML.
pub struct NvmlSource {
    /// Shared with the XID event thread, which outlives no source (it stops on drop).
    nvml: Arc<Nvml>,
    count: usize,
    /// Per GPU, the fields read every [`SELDOM`] rather than every sample, and when.
    seldom: Vec<Mutex<Option<(Instant, Seldom)>>>,
    /// XID events, heard on a thread of their own.
    xids: XidWatch,
    /// Who each GPU process belongs to.
    owners: OwnerCache,
    /// NVLink and topology: the layout read at open, the links' counters every sample.
    nvlinks: NvLinkWatch,
    /// Each GPU's MIG instance layout, read again only when it changes.
    mig: super::mig::MigCache,
}

/// How often fields that change seldom or never are read again: the GPU's identity (name,
/// UUID, PCI bus id) and rated figures (temperature thresholds, default and allowed power
/// caps, best clocks), the persistence mode, the link's best generation and width, the
/// lifetime ECC counts and the retired pages (which change only after an ECC error, whose
/// event makes the next sample read them at once). Twenty NVML calls a GPU saved on most
/// samples; a real driver spends microseconds in each.
const SELDOM: Duration = Duration::from_secs(10);

/// Fields read every [`SELDOM`].
#[derive(Debug, Clone, Default)]
struct Seldom {
    name: Option<String>,
    uuid: Option<String>,
    pci_bus_id: Option<String>,
    temp_slowdown_c: Option<f64>,
    temp_shutdown_c: Option<f64>,
    temp_gpu_max_c: Option<f64>,
    power_default_w: Option<f64>,
    power_min_w: Option<f64>,
    power_max_w: Option<f64>,
    sm_clock_max_mhz: Option<u32>,
    mem_clock_max_mhz: Option<u32>,
    persistence: Option<bool>,
    pcie_gen_max: Option<u32>,
    pcie_width_max: Option<u32>,
    ecc_corrected_total: Option<u64>,
    ecc_uncorrected_total: Option<u64>,
    retired_pages: Option<RetiredPages>,
}

/// NVML field values read in one call each sample: memory temperature, the PCIe replay
/// counter, and row remapping (`NVML_FI_DEV_*` in nvml.h).
const FI_MEMORY_TEMP: u32 = 82;
const FI_PCIE_REPLAY_COUNTER: u32 = 94;
const FI_REMAPPED_COR: u32 = 142;
const FI_REMAPPED_UNC: u32 = 143;
const FI_REMAPPED_PENDING: u32 = 144;
const FI_REMAPPED_FAILURE: u32 = 145;
const FIELDS: [FieldId; 6] = [
    FieldId(FI_MEMORY_TEMP),
    FieldId(FI_PCIE_REPLAY_COUNTER),
    FieldId(FI_REMAPPED_COR),
    FieldId(FI_REMAPPED_UNC),
    FieldId(FI_REMAPPED_PENDING),
    FieldId(FI_REMAPPED_FAILURE),
];

/// A field value as a number; a field the GPU does not support is absent.
fn field_number(v: &Result<SampleValue, NvmlError>) -> Option<f64> {
    match v {
        Ok(SampleValue::F64(x)) => Some(*x),
        Ok(SampleValue::U32(x)) => Some(f64::from(*x)),
        Ok(SampleValue::U64(x)) => Some(*x as f64),
        Ok(SampleValue::I64(x)) => Some(*x as f64),
        Err(_) => None,
    }
}

impl NvmlSource {
    /// Load NVML from `lib` (a path) or from the system's `libnvidia-ml.so.1`.
    pub fn open(lib: Option<&Path>) -> Result<NvmlSource, NvmlOpenError> {
        let name = lib
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "libnvidia-ml.so.1".into());
        let result = match lib {
            Some(path) => Nvml::builder()
                .lib_path(OsStr::new(path.as_os_str()))
                .init(),
            None => Nvml::init(),
        };
        let nvml = result.map_err(|e| match e {
            NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => {
                NvmlOpenError::NotFound { lib: name.clone() }
            }
            NvmlError::DriverNotLoaded => NvmlOpenError::DriverNotLoaded { lib: name.clone() },
            other => NvmlOpenError::Init {
                lib: name.clone(),
                source: other,
            },
        })?;
        let count = nvml.device_count().unwrap_or(0) as usize;
        let seldom = (0..count).map(|_| Mutex::new(None)).collect();
        let nvlinks = NvLinkWatch::open(&nvml, count);
        let nvml = Arc::new(nvml);
        let xids = XidWatch::start(Arc::clone(&nvml), count);
        Ok(NvmlSource {
            nvml,
            count,
            seldom,
            xids,
            mig: super::mig::MigCache::new(count),
            owners: OwnerCache::default(),
            nvlinks,
        })
    }

    /// The NVML handle, for the setters in `control::power` (this module only reads).
    pub(crate) fn nvml(&self) -> &Nvml {
        &self.nvml
    }
}

/// `Ok(v)` → `Some(v)`; GPU lost → remember it; anything else → absent.
struct Reader {
    lost: bool,
}

impl Reader {
    fn get<T>(&mut self, r: Result<T, NvmlError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(NvmlError::GpuLost) => {
                self.lost = true;
                None
            }
            Err(_) => None,
        }
    }
}

impl NvmlSource {
    /// GPU `index`'s seldom-read fields: the cached ones while they are younger than
    /// [`SELDOM`], else read now (a failed read is absent, as every field).
    fn seldom(&self, index: usize, dev: &nvml_wrapper::Device<'_>, r: &mut Reader) -> Seldom {
        let Some(slot) = self.seldom.get(index) else {
            return Seldom::default();
        };
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        // An ECC event makes the lifetime counts worth reading now.
        let ecc_event = self.xids.take_ecc_event(index);
        if let Some((at, cached)) = &*slot {
            if at.elapsed() < SELDOM && !ecc_event {
                return cached.clone();
            }
        }
        let threshold = |r: &mut Reader, t| r.get(dev.temperature_threshold(t)).map(f64::from);
        let constraints = r.get(dev.power_management_limit_constraints());
        let fresh = Seldom {
            name: r.get(dev.name()),
            uuid: r.get(dev.uuid()),
            pci_bus_id: r.get(dev.pci_info()).map(|p| p.bus_id),
            temp_slowdown_c: threshold(r, TemperatureThreshold::Slowdown),
            temp_shutdown_c: threshold(r, TemperatureThreshold::Shutdown),
            temp_gpu_max_c: threshold(r, TemperatureThreshold::GpuMax),
            power_default_w: r
                .get(dev.power_management_limit_default())
                .map(milliwatts)
                .and_then(nonzero),
            power_min_w: constraints
                .as_ref()
                .and_then(|c| nonzero(milliwatts(c.min_limit))),
            power_max_w: constraints.and_then(|c| nonzero(milliwatts(c.max_limit))),
            sm_clock_max_mhz: r.get(dev.max_clock_info(Clock::SM)),
            mem_clock_max_mhz: r.get(dev.max_clock_info(Clock::Memory)),
            persistence: r.get(dev.is_in_persistent_mode()),
            pcie_gen_max: r.get(dev.max_pcie_link_gen()),
            pcie_width_max: r.get(dev.max_pcie_link_width()),
            ecc_corrected_total: r
                .get(dev.total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate)),
            ecc_uncorrected_total: r
                .get(dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)),
            retired_pages: retired_pages(dev, r),
        };
        if r.lost {
            // Read from a GPU falling off: not to be kept for the next samples.
            *slot = None;
        } else {
            *slot = Some((Instant::now(), fresh.clone()));
        }
        fresh
    }
}

/// NVML speaks milliwatts (and millijoules).
fn milliwatts(v: u32) -> f64 {
    f64::from(v) / 1000.0
}

/// A limit of 0 W is a driver oddity, not a limit: unknown.
fn nonzero(w: f64) -> Option<f64> {
    (w > 0.0).then_some(w)
}

/// Page retirement: both causes' counts and the pending flag, or absent when any of the three
/// is (A100 and later remap rows and answer NOT_SUPPORTED, as do GeForce boards).
fn retired_pages(dev: &nvml_wrapper::Device<'_>, r: &mut Reader) -> Option<RetiredPages> {
    let single_bit = r.get(dev.retired_pages(RetirementCause::MultipleSingleBitEccErrors))?;
    let double_bit = r.get(dev.retired_pages(RetirementCause::DoubleBitEccError))?;
    let pending = r.get(dev.are_pages_pending_retired())?;
    Some(RetiredPages {
        single_bit: single_bit.len() as u64,
        double_bit: double_bit.len() as u64,
        pending,
    })
}

/// The first fan's speed: `nvmlDeviceGetFanSpeed_v2`, else `nvmlDeviceGetFanSpeed` where the
/// library lacks `_v2` or answers it NOT_SUPPORTED while the older call works (as nvtop and
/// gpustat read it). Unsupported by both: the error, so the field stays absent.
fn fan_speed(dev: &nvml_wrapper::Device<'_>) -> Result<u32, NvmlError> {
    match dev.fan_speed(0) {
        Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => {
            nvml_calls::fan_speed_v1(dev)
        }
        other => other,
    }
}

impl Source for NvmlSource {
    fn node_info(&self) -> NodeInfo {
        let cuda = self.nvml.sys_cuda_driver_version().ok().map(|v| {
            format!(
                "{}.{}",
                nvml_wrapper::cuda_driver_version_major(v),
                nvml_wrapper::cuda_driver_version_minor(v)
            )
        });
        NodeInfo {
            hostname: super::host::hostname(),
            source: "nvml".into(),
            driver_version: self.nvml.sys_driver_version().ok(),
            cuda_driver_version: cuda,
            nvml_version: self.nvml.sys_nvml_version().ok(),
            topology: self.nvlinks.topology(),
        }
    }

    fn gpu_count(&self) -> usize {
        self.count
    }

    fn sample_gpu(&self, index: usize) -> GpuSample {
        let mut s = GpuSample {
            index: index as u32,
            time_s: now_s(),
            ..GpuSample::default()
        };
        let dev = match self.nvml.device_by_index(index as u32) {
            Ok(d) => d,
            Err(_) => {
                // GPU_IS_LOST, or the handle cannot be had at all: either way nothing can be
                // read from it, which is what "lost" tells the user.
                s.lost = true;
                let xids = self.xids.view(index);
                s.xids = xids.recent;
                s.xid_since_s = xids.since_s;
                s.xid_count = xids.total;
                return s;
            }
        };
        let mut r = Reader { lost: false };
        let seldom = self.seldom(index, &dev, &mut r);
        s.name = seldom.name;
        s.uuid = seldom.uuid;
        s.pci_bus_id = seldom.pci_bus_id;
        s.temp_slowdown_c = seldom.temp_slowdown_c;
        s.temp_shutdown_c = seldom.temp_shutdown_c;
        s.temp_gpu_max_c = seldom.temp_gpu_max_c;
        s.power_default_w = seldom.power_default_w;
        s.power_min_w = seldom.power_min_w;
        s.power_max_w = seldom.power_max_w;
        s.sm_clock_max_mhz = seldom.sm_clock_max_mhz;
        s.mem_clock_max_mhz = seldom.mem_clock_max_mhz;
        s.persistence = seldom.persistence;
        s.pcie_gen_max = seldom.pcie_gen_max;
        s.pcie_width_max = seldom.pcie_width_max;
        s.ecc_corrected_total = seldom.ecc_corrected_total;
        s.ecc_uncorrected_total = seldom.ecc_uncorrected_total;
        s.retired_pages = seldom.retired_pages;
        if let Some(u) = r.get(dev.utilization_rates()) {
            s.util_gpu_pct = Some(u.gpu as f64);
            s.util_mem_pct = Some(u.memory as f64);
        }
        if let Some(m) = r.get(dev.memory_info()) {
            s.memory_used_bytes = Some(m.used);
            s.memory_total_bytes = Some(m.total);
            s.memory_reserved_bytes = Some(m.reserved);
        }
        s.temperature_c = r
            .get(dev.temperature(TemperatureSensor::Gpu))
            .map(f64::from);
        s.power_w = r.get(dev.power_usage()).map(milliwatts);
        s.power_limit_w = r
            .get(dev.power_management_limit())
            .map(milliwatts)
            .and_then(nonzero);
        s.power_enforced_w = r
            .get(dev.enforced_power_limit())
            .map(milliwatts)
            .and_then(nonzero);
        s.energy_j = r
            .get(dev.total_energy_consumption())
            .map(|mj| mj as f64 / 1000.0);
        s.sm_clock_mhz = r.get(dev.clock_info(Clock::SM));
        s.mem_clock_mhz = r.get(dev.clock_info(Clock::Memory));
        s.fan_pct = r.get(fan_speed(&dev)).map(f64::from);
        s.pstate = r.get(dev.performance_state()).map(|p| p.as_c());
        s.throttle_reasons = r.get(dev.current_throttle_reasons()).map(|t| t.bits());
        s.pcie_rx_kbps = r
            .get(dev.pcie_throughput(PcieUtilCounter::Receive))
            .map(u64::from);
        s.pcie_tx_kbps = r
            .get(dev.pcie_throughput(PcieUtilCounter::Send))
            .map(u64::from);
        s.pcie_gen = r.get(dev.current_pcie_link_gen());
        s.pcie_width = r.get(dev.current_pcie_link_width());
        s.ecc_corrected = r.get(dev.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile));
        s.ecc_uncorrected =
            r.get(dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile));
        if let Some(values) = r.get(dev.field_values_for(&FIELDS)) {
            let mut by_id = [None; FIELDS.len()];
            for v in values.into_iter().flatten() {
                if let Some(k) = FIELDS.iter().position(|f| f.0 == v.field.0) {
                    by_id[k] = field_number(&v.value);
                }
            }
            let [temp, replays, cor, unc, pending, failure] = by_id;
            s.memory_temp_c = temp;
            s.pcie_replays = replays.map(|x| x as u64);
            // All four or none: a part without row remapping answers NOT_SUPPORTED to each.
            if let (Some(cor), Some(unc), Some(pending), Some(failure)) =
                (cor, unc, pending, failure)
            {
                s.remapped_rows = Some(RemappedRows {
                    correctable: cor as u64,
                    uncorrectable: unc as u64,
                    pending: pending != 0.0,
                    failure: failure != 0.0,
                });
            }
        }
        if s.pcie_replays.is_none() {
            s.pcie_replays = r.get(dev.pcie_replay_counter()).map(u64::from);
        }
        s.enc_util_pct = r
            .get(dev.encoder_utilization())
            .map(|u| f64::from(u.utilization));
        s.dec_util_pct = r
            .get(dev.decoder_utilization())
            .map(|u| f64::from(u.utilization));
        s.nvlink = self.nvlinks.sample(index, &dev);
        let compute = r.get(dev.running_compute_processes());
        let graphics = r.get(dev.running_graphics_processes());
        if compute.is_some() || graphics.is_some() {
            let mut procs: Vec<GpuProcess> = Vec::new();
            for p in compute
                .into_iter()
                .flatten()
                .chain(graphics.into_iter().flatten())
            {
                if procs.iter().any(|q| q.pid == p.pid) {
                    continue;
                }
                procs.push(GpuProcess {
                    pid: p.pid,
                    name: self.nvml.sys_process_name(p.pid, 256).ok(),
                    used_memory_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                    owner: self.owners.owner(p.pid),
                });
            }
            s.processes = Some(procs);
        }
        s.mig = self.mig.read(index, &dev);
        if r.lost {
            // Values read before the GPU fell off are not to be trusted as current.
            s = GpuSample {
                index: s.index,
                name: s.name,
                uuid: s.uuid,
                pci_bus_id: s.pci_bus_id,
                lost: true,
                time_s: s.time_s,
                ..GpuSample::default()
            };
        }
        // Kept on a lost GPU too: its last XID (79, often) says why it went.
        let xids = self.xids.view(index);
        s.xids = xids.recent;
        s.xid_since_s = xids.since_s;
        s.xid_count = xids.total;
        s
    }
}
