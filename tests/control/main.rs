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
