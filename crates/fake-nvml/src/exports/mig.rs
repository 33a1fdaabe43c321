//! MIG (Multi-Instance GPU): MIG device handles, their GPU and compute instance ids and
//! attributes, and the profile table — served from the scenario's `[[mig]]` tables.
//!
//! A MIG device handle points into a static array of its own, so a physical handle and a MIG
//! handle never compare equal. As on a real driver, only some calls accept a MIG handle (UUID,
//! name, memory, processes, the MIG calls here); every other call answers
//! `NVML_ERROR_NOT_SUPPORTED` for one (see `index_of`). A GPU in MIG mode reports no
//! utilization of its own (NOT_SUPPORTED), as the driver does: the GPU is shared by instances.

use std::ffi::{c_uint, c_ulonglong};

use super::*;
use crate::context::Proc;
use crate::scenario::mig::{MigGpu, MigInstance, MigProfile};

/// Most MIG devices on one GPU (seven 1g instances).
pub(crate) const MAX_MIG: usize = 7;

static MIG_DEVICES: [nvmlDevice_st; MAX_GPUS * MAX_MIG] = {
    let mut a = [nvmlDevice_st { index: 0 }; MAX_GPUS * MAX_MIG];
    let mut i = 0;
    while i < MAX_GPUS * MAX_MIG {
        a[i].index = i as u32;
        i += 1;
    }
    a
};

fn mig_handle(gpu: usize, k: usize) -> nvmlDevice_t {
    std::ptr::from_ref(&MIG_DEVICES[gpu * MAX_MIG + k]).cast_mut()
}

/// (GPU, position among its MIG devices) of a MIG handle; `None` for any other pointer.
pub(super) fn mig_index_of(device: nvmlDevice_t) -> Option<(usize, usize)> {
    let base = MIG_DEVICES.as_ptr() as usize;
    let size = std::mem::size_of::<nvmlDevice_st>();
    let p = device as usize;
    if p < base || (p - base) % size != 0 || (p - base) / size >= MAX_GPUS * MAX_MIG {
        return None;
    }
    let i = (p - base) / size;
    Some((i / MAX_MIG, i % MAX_MIG))
}

/// What a handle names: a physical GPU, or instance `k` of GPU `i`.
#[derive(Clone, Copy)]
pub(super) enum Target {
    Gpu(usize),
    Mig(usize, usize),
}

/// A call that accepts physical and MIG handles alike: the handle is checked, the node brought
/// to now, and the (parent) GPU's faults applied.
pub(super) fn with_target(
    name: &str,
    device: nvmlDevice_t,
    f: impl FnOnce(&mut Context, Target) -> Res,
) -> nvmlReturn_t {
    let Some((i, k)) = mig_index_of(device) else {
        return with_device(name, device, |ctx, i| f(ctx, Target::Gpu(i)));
    };
    guarded(|| {
        stall(name, |_| Some(i));
        let mut rt = runtime();
        let ctx = rt.ctx.as_mut().ok_or(NVML_ERROR_UNINITIALIZED)?;
        ctx.sync();
        if i >= ctx.gpu_count() || instance(ctx, i, k).is_none() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        device_faults(ctx, name, i)?;
        f(ctx, Target::Mig(i, k))
    })
}

/// GPU `i`'s MIG state, if it is in MIG mode now.
pub(super) fn enabled(ctx: &Context, i: usize) -> Option<&MigGpu> {
    ctx.scenario
        .mig
        .get(i)
        .and_then(Option::as_ref)
        .filter(|m| m.enabled)
}

fn instance(ctx: &Context, i: usize, k: usize) -> Option<&MigInstance> {
    enabled(ctx, i).and_then(|m| m.instances.get(k))
}

fn instance_or_invalid(ctx: &Context, i: usize, k: usize) -> Result<&MigInstance, nvmlReturn_t> {
    instance(ctx, i, k).ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`: stable for the seed, GPU and GPU instance id.
pub(super) fn mig_uuid(ctx: &Context, i: usize, k: usize) -> Result<String, nvmlReturn_t> {
    let gi = instance_or_invalid(ctx, i, k)?.gpu_instance_id;
    let h = crate::scenario::fnv1a(format!("{}/{gi}", ctx.identities[i].uuid).as_bytes());
    let l = crate::scenario::fnv1a(format!("{h:x}/mig").as_bytes());
    Ok(format!(
        "MIG-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xffff,
        l >> 48,
        l & 0xffff_ffff_ffff
    ))
}

/// What `nvmlDeviceGetName` answers for a MIG device: `NVIDIA A100-SXM4-80GB MIG 1g.10gb`.
pub(super) fn mig_name(ctx: &Context, i: usize, k: usize) -> Result<String, nvmlReturn_t> {
    let p = instance_or_invalid(ctx, i, k)?.profile;
    Ok(format!("{} MIG {}", ctx.gpu(i).spec().name, p.name))
}

/// (total, used) bytes of a target. An instance's used memory is what its processes hold; a
/// GPU in MIG mode reports the sum of its instances'.
pub(super) fn memory_of(ctx: &mut Context, t: Target) -> (u64, u64) {
    const MIB: u64 = 1024 * 1024;
    match t {
        Target::Mig(i, k) => {
            let Some(inst) = instance(ctx, i, k).cloned() else {
                return (0, 0);
            };
            let total = inst.profile.memory_mib * MIB;
            let used: u64 = ctx
                .processes(i)
                .iter()
                .filter(|p| inst.pids.contains(&p.pid))
                .map(|p| p.used_bytes)
                .sum();
            (total, used.min(total))
        }
        Target::Gpu(i) => {
            let r = ctx.reading(i);
            let (total, used) = (r.memory_total_bytes, r.memory_used_bytes);
            match enabled(ctx, i).map(|m| m.instances.len()) {
                Some(n) => {
                    let used: u64 = (0..n).map(|k| memory_of(ctx, Target::Mig(i, k)).1).sum();
                    (total, used.min(total))
                }
                None => (total, used.min(total)),
            }
        }
    }
}

/// The processes a target reports, each with its (GPU instance, compute instance) ids —
/// nvml.h's "invalid" id off MIG.
pub(super) fn processes_of(
    ctx: &mut Context,
    t: Target,
    procs: Vec<Proc>,
) -> Vec<(Proc, c_uint, c_uint)> {
    const NO_INSTANCE: c_uint = 0xffff_ffff;
    let (i, only) = match t {
        Target::Gpu(i) => (i, None),
        Target::Mig(i, k) => (i, Some(k)),
    };
    let Some(mig) = enabled(ctx, i) else {
        return procs
            .into_iter()
            .map(|p| (p, NO_INSTANCE, NO_INSTANCE))
            .collect();
    };
    procs
        .into_iter()
        .filter_map(|p| {
            let k = mig.instances.iter().position(|m| m.pids.contains(&p.pid))?;
            if only.is_some_and(|o| o != k) {
                return None;
            }
            let gi = mig.instances[k].gpu_instance_id;
            Some((p, gi, 0))
        })
        .collect()
}

/// The GPU a call on its own utilization names, refused when the GPU is in MIG mode.
pub(super) fn no_utilization_in_mig(ctx: &Context, i: usize) -> Res {
    if enabled(ctx, i).is_some() {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    Ok(())
}

/// The MIG handle with `uuid`, if one of the enabled GPUs has that instance.
pub(super) fn handle_by_uuid(ctx: &Context, uuid: &str) -> Option<nvmlDevice_t> {
    (0..ctx.gpu_count()).find_map(|i| {
        let n = enabled(ctx, i)?.instances.len();
        (0..n)
            .find(|k| mig_uuid(ctx, i, *k).is_ok_and(|u| u == uuid))
            .map(|k| mig_handle(i, k))
    })
}

/// nvml.h's `nvmlDeviceAttributes_t`.
#[repr(C)]
pub struct nvmlDeviceAttributes_t {
    pub multiprocessorCount: c_uint,
    pub sharedCopyEngineCount: c_uint,
    pub sharedDecoderCount: c_uint,
    pub sharedEncoderCount: c_uint,
    pub sharedJpegCount: c_uint,
    pub sharedOfaCount: c_uint,
    pub gpuInstanceSliceCount: c_uint,
    pub computeInstanceSliceCount: c_uint,
    pub memorySizeMB: c_ulonglong,
}

/// nvml.h's `nvmlGpuInstanceProfileInfo_t`.
#[repr(C)]
pub struct nvmlGpuInstanceProfileInfo_t {
    pub id: c_uint,
    pub isP2pSupported: c_uint,
    pub sliceCount: c_uint,
    pub instanceCount: c_uint,
    pub multiprocessorCount: c_uint,
    pub copyEngineCount: c_uint,
    pub decoderCount: c_uint,
    pub encoderCount: c_uint,
    pub jpegCount: c_uint,
    pub ofaCount: c_uint,
    pub memorySizeMB: c_ulonglong,
}

/// MIG mode now and after the next reset (`[[mig]]` `enabled` / `pending`); NOT_SUPPORTED on
/// parts without MIG and on MIG handles.
pub(super) fn mig_mode(ctx: &Context, i: usize) -> Result<(c_uint, c_uint), nvmlReturn_t> {
    if !crate::identity::has_mig(ctx.gpu(i).spec()) {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    Ok(match ctx.scenario.mig.get(i).and_then(Option::as_ref) {
        Some(m) => (c_uint::from(m.enabled), c_uint::from(m.pending)),
        None => (0, 0),
    })
}

fn attributes(p: &MigProfile) -> nvmlDeviceAttributes_t {
    nvmlDeviceAttributes_t {
        multiprocessorCount: p.multiprocessors,
        sharedCopyEngineCount: p.copy_engines,
        sharedDecoderCount: p.slices.div_ceil(2),
        sharedEncoderCount: 0,
        sharedJpegCount: u32::from(p.slices == 7),
        sharedOfaCount: u32::from(p.slices == 7),
        gpuInstanceSliceCount: p.slices,
        computeInstanceSliceCount: p.slices,
        memorySizeMB: p.memory_mib,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    migDevice: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMigDeviceHandleByIndex", device, |ctx, i| {
        mig_mode(ctx, i)?;
        let n = enabled(ctx, i).map_or(0, |m| m.instances.len());
        if index as usize >= MAX_MIG {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if index as usize >= n {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        put(migDevice, mig_handle(i, index as usize))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    migDevice: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_target(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        migDevice,
        |_, t| match t {
            Target::Mig(i, _) => put(device, handle_of(i)),
            Target::Gpu(_) => Err(NVML_ERROR_INVALID_ARGUMENT),
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    with_target("nvmlDeviceGetGpuInstanceId", device, |ctx, t| match t {
        Target::Mig(i, k) => put(id, instance_or_invalid(ctx, i, k)?.gpu_instance_id),
        Target::Gpu(_) => Err(NVML_ERROR_NOT_SUPPORTED),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    with_target("nvmlDeviceGetComputeInstanceId", device, |ctx, t| match t {
        Target::Mig(i, k) => {
            instance_or_invalid(ctx, i, k)?;
            put(id, 0)
        }
        Target::Gpu(_) => Err(NVML_ERROR_NOT_SUPPORTED),
    })
}

fn device_attributes(
    name: &str,
    device: nvmlDevice_t,
    out: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    with_target(name, device, |ctx, t| match t {
        Target::Mig(i, k) => put(out, attributes(instance_or_invalid(ctx, i, k)?.profile)),
        // nvml.h: "currently only supports MIG device handles".
        Target::Gpu(_) => Err(NVML_ERROR_NOT_SUPPORTED),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    device_attributes("nvmlDeviceGetAttributes_v2", device, attributes)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    device_attributes("nvmlDeviceGetAttributes", device, attributes)
}

/// The profile table of the part (`profile` is nvml.h's profile index), whatever the mode:
/// NOT_SUPPORTED on parts fake-nvml has no table for, and for profiles the part lacks.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetGpuInstanceProfileInfo", device, |ctx, i| {
        mig_mode(ctx, i)?;
        let table = crate::scenario::mig::profiles_of(ctx.gpu(i).spec().id)
            .ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let p = table
            .iter()
            .find(|p| p.nvml_profile == profile)
            .ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let a = attributes(p);
        put(
            info,
            nvmlGpuInstanceProfileInfo_t {
                id: p.id,
                isP2pSupported: 0,
                sliceCount: p.slices,
                instanceCount: p.max_instances,
                multiprocessorCount: p.multiprocessors,
                copyEngineCount: p.copy_engines,
                decoderCount: a.sharedDecoderCount,
                encoderCount: 0,
                jpegCount: a.sharedJpegCount,
                ofaCount: a.sharedOfaCount,
                memorySizeMB: p.memory_mib,
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_sizes_match_nvml_h() {
        assert_eq!(std::mem::size_of::<nvmlDeviceAttributes_t>(), 40);
        assert_eq!(std::mem::size_of::<nvmlGpuInstanceProfileInfo_t>(), 48);
    }

    #[test]
    fn mig_handles_are_not_device_handles() {
        let h = mig_handle(2, 3);
        assert_eq!(mig_index_of(h), Some((2, 3)));
        assert_eq!(mig_index_of(handle_of(2)), None);
    }
}
