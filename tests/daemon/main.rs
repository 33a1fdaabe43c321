//! The daemon over its socket and through the CLI: protocol, bounds against hostile clients,
//! another user's connection, the system daemon, runs through the CLI and through daemon
//! restarts, runs outliving the daemon, its runtime files never reached through a link, and a
//! peer's own text (its process name) shown escaped.
//! One test binary; its tests share one process and run in parallel.
//!
//! Some tests start this binary again as another user to run one helper "test" (`--exact`
//! with the helper's full name, see `support::proc::test_name`); the helpers do nothing unless
//! their environment variable is set.

#[path = "../support/mod.rs"]
mod support;

mod auth;
mod bounds;
mod hostile_text;
mod metrics_flood;
mod protocol;
mod runs;
mod runs_hardening;
mod runtime_symlinks;
mod survive;
mod system;
