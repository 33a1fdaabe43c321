//! What every part of the daemon uses, and nothing of the daemon's own: [`RequestError`], a
//! request refused with the protocol's error code; [`DaemonError`], why the daemon could not
//! start (and [`home_description`], how its paths are named in messages); and [`lock`], a
//! mutex taken whether or not a panicking holder poisoned it (the daemon's state stays usable;
//! each part keeps its own invariants under its locks).

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use crate::config::Paths;
use crate::protocol::{ErrorCode, Response};
use crate::supervisor::SupervisorError;

/// A request the daemon refuses, with the protocol's error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    pub code: ErrorCode,
    pub message: String,
}

impl RequestError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> RequestError {
        RequestError {
            code,
            message: message.into(),
        }
    }

    pub fn into_response(self) -> Response {
        Response::Error {
            code: self.code,
            message: self.message,
        }
    }
}

impl From<SupervisorError> for RequestError {
    fn from(e: SupervisorError) -> RequestError {
        let code = match &e {
            SupervisorError::BadState { .. } => ErrorCode::BadState,
            SupervisorError::Launch(_) => ErrorCode::LaunchFailed,
            SupervisorError::Profile { .. } => ErrorCode::BadRequest,
            SupervisorError::Io { .. } => ErrorCode::Internal,
        };
        RequestError::new(code, e.to_string())
    }
}

/// `m`'s guard, poisoned or not.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why the daemon could not start (or stopped badly).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("a gpupilot daemon is already running for {home} ({pid}); its socket is {}", socket.display())]
    AlreadyRunning {
        /// `GPUPILOT_HOME=/x` or the runtime directory.
        home: String,
        /// `pid 1234`, or `pid unknown` when it has not written it yet.
        pid: String,
        socket: PathBuf,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Unsafe(String),
    #[error("{0}")]
    Detach(String),
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

/// How the paths are named in messages: `GPUPILOT_HOME=/x` when it is set, else the runtime
/// directory.
pub fn home_description(paths: &Paths) -> String {
    match std::env::var_os("GPUPILOT_HOME").filter(|h| !h.is_empty()) {
        // Only when these are its paths (the system daemon's are not).
        Some(h) if paths.runtime == std::path::Path::new(&h).join("run") => {
            format!("GPUPILOT_HOME={}", h.to_string_lossy())
        }
        _ => format!("runtime directory {}", paths.runtime.display()),
    }
}
