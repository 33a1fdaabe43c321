//! The daemon's table of runs: every run directory under `$STATE/runs`, the live ones driven
//! by [`crate::supervisor::Run::poll`], and how a person names a run (id, id prefix, `last`,
//! its name, `name:NAME`: [`run_spec`]).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use crate::protocol::{ErrorCode, RunInfo};
use crate::supervisor::run_spec::{self, SpecError};
use crate::supervisor::{Clock, Run, RunDir, RunStatus};
use crate::time::parse_rfc3339;

use crate::daemon::base::RequestError;

/// One run and how this daemon came by it.
#[derive(Debug)]
pub struct Entry {
    pub run: Run,
    /// Found in its directory when this daemon started (not started by this daemon).
    pub adopted: bool,
}

/// A run whose status changed during a poll.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub id: String,
    pub old: RunStatus,
    pub new: RunStatus,
    /// In words, from the run's summary: `exit 0`, `killed by SIGTERM`, …
    pub why: String,
}

/// What adoption found in one directory (for the node's event log).
#[derive(Debug, Clone, PartialEq)]
pub struct Adoption {
    pub id: String,
    pub pid: Option<u32>,
    pub status: RunStatus,
    /// It was live, or it ended while no daemon watched: worth an event.
    pub was_open: bool,
}

/// Every run the daemon knows, by id. Shown and searched in the order the runs started (see
/// [`RunTable::ordered`]), not in the ids' text order: `…-loop-10` comes after `…-loop-9`.
#[derive(Debug, Default)]
pub struct RunTable {
    entries: BTreeMap<String, Entry>,
}

impl RunTable {
    /// Take over every run directory under `state_dir`. Every one is listed: a file that
    /// cannot be read (a profile that no longer loads, a link or a FIFO the run put in a
    /// record's place) is passed over, and the run says so (see [`Run::problem`]).
    pub fn adopt_all(state_dir: &Path, clock: &dyn Clock) -> (RunTable, Vec<Adoption>) {
        let mut table = RunTable::default();
        let mut found = Vec::new();
        let dirs = match RunDir::list(state_dir) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("listing runs under {}: {e}", state_dir.display());
                Vec::new()
            }
        };
        for dir in dirs {
            let was_open = !matches!(dir.read_summary(), Ok(Some(s)) if s.status.is_final());
            let id = dir.id().to_string();
            let run = Run::adopt(dir, clock);
            found.push(Adoption {
                id: id.clone(),
                pid: run.pid(),
                status: run.status(),
                was_open,
            });
            table.entries.insert(id, Entry { run, adopted: true });
        }
        (table, found)
    }

    pub fn insert(&mut self, run: Run) {
        self.entries.insert(
            run.id().to_string(),
            Entry {
                run,
                adopted: false,
            },
        );
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Entry> {
        self.entries.get_mut(id)
    }

    /// The runs that have not ended for good.
    pub fn live(&self) -> impl Iterator<Item = &Run> {
        self.entries
            .values()
            .map(|e| &e.run)
            .filter(|r| !r.is_finished())
    }

    pub fn get(&self, id: &str) -> Option<&Entry> {
        self.entries.get(id)
    }

    /// Every run, oldest first: by start time (`started_at`, to the millisecond), then by id
    /// with its numbers compared as numbers, so that the `-2` … `-12` of runs started in the same
    /// second keep their order.
    pub fn ordered(&self) -> Vec<&Entry> {
        let mut all: Vec<(Option<SystemTime>, &Entry)> = self
            .entries
            .values()
            .map(|e| (parse_rfc3339(&e.run.summary().started_at), e))
            .collect();
        all.sort_by(|(ta, a), (tb, b)| {
            ta.cmp(tb).then_with(|| natural_cmp(a.run.id(), b.run.id()))
        });
        all.into_iter().map(|(_, e)| e).collect()
    }

    /// The id `spec` names ([`run_spec::resolve`]): the id itself; `last` (the newest run by
    /// start time); a unique id prefix; a run name (the newest run of that name), or
    /// `name:NAME` for a name that could be read as one of the others.
    pub fn resolve(&self, spec: &str) -> Result<String, RequestError> {
        let ordered = self.ordered();
        run_spec::resolve(
            spec,
            &ordered,
            |e| e.run.id(),
            |e| Some(e.run.summary().name.clone()),
        )
        .map(|e| e.run.id().to_string())
        .map_err(|e| {
            let code = match e {
                SpecError::Empty => ErrorCode::BadRequest,
                SpecError::NoRuns | SpecError::Unknown(_) => ErrorCode::UnknownRun,
                SpecError::Ambiguous(_) => ErrorCode::AmbiguousRun,
            };
            RequestError::new(code, e.to_string())
        })
    }

    /// Every run as `ps` shows it, oldest first.
    pub fn list(&self, now: SystemTime) -> Vec<RunInfo> {
        self.ordered().into_iter().map(|e| info(e, now)).collect()
    }

    /// The runs that have not ended for good (status not final), as `ps` shows them.
    pub fn list_live(&self, now: SystemTime) -> Vec<RunInfo> {
        self.ordered()
            .into_iter()
            .filter(|e| !e.run.summary().status.is_final())
            .map(|e| info(e, now))
            .collect()
    }

    /// (live, total).
    pub fn counts(&self) -> (usize, usize) {
        let live = self
            .entries
            .values()
            .filter(|e| !e.run.is_finished())
            .count();
        (live, self.entries.len())
    }

    /// Whether any run can still change by itself (a poll has something to look at).
    pub fn any_unfinished(&self) -> bool {
        self.entries.values().any(|e| !e.run.is_finished())
    }

    /// Poll every run that has not ended; report the ones whose status changed.
    pub fn poll(&mut self, clock: &dyn Clock) -> Vec<Change> {
        let mut changes = Vec::new();
        for (id, entry) in self.entries.iter_mut() {
            if entry.run.is_finished() {
                continue;
            }
            let old = entry.run.status();
            if let Err(e) = entry.run.poll(clock) {
                tracing::warn!("polling run {id}: {e}");
            }
            let new = entry.run.status();
            if new != old {
                changes.push(Change {
                    id: id.clone(),
                    old,
                    new,
                    why: why_changed(&entry.run, new),
                });
            }
        }
        changes
    }
}

/// `a` against `b` with every run of digits compared as a number: `loop-9` < `loop-10`.
fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let na = a.iter().take_while(|c| c.is_ascii_digit()).count();
                let nb = b.iter().take_while(|c| c.is_ascii_digit()).count();
                let (da, db) = (trim_zeros(&a[..na]), trim_zeros(&b[..nb]));
                let by_value = da.len().cmp(&db.len()).then_with(|| da.cmp(db));
                // Equal values: the shorter spelling (fewer leading zeros) first.
                match by_value.then_with(|| na.cmp(&nb)) {
                    Ordering::Equal => {}
                    other => return other,
                }
                (a, b) = (&a[na..], &b[nb..]);
            }
            (Some(x), Some(y)) => match x.cmp(y) {
                Ordering::Equal => (a, b) = (&a[1..], &b[1..]),
                other => return other,
            },
        }
    }
}

fn trim_zeros(digits: &[u8]) -> &[u8] {
    let zeros = digits.iter().take_while(|&&c| c == b'0').count();
    &digits[zeros..]
}

/// A status change in words, for the node's event log.
fn why_changed(run: &Run, new: RunStatus) -> String {
    let s = run.summary();
    match new {
        RunStatus::Running => format!("restarted (attempt {})", s.attempt),
        RunStatus::Backoff => format!(
            "{}; waiting to restart by its restart policy",
            s.description.as_deref().unwrap_or("the process ended")
        ),
        _ => s
            .description
            .clone()
            .unwrap_or_else(|| "the process ended".into()),
    }
}

/// A run as the protocol carries it.
pub fn info(entry: &Entry, now: SystemTime) -> RunInfo {
    let run = &entry.run;
    let s = run.summary();
    let uptime_s = if run.is_finished() {
        s.duration_s
    } else {
        parse_rfc3339(&s.started_at)
            .and_then(|t| now.duration_since(t).ok())
            .map(|d| d.as_secs_f64())
    };
    let plan = run.plan();
    RunInfo {
        id: run.id().to_string(),
        name: s.name.clone(),
        status: s.status,
        pid: s.pid,
        attempt: s.attempt,
        restarts: s.restarts,
        started_at: s.started_at.clone(),
        ended_at: s.ended_at.clone(),
        uptime_s,
        exit_code: s.exit_code,
        signal_name: s.signal_name.clone(),
        // What is wrong with its directory, after how it stands.
        description: match (s.description.as_deref(), run.problem()) {
            (Some(d), Some(p)) => Some(format!("{d}; {p}")),
            (d, p) => d.or(p).map(str::to_string),
        },
        command: plan.argv.clone(),
        cwd: plan.cwd.clone(),
        gpus: plan
            .env
            .get("CUDA_VISIBLE_DEVICES")
            .cloned()
            .unwrap_or_else(|| "all".into()),
        adopted: entry.adopted,
        dir: run.dir().path().to_path_buf(),
        energy: s.energy.clone(),
        slurm: run.slurm_job().cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;
    use crate::supervisor::{Caller, LaunchOptions, ManualClock};
    use std::time::{Duration, UNIX_EPOCH};

    fn table_with(names: &[(&str, u64)]) -> (tempfile::TempDir, RunTable) {
        let tmp = tempfile::tempdir().unwrap();
        let mut table = RunTable::default();
        let caller = Caller {
            cwd: tmp.path().to_path_buf(),
            env: [("PATH".to_string(), "/usr/bin:/bin".to_string())].into(),
        };
        for (name, secs) in names {
            let clock = ManualClock::at(UNIX_EPOCH + Duration::from_secs(1_796_008_500 + secs));
            let mut p = Profile::from_command(vec!["true".into()]);
            p.name = name.to_string();
            let mut run =
                Run::start_new(tmp.path(), &p, &caller, &LaunchOptions::default(), &clock).unwrap();
            run.wait(&clock, Duration::from_secs(10)).unwrap();
            table.insert(run);
        }
        (tmp, table)
    }

    #[test]
    fn names_ids_prefixes_and_last() {
        let (_tmp, t) = table_with(&[("train", 0), ("eval", 60), ("train", 3600)]);
        assert_eq!(t.resolve("last").unwrap(), "20261130-041500-train");
        assert_eq!(
            t.resolve("20261130-031500-train").unwrap(),
            "20261130-031500-train"
        );
        assert_eq!(t.resolve("20261130-0316").unwrap(), "20261130-031600-eval");
        assert_eq!(t.resolve("train").unwrap(), "20261130-041500-train");
        let e = t.resolve("20261130-03").unwrap_err();
        assert_eq!(e.code, ErrorCode::AmbiguousRun);
        assert!(e.message.contains("matches 2 runs"), "{}", e.message);
        let e = t.resolve("nope").unwrap_err();
        assert_eq!(e.code, ErrorCode::UnknownRun);
        assert_eq!(t.resolve(" ").unwrap_err().code, ErrorCode::BadRequest);
        assert_eq!(t.counts(), (0, 3));
        let list = t.list(SystemTime::now());
        assert_eq!(list.len(), 3);
        assert_eq!(list[0].status, RunStatus::Succeeded);
        assert_eq!(list[0].gpus, "all");
        assert_eq!(list[0].command, ["true"]);
    }

    #[test]
    fn runs_of_one_name_in_one_second_keep_their_numeric_order() {
        let twelve: Vec<(&str, u64)> = (0..12).map(|_| ("loop", 0)).collect();
        let (_tmp, t) = table_with(&twelve);
        let ids: Vec<String> = t
            .list(SystemTime::now())
            .into_iter()
            .map(|r| r.id)
            .collect();
        let mut want = vec!["20261130-031500-loop".to_string()];
        want.extend((2..=12).map(|n| format!("20261130-031500-loop-{n}")));
        assert_eq!(ids, want);
        assert_eq!(t.resolve("last").unwrap(), "20261130-031500-loop-12");
        assert_eq!(t.resolve("loop").unwrap(), "20261130-031500-loop-12");
        assert_eq!(
            t.resolve("20261130-031500-loop-1").unwrap_err().code,
            ErrorCode::AmbiguousRun
        );
    }

    #[test]
    fn natural_order_compares_numbers_as_numbers() {
        let mut v = ["a-10", "a-9", "a", "a-09", "b-1", "a-100"];
        v.sort_by(|x, y| natural_cmp(x, y));
        assert_eq!(v, ["a", "a-9", "a-09", "a-10", "a-100", "b-1"]);
        assert_eq!(natural_cmp("x", "x"), Ordering::Equal);
    }

    #[test]
    fn list_live_leaves_out_ended_runs() {
        let (tmp, mut t) = table_with(&[("done", 0), ("also-done", 60)]);
        assert!(t.list_live(SystemTime::now()).is_empty());
        let caller = Caller {
            cwd: tmp.path().to_path_buf(),
            env: [("PATH".to_string(), "/usr/bin:/bin".to_string())].into(),
        };
        let clock = ManualClock::at(UNIX_EPOCH + Duration::from_secs(1_796_008_500 + 120));
        let mut p = Profile::from_command(vec!["sleep".into(), "1".into()]);
        p.name = "live".into();
        let run =
            Run::start_new(tmp.path(), &p, &caller, &LaunchOptions::default(), &clock).unwrap();
        t.insert(run);
        let now = SystemTime::now();
        let live = t.list_live(now);
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].name, "live");
        assert!(!live[0].is_final());
        let all = t.list(now);
        assert_eq!(all.len(), 3);
        assert_eq!(
            all.iter().filter(|r| !r.is_final()).collect::<Vec<_>>(),
            live.iter().collect::<Vec<_>>()
        );
    }
}
