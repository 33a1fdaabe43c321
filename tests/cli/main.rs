//! The `gpupilot` binary as a user runs it, alone or with a daemon on the simulator: bad input,
//! the docs' examples, `doctor`, `profile check`, `status`, `report`, `export` (read back by
//! pandas), the NVML source through the fake library and a peer reading the same node, what the
//! package ships (version, completions, man pages, the SDK's version), and the fuzz loop over
//! every decoder fed by someone else. One test binary; its tests share one process and run in parallel, each in its
//! own temporary home.

#[path = "../support/mod.rs"]
mod support;

mod bad_input;
mod bench_cuda;
mod console_docs;
mod doctor;
mod events;
mod export;
mod fuzz;
mod mig;
mod nvlink;
mod nvml_fake;
mod packaging;
mod peer_gpustat;
mod profile_check;
mod report;
mod status;
