//! `/metrics` while slow clients flood its port: 200 loopback connections, each sending one
//! byte of a request head that never ends every 0.5 s and reconnecting as soon as it is
//! closed, must not keep a scraper out. Numbers are in BENCHMARKS.md ("`/metrics` under a
//! slow-client flood", `bench/metrics-flood.sh`); this test asserts the behaviour with a
//! generous bound.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::home::{DaemonProc, Home};
use crate::support::net::free_port;

const DRIPPERS: usize = 200;
const SCRAPES: usize = 10;
/// A scrape's whole deadline, as `curl -m 3`.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(3);
/// What a dripper sends, a byte at a time, then `a` for ever: a head that never ends.
const HEAD: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Drip: ";

/// One scrape within [`SCRAPE_TIMEOUT`]: the page when the answer is a 200 with a body that
/// ends in a newline, else why not.
fn scrape(port: u16) -> Result<String, String> {
    let deadline = Instant::now() + SCRAPE_TIMEOUT;
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), SCRAPE_TIMEOUT)
        .map_err(|e| format!("connect: {e}"))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut out = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("timed out after {} bytes", out.len()));
        }
        s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read after {} bytes: {e}", out.len())),
        }
    }
    let text = String::from_utf8_lossy(&out);
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") && body.ends_with('\n') => {
            Ok(body.to_string())
        }
        _ => Err(format!(
            "answer: {:?}",
            text.chars().take(80).collect::<String>()
        )),
    }
}

/// Each GPU's power series in a page: a whole page has one per GPU.
fn power_series(page: &str) -> usize {
    page.lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_POWER_USAGE{"))
        .count()
}

/// [`DRIPPERS`] connections to `port` until `stop`, each sending the next byte every 0.5 s and
/// replaced as soon as the server closes it; counts the connections opened.
fn drip(port: u16, stop: &AtomicBool, opened: &AtomicU64) {
    let mut conns: Vec<Option<(TcpStream, usize)>> = (0..DRIPPERS).map(|_| None).collect();
    let mut next_byte = Instant::now();
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        for c in conns.iter_mut() {
            if c.is_none() {
                let s = TcpStream::connect_timeout(
                    &([127, 0, 0, 1], port).into(),
                    Duration::from_secs(1),
                );
                if let Ok(s) = s
                    && s.set_nonblocking(true).is_ok()
                {
                    opened.fetch_add(1, Ordering::Relaxed);
                    *c = Some((s, 0));
                }
            }
        }
        // Anything from the server (an error page or the end) closes the connection.
        for c in conns.iter_mut() {
            if let Some((s, _)) = c
                && !matches!(s.read(&mut buf), Err(e) if e.kind() == ErrorKind::WouldBlock)
            {
                *c = None;
            }
        }
        if Instant::now() >= next_byte {
            next_byte += Duration::from_millis(500);
            for c in conns.iter_mut() {
                if let Some((s, sent)) = c {
                    let byte = HEAD.get(*sent).copied().unwrap_or(b'a');
                    *sent += 1;
                    if s.write_all(&[byte]).is_err() {
                        *c = None;
                    }
                }
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn scrapes_are_answered_while_200_slow_clients_flood_the_port() {
    let home = Home::new();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let child = home
        .gpupilot(&["daemon", "--rate", "10", "--metrics-addr", &addr])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _daemon = DaemonProc::answering(child, &home.paths, "the daemon");
    let started = Instant::now();
    let gpus = loop {
        match scrape(port) {
            Ok(page) if power_series(&page) > 0 => break power_series(&page),
            r => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "no page before the flood: {r:?}"
                );
                thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert_eq!(gpus, 2);

    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let dripper = {
        let (stop, opened) = (Arc::clone(&stop), Arc::clone(&opened));
        thread::spawn(move || drip(port, &stop, &opened))
    };
    // Every dripper connected, and the first of them already closed and back.
    thread::sleep(Duration::from_secs(2));
    let mut answered = 0;
    let mut failures = Vec::new();
    for _ in 0..SCRAPES {
        let asked = Instant::now();
        match scrape(port) {
            Ok(page) if power_series(&page) == gpus => answered += 1,
            Ok(page) => failures.push(format!("{} power series", power_series(&page))),
            Err(e) => failures.push(e),
        }
        thread::sleep(Duration::from_secs(1).saturating_sub(asked.elapsed()));
    }
    stop.store(true, Ordering::Relaxed);
    dripper.join().unwrap();
    let opened = opened.load(Ordering::Relaxed);

    // The flood was real: every dripper held a connection, and they were closed and opened
    // again (within the 1 s head deadline), not left alone.
    assert!(opened >= 2 * DRIPPERS as u64, "{opened} connections opened");
    assert!(
        answered * 10 >= SCRAPES * 9,
        "{answered} of {SCRAPES} scrapes answered; failures: {failures:?}"
    );
}
