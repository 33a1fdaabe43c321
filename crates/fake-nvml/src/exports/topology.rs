//! Where each GPU sits: the PCIe level two GPUs share, the GPUs near one, and the CPUs and
//! NUMA node it is attached to (`crate::topology`). NOT_SUPPORTED without a `[topology]`
//! table, as NVML answers where the OS gives it no topology.

use std::ffi::{c_uint, c_ulong};

use super::*;
use crate::topology::{
    NVML_TOPOLOGY_HOSTBRIDGE, NVML_TOPOLOGY_INTERNAL, NVML_TOPOLOGY_MULTIPLE, NVML_TOPOLOGY_NODE,
    NVML_TOPOLOGY_SINGLE, NVML_TOPOLOGY_SYSTEM, Topology,
};

/// `nvmlAffinityScope_t`: NUMA node or socket; one and the same on this board.
const NVML_AFFINITY_SCOPE_NODE: c_uint = 0;
const NVML_AFFINITY_SCOPE_SOCKET: c_uint = 1;

fn topo(ctx: &Context) -> Result<&Topology, nvmlReturn_t> {
    ctx.scenario
        .topology
        .as_ref()
        .ok_or(NVML_ERROR_NOT_SUPPORTED)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    pathInfo: *mut c_uint,
) -> nvmlReturn_t {
    let name = "nvmlDeviceGetTopologyCommonAncestor";
    with_device(name, device1, |ctx, i| {
        let j = index_of(device2, ctx.gpu_count())?;
        device_faults(ctx, name, j)?;
        put(pathInfo, topo(ctx)?.common_ancestor(ctx.gpu_count(), i, j))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyNearestGpus(
    device: nvmlDevice_t,
    level: c_uint,
    count: *mut c_uint,
    deviceArray: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetTopologyNearestGpus", device, |ctx, i| {
        let levels = [
            NVML_TOPOLOGY_INTERNAL,
            NVML_TOPOLOGY_SINGLE,
            NVML_TOPOLOGY_MULTIPLE,
            NVML_TOPOLOGY_HOSTBRIDGE,
            NVML_TOPOLOGY_NODE,
            NVML_TOPOLOGY_SYSTEM,
        ];
        if !levels.contains(&level) {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let t = topo(ctx)?;
        let n = ctx.gpu_count();
        let near: Vec<nvmlDevice_t> = (0..n)
            .filter(|&j| j != i && t.common_ancestor(n, i, j) <= level)
            .map(handle_of)
            .collect();
        put_list(count, deviceArray, near)
    })
}

/// Fills `size` words of a caller's bit set with the bits of `range` (bit k of word w is
/// CPU or node 64w + k, as NVML and `sched_setaffinity` number them).
fn put_mask(size: c_uint, set: *mut c_ulong, range: std::ops::Range<u32>) -> Res {
    if size == 0 || set.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let bits = c_ulong::BITS;
    for w in 0..size {
        let lo = w * bits;
        let mut word: c_ulong = 0;
        for b in 0..bits {
            if range.contains(&(lo + b)) {
                word |= 1 << b;
            }
        }
        // SAFETY: the caller gives `size` writable words (nvml.h's cpuSetSize/nodeSetSize).
        unsafe { set.add(w as usize).write(word) };
    }
    Ok(())
}

fn scope_ok(scope: c_uint) -> Res {
    match scope {
        NVML_AFFINITY_SCOPE_NODE | NVML_AFFINITY_SCOPE_SOCKET => Ok(()),
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device: nvmlDevice_t,
    cpuSetSize: c_uint,
    cpuSet: *mut c_ulong,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetCpuAffinity", device, |ctx, i| {
        put_mask(cpuSetSize, cpuSet, topo(ctx)?.cpus(ctx.gpu_count(), i))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinityWithinScope(
    device: nvmlDevice_t,
    cpuSetSize: c_uint,
    cpuSet: *mut c_ulong,
    scope: c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetCpuAffinityWithinScope", device, |ctx, i| {
        scope_ok(scope)?;
        put_mask(cpuSetSize, cpuSet, topo(ctx)?.cpus(ctx.gpu_count(), i))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: nvmlDevice_t,
    nodeSetSize: c_uint,
    nodeSet: *mut c_ulong,
    scope: c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMemoryAffinity", device, |ctx, i| {
        scope_ok(scope)?;
        let node = topo(ctx)?.socket(ctx.gpu_count(), i) as u32;
        put_mask(nodeSetSize, nodeSet, node..node + 1)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device: nvmlDevice_t,
    node: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetNumaNodeId", device, |ctx, i| {
        put(node, topo(ctx)?.socket(ctx.gpu_count(), i) as c_uint)
    })
}
