//! Helpers for the supervisor tests: profiles around `sh -c`, reading a run directory back,
//! process groups killed when a test fails.

use std::path::Path;

use gpupilot::profile::{self, Profile};
use gpupilot::supervisor::{Caller, RunDir, procfs};

/// A profile running `script` with `sh -c` (argv, not `shell = true`), plus `extra` TOML.
pub fn sh_profile(name: &str, script: &str, extra: &str) -> Profile {
    let text = format!("name = \"{name}\"\n[run]\ncommand = [\"sh\", \"-c\", {script:?}]\n{extra}");
    profile::parse_str("test.toml", &text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// This process's environment in `cwd`.
pub fn caller(cwd: &Path) -> Caller {
    let mut c = Caller::current().unwrap();
    c.cwd = cwd.to_path_buf();
    c
}

pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The `event` names of `events.jsonl`, in order.
pub fn event_names(dir: &RunDir) -> Vec<String> {
    lines(&dir.events_path())
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["event"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Processes in group `pgid` that are running (not zombies).
pub fn running_in_group(pgid: u32) -> Vec<u32> {
    procfs::running_in_group(pgid)
}

/// Kills a process group when dropped, so a failing test leaves no run behind.
pub struct KillGroupOnDrop(pub u32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        let _ =
            gpupilot::supervisor::signal::to_group(self.0, gpupilot::supervisor::signal::Sig::Kill);
    }
}
