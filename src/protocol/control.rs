//! The values of the GPU-settings requests: power caps, clock locks, the driver's target
//! temperature, and what `power` reports per GPU.

use serde::{Deserialize, Serialize};

use crate::control::PowerLimits;
use crate::control::power::{ClockRange, GpuOriginals, TempTarget};

/// Which GPUs a change applies to: JSON `"all"` (the default) or a list of indices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TargetGpus {
    #[default]
    All,
    Some(Vec<u32>),
}

impl Serialize for TargetGpus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TargetGpus::All => s.serialize_str("all"),
            TargetGpus::Some(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for TargetGpus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            List(Vec<u32>),
        }
        match Raw::deserialize(d)? {
            Raw::Word(w) if w == "all" => Ok(TargetGpus::All),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "gpus `{w}`: give \"all\" or a list of GPU indices"
            ))),
            Raw::List(v) => Ok(TargetGpus::Some(v)),
        }
    }
}

/// One GPU's settings as the daemon sees them (the answer to `power`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSettings {
    pub index: u32,
    #[serde(default)]
    pub uuid: Option<String>,
    /// The power limits, watts; absent when they cannot be read (see `notes`).
    #[serde(default)]
    pub power: Option<PowerLimits>,
    /// The SM clocks a lock may name.
    #[serde(default)]
    pub clocks: Option<ClockRange>,
    /// The SM clocks this daemon locked, `[min, max]` MHz (absent: not locked by gpupilot).
    #[serde(default)]
    pub locked_clocks_mhz: Option<[u32; 2]>,
    /// The driver's target temperature and its range; absent where the GPU has none.
    #[serde(default)]
    pub gpu_max: Option<TempTarget>,
    /// The values found before gpupilot's first change (what `reset` restores).
    #[serde(default)]
    pub original: GpuOriginals,
    /// What could not be read, in words.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// One setting changed on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuChange {
    pub gpu: u32,
    /// `power_limit`, `locked_clocks` or `gpu_max_temp`.
    pub what: String,
    /// In words with units: `700 W`, `unlocked`, `1200–1500 MHz`, `87 °C`.
    pub old: Option<String>,
    pub new: Option<String>,
}
