//! Prometheus's HTTP query API (`/api/v1/query`), instant queries only, through ureq: `http://`
//! or `https://` (rustls; the webpki roots, or a private CA's PEM file), a bearer token from a
//! file or basic auth (the URL's `user:password@`, or a file), connect and whole-request
//! timeouts, and a cap on the answer's size.
//!
//! Secrets never come from the command line's own words: a token or a password is read from a
//! file ([`Access`]); a password in the URL is sent but never shown ([`Prometheus::base`] leaves
//! it out).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

/// The most bytes an answer may have.
pub const MAX_BODY: usize = 64 << 20;

/// How long a query may take: connecting, and the whole exchange.
pub const TIMEOUT: Duration = Duration::from_secs(3);

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
    /// The transport's error is part of the message (not a `source`): the view shows one line.
    #[error("{url}: {msg}")]
    Transport { url: String, msg: String },
    #[error("{url}: HTTP {status}: {body}{hint}")]
    Status {
        url: String,
        status: u16,
        body: String,
        hint: &'static str,
    },
    #[error("{url}: {msg}")]
    Answer { url: String, msg: String },
}

/// How to reach a Prometheus that wants more than a URL: files holding the secrets, and the CA
/// that signed its certificate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Access {
    /// A file whose text (trimmed) is sent as `Authorization: Bearer TEXT`.
    pub bearer_token_file: Option<PathBuf>,
    /// A file whose first line is `USER:PASSWORD`, sent as basic auth.
    pub basic_auth_file: Option<PathBuf>,
    /// PEM certificates trusted for `https://` instead of the webpki roots.
    pub ca_file: Option<PathBuf>,
}

/// A Prometheus server to ask.
#[derive(Clone)]
pub struct Prometheus {
    /// `scheme://host[:port][/prefix]`, without a trailing slash or any `user:password@`.
    pub base: String,
    agent: ureq::Agent,
    /// The `Authorization` header's value, if any.
    authorization: Option<String>,
}

/// The base URL only: the agent has nothing to show, and the credentials must not be shown.
impl std::fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prometheus")
            .field("base", &self.base)
            .field("authorization", &self.authorization.as_ref().map(|_| "…"))
            .finish()
    }
}

/// A URL taken apart: the base without credentials, and the credentials.
#[derive(Debug, PartialEq)]
struct Parsed {
    base: String,
    userinfo: Option<(String, String)>,
}

fn parse_url(url: &str) -> Result<Parsed, QueryError> {
    let url = url.trim();
    let (scheme, rest) = if let Some(r) = url.strip_prefix("http://") {
        ("http", r)
    } else if let Some(r) = url.strip_prefix("https://") {
        ("https", r)
    } else if url.contains("://") {
        return Err(QueryError::Url(format!(
            "{url}: give Prometheus's http:// or https:// URL, like http://head:9090"
        )));
    } else {
        ("http", url)
    };
    let rest = rest.trim_end_matches('/');
    let (authority, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => {
            let (user, pass) = u.split_once(':').unwrap_or((u, ""));
            (Some((percent_decode(user), percent_decode(pass))), h)
        }
        None => (None, authority),
    };
    let host = match hostport.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => h,
        _ => hostport,
    };
    if host.is_empty() || host == "[]" {
        return Err(QueryError::Url(format!(
            "`{url}` names no host: give Prometheus's URL, like http://head:9090"
        )));
    }
    let base = format!("{scheme}://{hostport}{prefix}");
    ureq::http::Uri::try_from(base.as_str()).map_err(|e| {
        QueryError::Url(format!(
            "{base}: not a URL ({e}): give Prometheus's URL, like http://head:9090"
        ))
    })?;
    Ok(Parsed { base, userinfo })
}

/// `%XX` escapes in a URL's user name or password (`p%40ss` is `p@ss`).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn read_secret(path: &Path, what: &str, option: &str) -> Result<String, QueryError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        QueryError::Url(format!(
            "reading the {what} from {}: {e} (give a readable file to {option})",
            path.display()
        ))
    })?;
    Ok(text)
}

fn basic(user: &str, pass: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
    )
}

impl Prometheus {
    /// Parse `http[s]://[user:password@]host[:port][/prefix]` (the scheme may be left out:
    /// http). A user and password in the URL are sent as basic auth.
    pub fn new(url: &str) -> Result<Prometheus, QueryError> {
        Prometheus::with_access(url, &Access::default())
    }

    /// [`Prometheus::new`] with a token, basic auth or a CA read from the files of `access`.
    pub fn with_access(url: &str, access: &Access) -> Result<Prometheus, QueryError> {
        let parsed = parse_url(url)?;
        let mut authorization = None;
        if let Some(f) = &access.bearer_token_file {
            let token = read_secret(
                f,
                "bearer token",
                "--prometheus-bearer-token-file or [cluster] bearer_token_file",
            )?;
            let token = token.trim();
            if token.is_empty() || token.contains(['\r', '\n']) {
                return Err(QueryError::Url(format!(
                    "{}: the bearer token file should hold the token alone, on one line",
                    f.display()
                )));
            }
            authorization = Some(format!("Bearer {token}"));
        }
        let from_file = match &access.basic_auth_file {
            Some(f) => {
                let text = read_secret(
                    f,
                    "basic auth",
                    "--prometheus-basic-auth-file or [cluster] basic_auth_file",
                )?;
                let line = text.lines().next().unwrap_or_default().trim_end();
                let Some((user, pass)) = line.split_once(':') else {
                    return Err(QueryError::Url(format!(
                        "{}: the basic auth file's first line should be USER:PASSWORD",
                        f.display()
                    )));
                };
                Some((user.to_string(), pass.to_string()))
            }
            None => None,
        };
        let credentials = match (parsed.userinfo, from_file) {
            (Some(_), Some(_)) => {
                return Err(QueryError::Url(format!(
                    "{}: basic auth is given twice, in the URL and in a file: keep one",
                    parsed.base
                )));
            }
            (a, b) => a.or(b),
        };
        if let Some((user, pass)) = credentials {
            if authorization.is_some() {
                return Err(QueryError::Url(format!(
                    "{}: give a bearer token or basic auth, not both",
                    parsed.base
                )));
            }
            authorization = Some(basic(&user, &pass));
        }
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(f) = &access.ca_file {
            tls = tls.root_certs(ureq::tls::RootCerts::Specific(Arc::new(read_ca(f)?)));
        }
        let agent = ureq::Agent::config_builder()
            .timeout_connect(Some(TIMEOUT))
            .timeout_global(Some(TIMEOUT))
            .http_status_as_error(false)
            .user_agent(format!("gpupilot/{}", env!("CARGO_PKG_VERSION")))
            .accept("application/json")
            .tls_config(tls.build())
            .build()
            .new_agent();
        Ok(Prometheus {
            base: parsed.base,
            agent,
            authorization,
        })
    }

    /// An instant query: the series of the vector it returns.
    pub fn query(&self, promql: &str) -> Result<Vec<Series>, QueryError> {
        let path = format!("/api/v1/query?query={}", encode(promql));
        let body = self.get(&path)?;
        parse_vector(&body).map_err(|msg| QueryError::Answer {
            url: self.base.clone(),
            msg,
        })
    }

    /// GET `path` (after the base URL); the body of a 200 answer.
    pub fn get(&self, path: &str) -> Result<Vec<u8>, QueryError> {
        let mut req = self.agent.get(format!("{}{path}", self.base));
        if let Some(a) = &self.authorization {
            req = req.header("Authorization", a);
        }
        let mut resp = req.call().map_err(|e| self.transport(e))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let mut first = Vec::new();
            // The start of the body says why; a body that cannot be read says nothing more.
            let _ = resp
                .body_mut()
                .as_reader()
                .take(4096)
                .read_to_end(&mut first);
            let text: String = String::from_utf8_lossy(&first).chars().take(300).collect();
            let hint = match status {
                401 | 403 => {
                    "; check the credentials: --prometheus-bearer-token-file, a user and \
                     password in the URL, or [cluster] bearer_token_file / basic_auth_file"
                }
                404 => "; is this Prometheus's base URL (with its path prefix, if any)?",
                _ => "",
            };
            return Err(QueryError::Status {
                url: self.base.clone(),
                status,
                body: text.trim().to_string(),
                hint,
            });
        }
        resp.body_mut()
            .with_config()
            .limit(MAX_BODY as u64)
            .read_to_vec()
            .map_err(|e| self.transport(e))
    }

    /// A transport error in words that say what to do.
    fn transport(&self, e: ureq::Error) -> QueryError {
        use ureq::Error as E;
        let msg = match &e {
            E::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                format!("connection refused ({io}): is Prometheus running and listening there?")
            }
            E::HostNotFound => "host not found: check the host name in the URL".to_string(),
            E::ConnectionFailed => {
                "could not connect: is Prometheus running and reachable from here?".to_string()
            }
            E::Timeout(t) => format!(
                "no answer within {} s ({t}): is Prometheus reachable from here?",
                TIMEOUT.as_secs()
            ),
            E::BodyExceedsLimit(_) => format!("answer larger than {} MiB", MAX_BODY >> 20),
            E::Rustls(_) | E::Tls(_) => format!(
                "TLS: {e}: if Prometheus's certificate is signed by a private CA, give the CA's \
                 PEM file with --prometheus-ca FILE or [cluster] ca_file; the certificate must \
                 name the host of the URL"
            ),
            E::Protocol(_) => format!("the answer is not HTTP ({e}); is this Prometheus's URL?"),
            E::Io(io) if io.to_string().contains("certificate") => format!(
                "TLS: {io}: if Prometheus's certificate is signed by a private CA, give the \
                 CA's PEM file with --prometheus-ca FILE or [cluster] ca_file"
            ),
            _ => e.to_string(),
        };
        QueryError::Transport {
            url: self.base.clone(),
            msg,
        }
    }
}

/// The certificates of a PEM file.
fn read_ca(path: &Path) -> Result<Vec<ureq::tls::Certificate<'static>>, QueryError> {
    let bad = |why: String| {
        QueryError::Url(format!(
            "{}: {why} (--prometheus-ca or [cluster] ca_file wants the PEM file of the CA that \
             signed Prometheus's certificate)",
            path.display()
        ))
    };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        if let ureq::tls::PemItem::Certificate(c) = item.map_err(|e| bad(e.to_string()))? {
            certs.push(c);
        }
    }
    if certs.is_empty() {
        return Err(bad(
            "no certificate (-----BEGIN CERTIFICATE-----) in it".into()
        ));
    }
    Ok(certs)
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
        let p = |u| parse_url(u).unwrap();
        assert_eq!(p("http://head:9090/").base, "http://head:9090");
        assert_eq!(p("127.0.0.1:9091/prom").base, "http://127.0.0.1:9091/prom");
        assert_eq!(p("http://[::1]:9090").base, "http://[::1]:9090");
        assert_eq!(p("https://head:9090").base, "https://head:9090");
        let u = p("https://ann:p%40ss@head:9090/prom/");
        assert_eq!(u.base, "https://head:9090/prom", "no password shown");
        assert_eq!(u.userinfo, Some(("ann".into(), "p@ss".into())));
        assert!(parse_url("ftp://x").is_err());
        assert!(parse_url("http://").is_err());
        assert!(parse_url("http://u:p@").is_err());
        let d = format!(
            "{:?}",
            Prometheus::new("http://ann:secret@head:9090").unwrap()
        );
        assert!(!d.contains("secret"), "{d}");
    }

    #[test]
    fn encoding() {
        assert_eq!(encode("up{a=\"b\"}"), "up%7Ba%3D%22b%22%7D");
        assert_eq!(encode("a b|c"), "a%20b%7Cc");
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(basic("ann", "p@ss"), "Basic YW5uOnBAc3M=");
    }

    #[test]
    fn access_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let f = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            Some(p)
        };
        let token = Access {
            bearer_token_file: f("token", "abc\n"),
            ..Access::default()
        };
        let p = Prometheus::with_access("http://h:9090", &token).unwrap();
        assert_eq!(p.authorization.as_deref(), Some("Bearer abc"));
        let empty = Access {
            bearer_token_file: f("empty", "\n"),
            ..Access::default()
        };
        let e = Prometheus::with_access("http://h:9090", &empty).unwrap_err();
        assert!(e.to_string().contains("token"), "{e}");
        let both = Access {
            basic_auth_file: f("basic", "ann:pw\n"),
            ..token.clone()
        };
        let e = Prometheus::with_access("http://h:9090", &both).unwrap_err();
        assert!(e.to_string().contains("not both"), "{e}");
        let twice = Access {
            basic_auth_file: f("basic", "ann:pw\n"),
            ..Access::default()
        };
        assert!(Prometheus::with_access("http://u:p@h:9090", &twice).is_err());
        let p = Prometheus::with_access("http://h:9090", &twice).unwrap();
        assert_eq!(p.authorization, Some(basic("ann", "pw")));
        let bad_ca = Access {
            ca_file: f("ca.pem", "not a certificate"),
            ..Access::default()
        };
        let e = Prometheus::with_access("https://h:9090", &bad_ca).unwrap_err();
        assert!(e.to_string().contains("BEGIN CERTIFICATE"), "{e}");
        let missing = Access {
            bearer_token_file: Some(dir.path().join("nowhere")),
            ..Access::default()
        };
        let e = Prometheus::with_access("http://h:9090", &missing).unwrap_err();
        assert!(
            e.to_string().contains("--prometheus-bearer-token-file"),
            "{e}"
        );
    }

    #[test]
    fn errors_say_what_to_do() {
        // A port nothing listens on.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let e = Prometheus::new(&format!("http://127.0.0.1:{port}"))
            .unwrap()
            .query("up")
            .unwrap_err()
            .to_string();
        assert!(e.contains("refused") || e.contains("connect"), "{e}");
        // A server that answers 500 with a reason, and one that answers no JSON.
        for (answer, want) in [
            (
                "HTTP/1.1 500 Oops\r\nContent-Length: 9\r\n\r\nit broke\n",
                "HTTP 500: it broke",
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n<html>",
                "not a Prometheus answer",
            ),
        ] {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            let server = std::thread::spawn(move || {
                use std::io::Write;
                let (mut s, _) = l.accept().unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && s.read(&mut b).unwrap_or(0) == 1 {
                    head.push(b[0]);
                }
                s.write_all(answer.as_bytes()).unwrap();
            });
            let e = Prometheus::new(&format!("http://127.0.0.1:{port}"))
                .unwrap()
                .query("up")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
            server.join().unwrap();
        }
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
