//! The daemon's Prometheus endpoint: `GET /metrics` on `--metrics-addr` (default
//! [`DEFAULT_ADDR`], loopback), the page rendered by [`crate::exporter`] from the newest
//! snapshot, the live runs' trainer side and the control loops.
//!
//! The HTTP side is axum's router on hyper's HTTP/1 server, one task per connection: `GET`
//! and `HEAD /metrics` answer the page; any other path is 404 and any other method 405. Every
//! connection is bounded on its own: its request head within [`READ_TIMEOUT`] (an idle
//! keep-alive connection is closed after as long) and at most [`MAX_REQUEST`] bytes (431
//! beyond), the answer written within [`WRITE_TIMEOUT`]. Accepting never waits: up to
//! [`MAX_CONNECTIONS`] are served at once and one more is closed at once, so idle or slow
//! clients cannot hold a scrape up behind them.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::state::Daemon;
use crate::config::prometheus::HostnameLabel;
use crate::exporter;

/// Where the daemon serves `/metrics` unless told otherwise: loopback, dcgm-exporter's port.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9400";
/// The most bytes of a request head read (hyper's smallest buffer).
pub const MAX_REQUEST: usize = 8 * 1024;
/// How long a client has to send a request head, the first or the next on a kept connection.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may live in all (reading, rendering and writing its answers).
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once; one more is closed as soon as it is accepted.
pub const MAX_CONNECTIONS: usize = 64;

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

/// Accept scrapes until `shutdown`.
pub async fn serve(
    daemon: Arc<Daemon>,
    hostname_label: HostnameLabel,
    listener: TcpListener,
    shutdown: CancellationToken,
) {
    let render = move || page(&daemon, hostname_label);
    serve_page(Arc::new(render), listener, shutdown).await;
}

/// Serve `render`'s page on `listener` until `shutdown`.
async fn serve_page(render: Render, listener: TcpListener, shutdown: CancellationToken) {
    let app = router(render);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(READ_TIMEOUT)
        .max_buf_size(MAX_REQUEST);
    let mut refused = 0u64;
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
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            refused += 1;
            // Said once, then every thousandth: a flood must not flood the log too.
            if refused == 1 || refused % 1000 == 0 {
                tracing::warn!(
                    "metrics endpoint: {MAX_CONNECTIONS} connections already open; closed the \
                     one from {peer} ({refused} closed so far)"
                );
            }
            drop(stream);
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let conn = http.serve_connection(TokioIo::new(stream), service);
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = tokio::time::timeout(WRITE_TIMEOUT, conn.as_mut()) => match r {
                    Ok(Err(e)) => tracing::debug!("metrics endpoint: {peer}: {e}"),
                    Err(_) => tracing::debug!("metrics endpoint: {peer}: connection too long"),
                    Ok(Ok(())) => {}
                },
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
                }
            }
            drop(permit);
        });
    }
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn endpoint() -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve_page(
            Arc::new(|| "up 1\n".to_string()),
            listener,
            stop.clone(),
        ));
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

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_dropped_after_the_timeout() {
        let (addr, _stop) = endpoint().await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        let started = tokio::time::Instant::now();
        let mut out = Vec::new();
        let _ = client.read_to_end(&mut out).await;
        let waited = started.elapsed();
        assert!(
            waited >= READ_TIMEOUT && waited < READ_TIMEOUT * 2,
            "closed after {waited:?}"
        );
    }

    /// Idle connections (scrapers that connect and say nothing, as many as may be served at
    /// once but one) do not hold a scrape up: it is answered at once, not after their timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_connections_do_not_hold_a_scrape_up() {
        let (addr, _stop) = endpoint().await;
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS - 1 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        let asked = Instant::now();
        let r = exchange(addr, &get("/metrics", "GET")).await;
        let took = asked.elapsed();
        assert!(r.starts_with("http/1.1 200"), "{r}");
        assert!(took < READ_TIMEOUT / 2, "the scrape waited {took:?}");
        drop(idle);
    }
}
