//! A run's directory, `$STATE/runs/<id>/`, and the files in it:
//!
//! | file | what |
//! | --- | --- |
//! | `run.toml` | the resolved profile (a valid profile file itself) |
//! | `launch.json` | the exact argv, cwd and environment started (mode 0600: the environment may hold secrets) |
//! | `stdout.log`, `stderr.log` | the run's output, written by the run itself (its fds point at these files) |
//! | `events.jsonl` | lifecycle events, one JSON object a line |
//! | `summary.json` | status, exit, times; rewritten at each change |
//! | `pid` | `PID START_TIME BOOT_ID` of the current process, for adoption |
//! | `exit_code` | optional: written by the run itself, read when an adopted run ends |
//! | `monitor` | `PID START_TIME BOOT_ID` of the attempt's monitor (`supervisor::monitor`) |
//! | `exit.json` | how the attempt's main process ended, written by its monitor |
//!
//! The files gpupilot writes here are made 0600 and never written through a symbolic link:
//! logs and events are appended to only when they are regular files of ours, the others are
//! replaced whole through a temporary file made afresh ([`safe_fs`]). The records are read
//! within a bound, never through a link (`exit_code` included, which the run writes itself).
//!
//! Run ids are `YYYYMMDD-HHMMSS-NAME` in UTC (they sort by time and read at a glance); a second
//! run of the same name in the same second gets `-2`, `-3`, … The directory is created with
//! `create_dir`, so two supervisors can never get the same id.

use std::fs::{self, DirBuilder, File};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::ops::ControlFlow;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::events::{EventRecord, Summary};
use super::launch::LaunchPlan;
use crate::config::safe_fs::{self, DirKind};

// The most each record is read of (`safe_fs::read_capped`): far more than gpupilot writes, so
// that a file put in a record's place (by the run itself, or a link to a file that never ends)
// costs a bounded read and an error, never the daemon's memory.
/// `pid` and `monitor`: one line of three fields.
const MAX_PID_RECORD: u64 = 4 << 10;
/// `launch.json`: argv, cwd and the whole environment (Linux takes at most a few MiB of them).
const MAX_LAUNCH: u64 = 16 << 20;
/// `summary.json`.
const MAX_SUMMARY: u64 = 4 << 20;
/// `exit_code`: a number.
const MAX_EXIT_CODE: u64 = 64;
/// The most of `events.jsonl` read: some 300,000 events, far more than a run's lifecycle
/// makes. A run can write to the file itself; what lies beyond is not read.
pub const MAX_EVENTS_READ: u64 = 64 << 20;
/// The longest line of `events.jsonl` read as an event: gpupilot's are under a kilobyte.
pub const MAX_EVENT_LINE: usize = 64 << 10;

/// Where a reading of a run's `events.jsonl` stopped: `offset` is the byte just after a line's
/// newline, and `events` the events before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCursor {
    pub events: u64,
    pub offset: u64,
}

/// Where a run's process is: pid plus the start time that makes the pid unambiguous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidRecord {
    pub pid: u32,
    /// `/proc/PID/stat` field 22 (clock ticks after boot).
    pub start_time: u64,
    /// `/proc/sys/kernel/random/boot_id` when it was written.
    pub boot_id: Option<String>,
}

impl PidRecord {
    fn to_line(&self) -> String {
        match &self.boot_id {
            Some(b) => format!("{} {} {b}\n", self.pid, self.start_time),
            None => format!("{} {}\n", self.pid, self.start_time),
        }
    }

    fn parse(text: &str) -> Option<PidRecord> {
        let mut words = text.split_whitespace();
        Some(PidRecord {
            pid: words.next()?.parse().ok()?,
            start_time: words.next()?.parse().ok()?,
            boot_id: words.next().map(str::to_string),
        })
    }
}

/// The id for a run named `name` started at `now`: `20261130-031500-train-simple`.
pub fn run_id(now: SystemTime, name: &str) -> String {
    format!("{}-{name}", crate::time::compact(now))
}

/// One run's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    path: PathBuf,
    id: String,
}

impl RunDir {
    /// Where runs live under a state directory.
    pub fn runs_root(state_dir: &Path) -> PathBuf {
        state_dir.join("runs")
    }

    /// Make a new, empty run directory under `$STATE/runs/` (mode 0700). `runs/` itself is
    /// made here too, or must be a real, private directory of ours (not a link).
    pub fn create(state_dir: &Path, name: &str, now: SystemTime) -> io::Result<RunDir> {
        let root = RunDir::runs_root(state_dir);
        safe_fs::own_dir(&root, DirKind::Private)?;
        let base = run_id(now, name);
        for n in 1.. {
            let id = if n == 1 {
                base.clone()
            } else {
                format!("{base}-{n}")
            };
            let path = root.join(&id);
            // mkdir(2) fails on anything already there, a link included: the directory is ours.
            match DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(RunDir { path, id }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => continue,
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns")
    }

    /// An existing run directory; its id is its file name.
    pub fn open(path: impl Into<PathBuf>) -> io::Result<RunDir> {
        let path = path.into();
        if !path.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: no such run directory", path.display()),
            ));
        }
        let id = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(RunDir { path, id })
    }

    /// Every run directory under `$STATE/runs/`, oldest first (ids sort by time).
    pub fn list(state_dir: &Path) -> io::Result<Vec<RunDir>> {
        let root = RunDir::runs_root(state_dir);
        let entries = match fs::read_dir(&root) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut dirs = Vec::new();
        for entry in entries {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                dirs.push(RunDir::open(entry.path())?);
            }
        }
        dirs.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(dirs)
    }

    pub fn id(&self) -> &str {
        &self.id
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn profile_path(&self) -> PathBuf {
        self.path.join("run.toml")
    }
    pub fn launch_path(&self) -> PathBuf {
        self.path.join("launch.json")
    }
    pub fn stdout_path(&self) -> PathBuf {
        self.path.join("stdout.log")
    }
    pub fn stderr_path(&self) -> PathBuf {
        self.path.join("stderr.log")
    }
    pub fn events_path(&self) -> PathBuf {
        self.path.join("events.jsonl")
    }
    pub fn summary_path(&self) -> PathBuf {
        self.path.join("summary.json")
    }
    pub fn pid_path(&self) -> PathBuf {
        self.path.join("pid")
    }
    pub fn exit_code_path(&self) -> PathBuf {
        self.path.join("exit_code")
    }

    pub fn monitor_path(&self) -> PathBuf {
        self.path.join("monitor")
    }
    pub fn exit_record_path(&self) -> PathBuf {
        self.path.join("exit.json")
    }

    /// Record the current attempt's monitor (the same format as `pid`).
    pub fn write_monitor(&self, rec: &PidRecord) -> io::Result<()> {
        safe_fs::write_atomic(&self.monitor_path(), rec.to_line().as_bytes())
    }

    /// The monitor file, or None when there is none (a run started without a monitor).
    pub fn read_monitor(&self) -> io::Result<Option<PidRecord>> {
        match safe_fs::read_capped_string(&self.monitor_path(), MAX_PID_RECORD) {
            Ok(text) => Ok(PidRecord::parse(&text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Replace `exit.json` (written whole, or not at all).
    pub fn write_exit_record(&self, json: &[u8]) -> io::Result<()> {
        safe_fs::write_atomic(&self.exit_record_path(), json)
    }

    /// Open a log file for a process to write to directly (append: restarts add to it).
    pub fn open_log(path: &Path) -> io::Result<File> {
        safe_fs::open_append(path)
    }

    pub fn write_profile(&self, toml: &str) -> io::Result<()> {
        safe_fs::write_atomic(&self.profile_path(), toml.as_bytes())
    }

    pub fn write_launch(&self, plan: &LaunchPlan) -> io::Result<()> {
        let json = serde_json::to_vec_pretty(plan).map_err(io::Error::other)?;
        safe_fs::write_atomic(&self.launch_path(), &json)
    }

    pub fn read_launch(&self) -> io::Result<LaunchPlan> {
        let bytes = safe_fs::read_capped(&self.launch_path(), MAX_LAUNCH)?;
        serde_json::from_slice(&bytes).map_err(|e| bad_data(&self.launch_path(), e))
    }

    pub fn write_pid(&self, rec: &PidRecord) -> io::Result<()> {
        safe_fs::write_atomic(&self.pid_path(), rec.to_line().as_bytes())
    }

    /// The pid file, or None when there is none yet.
    pub fn read_pid(&self) -> io::Result<Option<PidRecord>> {
        match safe_fs::read_capped_string(&self.pid_path(), MAX_PID_RECORD) {
            Ok(text) => PidRecord::parse(&text)
                .map(Some)
                .ok_or_else(|| bad_data(&self.pid_path(), "expected `PID START_TIME [BOOT_ID]`")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Append one event line. One `write` of a whole line on an `O_APPEND` file, so lines from
    /// two writers never interleave.
    pub fn append_event(&self, rec: &EventRecord) -> io::Result<()> {
        let mut line = serde_json::to_string(rec).map_err(io::Error::other)?;
        line.push('\n');
        safe_fs::open_append(&self.events_path())?.write_all(line.as_bytes())
    }

    /// Each event in order to `f`, until it answers `Break`. A line that does not parse (cut
    /// short by a crash mid-write, or not an event at all) is passed over rather than making
    /// the whole history unreadable. The file is read bounded, since the run can write it too:
    /// its first [`MAX_EVENTS_READ`] bytes, and no line longer than [`MAX_EVENT_LINE`].
    pub fn visit_events(
        &self,
        mut f: impl FnMut(EventRecord) -> ControlFlow<()>,
    ) -> io::Result<()> {
        self.visit_lines_from(0, |rec, _| rec.map_or(ControlFlow::Continue(()), &mut f))
    }

    /// Each line of the event log from byte `from` on, read as [`Self::visit_events`] reads
    /// them, to `f`: its event (`None` for a line that is not one) and what was read of it.
    fn visit_lines_from(
        &self,
        from: u64,
        mut f: impl FnMut(Option<EventRecord>, safe_fs::LineRead) -> ControlFlow<()>,
    ) -> io::Result<()> {
        let mut file = match safe_fs::open_regular(&self.events_path()) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        file.seek(SeekFrom::Start(from))?;
        let mut r = BufReader::new(file.take(MAX_EVENTS_READ.saturating_sub(from)));
        let mut line = Vec::new();
        while let Some(read) = safe_fs::read_line_bounded(&mut r, &mut line, MAX_EVENT_LINE)? {
            let rec = read
                .kept
                .then(|| serde_json::from_slice(&line).ok())
                .flatten();
            if f(rec, read).is_break() {
                break;
            }
        }
        Ok(())
    }

    /// At most `max` events, from the `skip`th on (counted as [`Self::visit_events`] gives
    /// them).
    pub fn read_events(&self, skip: usize, max: usize) -> io::Result<Vec<EventRecord>> {
        Ok(self.read_events_at(EventCursor::default(), skip, max)?.0)
    }

    /// At most `max` events after `at` (the start, or where an earlier reading stopped), from
    /// the `skip`th on, and where this reading stopped: a reader that pages through the log
    /// goes on from there without reading what came before again. A last line without its
    /// newline is still being written: it waits for it. An `at` that is not the start of a
    /// line (the file was rewritten) is an `InvalidInput` error.
    pub fn read_events_at(
        &self,
        at: EventCursor,
        skip: usize,
        max: usize,
    ) -> io::Result<(Vec<EventRecord>, EventCursor)> {
        let mut out = Vec::new();
        if max == 0 {
            return Ok((out, at));
        }
        // From the byte before `at`, which must be the newline of the line before: its first
        // "line" is that newline alone. One open of the file checks the cursor and reads on.
        let mut check = at.offset > 0;
        let (mut cur, mut skipped) = (at, 0);
        self.visit_lines_from(at.offset.saturating_sub(1), |rec, read| {
            if check {
                if read.bytes == 1 && read.ended {
                    check = false;
                    return ControlFlow::Continue(());
                }
                return ControlFlow::Break(());
            }
            if !read.ended {
                return ControlFlow::Break(());
            }
            cur.offset += read.bytes;
            if let Some(rec) = rec {
                cur.events += 1;
                if skipped < skip {
                    skipped += 1;
                } else {
                    out.push(rec);
                }
            }
            if out.len() >= max {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        // Still set: the file ends before `at`, or no line starts there.
        if check {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: no line starts at byte {}",
                    self.events_path().display(),
                    at.offset
                ),
            ));
        }
        Ok((out, cur))
    }

    pub fn write_summary(&self, s: &Summary) -> io::Result<()> {
        let mut json = serde_json::to_vec_pretty(s).map_err(io::Error::other)?;
        json.push(b'\n');
        safe_fs::write_atomic(&self.summary_path(), &json)
    }

    pub fn read_summary(&self) -> io::Result<Option<Summary>> {
        match safe_fs::read_capped(&self.summary_path(), MAX_SUMMARY) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| bad_data(&self.summary_path(), e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The exit code a run wrote itself to `exit_code` (see the module doc), if any.
    pub fn read_exit_code(&self) -> Option<(i32, SystemTime)> {
        let path = self.exit_code_path();
        let code = safe_fs::read_capped_string(&path, MAX_EXIT_CODE)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let mtime = fs::metadata(&path).ok()?.modified().ok()?;
        Some((code, mtime))
    }
}

fn bad_data(path: &Path, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {e}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::events::Event;
    use std::fs::OpenOptions;
    use std::os::unix::fs::symlink;
    use std::time::{Duration, UNIX_EPOCH};

    /// An event as the log holds it, at a time that does not matter.
    fn rec(event: Event) -> EventRecord {
        EventRecord {
            time: "t".into(),
            event,
        }
    }

    #[test]
    fn run_files_are_never_written_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim.txt");
        fs::write(&victim, "precious\n").unwrap();
        let d = RunDir::create(tmp.path(), "l", SystemTime::now()).unwrap();
        symlink(&victim, d.events_path()).unwrap();
        symlink(&victim, d.stdout_path()).unwrap();
        let rec = EventRecord {
            time: "t".into(),
            event: Event::Paused {},
        };
        let e = d.append_event(&rec).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = RunDir::open_log(&d.stdout_path()).unwrap_err();
        assert!(e.to_string().contains("stdout.log"), "{e}");
        // A link where the temporary file goes is removed, not written through; the pid file
        // is made 0600 in its place.
        let planted = d.path().join(format!(".pid.tmp{}", std::process::id()));
        symlink(&victim, &planted).unwrap();
        d.write_pid(&PidRecord {
            pid: 1,
            start_time: 2,
            boot_id: None,
        })
        .unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(d.pid_path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        // `runs/` that is a link to somewhere else is refused, and nothing is made there.
        let state = tmp.path().join("state");
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir_all(&state).unwrap();
        fs::create_dir(&elsewhere).unwrap();
        symlink(&elsewhere, RunDir::runs_root(&state)).unwrap();
        let e = RunDir::create(&state, "x", SystemTime::now()).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    /// What a run (or anyone who can write its directory) puts in a record's place is read
    /// within a bound or not at all: a link to a file that never ends, a huge file.
    #[test]
    fn run_files_are_read_within_a_bound_and_never_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let d = RunDir::create(tmp.path(), "r", SystemTime::now()).unwrap();
        symlink("/dev/zero", d.exit_code_path()).unwrap();
        assert_eq!(d.read_exit_code(), None);
        symlink("/dev/zero", d.pid_path()).unwrap();
        let e = d.read_pid().unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        fs::write(d.summary_path(), vec![b' '; MAX_SUMMARY as usize + 1]).unwrap();
        let e = d.read_summary().unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
        fs::remove_file(d.exit_code_path()).unwrap();
        fs::write(d.exit_code_path(), "3\n").unwrap();
        assert_eq!(d.read_exit_code().map(|(c, _)| c), Some(3));
        // The event log is never read through a link to a file that never ends.
        symlink("/dev/zero", d.events_path()).unwrap();
        let e = d.read_events(0, usize::MAX).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
    }

    #[test]
    fn ids_are_utc_time_and_name_and_unique() {
        let t = UNIX_EPOCH + Duration::from_secs(1_796_008_500);
        assert_eq!(run_id(t, "train-simple"), "20261130-031500-train-simple");
        let tmp = tempfile::tempdir().unwrap();
        let a = RunDir::create(tmp.path(), "x", t).unwrap();
        let b = RunDir::create(tmp.path(), "x", t).unwrap();
        assert_eq!(a.id(), "20261130-031500-x");
        assert_eq!(b.id(), "20261130-031500-x-2");
        let listed: Vec<String> = RunDir::list(tmp.path())
            .unwrap()
            .iter()
            .map(|d| d.id().to_string())
            .collect();
        assert_eq!(listed, [a.id(), b.id()]);
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(a.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn pid_file_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let d = RunDir::create(tmp.path(), "p", SystemTime::now()).unwrap();
        assert_eq!(d.read_pid().unwrap(), None);
        let rec = PidRecord {
            pid: 12,
            start_time: 345,
            boot_id: Some("abc".into()),
        };
        d.write_pid(&rec).unwrap();
        assert_eq!(fs::read_to_string(d.pid_path()).unwrap(), "12 345 abc\n");
        assert_eq!(d.read_pid().unwrap(), Some(rec));
        fs::write(d.pid_path(), "garbage").unwrap();
        assert!(d.read_pid().is_err());
    }

    #[test]
    fn events_append_and_skip_torn_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let d = RunDir::create(tmp.path(), "e", SystemTime::now()).unwrap();
        d.append_event(&rec(Event::Paused {})).unwrap();
        OpenOptions::new()
            .append(true)
            .open(d.events_path())
            .unwrap()
            .write_all(b"{\"time\":\"t\",\"ev")
            .unwrap();
        fs::write(
            d.events_path(),
            fs::read_to_string(d.events_path()).unwrap() + "\n",
        )
        .unwrap();
        d.append_event(&rec(Event::Resumed {})).unwrap();
        let events: Vec<Event> = d
            .read_events(0, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|r| r.event)
            .collect();
        assert_eq!(events, [Event::Paused {}, Event::Resumed {}]);
    }

    #[test]
    fn events_are_read_bounded_and_by_page() {
        let tmp = tempfile::tempdir().unwrap();
        let d = RunDir::create(tmp.path(), "e", SystemTime::now()).unwrap();
        let names =
            |v: Vec<EventRecord>| -> Vec<Event> { v.into_iter().map(|r| r.event).collect() };
        d.append_event(&rec(Event::Paused {})).unwrap();
        // What a run could write in its own directory: a line past the bound (skipped, never
        // held whole), bytes that are not UTF-8, then more events.
        let mut f = OpenOptions::new()
            .append(true)
            .open(d.events_path())
            .unwrap();
        let huge = format!(
            "{{\"time\":\"t\",\"event\":\"paused\",\"pad\":\"{}\"}}\n",
            "x".repeat(MAX_EVENT_LINE)
        );
        f.write_all(huge.as_bytes()).unwrap();
        f.write_all(b"\xff\xfe not text\n").unwrap();
        drop(f);
        d.append_event(&rec(Event::Resumed {})).unwrap();
        d.append_event(&rec(Event::Paused {})).unwrap();
        assert_eq!(
            names(d.read_events(0, usize::MAX).unwrap()),
            [Event::Paused {}, Event::Resumed {}, Event::Paused {}]
        );
        assert_eq!(names(d.read_events(1, 1).unwrap()), [Event::Resumed {}]);
        assert_eq!(names(d.read_events(2, 5).unwrap()), [Event::Paused {}]);
        assert!(d.read_events(3, 5).unwrap().is_empty());
        assert!(d.read_events(0, 0).unwrap().is_empty());
        // Past MAX_EVENTS_READ nothing is read: a file grown there (sparse, so cheap to make)
        // ends the events where the bound falls.
        let f = OpenOptions::new()
            .append(true)
            .open(d.events_path())
            .unwrap();
        f.set_len(MAX_EVENTS_READ + 1).unwrap();
        drop(f);
        d.append_event(&rec(Event::Resumed {})).unwrap();
        assert_eq!(d.read_events(0, usize::MAX).unwrap().len(), 3);
    }

    /// A reading from a cursor goes on from its byte: what came before is not read again (here
    /// it is overwritten, and the reading does not see it), and the cursor it gives back goes
    /// on from there in turn. A cursor inside a line is refused.
    #[test]
    fn events_are_read_on_from_where_a_reading_stopped() {
        let tmp = tempfile::tempdir().unwrap();
        let d = RunDir::create(tmp.path(), "c", SystemTime::now()).unwrap();
        let names =
            |v: Vec<EventRecord>| -> Vec<Event> { v.into_iter().map(|r| r.event).collect() };
        for e in [Event::Paused {}, Event::Resumed {}, Event::Paused {}] {
            d.append_event(&rec(e)).unwrap();
        }
        let (first, at) = d.read_events_at(EventCursor::default(), 0, 2).unwrap();
        assert_eq!(names(first), [Event::Paused {}, Event::Resumed {}]);
        assert_eq!(at.events, 2);
        let text = fs::read(d.events_path()).unwrap();
        assert_eq!(text[at.offset as usize - 1], b'\n');
        // The first two lines become lines that are not events, of the same length.
        let mut blanked = text.clone();
        for b in &mut blanked[..at.offset as usize] {
            if *b != b'\n' {
                *b = b'z';
            }
        }
        fs::write(d.events_path(), &blanked).unwrap();
        let (rest, end) = d.read_events_at(at, 0, 10).unwrap();
        assert_eq!(names(rest), [Event::Paused {}]);
        assert_eq!(
            end,
            EventCursor {
                events: 3,
                offset: text.len() as u64
            }
        );
        assert_eq!(
            d.read_events(0, 10).unwrap().len(),
            1,
            "a full reading sees them"
        );
        // Nothing new: the same cursor. A line still without its newline is not read yet.
        assert_eq!(d.read_events_at(end, 0, 10).unwrap(), (vec![], end));
        let mut f = OpenOptions::new()
            .append(true)
            .open(d.events_path())
            .unwrap();
        f.write_all(br#"{"time":"t","event":"resumed"}"#).unwrap();
        assert_eq!(d.read_events_at(end, 0, 10).unwrap(), (vec![], end));
        f.write_all(b"\n").unwrap();
        let (late, _) = d.read_events_at(end, 0, 10).unwrap();
        assert_eq!(names(late), [Event::Resumed {}]);
        // Inside a line, or past the end: refused.
        for offset in [at.offset - 1, text.len() as u64 + 1000] {
            let inside = EventCursor { events: 2, offset };
            let e = d.read_events_at(inside, 0, 10).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        }
    }
}
