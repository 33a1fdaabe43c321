//! gpupilot: a terminal console for deep-learning training on GPU machines.
//!
//! # Layout
//!
//! Data flows one way: sources → sampler → history → views. In daily use the sampler, the
//! history and the runs live in the daemon, and the console and the CLI are its clients.
//!
//! The modules form layers, bottom to top; a module uses only the layers below it, and a test
//! (`layering.rs`) holds every `use crate::…` to that. docs/architecture.md follows a sample
//! and a knob change through them.
//!
//! - Leaves: [`units`] (how durations and quantities read to a person), [`text`] (untrusted
//!   text made safe for a terminal or a log line), [`time`] (RFC 3339 and run-id times),
//!   [`config`] (where files live, XDG or `GPUPILOT_HOME`; opening them without following
//!   planted links), then [`ipc`] (the daemon's socket and log paths, peer checks).
//! - What the node and its runs are: [`telemetry`] (sample types, every metric optional; the
//!   [`telemetry::Source`] trait, NVML, the simulator over `gpusim`, the host, and the sampler
//!   that reads each GPU on its own thread so one hung driver call stalls nothing else);
//!   [`profile`] (the run profile format: parse, `extends`, validate); [`training`] (what a
//!   run's trainers report and are asked: knobs, metrics, ranks); [`history`] (per-GPU series
//!   by time in a fixed memory budget, queried by window); [`cuda`] (real load on the GPU
//!   through the `gpuload` crate: is CUDA usable, GEMM and copy throughput, sustained load,
//!   the per-GPU checks of `doctor`).
//! - Acting: [`control`] (power caps, clocks, the thermal governor, the node budget, the
//!   energy tuner's search, energy accounting, alerts); [`supervisor`] (start, stop, pause,
//!   restart and re-adopt runs; their run directories and events).
//! - [`protocol`]: the versioned newline-delimited JSON messages between daemon and clients;
//!   it names the domain types above and is never named by them.
//! - Readers: [`advisor`] (findings with evidence and the command that acts), [`exporter`]
//!   (Prometheus exposition, dcgm-exporter's names), [`report`] (a run's report as HTML,
//!   Markdown or JSON), [`export`] (`gpupilot export`: GPU history and run metrics as CSV,
//!   JSON lines or Parquet), [`status`] (`gpupilot status`, the one-shot table and JSON),
//!   [`recording`] (a node's recording: the compact file format, its writer and reader).
//! - [`client`]: a blocking, thread-safe client of the daemon (answers by id, pushes on a
//!   channel); then [`daemon`] (the one process per `GPUPILOT_HOME` that owns sampling,
//!   history, runs and the node's event log, serving its clients on a Unix socket) and
//!   [`trainer`] (the synthetic trainer `demo` runs, a client of the trainer channel).
//! - What a person meets: [`tui`] (the console: feeds, updates, views; render borrows state
//!   and changes nothing), [`cluster`] (many nodes through Prometheus), [`cli`] (the command
//!   line; `main.rs` only parses it and calls in here), and [`commands`] (each parses its
//!   arguments, calls a service and prints).
//!
//! This crate has no `unsafe`: FFI lives in nvml-wrapper, in `crates/gpuload` (cudarc) and, for
//! tests, in `crates/fake-nvml`.

// Outside tests every failure is handled, or is an `expect` that says why it cannot happen:
// a daemon that supervises week-long runs must not die on an unexpected value (clippy.toml
// allows both in unit tests; integration tests are crates of their own).
#![deny(clippy::unwrap_used, clippy::panic)]

pub mod advisor;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod control;
pub mod cuda;
pub mod daemon;
pub mod export;
pub mod exporter;
pub mod history;
pub mod ipc;
pub mod profile;
pub mod protocol;
pub mod recording;
pub mod report;
pub mod status;
pub mod supervisor;
pub mod telemetry;
pub mod text;
pub mod time;
pub mod trainer;
pub mod training;
pub mod tui;
pub mod units;

#[cfg(test)]
mod layering;
