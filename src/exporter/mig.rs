//! MIG on `/metrics`, as dcgm-exporter exports it: a GPU in MIG mode has its framebuffer
//! series (`DCGM_FI_DEV_FB_USED`, `_FREE`, `_TOTAL`) once per GPU instance, with the GPU's
//! labels and `GPU_I_PROFILE` (`1g.10gb`) and `GPU_I_ID` (the GPU instance id) — not once for
//! the whole GPU, so that `sum(DCGM_FI_DEV_FB_USED)` counts each byte once. The GPU's other
//! series (power, temperature, clocks) stay whole-GPU, without those labels; its utilization is
//! absent, as NVML does not report one for a GPU in MIG mode.

use crate::telemetry::GpuSample;
use crate::telemetry::mig::MigInstance;

use super::escape_label;

const MIB: f64 = 1024.0 * 1024.0;

/// The per-instance value of a framebuffer family; None for every other family.
fn instance_value(family: &str, m: &MigInstance) -> Option<Option<f64>> {
    let mib = |b: u64| (b as f64 / MIB).round();
    Some(match family {
        "DCGM_FI_DEV_FB_USED" => m.memory_used_bytes.map(mib),
        "DCGM_FI_DEV_FB_FREE" => match (m.memory_total_bytes, m.memory_used_bytes) {
            (Some(t), Some(u)) => Some(mib(t.saturating_sub(u))),
            _ => None,
        },
        "DCGM_FI_DEV_FB_TOTAL" => m.memory_total_bytes.map(mib),
        _ => return None,
    })
}

/// `family`'s samples for `g` when `g` is in MIG mode and `family` is one that dcgm-exporter
/// exports per GPU instance: one per instance, `gpu_labels` (the GPU's `{…}`) with
/// `GPU_I_PROFILE` and `GPU_I_ID` added. None: export the GPU as a whole.
pub(super) fn per_instance(
    family: &str,
    g: &GpuSample,
    gpu_labels: &str,
) -> Option<Vec<(String, f64)>> {
    let mig = g.mig.as_ref().filter(|m| m.enabled)?;
    instance_value(family, &MigInstance::default())?;
    let base = gpu_labels.strip_suffix('}')?;
    Some(
        mig.instances
            .iter()
            .filter_map(|m| {
                let v = instance_value(family, m).flatten()?;
                let labels = format!(
                    "{base},GPU_I_PROFILE=\"{}\",GPU_I_ID=\"{}\"}}",
                    escape_label(m.profile.as_deref().unwrap_or("")),
                    m.gpu_instance_id.map(|i| i.to_string()).unwrap_or_default()
                );
                Some((labels, v))
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::mig::MigState;

    #[test]
    fn memory_per_instance_with_its_labels_other_families_whole() {
        let g = GpuSample {
            mig: Some(MigState {
                enabled: true,
                pending: true,
                instances: vec![MigInstance {
                    gpu_instance_id: Some(7),
                    profile: Some("1g.10gb".into()),
                    memory_used_bytes: Some(6144 << 20),
                    memory_total_bytes: Some(9728 << 20),
                    ..MigInstance::default()
                }],
            }),
            ..GpuSample::default()
        };
        let l = "{gpu=\"0\"}";
        assert_eq!(
            per_instance("DCGM_FI_DEV_FB_FREE", &g, l).unwrap(),
            [(
                "{gpu=\"0\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"7\"}".to_string(),
                3584.0
            )]
        );
        assert_eq!(per_instance("DCGM_FI_DEV_POWER_USAGE", &g, l), None);
        let whole = GpuSample::default();
        assert_eq!(per_instance("DCGM_FI_DEV_FB_USED", &whole, l), None);
    }
}
