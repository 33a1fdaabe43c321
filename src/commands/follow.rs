//! Following a run's logs through the daemon: what `run`, `attach` and `logs -f` share.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::protocol::{LogStream, MAX_LOG_CHUNK, RunInfo};

/// How often a follower asks for more output.
const POLL_EVERY: Duration = Duration::from_millis(200);

/// One log being followed: which, from where, and where its text goes.
#[derive(Debug, Clone, Copy)]
pub struct Tail {
    pub stream: LogStream,
    pub offset: u64,
    /// Write to our stderr (else stdout).
    pub to_stderr: bool,
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
/// `stop` turns true).
pub fn pump(
    client: &Client,
    run: &str,
    tails: &mut [Tail],
    follow: bool,
    stop: &AtomicBool,
) -> anyhow::Result<Ended> {
    loop {
        let mut all_finished = true;
        for t in tails.iter_mut() {
            loop {
                let c = client.logs(run, t.stream, t.offset, MAX_LOG_CHUNK)?;
                write(t.to_stderr, &c.data)?;
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
        let until = Instant::now() + POLL_EVERY;
        while Instant::now() < until {
            if stop.load(Ordering::SeqCst) {
                return Ok(Ended::Detached);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
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
