//! XID errors as NVML reports them: one event set, every GPU registered on it for critical
//! XID events (and single/double-bit ECC events where the GPU has them), waited on by a thread
//! of its own with a timeout, so it notices the stop of its owner within [`WAIT_MS`].
//!
//! A GPU that does not support events (NOT_SUPPORTED, or no XID events among its supported
//! types) is said once in the log and left out: it is never polled. An NVML without the event
//! functions at all (an old or partial library) is the same for every GPU. Such a GPU's XIDs
//! are absent, not an empty list: nobody listens.
//!
//! What the thread hears goes into a bounded ring per GPU ([`XID_RING`]); the sampler copies
//! the ring into each sample. An ECC event marks the GPU so that the sampler reads its
//! lifetime ECC counts again at once instead of at its next seldom read.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;

use super::now_s;
use super::xid::{XID_RING, XidEvent};

/// How long one wait lasts: the longest the thread takes to notice it should stop. An event
/// ends a wait at once, so this costs nothing in how soon an XID is heard; it is how often a
/// quiet node's listener wakes, which a daemon that samples once a second should not double.
/// Nothing waits for the thread to end (it holds its own reference to NVML).
pub const WAIT_MS: u32 = 5000;
/// How long [`XidWatch::start`] waits for the registrations before it returns (they go on).
const READY_WAIT: Duration = Duration::from_secs(3);
/// After a failed wait (other than a timeout), the pause before the next one.
const ERROR_PAUSE: Duration = Duration::from_secs(1);

/// What one GPU's listener knows.
#[derive(Debug, Default)]
struct GpuXids {
    /// Listening since (epoch seconds); None while registering or when events are off.
    since_s: Option<f64>,
    recent: VecDeque<XidEvent>,
    /// XIDs heard since listening began (the ring keeps the last [`XID_RING`]).
    total: u64,
    /// An ECC event came since the sampler last asked.
    ecc_event: bool,
}

/// One GPU's XIDs, as a sample carries them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct XidView {
    /// Listening since (epoch seconds); None: this GPU's XIDs cannot be heard.
    pub since_s: Option<f64>,
    /// The most recent, oldest first; None when not listening.
    pub recent: Option<Vec<XidEvent>>,
    pub total: Option<u64>,
}

/// The event thread and what it heard. Dropping it stops the thread within [`WAIT_MS`].
pub struct XidWatch {
    gpus: Arc<Vec<Mutex<GpuXids>>>,
    stop: Arc<AtomicBool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why events are off, in words for the log.
fn why_off(e: &NvmlError) -> String {
    match e {
        NvmlError::NotSupported => "the GPU does not support events".into(),
        NvmlError::FailedToLoadSymbol(_) => "this NVML library has no event functions".into(),
        NvmlError::GpuLost => "the GPU is lost".into(),
        NvmlError::NoPermission => "no permission to register for events".into(),
        other => other.to_string(),
    }
}

impl XidWatch {
    /// Register `count` GPUs and listen on a thread of its own. Returns once registration is
    /// done (or after [`READY_WAIT`], the registrations going on behind).
    pub fn start(nvml: Arc<Nvml>, count: usize) -> XidWatch {
        let gpus: Arc<Vec<Mutex<GpuXids>>> =
            Arc::new((0..count).map(|_| Mutex::default()).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = crossbeam_channel::bounded::<()>(1);
        let spawned = {
            let gpus = Arc::clone(&gpus);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("nvml-xid".into())
                .spawn(move || listen(&nvml, &gpus, &stop, ready_tx))
        };
        match spawned {
            Ok(_) => {
                let _ = ready_rx.recv_timeout(READY_WAIT);
            }
            Err(e) => tracing::warn!("XID events not read: no thread: {e}"),
        }
        XidWatch { gpus, stop }
    }

    /// GPU `gpu`'s XIDs now.
    pub fn view(&self, gpu: usize) -> XidView {
        let Some(slot) = self.gpus.get(gpu) else {
            return XidView::default();
        };
        let g = lock(slot);
        match g.since_s {
            None => XidView::default(),
            Some(since) => XidView {
                since_s: Some(since),
                recent: Some(g.recent.iter().cloned().collect()),
                total: Some(g.total),
            },
        }
    }

    /// Whether an ECC event came for `gpu` since the last call.
    pub fn take_ecc_event(&self, gpu: usize) -> bool {
        self.gpus
            .get(gpu)
            .is_some_and(|slot| std::mem::take(&mut lock(slot).ecc_event))
    }
}

impl Drop for XidWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The types asked for: XIDs, and ECC where the GPU has them.
fn wanted() -> EventTypes {
    EventTypes::CRITICAL_XID_ERROR
        | EventTypes::SINGLE_BIT_ECC_ERROR
        | EventTypes::DOUBLE_BIT_ECC_ERROR
}

/// A new set with every GPU of `on` registered again (a failed registration frees the set it
/// was given, the ones before it included). A GPU that fails now is dropped from `on`.
fn rebuild<'n>(nvml: &'n Nvml, on: &mut Vec<(u32, EventTypes)>) -> Option<EventSet<'n>> {
    let mut set = nvml.create_event_set().ok()?;
    let mut k = 0;
    while k < on.len() {
        let (i, types) = on[k];
        let Ok(dev) = nvml.device_by_index(i) else {
            on.remove(k);
            continue;
        };
        match dev.register_events(types, set) {
            Ok(s) => {
                set = s;
                k += 1;
            }
            Err(_) => {
                on.remove(k);
                // The set is gone with the failure: start again without that GPU.
                return rebuild(nvml, on);
            }
        }
    }
    Some(set)
}

fn listen(
    nvml: &Nvml,
    gpus: &[Mutex<GpuXids>],
    stop: &AtomicBool,
    ready: crossbeam_channel::Sender<()>,
) {
    let off = |i: usize, why: &str| {
        tracing::info!("GPU {i}: XID events are not read: {why}");
    };
    let mut set = match nvml.create_event_set() {
        Ok(s) => s,
        Err(e) => {
            tracing::info!("XID events are not read on any GPU: {}", why_off(&e));
            let _ = ready.send(());
            return;
        }
    };
    let mut on: Vec<(u32, EventTypes)> = Vec::new();
    for (i, _) in gpus.iter().enumerate() {
        let dev = match nvml.device_by_index(i as u32) {
            Ok(d) => d,
            Err(e) => {
                off(i, &why_off(&e));
                continue;
            }
        };
        let types = match dev.supported_event_types() {
            Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => t & wanted(),
            Ok(_) => {
                off(i, "the GPU reports no XID events");
                continue;
            }
            Err(e) => {
                off(i, &why_off(&e));
                continue;
            }
        };
        match dev.register_events(types, set) {
            Ok(s) => {
                set = s;
                on.push((i as u32, types));
            }
            Err(e) => {
                off(i, &why_off(&e.error));
                match rebuild(nvml, &mut on) {
                    Some(s) => set = s,
                    None => {
                        tracing::warn!("XID events: the event set could not be made again");
                        on.clear();
                        let _ = ready.send(());
                        return;
                    }
                }
            }
        }
    }
    let since = now_s();
    for (i, _) in &on {
        if let Some(slot) = gpus.get(*i as usize) {
            lock(slot).since_s = Some(since);
        }
    }
    let _ = ready.send(());
    if on.is_empty() {
        return;
    }
    let mut said_error = false;
    while !stop.load(Ordering::Relaxed) {
        match set.wait(WAIT_MS) {
            Ok(data) => {
                said_error = false;
                let Some(slot) = data.device.index().ok().and_then(|i| gpus.get(i as usize)) else {
                    continue;
                };
                let mut g = lock(slot);
                if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    let xid = match data.event_data {
                        Some(XidError::Value(v)) => v,
                        // NVML's 999: an XID it could not name.
                        Some(XidError::Unknown) | None => 999,
                    };
                    if g.recent.len() == XID_RING {
                        g.recent.pop_front();
                    }
                    g.recent.push_back(XidEvent::new(xid, now_s()));
                    g.total += 1;
                }
                if data
                    .event_type
                    .intersects(EventTypes::SINGLE_BIT_ECC_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR)
                {
                    g.ecc_event = true;
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                // Said once per run of failures; paused, so a failing wait never spins.
                if !said_error {
                    tracing::warn!("waiting for XID events: {e}");
                    said_error = true;
                }
                std::thread::sleep(ERROR_PAUSE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_in_words() {
        assert_eq!(
            why_off(&NvmlError::FailedToLoadSymbol("nvmlEventSetCreate".into())),
            "this NVML library has no event functions"
        );
        assert_eq!(
            why_off(&NvmlError::NotSupported),
            "the GPU does not support events"
        );
    }
}
