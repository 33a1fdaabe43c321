//! The node's event log: `$STATE/events.jsonl` (one [`NodeEventRecord`] a line, appended as
//! things happen), the most recent ones in memory for `events` requests, and a live feed for
//! subscribed clients.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use tokio::sync::broadcast;

use crate::protocol::{NodeEvent, NodeEventRecord};
use crate::supervisor::clock::rfc3339;

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
        // One write of a whole line on an O_APPEND file: lines never interleave.
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&self.path)?
            .write_all(line.as_bytes())
    }
}

/// The last [`KEEP`] events of the file (lines that do not parse are skipped).
fn read_tail(path: &Path) -> io::Result<VecDeque<NodeEventRecord>> {
    let mut f = match File::open(path) {
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
}
