//! Power limits changed outside gpupilot (pynvml, `nvidia-smi -pl`, another tool).
//!
//! Every setter the daemon calls goes through [`Watched`], which remembers per GPU the limit
//! gpupilot last set and when. At each snapshot a GPU whose limit differs by more than
//! [`TOLERANCE_W`] from the one last set or seen, with no change of gpupilot's in flight, was
//! changed by someone else: one `power_changed_outside` event per change, and the limit before
//! it becomes the GPU's recorded original (unless one is recorded already), so `power reset`
//! puts it back. The loops keep treating the new limit as the user's cap, as before.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::Control;
use crate::control::power::{ClockRange, GpuControl, TempTarget};
use crate::control::{ControlError, PowerControl, PowerLimits};
use crate::daemon::base::lock;
use crate::protocol::NodeEvent;
use crate::telemetry::Snapshot;

/// A difference smaller than this is a reading's rounding, not a change, watts.
pub(in crate::daemon) const TOLERANCE_W: f64 = 1.0;

/// Readings taken this soon after a setter returned may predate its effect, seconds.
const SETTLE_S: f64 = 1.0;

#[derive(Debug, Default)]
struct GpuWatch {
    /// The limit gpupilot last set, or last read in a snapshot, watts.
    known_w: Option<f64>,
    /// Setters of gpupilot's running now on this GPU.
    in_flight: u32,
    /// When the last one returned, seconds since the epoch.
    last_set_s: f64,
}

/// What the daemon knows of each GPU's limit. See the module doc.
#[derive(Debug, Default)]
pub(in crate::daemon) struct LimitWatch {
    gpus: BTreeMap<u32, GpuWatch>,
}

/// One change made outside gpupilot.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::daemon) struct OutsideChange {
    pub gpu: u32,
    pub uuid: Option<String>,
    pub old_w: f64,
    pub new_w: f64,
}

impl LimitWatch {
    fn begin(&mut self, gpu: u32) {
        self.gpus.entry(gpu).or_default().in_flight += 1;
    }

    fn end(&mut self, gpu: u32, set_w: Option<f64>, now_s: f64) {
        let g = self.gpus.entry(gpu).or_default();
        g.in_flight = g.in_flight.saturating_sub(1);
        g.last_set_s = now_s;
        if set_w.is_some() {
            g.known_w = set_w;
        }
    }

    /// The GPUs of `snap` whose limit was changed by someone else since the last look.
    pub(in crate::daemon) fn observe(&mut self, snap: &Snapshot) -> Vec<OutsideChange> {
        let mut out = Vec::new();
        for s in &snap.gpus {
            // A lost or stale GPU, or a limit that reads as nonsense, says nothing.
            let Some(now_w) = s.power_limit_w.filter(|w| w.is_finite() && *w > 0.0) else {
                continue;
            };
            if s.lost || s.stale {
                continue;
            }
            let g = self.gpus.entry(s.index).or_default();
            if g.in_flight > 0 || s.time_s < g.last_set_s + SETTLE_S {
                continue;
            }
            match g.known_w {
                Some(old_w) if (now_w - old_w).abs() > TOLERANCE_W => {
                    out.push(OutsideChange {
                        gpu: s.index,
                        uuid: s.uuid.clone(),
                        old_w,
                        new_w: now_w,
                    });
                    g.known_w = Some(now_w);
                }
                Some(_) => {}
                None => g.known_w = Some(now_w),
            }
        }
        out
    }
}

/// The daemon's control handle with its power setters noted in a [`LimitWatch`].
pub(in crate::daemon) struct Watched {
    pub inner: Arc<dyn GpuControl>,
    pub watch: Arc<Mutex<LimitWatch>>,
}

impl PowerControl for Watched {
    fn gpu_count(&self) -> usize {
        self.inner.gpu_count()
    }

    fn power_limits(&self, gpu: usize) -> Result<PowerLimits, ControlError> {
        self.inner.power_limits(gpu)
    }

    fn set_power_limit_w(&self, gpu: usize, watts: f64) -> Result<(), ControlError> {
        let g = gpu as u32;
        lock(&self.watch).begin(g);
        let r = self.inner.set_power_limit_w(gpu, watts);
        let set = r.is_ok().then_some(watts);
        lock(&self.watch).end(g, set, crate::telemetry::now_s());
        r
    }
}

impl GpuControl for Watched {
    fn gpu_uuid(&self, gpu: usize) -> Option<String> {
        self.inner.gpu_uuid(gpu)
    }
    fn clock_range(&self, gpu: usize) -> Result<ClockRange, ControlError> {
        self.inner.clock_range(gpu)
    }
    fn lock_clocks(&self, gpu: usize, min_mhz: u32, max_mhz: u32) -> Result<(), ControlError> {
        self.inner.lock_clocks(gpu, min_mhz, max_mhz)
    }
    fn reset_clocks(&self, gpu: usize) -> Result<(), ControlError> {
        self.inner.reset_clocks(gpu)
    }
    fn gpu_max_temp(&self, gpu: usize) -> Result<TempTarget, ControlError> {
        self.inner.gpu_max_temp(gpu)
    }
    fn set_gpu_max_temp(&self, gpu: usize, celsius: i32) -> Result<(), ControlError> {
        self.inner.set_gpu_max_temp(gpu, celsius)
    }
}

impl Control {
    /// Record the power limits changed outside gpupilot since the last snapshot (called from
    /// `Control::step`, before the loops): an event each, and the limit before as the original.
    pub(in crate::daemon) fn note_outside_changes(&self, snap: &Snapshot) {
        let Some((watch, originals)) = self.limit_watch() else {
            return;
        };
        let changes = lock(watch).observe(snap);
        for c in changes {
            tracing::info!(
                gpu = c.gpu,
                old_w = c.old_w,
                new_w = c.new_w,
                "power limit changed outside gpupilot"
            );
            if !self.readonly {
                let mut o = lock(originals);
                let rec = o.get(c.gpu);
                let same_gpu = match (&rec.uuid, &c.uuid) {
                    (Some(was), Some(now)) => was == now,
                    _ => true,
                };
                if same_gpu && rec.power_limit_w.is_none() {
                    if let Err(e) = o.update(c.gpu, c.uuid.clone(), |r| {
                        r.power_limit_w.get_or_insert(c.old_w);
                    }) {
                        tracing::warn!("GPU {}: recording its original power limit: {e}", c.gpu);
                    }
                }
            }
            self.events.record(NodeEvent::PowerChangedOutside {
                gpu: c.gpu,
                uuid: c.uuid,
                old_w: c.old_w,
                new_w: c.new_w,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::GpuSample;

    fn snap(t: f64, limits: &[f64]) -> Snapshot {
        Snapshot {
            time_s: t,
            gpus: limits
                .iter()
                .enumerate()
                .map(|(i, w)| GpuSample {
                    index: i as u32,
                    time_s: t,
                    power_limit_w: Some(*w),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn an_outside_change_is_seen_once_and_gpupilots_own_never() {
        let mut w = LimitWatch::default();
        assert!(w.observe(&snap(10.0, &[700.0, 700.0])).is_empty());
        // Someone else: once, however many snapshots show it.
        let c = w.observe(&snap(11.0, &[400.0, 700.3]));
        assert_eq!(
            c,
            vec![OutsideChange {
                gpu: 0,
                uuid: None,
                old_w: 700.0,
                new_w: 400.0
            }]
        );
        assert!(w.observe(&snap(12.0, &[400.0, 700.0])).is_empty());
        // gpupilot's own: in flight, then a snapshot read before it took effect, then after.
        w.begin(1);
        assert!(w.observe(&snap(13.0, &[400.0, 300.0])).is_empty());
        w.end(1, Some(300.0), 13.5);
        assert!(w.observe(&snap(14.0, &[400.0, 700.0])).is_empty());
        assert!(w.observe(&snap(15.0, &[400.0, 300.0])).is_empty());
        // A limit that reads 0 W is no change.
        assert!(w.observe(&snap(16.0, &[0.0, 300.0])).is_empty());
    }
}
