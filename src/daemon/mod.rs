//! `gpupilot daemon`: the one process per `GPUPILOT_HOME` that owns telemetry sampling,
//! history, runs and the node's event log. The TUI and every CLI command are its clients over
//! a Unix socket (`$RUNTIME/daemon.sock`, see [`crate::protocol`]).
//!
//! - `lock`: the runtime directory (0700), the lock file that makes a second daemon refuse to
//!   start, and the socket (0600).
//! - `auth`: who is on the other end of a connection (SO_PEERCRED) and whether they may act:
//!   on a user's daemon, that user and root; on the system daemon (`--system`, root's, socket
//!   0666 in a 0755 directory), everyone watches, root and one group change GPU settings.
//! - `events`: the node's `$STATE/events.jsonl` and the live feed of it.
//! - `runs`: the table of supervised runs: poll, list, resolve an id prefix.
//! - `state`: [`Daemon`], the shared state, and [`Daemon::answer`], every request but the
//!   subscriptions answered synchronously (tests call it without a socket).
//! - `ops`: the requests that act on runs (start, stop, pause, resume, logs, events), each
//!   change recorded with who, old → new and why.
//! - `control`: the GPU-settings requests (power caps, clock locks, the driver's target
//!   temperature) through the control handle, originals recorded before the first change.
//! - `server`: the accept loop and one task per connection (framing, handshake, pushes).
//! - `logs`: reading a chunk of a run's log for `logs -f`.
//! - `detach`: `--detach`, starting the daemon in its own session in the background.
//! - `logging`: tracing to `$STATE/daemon.log`.
//! - `metrics`: Prometheus `/metrics` over HTTP (`--metrics-addr`), the page from
//!   [`crate::exporter`].
//!
//! Runs survive the daemon by design: they run in their own sessions and write their own log
//! files, so a daemon that exits, crashes or is killed with SIGKILL leaves them running; the
//! next daemon re-adopts them from their directories. On SIGTERM or SIGINT the daemon stops
//! accepting, tells its clients, removes its socket and releases its lock; it never stops a
//! run on the way out. SIGHUP is ignored: a dropped terminal must not take the daemon along.

mod auth;
mod control;
mod control_loop;
pub mod detach;
mod events;
mod lock;
pub mod logging;
mod logs;
mod metrics;
mod ops;
mod run_power;
mod runs;
mod server;
mod state;
mod trainers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

pub use auth::{
    Access, DEFAULT_GROUP, GroupEntry, Identity, Mode, Peer, Verdict, decide, group_entry,
    peer_allowed, refusal_message,
};
pub use lock::{DaemonLock, lock_holder, prepare_private_dir, prepare_shared_dir};
pub use logs::utf8_cut;
pub use metrics::{DEFAULT_ADDR as DEFAULT_METRICS_ADDR, parse_addr as parse_metrics_addr};
pub use state::{Daemon, RequestError};

use crate::config::Paths;
use crate::telemetry::{Sampler, SamplerConfig, Source};

/// The socket's file name in the runtime directory.
pub const SOCKET_NAME: &str = "daemon.sock";
/// The lock file's name in the runtime directory (it holds the daemon's pid).
pub const LOCK_NAME: &str = "daemon.lock";
/// The daemon's log in the state directory.
pub const LOG_NAME: &str = "daemon.log";

/// How often runs are polled for exits, grace periods and backoffs.
const POLL_EVERY: Duration = Duration::from_millis(100);

/// Where the daemon's socket is for these paths.
pub fn socket_path(paths: &Paths) -> PathBuf {
    paths.runtime.join(SOCKET_NAME)
}

/// Where the daemon logs for these paths.
pub fn log_path(paths: &Paths) -> PathBuf {
    paths.state.join(LOG_NAME)
}

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

/// Run the daemon until SIGTERM or SIGINT. Blocks; builds its own tokio runtime.
pub fn run(opts: DaemonOptions) -> Result<(), DaemonError> {
    match opts.system_group {
        Some(_) => prepare_shared_dir(&opts.paths.runtime)?,
        None => prepare_private_dir(&opts.paths.runtime)?,
    }
    prepare_private_dir(&opts.paths.state)?;
    let lock = DaemonLock::acquire(&opts.paths)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gpupilot-daemon")
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
    // Sampling runs on the sampler's own threads; one more thread feeds history and pushes.
    let sampler = source.map(|s| {
        let sampler = Sampler::start(s, SamplerConfig::every(period));
        daemon.take_snapshot(sampler.latest());
        let rx = sampler.subscribe();
        let d = Arc::clone(&daemon);
        std::thread::Builder::new()
            .name("daemon-history".into())
            .spawn(move || {
                for snap in rx.iter() {
                    d.take_snapshot(snap);
                }
            })
            .expect("spawning the history thread");
        sampler
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

    let exporter = match opts.metrics_addr {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                tracing::info!("Prometheus metrics at http://{addr}/metrics");
                Some(tokio::spawn(metrics::serve(
                    Arc::clone(&daemon),
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
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(3), server).await;
    let _ = poller.await;
    if let Some(e) = exporter {
        let _ = e.await;
    }
    daemon.control_loop_stopping();
    daemon.control_stopping();
    daemon.stopped(&reason);
    if let Err(e) = std::fs::remove_file(&socket) {
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

async fn poll_runs(daemon: Arc<Daemon>, shutdown: CancellationToken) {
    let mut every = tokio::time::interval(POLL_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = every.tick() => {
                // With every run finished there is nothing to poll: skip the hop to the
                // blocking pool (ten thread wake-ups a second on an idle node).
                if !daemon.runs_to_poll() {
                    continue;
                }
                let d = Arc::clone(&daemon);
                // /proc reads and file writes: off the async workers.
                let _ = tokio::task::spawn_blocking(move || d.poll_runs()).await;
            }
        }
    }
}
