//! Processes on a GPU, in every struct version the peers use. Lists follow NVML's count
//! protocol (see `put_list`): a first call with a zero count learns the size.

use std::ffi::{c_uint, c_ulonglong};
use std::time::{SystemTime, UNIX_EPOCH};

use super::*;
use crate::context::Proc;
use crate::scenario::ProcessKind;

use super::mig::{Target, processes_of, with_target};

/// The processes of `kind` on a GPU or MIG device, with their (GPU instance, compute
/// instance) ids.
fn listed(ctx: &mut Context, t: Target, kind: Option<ProcessKind>) -> Vec<(Proc, c_uint, c_uint)> {
    let i = match t {
        Target::Gpu(i) | Target::Mig(i, _) => i,
    };
    let procs = match kind {
        Some(k) => ctx
            .processes(i)
            .into_iter()
            .filter(|p| p.kind == k)
            .collect(),
        // MPS: the simulated node runs no MPS server.
        None => Vec::new(),
    };
    processes_of(ctx, t, procs)
}

fn v1(
    name: &str,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
    kind: Option<ProcessKind>,
) -> nvmlReturn_t {
    with_target(name, device, |ctx, t| {
        let items = listed(ctx, t, kind)
            .iter()
            .map(|(p, _, _)| nvmlProcessInfo_v1_t {
                pid: p.pid,
                usedGpuMemory: p.used_bytes,
            })
            .collect();
        put_list(count, infos, items)
    })
}

fn v2(
    name: &str,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
    kind: Option<ProcessKind>,
) -> nvmlReturn_t {
    with_target(name, device, |ctx, t| {
        let items = listed(ctx, t, kind)
            .iter()
            .map(|(p, gi, ci)| nvmlProcessInfo_v2_t {
                pid: p.pid,
                usedGpuMemory: p.used_bytes,
                gpuInstanceId: *gi,
                computeInstanceId: *ci,
            })
            .collect();
        put_list(count, infos, items)
    })
}

const COMPUTE: Option<ProcessKind> = Some(ProcessKind::Compute);
const GRAPHICS: Option<ProcessKind> = Some(ProcessKind::Graphics);
const MPS: Option<ProcessKind> = None;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    v1(
        "nvmlDeviceGetComputeRunningProcesses",
        device,
        infoCount,
        infos,
        COMPUTE,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    v2(
        "nvmlDeviceGetComputeRunningProcesses_v2",
        device,
        infoCount,
        infos,
        COMPUTE,
    )
}

/// v3 returns the same 24-byte struct as v2 (nvml.h's `nvmlProcessInfo_t`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    v2(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        device,
        infoCount,
        infos,
        COMPUTE,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    v1(
        "nvmlDeviceGetGraphicsRunningProcesses",
        device,
        infoCount,
        infos,
        GRAPHICS,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    v2(
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        device,
        infoCount,
        infos,
        GRAPHICS,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    v2(
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        device,
        infoCount,
        infos,
        GRAPHICS,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    v1(
        "nvmlDeviceGetMPSComputeRunningProcesses",
        device,
        infoCount,
        infos,
        MPS,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    v2(
        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        device,
        infoCount,
        infos,
        MPS,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    v2(
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        device,
        infoCount,
        infos,
        MPS,
    )
}

/// The versioned list call newer pynvml and nvitop use: `plist->procArray` has
/// `numProcArrayEntries` slots; `mode` picks compute, graphics or MPS.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRunningProcessDetailList(
    device: nvmlDevice_t,
    plist: *mut nvmlProcessDetailList_v1_t,
) -> nvmlReturn_t {
    with_target("nvmlDeviceGetRunningProcessDetailList", device, |ctx, t| {
        if plist.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller fills version, mode, the capacity and the array pointer.
        let (version, mode, array) =
            unsafe { ((*plist).version, (*plist).mode, (*plist).procArray) };
        if version != NVML_PROCESS_DETAIL_LIST_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let kind = match mode {
            NVML_PROCESS_MODE_COMPUTE => COMPUTE,
            NVML_PROCESS_MODE_GRAPHICS => GRAPHICS,
            NVML_PROCESS_MODE_MPS => MPS,
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        let items = listed(ctx, t, kind)
            .iter()
            .map(|(p, gi, ci)| nvmlProcessDetail_v1_t {
                pid: p.pid,
                usedGpuMemory: p.used_bytes,
                gpuInstanceId: *gi,
                computeInstanceId: *ci,
                usedGpuCcProtectedMemory: 0,
            })
            .collect();
        // SAFETY: `numProcArrayEntries` lives in the caller's struct checked above.
        let count = unsafe { std::ptr::addr_of_mut!((*plist).numProcArrayEntries) };
        put_list(count, array, items)
    })
}

/// Per-process utilization samples (what nvtop shows per process): the GPU's utilization
/// split evenly among its processes, stamped now.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    utilization: *mut nvmlProcessUtilizationSample_t,
    processSamplesCount: *mut c_uint,
    _lastSeenTimeStamp: c_ulonglong,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetProcessUtilization", device, |ctx, i| {
        let procs = ctx.processes(i);
        if procs.is_empty() {
            // What the driver answers when it has no samples.
            return Err(NVML_ERROR_NOT_FOUND);
        }
        let r = ctx.reading(i);
        let n = procs.len() as f64;
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let items = procs
            .iter()
            .map(|p| nvmlProcessUtilizationSample_t {
                pid: p.pid,
                timeStamp: now_us,
                smUtil: pct(r.util_gpu_pct / n),
                memUtil: pct(r.util_mem_pct / n),
                encUtil: 0,
                decUtil: 0,
            })
            .collect();
        put_list(processSamplesCount, utilization, items)
    })
}
