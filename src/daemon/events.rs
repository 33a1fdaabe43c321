//! The node's event log: `$STATE/events.jsonl` (one [`NodeEventRecord`] a line, appended as
//! things happen), the most recent ones in memory for `events` requests, and a live feed for
//! subscribed clients. [`Refusals`] keeps a flood of refusals from filling it: one line for
//! the first of a kind, then a count.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::broadcast;

use crate::protocol::{NodeEvent, NodeEventRecord};
use crate::time::rfc3339;

/// Events kept in memory for `events` requests (older ones are in the file).
const KEEP: usize = 4096;
/// How much of the file's end is read at start to find the last events.
const TAIL_BYTES: u64 = 1 << 20;
/// Events a slow subscriber may fall behind before it is told it lagged.
const FEED: usize = 256;

/// The node's event log. See the module doc.
#[derive(Debug)]
pub struct NodeLog {
    path: PathBuf,
    inner: Mutex<Inner>,
    feed: broadcast::Sender<NodeEventRecord>,
}

#[derive(Debug)]
struct Inner {
    next_seq: u64,
    recent: VecDeque<NodeEventRecord>,
}

impl NodeLog {
    /// Open (or start) `events.jsonl` in `state_dir`, reading back the newest events so
    /// sequence numbers go on where the last daemon left off.
    pub fn open(state_dir: &Path) -> io::Result<NodeLog> {
        let path = state_dir.join("events.jsonl");
        let recent = read_tail(&path)?;
        let next_seq = recent.back().map_or(1, |r| r.seq + 1);
        Ok(NodeLog {
            path,
            inner: Mutex::new(Inner { next_seq, recent }),
            feed: broadcast::channel(FEED).0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Record `event` now: append it to the file, keep it, and send it to subscribers. A file
    /// that cannot be written is logged, never fatal (the event still reaches subscribers).
    pub fn record(&self, event: NodeEvent) -> NodeEventRecord {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let rec = NodeEventRecord {
            seq: inner.next_seq,
            time: rfc3339(SystemTime::now()),
            event,
        };
        inner.next_seq += 1;
        if let Err(e) = self.append(&rec) {
            tracing::warn!("writing {}: {e}", self.path.display());
        }
        if inner.recent.len() == KEEP {
            inner.recent.pop_front();
        }
        inner.recent.push_back(rec.clone());
        // Sending while still locked keeps the feed in `seq` order.
        let _ = self.feed.send(rec.clone());
        rec
    }

    /// Events with `seq > since`, oldest first, at most `max`; and the `since` to ask next.
    pub fn since(&self, since: u64, max: usize) -> (Vec<NodeEventRecord>, u64) {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let events: Vec<NodeEventRecord> = inner
            .recent
            .iter()
            .filter(|r| r.seq > since)
            .take(max)
            .cloned()
            .collect();
        let next = events.last().map_or(since, |r| r.seq);
        (events, next)
    }

    /// A live feed of new events.
    pub fn subscribe(&self) -> broadcast::Receiver<NodeEventRecord> {
        self.feed.subscribe()
    }

    fn append(&self, rec: &NodeEventRecord) -> io::Result<()> {
        let mut line = serde_json::to_string(rec).map_err(io::Error::other)?;
        line.push('\n');
        // One write of a whole line on an O_APPEND file: lines never interleave. Opened without
        // following a link another user could plant in its place.
        crate::config::safe_fs::open_append(&self.path)?.write_all(line.as_bytes())
    }
}

/// Refusals of peers, written down without letting a flood write a line each: the first few
/// of a kind (a user and a reason) in a window are recorded one by one, the rest are counted,
/// and a window that counted some ends in one more record with the count. A flood of any size
/// costs at most that many records per kind and window, in `events.jsonl`, in memory and in
/// the daemon's log; a refusal now and then is recorded as it happens, with its pid.
#[derive(Debug)]
pub struct Refusals {
    window: Duration,
    /// Refusals of a kind recorded one by one in a window before the rest are counted.
    each: u64,
    pending: Mutex<HashMap<(u32, String), Pending>>,
    /// Told when a kind starts pending: whoever flushes need not look while none is.
    started: tokio::sync::Notify,
}

#[derive(Debug)]
struct Pending {
    since: Instant,
    /// Seen in this window (recorded and counted).
    seen: u64,
    /// Counted, not recorded, in this window.
    more: u64,
    /// Whether this kind goes to `events.jsonl` (else only to the daemon's log).
    record: bool,
}

impl Refusals {
    /// Record `each` refusals of a kind (at least one) in a `window`, count the rest.
    pub fn new(window: Duration, each: u64) -> Refusals {
        Refusals {
            window,
            each: each.max(1),
            pending: Mutex::default(),
            started: tokio::sync::Notify::new(),
        }
    }

    /// Whether any kind waits for its window to end (a [`flush`](Self::flush) has work).
    pub fn pending(&self) -> bool {
        !self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Resolves when a kind starts pending after this is called (or had started since the
    /// last wait: the permit is kept).
    pub async fn started(&self) {
        self.started.notified().await
    }

    /// Note that `uid` was refused for `reason` (a few words, the same for every refusal of the
    /// kind). True when it is to be recorded, one of the first of its kind in the window: it
    /// is (as a `peer_refused` event, where `record`), and the caller writes its own, detailed
    /// line to the log. False: it was counted, and the caller writes nothing.
    pub fn note(
        &self,
        log: &NodeLog,
        uid: u32,
        pid: Option<u32>,
        reason: &str,
        record: bool,
    ) -> bool {
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let p = pending.entry((uid, reason.to_string())).or_insert_with(|| {
                self.started.notify_one();
                Pending {
                    since: Instant::now(),
                    seen: 0,
                    more: 0,
                    record,
                }
            });
            p.seen += 1;
            if p.seen > self.each {
                p.more += 1;
                return false;
            }
        }
        if record {
            log.record(NodeEvent::PeerRefused {
                uid,
                pid,
                reason: reason.to_string(),
            });
        }
        true
    }

    /// Write down the counts of windows that have ended (every window, with `all`: the daemon
    /// is stopping). A kind that was counted starts a new window in which all are counted (a
    /// flood that goes on is one line a window); one that was not is forgotten, so that its
    /// next refusals are recorded one by one again.
    pub fn flush(&self, log: &NodeLog, all: bool) {
        let now = Instant::now();
        let mut due = Vec::new();
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.retain(|(uid, reason), p| {
                let over = now.saturating_duration_since(p.since);
                if !all && over < self.window {
                    return true;
                }
                if p.more == 0 {
                    return false;
                }
                due.push((*uid, reason.clone(), p.more, over, p.record));
                p.since = now;
                p.seen = self.each;
                p.more = 0;
                true
            });
            if pending.is_empty() {
                pending.shrink_to_fit();
            }
        }
        for (uid, reason, more, over, record) in due {
            let times = if more == 1 { "time" } else { "times" };
            let line = format!(
                "{reason}: refused {more} more {times} in {:.0} s",
                over.as_secs_f64().max(1.0)
            );
            tracing::warn!(uid, "uid {uid}: {line}");
            if record {
                log.record(NodeEvent::PeerRefused {
                    uid,
                    pid: None,
                    reason: line,
                });
            }
        }
    }
}

/// The last [`KEEP`] events of the file (lines that do not parse are skipped).
fn read_tail(path: &Path) -> io::Result<VecDeque<NodeEventRecord>> {
    let mut f = match crate::config::safe_fs::open_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(VecDeque::new()),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let start = len.saturating_sub(TAIL_BYTES);
    f.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let mut lines = text.lines();
    if start > 0 {
        lines.next(); // most likely cut in the middle
    }
    let mut out = VecDeque::new();
    for line in lines {
        if let Ok(rec) = serde_json::from_str::<NodeEventRecord>(line) {
            if out.len() == KEEP {
                out.pop_front();
            }
            out.push_back(rec);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped(reason: &str) -> NodeEvent {
        NodeEvent::DaemonStopped {
            pid: 1,
            reason: reason.into(),
        }
    }

    #[test]
    fn seq_goes_on_across_reopen_and_feed_sees_new_events() {
        let tmp = tempfile::tempdir().unwrap();
        let log = NodeLog::open(tmp.path()).unwrap();
        assert_eq!(log.record(stopped("a")).seq, 1);
        assert_eq!(log.record(stopped("b")).seq, 2);
        drop(log);
        let log = NodeLog::open(tmp.path()).unwrap();
        let mut feed = log.subscribe();
        assert_eq!(log.record(stopped("c")).seq, 3);
        assert_eq!(feed.try_recv().unwrap().seq, 3);
        let (events, next) = log.since(1, 10);
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(next, 3);
        let (events, next) = log.since(3, 10);
        assert!(events.is_empty());
        assert_eq!(next, 3);
        let text = std::fs::read_to_string(log.path()).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(
            text.lines().next().unwrap().contains(r#""seq":1,"time":"#)
                && text.contains(r#""event":"daemon_stopped","pid":1,"reason":"a""#),
            "{text}"
        );
    }

    #[test]
    fn a_planted_link_is_never_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim.txt");
        std::fs::write(&victim, "precious\n").unwrap();
        let log = NodeLog::open(tmp.path()).unwrap();
        std::os::unix::fs::symlink(&victim, log.path()).unwrap();
        log.record(stopped("a"));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    }

    #[test]
    fn a_flood_of_refusals_is_a_few_records_then_a_count_per_window() {
        let tmp = tempfile::tempdir().unwrap();
        let log = NodeLog::open(tmp.path()).unwrap();
        let refusals = Refusals::new(Duration::from_millis(200), 3);
        let first: Vec<bool> = (0..5000)
            .map(|_| refusals.note(&log, 65534, Some(9), "power_cap: not in group g", true))
            .collect();
        assert_eq!(first.iter().filter(|f| **f).count(), 3);
        assert!(first[..3].iter().all(|f| *f));
        // Another kind, and a kind for the log only.
        assert!(refusals.note(&log, 65534, Some(9), "rate limited", true));
        for _ in 0..3 {
            assert!(refusals.note(&log, 65534, Some(9), "bad frames", false));
        }
        assert!(!refusals.note(&log, 65534, Some(9), "bad frames", false));
        refusals.flush(&log, false);
        assert_eq!(log.since(0, 100).0.len(), 4, "no window has ended yet");
        std::thread::sleep(Duration::from_millis(250));
        refusals.flush(&log, false);
        let (events, _) = log.since(0, 100);
        let reasons: Vec<String> = events
            .iter()
            .map(|e| match &e.event {
                NodeEvent::PeerRefused { reason, .. } => reason.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(reasons.len(), 5, "{reasons:?}");
        assert_eq!(
            reasons[4],
            "power_cap: not in group g: refused 4997 more times in 1 s"
        );
        // The flood going on is counted from the first in its new window; the kind that was
        // quiet is recorded again.
        assert!(!refusals.note(&log, 65534, None, "power_cap: not in group g", true));
        assert!(refusals.note(&log, 65534, None, "rate limited", true));
        refusals.flush(&log, true);
        assert_eq!(log.since(0, 100).0.len(), 7);
        let text = std::fs::read_to_string(log.path()).unwrap();
        assert_eq!(text.lines().count(), 7);
    }
}
