//! NVLink: each link's state, version and remote end, and the throughput counters NVML serves
//! as field values (`scopeId` the link, or `UINT_MAX` for all). Served when the scenario has a
//! `[topology]` table and the part has links (`crate::topology`); NOT_SUPPORTED otherwise, as
//! on a PCIe board. On an HGX board every link ends at an NVSwitch, never at another GPU.

use std::ffi::c_uint;

use super::*;
use crate::topology::{self, Topology};

/// `nvmlIntNvLinkDeviceType_t`: what is at a link's other end.
const NVML_NVLINK_DEVICE_TYPE_SWITCH: c_uint = 2;
/// `nvmlValueType_t`: the throughput counters are 64-bit.
const NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;
/// PCI device id of a third-generation NVSwitch (HGX H100), vendor in the low 16 bits.
const NVSWITCH_PCI_DEVICE_ID: c_uint = (0x22a3 << 16) | 0x10de;

/// Field values this module answers (`NVML_FI_DEV_*` in nvml.h).
const FI_NVLINK_LINK_COUNT: c_uint = 91;
const FI_NVLINK_THROUGHPUT_DATA_TX: c_uint = 138;
const FI_NVLINK_THROUGHPUT_DATA_RX: c_uint = 139;
const FI_NVLINK_THROUGHPUT_RAW_TX: c_uint = 140;
const FI_NVLINK_THROUGHPUT_RAW_RX: c_uint = 141;
const FI_NVLINK_GET_STATE: c_uint = 165;
const FI_NVLINK_GET_VERSION: c_uint = 166;
/// `scopeId` that asks for the sum over every link.
const ALL_LINKS: c_uint = c_uint::MAX;

/// The topology and GPU `i`'s number of links, or NOT_SUPPORTED when it has none.
fn nvlinks(ctx: &Context, i: usize) -> Result<(&Topology, u32), nvmlReturn_t> {
    let topo = ctx
        .scenario
        .topology
        .as_ref()
        .ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    match topo.links(ctx.gpu(i).spec()) {
        0 => Err(NVML_ERROR_NOT_SUPPORTED),
        n => Ok((topo, n)),
    }
}

/// The topology, when `link` is one of GPU `i`'s links.
fn on_link(ctx: &Context, i: usize, link: c_uint) -> Result<&Topology, nvmlReturn_t> {
    let (topo, n) = nvlinks(ctx, i)?;
    if link >= n {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(topo)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    isActive: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetNvLinkState", device, |ctx, i| {
        let topo = on_link(ctx, i, link)?;
        let state = if topo.is_down(i, link) {
            NVML_FEATURE_DISABLED
        } else {
            NVML_FEATURE_ENABLED
        };
        put(isActive, state)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkVersion(
    device: nvmlDevice_t,
    link: c_uint,
    version: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetNvLinkVersion", device, |ctx, i| {
        on_link(ctx, i, link)?;
        put(version, topology::version(ctx.gpu(i).spec()))
    })
}

/// The NVSwitch at the end of `link`, as `nvmlPciInfo_t`.
fn switch_pci(ctx: &Context, i: usize, link: c_uint) -> Result<nvmlPciInfo_t, nvmlReturn_t> {
    let (_, n) = nvlinks(ctx, i)?;
    if link >= n {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let bus = topology::switch_bus(topology::switch_of(n, link));
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: 0,
        bus,
        device: 0,
        pciDeviceId: NVSWITCH_PCI_DEVICE_ID,
        pciSubSystemId: 0,
        busId: [0; 32],
    };
    // Domain 0, as `identity::Identity::bus_id` and `bus_id_legacy` spell a GPU's.
    fill(&mut info.busIdLegacy, &format!("0000:{bus:02X}:00.0"));
    fill(&mut info.busId, &format!("00000000:{bus:02X}:00.0"));
    Ok(info)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetNvLinkRemotePciInfo_v2", device, |ctx, i| {
        put(pci, switch_pci(ctx, i, link)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    link: c_uint,
    pNvLinkDeviceType: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetNvLinkRemoteDeviceType", device, |ctx, i| {
        on_link(ctx, i, link)?;
        put(pNvLinkDeviceType, NVML_NVLINK_DEVICE_TYPE_SWITCH)
    })
}

/// An NVLink field's value and `nvmlValueType_t`, or why not; `None` when `field` is not an
/// NVLink field (the caller answers it).
pub(super) fn field_value(
    ctx: &Context,
    i: usize,
    field: c_uint,
    scope: c_uint,
) -> Option<Result<(u64, c_uint), nvmlReturn_t>> {
    let raw = match field {
        FI_NVLINK_LINK_COUNT => {
            return Some(
                nvlinks(ctx, i).map(|(_, n)| (u64::from(n), NVML_VALUE_TYPE_UNSIGNED_INT)),
            );
        }
        FI_NVLINK_GET_STATE => {
            return Some(on_link(ctx, i, scope).map(|t| {
                (
                    u64::from(!t.is_down(i, scope)),
                    NVML_VALUE_TYPE_UNSIGNED_INT,
                )
            }));
        }
        FI_NVLINK_GET_VERSION => {
            return Some(on_link(ctx, i, scope).map(|_| {
                let v = topology::version(ctx.gpu(i).spec());
                (u64::from(v), NVML_VALUE_TYPE_UNSIGNED_INT)
            }));
        }
        FI_NVLINK_THROUGHPUT_DATA_TX | FI_NVLINK_THROUGHPUT_DATA_RX => false,
        FI_NVLINK_THROUGHPUT_RAW_TX | FI_NVLINK_THROUGHPUT_RAW_RX => true,
        _ => return None,
    };
    // The all-reduce is symmetric: RX counts what TX does.
    Some(nvlinks(ctx, i).and_then(|(topo, n)| {
        let kib = |l| topology::link_kib(topo, ctx.node(), i, l, raw);
        let v = match scope {
            ALL_LINKS => (0..n).map(kib).sum(),
            l if l < n => kib(l),
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        Ok((v, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG))
    }))
}

/// Writes an NVLink field's answer into the caller's entry, stamped with the step's time so
/// that rates from two reads divide by the simulated interval, as NVML's do.
///
/// # Safety
///
/// `v` points at one of the caller's `nvmlFieldValue_t` entries (checked by the caller).
pub(super) unsafe fn write(
    v: *mut nvmlFieldValue_t,
    answer: Result<(u64, c_uint), nvmlReturn_t>,
    timestamp_us: i64,
) {
    // SAFETY: the caller's contract above; every member is written, none read.
    unsafe {
        (*v).timestamp = timestamp_us;
        (*v).latencyUsec = 0;
        (*v).value = nvmlValue_t { ullVal: 0 };
        match answer {
            Ok((x, kind)) => {
                (*v).nvmlReturn = NVML_SUCCESS;
                (*v).valueType = kind;
                if kind == NVML_VALUE_TYPE_UNSIGNED_INT {
                    (*v).value.uiVal = x.min(u64::from(c_uint::MAX)) as c_uint;
                } else {
                    (*v).value.ullVal = x;
                }
            }
            Err(e) => {
                (*v).nvmlReturn = e;
                (*v).valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            }
        }
    }
}
