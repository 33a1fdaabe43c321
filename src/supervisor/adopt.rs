//! Finding out, from a run directory alone, what became of its run: still alive, finished, or
//! gone without a word. This is how a restarted daemon picks its runs back up.
//!
//! A pid alone is not enough: pids are recycled. The pid file also holds the process start time
//! (`/proc/PID/stat` field 22) and the boot id, and a process counts as the run's only if all
//! three match and it is not a zombie.
//!
//! A live adopted run is not the new supervisor's child, so its exit status cannot be waited
//! for. Its monitor's (`supervisor::monitor`) can: the monitor writes it to `exit.json`, and
//! that is recorded as the exit. A run started without a monitor is recorded as `unknown status
//! (adopted)` — unless it wrote its own exit code to `$GPUPILOT_RUN_DIR/exit_code` (one
//! integer) after it started, which the Python SDK can do at exit.

use std::io;

use super::events::Summary;
use super::procfs::{self, ProcStat};
use super::rundir::{PidRecord, RunDir};

/// What a run directory's process is now.
#[derive(Debug, Clone, PartialEq)]
pub enum Adopted {
    /// Its process is alive (and is the one the pid file names).
    Live {
        pid: u32,
        start_time: u64,
        /// Stopped by SIGSTOP (a paused run).
        paused: bool,
    },
    /// It ended and its end was recorded.
    Finished(Summary),
    /// No live process, and no recorded end: it ended while nobody watched (or never started).
    Gone {
        pid: Option<PidRecord>,
        summary: Option<Summary>,
    },
}

/// The process a pid record names, if it is still that process and still running.
pub fn live_process(rec: &PidRecord) -> Option<ProcStat> {
    if rec.pid <= 1 {
        return None; // never a run: no run is init
    }
    if let (Some(recorded), Some(now)) = (&rec.boot_id, procfs::boot_id()) {
        if *recorded != now {
            return None;
        }
    }
    let st = procfs::stat(rec.pid).ok()?;
    (st.start_time == rec.start_time && st.is_running()).then_some(st)
}

/// Whether the process a pid record names is still running.
pub fn is_alive(rec: &PidRecord) -> bool {
    live_process(rec).is_some()
}

/// Look at a run directory and say what its run is now. Reads only.
pub fn adopt(dir: &RunDir) -> io::Result<Adopted> {
    let pid = dir.read_pid()?;
    if pid.as_ref().and_then(live_process).is_some() {
        return Ok(judge(pid, None));
    }
    Ok(judge(pid, dir.read_summary()?))
}

/// What a run is now, from its process record and its summary (each read from its directory,
/// or found another way when its file could not be read).
pub fn judge(pid: Option<PidRecord>, summary: Option<Summary>) -> Adopted {
    if let Some(st) = pid.as_ref().and_then(live_process) {
        return Adopted::Live {
            pid: st.pid,
            start_time: st.start_time,
            paused: st.is_stopped(),
        };
    }
    match summary {
        Some(s) if s.status.is_final() => Adopted::Finished(s),
        summary => Adopted::Gone { pid, summary },
    }
}
