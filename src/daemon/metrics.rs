//! The daemon's Prometheus endpoint: `GET /metrics` on `--metrics-addr` (default
//! [`DEFAULT_ADDR`], loopback), the page rendered by [`crate::exporter`] from the newest
//! snapshot, the live runs' trainer side and the control loops.
//!
//! The HTTP side is axum's router on hyper's HTTP/1 server: `GET` and `HEAD /metrics` answer
//! the page; any other path is 404 and any other method 405. One request per connection
//! (Prometheus opens a new one each scrape), in two stages, so that clients that are slow on
//! purpose cannot keep a scraper out:
//!
//! 1. **The head.** Every connection is accepted at once and has [`HEAD_TIMEOUT`] to send its
//!    whole request head, at most [`MAX_REQUEST`] bytes (431 beyond). Up to [`MAX_PENDING`]
//!    connections may be sending their heads at once; when one more arrives, the one that has
//!    been sending longest is closed to make room. A scraper's head is whole as soon as it
//!    connects, and the room is never taken from a request already received: to close a
//!    scraper's connection, a flood would need [`MAX_PENDING`] new connections in the moment
//!    between its connect and its head.
//! 2. **The answer.** Only a connection whose head has arrived takes one of [`MAX_ANSWERING`]
//!    slots; it waits up to [`HEAD_TIMEOUT`] for one (503 after that) and has
//!    [`ANSWER_TIMEOUT`] to be answered.
//!
//! Before, the 64 connection slots went to whoever connected, and each could be held 5 s by a
//! head sent a byte at a time: against 200 such clients, 2 or 3 scrapes of 25 were answered
//! (BENCHMARKS.md, "`/metrics` under a slow-client flood").

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use self::head::{Primed, read_head};
use super::state::Daemon;
use crate::config::prometheus::HostnameLabel;
use crate::exporter;

mod head;

/// Where the daemon serves `/metrics` unless told otherwise: loopback, dcgm-exporter's port.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9400";
/// The most bytes of a request head read (hyper's smallest buffer).
pub const MAX_REQUEST: usize = 8 * 1024;
/// How long a client has, from its connect, to send its whole request head. Prometheus sends
/// its head in one packet; only a client that is slow on purpose needs more than a round trip.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections still sending their request heads at once; one more closes the oldest of them.
/// With the unix socket's 512 and [`MAX_ANSWERING`], well under a default 1024 open files.
pub const MAX_PENDING: usize = 256;
/// Requests (whole heads received) answered at once.
pub const MAX_ANSWERING: usize = 64;
/// How long answering one request may take, rendering and writing (Prometheus's default
/// scrape timeout).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The `/metrics` page now, the node's label spelled `hostname_label`.
pub fn page(daemon: &Daemon, hostname_label: HostnameLabel) -> String {
    let snapshot = daemon.telemetry().borrow().clone();
    let runs = daemon.live_trainers();
    let control = daemon.control_status();
    exporter::render(&exporter::Input {
        hostname: daemon.node(),
        hostname_label,
        snapshot: snapshot.as_deref(),
        runs: &runs,
        control: Some(&control),
    })
}

/// What renders the page (the daemon's [`page`]; a fixed text in tests).
type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The endpoint's bounds ([`LIMITS`]; smaller in tests).
#[derive(Clone, Copy, Debug)]
struct Limits {
    pending: usize,
    answering: usize,
    head: Duration,
}

const LIMITS: Limits = Limits {
    pending: MAX_PENDING,
    answering: MAX_ANSWERING,
    head: HEAD_TIMEOUT,
};

/// Accept scrapes until `shutdown`.
pub async fn serve(
    daemon: Arc<Daemon>,
    hostname_label: HostnameLabel,
    listener: TcpListener,
    shutdown: CancellationToken,
) {
    let render = move || page(&daemon, hostname_label);
    serve_page(Arc::new(render), listener, shutdown, LIMITS).await;
}

/// The connections still sending their heads, oldest first, each with what closes it.
#[derive(Default)]
struct Pending {
    next: u64,
    open: BTreeMap<u64, CancellationToken>,
}

fn lock(m: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection's place among the [`Pending`]; given up when dropped (head read, or not).
struct PendingPlace {
    pending: Arc<Mutex<Pending>>,
    id: u64,
}

impl Drop for PendingPlace {
    fn drop(&mut self) {
        lock(&self.pending).open.remove(&self.id);
    }
}

/// What every connection's task shares.
struct Shared {
    app: Router,
    http: http1::Builder,
    slots: Arc<Semaphore>,
    shutdown: CancellationToken,
    limits: Limits,
}

/// Serve `render`'s page on `listener` until `shutdown`.
async fn serve_page(
    render: Render,
    listener: TcpListener,
    shutdown: CancellationToken,
    limits: Limits,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.head)
        .keep_alive(false)
        .max_buf_size(MAX_REQUEST);
    let shared = Arc::new(Shared {
        app: router(render),
        http,
        slots: Arc::new(Semaphore::new(limits.answering)),
        shutdown: shutdown.clone(),
        limits,
    });
    let pending = Arc::new(Mutex::new(Pending::default()));
    let mut evicted = 0u64;
    loop {
        let (stream, peer) = tokio::select! {
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
        let (place, closed, oldest) = {
            let mut p = lock(&pending);
            let oldest = if p.open.len() >= limits.pending {
                p.open.pop_first()
            } else {
                None
            };
            let id = p.next;
            p.next += 1;
            let closed = CancellationToken::new();
            p.open.insert(id, closed.clone());
            let place = PendingPlace {
                pending: Arc::clone(&pending),
                id,
            };
            (place, closed, oldest)
        };
        if let Some((_, close)) = oldest {
            close.cancel();
            evicted += 1;
            // Said once, then every thousandth: a flood must not flood the log too.
            if evicted == 1 || evicted % 1000 == 0 {
                tracing::warn!(
                    "metrics endpoint: {} connections still sending their request heads; \
                     closed the oldest to make room for {peer} ({evicted} closed so far)",
                    limits.pending
                );
            }
        }
        tokio::spawn(connection(stream, peer, place, closed, Arc::clone(&shared)));
    }
}

/// One connection: its head within the deadline (or closed to make room), then its answer.
async fn connection(
    mut stream: TcpStream,
    peer: std::net::SocketAddr,
    place: PendingPlace,
    closed: CancellationToken,
    shared: Arc<Shared>,
) {
    let head = tokio::select! {
        r = tokio::time::timeout(shared.limits.head, read_head(&mut stream)) => r,
        _ = closed.cancelled() => {
            tracing::debug!("metrics endpoint: {peer}: closed to make room, head unfinished");
            return;
        }
        _ = shared.shutdown.cancelled() => return,
    };
    drop(place);
    let head = match head {
        Ok(Ok(Some(head))) => head,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => return tracing::debug!("metrics endpoint: {peer}: {e}"),
        Err(_) => {
            return tracing::debug!("metrics endpoint: {peer}: no request head in time");
        }
    };
    let wait = tokio::time::timeout(
        shared.limits.head,
        Arc::clone(&shared.slots).acquire_owned(),
    );
    let Ok(Ok(permit)) = wait.await else {
        return busy(stream, peer).await;
    };
    let service = TowerToHyperService::new(shared.app.clone());
    let io = TokioIo::new(Primed::new(stream, head));
    let mut conn = std::pin::pin!(shared.http.serve_connection(io, service));
    tokio::select! {
        r = tokio::time::timeout(ANSWER_TIMEOUT, conn.as_mut()) => match r {
            Ok(Err(e)) => tracing::debug!("metrics endpoint: {peer}: {e}"),
            Err(_) => tracing::debug!("metrics endpoint: {peer}: answer too long"),
            Ok(Ok(())) => {}
        },
        _ = shared.shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
        }
    }
    drop(permit);
}

/// 503 to a request that found every answering slot taken for as long as it may wait.
async fn busy(mut stream: TcpStream, peer: std::net::SocketAddr) {
    tracing::debug!("metrics endpoint: {peer}: every answering slot busy");
    let body = "busy: too many requests at once, ask again\n";
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(answer.as_bytes())).await;
}

/// `/metrics` (GET, and HEAD without the body) and a 404 that says where the metrics are.
fn router(render: Render) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let render = Arc::clone(&render);
                async move {
                    match tokio::task::spawn_blocking(move || render()).await {
                        Ok(body) => {
                            ([(header::CONTENT_TYPE, exporter::CONTENT_TYPE)], body).into_response()
                        }
                        Err(e) => {
                            tracing::warn!("metrics endpoint: rendering the page failed: {e}");
                            (StatusCode::INTERNAL_SERVER_ERROR, "rendering failed\n")
                                .into_response()
                        }
                    }
                }
            }),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found: the metrics are at /metrics\n",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::time::Instant;
    use tokio::io::AsyncReadExt;

    async fn endpoint() -> (SocketAddr, CancellationToken) {
        endpoint_with(Arc::new(|| "up 1\n".to_string()), LIMITS).await
    }

    async fn endpoint_with(render: Render, limits: Limits) -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve_page(render, listener, stop.clone(), limits));
        (addr, stop)
    }

    /// One request on a new connection; the whole answer, lower-cased.
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).to_lowercase()
    }

    fn get(path: &str, method: &str) -> Vec<u8> {
        format!("{method} {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").into_bytes()
    }

    /// How long until the server closes `s` (what it sent is thrown away).
    async fn closed_after(s: &mut TcpStream) -> Duration {
        let started = tokio::time::Instant::now();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        started.elapsed()
    }

    #[tokio::test]
    async fn serves_bounded_answers() {
        let (addr, _stop) = endpoint().await;
        let r = exchange(addr, &get("/metrics", "GET")).await;
        assert!(r.starts_with("http/1.1 200 ok\r\n"), "{r}");
        assert!(r.contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        assert!(
            r.contains("content-length: 5\r\n") && r.ends_with("\r\n\r\nup 1\n"),
            "{r}"
        );
        let r = exchange(addr, &get("/metrics?x=1", "HEAD")).await;
        assert!(r.starts_with("http/1.1 200"), "{r}");
        assert!(r.ends_with("\r\n\r\n"), "a HEAD answer has no body: {r}");
        let r = exchange(addr, &get("/metrics", "DELETE")).await;
        assert!(
            r.starts_with("http/1.1 405") && r.contains("allow: get,head"),
            "{r}"
        );
        for path in ["/nope", "/"] {
            let r = exchange(addr, &get(path, "GET")).await;
            assert!(
                r.starts_with("http/1.1 404") && r.contains("/metrics"),
                "{r}"
            );
        }
        // A head that never ends is cut at MAX_REQUEST bytes.
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_REQUEST + 10));
        let r = exchange(addr, &big).await;
        assert!(r.starts_with("http/1.1 431"), "{r}");
    }

    /// One request a connection, even one that asks to be kept: a kept connection would hold
    /// an answering slot for nothing between scrapes.
    #[tokio::test]
    async fn the_connection_closes_after_its_answer() {
        let (addr, _stop) = endpoint().await;
        let two =
            b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\nGET /metrics HTTP/1.1\r\nHost: a\r\n\r\n";
        let r = exchange(addr, two).await;
        assert_eq!(r.matches("http/1.1 200").count(), 1, "{r}");
        assert!(r.contains("connection: close\r\n"), "{r}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_dropped_after_the_timeout() {
        let (addr, _stop) = endpoint().await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        let waited = closed_after(&mut client).await;
        assert!(
            waited >= HEAD_TIMEOUT && waited < HEAD_TIMEOUT * 2,
            "closed after {waited:?}"
        );
    }

    /// The deadline is for the whole head: a byte every 100 ms does not move it.
    #[tokio::test(start_paused = true)]
    async fn a_head_sent_a_byte_at_a_time_is_cut_at_the_timeout() {
        let (addr, _stop) = endpoint().await;
        let client = TcpStream::connect(addr).await.unwrap();
        let (mut rx, mut tx) = client.into_split();
        let started = tokio::time::Instant::now();
        let drip = tokio::spawn(async move {
            for b in b"GET /metrics HTTP/1.1\r\nX: ".iter().cycle().take(1000) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if tx.write_all(&[*b]).await.is_err() {
                    break;
                }
            }
        });
        let mut out = Vec::new();
        let _ = rx.read_to_end(&mut out).await;
        let waited = started.elapsed();
        drip.abort();
        assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
        assert!(
            waited >= HEAD_TIMEOUT && waited < HEAD_TIMEOUT + Duration::from_millis(200),
            "closed after {waited:?}"
        );
    }

    /// A head that arrives in pieces, its blank line split across them, within the deadline.
    #[tokio::test]
    async fn a_head_in_pieces_within_the_timeout_is_answered() {
        let (addr, _stop) = endpoint().await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        for piece in [&b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r"[..], b"\n"] {
            s.write_all(piece).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        let r = String::from_utf8_lossy(&out).to_lowercase();
        assert!(
            r.starts_with("http/1.1 200") && r.ends_with("up 1\n"),
            "{r}"
        );
    }

    /// More silent connections than may send heads at once: each newcomer closes the oldest,
    /// at once (not at the deadline), and a scrape among them is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_oldest_unfinished_head_makes_room_for_a_new_connection() {
        let limits = Limits {
            pending: 8,
            answering: 2,
            head: Duration::from_secs(60),
        };
        let (addr, _stop) = endpoint_with(Arc::new(|| "up 1\n".to_string()), limits).await;
        let mut idle = Vec::new();
        for _ in 0..20 {
            idle.push(TcpStream::connect(addr).await.unwrap());
            // Accepted in this order: the oldest is the first connected.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let asked = Instant::now();
        let r = exchange(addr, &get("/metrics", "GET")).await;
        let took = asked.elapsed();
        assert!(
            r.starts_with("http/1.1 200") && r.ends_with("up 1\n"),
            "{r}"
        );
        assert!(took < Duration::from_secs(5), "the scrape waited {took:?}");
        // The scrape closed the 13th as it came; the newest 7 are still open.
        let mut open = 0;
        for s in &mut idle {
            let gone = tokio::time::timeout(Duration::from_millis(200), closed_after(s)).await;
            open += usize::from(gone.is_err());
        }
        assert_eq!(open, 7);
    }

    /// A complete request that finds every answering slot taken waits up to the head timeout,
    /// then hears 503 (not silence).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_with_no_answering_slot_gets_503() {
        let limits = Limits {
            pending: 8,
            answering: 1,
            head: Duration::from_millis(300),
        };
        let slow: Render = Arc::new(|| {
            std::thread::sleep(Duration::from_millis(1500));
            "up 1\n".to_string()
        });
        let (addr, _stop) = endpoint_with(slow, limits).await;
        let first = tokio::spawn(async move { exchange(addr, &get("/metrics", "GET")).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let asked = Instant::now();
        let r = exchange(addr, &get("/metrics", "GET")).await;
        let took = asked.elapsed();
        assert!(r.starts_with("http/1.1 503") && r.contains("busy"), "{r}");
        assert!(
            took >= limits.head && took < Duration::from_millis(1200),
            "{took:?}"
        );
        let r = first.await.unwrap();
        assert!(r.starts_with("http/1.1 200"), "{r}");
    }
}
