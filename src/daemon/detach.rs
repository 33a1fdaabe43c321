//! `gpupilot daemon --detach`: start the daemon in the background, in a session of its own
//! (so no terminal's hangup reaches it), and return once it answers on its socket.
//!
//! The crate has no `unsafe`, so there is no fork: the current binary is started again as
//! `gpupilot daemon … --new-session`, with stdin from /dev/null, stdout and stderr appended to
//! `$STATE/daemon.log` and `/` as its working directory; it calls setsid(2) first thing.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::base::{DaemonError, home_description, io_err};
use super::lock::fs_err;
use super::lock::{lock_holder, prepare_private_dir};
use crate::client::Client;
use crate::config::Paths;
use crate::config::safe_fs;
use crate::ipc::{log_path, socket_path};

/// How long `--detach` waits for the new daemon to answer.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// The hidden flag the detached daemon is started with: call setsid(2) first.
pub const NEW_SESSION_FLAG: &str = "--new-session";

/// Start `exe daemon ARGS --new-session` in the background and wait (at most `within`) until it
/// answers a hello; return its pid. `args` are the daemon's options (`--readonly`, `--rate`,
/// the global `--source` and simulator options), without `--detach`.
pub fn spawn(
    paths: &Paths,
    exe: &Path,
    args: &[OsString],
    within: Duration,
) -> Result<u32, DaemonError> {
    if let Some(pid) = lock_holder(paths) {
        return Err(DaemonError::AlreadyRunning {
            home: home_description(paths),
            pid: format!("pid {pid}"),
            socket: socket_path(paths),
        });
    }
    prepare_private_dir(&paths.state)?;
    let log = log_path(paths);
    let open_log =
        || safe_fs::open_append(&log).map_err(fs_err(format!("opening {}", log.display())));
    let mut cmd = Command::new(exe);
    cmd.arg("daemon")
        .args(args)
        .arg(NEW_SESSION_FLAG)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(open_log()?)
        .stderr(open_log()?);
    // The daemon works from `/`: a relative GPUPILOT_HOME must not change meaning.
    if let Some(home) = std::env::var_os("GPUPILOT_HOME").filter(|h| !h.is_empty()) {
        let abs = std::path::absolute(&home).map_err(io_err("resolving GPUPILOT_HOME"))?;
        cmd.env("GPUPILOT_HOME", abs);
    }
    // `--system` is passed as an argument when meant; an inherited GPUPILOT_SYSTEM=1 must not
    // turn a user's daemon into an attempt at the system daemon.
    cmd.env_remove("GPUPILOT_SYSTEM");
    if let Some(dir) = std::env::var_os("GPUPILOT_SYSTEM_DIR").filter(|d| !d.is_empty()) {
        let abs = std::path::absolute(&dir).map_err(io_err("resolving GPUPILOT_SYSTEM_DIR"))?;
        cmd.env("GPUPILOT_SYSTEM_DIR", abs);
    }
    let mut child = cmd
        .spawn()
        .map_err(io_err(format!("starting {} daemon", exe.display())))?;
    let pid = child.id();
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(DaemonError::Detach(format!(
                "the daemon exited at once ({status}); the end of its log ({}):\n{}",
                log.display(),
                log_tail(&log, 10)
            )));
        }
        if Client::connect(paths).is_ok() {
            return Ok(pid);
        }
        if Instant::now() >= deadline {
            return Err(DaemonError::Detach(format!(
                "the daemon (pid {pid}) did not answer within {} s; see {}",
                within.as_secs(),
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last `n` lines of a log (for messages), from its last 64 KiB: a log of months is not
/// read whole for ten lines, nor one that is not a regular file of ours.
fn log_tail(path: &Path, n: usize) -> String {
    let Ok((bytes, from)) =
        safe_fs::open_read(path).and_then(|mut f| safe_fs::read_end(&mut f, 64 << 10, 0))
    else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<&str> = text.lines().collect();
    if from > 0 && lines.len() > 1 {
        // Most likely the middle of a line.
        lines.remove(0);
    }
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_long_log_is_its_last_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("daemon.log");
        let text: String = (0..50_000).map(|i| format!("line {i}\n")).collect();
        assert!(text.len() as u64 > 4 * (64 << 10));
        safe_fs::write_atomic(&log, text.as_bytes()).unwrap();
        let want: Vec<String> = (49_990..50_000).map(|i| format!("line {i}")).collect();
        assert_eq!(log_tail(&log, 10), want.join("\n"));
        safe_fs::write_atomic(&log, b"one\ntwo\n").unwrap();
        assert_eq!(log_tail(&log, 10), "one\ntwo");
        assert_eq!(log_tail(&tmp.path().join("none"), 10), "");
    }
}
