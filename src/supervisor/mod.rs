//! The run supervisor: runs that outlive the terminal, the TUI and the supervisor itself.
//!
//! A run is started in its own session and process group (by its monitor, see `monitor`), with
//! stdout and stderr opened straight onto files in its run directory: the supervisor holds no
//! pipe, so when it dies (or the SSH session that started it drops) the run keeps running and
//! keeps writing, and its monitor still records how it ends. Every
//! lifecycle event lands in the run directory as it happens, and a new supervisor re-adopts
//! the run from there, telling the run's process from a recycled pid by its start time.
//!
//! - `launch`: profile + caller → argv/cwd/env ([`LaunchPlan`]); torchrun argv; spawning.
//! - `run`: [`Run`], the state machine: start, poll, stop (SIGTERM, grace, SIGKILL), pause,
//!   resume, restart with backoff (`run/attempt.rs`: one process; `run/adoption.rs`: taking a
//!   run over from a dead supervisor).
//! - `restart`: the restart policy as a pure function ([`restart::next_action`]).
//! - `adopt`: what became of a run, from its directory alone ([`adopt::adopt`]).
//! - `rundir`: the run directory and its files ([`RunDir`]).
//! - `run_spec`: how a person names a run (id, id prefix, name, `name:NAME`, `last`).
//! - `events`: `events.jsonl` lines and `summary.json` ([`Event`], [`Summary`]).
//! - `slurm`: runs that are Slurm batch jobs (`sbatch`, `squeue`, `scancel`).
//! - `ranks`: N local ranks with torchrun's environment (`gpupilot ranks`, `launcher = "ranks"`);
//!   `ranks_output`: their output copied to the logs a whole line at a time; `rank_lines`: the
//!   `[rankN]: ` line format, and the filter of one rank's lines (`logs --rank`).
//! - `monitor`: the per-run process that waits for the command and writes its exit status to
//!   the run directory, so that it survives the supervisor; a child subreaper, so that nothing
//!   the run starts escapes `stop`.
//! - `clock`, `procfs`, `signal`: time passed in, `/proc/PID/stat`, signals to a group.
//!
//! Nothing here talks to a socket or draws anything; the daemon drives [`Run::poll`].

pub mod adopt;
pub mod clock;
pub mod events;
pub mod launch;
pub mod monitor;
pub mod procfs;
pub mod rank_lines;
pub mod ranks;
pub mod ranks_output;
pub mod restart;
mod run;
pub mod run_spec;
pub mod rundir;
pub mod signal;
pub mod slurm;

use std::path::PathBuf;

pub use adopt::{Adopted, adopt, is_alive};
pub use clock::{Clock, ManualClock, SystemClock};
pub use events::{Event, EventRecord, ExitInfo, RunStatus, Summary};
pub use launch::{Caller, KnobValues, LaunchError, LaunchOptions, LaunchPlan, torchrun_argv};
pub use restart::{AfterExit, Attempt, GiveUp, next_action};
pub use run::{DEFAULT_GRACE, Run};
pub use rundir::{EventCursor, PidRecord, RunDir, run_id};

use crate::profile::ProfileError;

/// Why a supervisor operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("{}: the run's profile does not load: {source}", path.display())]
    Profile {
        path: PathBuf,
        #[source]
        source: Box<ProfileError>,
    },
    #[error("run {id} is {status}: cannot {action} it")]
    BadState {
        id: String,
        status: &'static str,
        action: &'static str,
    },
}
