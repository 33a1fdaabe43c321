//! Dedicated telemetry subscribers: connections that asked for snapshots alone and said they
//! send nothing more (`subscribe` with `dedicated`, the console's second connection). They
//! leave the runtime: the sampler's thread that takes a snapshot writes it to each of them
//! itself, non-blocking, so a push wakes no thread of the daemon's but that one (through the
//! runtime, a push woke its worker twice: for the snapshot, and for the socket's room once the
//! client had read it).
//!
//! The encoding and the rules are the runtime's, both in `push` (`TelemetryFrames`, and
//! `Sent::step` for what becomes of each snapshot): each push is the snapshot's changes to the
//! last one written to that connection (whole every [`crate::protocol::delta::KEYFRAME_EVERY`]
//! pushes, or without `delta`); a client that has not read what was written before skips
//! snapshots rather than be given a backlog. What this path gives the rule is its backlog: the
//! socket holds a push unread (`Backlog::Unread`, so the snapshot is skipped) while a quarter of
//! its send buffer, [`DEDICATED_SEND_BUFFER`] doubled by the kernel, waits unread (the kernel's
//! rule for writable: one push of a busy node or a few small ones), or while the end of a frame
//! the socket took only in part is still to go; that end is finished before anything else is
//! written. A client that closed is dropped at the next
//! push; at shutdown each is told, as other connections are.

use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::SendFlags;

use super::limits::{Admitted, DEDICATED_SEND_BUFFER};
use super::push::{Backlog, Sent, Step, TelemetryFrames};
use crate::daemon::state::Daemon;
use crate::daemon::telemetry::Sink;
use crate::telemetry::Snapshot;

/// Every dedicated subscriber, and the newest snapshot (what a new one gets first).
pub(super) struct Direct {
    frames: Arc<TelemetryFrames>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    conns: Vec<Subscriber>,
    newest: Option<Arc<Snapshot>>,
    /// Shut down: no more subscribers, no more pushes.
    closed: bool,
}

/// One dedicated connection.
struct Subscriber {
    stream: UnixStream,
    /// Pushes as changes to the last snapshot written.
    delta: bool,
    /// The last snapshot written (or begun).
    sent: Sent,
    /// The end of a frame the socket did not take whole, and where it stands.
    rest: Option<(Arc<str>, usize)>,
    /// Its place in the connection bounds, and in the daemon's count of clients.
    _held: Held,
    who: String,
}

/// What a dedicated connection holds while it lasts: its admission (per-user and total
/// connection bounds) and one in the daemon's client count.
pub(super) struct Held {
    _admitted: Admitted,
    daemon: Arc<Daemon>,
}

impl Held {
    pub(super) fn new(admitted: Admitted, daemon: Arc<Daemon>) -> Held {
        Held {
            _admitted: admitted,
            daemon,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.daemon.client(false);
    }
}

impl Direct {
    pub(super) fn new(frames: Arc<TelemetryFrames>) -> Direct {
        Direct {
            frames,
            inner: Mutex::default(),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take `stream` on (its subscription already answered): the newest snapshot goes to it
    /// at once, whole, then each new one. Once shut down, the stream is dropped.
    pub(super) fn add(&self, stream: UnixStream, delta: bool, held: Held, who: String) {
        if let Err(e) = stream.set_nonblocking(true) {
            tracing::debug!("{who}: a dedicated subscriber's socket: {e}");
            return;
        }
        if let Err(e) =
            rustix::net::sockopt::set_socket_send_buffer_size(&stream, DEDICATED_SEND_BUFFER)
        {
            tracing::debug!("{who}: setting a dedicated subscriber's send buffer: {e}");
        }
        let mut sub = Subscriber {
            stream,
            delta,
            sent: Sent::default(),
            rest: None,
            _held: held,
            who,
        };
        let mut inner = self.inner();
        if inner.closed {
            return;
        }
        if let Some(newest) = inner.newest.clone() {
            if !sub.push(&newest, &self.frames) {
                return;
            }
        }
        tracing::debug!("{}: dedicated telemetry subscriber", sub.who);
        inner.conns.push(sub);
    }

    /// Tell every subscriber `line` (the shutdown push), as far as its socket takes it now,
    /// and drop them all; none is taken after this.
    pub(super) fn close(&self, line: &str) {
        let conns = {
            let mut inner = self.inner();
            inner.closed = true;
            std::mem::take(&mut inner.conns)
        };
        for mut sub in conns {
            if sub.finish() == Room::Yes {
                let _ = send(&sub.stream, line.as_bytes());
            }
        }
    }

    /// How many subscribers there are now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner().conns.len()
    }
}

impl Sink for Direct {
    fn put(&self, snap: &Arc<Snapshot>) {
        let mut inner = self.inner();
        if inner.closed {
            return;
        }
        inner.newest = Some(Arc::clone(snap));
        inner.conns.retain_mut(|sub| {
            let there = sub.push(snap, &self.frames);
            if !there {
                tracing::debug!("{}: dedicated telemetry subscriber gone", sub.who);
            }
            there
        });
    }
}

impl Subscriber {
    /// Write `snap` to this subscriber, or skip it (see the module doc); false once the
    /// client is gone.
    fn push(&mut self, snap: &Arc<Snapshot>, frames: &TelemetryFrames) -> bool {
        // The rest of a frame begun first; then whether the socket holds too much unread.
        let backlog = match self.finish() {
            Room::Yes => match room(&self.stream) {
                Room::Yes => Backlog::Clear,
                Room::No => Backlog::Unread,
                Room::Gone => return false,
            },
            Room::No => Backlog::Unread,
            Room::Gone => return false,
        };
        let base = match self.sent.step(self.delta, backlog) {
            Step::Write(base) | Step::Replace(base) => base,
            Step::Skip => return true,
        };
        let (line, is_delta) = frames.line(snap, base.as_ref());
        let wrote = match send(&self.stream, line.as_bytes()) {
            Ok(n) => n,
            Err(Errno::AGAIN) => return true,
            Err(_) => return false,
        };
        self.sent.wrote(Arc::clone(snap), is_delta);
        if wrote < line.len() {
            // The rest goes first next time.
            self.rest = Some((line, wrote));
        }
        true
    }

    /// Write the rest of a frame begun before, as far as the socket takes it: whether the
    /// next may be written (none is left), not yet, or the client is gone.
    fn finish(&mut self) -> Room {
        let Some((line, at)) = self.rest.as_mut() else {
            return Room::Yes;
        };
        match send(&self.stream, &line.as_bytes()[*at..]) {
            Ok(n) => {
                *at += n;
                if *at < line.len() {
                    return Room::No;
                }
                self.rest = None;
                Room::Yes
            }
            Err(Errno::AGAIN) => Room::No,
            Err(_) => Room::Gone,
        }
    }
}

fn send(stream: &UnixStream, bytes: &[u8]) -> Result<usize, Errno> {
    rustix::net::send(stream, bytes, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)
}

/// Whether something may be written to a subscriber now.
#[derive(Debug, PartialEq, Eq)]
enum Room {
    Yes,
    No,
    Gone,
}

/// Whether the socket has room for a push: what it holds unread is under a quarter of its
/// send buffer (the kernel's rule for writable), and the client has not closed.
fn room(stream: &UnixStream) -> Room {
    let mut fds = [PollFd::new(stream, PollFlags::OUT)];
    // Zero: look, do not wait.
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    if rustix::event::poll(&mut fds, Some(&now)).is_err() {
        // EINTR: look again next time (a client that is gone is found by the write).
        return Room::No;
    }
    let got = fds[0].revents();
    if got.intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL) {
        Room::Gone
    } else if got.contains(PollFlags::OUT) {
        Room::Yes
    } else {
        Room::No
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::daemon::server::limits::{Bounds, Limits};
    use crate::protocol::delta::SnapshotStream;
    use crate::protocol::{Response, ServerFrame};
    use crate::telemetry::GpuSample;
    use std::io::{BufRead, BufReader, Read};

    fn snapshot(gpus: u32, t: f64) -> Arc<Snapshot> {
        Arc::new(Snapshot {
            time_s: t,
            gpus: (0..gpus)
                .map(|i| GpuSample {
                    index: i,
                    time_s: t,
                    name: Some(format!("NVIDIA H100 80GB HBM3 number {i}")),
                    uuid: Some(format!("GPU-{i:08}-aaaa-bbbb-cccc-dddddddddddd")),
                    power_w: Some(300.0 + t + f64::from(i)),
                    util_gpu_pct: Some((t * 7.0 + f64::from(i)) % 100.0),
                    ..GpuSample::default()
                })
                .collect(),
            ..Snapshot::default()
        })
    }

    /// A daemon for the client count, bounds for the admission, and a direct set (also for
    /// `push`'s test of both paths).
    pub(in crate::daemon::server) struct Rig {
        _dir: tempfile::TempDir,
        daemon: Arc<Daemon>,
        bounds: Arc<Bounds>,
        pub(in crate::daemon::server) direct: Direct,
    }

    impl Rig {
        fn new() -> Rig {
            Rig::encoding_with(Arc::default())
        }

        /// A rig whose subscribers are sent frames encoded by `frames`.
        pub(in crate::daemon::server) fn encoding_with(frames: Arc<TelemetryFrames>) -> Rig {
            let dir = tempfile::tempdir().unwrap();
            let paths = crate::config::Paths {
                config: dir.path().join("config"),
                state: dir.path().join("state"),
                runtime: dir.path().join("run"),
            };
            std::fs::create_dir_all(&paths.state).unwrap();
            let socket = paths.runtime.join("daemon.sock");
            let daemon = Daemon::new(paths, socket, false, 1.0, None, None, Some("none".into()));
            Rig {
                _dir: dir,
                daemon: Arc::new(daemon.unwrap()),
                bounds: Arc::new(Bounds::new(Limits::default())),
                direct: Direct::new(frames),
            }
        }

        /// A dedicated subscriber as the server hands it over; the client's end.
        pub(in crate::daemon::server) fn subscribe(&self, delta: bool) -> BufReader<UnixStream> {
            let (ours, theirs) = UnixStream::pair().unwrap();
            self.daemon.client(true);
            let admitted = self.bounds.admit(1000, true).unwrap();
            let held = Held::new(admitted, Arc::clone(&self.daemon));
            self.direct.add(ours, delta, held, "test".into());
            theirs
                .set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
            BufReader::new(theirs)
        }

        fn clients(&self) -> usize {
            self.daemon.clients()
        }
    }

    /// The next push on `r`, rebuilt through `stream`: the snapshot, and whether it came as
    /// changes.
    fn read(r: &mut BufReader<UnixStream>, stream: &mut SnapshotStream) -> (Snapshot, bool) {
        let mut line = String::new();
        assert!(r.read_line(&mut line).unwrap() > 0, "closed");
        match stream.decode(&line, usize::MAX).unwrap().response {
            Response::Telemetry { snapshot } => (*snapshot, line.contains("telemetry_delta")),
            other => panic!("{other:?}"),
        }
    }

    /// What `r` holds now, without waiting.
    fn drain(r: &mut BufReader<UnixStream>) -> Vec<u8> {
        r.get_ref().set_nonblocking(true).unwrap();
        let mut got = r.buffer().to_vec();
        r.consume(got.len());
        let mut buf = [0; 4096];
        loop {
            match r.get_mut().read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        r.get_ref().set_nonblocking(false).unwrap();
        got
    }

    #[test]
    fn a_dedicated_subscriber_gets_the_newest_whole_at_once_then_each_as_changes() {
        let rig = Rig::new();
        let first = snapshot(8, 100.0);
        rig.direct.put(&first);
        let mut r = rig.subscribe(true);
        let mut stream = SnapshotStream::default();
        assert_eq!(read(&mut r, &mut stream), ((*first).clone(), false));
        for i in 1..=5 {
            let s = snapshot(8, 100.0 + f64::from(i));
            rig.direct.put(&s);
            assert_eq!(read(&mut r, &mut stream), ((*s).clone(), true), "push {i}");
        }
        // Without `delta`: whole every time.
        let mut whole = rig.subscribe(false);
        let mut other = SnapshotStream::default();
        assert!(!read(&mut whole, &mut other).1, "the newest, whole");
        let s = snapshot(8, 200.0);
        rig.direct.put(&s);
        assert_eq!(read(&mut whole, &mut other), ((*s).clone(), false));
        assert_eq!(read(&mut r, &mut stream), ((*s).clone(), true));
    }

    #[test]
    fn a_subscriber_that_does_not_read_is_skipped_then_gets_changes_to_what_it_was_last_written() {
        let rig = Rig::new();
        let mut r = rig.subscribe(true);
        let mut t = 0.0;
        let mut next = || {
            t += 1.0;
            snapshot(8, t)
        };
        // Far more than the socket may hold unread.
        let mut last = next();
        for _ in 0..200 {
            last = next();
            rig.direct.put(&last);
        }
        let held = drain(&mut r);
        let quarter = 2 * DEDICATED_SEND_BUFFER / 4;
        let frames = held
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .count();
        assert!(frames >= 1, "{frames} pushes written");
        assert!(
            held.len() <= quarter + 4096 && frames < 20,
            "{} bytes, {frames} pushes waited unread: a backlog",
            held.len()
        );
        // Each one it holds reads back; the next push is the newest, as changes to the last
        // one written.
        let mut stream = SnapshotStream::default();
        let mut lines = held.split(|&b| b == b'\n').filter(|l| !l.is_empty());
        let mut seen = Vec::new();
        for line in lines.by_ref() {
            let f = stream
                .decode(std::str::from_utf8(line).unwrap(), usize::MAX)
                .unwrap();
            let Response::Telemetry { snapshot } = f.response else {
                panic!()
            };
            seen.push(snapshot.time_s);
        }
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        assert!(*seen.last().unwrap() < last.time_s);
        let newest = next();
        rig.direct.put(&newest);
        assert_eq!(read(&mut r, &mut stream), ((*newest).clone(), true));
    }

    #[test]
    fn a_frame_the_socket_takes_in_part_is_finished_before_the_next() {
        let rig = Rig::new();
        let mut r = rig.subscribe(true);
        // A node so large that its whole snapshot is more than the socket takes at once.
        let big = snapshot(200, 1.0);
        let whole_len = crate::daemon::server::push::telemetry_push(&big).len();
        assert!(whole_len > 2 * DEDICATED_SEND_BUFFER, "{whole_len} bytes");
        rig.direct.put(&big);
        let part = drain(&mut r);
        assert!(!part.is_empty() && part.len() < whole_len);
        assert!(!part.contains(&b'\n'), "a whole frame went");
        // Each push finishes what it can of it first; once it is all out, changes follow.
        let mut got = part;
        let mut t = 1.0;
        let mut last = big;
        while !got.ends_with(b"\n") || got.iter().filter(|&&b| b == b'\n').count() < 2 {
            t += 1.0;
            last = snapshot(200, t);
            rig.direct.put(&last);
            got.extend(drain(&mut r));
            assert!(
                t < 50.0,
                "never finished: {} of {whole_len} bytes",
                got.len()
            );
        }
        let mut stream = SnapshotStream::default();
        let mut lines = got.split(|&b| b == b'\n').filter(|l| !l.is_empty());
        let first = lines.next().unwrap();
        assert_eq!(first.len() + 1, whole_len);
        let decoded = |line: &[u8], stream: &mut SnapshotStream| match stream
            .decode(std::str::from_utf8(line).unwrap(), usize::MAX)
            .unwrap()
            .response
        {
            Response::Telemetry { snapshot } => *snapshot,
            other => panic!("{other:?}"),
        };
        assert_eq!(decoded(first, &mut stream).time_s, 1.0);
        let mut rebuilt = None;
        for line in lines {
            rebuilt = Some(decoded(line, &mut stream));
        }
        assert_eq!(rebuilt.as_ref(), Some(&*last));
    }

    #[test]
    fn a_client_that_closed_is_dropped_at_the_next_push_and_counted_out() {
        let rig = Rig::new();
        let r = rig.subscribe(true);
        let _kept = rig.subscribe(true);
        assert_eq!((rig.direct.len(), rig.clients()), (2, 2));
        assert_eq!(rig.bounds.held(1000), (2, 2));
        drop(r);
        rig.direct.put(&snapshot(2, 1.0));
        assert_eq!((rig.direct.len(), rig.clients()), (1, 1));
        assert_eq!(rig.bounds.held(1000), (1, 1));
    }

    #[test]
    fn at_shutdown_each_is_told_and_none_is_taken_after() {
        let rig = Rig::new();
        rig.direct.put(&snapshot(2, 1.0));
        let mut r = rig.subscribe(true);
        let mut stream = SnapshotStream::default();
        read(&mut r, &mut stream);
        rig.direct
            .close("{\"type\":\"shutdown\",\"reason\":\"the daemon is stopping\"}\n");
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let f: ServerFrame = crate::protocol::decode(&line, usize::MAX).unwrap();
        assert!(matches!(f.response, Response::Shutdown { .. }), "{line}");
        assert_eq!(r.read_line(&mut line).unwrap(), 0, "closed after");
        let mut late = rig.subscribe(true);
        assert_eq!(
            late.read_line(&mut line).unwrap(),
            0,
            "a late one is closed"
        );
        rig.direct.put(&snapshot(2, 2.0));
        assert_eq!((rig.direct.len(), rig.clients()), (0, 0));
    }
}
