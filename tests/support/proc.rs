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

/// A program that another user may run: where it already was, or a link to it (a copy where a
/// link cannot be made) in a fresh directory every user can reach, removed when this drops.
///
/// A test run as root from a clone under a private directory (root's home is 0700) must not
/// start its own binaries as uid 65534 from where they are: that user cannot pass through the
/// clone's parents, and exec fails with "Permission denied".
pub struct Reachable {
    path: std::path::PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Reachable {
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// Whether a user who is neither the owner nor in the group may pass through every directory
/// above `path` and, with `exec`, run it (its mode bits for others; no ACLs here).
pub fn others_reach(path: &std::path::Path, exec: bool) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.permissions().mode());
    let dirs_ok = path.ancestors().skip(1).all(|d| mode(d) & 0o001 != 0);
    dirs_ok && (!exec || mode(path) & 0o001 != 0)
}

/// `program` where every user can run it ([`Reachable`]).
pub fn reachable_by_others(program: &std::path::Path) -> Reachable {
    use std::os::unix::fs::PermissionsExt;
    if others_reach(program, true) {
        return Reachable {
            path: program.to_path_buf(),
            _dir: None,
        };
    }
    let base = [std::env::temp_dir(), "/tmp".into(), "/var/tmp".into()]
        .into_iter()
        .find(|d| d.is_dir() && others_reach(&d.join("x"), false))
        .expect("a temporary directory that every user can pass through");
    let dir = tempfile::Builder::new()
        .prefix("gpupilot-reach-")
        .tempdir_in(base)
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir
        .path()
        .join(program.file_name().expect("a program's file name"));
    // A link costs nothing where the two are on one file system; the mode is the program's
    // own, which cargo makes 0755.
    if std::fs::hard_link(program, &path).is_err() || !others_reach(&path, true) {
        let _ = std::fs::remove_file(&path);
        std::fs::copy(program, &path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    assert!(others_reach(&path, true), "{}", path.display());
    Reachable {
        path,
        _dir: Some(dir),
    }
}

/// This test binary again as [`this_test_binary`], from where every user can run it: for a
/// helper run as another user. Keep the [`Reachable`] until the helper has ended.
pub fn this_test_binary_for_others(module: &str, f: &str) -> (Reachable, Command) {
    let exe = reachable_by_others(&std::env::current_exe().unwrap());
    let mut cmd = Command::new(exe.path());
    cmd.args(helper_args(module, f));
    (exe, cmd)
}
