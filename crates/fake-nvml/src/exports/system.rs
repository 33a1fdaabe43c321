//! Library lifetime and system-wide queries: init/shutdown, error strings, versions,
//! process names.

use std::ffi::{c_char, c_int, c_uint};

use super::*;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init("nvmlInit_v2")
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    init("nvmlInit")
}

/// Flags (`NVML_INIT_FLAG_NO_GPUS`, `NVML_INIT_FLAG_NO_ATTACH`) change nothing here: there is
/// always at least one GPU and nothing to attach.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init("nvmlInitWithFlags")
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    shutdown()
}

/// Static strings, as NVML returns them; valid without init.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static std::ffi::CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt Request Issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"The requested vgpu operation is not available on target device, because ECC is enabled",
        23 => c"Insufficient resources",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not Ready",
        28 => c"GPU not found",
        29 => c"Invalid state",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_system("nvmlSystemGetDriverVersion", |ctx| {
        put_str(version, length, &ctx.scenario.driver_version)
    })
}

/// `"<CUDA major>.<driver version>"`, e.g. `12.550.54.15`, as the real library reports.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_system("nvmlSystemGetNVMLVersion", |ctx| {
        let s = format!(
            "{}.{}",
            ctx.scenario.cuda_driver_version / 1000,
            ctx.scenario.driver_version
        );
        put_str(version, length, &s)
    })
}

fn cuda_version(name: &str, out: *mut c_int) -> nvmlReturn_t {
    with_system(name, |ctx| put(out, ctx.scenario.cuda_driver_version))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(
    cudaDriverVersion: *mut c_int,
) -> nvmlReturn_t {
    cuda_version("nvmlSystemGetCudaDriverVersion", cudaDriverVersion)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(
    cudaDriverVersion: *mut c_int,
) -> nvmlReturn_t {
    cuda_version("nvmlSystemGetCudaDriverVersion_v2", cudaDriverVersion)
}

/// Names of the scenario's processes (or of the default ones); `NVML_ERROR_NOT_FOUND` for any
/// other pid, as for a process that uses no GPU.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_system("nvmlSystemGetProcessName", |ctx| {
        let found = ctx.process_name(pid).ok_or(NVML_ERROR_NOT_FOUND)?;
        put_str(name, length, &found)
    })
}
