//! What a daemon acts on from its configuration: `control.toml` is read only from a file (and,
//! for a root daemon, a directory) that no other user owns or may write, and a root daemon runs
//! alert hooks only as the unprivileged user the file names, never as root. Each case raises an
//! alert at once (`temp_c = 1` on the simulated node) whose hook writes who it ran as.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::home::Home;
use crate::support::wait::wait_for;

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A home whose `control.toml` raises an alert at once and whose hook writes `id -u` to the
/// returned file (in a folder anyone may write: the hook may run as nobody).
fn home_with_hook(extra: &str) -> (Home, PathBuf) {
    let home = Home::new();
    let dir = home.dir.path().join("hooks");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(home.dir.path(), PermissionsExt::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o777)).unwrap();
    let out = dir.join("who");
    std::fs::create_dir_all(&home.paths.config).unwrap();
    std::fs::write(
        home.paths.config.join("control.toml"),
        format!(
            "[alerts]\ntemp_c = 1\nhook = [\"sh\", \"-c\", \"id -u > {}\"]\n{extra}",
            out.display()
        ),
    )
    .unwrap();
    (home, out)
}

fn thermal(home: &Home) -> String {
    home.ok(&["thermal"])
}

/// An alert was raised (so a hook, where one may run, was started).
fn wait_alert(home: &Home) {
    wait_for("the temperature alert", Duration::from_secs(20), || {
        !home.events_named("alert").is_empty()
    });
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
}

#[test]
fn a_config_another_user_may_write_is_not_acted_on() {
    let (home, out) = home_with_hook("hook_user = \"nobody\"\n");
    let file = home.paths.config.join("control.toml");
    // Another user's file (as root), or one any user may write (as anyone).
    if root() {
        chown(&home.paths.config, 65534);
    } else {
        std::fs::set_permissions(&file, PermissionsExt::from_mode(0o666)).unwrap();
    }
    let _d = home.daemon(&[]);
    let said = thermal(&home);
    assert!(
        said.contains("note: control.toml not used: refusing"),
        "{said}"
    );
    let why = if root() {
        "belongs to uid 65534"
    } else {
        "may write it"
    };
    assert!(said.contains(why), "{said}");
    // No rule from it: no alert, no hook.
    std::thread::sleep(Duration::from_secs(2));
    assert!(home.events_named("alert").is_empty());
    assert!(!out.exists());
}

#[test]
fn a_root_daemon_runs_a_hook_only_as_the_user_its_config_names() {
    if !root() {
        // A user's daemon runs hooks as itself: covered by the alert tests.
        return;
    }
    // No hook_user: the alert is raised, the hook is not run, and the daemon says why.
    let (home, out) = home_with_hook("");
    let _d = home.daemon(&[]);
    wait_alert(&home);
    let said = thermal(&home);
    assert!(said.contains("note: alert hooks not run:"), "{said}");
    assert!(said.contains("hook_user"), "{said}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(!out.exists(), "a hook ran as root");

    // hook_user = "nobody": it runs, as nobody.
    let (home, out) = home_with_hook("hook_user = \"nobody\"\n");
    let _d = home.daemon(&[]);
    wait_alert(&home);
    wait_for("the hook to run", Duration::from_secs(10), || out.exists());
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "65534");

    // A config directory its group may write is refused as well.
    let (home, _) = home_with_hook("hook_user = \"nobody\"\n");
    std::fs::set_permissions(&home.paths.config, PermissionsExt::from_mode(0o775)).unwrap();
    let _d = home.daemon(&[]);
    let said = thermal(&home);
    assert!(
        said.contains("its group or other users may write it"),
        "{said}"
    );
}
