//! Who is on the other end of a connection, and whether they may use this daemon.
//!
//! The kernel tells (SO_PEERCRED: the peer's uid, gid and pid when it connected); nothing the
//! peer says about itself is trusted. On a user's daemon the same user may act, and so may
//! root; anyone else is refused with a message that says how to get a daemon of their own.
//!
//! The system daemon (`gpupilot daemon --system`, root's) serves every local user: anyone may
//! watch; GPU settings are for root and the members of one group (`gpupilot`, or
//! `--allow-group`); runs are root's alone. [`decide`] is that policy as a pure function, tested
//! here; the facts it needs (the caller's groups from `/proc/PID/status`, the group from
//! `/etc/group`) are read by the functions beside it.

use crate::ipc::{Peer, peer_allowed, user_name};

/// The group whose members may change GPU settings on a system daemon, unless told otherwise.
pub const DEFAULT_GROUP: &str = "gpupilot";

/// How a daemon serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// A user's own daemon (running as `uid`): that user and root may use it, for everything.
    User { uid: u32 },
    /// The system daemon: every local user may watch, root and the members of `group` may
    /// change GPU settings, and only root may start, stop, read or steer runs.
    System { group: String },
}

/// What a caller wants, as far as who may do it is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Open a connection (and say hello).
    Connect,
    /// Read the node: status, telemetry, history, events, power settings, the run list.
    Watch,
    /// Change a GPU setting: power caps, clock locks, the target temperature, the thermal
    /// governor, the node power budget.
    GpuSettings,
    /// Start, stop, signal or steer a run, read its output, or be its trainer.
    Runs,
}

/// The facts about a caller that a decision needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    /// From the kernel (SO_PEERCRED).
    pub uid: u32,
    /// The primary group, from the kernel.
    pub gid: u32,
    /// Supplementary groups (`/proc/PID/status`); empty when unknown.
    pub groups: Vec<u32>,
    /// The user's name (`/etc/passwd`), for the group's member list and for messages.
    pub name: Option<String>,
}

impl Identity {
    /// The peer's identity; `with_groups`: also read its supplementary groups (a system
    /// daemon needs them, a user's daemon does not).
    pub fn of(peer: &Peer, with_groups: bool) -> Identity {
        Identity {
            uid: peer.uid,
            gid: peer.gid,
            groups: match (with_groups, peer.pid) {
                (true, Some(pid)) => proc_groups(pid, peer.uid),
                _ => Vec::new(),
            },
            name: user_name(peer.uid),
        }
    }

    /// `alice (uid 1000)`, or `uid 1000`.
    fn who(&self) -> String {
        match &self.name {
            Some(n) => format!("{n} (uid {})", self.uid),
            None => format!("uid {}", self.uid),
        }
    }
}

/// A group as `/etc/group` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    pub name: String,
    pub gid: u32,
    /// User names listed as members (not those whose primary group it is).
    pub members: Vec<String>,
}

/// What the policy says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Refused: `reason` in a few words for the event log, `message` for the caller (what to
    /// do about it).
    Deny {
        reason: String,
        message: String,
    },
}

/// Whether `who` may do `access` (the request `kind`, for messages) on a daemon in `mode`.
/// `group`: the allowed group as `/etc/group` has it now (None: no such group); consulted
/// only for GPU settings on a system daemon.
pub fn decide(
    mode: &Mode,
    who: &Identity,
    access: Access,
    kind: &str,
    group: Option<&GroupEntry>,
) -> Verdict {
    match mode {
        Mode::User { uid } => {
            if peer_allowed(*uid, who.uid) {
                Verdict::Allow
            } else {
                Verdict::Deny {
                    reason: "another user".into(),
                    message: refusal_message(*uid, who.uid),
                }
            }
        }
        Mode::System { .. } if who.uid == 0 => Verdict::Allow,
        Mode::System { group: name } => match access {
            Access::Connect | Access::Watch => Verdict::Allow,
            Access::GpuSettings if group.is_some_and(|g| is_member(who, g)) => Verdict::Allow,
            Access::GpuSettings => {
                let user = who.name.clone().unwrap_or_else(|| "USER".into());
                let fix = match group {
                    Some(_) => format!(
                        "ask an administrator to add you (`sudo usermod -aG {name} {user}`, then \
                         log in again)"
                    ),
                    None => format!(
                        "group `{name}` does not exist on this node: an administrator creates it \
                         and adds you (`sudo groupadd {name}`, `sudo usermod -aG {name} {user}`), \
                         or starts the daemon with `--allow-group GROUP`"
                    ),
                };
                Verdict::Deny {
                    reason: format!("{kind}: not root and not in group {name}"),
                    message: format!(
                        "permission denied: changing GPU settings ({kind}) on the system daemon \
                         is for root and the members of group `{name}`, and {} is not one: {fix}; \
                         watching needs no group",
                        who.who()
                    ),
                }
            }
            Access::Runs => Verdict::Deny {
                reason: format!("{kind}: runs on the system daemon are root's"),
                message: format!(
                    "permission denied: the system daemon runs no jobs for users ({kind}): runs, \
                     their output and their knobs belong to your own daemon; leave out --system \
                     (and GPUPILOT_SYSTEM) and use `gpupilot run`, which starts your daemon when \
                     none answers"
                ),
            },
        },
    }
}

/// Whether `who` belongs to `group`: as its primary group, as a supplementary group of the
/// calling process, or by name in the group's member list.
pub fn is_member(who: &Identity, group: &GroupEntry) -> bool {
    who.gid == group.gid
        || who.groups.contains(&group.gid)
        || who
            .name
            .as_ref()
            .is_some_and(|n| group.members.iter().any(|m| m == n))
}

/// The group `name` from an `/etc/group` (no NSS: groups only a directory service knows are
/// found through the caller's supplementary groups instead), read as
/// [`crate::ipc::find_in_db`] reads it. A number that names no group is taken as a gid.
pub fn parse_group(etc_group: impl std::io::Read, name: &str) -> Option<GroupEntry> {
    let found = crate::ipc::find_in_db(etc_group, |line| {
        let line = line.trim_end();
        if line.starts_with('#') || line.starts_with('+') || line.starts_with('-') {
            return None;
        }
        let mut f = line.split(':');
        let gname = f.next()?;
        if gname != name {
            return None;
        }
        let gid: u32 = f.nth(1)?.trim().parse().ok()?;
        let members = f
            .next()
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(String::from)
            .collect();
        Some(GroupEntry {
            name: gname.to_string(),
            gid,
            members,
        })
    });
    found.or_else(|| {
        name.parse().ok().map(|gid| GroupEntry {
            name: name.to_string(),
            gid,
            members: Vec::new(),
        })
    })
}

/// The group `name` as `/etc/group` has it now.
pub fn group_entry(name: &str) -> Option<GroupEntry> {
    match std::fs::File::open("/etc/group") {
        Ok(f) => parse_group(f, name),
        Err(_) => parse_group(std::io::empty(), name),
    }
}

/// The effective uid (`Uid:` line, second field) and the supplementary groups (`Groups:`)
/// in a `/proc/PID/status`.
pub fn parse_status_ids(status: &str) -> (Option<u32>, Vec<u32>) {
    let line = |key: &str| status.lines().find_map(|l| l.strip_prefix(key));
    let euid = line("Uid:").and_then(|rest| rest.split_whitespace().nth(1)?.parse().ok());
    let groups = line("Groups:")
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    (euid, groups)
}

/// The supplementary groups of process `pid`, which connected as `uid`. Empty when it is gone
/// or hidden (`hidepid`), or when the pid now belongs to a process of another user (reused):
/// the answer only ever takes rights away from `uid`, never lends it another user's.
fn proc_groups(pid: u32, uid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    match parse_status_ids(&status) {
        (Some(euid), groups) if euid == uid => groups,
        _ => Vec::new(),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Request;

    fn access_of(request: &Request) -> Access {
        crate::daemon::requests::classify(request).access
    }

    #[test]
    fn another_user_is_told_to_start_a_daemon_of_their_own() {
        let msg = refusal_message(1000, 1001);
        assert!(msg.starts_with("permission denied:"), "{msg}");
        assert!(
            msg.contains("uid 1001 may not use it") && msg.contains("gpupilot daemon --detach"),
            "{msg}"
        );
    }

    fn caller(uid: u32, gid: u32, groups: &[u32], name: &str) -> Identity {
        Identity {
            uid,
            gid,
            groups: groups.to_vec(),
            name: Some(name.into()),
        }
    }

    fn gpupilot_group() -> GroupEntry {
        GroupEntry {
            name: "gpupilot".into(),
            gid: 990,
            members: vec!["alice".into(), "bob".into()],
        }
    }

    fn system() -> Mode {
        Mode::System {
            group: "gpupilot".into(),
        }
    }

    fn denied(v: Verdict) -> (String, String) {
        match v {
            Verdict::Deny { reason, message } => (reason, message),
            Verdict::Allow => panic!("allowed"),
        }
    }

    #[test]
    fn a_users_daemon_serves_its_user_and_root_for_everything() {
        let mode = Mode::User { uid: 1000 };
        for access in [
            Access::Connect,
            Access::Watch,
            Access::GpuSettings,
            Access::Runs,
        ] {
            let me = caller(1000, 1000, &[], "alice");
            assert_eq!(decide(&mode, &me, access, "x", None), Verdict::Allow);
            let root = caller(0, 0, &[], "root");
            assert_eq!(decide(&mode, &root, access, "x", None), Verdict::Allow);
        }
        // Another user is refused at the door, group or not.
        let carol = caller(1002, 990, &[990], "carol");
        let group = gpupilot_group();
        let (reason, message) = denied(decide(
            &mode,
            &carol,
            Access::Connect,
            "connect",
            Some(&group),
        ));
        assert_eq!(reason, "another user");
        assert!(message.contains("uid 1002 may not use it"), "{message}");
    }

    #[test]
    fn on_the_system_daemon_everyone_watches() {
        let nobody = caller(65534, 65534, &[], "nobody");
        for access in [Access::Connect, Access::Watch] {
            assert_eq!(
                decide(&system(), &nobody, access, "status", None),
                Verdict::Allow
            );
        }
    }

    #[test]
    fn gpu_settings_are_for_root_and_the_group() {
        let group = gpupilot_group();
        let g = Some(&group);
        let settings = |who: &Identity| decide(&system(), who, Access::GpuSettings, "power_cap", g);
        assert_eq!(settings(&caller(0, 0, &[], "root")), Verdict::Allow);
        // By the member list, by the primary group, by a supplementary group of the process.
        assert_eq!(settings(&caller(1000, 1000, &[], "alice")), Verdict::Allow);
        assert_eq!(settings(&caller(1003, 990, &[], "dave")), Verdict::Allow);
        assert_eq!(
            settings(&caller(1004, 1004, &[27, 990], "erin")),
            Verdict::Allow
        );
        // Not a member: refused, and told which group to join.
        let (reason, message) = denied(settings(&caller(1002, 1002, &[27], "carol")));
        assert_eq!(reason, "power_cap: not root and not in group gpupilot");
        assert!(
            message.starts_with("permission denied: changing GPU settings (power_cap)"),
            "{message}"
        );
        assert!(message.contains("members of group `gpupilot`"), "{message}");
        assert!(message.contains("carol (uid 1002) is not one"), "{message}");
        assert!(
            message.contains("sudo usermod -aG gpupilot carol"),
            "{message}"
        );
        // Without the group on the node, nobody but root; the message says how to make it.
        let none = decide(
            &system(),
            &caller(1000, 1000, &[], "alice"),
            Access::GpuSettings,
            "clocks_lock",
            None,
        );
        let (_, message) = denied(none);
        assert!(message.contains("does not exist on this node"), "{message}");
        assert!(message.contains("sudo groupadd gpupilot"), "{message}");
        assert_eq!(
            decide(
                &system(),
                &caller(0, 0, &[], "root"),
                Access::GpuSettings,
                "x",
                None
            ),
            Verdict::Allow
        );
    }

    #[test]
    fn runs_on_the_system_daemon_are_roots() {
        let group = gpupilot_group();
        let alice = caller(1000, 990, &[990], "alice");
        let (reason, message) = denied(decide(
            &system(),
            &alice,
            Access::Runs,
            "run_start",
            Some(&group),
        ));
        assert_eq!(reason, "run_start: runs on the system daemon are root's");
        assert!(
            message.contains("runs no jobs for users (run_start)"),
            "{message}"
        );
        assert!(message.contains("leave out --system"), "{message}");
        assert_eq!(
            decide(
                &system(),
                &caller(0, 0, &[], "root"),
                Access::Runs,
                "run_start",
                None
            ),
            Verdict::Allow
        );
    }

    #[test]
    fn every_request_has_its_access() {
        use crate::protocol::TargetGpus;
        assert_eq!(access_of(&Request::Status {}), Access::Watch);
        assert_eq!(access_of(&Request::Power {}), Access::Watch);
        let runs = Request::Runs {
            run: None,
            live: true,
        };
        assert_eq!(access_of(&runs), Access::Watch);
        assert_eq!(
            access_of(&Request::PowerCap {
                gpus: TargetGpus::All,
                watts: 250.0,
                why: None
            }),
            Access::GpuSettings
        );
        assert_eq!(
            access_of(&Request::RunStop {
                run: "last".into(),
                kill: false,
                grace_s: None,
                why: None
            }),
            Access::Runs
        );
    }

    #[test]
    fn etc_group_and_proc_status_are_read() {
        // A line that is not text is passed over, not the end of the file.
        let etc =
            b"# comment\nroot:x:0:\n+nis\n\xff:x:7:\ngpupilot:x:990:alice, bob\nnogroup:x:65534:\n";
        let etc = &etc[..];
        assert_eq!(parse_group(etc, "gpupilot"), Some(gpupilot_group()));
        let nogroup = parse_group(etc, "nogroup").unwrap();
        assert_eq!((nogroup.gid, nogroup.members.len()), (65534, 0));
        assert_eq!(parse_group(etc, "wheel"), None);
        assert_eq!(
            parse_group(etc, "4242").map(|g| g.gid),
            Some(4242),
            "a bare gid"
        );
        let status = "Name:\tgpupilot\nUid:\t1000\t1001\t1000\t1000\nGroups:\t27 990 \nNgid:\t0\n";
        assert_eq!(parse_status_ids(status), (Some(1001), vec![27, 990]));
        assert_eq!(parse_status_ids("Groups:\n"), (None, vec![]));
        // This process, as the kernel reports it.
        let (euid, _) = parse_status_ids(&std::fs::read_to_string("/proc/self/status").unwrap());
        assert_eq!(euid, Some(rustix::process::geteuid().as_raw()));
        // A pid that is someone else's now lends no groups.
        let me = rustix::process::geteuid().as_raw();
        assert_eq!(
            proc_groups(std::process::id(), me.wrapping_add(1)),
            Vec::<u32>::new()
        );
    }
}
