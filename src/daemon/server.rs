//! The socket side: accept connections, check who is calling, and run one task per connection
//! that reads frames, answers them, and pushes subscribed updates.
//!
//! Who may connect, and (on the system daemon) who may make each request, is `auth::decide`'s
//! call; every refusal is logged and recorded as a `peer_refused` node event.
//!
//! Each connection has one writer task fed by a channel, so answers and pushes interleave
//! without tearing a frame. A frame that is too long, not UTF-8 or not a request ends that
//! connection only (after a `bad_frame` error that says why, also written to the log).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;

use super::auth::{Access, Identity, Mode, Peer, Verdict, decide, group_entry};
use super::relay;
use super::state::Daemon;
use super::trainers::Attach;
use crate::protocol::{
    self, ClientFrame, ErrorCode, MAX_REQUEST_FRAME, NodeEvent, Request, Response, ServerFrame,
};
use crate::telemetry::Snapshot;

/// Frames queued for one client before its answers wait (pushed snapshots are dropped).
const QUEUE: usize = 64;

/// Accept connections until `shutdown`; then tell every client and wait (briefly) for them.
pub async fn accept_loop(
    daemon: Arc<Daemon>,
    listener: UnixListener,
    shutdown: CancellationToken,
    mode: Arc<Mode>,
) {
    let mut conns = JoinSet::new();
    let frames = Arc::new(TelemetryFrames::default());
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(connection(
                        Arc::clone(&daemon),
                        stream,
                        shutdown.clone(),
                        Arc::clone(&mode),
                        Arc::clone(&frames),
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
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
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

async fn connection(
    daemon: Arc<Daemon>,
    mut stream: UnixStream,
    shutdown: CancellationToken,
    mode: Arc<Mode>,
    frames: Arc<TelemetryFrames>,
) {
    let peer = match Peer::of(&stream) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("a connection whose peer is unknown ({e}): closed");
            return;
        }
    };
    // The system daemon decides per request, and group membership needs the peer's groups.
    let who = Identity::of(&peer, matches!(*mode, Mode::System { .. }));
    if let Verdict::Deny { reason, message } = decide(&mode, &who, Access::Connect, "connect", None)
    {
        tracing::warn!(uid = peer.uid, pid = ?peer.pid, "refused a connection: {message}");
        daemon.events().record(NodeEvent::PeerRefused {
            uid: peer.uid,
            pid: peer.pid,
            reason,
        });
        let line = error(None, ErrorCode::PermissionDenied, message);
        let _ =
            tokio::time::timeout(Duration::from_secs(1), stream.write_all(line.as_bytes())).await;
        return;
    }
    daemon.client(true);
    let (rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<String>(QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            if wr.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    let mut conn = Conn {
        daemon: Arc::clone(&daemon),
        peer,
        who,
        mode,
        tx,
        id: daemon.conn_id(),
        trainer_of: None,
        trainer_rank: None,
        greeted: false,
        telemetry: None,
        events: None,
        frames,
    };
    let mut frames = FramedRead::new(rd, LinesCodec::new_with_max_length(MAX_REQUEST_FRAME));
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => {
                conn.send(push(Response::Shutdown { reason: "the daemon is stopping".into() })).await;
                break;
            }
            next = frames.next() => next,
        };
        let line = match next {
            None => break,
            Some(Ok(line)) => line,
            Some(Err(e)) => {
                let why = match e {
                    LinesCodecError::MaxLineLengthExceeded => {
                        format!("frame longer than {MAX_REQUEST_FRAME} bytes")
                    }
                    LinesCodecError::Io(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                        "frame is not UTF-8".to_string()
                    }
                    LinesCodecError::Io(e) => {
                        tracing::debug!("{}: read failed: {e}", conn.peer.describe());
                        break;
                    }
                };
                conn.bad_frame(None, &why).await;
                break;
            }
        };
        let frame = match protocol::decode::<ClientFrame>(&line, MAX_REQUEST_FRAME) {
            Ok(f) => f,
            Err(e) => {
                conn.bad_frame(id_of(&line), &e.to_string()).await;
                break;
            }
        };
        // A trainer of another node's run (`via_node`): this connection becomes a relay to that
        // node's daemon until either side closes (see `relay`).
        if conn.greeted && conn.trainer_of.is_none() {
            if let Some(ask) = relay::Ask::of(&frame, &line, daemon.node()) {
                match relay::open(&daemon, &conn.mode, ask, &shutdown).await {
                    Ok(relay) => {
                        relay.serve(frames, conn.tx.clone(), &shutdown).await;
                        break;
                    }
                    Err(answer) => {
                        conn.send(answer).await;
                        continue;
                    }
                }
            }
        }
        if !conn.handle(frame).await {
            break;
        }
    }
    conn.close();
    // Flush what is queued (an error saying why we close, say), then close.
    drop(conn);
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    daemon.client(false);
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
    /// The run this connection is the trainer of, after `trainer_attach`.
    trainer_of: Option<String>,
    /// Which rank of that run, where the trainer said.
    trainer_rank: Option<u32>,
    greeted: bool,
    telemetry: Option<JoinHandle<()>>,
    events: Option<JoinHandle<()>>,
    /// The telemetry push, encoded once per snapshot for every connection.
    frames: Arc<TelemetryFrames>,
}

impl Conn {
    async fn send(&self, line: String) {
        let _ = self.tx.send(line).await;
    }

    async fn bad_frame(&self, id: Option<u64>, why: &str) {
        tracing::warn!(
            "closing the connection from {}: {why}",
            self.peer.describe()
        );
        self.send(error(
            id,
            ErrorCode::BadFrame,
            format!("{why}; closing the connection"),
        ))
        .await;
    }

    /// Whether this peer may make `request`; a refusal is logged and recorded, and its message
    /// returned for the answer.
    fn refused(&self, request: &Request) -> Option<String> {
        let access = Access::of(request);
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
                tracing::warn!(
                    uid = self.peer.uid,
                    pid = ?self.peer.pid,
                    "refused {kind} from {}: {message}",
                    self.peer.describe()
                );
                self.daemon.events().record(NodeEvent::PeerRefused {
                    uid: self.peer.uid,
                    pid: self.peer.pid,
                    reason,
                });
                Some(message)
            }
        }
    }

    /// Answer one frame; false closes the connection.
    async fn handle(&mut self, frame: ClientFrame) -> bool {
        let id = frame.id;
        if self.greeted {
            if let Some(message) = self.refused(&frame.request) {
                self.send(error(Some(id), ErrorCode::PermissionDenied, message))
                    .await;
                return true;
            }
        }
        match frame.request {
            Request::Hello { version, client } => {
                if self.greeted {
                    self.send(error(
                        Some(id),
                        ErrorCode::BadRequest,
                        "hello was already said",
                    ))
                    .await;
                    return true;
                }
                if version != protocol::VERSION {
                    let message = format!(
                        "protocol version mismatch: this daemon (pid {}) speaks version {}, the client ({client}) {version}; \
                         use the same gpupilot for both (after an upgrade, restart the daemon: it leaves runs running)",
                        self.daemon.pid(),
                        protocol::VERSION
                    );
                    tracing::warn!("{}: {message}", self.peer.describe());
                    self.send(error(Some(id), ErrorCode::VersionMismatch, message))
                        .await;
                    return false;
                }
                tracing::debug!("{} connected ({client})", self.peer.describe());
                self.greeted = true;
                self.send(reply(
                    id,
                    Response::Welcome {
                        version: protocol::VERSION,
                        daemon_pid: self.daemon.pid(),
                        node: self.daemon.node().to_string(),
                        readonly: self.daemon.readonly(),
                    },
                ))
                .await;
                true
            }
            _ if !self.greeted => {
                tracing::warn!(
                    "closing the connection from {}: no hello",
                    self.peer.describe()
                );
                self.send(error(
                    Some(id),
                    ErrorCode::HandshakeRequired,
                    "say hello first: {\"id\":1,\"type\":\"hello\",\"version\":1,\"client\":\"…\"}",
                ))
                .await;
                false
            }
            Request::TrainerAttach {
                run,
                pid,
                knobs,
                ranges,
                rank,
            } => {
                if self.trainer_of.is_some() {
                    self.send(error(
                        Some(id),
                        ErrorCode::BadRequest,
                        "this connection is already a trainer; open another to attach again",
                    ))
                    .await;
                    return true;
                }
                let daemon = Arc::clone(&self.daemon);
                let (conn, tx) = (self.id, self.tx.clone());
                let answer = tokio::task::spawn_blocking(move || {
                    let ask = Attach {
                        run,
                        pid,
                        rank,
                        knobs,
                        ranges,
                    };
                    daemon.trainer_attach(conn, tx, ask)
                })
                .await;
                match answer {
                    Ok(Ok((run, rank, response, pushes))) => {
                        self.trainer_of = Some(run);
                        self.trainer_rank = rank;
                        self.send(reply(id, response)).await;
                        for line in pushes {
                            self.send(line).await;
                        }
                    }
                    Ok(Err(e)) => self.send(reply(id, e.into_response())).await,
                    Err(e) => {
                        tracing::error!("answering trainer_attach: {e}");
                        self.send(error(
                            Some(id),
                            ErrorCode::Internal,
                            "the daemon failed answering trainer_attach; see its log",
                        ))
                        .await;
                    }
                }
                true
            }
            Request::Metrics(_)
            | Request::KnobAck { .. }
            | Request::KnobVote { .. }
            | Request::TrainerError { .. }
                if self.trainer_of.is_none() =>
            {
                self.send(error(
                    Some(id),
                    ErrorCode::BadState,
                    "attach first: send trainer_attach with the run's id (GPUPILOT_RUN_ID)",
                ))
                .await;
                true
            }
            // Small and frequent: answered here, without a hop to the blocking pool, so that
            // a knob's round trip stays short.
            Request::Metrics(report) => {
                let run = self.trainer_of.as_deref().expect("checked above");
                let response = self.daemon.trainer_metrics(run, self.trainer_rank, report);
                self.send(reply(id, response)).await;
                true
            }
            Request::KnobAck {
                seq,
                applied,
                reason,
                step,
            } => {
                let run = self.trainer_of.as_deref().expect("checked above");
                let rank = self.trainer_rank;
                let response = self.daemon.knob_ack(run, rank, seq, applied, reason, step);
                self.send(reply(id, response)).await;
                true
            }
            Request::KnobVote {
                seq,
                ready,
                reason,
                step,
            } => {
                let run = self.trainer_of.as_deref().expect("checked above");
                let rank = self.trainer_rank;
                let response = self.daemon.knob_vote(run, rank, seq, ready, reason, step);
                self.send(reply(id, response)).await;
                true
            }
            Request::TrainerError {
                kind,
                message,
                batch_size: _,
            } => {
                let run = self.trainer_of.clone().expect("checked above");
                let response = self.daemon.trainer_error(&run, kind, message);
                self.send(reply(id, response)).await;
                true
            }
            Request::Subscribe { telemetry, events } => {
                self.subscribe(telemetry, events);
                self.send(reply(id, Response::Subscribed { telemetry, events }))
                    .await;
                true
            }
            // Memory only (the history lock is held just for a snapshot's appends): answered
            // here, without a hop to the blocking pool and back.
            request @ Request::History { .. } => {
                let response = self.daemon.answer(&self.peer, request);
                self.send(reply(id, response)).await;
                true
            }
            request => {
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

    fn subscribe(&mut self, telemetry: bool, events: bool) {
        match (telemetry, &self.telemetry) {
            (true, None) => {
                let mut rx = self.daemon.telemetry();
                let tx = self.tx.clone();
                let frames = Arc::clone(&self.frames);
                self.telemetry = Some(tokio::spawn(async move {
                    // The newest snapshot at once, then each new one.
                    loop {
                        let snap = rx.borrow_and_update().clone();
                        if let Some(s) = snap {
                            let line = frames.line(&s);
                            // A client that does not keep up skips snapshots; it never stalls
                            // the daemon or its own answers.
                            if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(line) {
                                break;
                            }
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
        if self.trainer_of.take().is_some() {
            self.daemon.trainer_detached(self.id);
        }
        for t in [self.telemetry.take(), self.events.take()]
            .into_iter()
            .flatten()
        {
            t.abort();
        }
    }
}

/// The newest snapshot's push frame, shared by every subscribed connection: each snapshot is
/// encoded once, however many consoles watch.
#[derive(Default)]
struct TelemetryFrames {
    newest: std::sync::Mutex<Option<(Arc<Snapshot>, Arc<str>)>>,
}

impl TelemetryFrames {
    /// The push frame of `snap` (a `telemetry` response with no id).
    fn line(&self, snap: &Arc<Snapshot>) -> String {
        let mut newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, line)) = newest.as_ref() {
            if Arc::ptr_eq(s, snap) {
                return line.to_string();
            }
        }
        let line = telemetry_push(snap);
        *newest = Some((Arc::clone(snap), Arc::from(line.as_str())));
        line
    }
}

/// `push(Response::Telemetry { snapshot })` without copying the snapshot first: the same
/// bytes, from a borrowed snapshot.
fn telemetry_push(snapshot: &Snapshot) -> String {
    #[derive(serde::Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Push<'a> {
        Telemetry { snapshot: &'a Snapshot },
    }
    protocol::encode(&Push::Telemetry { snapshot })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{GpuSample, HostSample};

    fn snapshot(power: f64) -> Snapshot {
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
        let expected = push(Response::Telemetry {
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
        let newest = |f: &TelemetryFrames| f.newest.lock().unwrap().clone().unwrap();
        let a = Arc::new(snapshot(300.0));
        let first = frames.line(&a);
        assert_eq!(first, telemetry_push(&a));
        let (kept, cached) = newest(&frames);
        assert!(Arc::ptr_eq(&kept, &a) && *cached == *first);
        assert_eq!(frames.line(&a), first, "the same snapshot, from the cache");
        assert!(
            Arc::ptr_eq(&newest(&frames).1, &cached),
            "not encoded again"
        );
        let b = Arc::new(snapshot(310.0));
        let second = frames.line(&b);
        assert_eq!(second, telemetry_push(&b));
        assert_ne!(second, first);
        assert!(Arc::ptr_eq(&newest(&frames).0, &b));
    }
}
