//! `doctor`'s lines about gpupilot itself, true on a real node and a simulated one alike: its
//! directories (config, state, runtime) and whether a daemon answers.
//!
//! Read only: a directory not made yet is a note (gpupilot makes it on first use); one that is
//! a link, someone else's or open to other users is a problem, because the daemon refuses it
//! ([`crate::config::safe_fs::own_dir`]) and says so only when it starts.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::checks::{Check, Status};
use crate::config::paths::Paths;

/// One of gpupilot's directories as found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirFacts {
    /// `config`, `state` or `runtime`.
    pub role: String,
    pub path: String,
    #[serde(flatten)]
    pub found: Found,
}

/// What is at a directory's path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "found", rename_all = "snake_case")]
pub enum Found {
    /// A directory of ours, closed to others where it must be.
    Fine,
    /// Nothing yet: made on first use, if its nearest existing parent lets us.
    Missing {
        can_make: bool,
    },
    /// A symbolic link, a file or anything but a directory.
    NotADirectory,
    NotOurs {
        owner: u32,
    },
    /// Group or others may read or write a directory that must be private.
    OpenToOthers {
        mode: u32,
    },
    Unreadable {
        error: String,
    },
}

/// gpupilot's directories and daemon.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HomeFacts {
    pub dirs: Vec<DirFacts>,
    /// The running daemon's source (`nvml`, `sim`) and GPU count; absent when none answers.
    pub daemon: Option<DaemonSeen>,
}

/// A daemon that answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaemonSeen {
    pub source: String,
    pub gpus: usize,
}

fn look(role: &str, path: &Path, private: bool) -> DirFacts {
    let found = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = path.ancestors().skip(1).find(|p| p.exists());
            Found::Missing {
                can_make: parent.is_some_and(|p| {
                    rustix::fs::access(
                        p,
                        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
                    )
                    .is_ok()
                }),
            }
        }
        Err(e) => Found::Unreadable {
            error: e.to_string(),
        },
        Ok(m) if !m.is_dir() => Found::NotADirectory,
        Ok(m) if m.uid() != crate::config::paths::current_uid() => {
            Found::NotOurs { owner: m.uid() }
        }
        Ok(m) if private && m.mode() & 0o077 != 0 => Found::OpenToOthers {
            mode: m.mode() & 0o7777,
        },
        Ok(_) => Found::Fine,
    };
    DirFacts {
        role: role.into(),
        path: path.display().to_string(),
        found,
    }
}

/// Look at `paths` and take the daemon's answer (`daemon`, if one answered).
pub fn gather(paths: &Paths, daemon: Option<&crate::telemetry::Snapshot>) -> HomeFacts {
    HomeFacts {
        dirs: vec![
            look("config", &paths.config, false),
            look("state", &paths.state, true),
            look("runtime", &paths.runtime, true),
        ],
        daemon: daemon.map(|s| DaemonSeen {
            source: s.node.source.clone(),
            gpus: s.gpus.len(),
        }),
    }
}

fn line(name: &str, status: Status, detail: String) -> Check {
    Check {
        name: name.into(),
        status,
        detail,
    }
}

/// The `home` and `daemon` lines.
pub fn checks(h: &HomeFacts) -> Vec<Check> {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    for d in &h.dirs {
        let (role, path) = (&d.role, &d.path);
        match &d.found {
            Found::Fine => {}
            Found::Missing { can_make: true } => notes.push(role.as_str()),
            Found::Missing { can_make: false } => problems.push(format!(
                "{role} {path} does not exist and this user cannot make it: make it (`mkdir -p -m 700 {path}`) or set GPUPILOT_HOME to a directory of yours"
            )),
            Found::NotADirectory => problems.push(format!(
                "{role} {path} is not a directory (a link or a file): remove it so that gpupilot makes it"
            )),
            Found::NotOurs { owner } => problems.push(format!(
                "{role} {path} belongs to uid {owner}, not this user: remove it (as its owner or root) or set GPUPILOT_HOME"
            )),
            Found::OpenToOthers { mode } => problems.push(format!(
                "{role} {path} is open to other users (mode {mode:04o}), which the daemon refuses: `chmod 700 {path}`"
            )),
            Found::Unreadable { error } => problems.push(format!("{role} {path}: {error}")),
        }
    }
    let home = if !problems.is_empty() {
        line("home", Status::Fail, problems.join("; "))
    } else {
        let all: Vec<String> = h
            .dirs
            .iter()
            .map(|d| format!("{} {}", d.role, d.path))
            .collect();
        let mut detail = format!("gpupilot's directories are usable: {}", all.join(", "));
        if !notes.is_empty() {
            detail = format!(
                "{detail} (not made yet, made on first use: {})",
                notes.join(", ")
            );
        }
        line("home", Status::Ok, detail)
    };
    let daemon = match &h.daemon {
        Some(d) => line(
            "daemon",
            Status::Info,
            format!(
                "a daemon answers: it reads {} ({} GPU{})",
                if d.source == "nvml" {
                    "NVML"
                } else {
                    "the simulator"
                },
                d.gpus,
                if d.gpus == 1 { "" } else { "s" }
            ),
        ),
        None => line(
            "daemon",
            Status::Info,
            "no daemon answers for this user: the console starts one, or `gpupilot daemon --detach`"
                .into(),
        ),
    };
    vec![home, daemon]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn directories_are_judged_as_the_daemon_would() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = Paths {
            config: tmp.path().join("config"),
            state: tmp.path().join("state"),
            runtime: tmp.path().join("run"),
        };
        let h = gather(&paths, None);
        assert!(matches!(h.dirs[1].found, Found::Missing { can_make: true }));
        let c = checks(&h);
        assert_eq!((c[0].status, c[1].status), (Status::Ok, Status::Info));
        assert!(
            c[0].detail
                .ends_with("(not made yet, made on first use: config, state, runtime)"),
            "{}",
            c[0].detail
        );
        assert!(c[1].detail.contains("no daemon answers"), "{}", c[1].detail);

        std::fs::create_dir(&paths.state).unwrap();
        std::fs::set_permissions(&paths.state, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("/tmp", &paths.runtime).unwrap();
        let c = checks(&gather(&paths, None));
        assert_eq!(c[0].status, Status::Fail);
        assert!(
            c[0].detail.contains("is open to other users (mode 0755)")
                && c[0].detail.contains("chmod 700")
                && c[0]
                    .detail
                    .contains("is not a directory (a link or a file)"),
            "{}",
            c[0].detail
        );
    }
}
