//! The requests that act on runs: start (spawn, then join the table), stop, pause and resume,
//! and reading a run's logs and events. Every change is recorded with who asked, the old and new
//! status, and why, in the run's `events.jsonl` and the node's.

use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use super::Runs;
use super::logs;
use super::table as runs;
use crate::daemon::base::RequestError;
use crate::ipc::Peer;
use crate::profile::{self, Profile};
use crate::protocol::{self, ErrorCode, LogStream, NodeEvent, Response, RunSignal};
use crate::supervisor::{
    Caller, DEFAULT_GRACE, Event, EventCursor, EventRecord, LaunchOptions, Run, SupervisorError,
    SystemClock,
};
use crate::time::rfc3339;

impl Runs {
    /// A run is about to be started: until the guard is dropped (the run joined the table, or
    /// did not start), a trainer that attaches to a run not in the table waits for it
    /// ([`Self::resolve_starting`]). Spawning waits (briefly) for the new session, so it is
    /// done without the table locked, and the run's trainer may attach before it joins.
    pub fn launching(&self) -> Launching<'_> {
        self.launching.fetch_add(1, Ordering::SeqCst);
        Launching(self)
    }

    /// Start a run's process (its directory under `$STATE/runs`); it joins the table with
    /// [`Self::started`].
    pub fn spawn(
        &self,
        profile: &Profile,
        caller: &Caller,
        options: &LaunchOptions,
    ) -> Result<Run, SupervisorError> {
        Run::start_new(&self.state_dir, profile, caller, options, &self.clock)
    }

    /// The run [`Self::spawn`] started joins the table, recorded with who started it and why
    /// in its events and the node's; the poller is woken for it.
    pub fn started(
        &self,
        run: Run,
        launching: Launching<'_>,
        peer: &Peer,
        why: Option<String>,
    ) -> protocol::RunInfo {
        let by = peer.describe();
        append_run_event(
            &run,
            Event::Changed {
                by: by.clone(),
                what: "run".into(),
                old: None,
                new: Some("started".into()),
                why: why.clone(),
            },
        );
        self.events.record(NodeEvent::RunStarted {
            run: run.id().to_string(),
            by,
            command: run.plan().argv.clone(),
            why,
        });
        let id = run.id().to_string();
        let mut table = self.table();
        table.insert(run);
        let info = runs::info(table.get(&id).expect("just inserted"), SystemTime::now());
        drop(table);
        drop(launching);
        // The poller sleeps while no run is live: a new one must wake it.
        self.added.notify_one();
        info
    }

    /// The run table locked, with the id `spec` names. A trainer attaches as soon as its
    /// process starts, which may be before its run joins the table: while a run is being
    /// started, a spec that matches none is looked up again when it joins (for at most
    /// [`LAUNCH_WAIT`]).
    pub(in crate::daemon) fn resolve_starting(
        &self,
        spec: &str,
    ) -> Result<(MutexGuard<'_, runs::RunTable>, String), RequestError> {
        let deadline = Instant::now() + LAUNCH_WAIT;
        let mut table = self.table();
        loop {
            match table.resolve(spec) {
                Ok(id) => return Ok((table, id)),
                Err(e) if e.code == ErrorCode::UnknownRun => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() || self.launching.load(Ordering::SeqCst) == 0 {
                        return Err(e);
                    }
                    table = self
                        .joined
                        .wait_timeout(table, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub(in crate::daemon) fn stop_run(
        &self,
        peer: &Peer,
        spec: &str,
        kill: bool,
        grace_s: Option<f64>,
        why: Option<String>,
    ) -> Result<protocol::RunInfo, RequestError> {
        let grace = match grace_s {
            None => DEFAULT_GRACE,
            Some(g) if g.is_finite() && (0.0..=86_400.0).contains(&g) => Duration::from_secs_f64(g),
            Some(g) => {
                return Err(RequestError::new(
                    ErrorCode::BadRequest,
                    format!("grace period {g} s: give 0 to 86400 seconds"),
                ));
            }
        };
        let how = if kill {
            "stop --kill: SIGKILL to the process group now".to_string()
        } else {
            format!(
                "stop: SIGTERM to the process group, SIGKILL after {} s",
                grace.as_secs_f64()
            )
        };
        self.change_run(peer, spec, why.unwrap_or(how), |run, clock| {
            if kill {
                run.kill(clock)
            } else {
                run.stop(grace, clock)
            }
        })
    }

    pub(in crate::daemon) fn signal_run(
        &self,
        peer: &Peer,
        spec: &str,
        signal: RunSignal,
        why: Option<String>,
    ) -> Result<protocol::RunInfo, RequestError> {
        let how = match signal {
            RunSignal::Pause => "pause: SIGSTOP to the process group",
            RunSignal::Resume => "resume: SIGCONT to the process group",
        };
        self.change_run(
            peer,
            spec,
            why.unwrap_or_else(|| how.into()),
            |run, clock| match signal {
                RunSignal::Pause => run.pause(clock),
                RunSignal::Resume => run.resume(clock),
            },
        )
    }

    /// Apply `change` to the run `spec` names and record who did it, old → new, and why.
    fn change_run(
        &self,
        peer: &Peer,
        spec: &str,
        why: String,
        change: impl FnOnce(&mut Run, &SystemClock) -> Result<(), SupervisorError>,
    ) -> Result<protocol::RunInfo, RequestError> {
        let mut table = self.table();
        let id = table.resolve(spec)?;
        let entry = table.get_mut(&id).expect("resolved");
        let old = entry.run.status();
        change(&mut entry.run, &self.clock)?;
        let new = entry.run.status();
        let by = peer.describe();
        append_run_event(
            &entry.run,
            Event::Changed {
                by: by.clone(),
                what: "status".into(),
                old: Some(old.as_str().into()),
                new: Some(new.as_str().into()),
                why: Some(why.clone()),
            },
        );
        let info = runs::info(entry, SystemTime::now());
        drop(table);
        self.events.record(NodeEvent::RunStatus {
            run: id,
            old,
            new,
            by,
            why,
        });
        Ok(info)
    }

    pub(in crate::daemon) fn logs(
        &self,
        spec: &str,
        stream: LogStream,
        offset: u64,
        max_bytes: Option<u64>,
    ) -> Result<Response, RequestError> {
        let (id, path, finished) = {
            let table = self.table();
            let id = table.resolve(spec)?;
            let run = &table.get(&id).expect("resolved").run;
            let path = match stream {
                LogStream::Stdout => run.dir().stdout_path(),
                LogStream::Stderr => run.dir().stderr_path(),
            };
            // Whether it had ended is read before the file: then every byte it wrote is in
            // what we read, and `finished` with `next_offset == size` really means the end.
            (id, path, run.is_finished())
        };
        let max = max_bytes
            .unwrap_or(protocol::MAX_LOG_CHUNK)
            .min(protocol::MAX_LOG_CHUNK);
        let chunk = logs::read_chunk(&path, offset, max, finished).map_err(|e| {
            RequestError::new(
                ErrorCode::Internal,
                format!("reading {}: {e}", path.display()),
            )
        })?;
        Ok(Response::Logs {
            run: id,
            stream,
            offset,
            next_offset: chunk.next_offset,
            size: chunk.size,
            data: chunk.data,
            finished,
        })
    }

    pub(in crate::daemon) fn run_events(
        &self,
        spec: &str,
        since: u64,
        max: Option<u32>,
    ) -> Result<Response, RequestError> {
        let (id, dir) = {
            let table = self.table();
            let id = table.resolve(spec)?;
            let dir = table.get(&id).expect("resolved").run.dir().clone();
            (id, dir)
        };
        let max = max
            .unwrap_or(protocol::MAX_EVENTS)
            .min(protocol::MAX_EVENTS) as usize;
        // A console asks again from where the last answer ended: that reading goes on from
        // the byte it stopped at, not from the top of the log.
        let known = self.event_cursors().get(&(id.clone(), since)).copied();
        let read = match known {
            Some(offset) => dir
                .read_events_at(
                    EventCursor {
                        events: since,
                        offset,
                    },
                    0,
                    max,
                )
                .or_else(|_| dir.read_events_at(EventCursor::default(), skip(since), max)),
            None => dir.read_events_at(EventCursor::default(), skip(since), max),
        };
        let (events, cursor) = read.map_err(|e| {
            RequestError::new(
                ErrorCode::Internal,
                format!("reading {}: {e}", dir.events_path().display()),
            )
        })?;
        let mut cursors = self.event_cursors();
        if cursors.len() >= MAX_EVENT_CURSORS {
            cursors.clear();
        }
        cursors.insert((id.clone(), cursor.events), cursor.offset);
        drop(cursors);
        let next = since + events.len() as u64;
        Ok(Response::RunEvents {
            run: id,
            events,
            next,
        })
    }
}

/// Where readings of runs' event logs stopped, kept at most (a console watching a run asks
/// from there once a refresh).
const MAX_EVENT_CURSORS: usize = 1024;

fn skip(since: u64) -> usize {
    usize::try_from(since).unwrap_or(usize::MAX)
}

/// A profile that came over the socket is checked again as if read from a file: the client is
/// trusted with nothing (a name like `../x` would escape the runs directory).
pub(in crate::daemon) fn recheck(profile: &Profile) -> Result<Profile, RequestError> {
    let mut checked = profile::parse_str("run.toml", &profile.to_toml()).map_err(|e| {
        RequestError::new(
            ErrorCode::BadRequest,
            format!("the profile is not valid: {e}"),
        )
    })?;
    checked.source.clone_from(&profile.source);
    Ok(checked)
}

pub(in crate::daemon) fn append_run_event(run: &Run, event: Event) {
    let rec = EventRecord {
        time: rfc3339(SystemTime::now()),
        event,
    };
    if let Err(e) = run.dir().append_event(&rec) {
        tracing::warn!("writing {}: {e}", run.dir().events_path().display());
    }
}

/// How long a trainer's attach waits for a run that is being started to join the table.
const LAUNCH_WAIT: Duration = Duration::from_secs(5);

/// A run being started, counted in `Runs::launching` until dropped (started or failed);
/// dropping it wakes attaches waiting in [`Runs::resolve_starting`].
pub struct Launching<'a>(&'a Runs);

impl Drop for Launching<'_> {
    fn drop(&mut self) {
        // Under the table's lock, so a waiter cannot miss the wake-up between its lookup and
        // its wait.
        let _table = self.0.table();
        self.0.launching.fetch_sub(1, Ordering::SeqCst);
        self.0.joined.notify_all();
    }
}
