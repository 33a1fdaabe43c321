//! The socket side: accept connections, check who is calling, and run one task per connection
//! that reads frames, answers them, and pushes subscribed updates.
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

use super::auth::{Peer, peer_allowed, refusal_message};
use super::state::Daemon;
use crate::protocol::{
    self, ClientFrame, ErrorCode, MAX_REQUEST_FRAME, NodeEvent, Request, Response, ServerFrame,
};

/// Frames queued for one client before its answers wait (pushed snapshots are dropped).
const QUEUE: usize = 64;

/// Accept connections until `shutdown`; then tell every client and wait (briefly) for them.
pub async fn accept_loop(daemon: Arc<Daemon>, listener: UnixListener, shutdown: CancellationToken) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(connection(Arc::clone(&daemon), stream, shutdown.clone()));
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

async fn connection(daemon: Arc<Daemon>, mut stream: UnixStream, shutdown: CancellationToken) {
    let peer = match Peer::of(&stream) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("a connection whose peer is unknown ({e}): closed");
            return;
        }
    };
    if !peer_allowed(daemon.uid(), peer.uid) {
        let message = refusal_message(daemon.uid(), peer.uid);
        tracing::warn!(uid = peer.uid, pid = ?peer.pid, "refused a connection: {message}");
        daemon.events().record(NodeEvent::PeerRefused {
            uid: peer.uid,
            pid: peer.pid,
            reason: "another user".into(),
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
        tx,
        greeted: false,
        telemetry: None,
        events: None,
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
    tx: mpsc::Sender<String>,
    greeted: bool,
    telemetry: Option<JoinHandle<()>>,
    events: Option<JoinHandle<()>>,
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

    /// Answer one frame; false closes the connection.
    async fn handle(&mut self, frame: ClientFrame) -> bool {
        let id = frame.id;
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
            Request::Subscribe { telemetry, events } => {
                self.subscribe(telemetry, events);
                self.send(reply(id, Response::Subscribed { telemetry, events }))
                    .await;
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
                self.telemetry = Some(tokio::spawn(async move {
                    // The newest snapshot at once, then each new one.
                    loop {
                        let snap = rx.borrow_and_update().clone();
                        if let Some(s) = snap {
                            let line = push(Response::Telemetry {
                                snapshot: Box::new((*s).clone()),
                            });
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
        for t in [self.telemetry.take(), self.events.take()]
            .into_iter()
            .flatten()
        {
            t.abort();
        }
    }
}
