//! Which XIDs of a snapshot become node events: each new one, except in a storm. A GPU that
//! repeats an XID (an application faulting in a loop, a flapping NVLink) would otherwise write
//! a line a second into `events.jsonl` for as long as it lasts; here each GPU and XID number
//! gets at most one event per [`WINDOW_S`], and the ones folded into it are counted in its
//! `repeats`. Every XID still counts in the GPU's sample (`xid_count`) and on `/metrics`.

use std::collections::HashMap;

use crate::protocol::NodeEvent;
use crate::telemetry::Snapshot;
use crate::telemetry::xid::explain;

/// At most one event per GPU and XID number in this many seconds.
pub const WINDOW_S: f64 = 10.0;
/// GPU and XID pairs remembered at most (quiet ones are forgotten first).
const MAX_KEYS: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Window {
    start_s: f64,
    /// XIDs folded since the one recorded at `start_s`.
    folded: u64,
}

/// What has been seen and recorded. See the module doc.
#[derive(Debug, Default)]
pub struct XidLog {
    /// Per GPU, its count of XIDs heard at the last snapshot.
    seen: HashMap<u32, u64>,
    windows: HashMap<(u32, u64), Window>,
}

fn event(gpu: u32, uuid: Option<String>, xid: u64, repeats: Option<u64>) -> NodeEvent {
    let info = explain(xid);
    NodeEvent::Xid {
        gpu,
        uuid,
        xid,
        name: info.name.to_string(),
        action: info.action.to_string(),
        repeats,
    }
}

impl XidLog {
    /// The node events `snap` makes, oldest first: new XIDs (more new ones than a GPU's ring
    /// keeps are the ring's; the others were never seen), and the count of those folded in a
    /// window that has ended.
    pub fn take(&mut self, snap: &Snapshot) -> Vec<NodeEvent> {
        let mut events = Vec::new();
        let now = snap.time_s;
        let uuid_of = |gpu: u32| {
            snap.gpus
                .iter()
                .find(|g| g.index == gpu)
                .and_then(|g| g.uuid.clone())
        };
        // Windows that ended with XIDs folded in them: one event says how many.
        let mut ended: Vec<(u32, u64)> = self
            .windows
            .iter()
            .filter(|(_, w)| w.folded > 0 && now - w.start_s >= WINDOW_S)
            .map(|(k, _)| *k)
            .collect();
        ended.sort_unstable();
        for (gpu, xid) in ended {
            if let Some(w) = self.windows.get_mut(&(gpu, xid)) {
                events.push(event(gpu, uuid_of(gpu), xid, Some(w.folded)));
                *w = Window {
                    start_s: now,
                    folded: 0,
                };
            }
        }
        for g in &snap.gpus {
            let (Some(xids), Some(count)) = (&g.xids, g.xid_count) else {
                continue;
            };
            let before = self.seen.insert(g.index, count).unwrap_or(0);
            let new = usize::try_from(count.saturating_sub(before)).unwrap_or(usize::MAX);
            for x in &xids[xids.len().saturating_sub(new)..] {
                let key = (g.index, x.xid);
                match self.windows.get_mut(&key) {
                    Some(w) if x.time_s - w.start_s < WINDOW_S => w.folded += 1,
                    _ => {
                        if self.windows.len() >= MAX_KEYS {
                            self.windows.retain(|_, w| w.folded > 0);
                        }
                        self.windows.insert(
                            key,
                            Window {
                                start_s: x.time_s,
                                folded: 0,
                            },
                        );
                        events.push(event(g.index, g.uuid.clone(), x.xid, None));
                    }
                }
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::GpuSample;
    use crate::telemetry::xid::XidEvent;

    /// GPU 0 having heard `times` (XID 31 each) in all, the snapshot at `now`.
    fn snap(times: &[f64], now: f64) -> Snapshot {
        let xids: Vec<XidEvent> = times.iter().map(|t| XidEvent::new(31, *t)).collect();
        let start = xids.len().saturating_sub(crate::telemetry::xid::XID_RING);
        Snapshot {
            time_s: now,
            gpus: vec![GpuSample {
                index: 0,
                uuid: Some("GPU-0".into()),
                xid_count: Some(times.len() as u64),
                xids: Some(xids[start..].to_vec()),
                ..GpuSample::default()
            }],
            ..Snapshot::default()
        }
    }

    fn repeats(e: &NodeEvent) -> Option<u64> {
        match e {
            NodeEvent::Xid { repeats, .. } => *repeats,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_new_xid_is_an_event_once() {
        let mut log = XidLog::default();
        assert!(log.take(&snap(&[], 0.0)).is_empty());
        let e = log.take(&snap(&[1.0], 1.5));
        assert_eq!(e.len(), 1);
        assert!(matches!(
            &e[0],
            NodeEvent::Xid { gpu: 0, xid: 31, name, uuid: Some(u), repeats: None, .. }
                if name == "GPU memory page fault" && u == "GPU-0"
        ));
        assert!(log.take(&snap(&[1.0], 2.0)).is_empty(), "not twice");
        // The next one, after the window: an event of its own.
        assert_eq!(log.take(&snap(&[1.0, 20.0], 20.5)).len(), 1);
    }

    #[test]
    fn a_storm_is_one_event_per_window_with_its_count() {
        let mut log = XidLog::default();
        let mut times = Vec::new();
        let mut events = Vec::new();
        // One XID a second for 35 s, a snapshot after each.
        for s in 0..35 {
            times.push(f64::from(s));
            events.extend(log.take(&snap(&times, f64::from(s) + 0.5)));
        }
        // Then quiet: the last window's count comes out once it ends.
        events.extend(log.take(&snap(&times, 60.0)));
        assert!(log.take(&snap(&times, 70.0)).is_empty());
        let counts: Vec<Option<u64>> = events.iter().map(repeats).collect();
        assert_eq!(counts[0], None, "the first is recorded as it comes");
        let folded: u64 = counts.iter().flatten().sum();
        assert_eq!(folded + 1, 35, "every XID accounted for: {counts:?}");
        assert!(events.len() <= 5, "{counts:?}");
    }
}
