//! What a GPU is: names, ids, PCI identity, architecture, capabilities and modes that only
//! change through setters (persistence) or never (ECC, MIG, display).

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};

use super::*;
use crate::identity;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    super::mig::with_target("nvmlDeviceGetName", device, |ctx, t| match t {
        super::mig::Target::Gpu(i) => put_str(name, length, ctx.gpu(i).spec().name),
        super::mig::Target::Mig(i, k) => put_str(name, length, &super::mig::mig_name(ctx, i, k)?),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    super::mig::with_target("nvmlDeviceGetUUID", device, |ctx, t| match t {
        super::mig::Target::Gpu(i) => put_str(uuid, length, &ctx.identities[i].uuid),
        super::mig::Target::Mig(i, k) => put_str(uuid, length, &super::mig::mig_uuid(ctx, i, k)?),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetSerial", device, |ctx, i| {
        put_str(serial, length, &ctx.identities[i].serial)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(
    device: nvmlDevice_t,
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetVbiosVersion", device, |_, _| {
        put_str(version, length, "96.00.99.00.01")
    })
}

fn pci_info(ctx: &Context, i: usize) -> nvmlPciInfo_t {
    let id = &ctx.identities[i];
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: id.pci_domain,
        bus: id.pci_bus,
        device: 0,
        pciDeviceId: id.pci_device_id,
        pciSubSystemId: id.pci_subsystem_id,
        busId: [0; 32],
    };
    fill(&mut info.busIdLegacy, &id.bus_id_legacy());
    fill(&mut info.busId, &id.bus_id());
    info
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPciInfo_v3", device, |ctx, i| {
        put(pci, pci_info(ctx, i))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPciInfo_v2", device, |ctx, i| {
        put(pci, pci_info(ctx, i))
    })
}

/// The v1 struct is 52 bytes: writing the 68-byte v2 layout would overrun old callers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_v1_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPciInfo", device, |ctx, i| {
        let v2 = pci_info(ctx, i);
        put(
            pci,
            nvmlPciInfo_v1_t {
                busId: v2.busIdLegacy,
                domain: v2.domain,
                bus: v2.bus,
                device: v2.device,
                pciDeviceId: v2.pciDeviceId,
                pciSubSystemId: v2.pciSubSystemId,
                reserved: [0; 4],
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    type_: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetBrand", device, |ctx, i| {
        let spec = ctx.gpu(i).spec();
        put(
            type_,
            if identity::is_datacenter(spec) {
                NVML_BRAND_NVIDIA
            } else {
                NVML_BRAND_GEFORCE_RTX
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetArchitecture", device, |ctx, i| {
        put(arch, identity::architecture(ctx.gpu(i).spec()))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetCudaComputeCapability", device, |ctx, i| {
        if major.is_null() || minor.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let (ma, mi) = ctx.gpu(i).spec().compute_capability;
        put(major, ma as c_int)?;
        put(minor, mi as c_int)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumGpuCores(
    device: nvmlDevice_t,
    numCores: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetNumGpuCores", device, |ctx, i| {
        put(numCores, identity::cuda_cores(ctx.gpu(i).spec()))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMultiGpuBoard(
    device: nvmlDevice_t,
    multiGpuBool: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMultiGpuBoard", device, |_, _| {
        put(multiGpuBool, 0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBoardId(
    device: nvmlDevice_t,
    boardId: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetBoardId", device, |ctx, i| {
        put(boardId, ctx.identities[i].pci_bus << 8)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDisplayMode(
    device: nvmlDevice_t,
    display: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetDisplayMode", device, |_, _| {
        put(display, NVML_FEATURE_DISABLED)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDisplayActive(
    device: nvmlDevice_t,
    isActive: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetDisplayActive", device, |_, _| {
        put(isActive, NVML_FEATURE_DISABLED)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPersistenceMode", device, |ctx, i| {
        put(
            mode,
            if ctx.reading(i).persistence {
                NVML_FEATURE_ENABLED
            } else {
                NVML_FEATURE_DISABLED
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPowerManagementMode", device, |_, _| {
        put(mode, NVML_FEATURE_ENABLED)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetComputeMode", device, |_, _| {
        put(mode, NVML_COMPUTEMODE_DEFAULT)
    })
}

/// Windows driver models: not a Linux concept, as on a real Linux driver.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDriverModel(
    device: nvmlDevice_t,
    _current: *mut c_uint,
    _pending: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetDriverModel", device, |_, _| {
        Err(NVML_ERROR_NOT_SUPPORTED)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDriverModel_v2(
    device: nvmlDevice_t,
    _current: *mut c_uint,
    _pending: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetDriverModel_v2", device, |_, _| {
        Err(NVML_ERROR_NOT_SUPPORTED)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBusType(
    device: nvmlDevice_t,
    type_: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetBusType", device, |_, _| {
        put(type_, NVML_BUS_TYPE_PCIE)
    })
}

/// MIG is available on data-centre Ampere/Hopper/Blackwell parts, off unless the scenario's
/// `[[mig]]` says otherwise.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    currentMode: *mut c_uint,
    pendingMode: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMigMode", device, |ctx, i| {
        let (current, pending) = super::mig::mig_mode(ctx, i)?;
        if currentMode.is_null() || pendingMode.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        put(currentMode, current)?;
        put(pendingMode, pending)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMaxMigDeviceCount", device, |ctx, i| {
        put(
            count,
            if identity::has_mig(ctx.gpu(i).spec()) {
                7
            } else {
                0
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    isMigDevice: *mut c_uint,
) -> nvmlReturn_t {
    super::mig::with_target("nvmlDeviceIsMigDeviceHandle", device, |_, t| {
        put(
            isMigDevice,
            c_uint::from(matches!(t, super::mig::Target::Mig(..))),
        )
    })
}

/// ECC is on for data-centre parts and off (counters unsupported) for consumer ones.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetEccMode", device, |ctx, i| {
        if current.is_null() || pending.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let on = if identity::is_datacenter(ctx.gpu(i).spec()) {
            NVML_FEATURE_ENABLED
        } else {
            NVML_FEATURE_DISABLED
        };
        put(current, on)?;
        put(pending, on)
    })
}

fn ecc_counter<T>(
    ctx: &Context,
    i: usize,
    error_type: c_uint,
    counter_type: c_uint,
    out: *mut T,
    value: impl FnOnce(u64) -> T,
) -> Res {
    if !identity::is_datacenter(ctx.gpu(i).spec()) {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    let valid_error = matches!(
        error_type,
        NVML_MEMORY_ERROR_TYPE_CORRECTED | NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    );
    let valid_counter = matches!(counter_type, NVML_VOLATILE_ECC | NVML_AGGREGATE_ECC);
    if !valid_error || !valid_counter {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // No errors unless the scenario says so; volatile and aggregate alike.
    let errors = ctx.scenario.ecc_errors.get(i).copied().unwrap_or_default();
    let count = if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED {
        errors.corrected
    } else {
        errors.uncorrected
    };
    put(out, value(count))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    errorType: c_uint,
    counterType: c_uint,
    eccCounts: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetTotalEccErrors", device, |ctx, i| {
        ecc_counter(ctx, i, errorType, counterType, eccCounts, |n| n)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(
    device: nvmlDevice_t,
    errorType: c_uint,
    counterType: c_uint,
    _locationType: c_uint,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMemoryErrorCounter", device, |ctx, i| {
        ecc_counter(ctx, i, errorType, counterType, count, |n| n)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDetailedEccErrors(
    device: nvmlDevice_t,
    errorType: c_uint,
    counterType: c_uint,
    eccCounts: *mut nvmlEccErrorCounts_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetDetailedEccErrors", device, |ctx, i| {
        // Every error a scenario gives a GPU is in device memory.
        let counts = |n| nvmlEccErrorCounts_t {
            l1Cache: 0,
            l2Cache: 0,
            deviceMemory: n,
            registerFile: 0,
        };
        ecc_counter(ctx, i, errorType, counterType, eccCounts, counts)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumFans(
    device: nvmlDevice_t,
    numFans: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetNumFans", device, |ctx, i| {
        put(numFans, u32::from(ctx.gpu(i).spec().has_fan))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    device: nvmlDevice_t,
    maxLinkGen: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMaxPcieLinkGeneration", device, |ctx, i| {
        put(maxLinkGen, ctx.gpu(i).spec().pcie_gen)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuMaxPcieLinkGeneration(
    device: nvmlDevice_t,
    maxLinkGenDevice: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetGpuMaxPcieLinkGeneration", device, |ctx, i| {
        put(maxLinkGenDevice, ctx.gpu(i).spec().pcie_gen)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    device: nvmlDevice_t,
    maxLinkWidth: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMaxPcieLinkWidth", device, |ctx, i| {
        put(maxLinkWidth, ctx.gpu(i).spec().pcie_width)
    })
}

/// `nvmlPcieLinkMaxSpeed`: NVML_PCIE_LINK_MAX_SPEED_* enum values, 1 (2.5 GT/s) per generation up.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieLinkMaxSpeed(
    device: nvmlDevice_t,
    maxSpeed: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPcieLinkMaxSpeed", device, |ctx, i| {
        put(maxSpeed, ctx.gpu(i).spec().pcie_gen.min(6))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(
    device: nvmlDevice_t,
    bar1Memory: *mut nvmlBAR1Memory_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetBAR1MemoryInfo", device, |ctx, i| {
        let total = identity::bar1_bytes(ctx.gpu(i).spec());
        // The driver maps a few MiB for its own use; a busy GPU a little more.
        let used = if ctx.reading(i).util_gpu_pct > 0.0 {
            9 << 20
        } else {
            2 << 20
        };
        put(
            bar1Memory,
            nvmlBAR1Memory_t {
                bar1Total: total,
                bar1Free: total - used,
                bar1Used: used,
            },
        )
    })
}
