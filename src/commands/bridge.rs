//! `gpupilot bridge`: this node's daemon on stdin and stdout, for `ssh NODE gpupilot bridge`
//! (what `gpupilot attach --host NODE` runs). Bytes pass through unchanged in both directions:
//! the daemon checks who is calling (the SSH user, through the socket's peer credentials) and
//! the protocol is the local one, so there is nothing new to secure.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use anyhow::Context as _;

use super::connect_or_spawn;
use crate::cli::GlobalArgs;
use crate::config::Paths;

pub fn bridge(g: &GlobalArgs) -> anyhow::Result<ExitCode> {
    let paths = Paths::from_env();
    // A node whose daemon is not running gets one, as its console would.
    let probe = connect_or_spawn(g, &paths)?;
    let socket = probe.socket().to_path_buf();
    drop(probe);
    let stream = UnixStream::connect(&socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let mut to_daemon = stream.try_clone()?;
    let upstream = std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_daemon.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        // The client is done: let the daemon see the end of the connection.
        let _ = to_daemon.shutdown(std::net::Shutdown::Write);
    });
    let mut from_daemon = stream;
    let mut stdout = std::io::stdout().lock();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from_daemon.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if stdout
                    .write_all(&buf[..n])
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    // The daemon closed (or stdout did): nothing more to carry. The stdin thread may be
    // blocked in a read; the process's exit ends it.
    drop(upstream);
    Ok(ExitCode::SUCCESS)
}
