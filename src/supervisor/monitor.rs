//! The per-run monitor: a small process between the supervisor and a run's main process, so
//! that the run's exit status outlives the supervisor (as podman's conmon does for containers).
//!
//! The supervisor starts `gpupilot run-monitor RUN_DIR -- COMMAND…` (this binary; see
//! [`main_if_asked`]). The monitor
//!
//! 1. leaves the supervisor's session (setsid(2)) so nothing that ends the supervisor ends it,
//!    and makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`): a process the run starts
//!    in a session of its own (`setsid sleep …`) is reparented to the monitor when its parent
//!    ends, not to init, so it stays findable and `stop` ends it too;
//! 2. starts the command in its own session and group, as `launch::spawn` did before, and
//!    tells the supervisor its pid and start time on one line of stdout;
//! 3. waits for it, and writes how it ended to `exit.json` in the run directory (whole or not
//!    at all), whether or not a supervisor is still there to hear it;
//! 4. goes on reaping the run's leftovers, and exits when none is left.
//!
//! A supervisor that adopts the run later reads `exit.json`: the exit code, the restart policy
//! and `gpupilot run`'s exit status survive a daemon that was killed or upgraded.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::events::ExitInfo;
use super::launch;
use super::procfs;
use super::rundir::{PidRecord, RunDir};
use crate::time::rfc3339;

/// The hidden subcommand that makes this binary a monitor.
pub const SUBCOMMAND: &str = "run-monitor";

/// How long the supervisor waits for a new monitor to report its command's pid.
const REPORT_WAIT: Duration = Duration::from_secs(10);

/// `exit.json`: how an attempt's main process ended, as its monitor saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitRecord {
    /// The process (pid and start time, as in the `pid` file): which attempt this is about.
    pub pid: u32,
    pub start_time: u64,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub ended_at: String,
}

impl ExitRecord {
    pub fn exit(&self) -> ExitInfo {
        ExitInfo {
            code: self.code,
            signal: self.signal,
        }
    }
}

/// The exit record its monitor wrote (`exit.json`), whichever process it is about.
pub fn read_record(dir: &RunDir) -> Option<ExitRecord> {
    // One small object: a bounded read, never through a link.
    let bytes = crate::config::safe_fs::read_capped(&dir.exit_record_path(), 64 << 10).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The exit record of the process `rec` names, if its monitor wrote one.
fn record_of(dir: &RunDir, rec: &PidRecord) -> Option<ExitRecord> {
    read_record(dir).filter(|r| r.pid == rec.pid && r.start_time == rec.start_time)
}

/// How the process `rec` names ended, if its monitor wrote it down.
pub fn recorded_exit(dir: &RunDir, rec: &PidRecord) -> Option<ExitInfo> {
    record_of(dir, rec).map(|r| r.exit())
}

/// When the process `rec` names ended, as its monitor saw it: the time a run's end is
/// recorded with, however late a supervisor notices it.
pub fn recorded_end(dir: &RunDir, rec: &PidRecord) -> Option<SystemTime> {
    crate::time::parse_rfc3339(&record_of(dir, rec)?.ended_at)
}

/// A command just started through a monitor.
#[derive(Debug)]
pub struct Started {
    pub pid: u32,
    pub start_time: u64,
    pub own_session: bool,
    pub own_group: bool,
    pub monitor: PidRecord,
}

/// Start `plan.argv` under a monitor (`program run-monitor …`) with the plan's cwd and
/// environment, and wait for the monitor to say what it started.
pub fn start(program: &Path, plan: &launch::LaunchPlan, dir: &RunDir) -> io::Result<Started> {
    let stderr = RunDir::open_log(&dir.stderr_path())?;
    let mut child = Command::new(program)
        .arg(SUBCOMMAND)
        .arg(dir.path())
        .arg("--")
        .args(&plan.argv)
        .current_dir(&plan.cwd)
        .env_clear()
        .envs(&plan.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .spawn()?;
    let monitor_pid = child.id();
    let Some(out) = child.stdout.take() else {
        return Err(io::Error::other("the monitor's stdout was not piped"));
    };
    // One line, then the monitor is reaped whenever it ends (after its run and leftovers): a
    // thread waits for it so that it never lingers as a zombie of the supervisor.
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("gpupilot-monitor".into())
        .spawn(move || {
            let mut line = String::new();
            let read = BufReader::new(out).read_line(&mut line).map(|_| line);
            let _ = tx.send(read);
            let _ = child.wait();
        })?;
    let line = match rx.recv_timeout(REPORT_WAIT) {
        Ok(read) => read?,
        Err(_) => {
            let _ = super::signal::to_process(monitor_pid, super::signal::Sig::Kill);
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the run's monitor (pid {monitor_pid}) did not report within {} s",
                    REPORT_WAIT.as_secs()
                ),
            ));
        }
    };
    let monitor = PidRecord {
        pid: monitor_pid,
        start_time: procfs::stat(monitor_pid).map_or(0, |s| s.start_time),
        boot_id: procfs::boot_id(),
    };
    parse_report(&line, monitor)
}

/// `PID START_TIME OWN_SESSION OWN_GROUP` (0 or 1), or `error: WHY`.
fn parse_report(line: &str, monitor: PidRecord) -> io::Result<Started> {
    let line = line.trim();
    if let Some(why) = line.strip_prefix("error: ") {
        return Err(io::Error::other(why.to_string()));
    }
    let w: Vec<&str> = line.split_whitespace().collect();
    let bad = || io::Error::other(format!("the run's monitor said {line:?}"));
    match w.as_slice() {
        [pid, start, session, group] => Ok(Started {
            pid: pid.parse().map_err(|_| bad())?,
            start_time: start.parse().map_err(|_| bad())?,
            own_session: *session == "1",
            own_group: *group == "1",
            monitor,
        }),
        _ => Err(bad()),
    }
}

/// When this process was started as `gpupilot run-monitor …`, be the monitor and return its
/// exit code; else None. Called first thing in `main`, before the command line is parsed: the
/// monitor has its own two arguments and must not depend on the caller's `GPUPILOT_*`
/// variables, which its command inherits.
pub fn main_if_asked() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != SUBCOMMAND {
        return None;
    }
    let dir = PathBuf::from(args.next()?);
    if args.next().is_none_or(|a| a != "--") {
        eprintln!("gpupilot {SUBCOMMAND}: usage: gpupilot {SUBCOMMAND} RUN_DIR -- COMMAND…");
        return Some(ExitCode::from(2));
    }
    let argv: Vec<OsString> = args.collect();
    Some(monitor(&dir, &argv))
}

fn report(line: &str) {
    let mut out = io::stdout().lock();
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}

fn monitor(dir: &Path, argv: &[OsString]) -> ExitCode {
    // Out of the supervisor's session and group: its end, its terminal's hangup or a signal to
    // its group do not reach the monitor.
    let _ = rustix::process::setsid();
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        eprintln!("gpupilot {SUBCOMMAND}: cannot become a child subreaper: {e}");
    }
    let argv: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let dir = match RunDir::open(dir) {
        Ok(d) => d,
        Err(e) => {
            report(&format!("error: {e}\n"));
            return ExitCode::FAILURE;
        }
    };
    let spawned = match launch::spawn_in_session(&argv, &dir, |_| {}) {
        Ok(s) => s,
        Err(e) => {
            report(&format!("error: {e}\n"));
            return ExitCode::FAILURE;
        }
    };
    let (pid, start_time) = (spawned.pid, spawned.start_time);
    report(&format!(
        "{pid} {start_time} {} {}\n",
        u8::from(spawned.own_session),
        u8::from(spawned.own_group)
    ));
    // The child is reaped below, with everything else that ends up ours.
    drop(spawned.child);
    let main_pid = rustix::process::Pid::from_raw(pid as i32);
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(Some((reaped, status))) => {
                if Some(reaped) == main_pid {
                    let rec = ExitRecord {
                        pid,
                        start_time,
                        code: status.exit_status(),
                        signal: status.terminating_signal(),
                        ended_at: rfc3339(SystemTime::now()),
                    };
                    write_record(&dir, &rec);
                }
            }
            Ok(None) => {}
            Err(rustix::io::Errno::INTR) => {}
            // ECHILD: the run and all it left behind are gone.
            Err(_) => return ExitCode::SUCCESS,
        }
    }
}

fn write_record(dir: &RunDir, rec: &ExitRecord) {
    let written = serde_json::to_vec(rec)
        .map_err(io::Error::other)
        .and_then(|mut json| {
            json.push(b'\n');
            dir.write_exit_record(&json)
        });
    if let Err(e) = written {
        eprintln!(
            "gpupilot {SUBCOMMAND}: writing {}: {e}",
            dir.exit_record_path().display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_parse() {
        let m = PidRecord {
            pid: 9,
            start_time: 1,
            boot_id: None,
        };
        let s = parse_report("4242 777 1 1\n", m.clone()).unwrap();
        assert_eq!(
            (s.pid, s.start_time, s.own_session, s.own_group),
            (4242, 777, true, true)
        );
        let e = parse_report("error: no such file\n", m.clone()).unwrap_err();
        assert_eq!(e.to_string(), "no such file");
        assert!(parse_report("", m.clone()).is_err());
        assert!(parse_report("1 2 3", m).is_err());
    }

    #[test]
    fn an_exit_record_counts_only_for_its_own_process() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::create(tmp.path(), "m", SystemTime::now()).unwrap();
        let rec = PidRecord {
            pid: 4242,
            start_time: 777,
            boot_id: None,
        };
        assert_eq!(recorded_exit(&dir, &rec), None);
        write_record(
            &dir,
            &ExitRecord {
                pid: 4242,
                start_time: 777,
                code: Some(3),
                signal: None,
                ended_at: "2026-11-30T03:15:00.000Z".into(),
            },
        );
        assert_eq!(recorded_exit(&dir, &rec), Some(ExitInfo::code(3)));
        let other = PidRecord {
            start_time: 778,
            ..rec
        };
        assert_eq!(recorded_exit(&dir, &other), None);
    }
}
