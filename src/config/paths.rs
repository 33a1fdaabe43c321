//! Where config, state and the runtime socket live.
//!
//! `GPUPILOT_HOME=DIR` puts everything under DIR (tests use it to isolate); otherwise the XDG
//! directories: `$XDG_CONFIG_HOME/gpupilot`, `$XDG_STATE_HOME/gpupilot`, and
//! `$XDG_RUNTIME_DIR/gpupilot` (fallback `/tmp/gpupilot-$UID`). The daemon makes its runtime
//! and state directories 0700, or refuses ones that are links, someone else's or open to others
//! ([`super::safe_fs`]): anyone may create `/tmp/gpupilot-$UID` first.
//!
//! The system daemon (`gpupilot daemon --system`, root's, one per node) has its own:
//! `/etc/gpupilot`, `/var/lib/gpupilot` and `/run/gpupilot`, or `DIR/{config,state,run}` with
//! `GPUPILOT_SYSTEM_DIR=DIR` (tests). A client told `--system` (or `GPUPILOT_SYSTEM=1`) talks
//! to the system daemon's socket and keeps its own config and state.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The system daemon's directories when `GPUPILOT_SYSTEM_DIR` is not set.
pub const SYSTEM_CONFIG: &str = "/etc/gpupilot";
pub const SYSTEM_STATE: &str = "/var/lib/gpupilot";
pub const SYSTEM_RUNTIME: &str = "/run/gpupilot";

/// Set once by `--system` / `GPUPILOT_SYSTEM=1` (see [`use_system_daemon`]).
static SYSTEM_DAEMON: AtomicBool = AtomicBool::new(false);

/// From now on, [`Paths::from_env`] names the system daemon's socket: every command of this
/// process talks to root's daemon instead of the user's (the global `--system`).
pub fn use_system_daemon() {
    SYSTEM_DAEMON.store(true, Ordering::Relaxed);
}

/// Whether this process talks to the system daemon (`--system`).
pub fn system_daemon_selected() -> bool {
    SYSTEM_DAEMON.load(Ordering::Relaxed)
}

/// The three directories gpupilot uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub config: PathBuf,
    pub state: PathBuf,
    pub runtime: PathBuf,
}

impl Paths {
    /// Resolve from the environment (see the module doc). After [`use_system_daemon`], the
    /// runtime directory (the socket's) is the system daemon's; config and state stay ours.
    pub fn from_env() -> Paths {
        let mut paths = Self::resolve(env_path);
        if system_daemon_selected() {
            paths.runtime = Self::system_from_env().runtime;
        }
        paths
    }

    /// The system daemon's directories, from `GPUPILOT_SYSTEM_DIR` or the defaults.
    pub fn system_from_env() -> Paths {
        Self::resolve_system(env_path)
    }

    /// The system daemon's directories with a custom environment lookup (tests). A relative
    /// `GPUPILOT_SYSTEM_DIR` is made absolute: the daemon works from `/`.
    pub fn resolve_system(env: impl Fn(&str) -> Option<PathBuf>) -> Paths {
        match env("GPUPILOT_SYSTEM_DIR") {
            Some(dir) => {
                let dir = std::path::absolute(&dir).unwrap_or(dir);
                Paths {
                    config: dir.join("config"),
                    state: dir.join("state"),
                    runtime: dir.join("run"),
                }
            }
            None => Paths {
                config: PathBuf::from(SYSTEM_CONFIG),
                state: PathBuf::from(SYSTEM_STATE),
                runtime: PathBuf::from(SYSTEM_RUNTIME),
            },
        }
    }

    /// Resolve with a custom environment lookup (tests).
    pub fn resolve(env: impl Fn(&str) -> Option<PathBuf>) -> Paths {
        if let Some(home) = env("GPUPILOT_HOME") {
            return Paths {
                config: home.join("config"),
                state: home.join("state"),
                runtime: home.join("run"),
            };
        }
        let home = env("HOME").unwrap_or_else(|| PathBuf::from("/"));
        let config = env("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config"));
        let state = env("XDG_STATE_HOME").unwrap_or_else(|| home.join(".local/state"));
        let runtime = env("XDG_RUNTIME_DIR")
            .map(|d| d.join("gpupilot"))
            .unwrap_or_else(|| PathBuf::from(format!("/tmp/gpupilot-{}", current_uid())));
        Paths {
            config: config.join("gpupilot"),
            state: state.join("gpupilot"),
            runtime,
        }
    }

    /// A user file in the config directory, e.g. `themes/dark.toml`.
    pub fn config_file(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.config.join(rel)
    }
}

fn env_path(k: &str) -> Option<PathBuf> {
    std::env::var_os(k)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The real user id of this process (from /proc, so no unsafe call is needed).
pub fn current_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<PathBuf> {
        let m: HashMap<String, PathBuf> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn gpupilot_home_wins() {
        let p = Paths::resolve(env(&[("GPUPILOT_HOME", "/x"), ("XDG_CONFIG_HOME", "/c")]));
        assert_eq!(p.config, PathBuf::from("/x/config"));
        assert_eq!(p.state, PathBuf::from("/x/state"));
        assert_eq!(p.runtime, PathBuf::from("/x/run"));
    }

    #[test]
    fn xdg_and_fallbacks() {
        let p = Paths::resolve(env(&[("HOME", "/h"), ("XDG_RUNTIME_DIR", "/r")]));
        assert_eq!(p.config, PathBuf::from("/h/.config/gpupilot"));
        assert_eq!(p.state, PathBuf::from("/h/.local/state/gpupilot"));
        assert_eq!(p.runtime, PathBuf::from("/r/gpupilot"));
        let p = Paths::resolve(env(&[("HOME", "/h")]));
        assert!(p.runtime.starts_with("/tmp"));
        assert!(p.runtime.to_string_lossy().starts_with("/tmp/gpupilot-"));
    }

    #[test]
    fn the_system_daemon_has_system_places_or_one_directory() {
        let p = Paths::resolve_system(env(&[("GPUPILOT_HOME", "/x")]));
        assert_eq!(p.config, PathBuf::from("/etc/gpupilot"));
        assert_eq!(p.state, PathBuf::from("/var/lib/gpupilot"));
        assert_eq!(p.runtime, PathBuf::from("/run/gpupilot"));
        let p = Paths::resolve_system(env(&[("GPUPILOT_SYSTEM_DIR", "/s")]));
        assert_eq!(p.config, PathBuf::from("/s/config"));
        assert_eq!(p.state, PathBuf::from("/s/state"));
        assert_eq!(p.runtime, PathBuf::from("/s/run"));
        let p = Paths::resolve_system(env(&[("GPUPILOT_SYSTEM_DIR", "rel")]));
        assert!(
            p.runtime.is_absolute() && p.runtime.ends_with("rel/run"),
            "{p:?}"
        );
    }
}
