//! `tune_start`, `tune_status`, `tune_stop`: energy-tuning jobs, searched by the daemon (see
//! `super::super::tune`).

use super::{Class, Sender, not_of};
use crate::daemon::auth::Access;
use crate::daemon::base::RequestError;
use crate::daemon::state::Daemon;
use crate::protocol::{Request, Response};

pub(super) fn class(request: &Request) -> Option<Class> {
    use Access::{GpuSettings, Watch};
    let (access, changes) = match request {
        Request::TuneStart { .. } => (GpuSettings, true),
        Request::TuneStatus { .. } => (Watch, false),
        Request::TuneStop { .. } => (GpuSettings, true),
        _ => return None,
    };
    Some(Class::new(Sender::Client, access, changes))
}

pub(super) fn answer(daemon: &Daemon, request: Request) -> Result<Response, RequestError> {
    let tuning = &daemon.tuning;
    match request {
        Request::TuneStart { run, settings } => tuning
            .start(&run, settings)
            .map(|job| Response::TuneJobs { jobs: vec![job] }),
        Request::TuneStatus { job } => tuning
            .status(job.as_deref())
            .map(|jobs| Response::TuneJobs { jobs }),
        Request::TuneStop { job } => tuning
            .stop(&job)
            .map(|job| Response::TuneJobs { jobs: vec![job] }),
        other => Err(not_of("tuning", &other)),
    }
}
