//! What the integration tests share. Every test binary (`tests/NAME/main.rs`, one per area)
//! includes this one tree with `#[path = "../support/mod.rs"] mod support;`, so there is one
//! copy of each helper:
//!
//! - [`wait`]: bounded waits ([`wait::wait_for`], [`wait::poll`]) and the end of a child
//!   ([`wait::finish`]); every wait in the tests has a deadline and says what it waited for.
//! - [`proc`]: signals to one process, and this test binary run again as a helper.
//! - [`net`]: a free loopback port, one HTTP GET.
//! - [`home`]: a temporary GPUPILOT_HOME with a real daemon on the simulator, raw connections.
//! - [`nvml`] and [`nvml_daemon`]: the fake NVML library, a node made from a scenario, and a
//!   daemon on it.
//! - [`peers`]: programs from elsewhere (gpustat, tmux, sshd, prometheus…) that a test needs.
//! - [`prometheus`]: a real Prometheus on loopback scraping given targets every second.
//! - [`promtool`]: `promtool check metrics` on a page, allowing only dcgm-exporter's own lints.
//! - [`sim_daemon`]: a daemon in the test's own process on a simulator driven by hand.
//! - [`supervisor`]: profiles around `sh -c`, run directories read back.
//! - [`ranks`]: a rank of the Python SDK that trains by sleeping, what the ranks printed.
//! - [`ssh`]: a loopback `sshd` with throwaway keys.
//! - [`tmux`]: a private tmux server for the end-to-end console tests.
//! - [`tui`]: the console's hand-built fixtures, keys, the screen as text.
//! - [`feed`]: a console feed's updates read with a bound on every wait.
//!
//! Tests of one binary share a process: nothing here changes the process's environment,
//! working directory, umask or signal dispositions, and each test keeps its own homes,
//! daemons, ports and temporary directories.
#![allow(dead_code)]

pub mod feed;
pub mod home;
pub mod net;
pub mod nvml;
pub mod nvml_daemon;
pub mod peers;
pub mod proc;
pub mod prometheus;
pub mod promtool;
pub mod ranks;
pub mod sim_daemon;
pub mod ssh;
pub mod supervisor;
pub mod tmux;
pub mod tui;
pub mod wait;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// `text` as JSON; a failure shows the text.
pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Lines in a file (0 when it does not exist).
pub fn count_lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// Write an executable script (mode 0755).
pub fn write_exec(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}
