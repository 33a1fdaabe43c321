//! The daemon's own directories and files are made by it or refused, never reached through a
//! symbolic link: what another local user may plant in a runtime directory (a link to a victim
//! directory or file, a file where the socket goes, a directory open to all) is refused with a
//! message naming the path, and nothing it points at changes.
//!
//! The cases with another user's directory need root (chown); they are skipped otherwise.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use crate::support::home::Home;

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// `gpupilot daemon`, which must refuse to start: its stderr. A daemon that starts instead is
/// killed after a few seconds and the test fails.
fn refused(home: &Home) -> String {
    let out: Output = home.run(&["daemon", "--rate", "10"], Duration::from_secs(8));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the daemon started: {err}");
    assert_eq!(gpupilot::daemon::lock_holder(&home.paths), None);
    err
}

#[test]
fn a_symlinked_runtime_dir_is_refused_and_its_target_unchanged() {
    let home = Home::new();
    let victim_dir = home.dir.path().join("victimdir");
    fs::create_dir(&victim_dir).unwrap();
    fs::set_permissions(&victim_dir, fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = home.dir.path().join("victim.txt");
    fs::write(&victim, "root's own\n").unwrap();
    symlink(&victim, victim_dir.join("daemon.lock")).unwrap();
    fs::create_dir_all(home.root()).unwrap();
    symlink(&victim_dir, &home.paths.runtime).unwrap();

    let err = refused(&home);
    assert!(
        err.contains(&home.paths.runtime.display().to_string()),
        "{err}"
    );
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(mode(&victim_dir), 0o1777, "the target keeps its mode");
    assert_eq!(fs::read_to_string(&victim).unwrap(), "root's own\n");
    assert!(!victim_dir.join("daemon.sock").exists());
}

#[test]
fn a_lock_file_link_leaves_the_victim_untouched() {
    let home = Home::new();
    fs::create_dir_all(&home.paths.runtime).unwrap();
    fs::set_permissions(&home.paths.runtime, fs::Permissions::from_mode(0o700)).unwrap();
    let victim = home.dir.path().join("victim.txt");
    fs::write(&victim, "root's own\n").unwrap();
    symlink(&victim, home.paths.runtime.join("daemon.lock")).unwrap();

    let err = refused(&home);
    assert!(err.contains("daemon.lock"), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(fs::read_to_string(&victim).unwrap(), "root's own\n");
}

#[test]
fn a_regular_file_at_the_socket_path_is_not_deleted() {
    let home = Home::new();
    fs::create_dir_all(&home.paths.runtime).unwrap();
    fs::set_permissions(&home.paths.runtime, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(home.socket(), "not a socket\n").unwrap();

    let err = refused(&home);
    assert!(err.contains(&home.socket().display().to_string()), "{err}");
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(fs::read_to_string(home.socket()).unwrap(), "not a socket\n");

    // Moved away as the message says, the daemon starts and serves there.
    fs::remove_file(home.socket()).unwrap();
    let _d = home.daemon(&[]);
    assert!(
        fs::symlink_metadata(home.socket())
            .unwrap()
            .file_type()
            .is_socket()
    );
}

#[test]
fn a_runtime_dir_open_to_everyone_is_refused_and_left_as_it_is() {
    let home = Home::new();
    fs::create_dir_all(&home.paths.runtime).unwrap();
    fs::set_permissions(&home.paths.runtime, fs::Permissions::from_mode(0o777)).unwrap();

    let err = refused(&home);
    assert!(
        err.contains(&home.paths.runtime.display().to_string()),
        "{err}"
    );
    assert!(err.contains("mode 0777"), "{err}");
    assert!(err.contains("chmod 700"), "{err}");
    assert_eq!(mode(&home.paths.runtime), 0o777);
    assert!(!home.paths.runtime.join("daemon.lock").exists());
}

#[test]
fn a_runtime_dir_of_another_user_is_refused() {
    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("skipped: only root can make a directory another user's (chown)");
        return;
    }
    let home = Home::new();
    fs::create_dir_all(&home.paths.runtime).unwrap();
    fs::set_permissions(&home.paths.runtime, fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::lchown(&home.paths.runtime, Some(65534), Some(65534)).unwrap();

    let err = refused(&home);
    assert!(
        err.contains(&home.paths.runtime.display().to_string()),
        "{err}"
    );
    assert!(err.contains("belongs to uid 65534"), "{err}");
    assert_eq!(fs::metadata(&home.paths.runtime).unwrap().uid(), 65534);
    assert!(!home.paths.runtime.join("daemon.lock").exists());
}

#[test]
fn a_daemon_log_link_is_not_written_through() {
    let home = Home::new();
    fs::create_dir_all(&home.paths.state).unwrap();
    fs::set_permissions(&home.paths.state, fs::Permissions::from_mode(0o700)).unwrap();
    let victim = home.dir.path().join("victim.txt");
    fs::write(&victim, "root's own\n").unwrap();
    symlink(&victim, home.paths.state.join("daemon.log")).unwrap();

    // The daemon runs without its log file (and says why) rather than append to the target.
    let mut d = home.daemon(&[]);
    home.ok(&["ps"]);
    let (_, err) = d.signal_and_wait(rustix::process::Signal::TERM);
    assert!(err.contains("daemon.log"), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(fs::read_to_string(&victim).unwrap(), "root's own\n");
}
