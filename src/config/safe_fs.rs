//! The directories and files gpupilot keeps for itself (runtime, state, run directories), made
//! and opened so that nobody else's can stand in for them.
//!
//! What tmux and ssh-agent do: a directory is made here, or, when it exists, opened without
//! following a symbolic link (`O_NOFOLLOW | O_DIRECTORY`) and checked on the open descriptor
//! (`fstat`): a real directory, ours, not open to others. One that is not is refused with a
//! message naming the path, the problem and the way out; a directory we did not just make is
//! never chmodded (tightening one that others could write would not take out what they put in
//! it). Files in them are opened with `O_NOFOLLOW`, made 0600, appended to or rewritten only
//! when they are regular files of ours, and replaced whole through a fresh temporary file
//! (`O_CREAT | O_EXCL`) and rename(2). Nothing here removes what it did not make, except a
//! socket of ours (see [`remove_stale_socket`]).
//!
//! Only the last component of a path is checked: a link higher up (`/home -> /data/home`) is
//! the system's or the user's choice, and the directories below it are checked all the same.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::ControlFlow;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::OFlags;

/// A path refused because someone else could have put it there or could change it; wrapped in
/// an [`io::Error`] of kind `PermissionDenied` (see [`refusal`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refusing {}: {problem}; {fix}", path.display())]
pub struct Refused {
    pub path: PathBuf,
    /// What is wrong: "it is a symbolic link (to /x)", "it belongs to uid 65534, not to you".
    pub problem: String,
    /// What to do about it.
    pub fix: String,
}

impl Refused {
    fn error(path: &Path, problem: impl Into<String>, fix: impl Into<String>) -> io::Error {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            Refused {
                path: path.to_path_buf(),
                problem: problem.into(),
                fix: fix.into(),
            },
        )
    }
}

/// The refusal inside `e`, when `e` is one (and not a plain I/O error).
pub fn refusal(e: &io::Error) -> Option<&Refused> {
    e.get_ref()?.downcast_ref::<Refused>()
}

/// The effective uid: the owner of what this process makes.
pub fn my_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// `O_NOFOLLOW` for [`OpenOptionsExt::custom_flags`] (std adds `O_CLOEXEC` itself).
fn no_follow() -> i32 {
    // O_NOFOLLOW is a small positive flag (0o400000 on x86-64 and aarch64).
    OFlags::NOFOLLOW.bits() as i32
}

/// How a directory must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirKind {
    /// 0700: a user's runtime or state directory, the system daemon's state.
    Private,
    /// 0755: the system daemon's runtime directory, which every user passes through to the
    /// socket; nobody but its owner may write it.
    Shared,
}

impl DirKind {
    fn mode(self) -> u32 {
        match self {
            DirKind::Private => 0o700,
            DirKind::Shared => 0o755,
        }
    }

    /// The mode bits that make an existing directory unsafe.
    fn forbidden(self) -> u32 {
        match self {
            DirKind::Private => 0o077,
            DirKind::Shared => 0o022,
        }
    }
}

/// Make `dir` (its parents too, with the same mode) or check the one that is there: a real
/// directory (not a link), owned by us, and not open to others as `kind` says. One made here
/// gets exactly `kind`'s mode; one that was there is left exactly as it was.
pub fn own_dir(dir: &Path, kind: DirKind) -> io::Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        DirBuilder::new()
            .recursive(true)
            .mode(kind.mode())
            .create(parent)?;
    }
    let made = match DirBuilder::new().mode(kind.mode()).create(dir) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(e),
    };
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(no_follow() | OFlags::DIRECTORY.bits() as i32)
        .open(dir)
        .map_err(|e| not_openable(dir, e, DIRECTORY))?;
    let meta = f.metadata()?;
    check_owner(
        dir,
        meta.uid(),
        "remove it (as its owner or root) so that gpupilot makes it, or",
    )?;
    if made {
        // mkdir(2) applied the umask; a directory of our own making gets the mode meant.
        return f.set_permissions(PermissionsExt::from_mode(kind.mode()));
    }
    let mode = meta.mode() & 0o7777;
    if mode & kind.forbidden() != 0 {
        let want = kind.mode();
        return Err(Refused::error(
            dir,
            format!(
                "it is open to other users (mode {mode:04o}), who could have put files of \
                 theirs in it"
            ),
            format!(
                "check what is in it, then `chmod {want:o} {}`; or remove it and gpupilot \
                 makes it again ({want:04o})",
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// Refuse what is not ours. `or` starts the way out; the rest names another place.
fn check_owner(path: &Path, uid: u32, or: &str) -> io::Result<()> {
    let me = my_uid();
    if uid == me {
        return Ok(());
    }
    Err(Refused::error(
        path,
        format!("it belongs to uid {uid}, not to you (uid {me})"),
        format!("{or} use a place of your own (GPUPILOT_HOME=DIR)"),
    ))
}

/// What [`not_openable`] expected at a path.
const DIRECTORY: &str = "a directory";
const FILE: &str = "a regular file";

/// The error for an `O_NOFOLLOW` open that failed: a link or something else in the place of
/// `what` is a refusal; anything else stays the I/O error it was.
fn not_openable(path: &Path, e: io::Error, what: &str) -> io::Error {
    // ELOOP: the last component is a link; ENOTDIR: not a directory (with O_DIRECTORY);
    // EISDIR: a directory opened to write.
    use rustix::io::Errno;
    let suspicious = e.raw_os_error().is_some_and(|code| {
        [Errno::LOOP, Errno::NOTDIR, Errno::ISDIR]
            .iter()
            .any(|x| x.raw_os_error() == code)
    });
    if !suspicious {
        return e;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            let target = std::fs::read_link(path)
                .map(|t| format!(" to {}", t.display()))
                .unwrap_or_default();
            let fix = if what == DIRECTORY {
                "remove the link (gpupilot makes the directory itself), or name the real \
                 directory instead (GPUPILOT_HOME=DIR)"
            } else {
                "remove the link; gpupilot makes the file itself"
            };
            Refused::error(
                path,
                format!("it is a symbolic link{target}, and gpupilot does not follow one here"),
                fix,
            )
        }
        Ok(m) => Refused::error(
            path,
            format!("it is not {what} but {}", describe(&m)),
            "move it away",
        ),
        Err(_) => e,
    }
}

/// "a directory", "a socket", … for messages.
fn describe(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_file() {
        "a regular file"
    } else {
        "a device"
    }
}

/// Open options for a file of ours: never through a link, 0600 when made. `O_NONBLOCK` so
/// that a FIFO in the file's place cannot hold the open forever; [`check_file`] refuses it
/// and clears the flag on a regular file.
fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(0o600)
        .custom_flags(no_follow() | OFlags::NONBLOCK.bits() as i32);
    o
}

/// Refuse an open file that is not a regular file.
fn check_regular(path: &Path, meta: &std::fs::Metadata) -> io::Result<()> {
    if meta.file_type().is_file() {
        return Ok(());
    }
    Err(Refused::error(
        path,
        format!("it is not a regular file but {}", describe(meta)),
        "move it away",
    ))
}

/// Refuse an open file that is not a regular file of ours; make it blocking again.
fn check_file(path: &Path, f: &File) -> io::Result<()> {
    let meta = f.metadata()?;
    check_regular(path, &meta)?;
    check_owner(path, meta.uid(), "remove it, or")?;
    let flags = rustix::fs::fcntl_getfl(f)?;
    rustix::fs::fcntl_setfl(f, flags - OFlags::NONBLOCK)?;
    Ok(())
}

/// Open `path` with `o`, then refuse what is not a regular file of ours.
fn open_checked(path: &Path, o: &OpenOptions) -> io::Result<File> {
    let f = o.open(path).map_err(|e| not_openable(path, e, FILE))?;
    check_file(path, &f)?;
    Ok(f)
}

/// Open `path` to append to it, making it (0600) if needed: for logs.
pub fn open_append(path: &Path) -> io::Result<File> {
    open_checked(path, options().create(true).append(true))
}

/// Open `path` to read and write it, making it (0600) if needed and never truncating it: the
/// caller rewrites it once it knows it may (a lock file, after taking the lock).
pub fn open_rw(path: &Path) -> io::Result<File> {
    open_checked(
        path,
        options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false),
    )
}

/// Open an existing file of ours to read it, without following a link.
pub fn open_read(path: &Path) -> io::Result<File> {
    open_checked(path, options().read(true))
}

/// Open `path` to read it, a file in a directory of ours that someone else may write (a run's
/// logs, which the run writes itself): never through a link, and only a regular file (a FIFO
/// is refused at once rather than waited on: the open does not block). Its owner is not
/// checked. Whoever reads should still bound what it reads: a regular file can grow.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let f = options()
        .read(true)
        .open(path)
        .map_err(|e| not_openable(path, e, FILE))?;
    check_regular(path, &f.metadata()?)?;
    Ok(f)
}

/// Read a settings file a daemon acts on (`control.toml`), at most `max` bytes, trusting it
/// only as sshd's StrictModes does. A root daemon runs what it says as root (alert hooks, caps),
/// so for it the file and its directory must be root's, writable by nobody else, and neither
/// may be a symbolic link. A user's daemon takes its own files or root's, links followed (a
/// dotfiles checkout), but none that any user may write. `NotFound` when there is no file (or,
/// for root, no directory).
pub fn read_config(path: &Path, max: u64) -> io::Result<String> {
    let root = my_uid() == 0;
    if root {
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            let d = OpenOptions::new()
                .read(true)
                .custom_flags(no_follow() | OFlags::DIRECTORY.bits() as i32)
                .open(dir)
                .map_err(|e| not_openable(dir, e, DIRECTORY))?;
            check_trusted(dir, &d.metadata()?, true)?;
        }
    }
    let mut o = OpenOptions::new();
    o.read(true)
        .custom_flags(OFlags::NONBLOCK.bits() as i32 | if root { no_follow() } else { 0 });
    let f = o.open(path).map_err(|e| not_openable(path, e, FILE))?;
    let meta = f.metadata()?;
    check_regular(path, &meta)?;
    check_trusted(path, &meta, root)?;
    let mut text = String::new();
    f.take(max).read_to_string(&mut text)?;
    Ok(text)
}

/// A settings file or its directory that `root` (or a user's daemon) may act on: owned by root
/// (or, for a user, by them) and not writable by others (for root, by its group either).
fn check_trusted(path: &Path, meta: &std::fs::Metadata, root: bool) -> io::Result<()> {
    let me = my_uid();
    let mode = meta.mode() & 0o7777;
    let owner_ok = meta.uid() == 0 || meta.uid() == me;
    let forbidden = if root { 0o022 } else { 0o002 };
    let chown = if root {
        "chown root:root"
    } else {
        "chown $USER"
    };
    if !owner_ok {
        return Err(Refused::error(
            path,
            format!(
                "it belongs to uid {}, and the daemon (uid {me}) would act on what they write                  in it",
                meta.uid()
            ),
            format!(
                "`{chown} {}` once you have checked what is in it",
                path.display()
            ),
        ));
    }
    if mode & forbidden != 0 {
        let who = if root {
            "its group or other users"
        } else {
            "other users"
        };
        let bits = if root { "go-w" } else { "o-w" };
        return Err(Refused::error(
            path,
            format!("{who} may write it (mode {mode:04o})"),
            format!(
                "`chmod {bits} {}` once you have checked what is in it",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// The end of the open file `f`: its bytes from `max` before its end, or from `floor` when that
/// is later, up to the size it has now (not what is written meanwhile); and where they start.
pub fn read_end(f: &mut File, max: u64, floor: u64) -> io::Result<(Vec<u8>, u64)> {
    use std::io::{Seek, SeekFrom};
    let len = f.metadata()?.len();
    let from = len.saturating_sub(max).max(floor);
    let mut bytes = Vec::new();
    if from < len {
        f.seek(SeekFrom::Start(from))?;
        f.take(len - from).read_to_end(&mut bytes)?;
    }
    Ok((bytes, from))
}

/// What [`read_line_bounded`] read of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineRead {
    /// It was no longer than the bound, and is in the buffer.
    pub kept: bool,
    /// It ended with a newline (only the input's last line may not).
    pub ended: bool,
    /// Bytes of input it took, its newline included.
    pub bytes: u64,
}

/// The next line of `r` into `line` (emptied first, without its newline), bounded: a line
/// longer than `max` bytes is read past, not kept, and leaves `line` empty. `None` at the end
/// of the input; otherwise what was read of the line. A last line without a newline counts.
pub fn read_line_bounded(
    r: &mut impl io::BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<Option<LineRead>> {
    line.clear();
    let mut read = LineRead {
        kept: true,
        ended: false,
        bytes: 0,
    };
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok((read.bytes > 0).then_some(read));
        }
        let (part, used, ends) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], i + 1, true),
            None => (buf, buf.len(), false),
        };
        if read.kept && line.len() + part.len() <= max {
            line.extend_from_slice(part);
        } else if read.kept {
            read.kept = false;
            line.clear();
        }
        r.consume(used);
        read.bytes += used as u64;
        if ends {
            read.ended = true;
            return Ok(Some(read));
        }
    }
}

/// Each line of `r` to `f`, read as [`read_line_bounded`] reads them: `None` for a line longer
/// than `max` bytes, which is passed over without being kept. Until the end of `r`, or until
/// `f` answers `Break`.
pub fn visit_lines(
    mut r: impl io::BufRead,
    max: usize,
    mut f: impl FnMut(Option<&[u8]>) -> ControlFlow<()>,
) -> io::Result<()> {
    let mut line = Vec::new();
    while let Some(read) = read_line_bounded(&mut r, &mut line, max)? {
        if f(read.kept.then_some(line.as_slice())).is_break() {
            break;
        }
    }
    Ok(())
}

/// The whole of `path`, a record gpupilot keeps (or a run writes) in a directory of ours: at
/// most `max` bytes, opened without following a link. A link, a FIFO or a device in its place
/// is refused rather than read (a link to `/dev/zero` would never end), and a file longer than
/// `max` is an `InvalidData` error that names the bound. Its owner is not checked: a command of
/// another user (root's `gpupilot report`, say) may read a run's files.
pub fn read_capped(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let f = open_regular(path)?;
    let mut bytes = Vec::new();
    f.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is longer than {max} bytes, more than gpupilot ever writes there: not read",
                path.display()
            ),
        ));
    }
    Ok(bytes)
}

/// [`read_capped`], as UTF-8 text.
pub fn read_capped_string(path: &Path, max: u64) -> io::Result<String> {
    String::from_utf8(read_capped(path, max)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not UTF-8 text", path.display()),
        )
    })
}

/// Replace `path` with `bytes` (0600) in one step, so a reader (or a crash) never sees half a
/// file: written to a temporary file beside it that this call makes itself (`O_EXCL`, so no
/// link or file put there is written through), then renamed over `path` (which replaces a
/// link rather than follow it).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace(path, bytes, false)
}

/// [`write_atomic`], synced to the disk (the file, then its directory) before it returns: for
/// a record whose loss would lose something that cannot be found again (a GPU's original
/// settings).
pub fn write_atomic_durable(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace(path, bytes, true)
}

fn replace(path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    let name = path
        .file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp{}", std::process::id()));
    let make = || options().write(true).create_new(true).open(&tmp);
    let mut f = match make() {
        // Left by an earlier process of this pid that died mid-write: unlink(2) removes a link
        // itself, never its target.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&tmp)?;
            make()?
        }
        other => other?,
    };
    let written = f
        .write_all(bytes)
        .and_then(|()| if durable { f.sync_all() } else { Ok(()) })
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    } else if durable {
        // The rename itself must survive a crash too.
        if let Some(dir) = path.parent().and_then(|d| File::open(d).ok()) {
            let _ = dir.sync_all();
        }
    }
    written
}

/// Remove a socket file left by a daemon that died (call with the daemon's lock held): only a
/// socket, and only one of ours. Anything else at `path` is refused, never deleted. Whether
/// there was one to remove.
pub fn remove_stale_socket(path: &Path) -> io::Result<bool> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(Refused::error(
            path,
            format!(
                "the daemon's socket goes there, and it is not a socket but {}, which gpupilot \
                 does not delete",
                describe(&meta)
            ),
            "move it away if nothing needs it",
        ));
    }
    check_owner(path, meta.uid(), "remove it, or")?;
    std::fs::remove_file(path)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn make_fifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
    }

    fn victim(dir: &Path) -> PathBuf {
        let v = dir.join("victim.txt");
        fs::write(&v, "precious\n").unwrap();
        v
    }

    #[test]
    fn appending_and_rewriting_never_go_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let v = victim(tmp.path());
        let link = tmp.path().join("daemon.log");
        symlink(&v, &link).unwrap();
        let e = open_append(&link).unwrap_err();
        let r = refusal(&e).expect("a refusal");
        assert_eq!(r.path, link);
        assert!(r.problem.contains("symbolic link to"), "{e}");
        let e = open_rw(&link).unwrap_err();
        assert!(refusal(&e).is_some(), "{e}");
        assert!(open_read(&link).is_err());
        assert_eq!(fs::read_to_string(&v).unwrap(), "precious\n");

        // write_atomic replaces the link itself, the victim stays as it was.
        write_atomic(&link, b"new\n").unwrap();
        assert!(!fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(fs::read_to_string(&link).unwrap(), "new\n");
        assert_eq!(fs::read_to_string(&v).unwrap(), "precious\n");
    }

    #[test]
    fn a_capped_read_takes_a_regular_file_up_to_its_bound_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("summary.json");
        fs::write(&p, b"0123456789").unwrap();
        assert_eq!(read_capped(&p, 10).unwrap(), b"0123456789");
        let e = read_capped(&p, 9).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("longer than 9 bytes"), "{e}");
        // Missing stays NotFound (callers take it for "none yet").
        let e = read_capped(&tmp.path().join("none"), 9).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        // A link (to a file that never ends) is refused, not followed.
        let link = tmp.path().join("exit_code");
        symlink("/dev/zero", &link).unwrap();
        let e = read_capped(&link, 64).unwrap_err();
        assert!(
            refusal(&e).is_some_and(|r| r.problem.contains("symbolic link")),
            "{e}"
        );
        // A FIFO is refused at once, not waited on.
        let fifo = tmp.path().join("pid");
        make_fifo(&fifo);
        let e = read_capped_string(&fifo, 64).unwrap_err();
        assert!(
            refusal(&e).is_some_and(|r| r.problem.contains("FIFO")),
            "{e}"
        );
        fs::write(&p, [0xff, 0xfe]).unwrap();
        let e = read_capped_string(&p, 64).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
    }

    #[test]
    fn the_end_of_a_file_is_its_last_bytes_from_the_floor_on() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("stderr.log");
        fs::write(&p, b"0123456789").unwrap();
        let mut f = open_regular(&p).unwrap();
        assert_eq!(read_end(&mut f, 4, 0).unwrap(), (b"6789".to_vec(), 6));
        assert_eq!(read_end(&mut f, 4, 8).unwrap(), (b"89".to_vec(), 8));
        assert_eq!(
            read_end(&mut f, 100, 0).unwrap(),
            (b"0123456789".to_vec(), 0)
        );
        assert_eq!(read_end(&mut f, 4, 10).unwrap(), (Vec::new(), 10));
    }

    #[test]
    fn a_planted_temporary_file_is_not_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let v = victim(tmp.path());
        let path = tmp.path().join("summary.json");
        let planted = tmp
            .path()
            .join(format!(".summary.json.tmp{}", std::process::id()));
        symlink(&v, &planted).unwrap();
        write_atomic(&path, b"{}\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "{}\n");
        assert_eq!(fs::read_to_string(&v).unwrap(), "precious\n");
        assert!(!planted.exists() && fs::symlink_metadata(&planted).is_err());
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn new_files_are_0600_and_appends_keep_what_was_there() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("a.log");
        open_append(&p).unwrap().write_all(b"one\n").unwrap();
        open_append(&p).unwrap().write_all(b"two\n").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "one\ntwo\n");
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        open_rw(&p).unwrap();
        assert_eq!(
            fs::read_to_string(&p).unwrap(),
            "one\ntwo\n",
            "not truncated"
        );
    }

    #[test]
    fn a_directory_or_fifo_in_the_place_of_a_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let e = open_rw(tmp.path()).unwrap_err();
        assert!(
            e.to_string().contains("not a regular file but a directory"),
            "{e}"
        );
        // Nobody reads this FIFO: a blocking open to write would never return.
        let fifo = tmp.path().join("daemon.log");
        make_fifo(&fifo);
        assert!(open_append(&fifo).is_err());
        let e = open_rw(&fifo).unwrap_err();
        assert!(
            e.to_string().contains("not a regular file but a FIFO"),
            "{e}"
        );
    }

    #[test]
    fn an_opened_file_blocks_as_usual() {
        let tmp = tempfile::tempdir().unwrap();
        let f = open_append(&tmp.path().join("a.log")).unwrap();
        let flags = rustix::fs::fcntl_getfl(&f).unwrap();
        assert!(!flags.contains(OFlags::NONBLOCK), "{flags:?}");
    }

    #[test]
    fn own_dir_makes_with_the_exact_mode_and_refuses_links() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("a/b");
        own_dir(&d, DirKind::Shared).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o7777, 0o755);
        let l = tmp.path().join("l");
        symlink(&d, &l).unwrap();
        let e = own_dir(&l, DirKind::Shared).unwrap_err();
        assert!(
            refusal(&e).is_some_and(|r| r.problem.contains("symbolic link")),
            "{e}"
        );
        // A dangling link is a link too, not a place to make the directory.
        let dangling = tmp.path().join("dangling");
        symlink(tmp.path().join("nowhere"), &dangling).unwrap();
        assert!(own_dir(&dangling, DirKind::Private).is_err());
        assert!(!tmp.path().join("nowhere").exists());
    }

    #[test]
    fn only_a_socket_is_removed_as_stale() {
        let tmp = tempfile::tempdir().unwrap();
        let s = tmp.path().join("s.sock");
        assert!(!remove_stale_socket(&s).unwrap());
        drop(std::os::unix::net::UnixListener::bind(&s).unwrap());
        assert!(remove_stale_socket(&s).unwrap());
        assert!(!s.exists());
        fs::create_dir(&s).unwrap();
        let e = remove_stale_socket(&s).unwrap_err();
        assert!(
            e.to_string().contains("not a socket but a directory"),
            "{e}"
        );
        assert!(s.is_dir());
    }

    #[test]
    fn lines_are_read_bounded_and_long_ones_passed_over() {
        use std::io::BufReader;
        let long = "x".repeat(100);
        let text = format!("one\n{long}\n\ntwo\n{long}");
        // A reader's buffer shorter than a line: the bound holds across refills.
        let r = BufReader::with_capacity(7, text.as_bytes());
        let mut got = Vec::new();
        visit_lines(r, 10, |line| {
            got.push(line.map(|l| String::from_utf8(l.to_vec()).unwrap()));
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(
            got,
            [
                Some("one".into()),
                None,
                Some(String::new()),
                Some("two".into()),
                None
            ]
        );
        // `Break` ends the reading.
        let mut seen = 0;
        visit_lines(text.as_bytes(), 10, |_| {
            seen += 1;
            if seen == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
        assert_eq!(seen, 2);
        let mut line = Vec::new();
        // Exactly the bound is kept; the end of the input with nothing after a newline is
        // no line.
        let mut r = BufReader::new(&b"0123456789\n"[..]);
        let read = read_line_bounded(&mut r, &mut line, 10).unwrap();
        assert_eq!(read.map(|l| l.kept), Some(true));
        assert_eq!(line, b"0123456789");
        assert_eq!(read_line_bounded(&mut r, &mut line, 10).unwrap(), None);
        assert!(line.is_empty());
    }
}
