//! Processes: a signal to one process, and this test binary started again to run one helper
//! "test" in another process (as another user, or to be killed).
//!
//! Every signal goes through rustix to one positive pid, or through the supervisor's group
//! helper (which refuses 0 and 1): never through `kill(1)` with a negative number, which procps
//! reads as `-1`, "every process".

use std::process::Command;

use rustix::process::{Pid, Signal};

/// Send `sig` to one process (a positive pid, checked).
pub fn send(pid: u32, sig: Signal) {
    let raw = i32::try_from(pid).expect("pid fits");
    assert!(raw > 1, "refusing to signal pid {pid}");
    let _ = rustix::process::kill_process(Pid::from_raw(raw).unwrap(), sig);
}

/// The name libtest gives the test function `f` of the module `module` (pass
/// `module_path!()`): the path under the binary's root, which `--exact` wants. A test that
/// starts this binary again to run one helper names it this way, so the helper is found
/// whichever binary and module it lives in.
pub fn test_name(module: &str, f: &str) -> String {
    match module.split_once("::") {
        Some((_binary, path)) => format!("{path}::{f}"),
        None => f.to_string(),
    }
}

/// libtest's arguments to run only the test `f` of `module` (`module_path!()`), its output
/// not captured, on one thread: `--exact NAME --nocapture --test-threads 1`.
pub fn helper_args(module: &str, f: &str) -> Vec<String> {
    let name = test_name(module, f);
    ["--exact", &name, "--nocapture", "--test-threads", "1"]
        .map(String::from)
        .to_vec()
}

/// This test binary again, running only the test `f` of `module` ([`helper_args`]).
pub fn this_test_binary(module: &str, f: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(helper_args(module, f));
    cmd
}
