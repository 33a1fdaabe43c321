//! gpusim: a documented, physically plausible model of GPUs training deep-learning models.
//!
//! Deterministic given a seed and a time step, no I/O, no wall clock, no global state. gpupilot's
//! simulated source, its tests and the fake NVML library all read the same [`Node`].
//!
//! # Layout
//!
//! - [`catalog`] — fixed figures of real GPUs ([`GpuSpec`], [`CATALOG`], [`find`]).
//! - [`workload`] — training models ([`ModelSpec`], [`MODELS`]) and a job's progress
//!   ([`Training`]).
//! - [`power`] — the power curve, the power-cap clock solver and steady-state energy helpers
//!   ([`energy_per_sample_at_cap`], [`energy_optimal_cap_w`]).
//! - [`gpu`] — one GPU's settings and state, stepped in time ([`Gpu`], [`GpuReading`], the
//!   NVML [`throttle`] reason bits).
//! - [`node`] — GPUs sharing an ambient and a fixed-step clock ([`Node`], [`NodeConfig`]).
//! - [`rng`] — splitmix64, the only source of noise, stored in the serialized state.
//! - [`error`] — [`SimError`].
//!
//! # The model
//!
//! Units: watts (W), MHz, Celsius (C), seconds (s), bytes, millijoules (mJ); percentages 0..=100.
//!
//! **Training step.** A step of batch `B` at SM clock `f` computes for
//! `t_c = gflop·B / (fp16_tflops · tensor_efficiency · 1000) · (m + (1 − m)·f_max/f)` s, where `m`
//! is the model's memory-bound fraction (that part does not speed up with the clock). The loader
//! needs `t_d = B · data_s_per_sample / workers` s per batch and adds a seeded jitter
//! `j ∈ [0, 2·frac·t_d)` per step (`frac` ≈ 0.25, staggered per GPU). Serial loading (prefetch 0 or
//! no workers) waits `t_d + j`; prefetch depth `d ≥ 1` overlaps loading with compute and waits
//! `max(0, t_d − t_c) + j/(1 + d)`. Utilization `u = t_c / (t_c + wait)`, throughput
//! `B / (t_c + wait)` samples/s. Memory used is `static + B · per_sample` bytes; above the GPU's
//! memory the job is out of memory and stops (util 0, memory at static). Loss falls as
//! `final + (initial − final) · 2^(−samples/halflife)`, times `1 ± 1%` noise.
//!
//! **Power.** `P = idle + u · (static + mem · r(f) + a · K · x · v(x)²)` W, with `x = f/f_max`,
//! `a` the model's power intensity, `r(f) = 1/(m + (1 − m)/x)` the rate at which work (and memory
//! traffic) proceeds, and `v` the core voltage relative to its floor: 1 up to the knee clock,
//! rising linearly to `voltage_max_ratio` (1.25) at `f_max`. `K` is calibrated so that the
//! heaviest model (`a = 1`) at `f_max` and full load draws 1.02 × the default power limit, so the
//! default cap binds slightly on the biggest models only. Energy per sample is `P · t_c / B`:
//! idle and static power make low clocks expensive (the step takes longer), `v²` makes high
//! clocks expensive, and because of `m` time does not scale fully with the clock, so the
//! optimum is strictly inside the cap range, near the voltage knee: about 60% of the max cap on
//! the data-centre parts and 50% (66% of default) on the RTX 4090, whose 600 W max is headroom
//! its 2520 MHz boost never uses. Memory power follows `r`, so its energy per sample does not
//! depend on the clock.
//!
//! **Power cap.** The clock is the highest one (from the top of the locked range, or `f_max`,
//! down a 15 MHz grid) whose power is within the cap; if the cap binds, reason `SW_POWER_CAP`.
//! Power and thermal limits may go below a locked minimum, as on real parts. If even the lowest
//! clock draws too much, the clock is gated part of the time so the board sits at the cap.
//!
//! **Temperature.** First order: `dT/dt = (ambient + R·P − T) / tau`, integrated exactly per
//! step. `R` is chosen so the heaviest job at the default cap in 25 C settles at 67-72 C; at
//! 45 C ambient the heavy models reach `slowdown_c` on the data-centre parts. At `T ≥
//! slowdown_c` the clock halves (`HW_SLOWDOWN | HW_THERMAL_SLOWDOWN`) until `T` falls 5 C below.
//! A cooling fault ([`CoolingFault`]: a dead fan, a clogged heatsink) multiplies one GPU's `R`
//! from a given time on; an H100 training at 700 W with `R` tripled settles far above its
//! slowdown, so it throttles (its halved clock draws less, and it hovers around the threshold)
//! while its siblings run at full clock — the straggler of a data-parallel job.
//! Fans (RTX 4090 only) run 30% up to 45 C, rising to 100% at 90 C. `shutdown_c` is reported,
//! not enforced.
//!
//! **Counters.** The energy counter integrates `P · dt` in mJ (monotone). PCIe rx is the input
//! data rate (samples/s × bytes per sample, KB/s = 1024 B/s), tx 2% of it (losses, metrics),
//! plus a small idle floor. Idle GPUs report `GPU_IDLE`, pstate 8 and the lowest (or locked
//! minimum) clock; busy ones pstate 0.
//!
//! **Determinism.** Noise comes from one splitmix64 per GPU, seeded from the node seed, which
//! also staggers each GPU's `R` (±4%) and loader jitter (±30%). Everything, the generators
//! included, serializes (GPU specs by id), so a restored node continues bit-identically
//! (with serde_json, enable its `float_roundtrip` feature).
//!
//! # Sources
//!
//! Catalog figures: NVIDIA datasheets (H100, H200, A100, V100, RTX 4090, RTX 6000, A40: memory,
//! TDP/TGP, boost clocks, FP16 tensor TFLOPS, bandwidth) and `nvidia-smi -q` fields (power-limit
//! range, memory total, clock range, slowdown/shutdown temperatures); each entry in `catalog.rs`
//! marks which, and marks estimates. Model costs (`workload.rs`) are textbook estimates (3× forward FLOPs,
//! 6·params·tokens). The power shape and thermal path are calibration of this model, tuned so
//! that energy optima resemble Zeus (You, Chung, Chowdhury, NSDI 2023), which measured optima
//! well below the default cap.

// Outside tests every failure is handled, or is an `expect` that says why it cannot happen:
// a daemon that supervises week-long runs must not die on an unexpected value (clippy.toml
// allows both in unit tests; integration tests are crates of their own).
#![deny(clippy::unwrap_used, clippy::panic)]

pub mod activity;
pub mod catalog;
pub mod error;
pub mod gpu;
pub mod measured;
pub mod node;
pub mod power;
pub mod rng;
pub mod workload;

pub use activity::Activity;
pub use catalog::{CATALOG, GpuSpec, find};
pub use error::SimError;
pub use gpu::{Gpu, GpuReading, throttle};
pub use measured::MeasuredCurve;
pub use node::{CoolingFault, Node, NodeConfig};
pub use power::{energy_optimal_cap_w, energy_per_sample_at_cap};
pub use rng::SplitMix64;
pub use workload::{MODELS, ModelSpec, Training, TrainingConfig, find_model};
