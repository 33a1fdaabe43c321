//! `hello` and `subscribe`: what a connection is. The server answers them, since a
//! subscription's pushes belong to the connection (`super::super::server`); who may, the
//! handshake's checks and the welcome are here.

use super::{Class, Sender};
use crate::daemon::auth::Access;
use crate::daemon::base::RequestError;
use crate::daemon::state::Daemon;
use crate::protocol::{self, ErrorCode, Request, Response};

pub(super) fn class(request: &Request) -> Option<Class> {
    match request {
        Request::Hello { .. } => Some(Class::new(Sender::Connection, Access::Watch, false)),
        Request::Subscribe { .. } => Some(Class::new(Sender::Connection, Access::Watch, false)),
        _ => None,
    }
}

/// The answer to `hello`.
#[derive(Debug)]
pub enum Hello {
    /// The connection is greeted.
    Welcome(Box<Response>),
    /// Refused; `close`: the connection closes after it (a protocol version this daemon does
    /// not speak), else it stays as it was.
    Refused { error: RequestError, close: bool },
}

/// `hello` with `version` from `client`, on a connection already `greeted` or not.
pub fn hello(daemon: &Daemon, greeted: bool, version: u32, client: &str) -> Hello {
    if greeted {
        return Hello::Refused {
            error: RequestError::new(ErrorCode::BadRequest, "hello was already said"),
            close: false,
        };
    }
    if version != protocol::VERSION {
        let release = env!("CARGO_PKG_VERSION");
        let message = format!(
            "protocol version mismatch: this daemon (gpupilot {release}, pid {}) speaks version {}, the client ({client}) {version}; \
             use one gpupilot release for both: after an upgrade, restart the daemon (it leaves runs running); \
             a Python SDK must come from the daemon's release ({release})",
            daemon.pid(),
            protocol::VERSION,
        );
        return Hello::Refused {
            error: RequestError::new(ErrorCode::VersionMismatch, message),
            close: true,
        };
    }
    Hello::Welcome(Box::new(Response::Welcome {
        version: protocol::VERSION,
        daemon_pid: daemon.pid(),
        node: daemon.node().to_string(),
        readonly: daemon.readonly(),
    }))
}

/// `subscribe`'s fields checked: `dedicated` is for a connection subscribed to telemetry alone.
pub fn subscribe_check(telemetry: bool, events: bool, dedicated: bool) -> Result<(), RequestError> {
    if dedicated && (!telemetry || events) {
        return Err(RequestError::new(
            ErrorCode::BadRequest,
            "`dedicated` is for a connection subscribed to telemetry alone \
             (`\"telemetry\":true`, no `events`)",
        ));
    }
    Ok(())
}
