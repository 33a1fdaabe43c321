//! The daemon's runs: the table of supervised runs, the requests that act on them, and each
//! run's trainer channel.
//!
//! - `table`: every run directory under `$STATE/runs`, polled, listed, named by id prefix.
//! - `ops`: start, stop, pause and resume, a run's logs and events, each change recorded with
//!   who, old → new and why.
//! - `trainers`: the trainer channel: which connection is which run's trainer, knob changes
//!   and their acknowledgements, each run's metrics.
//! - `ranks`, `rank_changes`: the ranks of a run of several, and a knob change applied at one
//!   step on every rank.
//! - `trainer_output`: metrics read from the output of a script that does not use the SDK.
//! - `logs`: a chunk of a run's log for `logs -f`.
//! - `run_report`: `report.html` into a run's directory when it ends.

pub(super) mod logs;
pub(super) mod ops;
pub(super) mod rank_changes;
pub(super) mod ranks;
pub(super) mod run_report;
pub(super) mod table;
pub(super) mod trainer_output;
pub(super) mod trainers;
