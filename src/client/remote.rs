//! A daemon on another node, reached through a program's stdin and stdout: `ssh NODE gpupilot
//! bridge` (see `commands::bridge`). The program gets one end of a socket pair as its stdin and
//! stdout; the client speaks the ordinary protocol over the other end, so everything a local
//! client does works remotely, authenticated by SSH and nothing new.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Client, ClientError};

/// How a connection was made, so that it can be made again (the console reconnects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A local daemon's socket.
    Socket(PathBuf),
    /// A program that bridges to a daemon (`ssh NODE gpupilot bridge`); `label` names it in
    /// messages (`ssh:gpu-node-07`).
    Command { argv: Vec<OsString>, label: String },
}

impl Origin {
    /// The argv of `ssh [SSH_OPTIONS] HOST gpupilot bridge`; `ssh` is `$GPUPILOT_SSH` (split
    /// into words) when set, so tests and unusual setups can add options.
    pub fn ssh(host: &str) -> Origin {
        let ssh = std::env::var("GPUPILOT_SSH").unwrap_or_else(|_| "ssh".into());
        let remote =
            std::env::var("GPUPILOT_REMOTE_COMMAND").unwrap_or_else(|_| "gpupilot bridge".into());
        let mut argv: Vec<OsString> = shell_words::split(&ssh)
            .unwrap_or_else(|_| vec![ssh.clone()])
            .into_iter()
            .map(OsString::from)
            .collect();
        // Fail rather than prompt: the console owns the terminal.
        argv.extend(["-o".into(), "BatchMode=yes".into()]);
        argv.extend(["-o".into(), "ConnectTimeout=10".into()]);
        argv.push(host.into());
        argv.extend(
            shell_words::split(&remote)
                .unwrap_or_else(|_| vec![remote.clone()])
                .into_iter()
                .map(OsString::from),
        );
        Origin::Command {
            argv,
            label: format!("ssh:{host}"),
        }
    }

    /// Connect again the same way.
    pub fn connect(&self, client_name: &str) -> Result<Client, ClientError> {
        match self {
            Origin::Socket(socket) => Client::connect_to(socket, client_name),
            Origin::Command { argv, label } => connect_command(argv, label, client_name),
        }
    }

    /// A name for messages: the socket's path, or `ssh:HOST`.
    pub fn describe(&self) -> String {
        match self {
            Origin::Socket(s) => s.display().to_string(),
            Origin::Command { label, .. } => label.clone(),
        }
    }
}

/// The bridging program; killed when the client that uses it is dropped.
pub(super) struct BridgeProcess {
    child: Child,
}

impl Drop for BridgeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The most of a bridging program's stderr kept for an error message.
const MAX_SAID: usize = 16 * 1024;

/// Start `argv` (a bridge: `ssh NODE gpupilot bridge`) with one end of a socket pair as its
/// stdin and stdout; the other end, the child, and what it says on stderr (kept for error
/// messages, at most 16 KiB, read on a thread of its own so that it never blocks the program).
pub fn spawn_bridge(argv: &[OsString]) -> std::io::Result<(UnixStream, Child, Arc<Mutex<String>>)> {
    let (ours, theirs) = UnixStream::pair()?;
    let theirs_out: OwnedFd = theirs.try_clone()?.into();
    let theirs_in: OwnedFd = theirs.into();
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::from(theirs_in))
        .stdout(Stdio::from(theirs_out))
        .stderr(Stdio::piped())
        .spawn()?;
    let said = Arc::new(Mutex::new(String::new()));
    if let Some(mut err) = child.stderr.take() {
        let said = Arc::clone(&said);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut s = said.lock().unwrap_or_else(|e| e.into_inner());
                if s.len() < MAX_SAID {
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
    }
    Ok((ours, child, said))
}

fn connect_command(
    argv: &[OsString],
    label: &str,
    client_name: &str,
) -> Result<Client, ClientError> {
    let (ours, mut child, said) = spawn_bridge(argv)
        .map_err(|e| ClientError::Remote(format!("running {}: {e}", argv[0].to_string_lossy())))?;
    match Client::handshake(ours, PathBuf::from(label), client_name) {
        Ok(mut client) => {
            client.origin = Origin::Command {
                argv: argv.to_vec(),
                label: label.into(),
            };
            client.link = Some(BridgeProcess { child });
            Ok(client)
        }
        Err(e) => {
            // Give the program a moment to finish saying why (ssh prints, then exits).
            let deadline = Instant::now() + Duration::from_secs(2);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let status = child.wait().ok();
            std::thread::sleep(Duration::from_millis(50));
            let said = said
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .trim()
                .to_string();
            let program = argv
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ");
            let why = match (said.is_empty(), status) {
                (false, _) => said,
                (true, Some(s)) if !s.success() => format!("it exited with {s}"),
                _ => e.to_string(),
            };
            Err(ClientError::Remote(format!(
                "no gpupilot daemon reachable through `{program}`: {why}"
            )))
        }
    }
}
