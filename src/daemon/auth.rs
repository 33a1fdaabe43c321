//! Who is on the other end of a connection, and whether they may use this daemon.
//!
//! The kernel tells (SO_PEERCRED: the peer's uid, gid and pid when it connected); nothing the
//! peer says about itself is trusted. The same user may act, and so may root; anyone else is
//! refused with a message that says how to get a daemon of their own.

use std::os::fd::AsFd;

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

    /// `alice (uid 1000) via gpupilot (pid 4242)`: the `by` of events.
    pub fn describe(&self) -> String {
        let who = match user_name(self.uid) {
            Some(name) => format!("{name} (uid {})", self.uid),
            None => format!("uid {}", self.uid),
        };
        match self.pid {
            Some(pid) => match process_name(pid) {
                Some(comm) => format!("{who} via {comm} (pid {pid})"),
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

/// What a refused peer is told.
pub fn refusal_message(daemon_uid: u32, peer_uid: u32) -> String {
    let owner = match user_name(daemon_uid) {
        Some(n) => format!("{n} (uid {daemon_uid})"),
        None => format!("uid {daemon_uid}"),
    };
    format!(
        "permission denied: this gpupilot daemon belongs to {owner}, and uid {peer_uid} may not use it; \
         start a daemon of your own (`gpupilot daemon --detach`, with your own GPUPILOT_HOME or XDG_RUNTIME_DIR)"
    )
}

/// A user's name from `/etc/passwd` (no NSS: enough for the event log).
pub fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        let name = f.next()?;
        let id: u32 = f.nth(1)?.parse().ok()?;
        (id == uid).then(|| name.to_string())
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
            "a root daemon does not serve users (yet)"
        );
        let msg = refusal_message(1000, 1001);
        assert!(msg.starts_with("permission denied:"), "{msg}");
        assert!(
            msg.contains("uid 1001 may not use it") && msg.contains("gpupilot daemon --detach"),
            "{msg}"
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
    fn root_has_a_name() {
        assert_eq!(user_name(0).as_deref(), Some("root"));
    }
}
