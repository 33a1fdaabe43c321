//! Signals to a run's process group, through rustix's safe wrappers around kill(2).

use std::io;

use rustix::process::{Pid, Signal};

/// The signals the supervisor sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sig {
    Term,
    Kill,
    Stop,
    Cont,
}

impl Sig {
    fn raw(self) -> Signal {
        match self {
            Sig::Term => Signal::TERM,
            Sig::Kill => Signal::KILL,
            Sig::Stop => Signal::STOP,
            Sig::Cont => Signal::CONT,
        }
    }
}

/// The pid to signal, refusing 0 and 1: `kill(-1, sig)` signals every process the caller may
/// signal and `kill(0, sig)` the caller's own group, and pid 1 is init. A corrupt pid file must
/// never turn a stop into either.
pub(crate) fn pid(raw: u32) -> io::Result<Pid> {
    i32::try_from(raw)
        .ok()
        .filter(|&p| p > 1)
        .and_then(Pid::from_raw)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("refusing to signal pid {raw}"),
            )
        })
}

/// `kill(-pgid, sig)`: every process in the group.
pub fn to_group(pgid: u32, sig: Sig) -> io::Result<()> {
    Ok(rustix::process::kill_process_group(pid(pgid)?, sig.raw())?)
}

/// `kill(pid, sig)`: one process.
pub fn to_process(p: u32, sig: Sig) -> io::Result<()> {
    Ok(rustix::process::kill_process(pid(p)?, sig.raw())?)
}

/// Whether any process (a zombie included) is still in the group.
pub fn group_exists(pgid: u32) -> bool {
    pid(pgid).is_ok_and(|p| rustix::process::test_kill_process_group(p).is_ok())
}

/// `SIGTERM` for 15, and so on for the signals a run is likely to die of.
pub fn signal_name(n: i32) -> Option<&'static str> {
    Some(match n {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        17 => "SIGCHLD",
        18 => "SIGCONT",
        19 => "SIGSTOP",
        20 => "SIGTSTP",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(signal_name(15), Some("SIGTERM"));
        assert_eq!(signal_name(9), Some("SIGKILL"));
        assert_eq!(signal_name(64), None);
    }

    #[test]
    fn never_targets_everyone_our_group_or_init() {
        // Checked on the conversion, so a broken guard cannot send anything from a test.
        for raw in [0, 1, u32::MAX, i32::MAX as u32 + 1] {
            assert!(pid(raw).is_err(), "{raw}");
        }
        assert_eq!(pid(2).unwrap().as_raw_nonzero().get(), 2);
    }
}
