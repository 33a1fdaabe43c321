//! Where config, state and the runtime socket live.
//!
//! `GPUPILOT_HOME=DIR` puts everything under DIR (tests use it to isolate); otherwise the XDG
//! directories: `$XDG_CONFIG_HOME/gpupilot`, `$XDG_STATE_HOME/gpupilot`, and
//! `$XDG_RUNTIME_DIR/gpupilot` (fallback `/tmp/gpupilot-$UID`, which is created mode 0700).

use std::path::{Path, PathBuf};

/// The three directories gpupilot uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub config: PathBuf,
    pub state: PathBuf,
    pub runtime: PathBuf,
}

impl Paths {
    /// Resolve from the environment (see the module doc).
    pub fn from_env() -> Paths {
        Self::resolve(|k| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
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
}
