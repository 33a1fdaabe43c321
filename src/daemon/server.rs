//! The socket side: accept connections, check who is calling, and run one task per connection
//! that reads frames, answers them, and pushes subscribed updates.
//!
//! Who may connect, and (on the system daemon) who may make each request, is `auth::decide`'s
//! call; every refusal is logged and recorded as a `peer_refused` node event, a flood of them
//! as one record and a count (`events::Refusals`).
//!
//! What one client may take is bounded (`limits`, where every number is): connections per
//! user and in all, a deadline for the hello and one for a frame begun, requests per second
//! for users other than root and the daemon's own, the bytes of unfinished frames
//! (`frames`) and of unread answers. None of it is allocated ahead: a connection's buffers
//! grow with what it sends and shrink back.
//!
//! Each connection has one writer task fed by a channel, so answers and pushes interleave
//! without tearing a frame; the newest telemetry snapshot waits beside it, alone, so that a
//! slow subscriber skips snapshots instead of receiving old ones. A frame that is too long, not
//! UTF-8 or not a request ends that connection only (after a `bad_frame` error that says why,
//! also written to the log); a request of a known type with a field that does not fit is
//! answered `bad_request` and the connection stays.
//!
//! How a snapshot is encoded (once for every connection), what each connection was last
//! written, and whether a new snapshot is written, replaces the one waiting or is skipped are
//! `push`'s, for these connections and for the dedicated subscribers that `direct` writes from
//! the sampler's thread alike.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Notify, Semaphore, broadcast, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::auth::{Access, Identity, Mode, Verdict, decide, group_entry};
use super::base::RequestError;
use super::events::Refusals;
use super::relay;
use super::requests::{self, Hello, Sender, classify, trainer::Channel};
use super::state::Daemon;
use crate::ipc::Peer;
use crate::protocol::{
    self, ClientFrame, ErrorCode, FrameError, MAX_REQUEST_FRAME, Request, Response, ServerFrame,
};
use crate::telemetry::Snapshot;

mod direct;
mod frames;
pub mod limits;
mod push;

use direct::{Direct, Held};
use frames::{Frames, Read};
use limits::{Bounds, Full, Limits, SUBSCRIBER_SEND_BUFFER};
use push::{Backlog, Sent, Step, TelemetryFrames};

/// Frames queued for one client before its answers wait. Answers are also bounded in bytes
/// ([`limits::QUEUED_ANSWER_BYTES`]); snapshots are not queued at all (the newest waits alone).
const QUEUE: usize = 64;

/// What every connection shares: the bounds, the refusals being counted, the encoded snapshot,
/// the dedicated subscribers.
struct Shared {
    bounds: Arc<Bounds>,
    refusals: Refusals,
    telemetry: Arc<TelemetryFrames>,
    direct: Arc<Direct>,
}

/// Accept connections until `shutdown`; then tell every client and wait (briefly) for them.
pub async fn accept_loop(
    daemon: Arc<Daemon>,
    listener: UnixListener,
    shutdown: CancellationToken,
    mode: Arc<Mode>,
) {
    let limits = Limits::from_env();
    let every = limits.audit_window.min(Duration::from_secs(1));
    let frames = Arc::new(TelemetryFrames::default());
    let direct = Arc::new(Direct::new(Arc::clone(&frames)));
    let sink: Arc<dyn super::telemetry::Sink> = direct.clone();
    daemon.telemetry_sink(Arc::downgrade(&sink));
    let shared = Arc::new(Shared {
        refusals: Refusals::new(limits.audit_window, limits::AUDIT_EACH),
        bounds: Arc::new(Bounds::new(limits)),
        telemetry: frames,
        direct,
    });
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conns = JoinSet::new();
    loop {
        // The housekeeping tick runs only while it has work: refusals counted in a window, or
        // a user gone whose allowance is to be forgotten. A daemon with only live connections
        // sleeps until something happens.
        let housekeeping = shared.refusals.pending() || shared.bounds.prunable();
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick(), if housekeeping => {
                shared.refusals.flush(daemon.events(), false);
                shared.bounds.prune(Instant::now());
            }
            // A refusal in a connection: look again (a connection that ends wakes the loop
            // through `join_next`).
            _ = shared.refusals.started(), if !housekeeping => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(connection(
                        Arc::clone(&daemon),
                        stream,
                        shutdown.clone(),
                        Arc::clone(&mode),
                        Arc::clone(&shared),
                    ));
                }
                Err(e) => {
                    // EMFILE and friends: back off rather than spin.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    shared.direct.close(&push(Response::Shutdown {
        reason: "the daemon is stopping".into(),
    }));
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    shared.refusals.flush(daemon.events(), true);
}

/// A frame with no id (a push, or an error not tied to a request).
fn push(response: Response) -> String {
    protocol::encode(&ServerFrame { id: None, response })
}

fn reply(id: u64, response: Response) -> String {
    protocol::encode(&ServerFrame {
        id: Some(id),
        response,
    })
}

fn error(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> String {
    protocol::encode(&ServerFrame {
        id,
        response: Response::Error {
            code,
            message: message.into(),
        },
    })
}

/// `5`, `0.4`: seconds for messages.
fn secs(d: Duration) -> String {
    format!("{}", d.as_secs_f64())
}

/// A refusal of `peer` for `reason`, coalesced (`Refusals`): recorded as a `peer_refused` event
/// where `record`, and `line` written to the log, for the first few of a kind in a window;
/// only counted after them.
fn audit(
    shared: &Shared,
    daemon: &Daemon,
    peer: &Peer,
    reason: &str,
    record: bool,
    line: impl FnOnce() -> String,
) {
    let (uid, pid) = (peer.uid, peer.pid);
    if shared
        .refusals
        .note(daemon.events(), uid, pid, reason, record)
    {
        tracing::warn!(uid, pid = ?pid, "{}", line());
    }
}

/// Say why to a connection that is not served, and close it.
async fn refuse(mut stream: UnixStream, line: String) {
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(line.as_bytes())).await;
}

async fn connection(
    daemon: Arc<Daemon>,
    stream: UnixStream,
    shutdown: CancellationToken,
    mode: Arc<Mode>,
    shared: Arc<Shared>,
) {
    let peer = match Peer::of(&stream) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("a connection whose peer is unknown ({e}): closed");
            return;
        }
    };
    // Counted before anything else is looked up about the peer, so that a flood of
    // connections costs no more than this.
    let trusted = peer.uid == 0 || peer.uid == daemon.uid();
    let admitted = match shared.bounds.admit(peer.uid, trusted) {
        Ok(a) => a,
        Err(Full { reason, message }) => {
            audit(&shared, &daemon, &peer, &reason, true, || {
                format!("refused a connection from {}: {message}", peer.describe())
            });
            refuse(stream, error(None, ErrorCode::TooManyConnections, message)).await;
            return;
        }
    };
    // The system daemon decides per request, and group membership needs the peer's groups.
    let who = Identity::of(&peer, matches!(*mode, Mode::System { .. }));
    if let Verdict::Deny { reason, message } = decide(&mode, &who, Access::Connect, "connect", None)
    {
        audit(&shared, &daemon, &peer, &reason, true, || {
            format!("refused a connection: {message}")
        });
        refuse(stream, error(None, ErrorCode::PermissionDenied, message)).await;
        return;
    }
    daemon.client(true);
    let limits = shared.bounds.limits.clone();
    let (rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::channel::<String>(QUEUE);
    let out = Arc::new(Outbox::new(limits.queued_answer_bytes));
    let writer = tokio::spawn(write_loop(wr, rx, Arc::clone(&out)));
    let mut conn = Conn {
        daemon: Arc::clone(&daemon),
        peer,
        who,
        mode,
        tx,
        out,
        id: daemon.conn_id(),
        trainer: Channel::default(),
        greeted: false,
        dedicated: None,
        telemetry: None,
        events: None,
        shared: Arc::clone(&shared),
    };
    let budget = shared.bounds.unfinished(trusted);
    let mut frames = Frames::new(rd, MAX_REQUEST_FRAME, limits.frame, Some(budget));
    let hello_by = tokio::time::Instant::now() + limits.handshake;
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => {
                conn.send(push(Response::Shutdown { reason: "the daemon is stopping".into() })).await;
                break;
            }
            () = tokio::time::sleep_until(hello_by), if !conn.greeted => {
                let why = format!("no hello within {} s of connecting", secs(limits.handshake));
                conn.closing("no hello in time", &why);
                conn.send(error(
                    None,
                    ErrorCode::HandshakeRequired,
                    format!("{why}; closing the connection"),
                ))
                .await;
                break;
            }
            next = frames.next() => next,
        };
        let line = match next {
            Read::Frame(line) => line,
            Read::End => break,
            Read::TooLong => {
                let why = format!("frame longer than {MAX_REQUEST_FRAME} bytes");
                conn.bad_frame("a frame too long", None, &why).await;
                break;
            }
            Read::Stalled => {
                let why = format!(
                    "an unfinished frame (no newline) waited more than {} s for its end",
                    secs(limits.frame)
                );
                conn.bad_frame("an unfinished frame", None, &why).await;
                break;
            }
            Read::NotUtf8 => {
                conn.bad_frame("a frame not UTF-8", None, "frame is not UTF-8")
                    .await;
                break;
            }
            Read::Failed(e) => {
                tracing::debug!("{}: read failed: {e}", conn.peer.describe());
                break;
            }
        };
        if !trusted && !shared.bounds.allow(conn.peer.uid, Instant::now()) {
            conn.rate_limited(id_of(&line)).await;
            continue;
        }
        let frame = match protocol::decode::<ClientFrame>(&line, MAX_REQUEST_FRAME) {
            Ok(f) => f,
            Err(e) => match misfit(&line, &e) {
                // JSON, a request we know, a field of the wrong type: the request is refused,
                // the connection stays (unless it has not said hello).
                Some((id, kind)) if conn.greeted || kind == "hello" => {
                    let why = match &e {
                        FrameError::Json(j) => j.to_string(),
                        other => other.to_string(),
                    };
                    conn.send(error(
                        Some(id),
                        ErrorCode::BadRequest,
                        format!("bad `{kind}` request: {why}"),
                    ))
                    .await;
                    continue;
                }
                Some((id, _)) => {
                    conn.no_hello(id).await;
                    break;
                }
                None => {
                    conn.bad_frame("a frame not a request", id_of(&line), &e.to_string())
                        .await;
                    break;
                }
            },
        };
        // A trainer of another node's run (`via_node`): this connection becomes a relay to that
        // node's daemon until either side closes (see `relay`).
        if conn.greeted && !conn.trainer.attached() {
            if let Some(ask) = relay::Ask::of(&frame, &line, daemon.node()) {
                match relay::open(&daemon, &conn.mode, ask, &shutdown).await {
                    Ok(relay) => {
                        let from_trainer = frames.into_framed(MAX_REQUEST_FRAME);
                        relay.serve(from_trainer, conn.tx.clone(), &shutdown).await;
                        break;
                    }
                    Err(answer) => {
                        conn.send(answer).await;
                        continue;
                    }
                }
            }
        }
        if let Request::Subscribe {
            telemetry: true, ..
        } = frame.request
        {
            // Little waits in the kernel for a subscriber that does not read: the newest
            // snapshot waits in the daemon instead (see the constant).
            frames.send_buffer(SUBSCRIBER_SEND_BUFFER);
        }
        if !conn.handle(frame).await {
            break;
        }
        if let Some(delta) = conn.dedicated {
            // Nothing more is read: the subscription's answer is written, then the socket
            // leaves the runtime for the sampler's thread (see `direct`).
            let who = conn.peer.describe();
            conn.close();
            drop(conn);
            let wr = match tokio::time::timeout(Duration::from_secs(2), writer).await {
                Ok(Ok(Some(wr))) => wr,
                _ => {
                    daemon.client(false);
                    return;
                }
            };
            let std = frames
                .into_inner()
                .reunite(wr)
                .map_err(|e| e.to_string())
                .and_then(|s| s.into_std().map_err(|e| e.to_string()));
            match std {
                Ok(stream) => {
                    let held = Held::new(admitted, Arc::clone(&daemon));
                    shared.direct.add(stream, delta, held, who);
                }
                Err(e) => {
                    tracing::debug!("{who}: handing a dedicated subscriber over: {e}");
                    daemon.client(false);
                }
            }
            return;
        }
    }
    conn.close();
    // Flush what is queued (an error saying why we close, say), then close.
    drop(conn);
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    daemon.client(false);
    drop(admitted);
}

/// A frame that is JSON and names a request this daemon knows, but does not fit it (a field of
/// the wrong type, a required one missing): its id and the request's type. None for anything
/// else (not JSON, no id, an unknown type), which closes the connection.
fn misfit(line: &str, e: &FrameError) -> Option<(u64, String)> {
    let FrameError::Json(e) = e else {
        return None;
    };
    if e.classify() != serde_json::error::Category::Data {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let id = value.get("id")?.as_u64()?;
    let kind = value.get("type")?.as_str()?;
    known_request(kind).then(|| (id, kind.to_string()))
}

/// Whether `kind` is the `type` of a request: serde says "unknown variant" for any other.
fn known_request(kind: &str) -> bool {
    match serde_json::from_value::<Request>(serde_json::json!({ "type": kind })) {
        Ok(_) => true,
        Err(e) => !e.to_string().starts_with("unknown variant"),
    }
}

/// The write side of one connection: answers and pushes in the order they were queued, and the
/// newest telemetry snapshot, which waits alone (a new one replaces it) so that a client that
/// reads slowly skips to the newest instead of working through a backlog.
struct Outbox {
    /// Bytes of answers that may wait (answers are the frames with an id).
    room: Semaphore,
    cap: usize,
    snapshot: Mutex<SnapshotSlot>,
    ready: Notify,
}

/// The connection's telemetry: the push waiting to be written, and what it last got.
#[derive(Default)]
struct SnapshotSlot {
    waiting: Option<Waiting>,
    sent: Sent,
}

struct Waiting {
    snap: Arc<Snapshot>,
    line: Arc<str>,
    delta: bool,
}

impl Outbox {
    fn new(cap: usize) -> Outbox {
        let cap = cap.clamp(1, u32::MAX as usize);
        Outbox {
            room: Semaphore::new(cap),
            cap,
            snapshot: Mutex::new(SnapshotSlot::default()),
            ready: Notify::new(),
        }
    }

    /// What `line` takes of the room: an answer its length (at most all of it, so that one
    /// answer larger than the room still goes, alone); a push nothing.
    fn cost(&self, line: &str) -> Option<u32> {
        line.starts_with("{\"id\":")
            .then(|| u32::try_from(line.len().min(self.cap)).unwrap_or(u32::MAX))
    }

    /// Wait for room for `line`; false when the connection's writer has gone.
    async fn reserve(&self, line: &str) -> bool {
        match self.cost(line) {
            Some(n) => match self.room.acquire_many(n).await {
                Ok(p) => {
                    p.forget();
                    true
                }
                Err(_) => false,
            },
            None => true,
        }
    }

    /// `line` was written: its room is free again. (Frames with an id queued by others, which
    /// took no room, give back none past the cap.)
    fn written(&self, line: &str) {
        if let Some(n) = self.cost(line) {
            let free = self.cap.saturating_sub(self.room.available_permits());
            self.room.add_permits((n as usize).min(free));
        }
    }

    fn slot(&self) -> MutexGuard<'_, SnapshotSlot> {
        self.snapshot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `snap` in place of the one waiting, by the push rule ([`Sent::step`]: a push
    /// that waits is replaced, never skipped): with `delta`, as its changes to the last
    /// snapshot written (whole every [`crate::protocol::delta::KEYFRAME_EVERY`] pushes), else
    /// whole. `frames` encodes it against a base (or none).
    fn put_snapshot(
        &self,
        snap: &Arc<Snapshot>,
        delta: bool,
        frames: impl Fn(&Arc<Snapshot>, Option<&Arc<Snapshot>>) -> (Arc<str>, bool),
    ) {
        loop {
            let step = {
                let slot = self.slot();
                let backlog = match slot.waiting {
                    Some(_) => Backlog::Waiting,
                    None => Backlog::Clear,
                };
                slot.sent.step(delta, backlog)
            };
            let base = match step {
                Step::Write(base) | Step::Replace(base) => base,
                Step::Skip => return,
            };
            // Encoded without the lock: the writer may take the waiting one meanwhile.
            let (line, is_delta) = frames(snap, base.as_ref());
            let mut slot = self.slot();
            if !slot.sent.fits(base.as_ref(), is_delta) {
                // A delta against a snapshot that is no longer the last written.
                continue;
            }
            slot.waiting = Some(Waiting {
                snap: Arc::clone(snap),
                line,
                delta: is_delta,
            });
            break;
        }
        self.ready.notify_one();
    }

    /// The push to write now, if one waits; it becomes the base of the next delta.
    fn take_snapshot(&self) -> Option<Arc<str>> {
        let mut slot = self.slot();
        let w = slot.waiting.take()?;
        slot.sent.wrote(w.snap, w.delta);
        Some(w.line)
    }

    /// Telemetry stopped: nothing waits, and the next push goes whole.
    fn forget_snapshots(&self) {
        *self.slot() = SnapshotSlot::default();
    }
}

/// Write what the connection queues until every sender is gone (then the write half comes
/// back, for the connection to close or hand over) or the client is.
async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<String>,
    out: Arc<Outbox>,
) -> Option<OwnedWriteHalf> {
    let mut ended = false;
    loop {
        tokio::select! {
            biased;
            line = rx.recv() => {
                let Some(line) = line else {
                    ended = true;
                    break;
                };
                let wrote = wr.write_all(line.as_bytes()).await;
                out.written(&line);
                if wrote.is_err() {
                    break;
                }
            }
            () = out.ready.notified() => {
                if let Some(line) = out.take_snapshot() {
                    if wr.write_all(line.as_bytes()).await.is_err() {
                        break;
                    }
                }
            }
        }
    }
    // Whoever waits for room gives up.
    out.room.close();
    if ended {
        return Some(wr);
    }
    let _ = wr.shutdown().await;
    None
}

/// The id of a frame that is JSON but not a valid request, so its error can carry it.
fn id_of(line: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(line)
        .ok()?
        .get("id")?
        .as_u64()
}

struct Conn {
    daemon: Arc<Daemon>,
    peer: Peer,
    /// The peer's uid, groups and name, for the policy.
    who: Identity,
    mode: Arc<Mode>,
    tx: mpsc::Sender<String>,
    /// This connection's number (for the trainer channel).
    id: u64,
    /// Its trainer side: the run (and rank) it speaks for, after `trainer_attach`.
    trainer: Channel,
    greeted: bool,
    /// Subscribed as a dedicated telemetry subscriber (with `delta` or not): the connection
    /// goes to [`Direct`] once its answer is written.
    dedicated: Option<bool>,
    telemetry: Option<JoinHandle<()>>,
    events: Option<JoinHandle<()>>,
    /// Where the newest snapshot waits, and the room answers may take.
    out: Arc<Outbox>,
    shared: Arc<Shared>,
}

impl Conn {
    /// Queue `line`; an answer waits for room (the client reading) first.
    async fn send(&self, line: String) {
        if self.out.reserve(&line).await {
            let _ = self.tx.send(line).await;
        }
    }

    /// See [`audit`].
    fn audit(&self, reason: &str, record: bool, line: impl FnOnce() -> String) {
        audit(&self.shared, &self.daemon, &self.peer, reason, record, line);
    }

    /// Log that this connection closes for `why`: the first times for `kind` from this user in
    /// a window, then counted (see `Refusals`).
    fn closing(&self, kind: &str, why: &str) {
        self.audit(&format!("closed: {kind}"), false, || {
            format!(
                "closing the connection from {}: {why}",
                self.peer.describe()
            )
        });
    }

    async fn bad_frame(&self, kind: &str, id: Option<u64>, why: &str) {
        self.closing(kind, why);
        self.send(error(
            id,
            ErrorCode::BadFrame,
            format!("{why}; closing the connection"),
        ))
        .await;
    }

    /// The first request was not a hello: say so; the connection closes.
    async fn no_hello(&self, id: u64) {
        self.closing("no hello", "no hello");
        self.send(error(
            Some(id),
            ErrorCode::HandshakeRequired,
            "say hello first: {\"id\":1,\"type\":\"hello\",\"version\":1,\"client\":\"…\"}",
        ))
        .await;
    }

    /// A request over this user's rate: not done, answered `rate_limited`, counted.
    async fn rate_limited(&self, id: Option<u64>) {
        let limits = &self.shared.bounds.limits;
        let (rate, burst) = (limits.rate_per_s, limits.burst);
        let uid = self.peer.uid;
        let reason = format!("over the rate limit ({rate} requests a second)");
        self.audit(&reason, true, || {
            format!(
                "{} asks faster than {rate} requests a second ({burst} at once): refusing the rest",
                self.peer.describe()
            )
        });
        self.send(error(
            id,
            ErrorCode::RateLimited,
            format!(
                "too many requests: uid {uid} may make {rate} a second ({burst} at once), on all \
                 its connections together; this one was not done: wait a moment and send it again"
            ),
        ))
        .await;
    }

    /// Whether this peer may make `request`; a refusal is logged and recorded, and its message
    /// returned for the answer.
    fn refused(&self, request: &Request) -> Option<String> {
        let access = classify(request).access;
        let kind = request.kind();
        // /etc/group is read at each change, so that a user added to the group needs no
        // daemon restart.
        let group = match (&*self.mode, access) {
            (Mode::System { group }, Access::GpuSettings) if self.who.uid != 0 => {
                group_entry(group)
            }
            _ => None,
        };
        match decide(&self.mode, &self.who, access, kind, group.as_ref()) {
            Verdict::Allow => None,
            Verdict::Deny { reason, message } => {
                self.audit(&reason, true, || {
                    format!("refused {kind} from {}: {message}", self.peer.describe())
                });
                Some(message)
            }
        }
    }

    /// Answer one frame; false closes the connection. Each request goes to its family
    /// (`requests`): the connection's own here, a trainer's to its channel, a client's to
    /// [`Daemon::answer`] (in `requests`).
    async fn handle(&mut self, frame: ClientFrame) -> bool {
        let id = frame.id;
        if self.greeted {
            if let Some(message) = self.refused(&frame.request) {
                self.send(error(Some(id), ErrorCode::PermissionDenied, message))
                    .await;
                return true;
            }
        }
        let request = frame.request;
        match classify(&request).sender {
            Sender::Connection => self.connection_request(id, request).await,
            _ if !self.greeted => {
                self.no_hello(id).await;
                false
            }
            Sender::Trainer => {
                let (response, pushes) = self
                    .trainer
                    .answer(&self.daemon, self.id, &self.tx, request)
                    .await;
                self.send(reply(id, response)).await;
                for line in pushes {
                    self.send(line).await;
                }
                true
            }
            Sender::Client if requests::answered_inline(&request) => {
                let response = self.daemon.answer(&self.peer, request);
                self.send(reply(id, response)).await;
                true
            }
            Sender::Client => {
                let daemon = Arc::clone(&self.daemon);
                let peer = self.peer.clone();
                let kind = request.kind();
                let answer =
                    tokio::task::spawn_blocking(move || daemon.answer(&peer, request)).await;
                let response = answer.unwrap_or_else(|e| {
                    tracing::error!("answering {kind}: {e}");
                    Response::Error {
                        code: ErrorCode::Internal,
                        message: format!("the daemon failed answering {kind}; see its log"),
                    }
                });
                self.send(reply(id, response)).await;
                true
            }
        }
    }

    /// `hello` and `subscribe` (checked and worded in `requests::connection`); false closes
    /// the connection.
    async fn connection_request(&mut self, id: u64, request: Request) -> bool {
        match request {
            Request::Hello { version, client } => {
                match requests::hello(&self.daemon, self.greeted, version, &client) {
                    Hello::Welcome(welcome) => {
                        tracing::debug!("{} connected ({client})", self.peer.describe());
                        self.greeted = true;
                        self.send(reply(id, *welcome)).await;
                        true
                    }
                    Hello::Refused { error, close } => {
                        if close {
                            tracing::warn!("{}: {}", self.peer.describe(), error.message);
                        }
                        self.send(reply(id, error.into_response())).await;
                        !close
                    }
                }
            }
            _ if !self.greeted => {
                self.no_hello(id).await;
                false
            }
            Request::Subscribe {
                telemetry,
                events,
                delta,
                dedicated,
            } => {
                if let Err(e) = requests::subscribe_check(telemetry, events, dedicated) {
                    self.send(reply(id, e.into_response())).await;
                    return true;
                }
                // Handed over only where snapshots come, and nothing else is pushed here; else
                // served as any subscription (the connection is read on).
                if dedicated
                    && self.daemon.samples()
                    && self.telemetry.is_none()
                    && self.events.is_none()
                    && !self.trainer.attached()
                {
                    self.dedicated = Some(delta);
                } else {
                    self.subscribe(telemetry, events, delta);
                }
                self.send(reply(id, Response::Subscribed { telemetry, events }))
                    .await;
                true
            }
            other => {
                let e = RequestError::new(
                    ErrorCode::Internal,
                    format!("{} is not the connection's request", other.kind()),
                );
                self.send(reply(id, e.into_response())).await;
                true
            }
        }
    }

    fn subscribe(&mut self, telemetry: bool, events: bool, delta: bool) {
        match (telemetry, &self.telemetry) {
            (true, None) => {
                let mut rx = self.daemon.telemetry();
                let out = Arc::clone(&self.out);
                let shared = Arc::clone(&self.shared);
                self.telemetry = Some(tokio::spawn(async move {
                    // The newest snapshot at once, then each new one. Each replaces the one
                    // still waiting, if any: a client that does not keep up skips snapshots,
                    // it is never sent old ones, and it never stalls the daemon or its answers.
                    loop {
                        let snap = rx.borrow_and_update().clone();
                        if let Some(s) = snap {
                            out.put_snapshot(&s, delta, |s, base| shared.telemetry.line(s, base));
                        }
                        if rx.changed().await.is_err() {
                            break;
                        }
                    }
                }));
            }
            (false, Some(_)) => {
                if let Some(t) = self.telemetry.take() {
                    t.abort();
                }
                self.out.forget_snapshots();
            }
            _ => {}
        }
        match (events, &self.events) {
            (true, None) => {
                let mut rx = self.daemon.events().subscribe();
                let tx = self.tx.clone();
                self.events = Some(tokio::spawn(async move {
                    loop {
                        let line = match rx.recv().await {
                            Ok(event) => push(Response::Event { event }),
                            Err(broadcast::error::RecvError::Lagged(missed)) => {
                                push(Response::Lagged { missed })
                            }
                            Err(broadcast::error::RecvError::Closed) => break,
                        };
                        if tx.send(line).await.is_err() {
                            break;
                        }
                    }
                }));
            }
            (false, Some(_)) => {
                if let Some(t) = self.events.take() {
                    t.abort();
                }
            }
            _ => {}
        }
    }

    fn close(&mut self) {
        self.trainer.close(&self.daemon, self.id);
        for t in [self.telemetry.take(), self.events.take()]
            .into_iter()
            .flatten()
        {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::push::tests::snapshot;
    use super::*;
    use crate::protocol::delta;

    #[test]
    fn a_subscriber_gets_changes_to_what_it_was_last_written() {
        let frames = TelemetryFrames::default();
        let out = Outbox::new(1000);
        let put = |s: &Arc<Snapshot>| out.put_snapshot(s, true, |s, b| frames.line(s, b));
        let mut stream = delta::SnapshotStream::default();
        let mut read = |line: Arc<str>| match stream.decode(&line, usize::MAX).unwrap().response {
            Response::Telemetry { snapshot } => (*snapshot, line.contains("telemetry_delta")),
            other => panic!("{other:?}"),
        };
        let snaps: Vec<Arc<Snapshot>> = (0..5)
            .map(|i| Arc::new(snapshot(300.0 + f64::from(i))))
            .collect();
        put(&snaps[0]);
        assert_eq!(
            read(out.take_snapshot().unwrap()),
            ((*snaps[0]).clone(), false)
        );
        put(&snaps[1]);
        assert_eq!(
            read(out.take_snapshot().unwrap()),
            ((*snaps[1]).clone(), true)
        );
        // A slow reader: 2 is replaced before it is written; 3 comes as changes to 1.
        put(&snaps[2]);
        put(&snaps[3]);
        assert_eq!(
            read(out.take_snapshot().unwrap()),
            ((*snaps[3]).clone(), true)
        );
        // Whole again after a keyframe's worth of pushes (one whole, then deltas; two so far).
        for i in 0..delta::KEYFRAME_EVERY {
            let s = Arc::new(snapshot(400.0 + f64::from(i)));
            put(&s);
            let (got, was_delta) = read(out.take_snapshot().unwrap());
            assert_eq!(got, *s);
            // The 60th push since the last whole one goes whole; changes to it follow.
            assert_eq!(was_delta, i + 3 != delta::KEYFRAME_EVERY, "push {i}");
        }
        // Telemetry stopped and started again: whole first.
        out.forget_snapshots();
        put(&snaps[4]);
        assert_eq!(
            read(out.take_snapshot().unwrap()),
            ((*snaps[4]).clone(), false)
        );
    }

    #[test]
    fn a_known_request_with_a_field_that_does_not_fit_is_told_from_a_frame_that_is_no_request() {
        let misfit_of = |line: &str| {
            let e = protocol::decode::<ClientFrame>(line, MAX_REQUEST_FRAME).unwrap_err();
            misfit(line, &e)
        };
        let events = r#"{"id":2,"type":"events","max":"many"}"#;
        assert_eq!(misfit_of(events), Some((2, "events".to_string())));
        let nan = r#"{"id":3,"type":"power_cap","watts":null}"#;
        assert_eq!(misfit_of(nan), Some((3, "power_cap".to_string())));
        let missing = r#"{"id":4,"type":"history","gpu":0}"#;
        assert_eq!(misfit_of(missing), Some((4, "history".to_string())));
        // Not a request at all: these close the connection.
        assert_eq!(misfit_of(r#"{"id":5,"type":"fly"}"#), None);
        assert_eq!(misfit_of(r#"{"id":"six","type":"runs"}"#), None);
        assert_eq!(misfit_of(r#"{"type":"runs"}"#), None);
        assert_eq!(misfit_of(r#"{"id":7,"type":"runs""#), None);
        assert!(known_request("status") && known_request("metrics") && known_request("hello"));
        assert!(!known_request("Status") && !known_request(""));
    }

    #[tokio::test]
    async fn answers_wait_for_room_in_bytes_pushes_do_not_and_one_large_answer_goes_alone() {
        let out = Outbox::new(1000);
        let answer = format!("{{\"id\":1,\"pad\":\"{}\"}}\n", "a".repeat(600));
        assert!(out.reserve(&answer).await);
        let second = tokio::time::timeout(Duration::from_millis(50), out.reserve(&answer)).await;
        assert!(second.is_err(), "no room until the first is written");
        let push = format!("{{\"type\":\"event\",\"pad\":\"{}\"}}\n", "e".repeat(5000));
        assert!(out.reserve(&push).await, "a push takes no room");
        out.written(&answer);
        assert!(out.reserve(&answer).await);
        out.written(&answer);
        // Larger than all the room: it waits for all of it, then goes.
        let large = format!("{{\"id\":2,\"pad\":\"{}\"}}\n", "b".repeat(5000));
        assert!(out.reserve(&large).await);
        assert_eq!(out.room.available_permits(), 0);
        out.written(&large);
        // An answer queued by others (no room taken) gives back none past the cap.
        out.written(&large);
        assert_eq!(out.room.available_permits(), 1000);
        // The writer gone, nobody waits forever.
        assert!(out.reserve(&large).await);
        out.room.close();
        assert!(!out.reserve(&large).await);
    }

    #[test]
    fn the_newest_snapshot_replaces_the_one_waiting() {
        let out = Outbox::new(1000);
        let old = Arc::new(snapshot(500.0));
        let new = Arc::new(snapshot(510.0));
        let whole = |s: &Arc<Snapshot>, _: Option<&Arc<Snapshot>>| {
            (
                Arc::from(format!("{}\n", s.gpus[0].power_w.unwrap())),
                false,
            )
        };
        out.put_snapshot(&old, false, whole);
        out.put_snapshot(&new, false, whole);
        assert_eq!(out.take_snapshot().as_deref(), Some("510\n"));
        assert_eq!(out.take_snapshot(), None);
    }
}
