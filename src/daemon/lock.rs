//! One daemon per `GPUPILOT_HOME`: the runtime directory (0700, ours), the lock file in it
//! (flock, holding the pid of the daemon that has it) and the socket (0600).
//!
//! The lock is what decides, not the socket: a daemon killed with SIGKILL leaves its socket
//! file behind but its lock goes with it, so the next daemon takes the lock and removes the
//! stale socket. The lock file itself is never removed: unlinking it while another daemon is
//! opening it would let two daemons each hold a lock on a different file.
//!
//! Nothing here follows a symbolic link or touches what is not ours
//! ([`crate::config::safe_fs`]): a runtime directory that is a link, someone else's or open to
//! others is refused, not repaired; so is a lock file that is a link or not ours, and anything
//! but a socket of ours where the socket goes.

use std::fs::{self, File};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{FlockOperation, flock};

use super::base::{DaemonError, home_description, io_err};
use crate::config::Paths;
use crate::config::safe_fs::{self, DirKind};
use crate::ipc::socket_path;

/// The lock file's name in the runtime directory (it holds the daemon's pid).
pub const LOCK_NAME: &str = "daemon.lock";

/// An I/O error from [`safe_fs`] as the daemon reports it: a refusal says all it has to say,
/// anything else is what failed while `what`.
pub(super) fn fs_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DaemonError {
    let what = what.into();
    move |e| match safe_fs::refusal(&e) {
        Some(r) => DaemonError::Unsafe(r.to_string()),
        None => io_err(what)(e),
    }
}

/// Make `dir` (and its parents) 0700 if needed, or check that the one there is a real
/// directory (not a link), ours and private; it is refused otherwise, never chmodded: in the
/// `/tmp/gpupilot-UID` fallback another user could have made it first, and put a link or a
/// file of theirs in it.
pub fn prepare_private_dir(dir: &Path) -> Result<(), DaemonError> {
    safe_fs::own_dir(dir, DirKind::Private).map_err(fs_err(format!("creating {}", dir.display())))
}

/// The system daemon's runtime directory: made 0755 if needed so that every local user
/// reaches the socket in it, or checked: a real directory of root's that nobody else may
/// write. One that others cannot pass through is kept as it is (see [`closed_ancestor`]).
pub fn prepare_shared_dir(dir: &Path) -> Result<(), DaemonError> {
    safe_fs::own_dir(dir, DirKind::Shared).map_err(fs_err(format!("creating {}", dir.display())))
}

/// The first directory above `dir` (itself included) that other users cannot pass through
/// (no `o+x`): a system socket under it is out of their reach.
pub fn closed_ancestor(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|d| fs::metadata(d).is_ok_and(|m| m.mode() & 0o001 == 0))
        .map(Path::to_path_buf)
}

/// Open the system daemon's socket to every local user (0666): who may do what is decided per
/// connection and per request (`auth`), not by the file's mode.
pub fn share_socket(socket: &Path) -> Result<(), DaemonError> {
    fs::set_permissions(socket, fs::Permissions::from_mode(0o666)).map_err(io_err(format!(
        "opening {} to every local user (0666)",
        socket.display()
    )))
}

/// The lock a running daemon holds for its whole life; dropping it releases the lock.
#[derive(Debug)]
pub struct DaemonLock {
    _file: File,
    path: PathBuf,
}

impl DaemonLock {
    /// Take the lock for `paths`, or say which daemon has it.
    pub fn acquire(paths: &Paths) -> Result<DaemonLock, DaemonError> {
        let path = paths.runtime.join(LOCK_NAME);
        // Not truncated on open: it is rewritten below, once the lock is ours.
        let mut file =
            safe_fs::open_rw(&path).map_err(fs_err(format!("opening {}", path.display())))?;
        if let Err(e) = flock(&file, FlockOperation::NonBlockingLockExclusive) {
            if e == rustix::io::Errno::WOULDBLOCK {
                let pid = read_pid_soon(&mut file)
                    .map(|p| format!("pid {p}"))
                    .unwrap_or_else(|| "pid unknown".into());
                return Err(DaemonError::AlreadyRunning {
                    home: home_description(paths),
                    pid,
                    socket: socket_path(paths),
                });
            }
            return Err(DaemonError::Io {
                what: format!("locking {}", path.display()),
                source: e.into(),
            });
        }
        let write = |f: &mut File| -> std::io::Result<()> {
            f.set_len(0)?;
            f.rewind()?;
            f.write_all(format!("{}\n", std::process::id()).as_bytes())?;
            f.sync_data()
        };
        write(&mut file).map_err(io_err(format!("writing {}", path.display())))?;
        Ok(DaemonLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The pid of the daemon holding the lock for `paths`, if one holds it.
pub fn lock_holder(paths: &Paths) -> Option<u32> {
    let path = paths.runtime.join(LOCK_NAME);
    let mut file = safe_fs::open_read(&path).ok()?;
    // A shared lock we can take means nobody holds the exclusive one.
    match flock(&file, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = flock(&file, FlockOperation::Unlock);
            None
        }
        Err(_) => read_pid_soon(&mut file),
    }
}

/// The pid in a lock file; a daemon that has just taken the lock may not have written it yet.
fn read_pid_soon(file: &mut File) -> Option<u32> {
    for _ in 0..20 {
        let mut text = String::new();
        if file.rewind().is_ok() && file.read_to_string(&mut text).is_ok() {
            if let Ok(pid) = text.trim().parse() {
                return Some(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Listen on `socket` (mode 0600), replacing a stale socket of ours; anything else there is
/// refused, never deleted. Call with the lock held.
pub fn bind(socket: &Path) -> Result<tokio::net::UnixListener, DaemonError> {
    if safe_fs::remove_stale_socket(socket)
        .map_err(fs_err(format!("removing {}", socket.display())))?
    {
        tracing::info!("removed a stale socket at {}", socket.display());
    }
    let listener = tokio::net::UnixListener::bind(socket)
        .map_err(io_err(format!("listening on {}", socket.display())))?;
    // bind(2) honours the umask; the directory is 0700 already, this is belt and braces.
    fs::set_permissions(socket, fs::Permissions::from_mode(0o600)).map_err(io_err(format!(
        "making {} private (0600)",
        socket.display()
    )))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(dir: &Path) -> Paths {
        Paths {
            config: dir.join("config"),
            state: dir.join("state"),
            runtime: dir.join("run"),
        }
    }

    #[test]
    fn second_lock_names_the_first_pid() {
        let tmp = tempfile::tempdir().unwrap();
        let p = paths(tmp.path());
        prepare_private_dir(&p.runtime).unwrap();
        assert_eq!(lock_holder(&p), None);
        let first = DaemonLock::acquire(&p).unwrap();
        let text = fs::read_to_string(first.path()).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        // flock locks belong to the open file description: a second open in this process
        // conflicts just as another process would.
        let err = DaemonLock::acquire(&p).unwrap_err().to_string();
        assert!(
            err.contains(&format!("(pid {})", std::process::id())),
            "{err}"
        );
        assert_eq!(lock_holder(&p), Some(std::process::id()));
        drop(first);
        assert_eq!(lock_holder(&p), None);
        DaemonLock::acquire(&p).unwrap();
    }

    #[test]
    fn shared_dir_is_0755_and_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("run");
        prepare_shared_dir(&d).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o755);
        prepare_shared_dir(&d).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o755);
    }

    #[test]
    fn a_closed_directory_on_the_way_is_found() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("a/b");
        prepare_shared_dir(&d).unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(closed_ancestor(&d).as_deref(), Some(tmp.path()));
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(closed_ancestor(&d), None);
    }

    #[test]
    fn private_dir_is_0700() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("a/b");
        prepare_private_dir(&d).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        // Ours and private already: accepted as it is.
        prepare_private_dir(&d).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
    }

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_private_dir_open_to_others_is_refused_and_left_as_it_is() {
        for open in [0o755, 0o770, 0o777, 0o1777] {
            let tmp = tempfile::tempdir().unwrap();
            let d = tmp.path().join("run");
            fs::create_dir(&d).unwrap();
            fs::set_permissions(&d, fs::Permissions::from_mode(open)).unwrap();
            let err = prepare_private_dir(&d).unwrap_err().to_string();
            assert!(err.contains(&d.display().to_string()), "{err}");
            assert!(err.contains(&format!("mode {open:04o}")), "{err}");
            assert!(err.contains("chmod 700"), "{err}");
            assert_eq!(
                mode(&d),
                open,
                "a directory we did not make is never chmodded"
            );
        }
    }

    #[test]
    fn a_symlinked_private_dir_is_refused_and_its_target_unchanged() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victimdir");
        fs::create_dir(&victim).unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o1777)).unwrap();
        let link = tmp.path().join("run");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let err = prepare_private_dir(&link).unwrap_err().to_string();
        assert!(err.contains(&link.display().to_string()), "{err}");
        assert!(err.contains("symbolic link"), "{err}");
        assert_eq!(mode(&victim), 0o1777);
        // A link to a directory of our own that is private is refused all the same.
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(prepare_private_dir(&link).is_err());
        // So is anything else in the directory's place.
        let file = tmp.path().join("file");
        fs::write(&file, "x").unwrap();
        let err = prepare_private_dir(&file).unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
    }

    /// Root's tests only: a directory made someone else's with chown(2).
    fn chown_to_nobody(p: &Path) -> bool {
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!(
                "skipped: only root can give {} to another user",
                p.display()
            );
            return false;
        }
        std::os::unix::fs::lchown(p, Some(65534), Some(65534)).unwrap();
        true
    }

    #[test]
    fn a_private_dir_of_another_user_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("run");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        if !chown_to_nobody(&d) {
            return;
        }
        let err = prepare_private_dir(&d).unwrap_err().to_string();
        assert!(err.contains("belongs to uid 65534"), "{err}");
        assert!(err.contains(&d.display().to_string()), "{err}");
    }

    #[test]
    fn a_lock_file_link_leaves_its_target_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let p = paths(tmp.path());
        prepare_private_dir(&p.runtime).unwrap();
        let victim = tmp.path().join("victim.txt");
        fs::write(&victim, "precious\n").unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&victim, p.runtime.join(LOCK_NAME)).unwrap();
        let err = DaemonLock::acquire(&p).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(err.contains(LOCK_NAME), "{err}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
        assert_eq!(mode(&victim), 0o644);
        assert_eq!(lock_holder(&p), None, "a link is not read either");
    }

    #[test]
    fn a_lock_file_of_another_user_is_neither_locked_nor_written() {
        let tmp = tempfile::tempdir().unwrap();
        let p = paths(tmp.path());
        prepare_private_dir(&p.runtime).unwrap();
        let lock = p.runtime.join(LOCK_NAME);
        fs::write(&lock, "theirs\n").unwrap();
        if !chown_to_nobody(&lock) {
            return;
        }
        let err = DaemonLock::acquire(&p).unwrap_err().to_string();
        assert!(err.contains("belongs to uid 65534"), "{err}");
        assert_eq!(fs::read_to_string(&lock).unwrap(), "theirs\n");
    }

    fn bind_now(socket: &Path) -> Result<tokio::net::UnixListener, DaemonError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async { bind(socket) })
    }

    #[test]
    fn a_stale_socket_of_ours_is_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("daemon.sock");
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        assert!(socket.exists(), "a closed listener leaves its file");
        bind_now(&socket).unwrap();
        assert_eq!(mode(&socket), 0o600);
    }

    #[test]
    fn what_is_not_a_socket_is_never_deleted_at_the_socket_path() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("daemon.sock");
        fs::write(&socket, "keep me\n").unwrap();
        let err = bind_now(&socket).unwrap_err().to_string();
        assert!(err.contains(&socket.display().to_string()), "{err}");
        assert!(err.contains("not a socket"), "{err}");
        assert_eq!(fs::read_to_string(&socket).unwrap(), "keep me\n");

        // A link (to a socket or anything else) is not ours to remove either.
        fs::remove_file(&socket).unwrap();
        let target = tmp.path().join("elsewhere.sock");
        drop(std::os::unix::net::UnixListener::bind(&target).unwrap());
        std::os::unix::fs::symlink(&target, &socket).unwrap();
        let err = bind_now(&socket).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(fs::symlink_metadata(&socket).unwrap().is_symlink());
        assert!(target.exists());
    }

    #[test]
    fn a_socket_of_another_user_is_not_deleted() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("daemon.sock");
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        if !chown_to_nobody(&socket) {
            return;
        }
        let err = bind_now(&socket).unwrap_err().to_string();
        assert!(err.contains("belongs to uid 65534"), "{err}");
        assert!(socket.exists());
    }

    #[test]
    fn shared_dir_open_to_writers_or_linked_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("run");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare_shared_dir(&d).unwrap_err().to_string();
        assert!(err.contains("mode 0777"), "{err}");
        assert_eq!(mode(&d), 0o777);
        let link = tmp.path().join("link");
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let err = prepare_shared_dir(&link).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
    }
}
