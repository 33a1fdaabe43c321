//! `gpupilot daemon`: the one process per `GPUPILOT_HOME` that owns telemetry sampling,
//! history, runs and the node's event log. The TUI and every CLI command are its clients over
//! a Unix socket (`$RUNTIME/daemon.sock`, see [`crate::protocol`]).
//!
//! Its parts, bottom to top (the layers `layers_tests.rs` checks: a part uses only the parts
//! of the layers below its own):
//!
//! - `base`: what every part uses: [`RequestError`], [`DaemonError`] and the poison-tolerant
//!   mutex `lock`.
//! - `logging`: tracing to `$STATE/daemon.log`.
//! - `events`: the node's `$STATE/events.jsonl` and the live feed of it.
//! - `auth`: who is on the other end of a connection (SO_PEERCRED) and whether they may act:
//!   on a user's daemon, that user and root; on the system daemon (`--system`, root's, socket
//!   0666 in a 0755 directory), everyone watches, root and one group change GPU settings.
//! - `lock`: the runtime directory (0700), the lock file that makes a second daemon refuse to
//!   start, and the socket (0600).
//! - `telemetry`: the newest snapshot, which subscribers follow, and every GPU's history.
//! - `runs`: the table of supervised runs (poll, list, resolve an id prefix), what acts on
//!   them (start, stop, pause, resume, logs, events, each change recorded with who, old → new
//!   and why), and each run's trainer channel (knobs, metrics, ranks).
//! - `control`: the GPU settings (power caps, clock locks, the driver's target temperature)
//!   through the control handle, originals recorded before the first change; the control
//!   loops at every snapshot; the caps runs' profiles set; limits changed outside.
//! - `tune`: energy-tuning jobs (`tune energy`), searched by the daemon, recorded under
//!   `$STATE/tune` and resumed (or their caps restored) by the next daemon.
//! - `state`: [`Daemon`], the parts together, and what crosses them (a snapshot through
//!   history, the control loops and out).
//! - `requests`: every request in its family, a module each (connection, node, events, runs,
//!   trainer and knobs, control, tuning) with the requests' classification (who sends it, who
//!   may, whether it changes something) and their handler; [`Daemon::answer`] sends a client's
//!   request to its family.
//! - `relay`: a trainer of another node's run, relayed to that node's daemon over SSH.
//! - `server`: the accept loop and one task per connection: framing, bounds, who may, then
//!   the request to its family; telemetry pushes.
//! - `metrics`: Prometheus `/metrics` over HTTP (`--metrics-addr`), the page from
//!   [`crate::exporter`].
//! - `detach`: `--detach`, starting the daemon in its own session in the background.
//! - `stop`: `daemon stop`, SIGTERM to the process that holds the lock, once it is known to be
//!   a gpupilot daemon the caller may signal, and a bounded wait for it to go.
//!
//! Runs survive the daemon by design: they run in their own sessions and write their own log
//! files, so a daemon that exits, crashes or is killed with SIGKILL leaves them running; the
//! next daemon re-adopts them from their directories. On SIGTERM or SIGINT the daemon stops
//! accepting, tells its clients, removes its socket and releases its lock; it never stops a
//! run on the way out. SIGHUP is ignored: a dropped terminal must not take the daemon along.

mod auth;
mod base;
mod control;
pub mod detach;
mod events;
mod lock;
pub mod logging;
mod metrics;
mod relay;
mod requests;
mod runs;
mod server;
mod state;
pub mod stop;
mod telemetry;
mod tune;

#[cfg(test)]
mod layers_tests;

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

pub use crate::config::prometheus::parse_metrics_addr;
use crate::ipc::socket_path;
pub use auth::{
    Access, DEFAULT_GROUP, GroupEntry, Identity, Mode, Verdict, decide, group_entry,
    refusal_message,
};
use base::io_err;
pub use base::{DaemonError, RequestError, home_description};
pub use lock::{DaemonLock, LOCK_NAME, lock_holder, prepare_private_dir, prepare_shared_dir};
pub use metrics::DEFAULT_ADDR as DEFAULT_METRICS_ADDR;
pub use runs::logs::utf8_cut;
pub use runs::trainer_output::parse_line as parse_output_line;
pub use runs::trainers::Attach;
pub use state::Daemon;

use crate::config::Paths;
use crate::telemetry::{Sampler, SamplerConfig, Source};

/// How often runs are polled for exits, grace periods and backoffs.
const POLL_EVERY: Duration = Duration::from_millis(100);

/// How long an idle thread of the blocking pool waits for more work before it exits. Tokio's
/// default, 10 s, is the interval at which a console on a quiet node polls (and Prometheus
/// scrapes every 15 s to a minute): each poll found the thread gone and made a new one (a
/// clone, a fresh stack and its first pages faulted in, the old stack unmapped). Two minutes
/// outlast those intervals, and a parked thread costs nothing while it waits.
pub const BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(120);

/// How a daemon is set up.
pub struct DaemonOptions {
    pub paths: Paths,
    /// The telemetry source, or why there is none (the daemon supervises runs regardless).
    pub source: Result<Arc<dyn Source>, String>,
    /// Samples per second.
    pub rate_hz: f64,
    /// Refuse every request that changes something.
    pub readonly: bool,
    /// Power caps, clock locks and target temperatures: the same object as `source`.
    pub control: Option<Arc<dyn crate::control::power::GpuControl>>,
    /// Restore the recorded original GPU settings when the daemon stops.
    pub restore_on_exit: bool,
    /// Serve as the system daemon (`--system`): the group whose members may change GPU
    /// settings. None: a user's own daemon.
    pub system_group: Option<String>,
    /// Where to serve Prometheus `/metrics` (None: not at all). See `metrics`.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// How `/metrics` spells the node's label (`[exporter] hostname_label`).
    pub metrics_hostname_label: crate::config::prometheus::HostnameLabel,
}

/// Run the daemon until SIGTERM or SIGINT. Blocks; builds its own tokio runtime.
pub fn run(opts: DaemonOptions) -> Result<(), DaemonError> {
    match opts.system_group {
        Some(_) => prepare_shared_dir(&opts.paths.runtime)?,
        None => prepare_private_dir(&opts.paths.runtime)?,
    }
    prepare_private_dir(&opts.paths.state)?;
    let lock = DaemonLock::acquire(&opts.paths)?;
    // One worker: the daemon's async side is small (framing, pushes, answers from memory),
    // and a second worker mostly woke to find nothing to steal. Blocking work (runs, files,
    // NVML calls) goes to the blocking pool, sampling and history to threads of their own.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("gpupilot-daemon")
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .enable_all()
        .build()
        .map_err(io_err("starting the daemon's runtime"))?;
    let result = rt.block_on(serve(opts));
    // Let blocking tasks (a run start in flight) finish, but not forever.
    rt.shutdown_timeout(Duration::from_secs(3));
    drop(lock);
    result
}

async fn serve(opts: DaemonOptions) -> Result<(), DaemonError> {
    let socket = socket_path(&opts.paths);
    let listener = lock::bind(&socket)?;
    if opts.system_group.is_some() {
        lock::share_socket(&socket)?;
        if let Some(closed) = lock::closed_ancestor(&opts.paths.runtime) {
            tracing::warn!(
                "{} is closed to other users (no o+x): they cannot reach {}; `chmod o+x` it",
                closed.display(),
                socket.display()
            );
        }
    }
    let period = Duration::from_secs_f64(1.0 / opts.rate_hz.clamp(0.01, 100.0));
    let (source, telemetry_error) = match opts.source {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(e)),
    };
    let daemon = Arc::new(Daemon::new(
        opts.paths.clone(),
        socket.clone(),
        opts.readonly,
        opts.rate_hz,
        source.as_ref().map(|s| s.gpu_count()),
        source.as_ref().map(|s| s.node_info().source),
        telemetry_error,
    )?);
    if let Some(control) = opts.control {
        daemon.attach_control(control, opts.restore_on_exit)?;
    }
    if let Some(s) = &source {
        daemon.tuning_reads_from(Arc::clone(s));
    }
    // Sampling runs on the sampler's own threads; the one that assembles each snapshot also
    // takes it into history, the control loops and the pushes (the first one before this
    // goes on), so a sample wakes no thread of the daemon's own.
    let sampler = source.map(|s| {
        let d = Arc::clone(&daemon);
        Sampler::start_with_sink(s, SamplerConfig::every(period), move |snap| {
            d.take_snapshot(snap)
        })
    });
    tracing::info!(
        pid = std::process::id(),
        socket = %socket.display(),
        readonly = opts.readonly,
        system = opts.system_group.is_some(),
        "daemon started"
    );
    let mode = match opts.system_group {
        Some(group) => {
            match group_entry(&group) {
                Some(g) => tracing::info!(
                    "system daemon: every local user may watch; root and group {} (gid {}) may \
                     change GPU settings; runs are root's",
                    g.name,
                    g.gid
                ),
                None => tracing::warn!(
                    "system daemon: group {group} does not exist, so only root may change GPU \
                     settings until it does (`groupadd {group}`, or --allow-group)"
                ),
            }
            Mode::System { group }
        }
        None => Mode::User { uid: daemon.uid() },
    };

    let shutdown = CancellationToken::new();
    let poller = tokio::spawn(poll_runs(Arc::clone(&daemon), shutdown.clone()));
    let server = tokio::spawn(server::accept_loop(
        Arc::clone(&daemon),
        listener,
        shutdown.clone(),
        Arc::new(mode),
    ));
    daemon.tuning_resume();

    let exporter = match opts.metrics_addr {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                tracing::info!("Prometheus metrics at http://{addr}/metrics");
                Some(tokio::spawn(metrics::serve(
                    Arc::clone(&daemon),
                    opts.metrics_hostname_label,
                    l,
                    shutdown.clone(),
                )))
            }
            // The daemon's work goes on without the endpoint.
            Err(e) => {
                tracing::warn!(
                    "no Prometheus metrics: cannot listen on {addr}: {e}; pick another address \
                     with --metrics-addr ADDR:PORT (or `off`)"
                );
                None
            }
        },
        None => None,
    };

    let reason = wait_for_signal().await?;
    tracing::info!(%reason, "shutting down; runs keep running");
    // While the socket still answers: the jobs put their caps back through it.
    let d = Arc::clone(&daemon);
    let _ = tokio::task::spawn_blocking(move || d.tuning_stopping()).await;
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(3), server).await;
    let _ = poller.await;
    if let Some(e) = exporter {
        let _ = e.await;
    }
    daemon.control_loop_stopping();
    daemon.control_stopping();
    daemon.stopped(&reason);
    // Only our socket: whatever else another process put there is left (and said).
    if let Err(e) = crate::config::safe_fs::remove_stale_socket(&socket) {
        tracing::warn!("removing {}: {e}", socket.display());
    }
    drop(sampler);
    Ok(())
}

/// SIGTERM or SIGINT ends the daemon; SIGHUP is logged and ignored.
async fn wait_for_signal() -> Result<String, DaemonError> {
    let what = "installing signal handlers";
    let mut term = signal(SignalKind::terminate()).map_err(io_err(what))?;
    let mut int = signal(SignalKind::interrupt()).map_err(io_err(what))?;
    let mut hup = signal(SignalKind::hangup()).map_err(io_err(what))?;
    loop {
        tokio::select! {
            _ = term.recv() => return Ok("SIGTERM".into()),
            _ = int.recv() => return Ok("SIGINT".into()),
            _ = hup.recv() => {
                tracing::info!("SIGHUP ignored: the daemon outlives the terminal that started it");
            }
        }
    }
}

/// Poll live runs every [`POLL_EVERY`]; with none live, sleep until a run is started (runs
/// adopted at start are in the table before this begins, so the first check sees them).
async fn poll_runs(daemon: Arc<Daemon>, shutdown: CancellationToken) {
    let mut every = tokio::time::interval(POLL_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if !daemon.runs_to_poll() {
            // No timer while idle: an idle daemon wakes for nothing here. A start between the
            // check and this wait is not lost: `notify_one` keeps a permit for the next wait.
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = daemon.run_added().notified() => {}
            }
            // Poll at once, then every period from now.
            every.reset_immediately();
            continue;
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = every.tick() => {
                let d = Arc::clone(&daemon);
                // /proc reads and file writes: off the async workers.
                let _ = tokio::task::spawn_blocking(move || d.poll_runs()).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipc::{Peer, SOCKET_NAME};
    use crate::profile::Profile;
    use crate::protocol::{Request, Response};
    use crate::supervisor::Caller;
    use std::time::Instant;

    fn paths(dir: &std::path::Path) -> Paths {
        Paths {
            config: dir.join("config"),
            state: dir.join("state"),
            runtime: dir.join("run"),
        }
    }

    fn daemon(dir: &std::path::Path) -> Arc<Daemon> {
        let paths = paths(dir);
        std::fs::create_dir_all(&paths.state).unwrap();
        let socket = paths.runtime.join(SOCKET_NAME);
        let d = Daemon::new(paths, socket, false, 1.0, None, None, Some("none".into()));
        Arc::new(d.unwrap())
    }

    fn me() -> Peer {
        Peer {
            uid: rustix::process::getuid().as_raw(),
            gid: 0,
            pid: Some(std::process::id()),
        }
    }

    /// Start `sh -c script` as a run; its id.
    fn start(d: &Daemon, script: &str) -> String {
        let mut caller = Caller::current().unwrap();
        caller.cwd = std::env::temp_dir();
        let argv = vec!["sh".into(), "-c".into(), script.into()];
        let r = d.answer(
            &me(),
            Request::RunStart {
                profile: Box::new(Profile::from_command(argv)),
                caller,
                knobs: Default::default(),
                why: None,
            },
        );
        let Response::RunStarted { run } = r else {
            panic!("{r:?}")
        };
        run.id
    }

    fn finished(d: &Daemon, id: &str) -> bool {
        d.runs().table().get(id).unwrap().run.is_finished()
    }

    fn wait_until(limit: Duration, f: impl Fn() -> bool) -> bool {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn the_idle_poller_wakes_when_a_run_starts_and_sleeps_again_when_it_ends() {
        let tmp = tempfile::tempdir().unwrap();
        let d = daemon(tmp.path());
        let rt = runtime();
        let shutdown = CancellationToken::new();
        let poller = rt.spawn(poll_runs(Arc::clone(&d), shutdown.clone()));
        // Let the poller find nothing to poll and go to sleep.
        std::thread::sleep(Duration::from_millis(300));
        assert!(!poller.is_finished());
        // Only the poller reaps a run: an ended run stays live until it is polled.
        let first = start(&d, "exit 3");
        assert!(
            wait_until(Duration::from_secs(10), || finished(&d, &first)),
            "the poller did not wake for a started run"
        );
        // Asleep again; a second start wakes it again.
        std::thread::sleep(Duration::from_millis(300));
        let second = start(&d, "sleep 0.2");
        assert!(
            wait_until(Duration::from_secs(10), || finished(&d, &second)),
            "the poller did not wake for the second run"
        );
        shutdown.cancel();
        assert!(
            wait_until(Duration::from_secs(5), || poller.is_finished()),
            "an idle poller must stop at shutdown"
        );
    }

    #[test]
    fn the_poller_polls_runs_adopted_at_start() {
        let tmp = tempfile::tempdir().unwrap();
        let id = {
            let earlier = daemon(tmp.path());
            start(&earlier, "sleep 1")
            // That daemon goes away without polling; the run goes on.
        };
        let d = daemon(tmp.path());
        assert!(d.runs_to_poll(), "the run is adopted live");
        let rt = runtime();
        let shutdown = CancellationToken::new();
        let poller = rt.spawn(poll_runs(Arc::clone(&d), shutdown.clone()));
        assert!(
            wait_until(Duration::from_secs(10), || finished(&d, &id)),
            "an adopted run was never polled"
        );
        shutdown.cancel();
        assert!(wait_until(Duration::from_secs(5), || poller.is_finished()));
    }
}
