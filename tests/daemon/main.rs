//! The daemon over its socket and through the CLI: protocol, bounds against hostile clients,
//! another user's connection, the system daemon, runs through the CLI and through daemon
//! restarts, runs outliving the daemon, its runtime files never reached through a link, a
//! peer's own text (its process name) shown escaped, and the daemon's life as the CLI tells it
//! (started in the background, `daemon stop`, runs named like keywords).
//! One test binary; its tests share one process and run in parallel.
//!
//! Some tests start this binary again as another user to run one helper "test" (`--exact`
//! with the helper's full name, see `support::proc::test_name`); the helpers do nothing unless
//! their environment variable is set. They run it from where that user can reach it
//! (`support::proc::reachable_by_others`), so the tests pass in a clone under a private
//! directory.

#[path = "../support/mod.rs"]
mod support;

mod auth;
mod bounds;
mod hostile_text;
mod lifecycle;
mod metrics_flood;
mod protocol;
mod runs;
mod runs_hardening;
mod runtime_symlinks;
mod survive;
mod system;
