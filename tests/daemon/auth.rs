//! A second user's connection is refused by the daemon, on the kernel's word (SO_PEERCRED).
//!
//! Needs root (to run the client as another uid with setpriv); CI runs as root. The socket is
//! made reachable on purpose (0666 in a traversable directory) so that the peer check, not the
//! file mode, is what refuses: both must hold on their own.

use crate::support::home::Home;
use crate::support::proc::reachable_by_others;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

const NOBODY: &str = "65534";

fn as_nobody(home: &Home, args: &[&str]) -> std::process::Output {
    let plain = home.gpupilot(args);
    let exe = reachable_by_others(std::path::Path::new(plain.get_program()));
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
        .arg(exe.path())
        .args(plain.get_args())
        .current_dir("/")
        .env("GPUPILOT_HOME", home.root())
        .stdin(Stdio::null());
    cmd.output().expect("running setpriv")
}

fn is_root() -> bool {
    gpupilot::config::paths::current_uid() == 0
}

#[test]
fn another_users_connection_is_refused() {
    if !is_root() {
        eprintln!("SKIPPED: changing uid needs root");
        return;
    }
    let home = Home::new();
    let _d = home.daemon(&[]);

    // With the daemon's own modes (0700 directory, 0600 socket) the file system refuses first.
    let out = as_nobody(&home, &["ps"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ermission denied"), "{err}");

    // Open the way on purpose: now only the peer check stands between uid 65534 and the daemon.
    for dir in [
        home.dir.path().to_path_buf(),
        home.root(),
        home.paths.runtime.clone(),
    ] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(home.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody(&home, &["ps"]);
    assert!(
        !out.status.success(),
        "uid 65534 must not use root's daemon"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("this gpupilot daemon belongs to root (uid 0), and uid 65534 may not use it"),
        "{err}"
    );

    // The refusal is in the node's audit log; the owner still gets in.
    let refused = home
        .node_events()
        .into_iter()
        .any(|e| e.to_string().contains("65534"));
    assert!(refused, "{:?}", home.node_events());
    home.ok(&["ps"]);
}
