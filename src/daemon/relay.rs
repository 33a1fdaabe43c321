//! A trainer whose run is on another node: a rank of a Slurm job on a compute node, say, whose
//! run the login node's daemon started. Its `GPUPILOT_SOCKET` names a socket on that other node,
//! so it attaches to its own node's daemon instead, adding `"via_node": NODE` (the run's
//! `GPUPILOT_RUN_NODE`) to its `trainer_attach`. That connection then becomes a relay to NODE's
//! daemon, reached as `gpupilot attach --host NODE` reaches one: `ssh NODE gpupilot bridge`
//! ([`Origin::ssh`], so `$GPUPILOT_SSH` and `$GPUPILOT_REMOTE_COMMAND` apply). The other end
//! knows the user by SSH and by its socket's peer check; nothing listens on a port.
//!
//! The relay says `hello` to the other daemon, forwards the trainer's attach without `via_node`
//! (the other daemon sees an ordinary trainer), and from then on carries frames both ways
//! verbatim, one line at a time: a trainer's frame is at most [`MAX_REQUEST_FRAME`] (the
//! connection's codec), the other daemon's at most [`MAX_REPLY_FRAME`]. Towards the trainer a
//! frame goes through the connection's bounded writer queue, towards the other daemon straight
//! into SSH's pipe, so a side that stops reading holds the other back rather than filling a
//! buffer. When either side closes, the relay ends and the other side is closed.
//!
//! A relay that cannot open answers the attach with an `internal` error saying why (SSH's own
//! words: no route, no key, no gpupilot there); the SDK retries in the background as it does for
//! any refused attach. Relays opened and failed are node events (`relay_opened`,
//! `relay_failed`); a trainer retries every few seconds, so a failure is recorded again only
//! when its reason changes or [`RECORD_AGAIN_AFTER`] later.
//!
//! Only a user's own daemon relays: the system daemon would reach other nodes with root's SSH
//! identity on behalf of whoever asked, so it refuses.

use std::collections::BTreeMap;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;

use super::auth::Mode;
use super::state::Daemon;
use crate::client::{Origin, spawn_bridge};
use crate::protocol::{
    self, ClientFrame, ErrorCode, MAX_REPLY_FRAME, MAX_REQUEST_FRAME, NodeEvent, Request, Response,
    ServerFrame,
};

/// The field of `trainer_attach` that asks for a relay.
pub const VIA_FIELD: &str = "via_node";

/// How long SSH, the other daemon's `welcome` and its answer to the attach may take together.
/// SSH gives up connecting after 10 s (`Origin::ssh`); the SDK waits 30 s for the answer.
const OPEN_WITHIN: Duration = Duration::from_secs(25);

/// A failure of the same relay for the same reason is recorded once in this long.
pub const RECORD_AGAIN_AFTER: Duration = Duration::from_secs(60);

/// A `trainer_attach` that asks to be relayed to another node.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// The attach's id: the other daemon's answer carries it back.
    id: u64,
    /// The run's node.
    node: String,
    run: String,
    pid: Option<u32>,
    rank: Option<u32>,
    /// The attach as the trainer sent it, without `via_node`, with its newline.
    attach: String,
}

impl Ask {
    /// The relay `frame` (read from `line`) asks for: a `trainer_attach` whose `via_node`
    /// names a node other than `this_node`. Anything else is None and answered as usual.
    pub fn of(frame: &ClientFrame, line: &str, this_node: &str) -> Option<Ask> {
        let Request::TrainerAttach { run, pid, rank, .. } = &frame.request else {
            return None;
        };
        let mut fields: serde_json::Map<String, Value> = serde_json::from_str(line).ok()?;
        let node = match fields.remove(VIA_FIELD)? {
            Value::String(node) => node.trim().to_string(),
            _ => return None,
        };
        if node.is_empty() || node == this_node {
            return None;
        }
        let mut attach = Value::Object(fields).to_string();
        attach.push('\n');
        Some(Ask {
            id: frame.id,
            node,
            run: run.clone(),
            pid: *pid,
            rank: rank.as_ref().map(|r| r.rank),
            attach,
        })
    }

    fn who(&self) -> String {
        match self.rank {
            Some(r) => format!("run {} rank {r}", self.run),
            None => format!("run {}", self.run),
        }
    }
}

/// An open relay: the other daemon accepted the handshake and has answered the attach.
pub struct Relay {
    ask: Ask,
    to_node: OwnedWriteHalf,
    from_node: FramedRead<OwnedReadHalf, LinesCodec>,
    /// Frames from the other daemon read while opening (its answer to the attach last), for
    /// the trainer.
    pending: Vec<String>,
    _bridge: SshBridge,
}

/// Open the relay `ask` asks for. Err: the frame that answers the attach instead (an error
/// saying why), the connection staying an ordinary one.
pub async fn open(
    daemon: &Daemon,
    mode: &Mode,
    ask: Ask,
    shutdown: &CancellationToken,
) -> Result<Relay, String> {
    if let Mode::System { .. } = mode {
        let message = format!(
            "the system daemon relays no trainer: a rank of a run on {} attaches through its \
             user's own daemon on this node (`gpupilot daemon --detach`; GPUPILOT_NODE_SOCKET \
             names its socket)",
            ask.node
        );
        return Err(error(Some(ask.id), ErrorCode::PermissionDenied, message));
    }
    if !plausible_node(&ask.node) {
        let message = format!(
            "{VIA_FIELD} {:?} is not a node name (GPUPILOT_RUN_NODE should be the name of the \
             node whose daemon started the run)",
            ask.node
        );
        return Err(error(Some(ask.id), ErrorCode::BadRequest, message));
    }
    let Origin::Command { argv, .. } = Origin::ssh(&ask.node) else {
        return Err(error(
            Some(ask.id),
            ErrorCode::Internal,
            "no SSH command to run",
        ));
    };
    let program = argv
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let opened = match SshBridge::start(&argv) {
        Ok((stream, bridge)) => {
            let attempt = handshake(daemon, &ask, stream);
            let answer = tokio::select! {
                r = tokio::time::timeout(OPEN_WITHIN, attempt) => r.unwrap_or_else(|_| {
                    Err(format!("no answer within {} s", OPEN_WITHIN.as_secs()))
                }),
                _ = shutdown.cancelled() => Err("this daemon is stopping".into()),
            };
            match answer {
                Ok(halves) => Ok((halves, bridge)),
                Err(why) => Err((why, Some(bridge))),
            }
        }
        Err(e) => Err((format!("running {}: {e}", program), None)),
    };
    match opened {
        Ok(((to_node, from_node, pending), bridge)) => {
            let relay = Relay {
                ask,
                to_node,
                from_node,
                pending,
                _bridge: bridge,
            };
            relay.record_answer(daemon);
            Ok(relay)
        }
        Err((why, bridge)) => {
            // SSH says why it failed on stderr, then exits: give it a moment to finish.
            let said = match bridge {
                Some(bridge) => bridge.said_when_done().await,
                None => String::new(),
            };
            let why = if said.is_empty() { why } else { said };
            let reason = format!("no gpupilot daemon reachable through `{program}`: {why}");
            failed(daemon, &ask, &reason);
            Err(error(
                Some(ask.id),
                ErrorCode::Internal,
                format!(
                    "{reason} (a rank on another node reaches its run's daemon over SSH, as \
                     `gpupilot attach --host {}` does)",
                    ask.node
                ),
            ))
        }
    }
}

impl Relay {
    /// Carry frames both ways until either side closes (or this daemon stops); then close both.
    pub async fn serve(
        self,
        mut from_trainer: FramedRead<OwnedReadHalf, LinesCodec>,
        to_trainer: mpsc::Sender<String>,
        shutdown: &CancellationToken,
    ) {
        let Relay {
            ask,
            mut to_node,
            mut from_node,
            pending,
            _bridge,
        } = self;
        for line in pending {
            if to_trainer.send(line).await.is_err() {
                return;
            }
        }
        let node = ask.node.as_str();
        let why = {
            let up = async {
                loop {
                    let line = match from_trainer.next().await {
                        None => return "the trainer closed its connection".to_string(),
                        Some(Ok(line)) => line,
                        Some(Err(e)) => {
                            let why = match e {
                                LinesCodecError::MaxLineLengthExceeded => {
                                    format!("frame longer than {MAX_REQUEST_FRAME} bytes")
                                }
                                LinesCodecError::Io(e) => format!("reading the trainer: {e}"),
                            };
                            let answer =
                                error(None, ErrorCode::BadFrame, format!("{why}; closing"));
                            let _ = to_trainer.send(answer).await;
                            return why;
                        }
                    };
                    let mut bytes = line.into_bytes();
                    bytes.push(b'\n');
                    if let Err(e) = to_node.write_all(&bytes).await {
                        return format!("writing to {node}: {e}");
                    }
                }
            };
            let down = async {
                loop {
                    match from_node.next().await {
                        None => return format!("{node}'s daemon closed the connection"),
                        Some(Ok(mut line)) => {
                            line.push('\n');
                            if to_trainer.send(line).await.is_err() {
                                return "the trainer's connection closed".to_string();
                            }
                        }
                        Some(Err(e)) => return format!("reading from {node}: {e}"),
                    }
                }
            };
            tokio::select! {
                why = up => why,
                why = down => why,
                _ = shutdown.cancelled() => "this daemon is stopping".to_string(),
            }
        };
        tracing::info!("relay of {} to {node} closed: {why}", ask.who());
        // SSH sees the end of its input and closes the other daemon's connection in turn.
        let _ = to_node.shutdown().await;
    }

    /// Record how the other daemon answered the attach (the last pending frame).
    fn record_answer(&self, daemon: &Daemon) {
        let ask = &self.ask;
        let answer = self
            .pending
            .last()
            .and_then(|l| protocol::decode::<ServerFrame>(l, MAX_REPLY_FRAME).ok());
        match answer.map(|f| f.response) {
            Some(Response::Error { code, message }) => {
                let code = serde_json::to_value(code).unwrap_or_default();
                let reason = format!(
                    "{}'s daemon refused the attach: {}: {message}",
                    ask.node,
                    code.as_str().unwrap_or("error")
                );
                failed(daemon, ask, &reason);
            }
            _ => {
                tracing::info!(
                    "relaying {} (pid {}) to {}",
                    ask.who(),
                    ask.pid.map_or("?".into(), |p| p.to_string()),
                    ask.node
                );
                lock(&RECORDED).remove(&key(ask));
                daemon.events().record(NodeEvent::RelayOpened {
                    run: ask.run.clone(),
                    node: ask.node.clone(),
                    pid: ask.pid,
                    rank: ask.rank,
                });
            }
        }
    }
}

/// `hello` to the other daemon, then the attach; the halves of the stream and the frames read
/// up to the answer to the attach, which comes last.
async fn handshake(
    daemon: &Daemon,
    ask: &Ask,
    stream: UnixStream,
) -> Result<
    (
        OwnedWriteHalf,
        FramedRead<OwnedReadHalf, LinesCodec>,
        Vec<String>,
    ),
    String,
> {
    let (rd, mut wr) = stream.into_split();
    let mut lines = FramedRead::new(rd, LinesCodec::new_with_max_length(MAX_REPLY_FRAME));
    let hello = protocol::encode(&ClientFrame {
        id: ask.id.wrapping_add(1),
        request: Request::Hello {
            version: protocol::VERSION,
            client: format!(
                "gpupilot-relay {} (a trainer on {})",
                env!("CARGO_PKG_VERSION"),
                daemon.node()
            ),
        },
    });
    let node = &ask.node;
    wr.write_all(hello.as_bytes())
        .await
        .map_err(|e| format!("writing to ssh: {e}"))?;
    let welcome = next(&mut lines, node).await?;
    match protocol::decode::<ServerFrame>(&welcome, MAX_REPLY_FRAME).map(|f| f.response) {
        Ok(Response::Welcome { daemon_pid, .. }) => {
            tracing::debug!(
                "relay for {}: {node}'s daemon is pid {daemon_pid}",
                ask.who()
            );
        }
        Ok(Response::Error { message, .. }) => {
            return Err(format!("{node}'s daemon refused the handshake: {message}"));
        }
        _ => return Err(format!("{node} answered hello with {welcome:?}")),
    }
    wr.write_all(ask.attach.as_bytes())
        .await
        .map_err(|e| format!("writing to ssh: {e}"))?;
    let mut pending = Vec::new();
    loop {
        let mut line = next(&mut lines, node).await?;
        let answers = id_of(&line) == Some(ask.id);
        line.push('\n');
        pending.push(line);
        if answers {
            return Ok((wr, lines, pending));
        }
    }
}

async fn next(
    lines: &mut FramedRead<OwnedReadHalf, LinesCodec>,
    node: &str,
) -> Result<String, String> {
    match lines.next().await {
        Some(Ok(line)) => Ok(line),
        Some(Err(e)) => Err(format!("reading from {node}: {e}")),
        None => Err("the connection closed before the daemon answered".into()),
    }
}

fn id_of(line: &str) -> Option<u64> {
    serde_json::from_str::<Value>(line)
        .ok()?
        .get("id")?
        .as_u64()
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

/// A name SSH takes as a host (`gpu01`, `login.cluster`, `me@10.0.0.1`), never as an option.
fn plausible_node(node: &str) -> bool {
    !node.is_empty()
        && !node.starts_with('-')
        && node.len() <= 255
        && node.chars().all(|c| c.is_ascii_graphic())
}

type Key = (String, String, Option<u32>);

/// The failure last recorded per run, node and rank, and when.
static RECORDED: Mutex<BTreeMap<Key, (String, Instant)>> = Mutex::new(BTreeMap::new());

fn key(ask: &Ask) -> Key {
    (ask.run.clone(), ask.node.clone(), ask.rank)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Log a failed relay, and record it unless the same failure was recorded a moment ago.
fn failed(daemon: &Daemon, ask: &Ask, reason: &str) {
    let now = Instant::now();
    let fresh = {
        let mut recorded = lock(&RECORDED);
        recorded.retain(|_, (_, at)| now.duration_since(*at) < RECORD_AGAIN_AFTER);
        let fresh = recorded.get(&key(ask)).is_none_or(|(r, _)| r != reason);
        if fresh {
            recorded.insert(key(ask), (reason.to_string(), now));
        }
        fresh
    };
    if !fresh {
        tracing::debug!("relay of {} to {}: {reason}", ask.who(), ask.node);
        return;
    }
    tracing::warn!("relay of {} to {}: {reason}", ask.who(), ask.node);
    daemon.events().record(NodeEvent::RelayFailed {
        run: ask.run.clone(),
        node: ask.node.clone(),
        pid: ask.pid,
        rank: ask.rank,
        reason: reason.to_string(),
    });
}

/// The SSH process (`ssh NODE gpupilot bridge`), on one end of a socket pair; what it says on
/// stderr is kept for errors. Dropped, it gets a moment to end by itself (its input has closed)
/// and is killed otherwise.
struct SshBridge {
    child: Option<Child>,
    said: Arc<Mutex<String>>,
}

impl SshBridge {
    fn start(argv: &[std::ffi::OsString]) -> std::io::Result<(UnixStream, SshBridge)> {
        let (ours, child, said) = spawn_bridge(argv)?;
        let link = SshBridge {
            child: Some(child),
            said,
        };
        ours.set_nonblocking(true)?;
        Ok((UnixStream::from_std(ours)?, link))
    }

    /// What SSH said, once it has exited (or 2 s later): its own words, or its exit status.
    async fn said_when_done(mut self) -> String {
        let mut status = None;
        if let Some(child) = self.child.as_mut() {
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Ok(Some(s)) = child.try_wait() {
                    status = Some(s);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // The stderr reader may be a moment behind the exit.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let said = lock(&self.said).trim().to_string();
        match status {
            _ if !said.is_empty() => said,
            Some(s) if !s.success() => format!("it exited with {s}"),
            _ => String::new(),
        }
    }
}

impl Drop for SshBridge {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if !matches!(child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(line: &str) -> ClientFrame {
        protocol::decode(line, MAX_REQUEST_FRAME).unwrap()
    }

    #[test]
    fn an_attach_via_another_node_is_forwarded_without_the_field() {
        let line = r#"{"id":2,"type":"trainer_attach","run":"r1","pid":77,"rank":2,"world_size":4,"via_node":"login1","knobs":{"batch_size":32},"later":true}"#;
        let ask = Ask::of(&frame(line), line, "gpu07").expect("a relay");
        assert_eq!(ask.node, "login1");
        assert_eq!((ask.id, ask.pid, ask.rank), (2, Some(77), Some(2)));
        assert_eq!(ask.run, "r1");
        assert!(ask.attach.ends_with('\n'));
        let forwarded: Value = serde_json::from_str(&ask.attach).unwrap();
        let sent: Value = serde_json::from_str(line).unwrap();
        let mut expected = sent.as_object().unwrap().clone();
        expected.remove("via_node");
        assert_eq!(
            forwarded,
            Value::Object(expected),
            "every other field as sent"
        );
        // What the run's daemon reads is the attach itself.
        assert_eq!(frame(&ask.attach), frame(line));
    }

    #[test]
    fn no_relay_for_this_node_no_field_or_other_requests() {
        let this = r#"{"id":2,"type":"trainer_attach","run":"r1","via_node":"gpu07"}"#;
        assert_eq!(Ask::of(&frame(this), this, "gpu07"), None);
        let none = r#"{"id":2,"type":"trainer_attach","run":"r1"}"#;
        assert_eq!(Ask::of(&frame(none), none, "gpu07"), None);
        let blank = r#"{"id":2,"type":"trainer_attach","run":"r1","via_node":" "}"#;
        assert_eq!(Ask::of(&frame(blank), blank, "gpu07"), None);
        let number = r#"{"id":2,"type":"trainer_attach","run":"r1","via_node":7}"#;
        assert_eq!(Ask::of(&frame(number), number, "gpu07"), None);
        let other = r#"{"id":2,"type":"runs","via_node":"login1"}"#;
        assert_eq!(Ask::of(&frame(other), other, "gpu07"), None);
    }

    #[test]
    fn node_names_never_reach_ssh_as_options() {
        for ok in ["login1", "login.cluster.example", "me@10.0.0.1", "[::1]"] {
            assert!(plausible_node(ok), "{ok}");
        }
        for bad in ["-oProxyCommand=x", "a b", "a\nb", "", "é"] {
            assert!(!plausible_node(bad), "{bad:?}");
        }
    }
}
