//! What `/proc/PID/stat` says about a process: state, group, session and start time.
//!
//! The start time (field 22, clock ticks since boot) is what tells a run's process from a later
//! process that was given the same pid: a pid file records both, and both must match.

use std::io;

/// The fields of `/proc/PID/stat` the supervisor uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: u32,
    /// Field 3: R, S, D, T (stopped), Z (zombie), X (dead), …
    pub state: char,
    /// Field 4.
    pub ppid: i32,
    /// Field 5: the process group id.
    pub pgrp: i32,
    /// Field 6: the session id.
    pub session: i32,
    /// Field 22: start time in clock ticks after boot.
    pub start_time: u64,
}

impl ProcStat {
    /// Neither a zombie nor dead: a process that exited but was not yet reaped (by a parent that
    /// is not us, or an init that is slow to reap) counts as gone.
    pub fn is_running(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }

    /// Stopped by a signal (a paused run).
    pub fn is_stopped(&self) -> bool {
        matches!(self.state, 'T' | 't')
    }
}

/// Read `/proc/PID/stat`.
pub fn stat(pid: u32) -> io::Result<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(pid, &text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat: unexpected format"),
        )
    })
}

/// Parse the text of a stat file. The command name (field 2) is in parentheses and may hold
/// spaces and parentheses itself, so fields are counted after the last `)`.
pub fn parse_stat(pid: u32, text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); field N is fields[N - 3].
    Some(ProcStat {
        pid,
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// The running (not zombie) processes whose process group is `pgid`. Unlike `kill(-pgid, 0)`,
/// this does not count zombies that a slow (or absent) init has not reaped yet.
pub fn running_in_group(pgid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| stat(pid).ok())
        .filter(|st| i64::from(st.pgrp) == i64::from(pgid) && st.is_running())
        .map(|st| st.pid)
        .collect()
}

/// The running (not zombie) descendants of `root`, itself left out: its children, theirs, and
/// so on. Orphans of a run are reparented to its monitor (a child subreaper), so this finds the
/// processes a run left behind in other sessions and groups too.
pub fn descendants(root: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let all: Vec<ProcStat> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| stat(pid).ok())
        .collect();
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for st in all
            .iter()
            .filter(|st| i64::from(st.ppid) == i64::from(parent))
        {
            if st.pid != root && !found.contains(&st.pid) {
                found.push(st.pid);
                parents.push(st.pid);
            }
        }
    }
    found.retain(|&pid| all.iter().any(|st| st.pid == pid && st.is_running()));
    found
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`): after a reboot, pids and start times
/// start over, so a pid file from an earlier boot never names a live run.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_odd_command_names() {
        let text = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        let s = parse_stat(4242, text).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!((s.ppid, s.pgrp, s.session), (1, 4242, 4242));
        assert_eq!(s.start_time, 987_654);
        assert!(s.is_running());
        assert!(parse_stat(1, "1 (x) Z 0").is_none());
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let s = stat(me).unwrap();
        assert_eq!(s.pid, me);
        assert!(s.is_running());
        assert!(s.start_time > 0);
        assert_eq!(s.start_time, stat(me).unwrap().start_time);
        assert!(boot_id().is_some_and(|b| b.len() >= 32));
        assert!(running_in_group(s.pgrp as u32).contains(&me));
    }

    #[test]
    fn finds_children_and_grandchildren() {
        use std::time::{Duration, Instant};
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sh -c 'sleep 5; true' & wait"])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut below = descendants(child.id());
        while below.len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
            below = descendants(child.id());
        }
        assert_eq!(below.len(), 2, "{below:?}");
        assert!(!below.contains(&child.id()));
        assert!(descendants(std::process::id()).contains(&child.id()));
        let _ = child.kill();
        for pid in below {
            let _ =
                crate::supervisor::signal::to_process(pid, crate::supervisor::signal::Sig::Kill);
        }
        let _ = child.wait();
    }
}
