//! `status` and `history`: the daemon, its telemetry and the newest snapshot; a window of one
//! GPU's series.

use std::sync::atomic::Ordering;

use super::{Class, Sender, not_of};
use crate::daemon::auth::Access;
use crate::daemon::base::RequestError;
use crate::daemon::state::Daemon;
use crate::protocol::{self, DaemonInfo, Request, Response, RunCounts, StatusReply};
use crate::time::rfc3339;

pub(super) fn class(request: &Request) -> Option<Class> {
    match request {
        Request::Status {} | Request::History { .. } => {
            Some(Class::new(Sender::Client, Access::Watch, false))
        }
        _ => None,
    }
}

/// Whether `request` is answered on the connection's own task rather than in the blocking
/// pool: `history` reads memory only (the history's lock is held just for a snapshot's
/// appends), so it skips the hop there and back.
pub fn answered_inline(request: &Request) -> bool {
    matches!(request, Request::History { .. })
}

pub(super) fn answer(daemon: &Daemon, request: Request) -> Result<Response, RequestError> {
    match request {
        Request::Status {} => Ok(Response::Status(Box::new(status(daemon)))),
        Request::History {
            gpu,
            metric,
            from,
            to,
            max_points,
        } => {
            let max = max_points.min(protocol::MAX_HISTORY_POINTS) as usize;
            let points = daemon.telemetry.window(gpu as usize, metric, from, to, max);
            Ok(Response::History {
                gpu,
                metric,
                points,
            })
        }
        other => Err(not_of("node", &other)),
    }
}

fn status(d: &Daemon) -> StatusReply {
    let (live, total) = d.runs.counts();
    StatusReply {
        daemon: DaemonInfo {
            pid: d.pid(),
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: protocol::VERSION,
            node: d.node().to_string(),
            started_at: rfc3339(d.started_at),
            uptime_s: d.started.elapsed().as_secs_f64(),
            readonly: d.readonly(),
            uid: d.uid(),
            state_dir: d.paths.state.clone(),
            socket: d.socket().to_path_buf(),
            clients: d.clients.load(Ordering::Relaxed),
        },
        telemetry: d.telemetry.info().clone(),
        snapshot: d.telemetry.newest().as_deref().cloned(),
        runs: RunCounts { live, total },
        control: Some(d.control.status()),
    }
}
