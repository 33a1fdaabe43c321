//! Telemetry pushes, for both paths that deliver them: the runtime's (`Outbox` in the server,
//! where the newest snapshot waits for the connection's writer task) and the dedicated
//! subscribers' (`direct`, written from the sampler's thread). Both encode here and both skip
//! by the one rule here, so that a client is given the same frames whichever path serves it.
//!
//! - **The encoder** ([`TelemetryFrames`]): each snapshot is encoded once whole and once as its
//!   changes to the snapshot before (`crate::protocol::delta`), however many connections are
//!   sent it; [`telemetry_push`] writes the whole frame from a borrowed snapshot.
//! - **What a connection was last written** ([`Sent`]): the base of its next delta, and the
//!   deltas since its last whole snapshot (whole again every [`delta::KEYFRAME_EVERY`] pushes,
//!   or always without `delta`).
//! - **The rule** ([`Sent::step`]): given that record and what the connection still holds of
//!   earlier pushes ([`Backlog`], the one thing the paths differ in), a new snapshot is written
//!   now, put in place of the push that waits, or skipped; and encoded whole or as its changes
//!   to the last snapshot written. The runtime's outbox has a push waiting ([`Backlog::Waiting`])
//!   until its writer takes it; a dedicated subscriber's socket holds a push unread
//!   ([`Backlog::Unread`]) while a quarter of its send buffer waits, or while the end of a
//!   frame it took in part is still to be written. A snapshot that is skipped or replaced is
//!   never a base: the next delta is against what the client has.

use std::sync::Arc;

use crate::protocol::{self, delta};
use crate::telemetry::Snapshot;

/// The newest snapshot's push frames, shared by every subscribed connection: each snapshot is
/// encoded once whole and once as changes to the one before, however many consoles watch
/// (connections that keep up all have the same base).
#[derive(Default)]
pub(super) struct TelemetryFrames {
    newest: std::sync::Mutex<Option<NewestFrames>>,
}

struct NewestFrames {
    snap: Arc<Snapshot>,
    whole: Option<Arc<str>>,
    /// Its changes to `.0`.
    delta: Option<(Arc<Snapshot>, Arc<str>)>,
}

impl TelemetryFrames {
    /// The push frame of `snap`, shared (every subscriber holds the same bytes): its changes
    /// to `base` when there is one and the GPUs are the same (then true), else `snap` whole.
    pub(super) fn line(
        &self,
        snap: &Arc<Snapshot>,
        base: Option<&Arc<Snapshot>>,
    ) -> (Arc<str>, bool) {
        let mut newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        let frames = match newest.as_mut() {
            Some(f) if Arc::ptr_eq(&f.snap, snap) => f,
            _ => newest.insert(NewestFrames {
                snap: Arc::clone(snap),
                whole: None,
                delta: None,
            }),
        };
        if let Some(base) = base {
            if let Some((b, line)) = &frames.delta {
                if Arc::ptr_eq(b, base) {
                    return (Arc::clone(line), true);
                }
            }
            if let Some(line) = delta::encode_delta(base, snap) {
                let line: Arc<str> = Arc::from(line);
                frames.delta = Some((Arc::clone(base), Arc::clone(&line)));
                return (line, true);
            }
        }
        let whole = frames
            .whole
            .get_or_insert_with(|| Arc::from(telemetry_push(snap)));
        (Arc::clone(whole), false)
    }
}

/// `push(Response::Telemetry { snapshot })` without copying the snapshot first: the same
/// bytes, from a borrowed snapshot.
pub(super) fn telemetry_push(snapshot: &Snapshot) -> String {
    #[derive(serde::Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Push<'a> {
        Telemetry { snapshot: &'a Snapshot },
    }
    protocol::encode(&Push::Telemetry { snapshot })
}

/// What a subscriber was last written, for the next push's base (the outbox's and each
/// dedicated subscriber's).
#[derive(Default)]
pub(super) struct Sent {
    /// The last snapshot written: the base of the next delta (None: the next goes whole).
    snap: Option<Arc<Snapshot>>,
    /// Deltas written since the last whole snapshot.
    deltas: u32,
}

/// What a connection still holds of earlier pushes when a new snapshot comes: where the two
/// paths differ, the input to [`Sent::step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Backlog {
    /// Nothing: the new push is written now.
    Clear,
    /// A push waits in the daemon, not yet written (the outbox, while its writer is busy):
    /// the new one takes its place.
    Waiting,
    /// The socket holds pushes unread (a quarter of its send buffer), or the end of a frame
    /// it took in part is still to be written (a dedicated subscriber): the new one is skipped.
    Unread,
}

/// What becomes of a new snapshot, by [`Sent::step`]. The base is the snapshot to encode it
/// against ([`TelemetryFrames::line`]); None: whole.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    /// Write it now.
    Write(Option<Arc<Snapshot>>),
    /// Put it in place of the push that waits.
    Replace(Option<Arc<Snapshot>>),
    /// Not written at all: the next push is encoded against what was last written.
    Skip,
}

impl Sent {
    /// The one rule: what becomes of a new snapshot for a connection that was last written
    /// this, holds `backlog`, and asked for changes where `delta`. Written or queued, it goes
    /// as changes to the last snapshot written, or whole (see [`Sent::base`]); a snapshot that
    /// waits or is skipped is no base, so a client that skips is sent changes to what it has.
    pub(super) fn step(&self, delta: bool, backlog: Backlog) -> Step {
        match backlog {
            Backlog::Clear => Step::Write(self.base(delta)),
            Backlog::Waiting => Step::Replace(self.base(delta)),
            Backlog::Unread => Step::Skip,
        }
    }

    /// The base of the next push: the last snapshot written, unless it goes whole (no deltas
    /// asked, nothing written yet, or [`delta::KEYFRAME_EVERY`] pushes since the last whole).
    fn base(&self, delta: bool) -> Option<Arc<Snapshot>> {
        (delta && self.deltas + 1 < delta::KEYFRAME_EVERY)
            .then(|| self.snap.clone())
            .flatten()
    }

    /// Whether a frame encoded against `base` (a delta where `is_delta`) still fits what was
    /// last written: a delta only against the last snapshot written, and nothing encoded
    /// against a base that has since been replaced.
    pub(super) fn fits(&self, base: Option<&Arc<Snapshot>>, is_delta: bool) -> bool {
        match (&self.snap, base) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => !is_delta,
        }
    }

    /// `snap` was written (as changes where `is_delta`).
    pub(super) fn wrote(&mut self, snap: Arc<Snapshot>, is_delta: bool) {
        self.deltas = if is_delta { self.deltas + 1 } else { 0 };
        self.snap = Some(snap);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::daemon::server::push as push_frame;
    use crate::protocol::{Response, ServerFrame};
    use crate::telemetry::{GpuSample, HostSample};

    /// Two GPUs and the host, at `power` watts (the server's tests use it too).
    pub(in crate::daemon::server) fn snapshot(power: f64) -> Snapshot {
        Snapshot {
            time_s: 1_796_008_500.25,
            gpus: (0..2)
                .map(|i| GpuSample {
                    index: i,
                    time_s: 1_796_008_500.0,
                    power_w: Some(power + f64::from(i)),
                    temperature_c: Some(61.5),
                    ..GpuSample::default()
                })
                .collect(),
            host: Some(HostSample {
                cpu_pct: Some(12.5),
                ..HostSample::default()
            }),
            ..Snapshot::default()
        }
    }

    #[test]
    fn a_telemetry_push_is_the_same_frame_as_the_response_encodes() {
        let snap = snapshot(300.0);
        let expected = push_frame(Response::Telemetry {
            snapshot: Box::new(snap.clone()),
        });
        assert_eq!(telemetry_push(&snap), expected);
        let back: ServerFrame = protocol::decode(&expected, usize::MAX).unwrap();
        assert_eq!(
            back.response,
            Response::Telemetry {
                snapshot: Box::new(snap)
            }
        );
    }

    #[test]
    fn each_snapshot_is_encoded_once_and_a_new_one_replaces_it() {
        let frames = TelemetryFrames::default();
        let a = Arc::new(snapshot(300.0));
        let (first, delta) = frames.line(&a, None);
        assert!(!delta);
        assert_eq!(*first, telemetry_push(&a));
        assert!(
            Arc::ptr_eq(&frames.line(&a, None).0, &first),
            "the same snapshot: the same bytes, not encoded again"
        );
        let b = Arc::new(snapshot(310.0));
        let (changes, delta) = frames.line(&b, Some(&a));
        assert!(delta);
        assert_eq!(*changes, delta::encode_delta(&a, &b).unwrap());
        assert!(
            Arc::ptr_eq(&frames.line(&b, Some(&a)).0, &changes),
            "the same changes for every subscriber with the same base"
        );
        let (whole, delta) = frames.line(&b, None);
        assert!(!delta);
        assert_eq!(*whole, telemetry_push(&b));
        // Other GPUs: whole, even against a base.
        let mut fewer = snapshot(320.0);
        fewer.gpus.pop();
        let fewer = Arc::new(fewer);
        assert_eq!(
            frames.line(&fewer, Some(&b)),
            (Arc::from(telemetry_push(&fewer)), false)
        );
    }

    #[test]
    fn a_push_is_written_replaces_the_waiting_one_or_is_skipped_and_only_what_was_written_is_a_base()
     {
        let mut sent = Sent::default();
        // Nothing written yet: whole, however deltas were asked.
        assert_eq!(sent.step(true, Backlog::Clear), Step::Write(None));
        assert_eq!(sent.step(true, Backlog::Waiting), Step::Replace(None));
        assert_eq!(sent.step(true, Backlog::Unread), Step::Skip);
        let a = Arc::new(snapshot(300.0));
        sent.wrote(Arc::clone(&a), false);
        assert_eq!(
            sent.step(true, Backlog::Clear),
            Step::Write(Some(Arc::clone(&a)))
        );
        assert_eq!(
            sent.step(true, Backlog::Waiting),
            Step::Replace(Some(Arc::clone(&a)))
        );
        assert_eq!(sent.step(false, Backlog::Clear), Step::Write(None));
        assert_eq!(sent.step(true, Backlog::Unread), Step::Skip);
        // A skipped or replaced snapshot is no base: changes to what was written follow.
        assert_eq!(
            sent.step(true, Backlog::Clear),
            Step::Write(Some(Arc::clone(&a)))
        );
        assert!(sent.fits(Some(&a), true) && sent.fits(None, false));
        let b = Arc::new(snapshot(310.0));
        assert!(!sent.fits(Some(&b), true) && !sent.fits(None, true));
        // Whole again KEYFRAME_EVERY pushes after the last whole one.
        for i in 1..=delta::KEYFRAME_EVERY {
            let s = Arc::new(snapshot(400.0 + f64::from(i)));
            let Step::Write(base) = sent.step(true, Backlog::Clear) else {
                panic!("push {i}")
            };
            assert_eq!(base.is_some(), i < delta::KEYFRAME_EVERY, "push {i}");
            sent.wrote(s, base.is_some());
        }
        let Step::Write(base) = sent.step(true, Backlog::Clear) else {
            panic!()
        };
        assert!(base.is_some(), "changes to the keyframe");
    }

    /// One subscriber's end of either path: the bytes it has read, rebuilt into snapshots.
    struct Client {
        /// Which path serves it, for messages.
        path: &'static str,
        stream: std::os::unix::net::UnixStream,
        /// Read, not yet a whole frame.
        partial: Vec<u8>,
        decoder: delta::SnapshotStream,
        /// Each push read: the frame, the snapshot it rebuilt, and whether it came as changes.
        got: Vec<(String, Snapshot, bool)>,
    }

    impl Client {
        fn new(path: &'static str, stream: std::os::unix::net::UnixStream) -> Client {
            stream.set_nonblocking(false).unwrap();
            Client {
                path,
                stream,
                partial: Vec::new(),
                decoder: delta::SnapshotStream::default(),
                got: Vec::new(),
            }
        }

        /// Read for up to `wait`, and until `until` pushes have come (if any); the pushes read.
        fn read(&mut self, wait: std::time::Duration, until: Option<usize>) -> usize {
            use std::io::Read;
            let before = self.got.len();
            let by = std::time::Instant::now() + wait;
            let mut buf = [0; 65536];
            while until.is_none_or(|n| self.got.len() - before < n) {
                let left = by.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                self.stream.set_read_timeout(Some(left)).unwrap();
                match self.stream.read(&mut buf) {
                    Ok(0) => panic!("closed"),
                    Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
                while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = self.partial.drain(..=end).collect();
                    let line = String::from_utf8(line).unwrap();
                    let frame = (self.decoder.decode(&line, usize::MAX))
                        .unwrap_or_else(|e| panic!("{}: {e}: {line}", self.path));
                    let Response::Telemetry { snapshot } = frame.response else {
                        panic!("{line}")
                    };
                    let is_delta = line.starts_with(r#"{"type":"telemetry_delta","#);
                    self.got.push((line, *snapshot, is_delta));
                }
            }
            self.got.len() - before
        }

        /// The times of the snapshots received, in order.
        fn times(&self) -> Vec<f64> {
            self.got.iter().map(|(_, s, _)| s.time_s).collect()
        }
    }

    /// Eight GPUs whose values change every snapshot; `lost` leaves GPU 3 out.
    fn node(t: f64, lost: bool) -> Arc<Snapshot> {
        Arc::new(Snapshot {
            time_s: 1_796_008_500.0 + t,
            gpus: (0..8u32)
                .filter(|&i| !(lost && i == 3))
                .map(|i| GpuSample {
                    index: i,
                    time_s: 1_796_008_500.0 + t,
                    name: Some(format!("NVIDIA H100 80GB HBM3 number {i}")),
                    uuid: Some(format!("GPU-{i:08}-aaaa-bbbb-cccc-dddddddddddd")),
                    power_w: Some(300.0 + t + f64::from(i)),
                    util_gpu_pct: Some((t * 7.0 + f64::from(i)) % 100.0),
                    temperature_c: Some(50.0 + (t + f64::from(i)) % 30.0),
                    ..GpuSample::default()
                })
                .collect(),
            host: Some(HostSample {
                cpu_pct: Some(t % 100.0),
                ..HostSample::default()
            }),
            ..Snapshot::default()
        })
    }

    /// Each push received is a snapshot sent, none older than one received before it; each
    /// is whole where the client has none yet, where the GPUs changed since the last one it
    /// got, and every KEYFRAME_EVERY pushes, and changes to the last one it got otherwise.
    fn in_order(client: &Client, sent: &[Arc<Snapshot>], path: &str) {
        let mut at = 0;
        let mut since_whole = 0;
        let mut last: Option<&Snapshot> = None;
        for (i, (line, got, is_delta)) in client.got.iter().enumerate() {
            let Some(k) = sent[at..].iter().position(|s| **s == *got) else {
                panic!("{path}: a snapshot never sent, or older than one received before: {line}")
            };
            at += k + 1;
            let same_gpus = last.is_some_and(|l| {
                l.gpus
                    .iter()
                    .map(|g| g.index)
                    .eq(got.gpus.iter().map(|g| g.index))
            });
            let whole = !same_gpus || since_whole + 1 == delta::KEYFRAME_EVERY;
            assert_eq!(
                *is_delta, !whole,
                "{path}, push {i} received: whole or changes"
            );
            since_whole = if whole { 0 } else { since_whole + 1 };
            last = Some(got);
        }
        let times = client.times();
        assert!(times.windows(2).all(|w| w[0] < w[1]), "{path}: {times:?}");
    }

    /// The same snapshots through both paths (the runtime's outbox and its writer task, and a
    /// dedicated subscriber written from the sampler's thread), each to a client that reads
    /// all and to one that stops reading a while: the same frames to the one that keeps up,
    /// the newest last to the one that stalls, and nothing old after anything newer to either.
    #[test]
    fn both_paths_push_the_same_frames_and_skip_alike() {
        use super::super::limits::{QUEUED_ANSWER_BYTES, SUBSCRIBER_SEND_BUFFER};
        use super::super::{Outbox, QUEUE, write_loop};
        use crate::daemon::telemetry::Sink;
        use std::time::Duration;

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let frames = Arc::new(TelemetryFrames::default());
        // The runtime's path, as a connection subscribed to telemetry with `delta`.
        let outbox = |frames: Arc<TelemetryFrames>| {
            let _in = runtime.enter();
            let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
            rustix::net::sockopt::set_socket_send_buffer_size(&ours, SUBSCRIBER_SEND_BUFFER)
                .unwrap();
            let (_rd, wr) = ours.into_split();
            let (tx, rx) = tokio::sync::mpsc::channel::<String>(QUEUE);
            let out = Arc::new(Outbox::new(QUEUED_ANSWER_BYTES));
            runtime.spawn(write_loop(wr, rx, Arc::clone(&out)));
            let put = move |s: &Arc<Snapshot>| out.put_snapshot(s, true, |s, b| frames.line(s, b));
            (
                put,
                tx,
                _rd,
                Client::new("outbox", theirs.into_std().unwrap()),
            )
        };
        let rig = super::super::direct::tests::Rig::encoding_with(Arc::clone(&frames));
        let (put_async, _tx, _rd, mut keeps_async) = outbox(Arc::clone(&frames));
        let (put_async_slow, _tx2, _rd2, mut stalls_async) = outbox(Arc::clone(&frames));
        let mut keeps_direct = Client::new("direct", rig.subscribe(true).into_inner());
        let mut stalls_direct = Client::new("direct", rig.subscribe(true).into_inner());
        let put = |s: &Arc<Snapshot>| {
            // As the sampler's thread does: the dedicated subscribers first, then the runtime's.
            rig.direct.put(s);
            put_async(s);
            put_async_slow(s);
        };
        let second = Duration::from_secs(5);

        // Seven GPUs in the middle (GPU 3 lost), then eight again: more pushes than two
        // keyframes' worth, so the cadence and the changes of GPUs both show.
        let total = 2 * delta::KEYFRAME_EVERY + 45;
        // From here the stalling clients stop reading: after the last change of GPUs, and for
        // fewer pushes than a keyframe's worth, so that what comes after the stall is changes
        // to what they have.
        let stall = 135;
        let lost = |i: u32| (70..130).contains(&i);
        let mut sent = Vec::new();
        for i in 0..total {
            let s = node(f64::from(i), lost(i));
            put(&s);
            sent.push(Arc::clone(&s));
            assert_eq!(keeps_direct.read(second, Some(1)), 1, "direct, push {i}");
            assert_eq!(keeps_async.read(second, Some(1)), 1, "outbox, push {i}");
            // The stalling clients read along until the stall.
            if i < stall {
                assert_eq!(stalls_direct.read(second, Some(1)), 1, "direct, push {i}");
                assert_eq!(stalls_async.read(second, Some(1)), 1, "outbox, push {i}");
            } else {
                // Not reading: give the runtime's writer its turn to fill the socket.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // The client that keeps up: each snapshot, the same frame by either path, whole at
        // the first, at each change of GPUs and every KEYFRAME_EVERY pushes between.
        let mut since_whole = 0;
        for (i, ((d, a), s)) in keeps_direct
            .got
            .iter()
            .zip(&keeps_async.got)
            .zip(&sent)
            .enumerate()
        {
            let i = i as u32;
            assert_eq!(d.1, **s, "direct, push {i}");
            assert_eq!(a.1, **s, "outbox, push {i}");
            assert_eq!(d.0, a.0, "push {i}: the two paths wrote other frames");
            let whole =
                i == 0 || lost(i) != lost(i - 1) || since_whole + 1 == delta::KEYFRAME_EVERY;
            assert_eq!((d.2, a.2), (!whole, !whole), "push {i}: whole or changes");
            since_whole = if whole { 0 } else { since_whole + 1 };
        }
        assert_eq!(keeps_direct.got.len(), sent.len());

        // The clients that stalled: what waits for them (in the socket, and in the outbox),
        // then one more snapshot; it is the last they get, as changes to what they have.
        let stalled = sent.len() - stall as usize;
        let waited_direct = stalls_direct.read(Duration::from_millis(300), None);
        // The outbox's writer finishes what the socket holds, then writes the push that waited.
        let mut waited_async = 0;
        while stalls_async.times().last() != sent.last().map(|s| &s.time_s) {
            match stalls_async.read(second, Some(1)) {
                0 => break,
                n => waited_async += n,
            }
        }
        assert!(
            (1..stalled / 2).contains(&waited_direct) && (1..stalled / 2).contains(&waited_async),
            "of {stalled} pushes, {waited_direct} (direct) and {waited_async} (outbox) came"
        );
        assert_eq!(
            stalls_async.times().last(),
            sent.last().map(|s| &s.time_s),
            "outbox: the newest waited, and came last"
        );
        let newest = node(f64::from(total), false);
        put(&newest);
        sent.push(Arc::clone(&newest));
        for (client, path) in [
            (&mut stalls_direct, "direct"),
            (&mut stalls_async, "outbox"),
        ] {
            assert_eq!(client.read(second, Some(1)), 1, "{path}: the newest");
            assert_eq!(
                client.read(Duration::from_millis(100), None),
                0,
                "{path}: more after the newest"
            );
            let (_, last, is_delta) = client.got.last().unwrap();
            assert_eq!(last, &*newest, "{path}: the newest");
            assert!(
                is_delta,
                "{path}: the newest as changes to what the client has"
            );
            in_order(client, &sent, path);
        }
        in_order(&keeps_direct, &sent, "direct");
        in_order(&keeps_async, &sent, "outbox");
    }
}
