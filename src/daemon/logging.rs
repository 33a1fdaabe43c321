//! The daemon's log: tracing to `$STATE/daemon.log`, and to stderr too while it runs in the
//! foreground. Never to stdout, which a detached daemon does not have.
//!
//! A plain appending file through tracing-subscriber's writer is enough at the daemon's volume
//! (a few lines per run and per refused connection), so tracing-appender's background thread
//! and rotation are not needed; `GPUPILOT_LOG` (an env-filter, default `info`) sets the level.
//! The file is opened as [`safe_fs::open_append`] does: never through a link, only one of ours.
//!
//! A line holds what peers said (a process name, a reason, a run's command): every field is
//! written [`printable`], so a newline cannot forge a line and an escape sequence cannot reach
//! the terminal of whoever reads the log.

use std::path::Path;
use std::sync::Mutex;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::safe_fs;
use crate::text::printable;

/// Install the daemon's subscriber. `foreground`: also write to stderr. A log file that cannot
/// be opened is reported on stderr and the daemon goes on.
pub fn init(log_file: &Path, foreground: bool) {
    let filter = EnvFilter::try_from_env("GPUPILOT_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let file_layer = match safe_fs::open_append(log_file) {
        Ok(f) => Some(layer(Mutex::new(f), false)),
        Err(e) => {
            // A refusal names the file itself.
            match safe_fs::refusal(&e) {
                Some(r) => eprintln!("gpupilot daemon: not logging to a file: {r}"),
                None => eprintln!("gpupilot daemon: cannot write {}: {e}", log_file.display()),
            }
            None
        }
    };
    let stderr_layer = foreground.then(|| layer(std::io::stderr, true));
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(file_layer)
        .with(stderr_layer)
        .try_init();
}

/// A layer that writes one line per event to `writer`, every field [`printable`]; `terminal`:
/// the writer is a terminal (stderr), with colours and without the target.
fn layer<S, W>(writer: W, terminal: bool) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let fields = tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = printable(&format!("{value:?}"));
        if field.name() == "message" {
            write!(w, "{text}")
        } else {
            write!(w, "{field}={text}")
        }
    })
    .delimited(" ");
    tracing_subscriber::fmt::layer()
        .fmt_fields(fields)
        .with_ansi(terminal)
        .with_target(!terminal)
        .with_writer(writer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_peers_words_stay_on_one_line() {
        let buf = Shared::default();
        let out = buf.clone();
        let sub = tracing_subscriber::registry().with(layer(move || out.clone(), false));
        let by = "root (uid 0) via gp\u{1b}[2J\nFAKE (pid 7)";
        tracing::subscriber::with_default(sub, || {
            tracing::warn!("{by}: asked too often");
            tracing::warn!(why = "a\nb\u{202e}", run = %"r\r1", "refused");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        // Each line after its time stamp.
        let lines: Vec<&str> = text
            .lines()
            .map(|l| l.split_once(" WARN ").map_or(l, |(_, rest)| rest))
            .collect();
        assert_eq!(
            lines,
            [
                "gpupilot::daemon::logging::tests: root (uid 0) via gp\\x1b[2J\\nFAKE (pid 7): \
                 asked too often",
                "gpupilot::daemon::logging::tests: refused why=\"a\\nb\\u{202e}\" run=r\\r1",
            ]
        );
        assert!(text.ends_with('\n'), "{text:?}");
    }
}
