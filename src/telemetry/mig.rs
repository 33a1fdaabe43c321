//! MIG (Multi-Instance GPU): a GPU's MIG mode, the instances it is split into, their memory
//! and the processes in each — read through NVML.
//!
//! The instance layout (GPU and compute instance ids, profile, slices, UUID) changes only when
//! an administrator re-partitions the GPU, so it is read once and kept per GPU; every sample
//! walks the MIG device handles, reads each one's UUID and memory, and reads the layout again
//! only for a handle whose UUID is not the one kept. Absent is not zero: a GPU without MIG has
//! no `mig` at all, a field NVML does not answer is `None`.

use std::sync::Mutex;

use nvml_wrapper::Device;
use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};

/// A GPU's MIG state. Absent from a GPU that has no MIG (consumer parts, V100, an NVML
/// without the calls).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MigState {
    /// MIG mode now (`nvmlDeviceGetMigMode`'s current mode).
    pub enabled: bool,
    /// MIG mode after the next GPU reset; differs from `enabled` while a change waits.
    pub pending: bool,
    /// The GPU's MIG devices (one per compute instance), in NVML's order.
    #[serde(default)]
    pub instances: Vec<MigInstance>,
}

impl MigState {
    /// A mode change that waits for a GPU reset.
    pub fn change_pending(&self) -> bool {
        self.enabled != self.pending
    }
}

/// One MIG device: a compute instance inside a GPU instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MigInstance {
    /// `nvmlDeviceGetGpuInstanceId` (nvidia-smi's GI, dcgm-exporter's `GPU_I_ID`).
    pub gpu_instance_id: Option<u32>,
    /// `nvmlDeviceGetComputeInstanceId` (nvidia-smi's CI).
    pub compute_instance_id: Option<u32>,
    /// The profile, `1g.10gb`: from the MIG device's name (`… MIG 1g.10gb`).
    pub profile: Option<String>,
    /// Compute slices of the GPU instance (of 7), `nvmlDeviceGetAttributes`.
    pub slices: Option<u32>,
    /// `MIG-…`: what `CUDA_VISIBLE_DEVICES` takes to run on this instance.
    pub uuid: Option<String>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    /// Processes running in this instance.
    #[serde(default)]
    pub pids: Vec<u32>,
}

impl MigInstance {
    /// `0:7` (GPU index : GPU instance id): how `run --gpu` names an instance.
    pub fn address(&self, gpu: u32) -> Option<String> {
        self.gpu_instance_id.map(|gi| format!("{gpu}:{gi}"))
    }
}

/// The fields of an instance that change only with the layout.
#[derive(Debug, Clone, Default)]
struct Layout {
    uuid: Option<String>,
    gpu_instance_id: Option<u32>,
    compute_instance_id: Option<u32>,
    profile: Option<String>,
    slices: Option<u32>,
}

/// A GPU's MIG device slots (`nvmlDeviceGetMaxMigDeviceCount`) and its instances' layouts.
type GpuLayout = (u32, Vec<Layout>);

/// Each GPU's layout as last read (index: GPU).
#[derive(Debug, Default)]
pub(crate) struct MigCache {
    gpus: Vec<Mutex<Option<GpuLayout>>>,
}

/// The profile in a MIG device's name: `NVIDIA A100-SXM4-80GB MIG 1g.10gb` → `1g.10gb`.
pub fn profile_of_name(name: &str) -> Option<String> {
    let (_, p) = name.rsplit_once(" MIG ")?;
    let p = p.trim();
    (!p.is_empty()).then(|| p.to_string())
}

impl MigCache {
    pub(crate) fn new(count: usize) -> MigCache {
        MigCache {
            gpus: (0..count).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// GPU `index`'s MIG state; `None` when it has no MIG.
    pub(crate) fn read(&self, index: usize, dev: &Device<'_>) -> Option<MigState> {
        let mode = dev.mig_mode().ok()?;
        let mut state = MigState {
            enabled: mode.current == 1,
            pending: mode.pending == 1,
            instances: Vec::new(),
        };
        if !state.enabled {
            return Some(state);
        }
        let slot = self.gpus.get(index)?;
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        let (slots, layouts) = slot.get_or_insert_with(|| (0, Vec::new()));
        if *slots == 0 {
            *slots = dev.mig_device_count().unwrap_or(0);
        }
        let mut seen = Vec::new();
        for k in 0..*slots {
            let m = match dev.mig_device_by_index(k) {
                Ok(m) => m,
                Err(NvmlError::NotFound) => break,
                Err(_) => continue,
            };
            let uuid = m.uuid().ok();
            let kept = layouts
                .get(seen.len())
                .filter(|l| l.uuid.is_some() && l.uuid == uuid)
                .cloned();
            let layout = kept.unwrap_or_else(|| read_layout(&m, uuid));
            let memory = m.memory_info().ok();
            let pids = m
                .running_compute_processes()
                .map(|p| p.into_iter().map(|p| p.pid).collect())
                .unwrap_or_default();
            state.instances.push(MigInstance {
                gpu_instance_id: layout.gpu_instance_id,
                compute_instance_id: layout.compute_instance_id,
                profile: layout.profile.clone(),
                slices: layout.slices,
                uuid: layout.uuid.clone(),
                memory_used_bytes: memory.as_ref().map(|m| m.used),
                memory_total_bytes: memory.as_ref().map(|m| m.total),
                pids,
            });
            seen.push(layout);
        }
        *layouts = seen;
        Some(state)
    }
}

/// What does not change while the layout stays: read for a MIG device not seen before.
fn read_layout(m: &Device<'_>, uuid: Option<String>) -> Layout {
    Layout {
        uuid,
        gpu_instance_id: nvml_calls::gpu_instance_id(m).ok(),
        compute_instance_id: nvml_calls::compute_instance_id(m).ok(),
        profile: m.name().ok().as_deref().and_then(profile_of_name),
        slices: m.attributes().ok().map(|a| a.gpu_instance_slice_count),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_from_the_device_name() {
        assert_eq!(
            profile_of_name("NVIDIA A100-SXM4-80GB MIG 1g.10gb").as_deref(),
            Some("1g.10gb")
        );
        assert_eq!(
            profile_of_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me").as_deref(),
            Some("1g.10gb+me")
        );
        assert_eq!(profile_of_name("NVIDIA A100-SXM4-80GB"), None);
    }

    #[test]
    fn pending_change_and_address() {
        let s = MigState {
            enabled: false,
            pending: true,
            instances: vec![],
        };
        assert!(s.change_pending());
        let i = MigInstance {
            gpu_instance_id: Some(7),
            ..MigInstance::default()
        };
        assert_eq!(i.address(0).as_deref(), Some("0:7"));
        assert_eq!(MigInstance::default().address(0), None);
    }
}
