//! N local ranks of one command with torchrun's environment: what `gpupilot ranks` does, the
//! process of a `launcher = "ranks"` run (for where torchrun is missing, or broken like
//! Debian's torchrun 1.13 on Python 3.11).
//!
//! Each rank gets what torch.distributed's `env://` initialisation and torchrun-aware code read
//! (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `TORCHELASTIC_RUN_ID`, …;
//! [`rank_env`]). The ranks stay in the run's process group, so the supervisor's stop, pause
//! and resume (signals to the group) reach every rank. Each rank writes its stdout and stderr
//! to pipes that this process copies to its own (the run's log files) a whole line at a time,
//! with the rank's prefix (`[rank1]: …`, see [`super::ranks_output`]). SIGTERM, SIGINT and SIGHUP sent to this process alone are passed on to
//! every rank. When one rank fails (a non-zero exit, or death by a signal) the others get
//! SIGTERM, then SIGKILL after the grace period, as torchrun does; the exit code is that first
//! failed rank's (128 + signal for a signal), 0 when every rank succeeded.
//!
//! Only this thread reaps ranks; a waiter thread blocks in `waitid(WNOWAIT)` to say that some
//! rank ended without reaping it, so a rank's pid is never signalled after it was reaped (and
//! perhaps reused). Nothing here knows the daemon, run directories or profiles.

use std::io::{self, Write as _};
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};

use super::ranks_output::{Pump, RankStream};
use super::signal::signal_name;

/// What `gpupilot ranks` was asked to start.
#[derive(Debug, Clone, PartialEq)]
pub struct RanksConfig {
    /// Ranks to start (`WORLD_SIZE`).
    pub nproc: u32,
    /// `MASTER_ADDR`.
    pub master_addr: String,
    /// `MASTER_PORT`; None: a free port, picked now.
    pub master_port: Option<u16>,
    /// Between SIGTERM and SIGKILL for the other ranks once one failed.
    pub grace: Duration,
    /// The program every rank runs, and its arguments.
    pub command: Vec<String>,
    /// `TORCHELASTIC_RUN_ID` (the run's `GPUPILOT_RUN_ID`); None: `none`, torchrun's default.
    pub run_id: Option<String>,
    /// Set `OMP_NUM_THREADS=1` for each rank, as torchrun does with several ranks when the
    /// variable is not set, so N ranks do not each start a thread per core.
    pub one_omp_thread: bool,
}

/// The variables torchrun gives worker `rank` of `nproc` on a single node.
pub fn rank_env(
    rank: u32,
    nproc: u32,
    master_addr: &str,
    master_port: u16,
    run_id: Option<&str>,
) -> Vec<(&'static str, String)> {
    let (r, n) = (rank.to_string(), nproc.to_string());
    vec![
        ("RANK", r.clone()),
        ("LOCAL_RANK", r.clone()),
        ("ROLE_RANK", r),
        ("GROUP_RANK", "0".into()),
        ("WORLD_SIZE", n.clone()),
        ("LOCAL_WORLD_SIZE", n.clone()),
        ("ROLE_WORLD_SIZE", n),
        ("GROUP_WORLD_SIZE", "1".into()),
        ("ROLE_NAME", "default".into()),
        ("MASTER_ADDR", master_addr.into()),
        ("MASTER_PORT", master_port.to_string()),
        ("TORCHELASTIC_RUN_ID", run_id.unwrap_or("none").into()),
        ("TORCHELASTIC_RESTART_COUNT", "0".into()),
        ("TORCHELASTIC_MAX_RESTARTS", "0".into()),
        // Rank 0 serves the store at MASTER_ADDR:MASTER_PORT (no torchrun agent holds one).
        ("TORCHELASTIC_USE_AGENT_STORE", "False".into()),
    ]
}

/// A TCP port free right now: bound at `addr` (or the loopback address, when `addr` cannot be
/// bound here), read back and let go for rank 0 to take.
pub fn free_port(addr: &str) -> io::Result<u16> {
    let listener = TcpListener::bind((addr, 0)).or_else(|_| TcpListener::bind(("127.0.0.1", 0)))?;
    Ok(listener.local_addr()?.port())
}

/// The exit code for a rank's end (128 + N for death by signal N, as shells say it) and the
/// words for it.
pub fn describe(status: ExitStatus) -> (i32, String) {
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, format!("exited with code {code}")),
        (None, Some(sig)) => {
            let name = signal_name(sig).map_or_else(|| format!("signal {sig}"), str::to_string);
            (128 + sig, format!("was killed by {name}"))
        }
        (None, None) => (1, "ended in an unknown way".into()),
    }
}

/// Longest wait between two looks at the ranks when nothing is said (the waiter thread
/// normally says at once).
const POLL: Duration = Duration::from_millis(500);

/// How long the ranks' last output is waited for once every rank has ended (a process a rank
/// left behind may hold its pipes open).
const DRAIN_WAIT: Duration = Duration::from_secs(2);

enum Msg {
    Signal(Signal),
    /// Some rank has ended and waits to be reaped.
    Exited,
}

/// Start the ranks, look after them until every one has ended, and return the exit code.
pub fn run(config: &RanksConfig) -> io::Result<i32> {
    if config.command.is_empty() || config.nproc == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "nothing to start: give at least one rank and a command",
        ));
    }
    let port = match config.master_port {
        Some(p) => p,
        None => free_port(&config.master_addr)?,
    };
    let (tx, rx) = mpsc::channel();
    // Before the first rank: a stop that comes at once must reach every rank that started.
    watch_signals(tx.clone())?;
    let mut pump = Pump::start()?;
    let mut streams = Vec::new();
    let mut ranks = Ranks {
        children: Vec::new(),
        failure: None,
        kill_at: None,
        grace: config.grace,
    };
    for rank in 0..config.nproc {
        match spawn_rank(config, rank, port) {
            Ok(mut child) => {
                if let Some(out) = child.stdout.take() {
                    streams.push(RankStream {
                        rank,
                        pipe: out.into(),
                        stderr: false,
                    });
                }
                if let Some(err) = child.stderr.take() {
                    streams.push(RankStream {
                        rank,
                        pipe: err.into(),
                        stderr: true,
                    });
                }
                ranks.children.push(Some(child));
            }
            Err(e) => {
                let code = match e.kind() {
                    io::ErrorKind::NotFound => 127,
                    io::ErrorKind::PermissionDenied => 126,
                    _ => 1,
                };
                let what = format!("could not start ({}: {e})", config.command[0]);
                ranks.fail(rank, code, &what);
                break;
            }
        }
    }
    pump.copy(streams);
    let (ack_tx, ack_rx) = mpsc::channel();
    if !ranks.children.is_empty() {
        watch_exits(tx, ack_rx);
    }
    let mut ack_due = false;
    loop {
        ranks.reap();
        if ranks.all_ended() {
            break;
        }
        if ack_due {
            ack_due = false;
            let _ = ack_tx.send(());
        }
        let now = Instant::now();
        let wait = ranks
            .kill_at
            .map_or(POLL, |t| t.saturating_duration_since(now).min(POLL));
        match rx.recv_timeout(wait) {
            Ok(Msg::Signal(sig)) => ranks.signal_all(sig),
            Ok(Msg::Exited) => ack_due = true,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
        if ranks.kill_at.is_some_and(|t| Instant::now() >= t) {
            ranks.kill_at = None;
            ranks.reap();
            let left = ranks.running();
            if left > 0 {
                say(&format!(
                    "{left} rank{} still running {} s after SIGTERM: SIGKILL",
                    plural(left),
                    ranks.grace.as_secs_f64()
                ));
                ranks.signal_all(Signal::KILL);
            }
        }
    }
    pump.finish(DRAIN_WAIT);
    Ok(ranks.failure.unwrap_or(0))
}

struct Ranks {
    /// By rank; None once reaped.
    children: Vec<Option<Child>>,
    /// The exit code of the first rank that failed.
    failure: Option<i32>,
    /// When the ranks still running get SIGKILL.
    kill_at: Option<Instant>,
    grace: Duration,
}

impl Ranks {
    /// Reap every rank that has ended; the first failure stops the others.
    fn reap(&mut self) {
        for rank in 0..self.children.len() {
            let Some(child) = self.children[rank].as_mut() else {
                continue;
            };
            let status = match child.try_wait() {
                Ok(Some(status)) => status,
                Ok(None) => continue,
                Err(e) => {
                    // Not ours to wait for any more (cannot happen: this thread alone reaps).
                    say(&format!("rank {rank}: cannot wait for it: {e}"));
                    self.children[rank] = None;
                    continue;
                }
            };
            self.children[rank] = None;
            if !status.success() {
                let (code, what) = describe(status);
                self.fail(rank as u32, code, &what);
            }
        }
    }

    /// `rank` failed: say so once (the first failure), and stop the others.
    fn fail(&mut self, rank: u32, code: i32, what: &str) {
        if self.failure.is_some() {
            return;
        }
        self.failure = Some(code);
        let others = self.running();
        if others == 0 {
            say(&format!("rank {rank} {what}"));
            return;
        }
        say(&format!(
            "rank {rank} {what}; stopping the other {others} rank{} (SIGTERM, SIGKILL after {} s)",
            plural(others),
            self.grace.as_secs_f64()
        ));
        self.signal_all(Signal::TERM);
        self.kill_at = Some(Instant::now() + self.grace);
    }

    fn signal_all(&self, sig: Signal) {
        for child in self.children.iter().flatten() {
            // ESRCH: it has just ended, and is reaped on the next look.
            let _ = rustix::process::kill_process(Pid::from_child(child), sig);
        }
    }

    fn running(&self) -> usize {
        self.children.iter().flatten().count()
    }

    fn all_ended(&self) -> bool {
        self.running() == 0
    }
}

fn spawn_rank(config: &RanksConfig, rank: u32, port: u16) -> io::Result<Child> {
    let mut cmd = Command::new(&config.command[0]);
    cmd.args(&config.command[1..]).envs(rank_env(
        rank,
        config.nproc,
        &config.master_addr,
        port,
        config.run_id.as_deref(),
    ));
    if config.one_omp_thread && config.nproc > 1 {
        cmd.env("OMP_NUM_THREADS", "1");
    }
    // Same process group and session and stdin as this process; output through the pump.
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn()
}

/// SIGTERM, SIGINT and SIGHUP become messages (instead of ending this process). Ready when
/// this returns.
fn watch_signals(tx: Sender<Msg>) -> io::Result<()> {
    let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
    std::thread::Builder::new()
        .name("ranks-signals".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(async move {
                use tokio::signal::unix::{SignalKind, signal};
                let (mut term, mut int, mut hup) = match (
                    signal(SignalKind::terminate()),
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::hangup()),
                ) {
                    (Ok(t), Ok(i), Ok(h)) => (t, i, h),
                    (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                loop {
                    let sig = tokio::select! {
                        Some(()) = term.recv() => Signal::TERM,
                        Some(()) = int.recv() => Signal::INT,
                        Some(()) = hup.recv() => Signal::HUP,
                        else => return,
                    };
                    if tx.send(Msg::Signal(sig)).is_err() {
                        return;
                    }
                }
            });
        })?;
    ready_rx
        .recv()
        .unwrap_or_else(|_| Err(io::Error::other("the signal thread ended at start")))
}

/// A thread that says [`Msg::Exited`] when some child has ended, without reaping it, then
/// waits for the acknowledgement that it was reaped before it looks again. Without it (it
/// could not start, or `waitid` failed) the ranks are still looked at every [`POLL`].
fn watch_exits(tx: Sender<Msg>, ack: Receiver<()>) {
    let _ = std::thread::Builder::new()
        .name("ranks-wait".into())
        .spawn(move || {
            loop {
                match rustix::process::waitid(
                    WaitId::All,
                    WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
                ) {
                    Ok(_) => {
                        if tx.send(Msg::Exited).is_err() || ack.recv().is_err() {
                            return;
                        }
                    }
                    Err(Errno::INTR) => continue,
                    // ECHILD: every rank has been reaped.
                    Err(_) => return,
                }
            }
        });
}

/// One line on stderr (the run's stderr.log), in one `write()` so that no rank's line cuts it.
fn say(line: &str) {
    let _ = io::stderr().write_all(format!("gpupilot ranks: {line}\n").as_bytes());
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_gets_torchruns_variables() {
        let env: std::collections::BTreeMap<_, _> =
            rank_env(2, 4, "127.0.0.1", 29501, Some("20260101-000000-t"))
                .into_iter()
                .collect();
        for (k, v) in [
            ("RANK", "2"),
            ("LOCAL_RANK", "2"),
            ("ROLE_RANK", "2"),
            ("GROUP_RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("ROLE_WORLD_SIZE", "4"),
            ("GROUP_WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29501"),
            ("TORCHELASTIC_RUN_ID", "20260101-000000-t"),
            ("TORCHELASTIC_USE_AGENT_STORE", "False"),
        ] {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        let env = rank_env(0, 1, "::1", 1, None);
        assert!(env.contains(&("TORCHELASTIC_RUN_ID", "none".into())));
    }

    #[test]
    fn exits_and_signals_become_shell_codes() {
        // Wait statuses as the kernel writes them: code << 8, or the signal number.
        assert_eq!(
            describe(ExitStatus::from_raw(3 << 8)),
            (3, "exited with code 3".to_string())
        );
        assert_eq!(
            describe(ExitStatus::from_raw(0)),
            (0, "exited with code 0".to_string())
        );
        assert_eq!(
            describe(ExitStatus::from_raw(9)),
            (137, "was killed by SIGKILL".to_string())
        );
        assert_eq!(describe(ExitStatus::from_raw(15)).0, 143);
    }

    #[test]
    fn a_free_port_can_be_bound() {
        let port = free_port("127.0.0.1").unwrap();
        assert_ne!(port, 0);
        // Freed again: rank 0 can take it.
        TcpListener::bind(("127.0.0.1", port)).unwrap();
        // An address this machine does not have falls back to the loopback address.
        assert_ne!(free_port("192.0.2.1").unwrap(), 0);
    }
}
