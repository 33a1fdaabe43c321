//! The exported NVML C ABI. Every function here is `extern "C"`, `#[no_mangle]`, and:
//! - never unwinds into C (a panic becomes `NVML_ERROR_UNKNOWN`),
//! - returns `NVML_ERROR_UNINITIALIZED` before `nvmlInit*` and after the last `nvmlShutdown`,
//! - returns `NVML_ERROR_INVALID_ARGUMENT` for a null output pointer or a handle it did not issue,
//! - applies the scenario's faults (lost GPU, NOT_SUPPORTED, slow, NO_PERMISSION) by the name of
//!   the symbol that was called.
//!
//! # Safety
//!
//! The contract is nvml.h's: every pointer argument is null or valid for writes (or reads, for
//! input strings) of the type and length the header documents. The helpers below are the only
//! places that dereference caller pointers; they check for null and rely on the caller for the
//! rest.

#![allow(clippy::missing_safety_doc, non_snake_case)]

mod clocks;
mod control;
mod device_info;
mod events;
mod handles;
mod mig;
mod nvlink;
mod power;
mod processes;
mod retired;
mod system;
mod telemetry;
mod topology;

use std::ffi::{c_char, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use gpusim::Node;

use crate::context::Context;
use crate::ffi::*;
use crate::scenario::MAX_GPUS;
use crate::store::GpuExtra;

type Res = Result<(), nvmlReturn_t>;

/// Library-wide state: the init refcount and, while it is positive, the context.
struct Runtime {
    init_count: u32,
    ctx: Option<Context>,
}

static RUNTIME: Mutex<Runtime> = Mutex::new(Runtime {
    init_count: 0,
    ctx: None,
});

/// Whether the loaded scenario has any faults: lets the common path skip fault lookups.
static HAS_FAULTS: AtomicBool = AtomicBool::new(false);

/// The objects device handles point at: fixed addresses, so a handle is valid and compares
/// equal for the life of the process.
static DEVICES: [nvmlDevice_st; MAX_GPUS] = {
    let mut a = [nvmlDevice_st { index: 0 }; MAX_GPUS];
    let mut i = 0;
    while i < MAX_GPUS {
        a[i].index = i as u32;
        i += 1;
    }
    a
};

fn runtime() -> MutexGuard<'static, Runtime> {
    // A panic while holding the lock was already turned into an error code; the state it
    // guards is still consistent enough to go on.
    RUNTIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `f`, turning a panic into `NVML_ERROR_UNKNOWN` so nothing unwinds into C.
fn guarded(f: impl FnOnce() -> Res) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

pub(crate) fn handle_of(index: usize) -> nvmlDevice_t {
    std::ptr::from_ref(&DEVICES[index]).cast_mut()
}

/// The GPU index behind a handle, if the handle is one of ours and names an existing GPU.
fn index_of(device: nvmlDevice_t, count: usize) -> Result<usize, nvmlReturn_t> {
    let base = DEVICES.as_ptr() as usize;
    let size = std::mem::size_of::<nvmlDevice_st>();
    let p = device as usize;
    if mig::mig_index_of(device).is_some() {
        // A MIG device handle: most calls do not take one, as on a real driver.
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    if p < base || (p - base) % size != 0 {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let i = (p - base) / size;
    if i >= count.min(MAX_GPUS) {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(i)
}

/// Sleeps for a `slow` fault on `name` (on `gpu`, or a system call), without holding the lock.
fn stall(name: &str, gpu: impl FnOnce(&Context) -> Option<usize>) {
    if !HAS_FAULTS.load(Ordering::Relaxed) {
        return;
    }
    let delay = {
        let rt = runtime();
        rt.ctx
            .as_ref()
            .and_then(|ctx| ctx.scenario.faults.delay(name, gpu(ctx)))
    };
    if let Some(d) = delay {
        std::thread::sleep(d);
    }
}

/// A call that needs the library initialised but no device.
fn with_system(name: &str, f: impl FnOnce(&mut Context) -> Res) -> nvmlReturn_t {
    guarded(|| {
        stall(name, |_| None);
        let mut rt = runtime();
        let ctx = rt.ctx.as_mut().ok_or(NVML_ERROR_UNINITIALIZED)?;
        if ctx.scenario.faults.not_supported(name, None) {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        f(ctx)
    })
}

/// Checks a call on GPU `i` against the lost-GPU and NOT_SUPPORTED faults, after `sync`.
fn device_faults(ctx: &Context, name: &str, i: usize) -> Res {
    if HAS_FAULTS.load(Ordering::Relaxed) {
        let faults = &ctx.scenario.faults;
        if faults.lost(i, ctx.sim_time_s()) {
            return Err(NVML_ERROR_GPU_IS_LOST);
        }
        if faults.not_supported(name, Some(i)) {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
    }
    Ok(())
}

/// A call on one device: the handle is checked, the node brought to now, faults applied.
fn with_device(
    name: &str,
    device: nvmlDevice_t,
    f: impl FnOnce(&mut Context, usize) -> Res,
) -> nvmlReturn_t {
    guarded(|| {
        stall(name, |ctx| index_of(device, ctx.gpu_count()).ok());
        let mut rt = runtime();
        let ctx = rt.ctx.as_mut().ok_or(NVML_ERROR_UNINITIALIZED)?;
        let i = index_of(device, ctx.gpu_count())?;
        ctx.sync();
        device_faults(ctx, name, i)?;
        f(ctx, i)
    })
}

/// A setter on one device: permission fault, then the shared-node update protocol, then the
/// setter log (which records the call whatever it answered).
fn with_setter(
    name: &str,
    device: nvmlDevice_t,
    logged: serde_json::Value,
    apply: impl FnOnce(&mut Node, &mut Vec<GpuExtra>, usize) -> Res,
) -> nvmlReturn_t {
    with_device(name, device, |ctx, i| {
        let result = if HAS_FAULTS.load(Ordering::Relaxed)
            && ctx.scenario.faults.no_permission(name, Some(i))
        {
            Err(NVML_ERROR_NO_PERMISSION)
        } else {
            ctx.update(|node, extras| apply(node, extras, i))
        };
        if let Some(log) = &ctx.log {
            log.record(
                name,
                i,
                logged,
                ctx.sim_time_s(),
                result.err().unwrap_or(NVML_SUCCESS),
            );
        }
        result
    })
}

/// Writes `v` through a caller's output pointer.
fn put<T>(p: *mut T, v: T) -> Res {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and nvml.h requires output pointers to be valid for a write of T.
    unsafe { p.write(v) };
    Ok(())
}

/// Copies `s` and a NUL into a caller's buffer of `len` bytes.
fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Res {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let bytes = s.as_bytes();
    if (len as usize) < bytes.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: non-null, and the caller promises `len` writable bytes; we write bytes.len()+1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    Ok(())
}

/// Fills a fixed-size C char array (inside a struct we build) with `s`, NUL-terminated.
fn fill(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    dst[n] = 0;
}

/// Reads a caller's NUL-terminated input string.
fn get_str<'a>(p: *const c_char) -> Result<&'a str, nvmlReturn_t> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and nvml.h requires input strings to be NUL-terminated.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| NVML_ERROR_INVALID_ARGUMENT)
}

/// Fills a caller's array with `items` using NVML's count protocol: `*count` holds the
/// capacity on entry and the number of items on return; too small a capacity (or a null array
/// with items to report) answers `NVML_ERROR_INSUFFICIENT_SIZE`.
fn put_list<T>(count: *mut c_uint, array: *mut T, items: Vec<T>) -> Res {
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null `count`, valid for read and write per nvml.h.
    let capacity = unsafe { count.read() } as usize;
    let n = items.len();
    // SAFETY: as above.
    unsafe { count.write(n as c_uint) };
    if n == 0 {
        return Ok(());
    }
    if array.is_null() || capacity < n {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (k, item) in items.into_iter().enumerate() {
        // SAFETY: the caller gave `capacity >= n` writable elements.
        unsafe { array.add(k).write(item) };
    }
    Ok(())
}

/// Watts to NVML's milliwatts.
fn mw(watts: f64) -> c_uint {
    (watts * 1000.0).round().clamp(0.0, f64::from(u32::MAX)) as c_uint
}

/// A 0..=100 value as NVML's unsigned percent.
fn pct(v: f64) -> c_uint {
    v.round().clamp(0.0, 100.0) as c_uint
}

/// Starts (or re-counts) the library. Shared by the nvmlInit* symbols.
fn init(name: &str) -> nvmlReturn_t {
    guarded(|| {
        let mut rt = runtime();
        if rt.init_count == 0 {
            match Context::from_env() {
                Ok(ctx) => {
                    HAS_FAULTS.store(!ctx.scenario.faults.is_empty(), Ordering::Relaxed);
                    rt.ctx = Some(ctx);
                }
                Err(e) => {
                    eprintln!("fake-nvml: {name} failed: {e}");
                    return Err(NVML_ERROR_UNKNOWN);
                }
            }
        }
        rt.init_count += 1;
        Ok(())
    })
}

fn shutdown() -> nvmlReturn_t {
    guarded(|| {
        let mut rt = runtime();
        if rt.init_count == 0 {
            return Err(NVML_ERROR_UNINITIALIZED);
        }
        rt.init_count -= 1;
        if rt.init_count == 0 {
            rt.ctx = None;
            HAS_FAULTS.store(false, Ordering::Relaxed);
        }
        Ok(())
    })
}
