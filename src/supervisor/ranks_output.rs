//! The output of `gpupilot ranks`: every rank writes its stdout and stderr to pipes of its own,
//! and one thread of the launcher copies them to the launcher's stdout and stderr (the run's
//! `stdout.log` and `stderr.log`) a whole line at a time, each line prefixed with its rank
//! ([`super::rank_lines`]). Ranks that shared one log file directly would glue their lines
//! together: an unbuffered Python writes a line's text and its newline in two `write()`s.
//!
//! The launcher lives in the run's own session, not in the daemon, so the run's output still
//! never passes through the daemon, and a daemon that dies loses none of it. One `write()` per
//! line (of at most [`MAX_LINE`](super::rank_lines::MAX_LINE) bytes) into a file opened with
//! `O_APPEND` is never interleaved with another. Memory is bounded: one line per stream.

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd as _, OwnedFd};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;

use super::rank_lines::LineJoiner;

/// One stream of one rank, as handed to the pump.
pub struct RankStream {
    pub rank: u32,
    /// The read end of the rank's pipe.
    pub pipe: OwnedFd,
    /// Goes to stderr (else stdout).
    pub stderr: bool,
}

/// The thread that copies the ranks' output; [`Pump::start`] before the first rank.
pub struct Pump {
    streams: Option<Sender<Vec<RankStream>>>,
    done: Receiver<()>,
}

impl Pump {
    /// Start the thread, writing to duplicates of this process's stdout and stderr. It waits
    /// for [`Pump::copy`]; started first, so that no rank is started whose output nothing reads.
    pub fn start() -> io::Result<Pump> {
        let out = File::from(io::stdout().as_fd().try_clone_to_owned()?);
        let err = File::from(io::stderr().as_fd().try_clone_to_owned()?);
        let (tx, rx) = mpsc::channel::<Vec<RankStream>>();
        let (done_tx, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("ranks-output".into())
            .spawn(move || {
                if let Ok(streams) = rx.recv() {
                    copy_lines(streams, &out, &err);
                }
                drop(done_tx);
            })?;
        Ok(Pump {
            streams: Some(tx),
            done,
        })
    }

    /// Copy these streams until each has ended.
    pub fn copy(&mut self, streams: Vec<RankStream>) {
        if let Some(tx) = self.streams.take() {
            let _ = tx.send(streams);
        }
    }

    /// Wait for every stream to end (each rank and whatever it started that still holds its
    /// pipes), at most `wait`: a process a rank left behind cannot hold the job open for ever.
    pub fn finish(mut self, wait: Duration) {
        self.streams.take();
        let _ = self.done.recv_timeout(wait);
    }
}

struct Source {
    file: File,
    joiner: LineJoiner,
    stderr: bool,
    open: bool,
}

/// The pump's loop: poll every open pipe, read what is there, write the lines it completes.
fn copy_lines(streams: Vec<RankStream>, out: &File, err: &File) {
    let mut sources: Vec<Source> = streams
        .into_iter()
        .map(|s| Source {
            file: File::from(s.pipe),
            joiner: LineJoiner::new(s.rank),
            stderr: s.stderr,
            open: true,
        })
        .collect();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let now = Instant::now();
        for s in sources.iter_mut() {
            let to = if s.stderr { err } else { out };
            s.joiner.flush(now, false, &mut |line| write_line(to, line));
        }
        let open: Vec<usize> = (0..sources.len()).filter(|&i| sources[i].open).collect();
        if open.is_empty() {
            return;
        }
        let timeout = open
            .iter()
            .filter_map(|&i| sources[i].joiner.due())
            .min()
            .map(|t| t.saturating_duration_since(now))
            .and_then(|d| Timespec::try_from(d).ok());
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd<'_>> = open
                .iter()
                .map(|&i| PollFd::new(&sources[i].file, PollFlags::IN))
                .collect();
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(_) => fds.iter().map(|f| !f.revents().is_empty()).collect(),
                Err(Errno::INTR) => continue,
                // Cannot happen with valid descriptors; do not spin.
                Err(_) => return,
            }
        };
        for (&i, _) in open.iter().zip(ready).filter(|(_, r)| *r) {
            let s = &mut sources[i];
            let to = if s.stderr { err } else { out };
            match (&s.file).read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(0) | Err(_) => {
                    // The rank (and all it started) closed it: the end of its output.
                    s.joiner.flush(now, true, &mut |line| write_line(to, line));
                    s.open = false;
                }
                Ok(n) => s
                    .joiner
                    .push(&buf[..n], Instant::now(), &mut |line| write_line(to, line)),
            }
        }
    }
}

/// One line in one `write()` (a regular file takes it whole). An error (a full disk, a closed
/// pipe) loses the line but not the ranks: they go on being read, so that none blocks.
fn write_line(mut to: &File, line: &[u8]) {
    let _ = to.write_all(line);
}
