//! One daemon per `GPUPILOT_HOME`: the runtime directory (0700, ours), the lock file in it
//! (flock, holding the pid of the daemon that has it) and the socket (0600).
//!
//! The lock is what decides, not the socket: a daemon killed with SIGKILL leaves its socket
//! file behind but its lock goes with it, so the next daemon takes the lock and removes the
//! stale socket. The lock file itself is never removed: unlinking it while another daemon is
//! opening it would let two daemons each hold a lock on a different file.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{FlockOperation, flock};

use super::{DaemonError, LOCK_NAME, home_description, io_err, socket_path};
use crate::config::Paths;

/// Make `dir` (and its parents) if needed, and make sure it is ours and private (0700).
///
/// A directory that exists but belongs to someone else is refused: in the `/tmp/gpupilot-UID`
/// fallback, another user could have made it first to intercept the socket.
pub fn prepare_private_dir(dir: &Path) -> Result<(), DaemonError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(format!("creating {}", dir.display())))?;
    let meta = fs::metadata(dir).map_err(io_err(format!("reading {}", dir.display())))?;
    let me = rustix::process::getuid().as_raw();
    if meta.uid() != me {
        return Err(DaemonError::Unsafe(format!(
            "{} belongs to uid {}, not to you (uid {me}): refusing to keep a daemon's files there; \
             set GPUPILOT_HOME or XDG_RUNTIME_DIR to a directory of your own",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(io_err(format!("making {} private (0700)", dir.display())))?;
    }
    Ok(())
}

/// The system daemon's runtime directory: made if needed, root's, and 0755 so that every
/// local user reaches the socket in it (and nobody but root can put a file there).
pub fn prepare_shared_dir(dir: &Path) -> Result<(), DaemonError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(io_err(format!("creating {}", dir.display())))?;
    let meta = fs::metadata(dir).map_err(io_err(format!("reading {}", dir.display())))?;
    let me = rustix::process::getuid().as_raw();
    if meta.uid() != me {
        return Err(DaemonError::Unsafe(format!(
            "{} belongs to uid {}, not to uid {me}: refusing to serve the system socket from it; \
             remove it, or set GPUPILOT_SYSTEM_DIR to a directory of root's",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o777 != 0o755 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
            .map_err(io_err(format!("making {} 0755", dir.display())))?;
    }
    Ok(())
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
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io_err(format!("opening {}", path.display())))?;
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
    let mut file = File::open(&path).ok()?;
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

/// Listen on `socket` (mode 0600), replacing a stale socket file. Call with the lock held.
pub fn bind(socket: &Path) -> Result<tokio::net::UnixListener, DaemonError> {
    match fs::remove_file(socket) {
        Ok(()) => tracing::info!("removed a stale socket at {}", socket.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(format!("removing {}", socket.display()))(e)),
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
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
        prepare_shared_dir(&d).unwrap();
        assert_eq!(
            fs::metadata(&d).unwrap().mode() & 0o777,
            0o755,
            "not world-writable"
        );
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
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        prepare_private_dir(&d).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
    }
}
