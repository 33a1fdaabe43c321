//! Prometheus's HTTP query API (`/api/v1/query`), instant queries only, over a minimal blocking
//! HTTP/1.1 client: one `GET` per connection (`Connection: close`), connect, read and write
//! timeouts, a cap on the answer's size, `Content-Length`, chunked or read-to-close bodies.
//!
//! Plain `http://` only: Prometheus on a cluster's head node is normally reached over loopback
//! or the cluster network; for `https://` put the URL behind a local tunnel or proxy
//! (`ssh -L 9090:localhost:9090 head`). This keeps the query path free of a TLS stack and of an
//! HTTP crate for four requests a second.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde::Deserialize;

/// The most bytes an answer may have.
pub const MAX_BODY: usize = 64 << 20;

/// One series of an instant vector: its labels and newest value.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    /// Evaluation time of the query (Unix seconds).
    pub t: f64,
    pub v: f64,
}

impl Series {
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels.get(k).map(String::as_str)
    }
}

/// Why a query failed, in words for the status line.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{0}")]
    Url(String),
    /// The I/O error is part of the message (not a `source`): the view shows one line.
    #[error("{url}: {err}")]
    Io { url: String, err: std::io::Error },
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url}: {msg}")]
    Answer { url: String, msg: String },
}

/// A Prometheus server to ask.
#[derive(Debug, Clone)]
pub struct Prometheus {
    host: String,
    port: u16,
    /// Path prefix (`/prometheus` behind a reverse proxy), without a trailing slash.
    prefix: String,
    pub base: String,
    pub timeout: Duration,
}

impl Prometheus {
    /// Parse `http://host[:port][/prefix]` (the scheme may be left out).
    pub fn new(url: &str) -> Result<Prometheus, QueryError> {
        let url = url.trim();
        let rest = if let Some(r) = url.strip_prefix("http://") {
            r.trim_end_matches('/')
        } else if url.starts_with("https://") {
            return Err(QueryError::Url(format!(
                "{url}: https is not supported; reach Prometheus over http (on the cluster \
                 network, or through `ssh -L 9090:localhost:9090 HEAD` and \
                 http://127.0.0.1:9090)"
            )));
        } else if url.contains("://") {
            return Err(QueryError::Url(format!(
                "{url}: give Prometheus's http:// URL, like http://head:9090"
            )));
        } else {
            url.trim_end_matches('/')
        };
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].to_string()),
            None => (rest, String::new()),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
                match p.parse::<u16>() {
                    Ok(p) => (h.to_string(), p),
                    Err(_) => (authority.to_string(), 80),
                }
            }
            _ => (authority.to_string(), 80),
        };
        if host.is_empty() {
            return Err(QueryError::Url(format!(
                "`{url}` names no host: give Prometheus's URL, like http://head:9090"
            )));
        }
        Ok(Prometheus {
            base: format!("http://{authority}{prefix}"),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            prefix,
            timeout: Duration::from_secs(3),
        })
    }

    /// An instant query: the series of the vector it returns.
    pub fn query(&self, promql: &str) -> Result<Vec<Series>, QueryError> {
        let path = format!("{}/api/v1/query?query={}", self.prefix, encode(promql));
        let body = self.get(&path)?;
        parse_vector(&body).map_err(|msg| QueryError::Answer {
            url: self.base.clone(),
            msg,
        })
    }

    /// GET `path`; the body of a 200 answer.
    pub fn get(&self, path: &str) -> Result<Vec<u8>, QueryError> {
        let io = |err| QueryError::Io {
            url: self.base.clone(),
            err,
        };
        let addr = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(io)?
            .next()
            .ok_or_else(|| QueryError::Url(format!("{}: no address", self.base)))?;
        let mut s = TcpStream::connect_timeout(&addr, self.timeout).map_err(io)?;
        s.set_read_timeout(Some(self.timeout)).map_err(io)?;
        s.set_write_timeout(Some(self.timeout)).map_err(io)?;
        let host = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: gpupilot/{}\r\n\
             Accept: application/json\r\nConnection: close\r\n\r\n",
            env!("CARGO_PKG_VERSION")
        )
        .map_err(io)?;
        let mut raw = Vec::new();
        s.take(MAX_BODY as u64 + 64 * 1024)
            .read_to_end(&mut raw)
            .map_err(io)?;
        let (status, body) = parse_response(&raw).map_err(|msg| QueryError::Answer {
            url: self.base.clone(),
            msg,
        })?;
        if status != 200 {
            let text = String::from_utf8_lossy(&body);
            let text: String = text.chars().take(300).collect();
            return Err(QueryError::Status {
                url: self.base.clone(),
                status,
                body: text,
            });
        }
        Ok(body)
    }
}

/// Percent-encode a query parameter.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Split an HTTP/1.x response into status and (de-chunked) body.
pub fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer is not HTTP (no end of head)")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .filter(|_| status_line.starts_with("HTTP/1."))
        .ok_or_else(|| format!("the answer is not HTTP: `{status_line}`"))?;
    let mut chunked = false;
    let mut length = None;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        } else if k == "content-length" {
            length = v.parse::<usize>().ok();
        } else if k == "content-encoding" && !v.eq_ignore_ascii_case("identity") {
            return Err(format!("unexpected content encoding `{v}`"));
        }
    }
    let body = &raw[end + 4..];
    if body.len() > MAX_BODY {
        return Err(format!("answer larger than {} MiB", MAX_BODY >> 20));
    }
    if chunked {
        return dechunk(body).map(|b| (status, b));
    }
    match length {
        Some(n) if body.len() < n => Err(format!("answer cut short ({} of {n} bytes)", body.len())),
        Some(n) => Ok((status, body[..n].to_vec())),
        None => Ok((status, body.to_vec())),
    }
}

/// The body of a chunked answer. Sizes come from the other end: each is checked against what
/// is left and against [`MAX_BODY`] before any arithmetic, so `ffffffffffffffff` is a refusal,
/// not an overflow.
fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(b.len());
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunked answer cut short")?;
        let size_text = String::from_utf8_lossy(&b[..eol]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| {
            let shown: String = size_text.chars().take(20).collect();
            let more = if shown.len() < size_text.len() {
                "…"
            } else {
                ""
            };
            format!("bad chunk size `{shown}{more}`")
        })?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if size > MAX_BODY.saturating_sub(out.len()) {
            return Err(format!("chunked answer larger than {} MiB", MAX_BODY >> 20));
        }
        let end = size.checked_add(2).ok_or("chunked answer cut short")?;
        if b.len() < end {
            return Err("chunked answer cut short".into());
        }
        out.extend_from_slice(&b[..size]);
        b = &b[end..];
    }
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct VectorItem {
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

/// The series of an instant-vector answer (`{"status":"success","data":{"resultType":
/// "vector","result":[…]}}`). Values Prometheus writes as `NaN`/`+Inf` are left out.
pub fn parse_vector(body: &[u8]) -> Result<Vec<Series>, String> {
    let a: Answer =
        serde_json::from_slice(body).map_err(|e| format!("not a Prometheus answer: {e}"))?;
    if a.status != "success" {
        return Err(format!(
            "Prometheus says: {}",
            a.error.unwrap_or_else(|| a.status.clone())
        ));
    }
    let data = a.data.ok_or("answer without data")?;
    if data.result_type != "vector" {
        return Err(format!(
            "expected an instant vector, got a {}",
            data.result_type
        ));
    }
    let items: Vec<VectorItem> =
        serde_json::from_value(data.result).map_err(|e| format!("bad vector: {e}"))?;
    Ok(items
        .into_iter()
        .filter_map(|i| {
            let v: f64 = i.value.1.parse().ok()?;
            v.is_finite().then_some(Series {
                labels: i.metric,
                t: i.value.0,
                v,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let p = Prometheus::new("http://head:9090/").unwrap();
        assert_eq!(
            (p.host.as_str(), p.port, p.prefix.as_str()),
            ("head", 9090, "")
        );
        let p = Prometheus::new("127.0.0.1:9091/prom").unwrap();
        assert_eq!(
            (p.host.as_str(), p.port, p.prefix.as_str()),
            ("127.0.0.1", 9091, "/prom")
        );
        assert_eq!(p.base, "http://127.0.0.1:9091/prom");
        let p = Prometheus::new("http://[::1]:9090").unwrap();
        assert_eq!((p.host.as_str(), p.port), ("::1", 9090));
        assert_eq!(Prometheus::new("http://head").unwrap().port, 80);
        let e = Prometheus::new("https://head:9090")
            .unwrap_err()
            .to_string();
        assert!(e.contains("ssh -L"), "{e}");
        assert!(Prometheus::new("ftp://x").is_err());
        assert!(Prometheus::new("http://").is_err());
    }

    #[test]
    fn encoding() {
        assert_eq!(encode("up{a=\"b\"}"), "up%7Ba%3D%22b%22%7D");
        assert_eq!(encode("a b|c"), "a%20b%7Cc");
    }

    #[test]
    fn responses_plain_chunked_and_bad() {
        let (s, b) = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi").unwrap();
        assert_eq!((s, b.as_slice()), (200, &b"hi"[..]));
        let (s, b) = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((s, b.as_slice()), (200, &b"abcde"[..]));
        let (s, _) = parse_response(b"HTTP/1.0 400 Bad Request\r\n\r\nno").unwrap();
        assert_eq!(s, 400);
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhi").is_err());
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n").is_err());
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nff\r\nab")
                .is_err()
        );
    }

    #[test]
    fn chunk_sizes_near_the_end_of_usize_are_refused_not_overflowed() {
        for size in ["ffffffffffffffff", "fffffffffffffffe", "fffffffffffffff0"] {
            let raw = format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\nabc\r\n0\r\n\r\n"
            );
            let e = parse_response(raw.as_bytes()).unwrap_err();
            assert!(e.contains("chunk"), "{size}: {e}");
        }
        // Larger than usize, and longer than any message should quote.
        let raw = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{}\r\nabc\r\n",
            "f".repeat(500)
        );
        let e = parse_response(raw.as_bytes()).unwrap_err();
        assert!(e.len() < 120, "{e}");
        // Chunks that add up to more than the cap on an answer.
        let raw = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            MAX_BODY + 1
        );
        assert!(parse_response(raw.as_bytes()).is_err());
    }

    #[test]
    fn vectors() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"up","instance":"a:9400"},"value":[1700000000.5,"1"]},
            {"metric":{"instance":"b:9400"},"value":[1700000000.5,"NaN"]}]}}"#;
        let v = parse_vector(body).unwrap();
        assert_eq!(v.len(), 1, "NaN left out");
        assert_eq!(v[0].label("instance"), Some("a:9400"));
        assert_eq!((v[0].t, v[0].v), (1_700_000_000.5, 1.0));
        let e = parse_vector(br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#)
            .unwrap_err();
        assert!(e.contains("parse error"), "{e}");
        let e = parse_vector(br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#)
            .unwrap_err();
        assert!(e.contains("matrix"), "{e}");
        assert!(parse_vector(b"<html>").is_err());
    }
}
