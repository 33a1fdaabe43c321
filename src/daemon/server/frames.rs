//! Frames from a client, one a line: the connection's reader.
//!
//! Its buffer starts at [`READ_BUFFER`] and grows with a frame, never past the frame limit,
//! and goes back to its first size once a long frame has been read, so an idle connection
//! holds kilobytes, not the megabyte its longest frame needed. Its growth draws on a budget
//! the connections of its kind share (trusted peers' or the others',
//! [`limits::UNFINISHED_BYTES`]): when it is spent, the
//! connection stops reading until it is not. A frame begun must end within a deadline, waits
//! for the budget included.
//!
//! [`limits::UNFINISHED_BYTES`]: super::limits::UNFINISHED_BYTES

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::codec::{FramedRead, LinesCodec};

use super::limits::READ_BUFFER;

/// What reading gave.
#[derive(Debug)]
pub enum Read {
    /// One frame, without its newline (nor a `\r` before it).
    Frame(String),
    /// The client closed its side (after its last frame, if that had no newline).
    End,
    /// More than the limit without a newline.
    TooLong,
    NotUtf8,
    /// A frame begun and not ended within the deadline given to [`Frames::new`].
    Stalled,
    Failed(std::io::Error),
}

/// A connection's reader. See the module doc.
pub struct Frames {
    rd: OwnedReadHalf,
    buf: Vec<u8>,
    /// Where the frames not yet taken begin in `buf`.
    start: usize,
    /// Bytes from `start` on known to hold no newline.
    scanned: usize,
    /// The longest frame, newline excluded.
    max: usize,
    /// When the unfinished frame in `buf` began; None when there is none.
    since: Option<Instant>,
    /// How long a frame may stay unfinished.
    within: Duration,
    /// The budget growth draws on (KiB permits); None: unbounded (tests).
    budget: Option<Arc<Semaphore>>,
    /// What this buffer holds of it.
    held: Option<OwnedSemaphorePermit>,
    ended: bool,
}

impl Frames {
    /// Frames of at most `max` bytes from `rd`, each to end within `within` of its first byte.
    pub fn new(
        rd: OwnedReadHalf,
        max: usize,
        within: Duration,
        budget: Option<Arc<Semaphore>>,
    ) -> Frames {
        Frames {
            rd,
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            max,
            since: None,
            within,
            budget,
            held: None,
            ended: false,
        }
    }

    /// Set the connection's kernel send buffer to `bytes` (the kernel doubles it); a failure is
    /// only logged (the default buffer is larger, nothing else changes).
    pub fn send_buffer(&self, bytes: usize) {
        let socket: &tokio::net::UnixStream = self.rd.as_ref();
        if let Err(e) = rustix::net::sockopt::set_socket_send_buffer_size(socket, bytes) {
            tracing::debug!("setting a connection's send buffer: {e}");
        }
    }

    /// The buffer's size now (for tests).
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// The next frame. Cancel-safe: dropped while waiting, it loses nothing (the only waits are
    /// a socket read and the budget).
    pub async fn next(&mut self) -> Read {
        loop {
            if let Some(frame) = self.take_frame() {
                return frame;
            }
            if self.ended {
                return Read::End;
            }
            if self.buf.len() - self.start > self.max {
                return Read::TooLong;
            }
            let read = match self.since {
                Some(t) => {
                    let by = tokio::time::Instant::from_std(t) + self.within;
                    match tokio::time::timeout_at(by, self.read_more()).await {
                        Ok(read) => read,
                        Err(_) => return Read::Stalled,
                    }
                }
                None => self.read_more().await,
            };
            match read {
                Ok(0) => self.ended = true,
                Ok(_) => {
                    if self.since.is_none() {
                        self.since = Some(Instant::now());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Read::Failed(e),
            }
        }
    }

    /// Read what the client sent, after making room: frames already taken are dropped from the
    /// front, and a buffer still full grows.
    async fn read_more(&mut self) -> std::io::Result<usize> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
            self.fit();
        }
        if self.buf.len() == self.buf.capacity() {
            self.grow().await;
        }
        self.rd.read_buf(&mut self.buf).await
    }

    /// A complete frame from the buffer, if there is one; at the end of the stream, what is
    /// left (a last frame without its newline).
    fn take_frame(&mut self) -> Option<Read> {
        let from = self.start + self.scanned;
        let (end, newline) = match self.buf[from..].iter().position(|&b| b == b'\n') {
            Some(i) => (from + i, 1),
            None if self.ended && self.start < self.buf.len() => (self.buf.len(), 0),
            None => {
                self.scanned = self.buf.len() - self.start;
                return None;
            }
        };
        if end - self.start > self.max {
            return Some(Read::TooLong);
        }
        let mut line = &self.buf[self.start..end];
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        let frame = match std::str::from_utf8(line) {
            Ok(s) => Read::Frame(s.to_string()),
            Err(_) => Read::NotUtf8,
        };
        self.start = end + newline;
        self.scanned = 0;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            self.since = None;
            self.fit();
        } else {
            self.since = Some(Instant::now());
        }
        Some(frame)
    }

    /// Room for at least one more byte: the buffer doubles, up to the limit and a newline.
    async fn grow(&mut self) {
        let cap = self.buf.capacity();
        let target = (cap * 2).max(READ_BUFFER).min(self.max + 1).max(cap + 1);
        if let Some(budget) = &self.budget {
            let want = kib(target.saturating_sub(READ_BUFFER));
            let have = self.held.as_ref().map_or(0, |p| p.num_permits());
            if want > have {
                let more = u32::try_from(want - have).unwrap_or(u32::MAX);
                // The semaphore is never closed; if it were, growing unbudgeted is the lesser
                // harm than a connection that can never read again.
                if let Ok(p) = Arc::clone(budget).acquire_many_owned(more).await {
                    match &mut self.held {
                        Some(h) => h.merge(p),
                        None => self.held = Some(p),
                    }
                }
            }
        }
        self.buf.reserve_exact(target - self.buf.len());
    }

    /// After a long frame, a buffer at least twice what it holds (and larger than its first
    /// size) is replaced by one that fits: a new allocation, so that the old one goes back
    /// whole; and the budget it no longer needs goes back to the others.
    fn fit(&mut self) {
        let keep = self.buf.len().max(READ_BUFFER);
        if self.buf.capacity() < keep * 2 {
            return;
        }
        let mut small = Vec::with_capacity(keep);
        small.extend_from_slice(&self.buf);
        self.buf = small;
        let need = kib(self.buf.capacity().saturating_sub(READ_BUFFER));
        if need == 0 {
            self.held = None;
        } else if let Some(h) = &mut self.held {
            if let Some(excess) = h.split(h.num_permits().saturating_sub(need)) {
                drop(excess);
            }
        }
    }

    /// The read half, for a connection that is read no more (a dedicated subscriber: what it
    /// sent past its subscription is not read).
    pub fn into_inner(self) -> OwnedReadHalf {
        self.rd
    }

    /// The reader as the relay takes it (`relay::Relay::serve`), with what is buffered. The
    /// relay starts after a `trainer_attach` whose answer the trainer waits for, so at most an
    /// unfinished frame is buffered here, which the codec's first read completes.
    pub fn into_framed(self, max: usize) -> FramedRead<OwnedReadHalf, LinesCodec> {
        let mut framed = FramedRead::new(self.rd, LinesCodec::new_with_max_length(max));
        framed
            .read_buffer_mut()
            .extend_from_slice(&self.buf[self.start..]);
        framed
    }
}

fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::UnixStream;

    /// A reader, the daemon's write half (kept open), and the client's end.
    fn pair(max: usize, budget: Option<Arc<Semaphore>>) -> (Frames, impl Sized, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        let (rd, wr) = a.into_split();
        (Frames::new(rd, max, Duration::from_secs(30), budget), wr, b)
    }

    fn frame(r: Read) -> String {
        match r {
            Read::Frame(s) => s,
            other => panic!("not a frame: {other:?}"),
        }
    }

    #[tokio::test]
    async fn frames_split_on_newlines_and_a_last_one_without_is_kept() {
        let (mut f, _wr, mut client) = pair(100, None);
        client
            .write_all(b"{\"a\":1}\n{\"b\":2}\r\n{\"c\"")
            .await
            .unwrap();
        assert_eq!(frame(f.next().await), "{\"a\":1}");
        assert_eq!(frame(f.next().await), "{\"b\":2}");
        assert!(f.since.is_some(), "a frame is begun");
        client.write_all(b":3}").await.unwrap();
        drop(client);
        assert_eq!(frame(f.next().await), "{\"c\":3}");
        assert!(matches!(f.next().await, Read::End));
        assert!(f.since.is_none());
    }

    #[tokio::test]
    async fn a_frame_left_unfinished_past_the_deadline_stalls_and_a_quiet_reader_does_not() {
        let (a, mut client) = UnixStream::pair().unwrap();
        let (rd, _wr) = a.into_split();
        let mut f = Frames::new(rd, 100, Duration::from_millis(200), None);
        let quiet = tokio::time::timeout(Duration::from_millis(400), f.next()).await;
        assert!(quiet.is_err(), "nothing begun: no deadline");
        client.write_all(b"{\"id\":2,").await.unwrap();
        let t = Instant::now();
        assert!(matches!(f.next().await, Read::Stalled));
        assert!(t.elapsed() >= Duration::from_millis(150));
    }

    #[tokio::test]
    async fn a_long_frame_grows_the_buffer_which_shrinks_back_and_one_too_long_is_refused() {
        let (mut f, _wr, mut client) = pair(1 << 20, None);
        let (go, on) = tokio::sync::oneshot::channel::<()>();
        let writer = tokio::spawn(async move {
            let mut big = vec![b'x'; 600_000];
            big.extend_from_slice(b"\nshort\n");
            client.write_all(&big).await.unwrap();
            let _ = on.await;
            let _ = client.write_all(&vec![b'y'; (1 << 20) + 10]).await;
            client
        });
        assert_eq!(frame(f.next().await).len(), 600_000);
        assert!(f.capacity() >= 600_000);
        assert_eq!(frame(f.next().await), "short");
        assert_eq!(f.capacity(), READ_BUFFER, "back to its first size");
        go.send(()).unwrap();
        assert!(matches!(f.next().await, Read::TooLong));
        assert!(
            f.capacity() <= (1 << 20) + 1,
            "never past the limit: {}",
            f.capacity()
        );
        drop(f);
        let _ = writer.await;
    }

    #[tokio::test]
    async fn many_small_frames_in_one_read_are_taken_without_moving_the_rest_each_time() {
        let (mut f, _wr, mut client) = pair(1 << 20, None);
        let mut many = Vec::new();
        for i in 0..20_000 {
            many.extend_from_slice(format!("{{\"id\":{i}}}\n").as_bytes());
        }
        let writer = tokio::spawn(async move {
            client.write_all(&many).await.unwrap();
            client
        });
        for i in 0..20_000 {
            assert_eq!(frame(f.next().await), format!("{{\"id\":{i}}}"));
        }
        assert!(f.since.is_none());
        let _ = writer.await;
    }

    #[tokio::test]
    async fn growth_waits_for_the_shared_budget_and_gives_it_back() {
        let budget = Arc::new(Semaphore::new(64)); // 64 KiB beyond the first 8 KiB
        let (mut f, _wr, mut client) = pair(1 << 20, Some(Arc::clone(&budget)));
        let mut line = vec![b'x'; 50_000];
        line.push(b'\n');
        client.write_all(&line).await.unwrap();
        assert_eq!(frame(f.next().await).len(), 50_000);
        assert_eq!(budget.available_permits(), 64, "given back after the frame");

        // A frame larger than the budget stops reading until it is given more.
        let writer = tokio::spawn(async move {
            client.write_all(&vec![b'z'; 200_000]).await.unwrap();
            client.write_all(b"\n").await.unwrap();
            client
        });
        let waited = tokio::time::timeout(Duration::from_millis(300), f.next()).await;
        assert!(waited.is_err(), "it waits for the budget");
        assert_eq!(
            budget.available_permits(),
            64 - 56,
            "56 KiB held for 64 KiB"
        );
        budget.add_permits(1024);
        assert_eq!(frame(f.next().await).len(), 200_000);
        assert_eq!(budget.available_permits(), 64 + 1024);
        drop(writer);
    }
}
