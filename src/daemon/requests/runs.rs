//! The supervised runs: `runs` (the table, or one run), `run_start`, `run_stop`, `run_signal`,
//! `logs`, `run_events` and `run_metrics`. Each change is recorded with who, old → new and why
//! (`super::super::runs`).

use super::{Class, Sender, not_of};
use crate::daemon::auth::Access;
use crate::daemon::base::RequestError;
use crate::daemon::runs::ops::recheck;
use crate::daemon::state::Daemon;
use crate::ipc::Peer;
use crate::profile::Profile;
use crate::protocol::{Request, Response, RunInfo};
use crate::supervisor::{Caller, KnobValues, LaunchOptions};

pub(super) fn class(request: &Request) -> Option<Class> {
    use Access::{Runs, Watch};
    let (access, changes) = match request {
        Request::Runs { .. } => (Watch, false),
        Request::RunStart { .. } | Request::RunStop { .. } | Request::RunSignal { .. } => {
            (Runs, true)
        }
        Request::Logs { .. } | Request::RunEvents { .. } | Request::RunMetrics { .. } => {
            (Runs, false)
        }
        _ => return None,
    };
    Some(Class::new(Sender::Client, access, changes))
}

pub(super) fn answer(
    daemon: &Daemon,
    peer: &Peer,
    request: Request,
) -> Result<Response, RequestError> {
    let runs = &daemon.runs;
    match request {
        Request::Runs { run: None, live } => Ok(Response::Runs {
            runs: if live { runs.list_live() } else { runs.list() },
        }),
        Request::Runs {
            run: Some(spec), ..
        } => runs
            .info(&spec)
            .map(|info| Response::Runs { runs: vec![info] }),
        Request::RunStart {
            profile,
            caller,
            knobs,
            why,
        } => start(daemon, peer, &profile, &caller, knobs, why)
            .map(|run| Response::RunStarted { run }),
        Request::RunStop {
            run,
            kill,
            grace_s,
            why,
        } => runs
            .stop_run(peer, &run, kill, grace_s, why)
            .map(|run| Response::RunChanged { run }),
        Request::RunSignal { run, signal, why } => runs
            .signal_run(peer, &run, signal, why)
            .map(|run| Response::RunChanged { run }),
        Request::Logs {
            run,
            stream,
            offset,
            max_bytes,
        } => runs.logs(&run, stream, offset, max_bytes),
        Request::RunEvents { run, since, max } => runs.run_events(&run, since, max),
        Request::RunMetrics { run, since, max } => runs.run_metrics(&run, since, max),
        other => Err(not_of("runs", &other)),
    }
}

/// `run_start`: the run's power cap (`control::run_power`) set before its process starts,
/// then the run started and in the table.
fn start(
    daemon: &Daemon,
    peer: &Peer,
    profile: &Profile,
    caller: &Caller,
    knobs: KnobValues,
    why: Option<String>,
) -> Result<RunInfo, RequestError> {
    let profile = recheck(profile)?;
    // `[power] cap_w`: checked and set before the process starts (see `run_power`).
    let cap = daemon.control.run_cap_before_start(&profile, caller)?;
    // Started without the table locked: spawning waits (briefly) for the new session. Its
    // trainer may attach before the run is in the table: `launching` tells it to wait.
    let launching = daemon.runs.launching();
    let options = LaunchOptions {
        socket: Some(daemon.socket().to_path_buf()),
        node: Some(daemon.node().to_string()),
        knobs,
        // Each attempt under a monitor (this binary): its exit status survives us.
        monitor: crate::supervisor::launch::monitor_program(),
    };
    let run = match daemon.runs.spawn(&profile, caller, &options) {
        Ok(run) => run,
        Err(e) => {
            daemon.control.run_cap_undo(cap);
            return Err(e.into());
        }
    };
    daemon.control.run_cap_started(&run, cap);
    record_environment(daemon, &run);
    Ok(daemon.runs.started(run, launching, peer, why))
}

/// `environment.json` into a new run's directory (host, driver, CUDA, GPU models, the
/// daemon's version) for its report; a failure is logged, never fatal.
fn record_environment(daemon: &Daemon, run: &crate::supervisor::Run) {
    let dir = run.dir();
    let gpus = crate::report::model::run_gpus(dir, None);
    let snap = daemon.telemetry.newest();
    let env = crate::report::Environment::from_snapshot(
        snap.as_deref(),
        gpus.as_deref(),
        std::time::SystemTime::now(),
    );
    if let Err(e) = crate::report::environment::write(dir.path(), &env) {
        tracing::warn!("run {}: environment not recorded: {e}", run.id());
    }
}
