//! The daemon's runs part: the table of supervised runs, the requests that act on them, and
//! each run's trainer channel. [`Runs`] owns all of it; the daemon holds one.
//!
//! - `table`: every run directory under `$STATE/runs`, polled, listed, named by id prefix.
//! - `ops`: stop, pause and resume, a run's logs and events, each change recorded with who,
//!   old → new and why; a start's two halves (spawn, then join the table) and the wait of a
//!   trainer that attaches in between.
//! - `trainers`: the trainer channel: which connection is which run's trainer (or ranks), the
//!   knob changes in flight, each run's metrics.
//! - `knob_changes`: the one state machine of a knob change (proposal, votes, commit or
//!   call-off, acknowledgements), whatever the world size; a single process's change for its
//!   next batch is one of its modes.
//! - `rank_changes`: `knob_set`, `knob_ack` and `knob_vote` through that machine, its effects
//!   recorded after the locks are let go; ranks brought back to their job's value.
//! - `ranks`: the ranks of a run, their progress, and the step a change to several is applied
//!   at.
//! - `trainer_output`: metrics read from the output of a script that does not use the SDK.
//! - `logs`: a chunk of a run's log for `logs -f`.
//! - `run_report`: `report.html` into a run's directory when it ends.
//!
//! # Locks
//!
//! Two locks, always in this order: the run table ([`Runs::table`]), then the channels
//! ([`Runs::channels`]); never the channels first, and a lookup that needs both takes the table
//! to find the run and may let it go once it holds the channels. Neither is held while a node
//! event is recorded (the node log has a lock of its own, and feeds subscribers): what must be
//! written is gathered, the locks let go, then it is recorded (see `rank_changes::Effect`).
//! The other parts of the daemon take the table alone, never with a lock of their own held
//! (the control loops read the live runs before they lock the loops, and store the runs'
//! energy after).

pub(super) mod knob_changes;
pub(super) mod logs;
pub(super) mod metric_presets;
pub(super) mod ops;
pub(super) mod rank_changes;
pub(super) mod ranks;
pub(super) mod run_report;
pub(super) mod table;
pub(super) mod trainer_output;
pub(super) mod trainers;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::sync::Notify;

use super::base::{RequestError, lock};
use super::events::NodeLog;
use crate::history::History;
use crate::protocol::{NodeEvent, RunInfo};
use crate::supervisor::SystemClock;
use table::{Adoption, RunTable};
use trainers::Channels;

/// Every run this daemon knows, and their trainer channels. See the module doc.
pub struct Runs {
    /// `$STATE`: runs live in `$STATE/runs`.
    state_dir: PathBuf,
    /// Every run directory, live or ended (see `table`).
    table: Mutex<RunTable>,
    /// The trainer channel of every run (see `trainers`). After the table, never before.
    channels: Mutex<Channels>,
    clock: SystemClock,
    /// The node's event log, shared with the daemon's other parts.
    events: Arc<NodeLog>,
    /// Wakes the run poller when a run joins the table (it sleeps while no run is live).
    added: Notify,
    /// Runs being started: spawned (their trainer may already attach) but not yet in the
    /// table. `joined` (with the table) wakes whoever waits for one of them.
    launching: AtomicUsize,
    joined: Condvar,
    /// Where `run_events` answers ended: the byte of the log after the `n`th event, by run and
    /// `n` (see `ops::run_events`).
    event_cursors: Mutex<HashMap<(String, u64), u64>>,
}

impl Runs {
    /// Every run directory under `$STATE/runs`, adopted; what adoption found, for the node's
    /// event log.
    pub fn adopt(state_dir: PathBuf, events: Arc<NodeLog>) -> (Runs, Vec<Adoption>) {
        let clock = SystemClock;
        let (table, adoptions) = RunTable::adopt_all(&state_dir, &clock);
        let runs = Runs {
            state_dir,
            table: Mutex::new(table),
            channels: Mutex::default(),
            clock,
            events,
            added: Notify::new(),
            launching: AtomicUsize::new(0),
            joined: Condvar::new(),
            event_cursors: Mutex::default(),
        };
        (runs, adoptions)
    }

    /// The run table, locked: alone, or before [`Self::channels`].
    pub fn table(&self) -> MutexGuard<'_, RunTable> {
        lock(&self.table)
    }

    /// Where `run_events` answers ended, locked: alone.
    pub(in crate::daemon) fn event_cursors(&self) -> MutexGuard<'_, HashMap<(String, u64), u64>> {
        lock(&self.event_cursors)
    }

    /// The trainer channels, locked: alone, or after [`Self::table`].
    pub(in crate::daemon) fn channels(&self) -> MutexGuard<'_, Channels> {
        lock(&self.channels)
    }

    /// Notified when a run joins the table (the poller waits on it while no run is live).
    pub fn added(&self) -> &Notify {
        &self.added
    }

    /// Whether a poll has anything to do: cheap, callable from async code.
    pub fn any_live(&self) -> bool {
        self.table().any_unfinished()
    }

    /// Live runs and every run.
    pub fn counts(&self) -> (usize, usize) {
        self.table().counts()
    }

    /// Every run, oldest first.
    pub fn list(&self) -> Vec<RunInfo> {
        self.table().list(SystemTime::now())
    }

    /// The runs that have not ended, oldest first.
    pub fn list_live(&self) -> Vec<RunInfo> {
        self.table().list_live(SystemTime::now())
    }

    /// The run `spec` names (an id, an id prefix, a name, `last`).
    pub fn info(&self, spec: &str) -> Result<RunInfo, RequestError> {
        let table = self.table();
        table
            .resolve(spec)
            .map(|id| table::info(table.get(&id).expect("resolved"), SystemTime::now()))
    }

    /// Poll every live run; record status changes in the node's log, and have the report of
    /// each run that ended written (from `history`).
    pub fn poll(&self, history: &Mutex<History>) {
        let changes = self.table().poll(&self.clock);
        self.parse_outputs();
        self.check_rank_changes();
        for c in changes {
            if c.new.is_final() {
                run_report::after_end(&self.state_dir, &c.id, history);
            }
            self.events.record(NodeEvent::RunStatus {
                run: c.id,
                old: c.old,
                new: c.new,
                by: "daemon".into(),
                why: c.why,
            });
        }
    }
}
