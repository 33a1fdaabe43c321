//! Telemetry: what one look at a node sees, and where it comes from.
//!
//! Every metric is an `Option`: absent is not zero. A source that cannot read a field (the
//! driver says NOT_SUPPORTED, the library lacks the symbol, the GPU fell off the bus) leaves it
//! `None` and the views print `N/A`. Sources implement [`Source`]; the [`sampler`] runs one
//! thread per GPU so that a hung driver call on one GPU leaves the others live and marks only
//! that GPU stale.
//!
//! This module may read hardware and the simulator; it never draws and never changes settings
//! (control lives elsewhere).

pub mod host;
pub mod memory;
pub mod mig;
pub mod nvlink;
pub mod nvml;
pub mod nvml_events;
pub mod open;
pub mod owner;
pub mod sampler;
pub mod sim;
pub mod sim_energy;
pub mod xid;

use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

pub use sampler::{Sampler, SamplerConfig};

/// Seconds since the Unix epoch, as a float: the time base of samples and history.
pub fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// One GPU at one instant. Units are in the field names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    /// Position as the source enumerates it (NVML index).
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    /// The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST): nothing else in the sample is current.
    pub lost: bool,
    /// The sampler has no fresh reading (a call hung or the source stopped answering); values
    /// are the last ones read and must be shown as stale.
    pub stale: bool,
    /// When these values were read, seconds since the epoch.
    pub time_s: f64,
    pub util_gpu_pct: Option<f64>,
    pub util_mem_pct: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub temperature_c: Option<f64>,
    /// Temperature at which the GPU slows its clocks (NVML "slowdown" threshold).
    pub temp_slowdown_c: Option<f64>,
    pub temp_shutdown_c: Option<f64>,
    /// Driver's target temperature ("GPU max operating"), where the GPU has one.
    pub temp_gpu_max_c: Option<f64>,
    pub power_w: Option<f64>,
    /// The management power limit currently set (NVML speaks milliwatts; this is watts).
    pub power_limit_w: Option<f64>,
    /// The limit the GPU actually enforces (the lowest of all limiters).
    pub power_enforced_w: Option<f64>,
    pub power_default_w: Option<f64>,
    pub power_min_w: Option<f64>,
    pub power_max_w: Option<f64>,
    /// Total energy counter since the driver loaded, joules (NVML: millijoules).
    pub energy_j: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub mem_clock_max_mhz: Option<u32>,
    pub fan_pct: Option<f64>,
    /// Performance state, 0 (max) to 15 (min).
    pub pstate: Option<u32>,
    /// NVML clocks-event (throttle) reason bits; see [`throttle_reason_names`].
    pub throttle_reasons: Option<u64>,
    pub pcie_rx_kbps: Option<u64>,
    pub pcie_tx_kbps: Option<u64>,
    /// The PCIe link's generation and width now (a link trains down while the GPU idles).
    pub pcie_gen: Option<u32>,
    pub pcie_width: Option<u32>,
    /// The best the GPU and its slot can do: a busy GPU below these has a degraded link.
    #[serde(default)]
    pub pcie_gen_max: Option<u32>,
    #[serde(default)]
    pub pcie_width_max: Option<u32>,
    /// PCIe replays since the driver loaded: a climbing count is a bad link.
    #[serde(default)]
    pub pcie_replays: Option<u64>,
    /// Volatile ECC counts (since the driver loaded).
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    /// Aggregate ECC counts (the board's lifetime).
    #[serde(default)]
    pub ecc_corrected_total: Option<u64>,
    #[serde(default)]
    pub ecc_uncorrected_total: Option<u64>,
    /// Row remapping (A100 and later data-centre GPUs).
    #[serde(default)]
    pub remapped_rows: Option<RemappedRows>,
    /// Page retirement (data-centre GPUs before A100, which retire pages instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_pages: Option<RetiredPages>,
    /// HBM temperature, where the GPU reports it.
    #[serde(default)]
    pub memory_temp_c: Option<f64>,
    /// Framebuffer the driver reserves for itself.
    #[serde(default)]
    pub memory_reserved_bytes: Option<u64>,
    /// Video encoder and decoder utilization.
    #[serde(default)]
    pub enc_util_pct: Option<f64>,
    #[serde(default)]
    pub dec_util_pct: Option<f64>,
    pub persistence: Option<bool>,
    /// MIG mode and instances; absent on a GPU without MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<mig::MigState>,
    /// Compute and graphics processes on this GPU.
    pub processes: Option<Vec<GpuProcess>>,
    /// The XIDs this GPU reported most recently (oldest first, at most [`xid::XID_RING`]),
    /// heard since `xid_since_s`. Absent when nobody listens: the source has no XID events,
    /// or the GPU does not support them.
    #[serde(default)]
    pub xids: Option<Vec<xid::XidEvent>>,
    /// When listening for this GPU's XIDs began (epoch seconds).
    #[serde(default)]
    pub xid_since_s: Option<f64>,
    /// XIDs heard since `xid_since_s` (the list keeps only the most recent).
    #[serde(default)]
    pub xid_count: Option<u64>,
    /// NVLink state and traffic now (GPUs with NVLink, through NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<nvlink::NvLinkSample>,
}

impl GpuSample {
    /// The newest XID this GPU reported, if any was heard.
    pub fn last_xid(&self) -> Option<&xid::XidEvent> {
        self.xids.as_ref().and_then(|x| x.last())
    }

    /// The newest XID heard within `window_s` of `now_s`.
    pub fn recent_xid(&self, now_s: f64, window_s: f64) -> Option<&xid::XidEvent> {
        self.last_xid().filter(|x| now_s - x.time_s <= window_s)
    }
}

/// Rows of GPU memory remapped to spares after errors, and the state of remapping.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemappedRows {
    /// Rows remapped after correctable errors.
    pub correctable: u64,
    /// Rows remapped after uncorrectable errors.
    pub uncorrectable: u64,
    /// A remap waits for the next GPU reset: reset the GPU when it is idle.
    pub pending: bool,
    /// A remap failed: the GPU should be replaced.
    pub failure: bool,
}

/// Pages of GPU memory retired after ECC errors (V100 and other data-centre GPUs before A100;
/// later parts remap rows instead), and whether a retirement waits for a reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredPages {
    /// Pages retired after multiple single-bit errors.
    pub single_bit: u64,
    /// Pages retired after a double-bit error.
    pub double_bit: u64,
    /// A retirement waits for the next GPU reset (or driver reload): reset when idle.
    pub pending: bool,
}

impl RetiredPages {
    /// A board near this many retired pages is near the end of its retirement table (64
    /// pages at most); NVIDIA's guidance is to replace a board that retired 60 or more.
    pub const REPLACE_TOTAL: u64 = 60;
    /// Pages retired for double-bit errors at which gpupilot says "replace": each was an
    /// uncorrectable error that killed the process using it, and a board that keeps having
    /// them is failing whatever its total.
    pub const REPLACE_DBE: u64 = 10;

    /// Pages retired, both causes.
    pub fn total(&self) -> u64 {
        self.single_bit + self.double_bit
    }

    /// Whether the board should be replaced.
    pub fn should_replace(&self) -> bool {
        self.total() >= Self::REPLACE_TOTAL || self.double_bit >= Self::REPLACE_DBE
    }
}

/// A process that holds memory on a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub name: Option<String>,
    pub used_memory_bytes: Option<u64>,
    /// Its user and, from its cgroup, its Slurm job, container or pod; absent where the
    /// process cannot be seen (another PID namespace, a simulated process).
    #[serde(default)]
    pub owner: Option<owner::ProcessOwner>,
}

/// The host the GPUs sit in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostSample {
    pub cpu_pct: Option<f64>,
    pub cpu_count: Option<usize>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub load_1m: Option<f64>,
    pub load_5m: Option<f64>,
    pub load_15m: Option<f64>,
}

/// Facts about the node that do not change while it runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub hostname: String,
    /// Which source produced the samples: "nvml" or "sim".
    pub source: String,
    pub driver_version: Option<String>,
    /// CUDA version the driver supports, as "12.4".
    pub cuda_driver_version: Option<String>,
    pub nvml_version: Option<String>,
    /// How the GPUs are wired (NVLink, PCIe, CPU and NUMA affinity), read once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<nvlink::NodeTopology>,
}

/// Everything sampled at one moment: node facts, every GPU, the host.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub time_s: f64,
    pub node: NodeInfo,
    pub gpus: Vec<GpuSample>,
    pub host: Option<HostSample>,
}

/// A place GPU samples come from: real NVML or the simulator.
///
/// Methods take `&self` and the type is `Sync` because the sampler reads each GPU from its own
/// thread: a call that hangs on one GPU must not hold up the others.
pub trait Source: Send + Sync {
    /// Node-wide facts (driver, CUDA), read once.
    fn node_info(&self) -> NodeInfo;
    /// How many GPUs the source enumerates.
    fn gpu_count(&self) -> usize;
    /// Read one GPU now. Never panics; unreadable fields are `None`, a lost GPU has `lost`.
    fn sample_gpu(&self, index: usize) -> GpuSample;
}

/// NVML clocks-event reason bits (nvml.h `nvmlClocksEventReason*`), with plain-word names.
pub mod throttle {
    pub const GPU_IDLE: u64 = 0x1;
    pub const APPLICATIONS_CLOCKS_SETTING: u64 = 0x2;
    pub const SW_POWER_CAP: u64 = 0x4;
    pub const HW_SLOWDOWN: u64 = 0x8;
    pub const SYNC_BOOST: u64 = 0x10;
    pub const SW_THERMAL_SLOWDOWN: u64 = 0x20;
    pub const HW_THERMAL_SLOWDOWN: u64 = 0x40;
    pub const HW_POWER_BRAKE_SLOWDOWN: u64 = 0x80;
    pub const DISPLAY_CLOCK_SETTING: u64 = 0x100;

    /// (bit, short badge, plain words) for every reason gpupilot names.
    pub const REASONS: &[(u64, &str, &str)] = &[
        (GPU_IDLE, "idle", "GPU idle"),
        (
            APPLICATIONS_CLOCKS_SETTING,
            "app-clk",
            "application clocks setting",
        ),
        (SW_POWER_CAP, "pwr-cap", "power cap (software)"),
        (HW_SLOWDOWN, "hw-slow", "hardware slowdown"),
        (SYNC_BOOST, "sync", "sync boost"),
        (
            SW_THERMAL_SLOWDOWN,
            "thermal",
            "thermal slowdown (software)",
        ),
        (
            HW_THERMAL_SLOWDOWN,
            "hw-therm",
            "thermal slowdown (hardware)",
        ),
        (
            HW_POWER_BRAKE_SLOWDOWN,
            "pwr-brake",
            "power brake (external)",
        ),
        (DISPLAY_CLOCK_SETTING, "display", "display clock setting"),
    ];

    /// True when the reasons say the clock is held down by power (cap or brake).
    pub fn power_limited(bits: u64) -> bool {
        bits & (SW_POWER_CAP | HW_POWER_BRAKE_SLOWDOWN) != 0
    }

    /// True when the reasons say the clock is held down by temperature.
    pub fn thermal_limited(bits: u64) -> bool {
        bits & (SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN) != 0
    }

    /// What holds a GPU's clock down, read from its reason bits: the one reading behind the
    /// console's badges (which of them warn), the history's power- and thermal-limited series
    /// and the advisor's throttling findings, so none of them can tell another story.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Held {
        /// The software power cap (`pwr-cap`): a cap someone or something set.
        pub power_cap: bool,
        /// The power cap or an external power brake ([`power_limited`]).
        pub power: bool,
        /// Software or hardware thermal slowdown (`thermal`, `hw-therm`; [`thermal_limited`]).
        pub thermal: bool,
        /// Hardware slowdown (`hw-slow`).
        pub hardware: bool,
    }

    impl Held {
        /// Any reason that costs speed (the badges that warn).
        pub fn any(self) -> bool {
            self.power || self.thermal || self.hardware
        }
    }

    /// The reading of `bits`.
    pub fn held(bits: u64) -> Held {
        Held {
            power_cap: bits & SW_POWER_CAP != 0,
            power: power_limited(bits),
            thermal: thermal_limited(bits),
            hardware: bits & HW_SLOWDOWN != 0,
        }
    }

    /// [`held`] over a window of samples: how many report reasons at all (a sample without
    /// them says nothing, it is not a sample without throttling), and how many of those each
    /// reason held.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct HeldCount {
        pub reporting: usize,
        pub power_cap: usize,
        pub thermal: usize,
    }

    impl HeldCount {
        /// Counts over the samples' reason bits, `None` where a sample has none.
        pub fn of(reasons: impl IntoIterator<Item = Option<u64>>) -> HeldCount {
            reasons
                .into_iter()
                .flatten()
                .map(held)
                .fold(HeldCount::default(), |c, h| HeldCount {
                    reporting: c.reporting + 1,
                    power_cap: c.power_cap + usize::from(h.power_cap),
                    thermal: c.thermal + usize::from(h.thermal),
                })
        }

        fn share(&self, n: usize) -> Option<f64> {
            (self.reporting > 0).then(|| n as f64 / self.reporting as f64)
        }

        /// The share of reporting samples held by the power cap (None: none reported).
        pub fn power_cap_share(&self) -> Option<f64> {
            self.share(self.power_cap)
        }

        /// The share of reporting samples in thermal slowdown (None: none reported).
        pub fn thermal_share(&self) -> Option<f64> {
            self.share(self.thermal)
        }
    }
}

/// Short badges for the reason bits that are set, in a fixed order ("pwr-cap", "thermal", …).
pub fn throttle_reason_badges(bits: u64) -> Vec<&'static str> {
    throttle::REASONS
        .iter()
        .filter(|(bit, _, _)| bits & bit != 0)
        .map(|(_, badge, _)| *badge)
        .collect()
}

/// Plain-word names for the reason bits that are set.
pub fn throttle_reason_names(bits: u64) -> Vec<&'static str> {
    throttle::REASONS
        .iter()
        .filter(|(bit, _, _)| bits & bit != 0)
        .map(|(_, _, words)| *words)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_names_follow_bits() {
        let bits = throttle::SW_POWER_CAP | throttle::HW_THERMAL_SLOWDOWN;
        assert_eq!(throttle_reason_badges(bits), vec!["pwr-cap", "hw-therm"]);
        assert_eq!(
            throttle_reason_names(bits),
            vec!["power cap (software)", "thermal slowdown (hardware)"]
        );
        assert!(throttle::power_limited(bits));
        assert!(throttle::thermal_limited(bits));
        assert!(throttle_reason_badges(0).is_empty());
        assert!(!throttle::power_limited(throttle::GPU_IDLE));
    }

    /// Every combination of reason bits: a badge that names a thermal or power-cap reason is
    /// shown exactly when the reading that the advisor counts says so, and it warns exactly
    /// when the reading says speed is lost.
    #[test]
    fn badges_and_the_advisors_reading_agree_on_every_combination() {
        for bits in 0..(1u64 << throttle::REASONS.len()) {
            let badges = throttle_reason_badges(bits);
            let h = throttle::held(bits);
            let thermal_badge = badges.iter().any(|b| *b == "thermal" || *b == "hw-therm");
            assert_eq!(thermal_badge, h.thermal, "bits {bits:#x}: {badges:?}");
            assert_eq!(badges.contains(&"pwr-cap"), h.power_cap, "bits {bits:#x}");
            let warns = badges.iter().any(|b| {
                matches!(
                    *b,
                    "pwr-cap" | "pwr-brake" | "thermal" | "hw-therm" | "hw-slow"
                )
            });
            assert_eq!(warns, h.any(), "bits {bits:#x}: {badges:?}");
        }
        let c = throttle::HeldCount::of([
            Some(throttle::HW_THERMAL_SLOWDOWN),
            None,
            Some(throttle::SW_POWER_CAP | throttle::SW_THERMAL_SLOWDOWN),
            Some(0),
            Some(throttle::GPU_IDLE),
        ]);
        assert_eq!(
            (c.reporting, c.thermal, c.power_cap),
            (4, 2, 1),
            "a sample without reasons is not counted"
        );
        assert_eq!(c.thermal_share(), Some(0.5));
        assert_eq!(c.power_cap_share(), Some(0.25));
        assert_eq!(throttle::HeldCount::of([None]).thermal_share(), None);
    }
}
