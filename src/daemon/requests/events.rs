//! `events`: the node's event log, from a sequence number on.

use super::{Class, Sender, not_of};
use crate::daemon::auth::Access;
use crate::daemon::base::RequestError;
use crate::daemon::state::Daemon;
use crate::protocol::{self, Request, Response};

pub(super) fn class(request: &Request) -> Option<Class> {
    match request {
        Request::Events { .. } => Some(Class::new(Sender::Client, Access::Watch, false)),
        _ => None,
    }
}

pub(super) fn answer(daemon: &Daemon, request: Request) -> Result<Response, RequestError> {
    match request {
        Request::Events { since, max } => {
            let max = max
                .unwrap_or(protocol::MAX_EVENTS)
                .min(protocol::MAX_EVENTS);
            let (events, next) = daemon.events().since(since, max as usize);
            Ok(Response::Events { events, next })
        }
        other => Err(not_of("events", &other)),
    }
}
