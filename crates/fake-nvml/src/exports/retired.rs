//! Page retirement: the memory health of data-centre GPUs before Ampere (V100), which retire a
//! bad page of framebuffer where later parts remap a row. The counts and the pending flag come
//! from the scenario's `[[per_gpu]]` `retired_pages_sbe`, `retired_pages_dbe` and
//! `retired_pages_pending`; every other GPU answers NOT_SUPPORTED, as NVML does on A100 and
//! later (row remapping) and on GeForce parts.

use std::ffi::{c_uint, c_ulonglong};

use super::*;
use crate::identity;

/// `nvmlPageRetirementCause_t`.
const CAUSE_MULTIPLE_SINGLE_BIT: c_uint = 0;
const CAUSE_DOUBLE_BIT: c_uint = 1;

/// A fixed retirement time (Unix seconds) for every page: the simulated board's pages were
/// retired before the scenario starts.
const RETIRED_AT: c_ulonglong = 1_700_000_000;

/// Whether GPU `i` retires pages.
fn retires_pages(ctx: &Context, i: usize) -> bool {
    let spec = ctx.gpu(i).spec();
    identity::is_datacenter(spec) && identity::architecture(spec) < NVML_DEVICE_ARCH_AMPERE
}

/// The retired pages of `cause` on GPU `i`: how many, and the page address of the k-th.
fn pages(ctx: &Context, i: usize, cause: c_uint) -> Result<(c_uint, c_ulonglong), nvmlReturn_t> {
    if !retires_pages(ctx, i) {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    let h = ctx.scenario.health.get(i).copied().unwrap_or_default();
    match cause {
        // Distinct, stable page frame numbers per cause.
        CAUSE_MULTIPLE_SINGLE_BIT => Ok((h.retired_pages_sbe, 0x0001_0000)),
        CAUSE_DOUBLE_BIT => Ok((h.retired_pages_dbe, 0x0008_0000)),
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    }
}

/// nvml.h's protocol for both versions: `*pageCount` is the caller's buffer size in entries;
/// a size of 0 asks for the count alone (SUCCESS when there are none, else INSUFFICIENT_SIZE
/// with the count); a buffer too small is INSUFFICIENT_SIZE with the count; otherwise the
/// addresses (and, for `_v2`, the timestamps) are written and `*pageCount` is the count.
fn retired_pages(
    name: &str,
    device: nvmlDevice_t,
    cause: c_uint,
    page_count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device(name, device, |ctx, i| {
        if page_count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let (count, base) = pages(ctx, i, cause)?;
        // SAFETY: non-null, and nvml.h requires it valid for a read and a write of c_uint.
        let room = unsafe { page_count.read() };
        put(page_count, count)?;
        if count == 0 {
            return Ok(());
        }
        if room < count {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        if addresses.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        for k in 0..count as usize {
            // SAFETY: the caller's buffers hold `room` >= `count` entries (nvml.h).
            unsafe {
                addresses.add(k).write(base + k as c_ulonglong);
                if !timestamps.is_null() {
                    timestamps.add(k).write(RETIRED_AT);
                }
            }
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: nvmlDevice_t,
    cause: c_uint,
    pageCount: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> nvmlReturn_t {
    retired_pages(
        "nvmlDeviceGetRetiredPages",
        device,
        cause,
        pageCount,
        addresses,
        std::ptr::null_mut(),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: nvmlDevice_t,
    cause: c_uint,
    pageCount: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    retired_pages(
        "nvmlDeviceGetRetiredPages_v2",
        device,
        cause,
        pageCount,
        addresses,
        timestamps,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: nvmlDevice_t,
    isPending: *mut c_uint,
) -> nvmlReturn_t {
    with_device(
        "nvmlDeviceGetRetiredPagesPendingStatus",
        device,
        |ctx, i| {
            if !retires_pages(ctx, i) {
                return Err(NVML_ERROR_NOT_SUPPORTED);
            }
            let h = ctx.scenario.health.get(i).copied().unwrap_or_default();
            put(
                isPending,
                if h.retired_pages_pending {
                    NVML_FEATURE_ENABLED
                } else {
                    NVML_FEATURE_DISABLED
                },
            )
        },
    )
}
