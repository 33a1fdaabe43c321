//! Control of GPUs and runs: the control loops inside a daemon, power caps and clocks on the
//! fake NVML library, a run's `[power] cap_w`, `tune energy`, live knobs, and the daemon on bad
//! readings. One test binary; its tests share one process and run in parallel.

#[path = "../support/mod.rs"]
mod support;

mod bench;
mod config_trust;
mod hardening;
mod health;
mod in_daemon;
mod knobs;
mod link_alert;
mod one_voice;
mod power_nvml;
mod retired_pages;
mod run_power_cap;
mod tune_clocks;
mod tune_energy;
mod tune_joint_e2e;
mod tune_measured;

use std::time::Duration;

/// Poll `cond` every `every` until it holds; panic after `timeout` naming `what`. For probes
/// that start a `gpupilot` process or read a whole series from the daemon, where
/// [`support::wait::wait_for`]'s 10 ms would spend more CPU on watching than the test spends
/// on what it watches (and take it from the daemons and trainers of the tests beside it).
pub(crate) fn wait_every(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut cond: impl FnMut() -> bool,
) {
    support::wait::poll(what, timeout, every, || {
        if cond() { Ok(()) } else { Err(String::new()) }
    })
}
