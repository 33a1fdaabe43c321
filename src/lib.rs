//! gpupilot: a terminal console for deep-learning training on GPU machines.
//!
//! # Layout
//!
//! Data flows one way: sources → sampler → history → views. In daily use the sampler, the
//! history and the runs live in the daemon, and the console and the CLI are its clients.
//!
//! - [`telemetry`]: sample types (every metric optional), the [`telemetry::Source`] trait, the
//!   NVML source, the simulator source (over the `gpusim` crate), the host (sysinfo), and the
//!   sampler that reads each GPU on its own thread so one hung driver call stalls nothing else.
//! - [`history`]: per-GPU series by time in a fixed memory budget, queried by window.
//! - [`status`]: `gpupilot status`, the one-shot table and JSON.
//! - [`tui`]: the console — views, themes, keymap; render borrows state and changes nothing.
//! - [`config`]: where files live (XDG or `GPUPILOT_HOME`), themes and keymaps.
//! - [`profile`]: the run profile format (`profiles/*.toml`): parse, `extends`, validate.
//! - [`supervisor`]: start, stop, pause, restart and re-adopt runs; their run directories.
//! - [`report`]: a run's report (verdict, energy, charts with change markers, events) as a
//!   self-contained HTML page, Markdown or JSON, from its run directory.
//! - [`daemon`]: `gpupilot daemon`, the one process per `GPUPILOT_HOME` that owns sampling,
//!   history, runs and the node's event log, serving its clients on a Unix socket.
//! - [`protocol`]: the versioned newline-delimited JSON messages between daemon and clients.
//! - [`client`]: a blocking, thread-safe client of the daemon (answers by id, pushes on a
//!   channel).
//! - [`commands`]: `daemon`, `run`, `ps`, `attach`, `logs`, `stop`, `profile check`.
//! - [`cli`]: the command line; `main.rs` only parses it and calls in here.
//! - [`units`]: how durations and other quantities read to a person (a leaf).
//!
//! This crate has no `unsafe`: FFI lives in nvml-wrapper and, for tests, in `crates/fake-nvml`.

pub mod advisor;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod control;
pub mod daemon;
pub mod exporter;
pub mod history;
pub mod profile;
pub mod protocol;
pub mod report;
pub mod status;
pub mod supervisor;
pub mod telemetry;
pub mod time;
pub mod trainer;
pub mod training;
pub mod tui;
pub mod units;
