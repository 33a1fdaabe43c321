//! Where a client finds the daemon and how each end checks the other: a leaf below both
//! `client` and `daemon`, which uses only [`crate::config`]'s paths and
//! [`crate::text::printable`].
//!
//! - [`socket_path`], [`log_path`]: the daemon's socket and its log for a set of paths.
//! - [`Peer`]: the process at the other end of a Unix socket, from the kernel (SO_PEERCRED);
//!   nothing the peer says about itself is trusted.
//! - [`peer_allowed`]: the rule both ends apply: the same user, or root. The daemon refuses
//!   other users (the system daemon has its own policy, in `daemon::auth`); a client refuses a
//!   daemon that runs as anyone else.

use std::os::fd::AsFd;
use std::path::PathBuf;

use crate::config::Paths;
use crate::text::printable;

/// The socket's file name in the runtime directory.
pub const SOCKET_NAME: &str = "daemon.sock";
/// The daemon's log in the state directory.
pub const LOG_NAME: &str = "daemon.log";

/// Where the daemon's socket is for these paths.
pub fn socket_path(paths: &Paths) -> PathBuf {
    paths.runtime.join(SOCKET_NAME)
}

/// Where the daemon logs for these paths.
pub fn log_path(paths: &Paths) -> PathBuf {
    paths.state.join(LOG_NAME)
}

/// The process at the other end of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    /// Absent when the kernel does not say (a peer in another pid namespace).
    pub pid: Option<u32>,
}

impl Peer {
    /// The peer's credentials, from the kernel.
    pub fn of(socket: impl AsFd) -> std::io::Result<Peer> {
        let cred = rustix::net::sockopt::socket_peercred(socket)?;
        let pid = cred.pid.as_raw_nonzero().get();
        Ok(Peer {
            uid: cred.uid.as_raw(),
            gid: cred.gid.as_raw(),
            pid: u32::try_from(pid).ok().filter(|&p| p > 0),
        })
    }

    /// `alice (uid 1000) via gpupilot (pid 4242)`: the `by` of events, shown by every command,
    /// the console and the daemon's log. The process name is whatever the peer chose to call
    /// itself, so it is made [`printable`] here, once, for every reader.
    pub fn describe(&self) -> String {
        let who = match user_name(self.uid) {
            Some(name) => format!("{} (uid {})", printable(&name), self.uid),
            None => format!("uid {}", self.uid),
        };
        match self.pid {
            Some(pid) => match process_name(pid) {
                Some(comm) => format!("{who} via {} (pid {pid})", printable(&comm)),
                None => format!("{who} via pid {pid}"),
            },
            None => who,
        }
    }
}

/// Whether a peer running as `peer_uid` may use a daemon running as `daemon_uid`: the same
/// user, or root.
pub fn peer_allowed(daemon_uid: u32, peer_uid: u32) -> bool {
    peer_uid == daemon_uid || peer_uid == 0
}

/// A user's name from `/etc/passwd` (no NSS: enough for the event log).
pub fn user_name(uid: u32) -> Option<String> {
    let file = std::fs::File::open("/etc/passwd").ok()?;
    name_in_passwd(file, uid)
}

/// The most of a system database (`/etc/passwd`, `/etc/group`) read, and its longest line: a
/// site's directory may be large, and a group of many members makes a long line.
const MAX_DB: u64 = 64 << 20;
const MAX_DB_LINE: usize = 1 << 20;

/// What `f` finds first in the lines of a system database (`/etc/passwd`, `/etc/group`), read a
/// line at a time and bounded: a line longer than [`MAX_DB_LINE`], or one that is not text, is
/// passed over rather than making the whole file unreadable.
pub fn find_in_db<T>(r: impl std::io::Read, mut f: impl FnMut(&str) -> Option<T>) -> Option<T> {
    let mut found = None;
    let r = std::io::BufReader::new(r.take(MAX_DB));
    crate::config::safe_fs::visit_lines(r, MAX_DB_LINE, |line| {
        found = line
            .and_then(|l| std::str::from_utf8(l).ok())
            .and_then(&mut f);
        if found.is_some() {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    })
    .ok()?;
    found
}

/// The uid and primary gid of the user `name` in `/etc/passwd` (no NSS).
pub fn user_ids(name: &str) -> Option<(u32, u32)> {
    let file = std::fs::File::open("/etc/passwd").ok()?;
    ids_in_passwd(file, name)
}

/// The uid and gid of `name` in a passwd file.
fn ids_in_passwd(r: impl std::io::Read, name: &str) -> Option<(u32, u32)> {
    find_in_db(r, |line| {
        let mut f = line.split(':');
        if f.next()? != name {
            return None;
        }
        let (uid, gid) = (f.nth(1)?.parse().ok()?, f.next()?.parse().ok()?);
        Some((uid, gid))
    })
}

/// The name of `uid` in a passwd file.
fn name_in_passwd(r: impl std::io::Read, uid: u32) -> Option<String> {
    find_in_db(r, |line| {
        let mut f = line.split(':');
        let (name, id) = (f.next()?, f.nth(1)?);
        (id.parse() == Ok(uid)).then(|| name.to_string())
    })
}

/// A process's command name (`/proc/PID/comm`).
fn process_name(pid: u32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let comm = comm.trim();
    (!comm.is_empty()).then(|| comm.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_user_and_root_may_act_others_not() {
        assert!(peer_allowed(1000, 1000), "the same user");
        assert!(peer_allowed(1000, 0), "root");
        assert!(peer_allowed(0, 0), "root's daemon, root");
        assert!(!peer_allowed(1000, 1001), "another user");
        assert!(
            !peer_allowed(0, 1000),
            "root's own daemon serves root; users use the system daemon (`--system`)"
        );
    }

    #[test]
    fn a_socket_pair_knows_its_peer() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let peer = Peer::of(&a).unwrap();
        assert_eq!(peer.uid, rustix::process::getuid().as_raw());
        assert_eq!(peer.pid, Some(std::process::id()));
        let d = peer.describe();
        assert!(d.contains(&format!("(pid {})", std::process::id())), "{d}");
        assert!(d.contains(&format!("uid {}", peer.uid)), "{d}");
    }

    #[test]
    fn a_hostile_process_name_is_described_printably() {
        // The kernel names a process after the file it runs: a link whose name clears the
        // screen and forges a line gives its peer that name.
        let dir = tempfile::tempdir().unwrap();
        let name = "gp\u{1b}[2J\nFAKE";
        let link = dir.path().join(name);
        std::os::unix::fs::symlink("/bin/sleep", &link).unwrap();
        let mut child = std::process::Command::new(&link).arg("30").spawn().unwrap();
        // Until the child has exec'd, it still bears this thread's name.
        let t = std::time::Instant::now();
        while process_name(child.id()).is_none_or(|c| !c.starts_with("gp"))
            && t.elapsed() < std::time::Duration::from_secs(10)
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let peer = Peer {
            uid: 0,
            gid: 0,
            pid: Some(child.id()),
        };
        let d = peer.describe();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            d,
            format!("root (uid 0) via gp\\x1b[2J\\nFAKE (pid {})", child.id())
        );
    }

    #[test]
    fn root_has_a_name() {
        assert_eq!(user_name(0).as_deref(), Some("root"));
        // Read a line at a time: a line past the bound, or not text, is passed over.
        let long = format!("{}:x:5:5::/:/bin/sh\n", "a".repeat(MAX_DB_LINE));
        let passwd = format!(
            "root:x:0:0::/root:/bin/sh\n{long}\u{fffd}\nbob:x:1000:1000::/home/bob:/bin/sh"
        );
        let mut bytes = passwd.into_bytes();
        let odd = bytes.iter().position(|&b| b == 0xef).unwrap();
        bytes[odd] = 0xff;
        assert_eq!(name_in_passwd(&bytes[..], 1000).as_deref(), Some("bob"));
        assert_eq!(ids_in_passwd(&bytes[..], "bob"), Some((1000, 1000)));
        assert_eq!(ids_in_passwd(&bytes[..], "bo"), None);
        assert_eq!(name_in_passwd(&bytes[..], 0).as_deref(), Some("root"));
        assert_eq!(name_in_passwd(&bytes[..], 5), None);
        assert_eq!(name_in_passwd(&bytes[..], 7), None);
    }
}
