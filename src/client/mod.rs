//! A client of the daemon: connect, say hello, send requests and get their answers, and receive
//! pushed updates (telemetry snapshots, node events) on a channel.
//!
//! Blocking, so that CLI commands stay plain code, and thread-safe, so that the TUI can hold one
//! in an `Arc` and bridge [`Client::updates`] into its event loop as it does with the sampler.
//! One reader thread per connection routes answers to their requests (by id) and everything
//! else to the updates channel.
//!
//! A client checks the daemon too: the socket's owner (SO_PEERCRED) must be this user or root.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError, bounded};

use crate::config::Paths;
use crate::ipc::{Peer, log_path, peer_allowed, socket_path};
use crate::protocol::delta::SnapshotStream;
use crate::protocol::{
    self, ClientFrame, ErrorCode, MAX_REPLY_FRAME, NodeEventRecord, Request, Response, ServerFrame,
};
use crate::telemetry::Snapshot;

/// How long a request waits for its answer unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

/// Pushed updates held for a reader of [`Client::updates`]. When it is full, new snapshots are
/// dropped (the next one supersedes them); other updates wait for room.
const UPDATES_QUEUE: usize = 256;

/// Why talking to the daemon failed. Messages say what to do.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no gpupilot daemon answers at {}: start one with `gpupilot daemon --detach`", socket.display())]
    NoDaemon {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Refused(String),
    /// The daemon answered with an error.
    #[error("{message}")]
    Daemon { code: ErrorCode, message: String },
    /// The connection ended; `log` is the daemon's log where the client knows it.
    #[error("the daemon closed the connection (it may have stopped; its log is {})", match log {
        Some(p) => p.display().to_string(),
        None => "daemon.log in its state directory".into(),
    })]
    Closed { log: Option<PathBuf> },
    #[error("the daemon did not answer {what} within {} s", timeout.as_secs_f64())]
    Timeout {
        what: &'static str,
        timeout: Duration,
    },
    #[error("talking to the daemon: {0}")]
    Io(#[from] std::io::Error),
    #[error("the daemon answered {what} with something unexpected: {got}")]
    Unexpected { what: &'static str, got: String },
    #[error("starting a daemon: {0}")]
    Spawn(String),
    /// Another node could not be reached through its bridge (`ssh NODE gpupilot bridge`).
    #[error("{0}")]
    Remote(String),
}

impl ClientError {
    /// This error, naming `log` as the daemon's log where it is a lost connection.
    fn with_log(self, log: &Path) -> ClientError {
        match self {
            ClientError::Closed { log: None } => ClientError::Closed {
                log: Some(log.to_path_buf()),
            },
            other => other,
        }
    }

    /// The daemon's error code, when the daemon refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Daemon { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// What the daemon said in its welcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    pub version: u32,
    pub daemon_pid: u32,
    pub node: String,
    pub readonly: bool,
}

/// Something the daemon pushed (not an answer).
#[derive(Debug, Clone, PartialEq)]
pub enum Push {
    Telemetry(Box<Snapshot>),
    Event(NodeEventRecord),
    /// Events were dropped because this client read too slowly.
    Lagged(u64),
    /// The daemon is stopping.
    Shutdown(String),
    /// An error not tied to a request (the daemon closes the connection after it).
    Error {
        code: ErrorCode,
        message: String,
    },
    /// The connection is gone; nothing more will come.
    Closed,
    /// To a trainer: use `value` for `knob`, then acknowledge `seq` (or, with `apply_step`,
    /// vote on it and wait for its [`Push::KnobDecision`]).
    Knob {
        run: String,
        seq: u64,
        knob: crate::protocol::KnobName,
        value: i64,
        apply_step: Option<u64>,
    },
    /// To a rank: change `seq` is committed (apply it at its step) or called off.
    KnobDecision {
        seq: u64,
        commit: bool,
        reason: Option<String>,
    },
}

/// One piece of a run's log (see `Request::Logs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogChunk {
    /// The run's full id.
    pub run: String,
    pub data: String,
    pub next_offset: u64,
    pub size: u64,
    /// The run has ended: once `next_offset == size` there is nothing more.
    pub finished: bool,
}

pub mod advise;
pub mod bench;
mod calls;
mod push;
pub mod record;
mod remote;
pub mod system;
mod tuner;

pub use push::{PushStream, telemetry_stream};

pub use remote::{Origin, spawn_bridge};

pub use calls::{KnobPending, RunMetrics};

type Pending = Arc<Mutex<HashMap<u64, Sender<Response>>>>;

/// Takes pushed snapshots on the reader thread, before they would go on the updates channel,
/// and gives back those it leaves to the channel (see [`Client::tap_snapshots`]).
pub type SnapshotTap = Box<dyn FnMut(Box<Snapshot>) -> Option<Box<Snapshot>> + Send>;

type Tap = Arc<Mutex<Option<SnapshotTap>>>;

/// A connection to the daemon. See the module doc.
pub struct Client {
    writer: Mutex<UnixStream>,
    pending: Pending,
    next_id: AtomicU64,
    updates: Receiver<Push>,
    tap: Tap,
    welcome: Welcome,
    socket: PathBuf,
    timeout: Duration,
    /// How to connect again.
    origin: Origin,
    /// The bridging program of a remote connection (killed when the client goes).
    link: Option<remote::BridgeProcess>,
    /// The daemon's log, where known (named when the connection is lost).
    log: Option<PathBuf>,
}

impl Client {
    /// Connect to the daemon for `paths` as `gpupilot-cli`.
    pub fn connect(paths: &Paths) -> Result<Client, ClientError> {
        let log = log_path(paths);
        let mut client = Client::connect_to(
            &socket_path(paths),
            &format!("gpupilot-cli {}", env!("CARGO_PKG_VERSION")),
        )
        .map_err(|e| e.with_log(&log))?;
        client.log = Some(log);
        Ok(client)
    }

    /// Connect to the daemon at `socket`, saying hello as `client_name`.
    pub fn connect_to(socket: &Path, client_name: &str) -> Result<Client, ClientError> {
        let stream = connect_checked(socket)?;
        Client::handshake(stream, socket.to_path_buf(), client_name)
    }

    /// Say hello over a connected stream and start reading from it.
    fn handshake(
        stream: UnixStream,
        socket: PathBuf,
        client_name: &str,
    ) -> Result<Client, ClientError> {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut writer = stream;
        let hello = ClientFrame {
            id: 0,
            request: Request::Hello {
                version: protocol::VERSION,
                client: client_name.into(),
            },
        };
        writer.set_read_timeout(Some(DEFAULT_TIMEOUT))?;
        // A daemon that refuses this peer says why and closes at once, possibly before the
        // hello is written: the write then fails (EPIPE), but the refusal is still waiting to
        // be read, and it is the message the user needs.
        let wrote = match writer.write_all(protocol::encode(&hello).as_bytes()) {
            Err(e)
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                return Err(e.into());
            }
            wrote => wrote,
        };
        let frame = match read_frame(&mut reader, &mut SnapshotStream::default()) {
            Ok(Some(f)) => f,
            Ok(None) => {
                return Err(match wrote {
                    Err(e) => e.into(),
                    Ok(()) => ClientError::Closed { log: None },
                });
            }
            Err(e) if is_timeout(&e) => {
                return Err(ClientError::Timeout {
                    what: "hello",
                    timeout: DEFAULT_TIMEOUT,
                });
            }
            Err(e) => return Err(e.into()),
        };
        writer.set_read_timeout(None)?;
        let welcome = match frame.response {
            Response::Welcome {
                version,
                daemon_pid,
                node,
                readonly,
            } => Welcome {
                version,
                daemon_pid,
                node,
                readonly,
            },
            Response::Error { code, message } => {
                return Err(match code {
                    ErrorCode::PermissionDenied => ClientError::Refused(message),
                    code => ClientError::Daemon { code, message },
                });
            }
            other => {
                return Err(ClientError::Unexpected {
                    what: "hello",
                    got: format!("{other:?}"),
                });
            }
        };
        let pending: Pending = Arc::default();
        let tap: Tap = Arc::default();
        let (tx, updates) = bounded(UPDATES_QUEUE);
        {
            let (pending, tap) = (Arc::clone(&pending), Arc::clone(&tap));
            std::thread::Builder::new()
                .name("gpupilot-client".into())
                .spawn(move || read_loop(reader, pending, tap, tx))?;
        }
        Ok(Client {
            writer: Mutex::new(writer),
            pending,
            next_id: AtomicU64::new(1),
            updates,
            tap,
            welcome,
            origin: Origin::Socket(socket.clone()),
            socket,
            timeout: DEFAULT_TIMEOUT,
            link: None,
            log: None,
        })
    }

    /// Connect, or start `gpupilot daemon --detach DAEMON_ARGS` (this binary, `exe`) when none
    /// answers and connect to it. Returns the client and, when one was started, its pid.
    pub fn connect_or_spawn(
        paths: &Paths,
        exe: &Path,
        daemon_args: &[OsString],
    ) -> Result<(Client, Option<u32>), ClientError> {
        match Client::connect(paths) {
            Err(ClientError::NoDaemon { .. }) => {}
            other => return other.map(|c| (c, None)),
        }
        let pid = spawn_daemon(exe, daemon_args)?;
        Client::connect(paths).map(|c| (c, Some(pid)))
    }

    /// How this client connected (to connect again the same way).
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// Wait at most `timeout` for each answer from now on.
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Pushed updates, in the order they came; ends with [`Push::Closed`] (or, if that found no
    /// room, with the channel disconnecting). Drain it while
    /// subscribed: when 256 updates wait unread, new snapshots are dropped, and an event that
    /// finds no room holds up the answers behind it until there is.
    pub fn updates(&self) -> &Receiver<Push> {
        &self.updates
    }

    /// Hand pushed snapshots to `tap` on the reader thread as they arrive: those it keeps
    /// never reach [`Client::updates`]; those it gives back go there as before. A consumer that
    /// can take a snapshot from any thread saves a thread's wake-up per snapshot this way.
    /// Replaces any earlier tap.
    pub fn tap_snapshots(&self, tap: SnapshotTap) {
        *lock(&self.tap) = Some(tap);
    }

    /// Send `request`, wait for its answer. An error answer is returned as
    /// [`ClientError::Daemon`].
    pub fn request(&self, request: Request) -> Result<Response, ClientError> {
        let mut answers = self.request_all(vec![request])?;
        answers.pop().expect("one answer for one request")
    }

    /// Send every request at once, then wait for their answers, in order: a round trip for
    /// them all, not one each (over `ssh`, where a round trip may take a tenth of a second,
    /// that is the difference between a moment and many seconds). Each answer is waited for
    /// up to the client's timeout; the error is the sending's when nothing could be sent.
    pub fn request_all(
        &self,
        requests: Vec<Request>,
    ) -> Result<Vec<Result<Response, ClientError>>, ClientError> {
        let mut waiting = Vec::with_capacity(requests.len());
        let mut lines = String::new();
        {
            let mut pending = lock(&self.pending);
            for request in requests {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let (tx, rx) = bounded(1);
                pending.insert(id, tx);
                waiting.push((id, request.kind(), rx));
                lines.push_str(&protocol::encode(&ClientFrame { id, request }));
            }
        }
        let sent = lock(&self.writer).write_all(lines.as_bytes());
        if let Err(e) = sent {
            let mut pending = lock(&self.pending);
            for (id, ..) in &waiting {
                pending.remove(id);
            }
            return Err(if e.kind() == std::io::ErrorKind::BrokenPipe {
                self.closed()
            } else {
                e.into()
            });
        }
        // Each answer waits up to the timeout after the one before it; once one has not come
        // in time, the rest are not waited for (a daemon that hangs costs one timeout).
        let mut stalled = false;
        Ok(waiting
            .into_iter()
            .map(|(id, what, rx)| {
                let answer = if stalled {
                    rx.try_recv().map_err(|_| RecvTimeoutError::Timeout)
                } else {
                    rx.recv_timeout(self.timeout)
                };
                match answer {
                    Ok(Response::Error { code, message }) => {
                        Err(ClientError::Daemon { code, message })
                    }
                    Ok(r) => Ok(r),
                    Err(RecvTimeoutError::Timeout) => {
                        stalled = true;
                        lock(&self.pending).remove(&id);
                        Err(ClientError::Timeout {
                            what,
                            timeout: self.timeout,
                        })
                    }
                    Err(RecvTimeoutError::Disconnected) => Err(self.closed()),
                }
            })
            .collect())
    }

    /// The lost connection, naming the daemon's log where this client knows it.
    fn closed(&self) -> ClientError {
        ClientError::Closed {
            log: self.log.clone(),
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Ends the reader thread (its read returns) and tells the daemon we are gone.
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
    }
}

/// Connect to the daemon's socket and check who serves it: this user or root.
fn connect_checked(socket: &Path) -> Result<UnixStream, ClientError> {
    let stream = UnixStream::connect(socket).map_err(|source| ClientError::NoDaemon {
        socket: socket.to_path_buf(),
        source,
    })?;
    let me = rustix::process::getuid().as_raw();
    let daemon = Peer::of(&stream)?;
    if !peer_allowed(me, daemon.uid) {
        return Err(ClientError::Refused(format!(
            "the socket {} is served by uid {}, not by you (uid {me}) or root: refusing to use it",
            socket.display(),
            daemon.uid
        )));
    }
    Ok(stream)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// One frame, or None at the end of the stream, with snapshot deltas applied through
/// `snapshots` (the connection's). Lines over [`MAX_REPLY_FRAME`] are errors.
fn read_frame(
    reader: &mut impl BufRead,
    snapshots: &mut SnapshotStream,
) -> std::io::Result<Option<ServerFrame>> {
    let mut buf = Vec::new();
    let n = reader
        .take(MAX_REPLY_FRAME as u64 + 1)
        .read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    let text = std::str::from_utf8(&buf).map_err(std::io::Error::other)?;
    snapshots
        .decode(text, MAX_REPLY_FRAME)
        .map(Some)
        .map_err(std::io::Error::other)
}

fn read_loop(mut reader: BufReader<UnixStream>, pending: Pending, tap: Tap, updates: Sender<Push>) {
    let mut snapshots = SnapshotStream::default();
    loop {
        let frame = match read_frame(&mut reader, &mut snapshots) {
            Ok(Some(f)) => f,
            Ok(None) => break,
            // A delta that cannot be applied is skipped (the next whole snapshot mends it);
            // anything else unreadable ends the connection.
            Err(e) if is_delta_error(&e) => {
                tracing::debug!("reading from the daemon: {e}");
                continue;
            }
            Err(e) => {
                tracing::debug!("reading from the daemon: {e}");
                break;
            }
        };
        let update = match (frame.id, frame.response) {
            (Some(id), response) => {
                if let Some(tx) = lock(&pending).remove(&id) {
                    let _ = tx.send(response);
                }
                continue;
            }
            (None, Response::Telemetry { snapshot }) => {
                let left = match lock(&tap).as_mut() {
                    Some(tap) => tap(snapshot),
                    None => Some(snapshot),
                };
                match left {
                    Some(s) => Push::Telemetry(s),
                    None => continue,
                }
            }
            (None, Response::Event { event }) => Push::Event(event),
            (None, Response::Lagged { missed }) => Push::Lagged(missed),
            (
                None,
                Response::Knob {
                    run,
                    seq,
                    knob,
                    value,
                    apply_step,
                },
            ) => Push::Knob {
                run,
                seq,
                knob,
                value,
                apply_step,
            },
            (
                None,
                Response::KnobDecision {
                    seq,
                    commit,
                    reason,
                    ..
                },
            ) => Push::KnobDecision {
                seq,
                commit,
                reason,
            },
            (None, Response::Shutdown { reason }) => Push::Shutdown(reason),
            (None, Response::Error { code, message }) => Push::Error { code, message },
            (None, other) => {
                tracing::debug!("ignoring an unexpected push: {other:?}");
                continue;
            }
        };
        match update {
            // A reader that is behind misses snapshots, never events or answers.
            Push::Telemetry(_) => {
                if let Err(TrySendError::Disconnected(_)) = updates.try_send(update) {
                    break;
                }
            }
            update => {
                if updates.send(update).is_err() {
                    break;
                }
            }
        }
    }
    // Requests still waiting get `Closed` (their senders drop here).
    lock(&pending).clear();
    let _ = updates.try_send(Push::Closed);
}

/// Whether `e` (from [`read_frame`]) is a snapshot delta that could not be applied.
fn is_delta_error(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|e| e.downcast_ref::<protocol::FrameError>())
        .is_some_and(|e| matches!(e, protocol::FrameError::Delta(_)))
}

/// Run `exe daemon --detach ARGS` and wait for it (it returns once the daemon answers).
fn spawn_daemon(exe: &Path, daemon_args: &[OsString]) -> Result<u32, ClientError> {
    let out = std::process::Command::new(exe)
        .arg("daemon")
        .arg("--detach")
        .args(daemon_args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| ClientError::Spawn(format!("running {}: {e}", exe.display())))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(ClientError::Spawn(
            stderr.trim().trim_start_matches("gpupilot: ").to_string(),
        ));
    }
    stdout
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .ok_or_else(|| ClientError::Spawn(format!("the daemon printed no pid: {stdout}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_names_the_daemon_log_it_knows() {
        let known =
            ClientError::Closed { log: None }.with_log(Path::new("/home/a/state/daemon.log"));
        let text = known.to_string();
        assert!(text.contains("/home/a/state/daemon.log"), "{text}");
        let unknown = ClientError::Closed { log: None }.to_string();
        assert!(!unknown.contains('$'), "{unknown}");
        assert!(unknown.contains("daemon.log"), "{unknown}");
        // Other errors are left as they are.
        let other = ClientError::Refused("no".into()).with_log(Path::new("/x"));
        assert_eq!(other.to_string(), "no");
    }
}
