//! The C side of nvml.h that this library needs: return codes, enum values and `#[repr(C)]`
//! struct layouts, written from the public NVML API reference.
//!
//! Only layouts live here; no logic. Field names follow nvml.h so a reader can check them
//! against the header line by line.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};

/// `nvmlReturn_t`: a C enum, passed as a 32-bit int.
pub type nvmlReturn_t = c_uint;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NO_PERMISSION: nvmlReturn_t = 4;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_TIMEOUT: nvmlReturn_t = 10;
pub const NVML_ERROR_GPU_IS_LOST: nvmlReturn_t = 15;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// Opaque device handle, as nvml.h declares it (`struct nvmlDevice_st *`).
pub type nvmlDevice_t = *mut nvmlDevice_st;

/// The pointee of a device handle. The library hands out pointers into a static array of these,
/// so a handle stays valid and compares equal for the life of the process.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlDevice_st {
    pub(crate) index: u32,
}

/// `NVML_STRUCT_VERSION(name, ver)`: the struct size in the low bits, the version in the top byte.
pub const fn struct_version<T>(ver: u32) -> c_uint {
    (std::mem::size_of::<T>() as c_uint) | (ver << 24)
}

// Enum values (all C enums: 32-bit).
pub const NVML_TEMPERATURE_GPU: c_uint = 0;

pub const NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: c_uint = 0;
pub const NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: c_uint = 1;
pub const NVML_TEMPERATURE_THRESHOLD_MEM_MAX: c_uint = 2;
pub const NVML_TEMPERATURE_THRESHOLD_GPU_MAX: c_uint = 3;

pub const NVML_CLOCK_GRAPHICS: c_uint = 0;
pub const NVML_CLOCK_SM: c_uint = 1;
pub const NVML_CLOCK_MEM: c_uint = 2;
pub const NVML_CLOCK_VIDEO: c_uint = 3;

pub const NVML_CLOCK_ID_CURRENT: c_uint = 0;
pub const NVML_CLOCK_ID_APP_CLOCK_TARGET: c_uint = 1;
pub const NVML_CLOCK_ID_APP_CLOCK_DEFAULT: c_uint = 2;
pub const NVML_CLOCK_ID_CUSTOMER_BOOST_MAX: c_uint = 3;

/// Special values nvmlDeviceSetGpuLockedClocks accepts instead of MHz.
pub const NVML_CLOCK_LIMIT_ID_RANGE_START: c_uint = 0xffff_ff00;
pub const NVML_CLOCK_LIMIT_ID_TDP: c_uint = 0xffff_ff01;
pub const NVML_CLOCK_LIMIT_ID_UNLIMITED: c_uint = 0xffff_ff02;

pub const NVML_PCIE_UTIL_TX_BYTES: c_uint = 0;
pub const NVML_PCIE_UTIL_RX_BYTES: c_uint = 1;

pub const NVML_FEATURE_DISABLED: c_uint = 0;
pub const NVML_FEATURE_ENABLED: c_uint = 1;

pub const NVML_MEMORY_ERROR_TYPE_CORRECTED: c_uint = 0;
pub const NVML_MEMORY_ERROR_TYPE_UNCORRECTED: c_uint = 1;
pub const NVML_VOLATILE_ECC: c_uint = 0;
pub const NVML_AGGREGATE_ECC: c_uint = 1;

pub const NVML_COMPUTEMODE_DEFAULT: c_uint = 0;

pub const NVML_BRAND_GEFORCE_RTX: c_uint = 15;
pub const NVML_BRAND_NVIDIA: c_uint = 14;

pub const NVML_DEVICE_ARCH_VOLTA: c_uint = 5;
pub const NVML_DEVICE_ARCH_TURING: c_uint = 6;
pub const NVML_DEVICE_ARCH_AMPERE: c_uint = 7;
pub const NVML_DEVICE_ARCH_ADA: c_uint = 8;
pub const NVML_DEVICE_ARCH_HOPPER: c_uint = 9;
pub const NVML_DEVICE_ARCH_BLACKWELL: c_uint = 10;
pub const NVML_DEVICE_ARCH_UNKNOWN: c_uint = 0xffff_ffff;

pub const NVML_BUS_TYPE_PCIE: c_uint = 2;
pub const NVML_POWER_SOURCE_AC: c_uint = 0;

pub const NVML_PROCESS_MODE_COMPUTE: c_uint = 0;
pub const NVML_PROCESS_MODE_GRAPHICS: c_uint = 1;
pub const NVML_PROCESS_MODE_MPS: c_uint = 2;

/// nvmlValueType_t for nvmlFieldValue_t.
pub const NVML_VALUE_TYPE_UNSIGNED_INT: c_uint = 1;

#[repr(C)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
pub struct nvmlBAR1Memory_t {
    pub bar1Total: c_ulonglong,
    pub bar1Free: c_ulonglong,
    pub bar1Used: c_ulonglong,
}

#[repr(C)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// The current (v2/v3) PCI info layout.
#[repr(C)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; 32],
}

/// The layout the unversioned nvmlDeviceGetPciInfo (v1) filled: 52 bytes, no 32-byte bus id.
#[repr(C)]
pub struct nvmlPciInfo_v1_t {
    pub busId: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub reserved: [c_uint; 4],
}

#[repr(C)]
pub struct nvmlTemperature_v1_t {
    pub version: c_uint,
    pub sensorType: c_uint,
    pub temperature: c_int,
}

#[repr(C)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
}

/// Used by both the `_v2` and `_v3` process-list symbols (nvml.h's `nvmlProcessInfo_t`).
#[repr(C)]
pub struct nvmlProcessInfo_v2_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

#[repr(C)]
pub struct nvmlProcessDetail_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
    pub usedGpuCcProtectedMemory: c_ulonglong,
}

#[repr(C)]
pub struct nvmlProcessDetailList_v1_t {
    pub version: c_uint,
    pub mode: c_uint,
    pub numProcArrayEntries: c_uint,
    pub procArray: *mut nvmlProcessDetail_v1_t,
}

#[repr(C)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    pub timeStamp: c_ulonglong,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
}

#[repr(C)]
pub struct nvmlEccErrorCounts_t {
    pub l1Cache: c_ulonglong,
    pub l2Cache: c_ulonglong,
    pub deviceMemory: c_ulonglong,
    pub registerFile: c_ulonglong,
}

/// `nvmlValue_t`: an 8-byte union; only the members this library writes are named.
#[repr(C)]
#[derive(Clone, Copy)]
pub union nvmlValue_t {
    pub dVal: f64,
    pub uiVal: c_uint,
    pub ullVal: c_ulonglong,
}

#[repr(C)]
pub struct nvmlFieldValue_t {
    pub fieldId: c_uint,
    pub scopeId: c_uint,
    pub timestamp: i64,
    pub latencyUsec: i64,
    pub valueType: c_uint,
    pub nvmlReturn: nvmlReturn_t,
    pub value: nvmlValue_t,
}

/// An event set: opaque to callers; ours point at a heap cell named in `exports::events`.
pub type nvmlEventSet_t = *mut nvmlEventSet_st;

#[repr(C)]
pub struct nvmlEventSet_st {
    _private: [u8; 0],
}

/// What `nvmlEventSetWait` fills in.
#[repr(C)]
pub struct nvmlEventData_t {
    pub device: nvmlDevice_t,
    pub eventType: c_ulonglong,
    pub eventData: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// `nvmlEventType*` bits.
pub const NVML_EVENT_SINGLE_BIT_ECC: c_ulonglong = 0x1;
pub const NVML_EVENT_DOUBLE_BIT_ECC: c_ulonglong = 0x2;
pub const NVML_EVENT_XID_CRITICAL: c_ulonglong = 0x8;

/// Versions the versioned structs must carry.
pub const NVML_MEMORY_V2: c_uint = struct_version::<nvmlMemory_v2_t>(2);
pub const NVML_TEMPERATURE_V1: c_uint = struct_version::<nvmlTemperature_v1_t>(1);
pub const NVML_PROCESS_DETAIL_LIST_V1: c_uint = struct_version::<nvmlProcessDetailList_v1_t>(1);

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    /// Sizes as nvml.h has them on x86_64 / aarch64 Linux; a wrong one corrupts the caller's memory.
    #[test]
    fn layouts_match_nvml_h() {
        assert_eq!(size_of::<nvmlMemory_t>(), 24);
        assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(NVML_MEMORY_V2, 0x0200_0028);
        assert_eq!(size_of::<nvmlPciInfo_t>(), 68);
        assert_eq!(size_of::<nvmlPciInfo_v1_t>(), 52);
        assert_eq!(NVML_TEMPERATURE_V1, 0x0100_000C);
        assert_eq!(size_of::<nvmlProcessInfo_v1_t>(), 16);
        assert_eq!(size_of::<nvmlProcessInfo_v2_t>(), 24);
        assert_eq!(size_of::<nvmlProcessDetail_v1_t>(), 32);
        assert_eq!(size_of::<nvmlProcessDetailList_v1_t>(), 24);
        assert_eq!(size_of::<nvmlProcessUtilizationSample_t>(), 32);
        assert_eq!(size_of::<nvmlFieldValue_t>(), 40);
        assert_eq!(size_of::<nvmlUtilization_t>(), 8);
        assert_eq!(size_of::<nvmlBAR1Memory_t>(), 24);
        assert_eq!(size_of::<nvmlEventData_t>(), 32);
    }
}
