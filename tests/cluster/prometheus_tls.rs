//! The cluster view's query client against an HTTPS Prometheus stand-in on loopback: a CA and a
//! certificate for 127.0.0.1 made here (rcgen), served with rustls, answering an instant vector
//! only to the right `Authorization` header. The client with the CA file and the token gets the
//! series; without the CA it fails naming the certificate; a wrong token is a clear 401; a user
//! and password in the URL are sent as basic auth. Then a real Prometheus behind its own TLS
//! and basic auth (`--web.config.file`, the same kind of certificate): the client with the CA
//! and the user's password file reads it; a wrong password, a bearer token and a missing CA
//! each fail with a clear message.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::support::net::free_port;
use crate::support::peers::peer;
use crate::support::prometheus::PrometheusProc;
use crate::support::wait::poll;
use gpupilot::cluster::query::{Access, Prometheus};

const TOKEN: &str = "s3cret-token";
/// `ann:p@ss`, as basic auth sends it.
const BASIC: &str = "Basic YW5uOnBAc3M=";

const VECTOR: &str = r#"{"status":"success","data":{"resultType":"vector","result":[
{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","Hostname":"n1","gpu":"0"},"value":[1700000000.5,"87"]}]}}"#;

/// A CA, a certificate for 127.0.0.1 signed by it, and the HTTPS server on a free port.
struct Server {
    port: u16,
    ca_pem: String,
}

/// A CA (its PEM), and a certificate for 127.0.0.1 it signed with the certificate's key.
struct Certs {
    ca_pem: String,
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

fn certs() -> Certs {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    Certs {
        ca_pem: ca.pem(),
        cert,
        key,
    }
}

fn start() -> Server {
    let Certs { ca_pem, cert, key } = certs();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(tcp) = tcp else { continue };
            let config = config.clone();
            std::thread::spawn(move || {
                tcp.set_read_timeout(Some(Duration::from_secs(5))).ok();
                tcp.set_write_timeout(Some(Duration::from_secs(5))).ok();
                let Ok(conn) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match tls.read(&mut b) {
                        Ok(1) => head.push(b[0]),
                        _ => return, // a failed handshake, or a client gone
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let auth = head.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("authorization")
                        .then(|| v.trim().to_string())
                });
                let ok = head.starts_with("GET /api/v1/query?query=")
                    && matches!(auth.as_deref(), Some(a) if a == format!("Bearer {TOKEN}") || a == BASIC);
                let (status, body) = if ok {
                    ("200 OK", VECTOR)
                } else {
                    ("401 Unauthorized", "Unauthorized\n")
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(answer.as_bytes());
                let _ = tls.flush();
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    Server { port, ca_pem }
}

/// Why asking `url` for `up` with `access` fails.
fn refusal(url: &str, access: &Access) -> String {
    Prometheus::with_access(url, access)
        .unwrap()
        .query("up")
        .unwrap_err()
        .to_string()
}

/// `access` without its CA file: the webpki roots do not know the CA, and the message says so
/// and what to give.
fn without_the_ca(url: &str, access: &Access) {
    let no_ca = Access {
        ca_file: None,
        ..access.clone()
    };
    let e = refusal(url, &no_ca);
    assert!(
        e.contains("certificate") && e.contains("--prometheus-ca"),
        "{e}"
    );
}

fn file(dir: &tempfile::TempDir, name: &str, text: &str) -> Option<PathBuf> {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    Some(p)
}

#[test]
fn https_with_a_private_ca_and_a_bearer_token() {
    let server = start();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("https://127.0.0.1:{}", server.port);
    let access = Access {
        bearer_token_file: file(&dir, "token", &format!("{TOKEN}\n")),
        ca_file: file(&dir, "ca.pem", &server.ca_pem),
        ..Access::default()
    };
    let series = Prometheus::with_access(&url, &access)
        .unwrap()
        .query("DCGM_FI_DEV_GPU_UTIL")
        .unwrap();
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].label("Hostname"), Some("n1"));
    assert_eq!(series[0].v, 87.0);

    without_the_ca(&url, &access);

    // A wrong token: HTTP 401, the server's words, and where the credentials come from.
    let wrong = Access {
        bearer_token_file: file(&dir, "wrong", "not-the-token\n"),
        ..access.clone()
    };
    let e = refusal(&url, &wrong);
    assert!(
        e.contains("HTTP 401") && e.contains("Unauthorized") && e.contains("bearer"),
        "{e}"
    );
    assert!(
        !e.contains("not-the-token"),
        "the token is never shown: {e}"
    );
}

#[test]
fn basic_auth_from_the_url_is_sent_and_never_shown() {
    let server = start();
    let dir = tempfile::tempdir().unwrap();
    let access = Access {
        ca_file: file(&dir, "ca.pem", &server.ca_pem),
        ..Access::default()
    };
    let prom = Prometheus::with_access(
        &format!("https://ann:p%40ss@127.0.0.1:{}", server.port),
        &access,
    )
    .unwrap();
    assert!(
        !prom.base.contains("p%40ss") && !prom.base.contains("ann"),
        "{}",
        prom.base
    );
    assert_eq!(prom.query("up").unwrap().len(), 1);
    // The wrong password is refused by the server, and the message does not repeat it.
    let prom = Prometheus::with_access(
        &format!("https://ann:nope@127.0.0.1:{}", server.port),
        &access,
    )
    .unwrap();
    let e = prom.query("up").unwrap_err().to_string();
    assert!(e.contains("HTTP 401") && !e.contains("nope"), "{e}");
}

/// The password of `ann` on the real Prometheus below, and its bcrypt hash (cost 4, so that
/// each request's check is quick), as Prometheus's web config wants it.
const PASSWORD: &str = "p@ss-w0rd";
const PASSWORD_BCRYPT: &str = "$2b$04$MrQOWmpTOUvz8a7oGoLVP.KxcSLGM8nNuvw8SAhP.p200HBH7P2e6";

#[test]
fn a_real_prometheus_behind_https_and_basic_auth() {
    let Some(prometheus) = peer("prometheus") else {
        return;
    };
    // Prometheus's own TLS and basic auth (`--web.config.file`), with a certificate made here.
    let Certs { ca_pem, cert, key } = certs();
    let dir = tempfile::tempdir().unwrap();
    let cert_file = file(&dir, "cert.pem", &cert.pem()).unwrap();
    let key_file = file(&dir, "key.pem", &key.serialize_pem()).unwrap();
    let web = file(
        &dir,
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  ann: '{PASSWORD_BCRYPT}'\n",
            cert_file.display(),
            key_file.display()
        ),
    )
    .unwrap();
    let server = PrometheusProc::start(
        &prometheus,
        &[format!("127.0.0.1:{}", free_port())],
        &[format!("--web.config.file={}", web.display())],
    );
    let url = format!("https://127.0.0.1:{}", server.port);
    let access = Access {
        basic_auth_file: file(&dir, "auth", &format!("ann:{PASSWORD}\n")),
        ca_file: file(&dir, "ca.pem", &ca_pem),
        ..Access::default()
    };
    let prom = Prometheus::with_access(&url, &access).unwrap();
    poll(
        "Prometheus to answer over HTTPS",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || match prom.query("vector(1)") {
            Ok(v) if v.len() == 1 && v[0].v == 1.0 => Ok(()),
            other => Err(format!(" ({other:?}); its log:\n{}", server.log())),
        },
    );
    // The scrape target (a closed port) is down, and Prometheus says so through the client.
    poll(
        "the target's `up` series",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || match prom.query("up") {
            Ok(v) if v.len() == 1 && v[0].v == 0.0 => Ok(()),
            other => Err(format!(" ({other:?})")),
        },
    );

    // A wrong password: Prometheus's 401, said with where the credentials come from.
    let wrong = Access {
        basic_auth_file: file(&dir, "wrong", "ann:nope\n"),
        ..access.clone()
    };
    let e = refusal(&url, &wrong);
    assert!(e.contains("HTTP 401") && !e.contains("nope"), "{e}");
    // A bearer token where Prometheus wants basic auth: refused the same way, and the message
    // names the token's option.
    let token = Access {
        basic_auth_file: None,
        bearer_token_file: file(&dir, "token", "s3cret-token\n"),
        ..access.clone()
    };
    let e = refusal(&url, &token);
    assert!(
        e.contains("HTTP 401") && e.contains("bearer") && !e.contains("s3cret"),
        "{e}"
    );
    without_the_ca(&url, &access);
    // Plain HTTP to the TLS port: Prometheus answers 400, an error here.
    let plain = Prometheus::new(&format!("http://127.0.0.1:{}", server.port)).unwrap();
    assert!(plain.query("up").is_err());
}
