//! # fake-nvml: `libnvidia-ml.so.1` over simulated GPUs
//!
//! Built as a cdylib, this crate is a drop-in NVML: the real C ABI of nvml.h, answered from a
//! [`gpusim`] node instead of a driver. Any NVML client — gpupilot through nvml-wrapper,
//! nvtop, nvitop, gpustat through pynvml — loads it (put a `libnvidia-ml.so.1` symlink to
//! `target/<profile>/libnvidia_ml.so` on `LD_LIBRARY_PATH`) and sees the simulated GPUs.
//!
//! Layout:
//! - [`scenario`] — the TOML that defines the node (GPUs, load, versions, processes, faults),
//!   parsed strictly with file:line:column errors;
//! - [`faults`] — which calls fail, stall or lie;
//! - [`identity`] — UUIDs, serials, PCI addresses: fixed facts gpusim does not model;
//! - [`store`] — the state file that shares one node between processes (flock + a mapped
//!   generation counter);
//! - [`context`] — this process's copy of the node, kept at "now" and in step with the others;
//! - [`setlog`] — the JSON-lines log of every setter call (`FAKE_NVML_LOG`);
//! - `exports` — the `extern "C"` functions, the only code that touches caller pointers;
//! - [`symbols`] — the list of exported names;
//! - [`testing`] — helpers for tests that load the built library;
//! - [`topology`] — NVLink, PCIe switches and NUMA of an HGX board (`[topology]`).
//!
//! The rlib exists for those helpers and for unit tests; nothing in it starts a simulation
//! unless an exported function is called. See `docs/fake-nvml.md` for the scenario format and
//! the environment variables.

// Outside tests every failure is handled, or is an `expect` that says why it cannot happen:
// a daemon that supervises week-long runs must not die on an unexpected value (clippy.toml
// allows both in unit tests; integration tests are crates of their own).
#![deny(clippy::unwrap_used, clippy::panic)]

pub mod context;
mod exports;
pub mod faults;
pub mod ffi;
pub mod identity;
pub mod scenario;
pub mod setlog;
pub mod store;
pub mod symbols;
pub mod testing;
pub mod topology;
