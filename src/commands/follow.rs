//! Following a run's logs through the daemon: what `run`, `attach` and `logs -f` share (and
//! `logs --rank`, which keeps one rank's lines of a `launcher = "ranks"` job).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::client::{Client, ClientError};
use crate::protocol::{LogStream, MAX_LOG_CHUNK, RunInfo};
use crate::supervisor::rank_lines::RankFilter;

/// How often a follower asks for more output.
const POLL_EVERY: Duration = Duration::from_millis(200);

/// How long a follower whose daemon went away looks for it again (a restart, an upgrade)
/// before it gives up; the run goes on either way.
const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// The first wait between two tries to reconnect; each further wait doubles, up to
/// [`RECONNECT_MAX_WAIT`].
const RECONNECT_FIRST_WAIT: Duration = Duration::from_millis(100);
const RECONNECT_MAX_WAIT: Duration = Duration::from_secs(2);

/// One log being followed: which, from where, and where its text goes.
#[derive(Debug, Clone, Copy)]
pub struct Tail {
    pub stream: LogStream,
    pub offset: u64,
    /// Write to our stderr (else stdout).
    pub to_stderr: bool,
    /// Only this rank's lines (`[rankN]: …`, a `launcher = "ranks"` job's).
    pub rank: Option<u32>,
}

/// How following ended.
#[derive(Debug)]
pub enum Ended {
    /// The run ended and every byte of its output was printed.
    Finished(Box<RunInfo>),
    /// Ctrl-C: the run goes on.
    Detached,
    /// Not following: what there was has been printed.
    Printed,
}

fn write(to_stderr: bool, text: &str) -> std::io::Result<()> {
    if to_stderr {
        let mut e = std::io::stderr().lock();
        e.write_all(text.as_bytes())?;
        e.flush()
    } else {
        super::out(text)
    }
}

/// Print the logs from their offsets on; with `follow`, keep going until the run ends (or
/// `stop` turns true). A daemon that goes away meanwhile (killed, restarted, upgraded) is
/// looked for again for [`RECONNECT_FOR`], and following goes on from the offsets reached:
/// every byte is printed once.
pub fn pump(
    client: &mut Client,
    run: &str,
    tails: &mut [Tail],
    follow: bool,
    stop: &AtomicBool,
) -> anyhow::Result<Ended> {
    // Kept across reconnections: a line cut between two chunks stays one line.
    let mut filters: Vec<Option<RankFilter>> =
        tails.iter().map(|t| t.rank.map(RankFilter::new)).collect();
    loop {
        match pump_once(client, run, tails, &mut filters, follow, stop) {
            Err(Lost::Other(e)) => return Err(e),
            Err(Lost::Connection(e)) if follow => match reconnect(client, stop, &e)? {
                Some(c) => {
                    *client = c;
                    eprintln!("gpupilot: daemon restarted, following again");
                }
                None => return Ok(Ended::Detached),
            },
            Err(Lost::Connection(e)) => return Err(e.into()),
            Ok(ended) => return Ok(ended),
        }
    }
}

/// Why following stopped short.
enum Lost {
    /// The daemon went away (the connection closed, or it no longer answers).
    Connection(ClientError),
    Other(anyhow::Error),
}

impl From<ClientError> for Lost {
    fn from(e: ClientError) -> Lost {
        match e {
            ClientError::Closed { .. } | ClientError::Io(_) | ClientError::Timeout { .. } => {
                Lost::Connection(e)
            }
            e => Lost::Other(e.into()),
        }
    }
}

impl From<std::io::Error> for Lost {
    fn from(e: std::io::Error) -> Lost {
        Lost::Other(e.into())
    }
}

fn pump_once(
    client: &Client,
    run: &str,
    tails: &mut [Tail],
    filters: &mut [Option<RankFilter>],
    follow: bool,
    stop: &AtomicBool,
) -> Result<Ended, Lost> {
    loop {
        let mut all_finished = true;
        for (t, filter) in tails.iter_mut().zip(filters.iter_mut()) {
            loop {
                let c = client.logs(run, t.stream, t.offset, MAX_LOG_CHUNK)?;
                match filter {
                    Some(f) => write(t.to_stderr, &f.feed(&c.data))?,
                    None => write(t.to_stderr, &c.data)?,
                }
                let progressed = c.next_offset > t.offset;
                t.offset = c.next_offset;
                if !progressed || c.next_offset >= c.size {
                    // `finished` was read before the data: with all of it read, that is the end.
                    all_finished &= c.finished && c.next_offset >= c.size;
                    break;
                }
            }
        }
        if !follow {
            return Ok(Ended::Printed);
        }
        if all_finished {
            return Ok(Ended::Finished(Box::new(client.run(run)?)));
        }
        if sleep_unless_stopped(POLL_EVERY, stop) {
            return Ok(Ended::Detached);
        }
    }
}

/// Sleep for `d`; true (at once) when `stop` turns true meanwhile.
pub(super) fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) -> bool {
    let until = Instant::now() + d;
    loop {
        if stop.load(Ordering::SeqCst) {
            return true;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

/// Connect again the way `client` connected, with backoff, for at most [`RECONNECT_FOR`]:
/// the new client, or None on Ctrl-C. Only connects: a daemon that is not there is not
/// started (whoever stopped it may mean it).
fn reconnect(
    client: &Client,
    stop: &AtomicBool,
    lost: &ClientError,
) -> anyhow::Result<Option<Client>> {
    let origin = client.origin().clone();
    let name = format!("gpupilot-cli {}", env!("CARGO_PKG_VERSION"));
    eprintln!(
        "gpupilot: lost the daemon ({}); the run goes on; reconnecting for up to {} s",
        lost_reason(lost),
        RECONNECT_FOR.as_secs()
    );
    let deadline = Instant::now() + RECONNECT_FOR;
    let mut wait = RECONNECT_FIRST_WAIT;
    loop {
        if sleep_unless_stopped(wait, stop) {
            return Ok(None);
        }
        match origin.connect(&name) {
            Ok(c) => return Ok(Some(c)),
            Err(e @ ClientError::Refused(_)) => return Err(e.into()),
            Err(e) if Instant::now() >= deadline => {
                anyhow::bail!(
                    "the daemon at {} did not come back within {} s ({e}); the run goes on: \
                     `gpupilot attach` follows it again once a daemon runs (its log: {})",
                    origin.describe(),
                    RECONNECT_FOR.as_secs(),
                    daemon_log()
                )
            }
            Err(_) => wait = (wait * 2).min(RECONNECT_MAX_WAIT),
        }
    }
}

/// A lost connection in words, without the client's generic advice.
pub(super) fn lost_reason(e: &ClientError) -> String {
    match e {
        ClientError::Closed { .. } => "it closed the connection".into(),
        e => e.to_string(),
    }
}

/// Where the daemon this command talks to logs.
fn daemon_log() -> String {
    let paths = if crate::config::paths::system_daemon_selected() {
        crate::config::Paths::system_from_env()
    } else {
        crate::config::Paths::from_env()
    };
    crate::ipc::log_path(&paths).display().to_string()
}

/// The last `bytes` of a log from its first whole line on, printed; returns where it ended.
pub fn print_tail(client: &Client, run: &str, t: Tail, bytes: u64) -> anyhow::Result<u64> {
    let size = client.logs(run, t.stream, 0, 0)?.size;
    let start = size.saturating_sub(bytes);
    let c = client.logs(run, t.stream, start, bytes)?;
    let text = if start > 0 {
        c.data.split_once('\n').map_or("", |(_, rest)| rest)
    } else {
        c.data.as_str()
    };
    write(t.to_stderr, text)?;
    Ok(c.next_offset)
}

/// The exit status `run` passes on for a run that ended: its exit code, 128 + signal for a
/// signal (as shells do), 1 when unknown.
pub fn exit_status(info: &RunInfo) -> u8 {
    if let Some(code) = info.exit_code {
        return (code & 0xff) as u8;
    }
    let signal = info
        .signal_name
        .as_deref()
        .and_then(|n| (1..32).find(|&s| crate::supervisor::signal::signal_name(s) == Some(n)));
    signal.map_or(1, |s| 128 + s as u8)
}
