//! What every part of the daemon uses, and nothing of the daemon's own: [`RequestError`], a
//! request refused with the protocol's error code, and [`lock`], a mutex taken whether or not a
//! panicking holder poisoned it (the daemon's state stays usable; each part keeps its own
//! invariants under its locks).

use std::sync::{Mutex, MutexGuard};

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
