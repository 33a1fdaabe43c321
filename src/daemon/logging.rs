//! The daemon's log: tracing to `$STATE/daemon.log`, and to stderr too while it runs in the
//! foreground. Never to stdout, which a detached daemon does not have.
//!
//! A plain appending file through tracing-subscriber's writer is enough at the daemon's volume
//! (a few lines per run and per refused connection), so tracing-appender's background thread
//! and rotation are not needed; `GPUPILOT_LOG` (an env-filter, default `info`) sets the level.
//! The file is opened as [`safe_fs::open_append`] does: never through a link, only one of ours.

use std::path::Path;
use std::sync::Mutex;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::safe_fs;

/// Install the daemon's subscriber. `foreground`: also write to stderr. A log file that cannot
/// be opened is reported on stderr and the daemon goes on.
pub fn init(log_file: &Path, foreground: bool) {
    let filter = EnvFilter::try_from_env("GPUPILOT_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let file_layer = match safe_fs::open_append(log_file) {
        Ok(f) => Some(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(Mutex::new(f)),
        ),
        Err(e) => {
            // A refusal names the file itself.
            match safe_fs::refusal(&e) {
                Some(r) => eprintln!("gpupilot daemon: not logging to a file: {r}"),
                None => eprintln!("gpupilot daemon: cannot write {}: {e}", log_file.display()),
            }
            None
        }
    };
    let stderr_layer = foreground.then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_target(false)
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(file_layer)
        .with(stderr_layer)
        .try_init();
}
