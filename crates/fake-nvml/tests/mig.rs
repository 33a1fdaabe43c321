//! MIG through nvml-wrapper (the binding gpupilot uses) and nvitop: the A100 of
//! `scenarios/mig-a100.toml` in MIG mode with four instances, the H100 next to it not, and a
//! V100 that has no MIG at all.

mod common;

use common::{isolate, nvml};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

const MIG_A100: &str = include_str!("../scenarios/mig-a100.toml");
const MIB: u64 = 1024 * 1024;

#[test]
fn mig_devices_of_the_a100() {
    let Some(_) = isolate("mig_devices_of_the_a100", MIG_A100) else {
        return;
    };
    let nvml = nvml();
    let a100 = nvml.device_by_index(0).unwrap();
    let mode = a100.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(a100.mig_device_count().unwrap(), 7);
    assert!(!a100.mig_is_mig_device_handle().unwrap());
    // A GPU in MIG mode has no utilization of its own.
    assert!(matches!(
        a100.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));

    // By GPU instance id: the 3g.40gb (id 2), then the three 1g.10gb (7, 8, 9).
    let expected = [
        ("3g.40gb", 3, 40_192, 30_720),
        ("1g.10gb", 1, 9_728, 6_144),
        ("1g.10gb", 1, 9_728, 0),
        ("1g.10gb", 1, 9_728, 0),
    ];
    let mut uuids = Vec::new();
    let mut used_sum = 0;
    for (k, (profile, slices, mib, used_mib)) in expected.into_iter().enumerate() {
        let m = a100.mig_device_by_index(k as u32).unwrap();
        assert!(m.mig_is_mig_device_handle().unwrap());
        assert_eq!(
            m.name().unwrap(),
            format!("NVIDIA A100-SXM4-80GB MIG {profile}")
        );
        let uuid = m.uuid().unwrap();
        assert!(uuid.starts_with("MIG-") && uuid.len() == 40, "{uuid}");
        assert_eq!(
            nvml.device_by_uuid(uuid.as_str()).unwrap().uuid().unwrap(),
            uuid
        );
        uuids.push(uuid);
        let mem = m.memory_info().unwrap();
        assert_eq!(mem.total, mib * MIB);
        assert_eq!(mem.used, used_mib * MIB);
        used_sum += mem.used;
        let attrs = m.attributes().unwrap();
        assert_eq!(attrs.gpu_instance_slice_count, slices);
        assert_eq!(attrs.memory_size_mb, mib);
        assert_eq!(
            m.mig_parent_device().unwrap().uuid().unwrap(),
            a100.uuid().unwrap()
        );
        // Most calls do not take a MIG handle.
        assert!(matches!(
            m.utilization_rates(),
            Err(NvmlError::NotSupported)
        ));
        assert!(matches!(m.power_usage(), Err(NvmlError::NotSupported)));
        let procs = m.running_compute_processes().unwrap();
        assert_eq!(procs.len(), usize::from(used_mib > 0), "{procs:?}");
    }
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), 4, "distinct MIG UUIDs");
    assert!(matches!(
        a100.mig_device_by_index(4),
        Err(NvmlError::NotFound)
    ));
    // The parent's memory is its instances'.
    assert_eq!(a100.memory_info().unwrap().used, used_sum);

    // The parent lists every process with its GPU and compute instance.
    let mut procs: Vec<_> = a100
        .running_compute_processes()
        .unwrap()
        .into_iter()
        .map(|p| {
            (
                p.pid,
                p.gpu_instance_id,
                p.compute_instance_id,
                p.used_gpu_memory,
            )
        })
        .collect();
    procs.sort_by_key(|p| p.0);
    assert_eq!(
        procs,
        [
            (4200100, Some(7), Some(0), UsedGpuMemory::Used(6144 * MIB)),
            (4200101, Some(2), Some(0), UsedGpuMemory::Used(30_720 * MIB)),
        ]
    );

    // The H100 is MIG-capable but not in MIG mode.
    let h100 = nvml.device_by_index(1).unwrap();
    let mode = h100.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (0, 0));
    assert!(matches!(
        h100.mig_device_by_index(0),
        Err(NvmlError::NotFound)
    ));
    assert!(h100.utilization_rates().is_ok());
    let p = h100.running_compute_processes().unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(
        (p[0].gpu_instance_id, p[0].compute_instance_id),
        (None, None)
    );
}

const V100_AND_PENDING: &str = r#"
gpus = ["v100-sxm2", "a100-sxm-80gb"]
[[mig]]
gpu = 1
enabled = false
pending = true
"#;

#[test]
fn no_mig_on_a_v100_and_a_pending_change() {
    let Some(_) = isolate("no_mig_on_a_v100_and_a_pending_change", V100_AND_PENDING) else {
        return;
    };
    let nvml = nvml();
    let v100 = nvml.device_by_index(0).unwrap();
    assert!(matches!(v100.mig_mode(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        v100.mig_device_by_index(0),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(v100.profile_info(0), Err(NvmlError::NotSupported)));
    let a100 = nvml.device_by_index(1).unwrap();
    let mode = a100.mig_mode().unwrap();
    assert_eq!(
        (mode.current, mode.pending),
        (0, 1),
        "enabled after the next reset"
    );
    assert!(matches!(
        a100.mig_device_by_index(0),
        Err(NvmlError::NotFound)
    ));
    let p = a100.profile_info(0).unwrap();
    assert_eq!(
        (p.id, p.slice_count, p.instance_count, p.memory_size_mb),
        (19, 1, 7, 9_728)
    );
}
