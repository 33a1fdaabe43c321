//! Snapshots read on the console's own thread.
//!
//! With a runtime to run on (the console's event loop), the feed opens a second connection to
//! a local daemon that carries nothing but snapshots, and this task reads it there: a snapshot
//! then wakes one thread, the one that draws it, instead of the client's reader thread and
//! then the loop. It is passed on as the reader thread would ([`Pass`]); one the feed must
//! see first (a poll is due with it, or it came too soon) goes to the feed's thread.

use super::pass::{Offer, Pass, Via};
use crate::client::PushStream;
use crate::protocol::delta::SnapshotStream;
use crate::protocol::{MAX_REPLY_FRAME, Response};
use crate::telemetry::Snapshot;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::mpsc;

/// The feed's side of the pump.
pub(super) struct Pump {
    /// New connections to read (each replaces the last).
    pub conns: mpsc::UnboundedSender<PushStream>,
    /// Snapshots the pump leaves to the feed.
    pub to_feed: crossbeam_channel::Receiver<Box<Snapshot>>,
}

impl Pump {
    /// Start the pump on `rt`.
    pub(super) fn start(rt: &tokio::runtime::Handle, pass: Arc<Pass>) -> Pump {
        let (conns, rx) = mpsc::unbounded_channel();
        let (tx, to_feed) = crossbeam_channel::unbounded();
        rt.spawn(run(rx, pass, tx));
        Pump { conns, to_feed }
    }
}

/// Read each connection given until it ends or the next one comes; stop when the feed or the
/// console is gone.
async fn run(
    mut conns: mpsc::UnboundedReceiver<PushStream>,
    pass: Arc<Pass>,
    to_feed: crossbeam_channel::Sender<Box<Snapshot>>,
) {
    let mut next = conns.recv().await;
    let mut line = Vec::new();
    while let Some(conn) = next.take() {
        let mut snapshots = conn.snapshots;
        let Ok(stream) = conn
            .stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixStream::from_std(conn.stream))
        else {
            next = conns.recv().await;
            continue;
        };
        let mut reader =
            BufReader::with_capacity(64 << 10, std::io::Cursor::new(conn.buffered).chain(stream));
        loop {
            line.clear();
            let mut limited = (&mut reader).take(MAX_REPLY_FRAME as u64 + 1);
            let read = limited.read_until(b'\n', &mut line);
            tokio::select! {
                c = conns.recv() => {
                    next = c;
                    break;
                }
                r = read => match r {
                    // The daemon went: the feed says so, and sends the next connection.
                    Ok(0) | Err(_) => {
                        next = conns.recv().await;
                        break;
                    }
                    Ok(_) => {
                        if !take(&line, &mut snapshots, &pass, &to_feed) {
                            return;
                        }
                    }
                },
            }
        }
    }
}

/// Pass a pushed snapshot on (whole: `snapshots` applies the connection's deltas); false once
/// the console is gone.
fn take(
    line: &[u8],
    snapshots: &mut SnapshotStream,
    pass: &Pass,
    to_feed: &crossbeam_channel::Sender<Box<Snapshot>>,
) -> bool {
    let Ok(text) = std::str::from_utf8(line) else {
        return true;
    };
    let snapshot = match snapshots.decode(text, MAX_REPLY_FRAME) {
        Ok(f) => match f.response {
            Response::Telemetry { snapshot } => snapshot,
            _ => return true,
        },
        Err(e) => {
            tracing::debug!("reading snapshots from the daemon: {e}");
            return true;
        }
    };
    match pass.offer(snapshot, Via::Reader) {
        Offer::ToFeed(s) => to_feed.send(s).is_ok(),
        Offer::Closed => false,
        Offer::Sent | Offer::Held(_) | Offer::Stale => true,
    }
}
