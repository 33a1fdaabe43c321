//! A connection that only receives telemetry: hello, subscribe, then nothing but pushed
//! snapshots. The console reads one on its own event loop's thread, so that a snapshot wakes
//! that thread alone instead of a reader thread and then the loop (see `tui::feed::daemon`).

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use super::{ClientError, DEFAULT_TIMEOUT, connect_checked, is_timeout, read_frame};
use crate::protocol::delta::SnapshotStream;
use crate::protocol::{self, ClientFrame, Request, Response};

/// A connection subscribed to telemetry alone, ready to be read from.
#[derive(Debug)]
pub struct PushStream {
    pub stream: UnixStream,
    /// What was read past the subscription's answer: the start of the first pushes.
    pub buffered: Vec<u8>,
    /// Read its pushes through this: snapshots come as changes to the one before, and one
    /// may have come before the subscription's answer.
    pub snapshots: SnapshotStream,
}

/// Connect to the daemon at `socket` as `client_name` (the same checks as
/// [`super::Client::connect_to`]) and subscribe to its snapshots. A snapshot pushed before the
/// subscription's answer is not passed on (the next one comes within a period), but it is the
/// base of the changes that follow it: read on through [`PushStream::snapshots`].
pub fn telemetry_stream(socket: &Path, client_name: &str) -> Result<PushStream, ClientError> {
    let stream = connect_checked(socket)?;
    stream.set_read_timeout(Some(DEFAULT_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let frames = [
        Request::Hello {
            version: protocol::VERSION,
            client: client_name.into(),
        },
        Request::Subscribe {
            telemetry: true,
            events: false,
            delta: true,
            dedicated: true,
        },
    ];
    for (id, request) in frames.into_iter().enumerate() {
        writer.write_all(
            protocol::encode(&ClientFrame {
                id: id as u64,
                request,
            })
            .as_bytes(),
        )?;
    }
    let mut reader = BufReader::with_capacity(64 << 10, stream);
    let timeout = |what| ClientError::Timeout {
        what,
        timeout: DEFAULT_TIMEOUT,
    };
    let mut snapshots = SnapshotStream::default();
    loop {
        let frame = match read_frame(&mut reader, &mut snapshots) {
            Ok(Some(f)) => f,
            Ok(None) => return Err(ClientError::Closed { log: None }),
            Err(e) if is_timeout(&e) => return Err(timeout("subscribe")),
            Err(e) => return Err(e.into()),
        };
        match (frame.id, frame.response) {
            (Some(1), Response::Subscribed { .. }) => break,
            // A refusal (of this peer, or of the hello) may come without an id.
            (_, Response::Error { code, message }) => {
                return Err(ClientError::Daemon { code, message });
            }
            (Some(0), Response::Welcome { .. }) | (None, Response::Telemetry { .. }) => {}
            (_, other) => {
                return Err(ClientError::Unexpected {
                    what: "subscribe",
                    got: format!("{other:?}"),
                });
            }
        }
    }
    let buffered = reader.buffer().to_vec();
    let stream = reader.into_inner();
    stream.set_read_timeout(None)?;
    Ok(PushStream {
        stream,
        buffered,
        snapshots,
    })
}
