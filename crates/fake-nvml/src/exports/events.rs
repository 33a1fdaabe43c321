//! Event sets: critical XID events from the scenario's `xid` faults.
//!
//! Every GPU supports XID and single/double-bit ECC events unless a `not_supported` fault names
//! `nvmlDeviceGetSupportedEventTypes` or `nvmlDeviceRegisterEvents` for it: then both answer
//! NOT_SUPPORTED (and a fault on `nvmlEventSetCreate` takes events away from the whole node).
//! A set delivers the XIDs of its GPUs that fall after their registration, in simulated time,
//! oldest first; ECC events are accepted at registration and never fired (the simulated
//! memory's counts do not change).
//!
//! A set's handle is the address of a heap cell this module owns, looked up in a table before
//! any use: a handle that is not in the table is INVALID_ARGUMENT, never dereferenced.
//! `nvmlEventSetWait` sleeps without holding the library's lock, so other threads' calls go on
//! while one waits.

use std::collections::VecDeque;
use std::ffi::{c_uint, c_ulonglong};
use std::time::{Duration, Instant};

use super::*;

/// Events a set keeps undelivered at most (the oldest go first).
const MAX_QUEUED: usize = 1024;
/// The longest one sleep inside a wait: simulated time follows the wall clock in steps, so a
/// due XID is looked for again at least this often.
const POLL: Duration = Duration::from_millis(100);

const SUPPORTED: c_ulonglong =
    NVML_EVENT_SINGLE_BIT_ECC | NVML_EVENT_DOUBLE_BIT_ECC | NVML_EVENT_XID_CRITICAL;

/// One GPU registered on a set.
struct Registered {
    gpu: usize,
    types: c_ulonglong,
    /// XIDs up to this simulated time have been queued (or fell before registration).
    seen_to_s: f64,
}

struct Set {
    handle: usize,
    /// Owns the cell whose address is the handle.
    _cell: Box<u8>,
    gpus: Vec<Registered>,
    queue: VecDeque<(usize, c_ulonglong, c_ulonglong)>,
}

static SETS: Mutex<Vec<Set>> = Mutex::new(Vec::new());

fn sets() -> MutexGuard<'static, Vec<Set>> {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

fn find(sets: &mut [Set], handle: nvmlEventSet_t) -> Result<&mut Set, nvmlReturn_t> {
    sets.iter_mut()
        .find(|s| s.handle == handle as usize)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// NOT_SUPPORTED where a fault takes events away from GPU `i`.
fn events_off(ctx: &Context, i: usize) -> bool {
    HAS_FAULTS.load(Ordering::Relaxed)
        && [
            "nvmlDeviceGetSupportedEventTypes",
            "nvmlDeviceRegisterEvents",
        ]
        .iter()
        .any(|f| ctx.scenario.faults.not_supported(f, Some(i)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    with_system("nvmlEventSetCreate", |_| {
        let cell = Box::new(0u8);
        let handle = std::ptr::from_ref::<u8>(&cell) as usize;
        put(set, handle as nvmlEventSet_t)?;
        sets().push(Set {
            handle,
            _cell: cell,
            gpus: Vec::new(),
            queue: VecDeque::new(),
        });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    with_system("nvmlEventSetFree", |_| {
        let mut sets = sets();
        let k = sets
            .iter()
            .position(|s| s.handle == set as usize)
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        sets.swap_remove(k);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetSupportedEventTypes", device, |ctx, i| {
        if events_off(ctx, i) {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        put(types, SUPPORTED)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceRegisterEvents", device, |ctx, i| {
        if events_off(ctx, i) || types & !SUPPORTED != 0 {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        let now = ctx.sim_time_s();
        let mut sets = sets();
        let s = find(&mut sets, set)?;
        match s.gpus.iter_mut().find(|r| r.gpu == i) {
            Some(r) => r.types |= types,
            None => s.gpus.push(Registered {
                gpu: i,
                types,
                seen_to_s: now,
            }),
        }
        Ok(())
    })
}

/// Queue every XID due on `set`'s GPUs up to now; the simulated time it looked at, and when
/// the next one falls due.
fn look(name: &str, set: nvmlEventSet_t) -> Result<(Option<f64>, f64), nvmlReturn_t> {
    let mut rt = runtime();
    let ctx = rt.ctx.as_mut().ok_or(NVML_ERROR_UNINITIALIZED)?;
    if ctx.scenario.faults.not_supported(name, None) {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    ctx.sync();
    let now = ctx.sim_time_s();
    let faults = &ctx.scenario.faults;
    let mut sets = sets();
    let s = find(&mut sets, set)?;
    let mut next: Option<f64> = None;
    for r in s.gpus.iter_mut() {
        if r.types & NVML_EVENT_XID_CRITICAL == 0 {
            continue;
        }
        for (_, xid) in faults.xids_between(r.gpu, r.seen_to_s, now) {
            if s.queue.len() == MAX_QUEUED {
                s.queue.pop_front();
            }
            s.queue.push_back((r.gpu, NVML_EVENT_XID_CRITICAL, xid));
        }
        r.seen_to_s = r.seen_to_s.max(now);
        if let Some(t) = faults.next_xid_after(r.gpu, now) {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
    }
    Ok((next, now))
}

/// Deliver the oldest queued event of `set` into `data`; false when none is queued.
fn deliver(set: nvmlEventSet_t, data: *mut nvmlEventData_t) -> Result<bool, nvmlReturn_t> {
    let mut sets = sets();
    let s = find(&mut sets, set)?;
    let Some((gpu, kind, value)) = s.queue.pop_front() else {
        return Ok(false);
    };
    put(
        data,
        nvmlEventData_t {
            device: handle_of(gpu),
            eventType: kind,
            eventData: value,
            gpuInstanceId: 0xffff_ffff,
            computeInstanceId: 0xffff_ffff,
        },
    )?;
    Ok(true)
}

fn wait(
    name: &str,
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        if data.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        loop {
            let (next, now) = look(name, set)?;
            if deliver(set, data)? {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NVML_ERROR_TIMEOUT);
            }
            // Nothing due: sleep (without the lock) until the next XID, the deadline, or the
            // next look, whichever comes first; with no XID to come, to the deadline.
            let nap = match next {
                Some(t) => Duration::from_secs_f64((t - now).max(0.0))
                    .clamp(Duration::from_millis(1), POLL),
                None => left,
            };
            std::thread::sleep(nap.min(left));
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    wait("nvmlEventSetWait_v2", set, data, timeout_ms)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    wait("nvmlEventSetWait", set, data, timeout_ms)
}
