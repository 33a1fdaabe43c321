//! The daemon's Prometheus endpoint: `GET /metrics` on `--metrics-addr` (default
//! [`DEFAULT_ADDR`], loopback), the page rendered by [`crate::exporter`] from the newest
//! snapshot, the live runs' trainer side and the control loops.
//!
//! The HTTP side is a minimal HTTP/1.1 responder over tokio's `TcpListener` rather than a web
//! framework: it answers one `GET` (or `HEAD`) per connection and closes it, which is all a
//! Prometheus scrape needs, and it is bounded — request head at most [`MAX_REQUEST`] bytes,
//! [`READ_TIMEOUT`] to send it, at most [`MAX_CONNECTIONS`] at once (more wait in the kernel's
//! backlog). Anything else gets 400, 404, 405 or 431 and the connection is closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::state::Daemon;
use crate::exporter;

/// Where the daemon serves `/metrics` unless told otherwise: loopback, dcgm-exporter's port.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9400";
/// The most bytes of a request head read.
pub const MAX_REQUEST: usize = 8 * 1024;
/// How long a client has to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long writing the answer may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;

/// Parse `--metrics-addr`: `off` (None) or `ADDR:PORT`.
pub fn parse_addr(s: &str) -> Result<Option<SocketAddr>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") || s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    s.parse::<SocketAddr>().map(Some).map_err(|_| {
        format!(
            "metrics address `{s}`: give ADDR:PORT (`127.0.0.1:9400`, `0.0.0.0:9400`, \
             `[::1]:9400`) or `off`"
        )
    })
}

/// The `/metrics` page now.
pub fn page(daemon: &Daemon) -> String {
    let snapshot = daemon.telemetry().borrow().clone();
    let runs = daemon.live_trainers();
    let control = daemon.control_status();
    exporter::render(&exporter::Input {
        hostname: daemon.node(),
        snapshot: snapshot.as_deref(),
        runs: &runs,
        control: Some(&control),
    })
}

/// Accept scrapes until `shutdown`.
pub async fn serve(daemon: Arc<Daemon>, listener: TcpListener, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = Arc::clone(&slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("metrics endpoint: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let d = Arc::clone(&daemon);
        tokio::spawn(async move {
            let render = move || page(&d);
            if let Err(e) = answer(stream, render).await {
                tracing::debug!("metrics endpoint: {e}");
            }
            drop(permit);
        });
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Asked {
    Metrics { head_only: bool },
    Index { head_only: bool },
    NotFound,
    BadMethod,
    Bad,
}

/// Read the request line of a head (`GET /metrics?x HTTP/1.1`).
pub fn parse_head(head: &[u8]) -> Asked {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Asked::Bad;
    };
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return Asked::Bad;
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Asked::BadMethod,
    };
    match target.split('?').next().unwrap_or_default() {
        "/metrics" => Asked::Metrics { head_only },
        "/" => Asked::Index { head_only },
        _ => Asked::NotFound,
    }
}

/// Read one request head (bounded in size and time), answer it, close.
async fn answer(
    mut stream: TcpStream,
    render: impl FnOnce() -> String + Send + 'static,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
                return Ok(true);
            }
            if head.len() >= MAX_REQUEST {
                return Ok(false);
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "closed before the request head ended",
                ));
            }
            head.extend_from_slice(&buf[..n]);
        }
    };
    let complete = match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "request head not sent in time",
            ));
        }
    };
    let (status, content_type, body, head_only) = if !complete {
        (
            "431 Request Header Fields Too Large",
            "text/plain",
            "request head too large\n".to_string(),
            false,
        )
    } else {
        match parse_head(&head) {
            Asked::Metrics { head_only } => {
                let body = tokio::task::spawn_blocking(render)
                    .await
                    .map_err(std::io::Error::other)?;
                ("200 OK", exporter::CONTENT_TYPE, body, head_only)
            }
            Asked::Index { head_only } => (
                "200 OK",
                "text/plain; charset=utf-8",
                "gpupilot daemon: Prometheus metrics at /metrics\n".to_string(),
                head_only,
            ),
            Asked::NotFound => (
                "404 Not Found",
                "text/plain",
                "not found: the metrics are at /metrics\n".into(),
                false,
            ),
            Asked::BadMethod => (
                "405 Method Not Allowed",
                "text/plain",
                "only GET and HEAD\n".into(),
                false,
            ),
            Asked::Bad => (
                "400 Bad Request",
                "text/plain",
                "bad request\n".into(),
                false,
            ),
        }
    };
    let mut reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        reply.push_str("Allow: GET, HEAD\r\n");
    }
    reply.push_str("\r\n");
    if !head_only {
        reply.push_str(&body);
    }
    let write = async {
        stream.write_all(reply.as_bytes()).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(WRITE_TIMEOUT, write)
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "answer not taken in time",
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_off() {
        assert_eq!(parse_addr("off").unwrap(), None);
        assert_eq!(
            parse_addr("127.0.0.1:9400").unwrap(),
            Some("127.0.0.1:9400".parse().unwrap())
        );
        assert!(parse_addr("[::1]:9400").unwrap().is_some());
        let e = parse_addr("localhost").unwrap_err();
        assert!(e.contains("ADDR:PORT") && e.contains("off"), "{e}");
    }

    #[test]
    fn request_heads() {
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Asked::Metrics { head_only: false }
        );
        assert_eq!(
            parse_head(b"HEAD /metrics?format=x HTTP/1.0\r\n\r\n"),
            Asked::Metrics { head_only: true }
        );
        assert_eq!(
            parse_head(b"GET / HTTP/1.1\r\n\r\n"),
            Asked::Index { head_only: false }
        );
        assert_eq!(parse_head(b"GET /x HTTP/1.1\r\n\r\n"), Asked::NotFound);
        assert_eq!(
            parse_head(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Asked::BadMethod
        );
        assert_eq!(parse_head(b"GET /metrics\r\n\r\n"), Asked::Bad);
        assert_eq!(parse_head(b"\xff\xfe"), Asked::Bad);
    }

    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn serves_bounded_answers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                tokio::spawn(answer(s, || "up 1\n".to_string()));
            }
        });
        let r = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        assert!(
            r.contains("Content-Length: 5\r\n") && r.ends_with("\r\n\r\nup 1\n"),
            "{r}"
        );
        let r = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
        assert!(
            r.contains("Content-Length: 5\r\n") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        let r = exchange(addr, b"DELETE /metrics HTTP/1.1\r\n\r\n").await;
        assert!(
            r.starts_with("HTTP/1.1 405") && r.contains("Allow: GET, HEAD"),
            "{r}"
        );
        let r = exchange(addr, b"GET /nope HTTP/1.1\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 404"), "{r}");
        // A head that never ends is cut at MAX_REQUEST bytes.
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_REQUEST + 10));
        let r = exchange(addr, &big).await;
        assert!(r.starts_with("HTTP/1.1 431"), "{r}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_dropped_after_the_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            answer(s, String::new).await
        });
        let _client = TcpStream::connect(addr).await.unwrap();
        let r = server.await.unwrap();
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
    }
}
