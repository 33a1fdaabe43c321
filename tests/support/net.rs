//! Loopback networking for the tests: a free port, a closed one, one HTTP GET.

use std::io::{Read as _, Write as _};
use std::time::Duration;

/// A TCP port free on loopback now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A loopback TCP port where nothing listens, for as long as the returned socket lives: it is
/// bound there and never listens, so connecting is refused and no other test can take the port
/// meanwhile, as it could one `free_port` found free.
pub fn closed_port() -> (rustix::fd::OwnedFd, u16) {
    use rustix::net::{AddressFamily, SocketType, bind, getsockname, socket};
    use std::net::{Ipv4Addr, SocketAddrV4};
    let fd = socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    bind(&fd, &SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = SocketAddrV4::try_from(getsockname(&fd).unwrap())
        .unwrap()
        .port();
    (fd, port)
}

/// `GET path` on loopback `port` (one request, the connection closed after it): the answer's
/// head and body.
pub fn http_get(port: u16, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}
