//! Counting GPUs and turning indices, UUIDs, serials and PCI addresses into handles.

use std::ffi::{c_char, c_uint};

use super::*;
use crate::identity::parse_bus_id;

fn count(name: &str, out: *mut c_uint) -> nvmlReturn_t {
    with_system(name, |ctx| put(out, ctx.gpu_count() as c_uint))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> nvmlReturn_t {
    count("nvmlDeviceGetCount_v2", deviceCount)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(deviceCount: *mut c_uint) -> nvmlReturn_t {
    count("nvmlDeviceGetCount", deviceCount)
}

/// Hands out the handle of the GPU `find` picks, honouring that GPU's faults: a lost GPU
/// answers `NVML_ERROR_GPU_IS_LOST` here too, as the real library does.
fn lookup(
    name: &str,
    out: *mut nvmlDevice_t,
    find: impl FnOnce(&Context) -> Result<usize, nvmlReturn_t>,
) -> nvmlReturn_t {
    with_system(name, |ctx| {
        if out.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        ctx.sync();
        let i = find(ctx)?;
        device_faults(ctx, name, i)?;
        put(out, handle_of(i))
    })
}

fn by_index(name: &str, index: c_uint, out: *mut nvmlDevice_t) -> nvmlReturn_t {
    lookup(name, out, |ctx| {
        // An index past the end is an invalid argument, not "not found".
        let i = index as usize;
        if i < ctx.gpu_count() {
            Ok(i)
        } else {
            Err(NVML_ERROR_INVALID_ARGUMENT)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    by_index("nvmlDeviceGetHandleByIndex_v2", index, device)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    by_index("nvmlDeviceGetHandleByIndex", index, device)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // A MIG device's UUID (`MIG-…`) names its MIG handle.
    let mig = with_system("nvmlDeviceGetHandleByUUID", |ctx| {
        ctx.sync();
        let found = super::mig::handle_by_uuid(ctx, get_str(uuid)?).ok_or(NVML_ERROR_NOT_FOUND)?;
        put(device, found)
    });
    if mig != NVML_ERROR_NOT_FOUND {
        return mig;
    }
    lookup("nvmlDeviceGetHandleByUUID", device, |ctx| {
        let uuid = get_str(uuid)?;
        ctx.identities
            .iter()
            .position(|id| id.uuid == uuid)
            .ok_or(NVML_ERROR_NOT_FOUND)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    lookup("nvmlDeviceGetHandleBySerial", device, |ctx| {
        let serial = get_str(serial)?;
        ctx.identities
            .iter()
            .position(|id| id.serial == serial)
            .ok_or(NVML_ERROR_NOT_FOUND)
    })
}

fn by_bus_id(name: &str, bus_id: *const c_char, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    lookup(name, device, |ctx| {
        let addr = parse_bus_id(get_str(bus_id)?).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        ctx.identities
            .iter()
            .position(|id| (id.pci_domain, id.pci_bus, 0) == addr)
            .ok_or(NVML_ERROR_NOT_FOUND)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pciBusId: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    by_bus_id("nvmlDeviceGetHandleByPciBusId_v2", pciBusId, device)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    pciBusId: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    by_bus_id("nvmlDeviceGetHandleByPciBusId", pciBusId, device)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetIndex", device, |_, i| put(index, i as c_uint))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minorNumber: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMinorNumber", device, |ctx, i| {
        put(minorNumber, ctx.identities[i].minor)
    })
}
