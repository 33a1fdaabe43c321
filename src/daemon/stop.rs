//! `gpupilot daemon stop`: ask the daemon of these paths to exit, as SIGTERM does (it stops
//! accepting, tells its clients, removes its socket, releases its lock), and wait for it.
//!
//! The daemon is found by its lock ([`lock_holder`]: the pid of the process that holds the
//! lock file's flock, not merely a number in a file), and signalled only when that process
//! is a `gpupilot daemon` of the caller's (or the caller is root). Runs are never stopped
//! here: they run on in their own sessions, and the next daemon adopts them.

use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::base::home_description;
use super::lock::lock_holder;
use crate::config::Paths;
use crate::ipc::log_path;
use crate::supervisor::procfs;

/// How long `daemon stop` waits for the daemon to exit unless told otherwise: it lets
/// blocking work finish for up to 3 s after it stops serving.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// Why a daemon was not stopped.
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    #[error("no gpupilot daemon runs for {home} (nothing holds {})", lock.display())]
    NotRunning { home: String, lock: PathBuf },
    #[error(
        "pid {pid} holds the daemon's lock for {home}, but it is {what}: not signalled; see \
         what it is with `ps -o user,args -p {pid}`"
    )]
    NotOurs {
        pid: u32,
        home: String,
        what: String,
    },
    #[error("signalling the daemon (pid {pid}): {source}")]
    Signal {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the daemon (pid {pid}) was sent SIGTERM but still runs after {} s; its log is {}; \
         `kill -KILL {pid}` ends it (its runs go on)",
        waited.as_secs(), log.display()
    )]
    StillRunning {
        pid: u32,
        waited: Duration,
        log: PathBuf,
    },
}

/// A daemon that was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    pub pid: u32,
    /// `GPUPILOT_HOME=/x` or the runtime directory.
    pub home: String,
    /// How long it took to exit.
    pub took: Duration,
}

/// Stop the daemon of `paths`: SIGTERM to the process holding its lock, once it is known to
/// be a gpupilot daemon this user may signal; then wait (at most `within`) for the lock to
/// be released, which the daemon does last, and for the process to end (a zombie that its
/// parent has not reaped yet has ended).
pub fn stop(paths: &Paths, within: Duration) -> Result<Stopped, StopError> {
    let home = home_description(paths);
    let pid = lock_holder(paths).ok_or_else(|| StopError::NotRunning {
        home: home.clone(),
        lock: paths.runtime.join(super::lock::LOCK_NAME),
    })?;
    let me = rustix::process::geteuid().as_raw();
    check_is_our_daemon(pid, me).map_err(|what| StopError::NotOurs {
        pid,
        home: home.clone(),
        what,
    })?;
    let raw = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .filter(|p| p.as_raw_nonzero().get() > 1)
        .ok_or_else(|| StopError::NotOurs {
            pid,
            home: home.clone(),
            what: "not a process that may be signalled".into(),
        })?;
    // Its start time tells it from a later process given the same pid.
    let born = procfs::stat(pid).ok().map(|s| s.start_time);
    let gone = || {
        procfs::stat(pid)
            .map(|s| !s.is_running() || Some(s.start_time) != born)
            .unwrap_or(true)
    };
    let started = Instant::now();
    rustix::process::kill_process(raw, rustix::process::Signal::TERM).map_err(|e| {
        StopError::Signal {
            pid,
            source: e.into(),
        }
    })?;
    let deadline = started + within;
    loop {
        // The lock goes with the daemon's last step; the process right after it.
        if lock_holder(paths) != Some(pid) && gone() {
            return Ok(Stopped {
                pid,
                home,
                took: started.elapsed(),
            });
        }
        if Instant::now() >= deadline {
            return Err(StopError::StillRunning {
                pid,
                waited: within,
                log: log_path(paths),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `Ok` when process `pid` runs `gpupilot daemon` (its arguments say so) as user `me`, or
/// `me` is root; else what it is, in words.
fn check_is_our_daemon(pid: u32, me: u32) -> Result<(), String> {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    let owner = std::fs::metadata(&dir)
        .map_err(|e| format!("a process that cannot be looked at ({e})"))?
        .uid();
    if owner != me && me != 0 {
        return Err(format!(
            "{}'s, not yours",
            crate::ipc::user_name(owner).unwrap_or_else(|| format!("uid {owner}"))
        ));
    }
    // At most 64 KiB of arguments: a daemon's are a few hundred bytes.
    let mut args = Vec::new();
    std::fs::File::open(dir.join("cmdline"))
        .and_then(|f| f.take(64 << 10).read_to_end(&mut args))
        .map_err(|e| format!("a process whose arguments cannot be read ({e})"))?;
    if is_daemon_cmdline(&args) {
        Ok(())
    } else {
        Err(format!(
            "`{}`, not a gpupilot daemon",
            String::from_utf8_lossy(&args).replace('\0', " ").trim()
        ))
    }
}

/// Whether NUL-separated arguments are those of `gpupilot … daemon …`: a program named
/// gpupilot (or a link to it with that name in it) with `daemon` among its arguments.
fn is_daemon_cmdline(args: &[u8]) -> bool {
    let mut words = args.split(|b| *b == 0);
    let program = words.next().unwrap_or_default();
    let name = program.rsplit(|b| *b == b'/').next().unwrap_or_default();
    String::from_utf8_lossy(name).contains("gpupilot") && words.any(|w| w == b"daemon")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemons_command_line_is_told_from_others() {
        assert!(is_daemon_cmdline(
            b"/usr/bin/gpupilot\0--source\0sim\0daemon\0--new-session\0"
        ));
        assert!(is_daemon_cmdline(b"gpupilot\0daemon\0"));
        assert!(!is_daemon_cmdline(b"/usr/bin/gpupilot\0ps\0"));
        assert!(!is_daemon_cmdline(b"/usr/bin/sleep\0daemon\0"));
        assert!(!is_daemon_cmdline(b""));
        // The word itself, not a part of another.
        assert!(!is_daemon_cmdline(b"/usr/bin/gpupilot\0daemons\0"));
    }

    #[test]
    fn no_daemon_is_said_with_its_home() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = Paths {
            config: tmp.path().join("config"),
            state: tmp.path().join("state"),
            runtime: tmp.path().join("run"),
        };
        let err = stop(&paths, Duration::from_millis(10)).unwrap_err();
        assert!(matches!(err, StopError::NotRunning { .. }), "{err}");
        let text = err.to_string();
        assert!(text.starts_with("no gpupilot daemon runs for"), "{text}");
        assert!(text.contains("daemon.lock"), "{text}");
    }

    #[test]
    fn a_process_that_is_not_a_daemon_is_not_signalled() {
        // This test process: ours, but not a daemon.
        let err = check_is_our_daemon(std::process::id(), rustix::process::geteuid().as_raw())
            .unwrap_err();
        assert!(err.contains("not a gpupilot daemon"), "{err}");
        // Someone else's, for a user who is not root (uid 65534 asking about our process).
        if rustix::process::geteuid().as_raw() != 65534 {
            let err = check_is_our_daemon(std::process::id(), 65534).unwrap_err();
            assert!(err.contains("not yours"), "{err}");
        }
    }
}
